"""The timeline, as plain data: every host's last flight records aligned into steps
(`TimelineStep`, `Stragglers`, `Timeline`; gathered by `multihost._debug._timeline.timeline`).

Standard library only: `Timeline.build` is a pure function of the records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from multihost._models._audit import AUDIT_THREAD
from multihost._recorder import SERVICE_BARRIER, SERVICE_KINDS, SERVICE_WAIT, WAITING, FlightRecord
from multihost._text import fmt_hosts, fmt_seconds

#: The call site prefix of collectives the notebook's magics ran (`_sequence.called_from`).
NOTEBOOK_SITE = 'notebook:'

#: Magics whose collectives are the user's own steps (``%mh_barrier ckpt``: a barrier the
#: user asked for, as the program's would be), counted in the straggler verdict.
USER_STEP_SITES = (f'{NOTEBOOK_SITE} %mh_barrier',)
#: Fewest counted steps from which a straggler is named (from fewer, who was last is chance).
MIN_STEPS = 5

#: Rows `Timeline.format` shows by default (the newest steps).
FORMAT_ROWS = 20
#: Per-host lateness columns in `Timeline.format` up to this many hosts.
MAX_HOST_COLUMNS = 8

# A step's key: ('seq', seq) for checked entries, ('call', name, call) for unchecked launches,
# ('service', kind, name, call) for a library's own service barriers and key waits.
StepKey = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class TimelineStep:
    """One step, as every host recorded it.

    Attributes:
        label: ``train_step call #41`` (a launch and its call number),
            ``barrier('ckpt') #57`` (a collective and its sequence number).
        kind: ``'launch'`` or the collective (``'barrier'``, ...).
        name: the function's or collective's name.
        seq: the collective sequence number (checked steps), else None.
        call: a launch's call number of ``name`` (0-based), else -1.
        clock_compared: lateness comes from comparing wall clocks (an
            unchecked launch), so clock skew between machines applies;
            False: from each host's own wait at the cross-host check.
        records: process -> its flight record of this step.
        lateness: process -> seconds after the first host to arrive
            (hosts whose arrival is known: checked steps need the wait, so a
            host still waiting at the check has none).
        waiting: hosts still waiting at this step's check.
        missing: hosts that answered but hold no record of this step: not
            there yet (or, after an interrupt realigned the sequence, never).
    """

    label: str
    kind: str
    name: str
    seq: int | None
    call: int
    clock_compared: bool
    records: Mapping[int, FlightRecord]
    lateness: Mapping[int, float]
    waiting: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()

    @property
    def hosts(self) -> tuple[int, ...]:
        """The hosts that recorded this step."""
        return tuple(sorted(self.records))

    @property
    def audit(self) -> bool:
        """An exchange of the audit (``multihost run --audit``), off the main thread: not a
        step of the program (its hosts arrive when their audit thread gets there)."""
        return bool(self.records) and all(r.thread == AUDIT_THREAD for r in self.records.values())

    @property
    def notebook(self) -> bool:
        """A collective the notebook's magics ran (``%mh_diff``...), not a step of the program:
        every host recorded a call site ``notebook: ...`` (`_sequence.called_from`)."""
        return bool(self.records) and all(
            r.site.startswith(NOTEBOOK_SITE) and not r.site.startswith(USER_STEP_SITES)
            for r in self.records.values()
        )

    @property
    def inside(self) -> str:
        """``'jax.device_put'``: the JAX function that made this collective itself (its call
        site ends ``(inside jax.device_put)``, `_sequence.call_site`); empty for the user's."""
        sites = {r.site for r in self.records.values()}
        found = {t.rsplit(' (inside ', 1)[1].rstrip(')') for t in sites if ' (inside ' in t}
        return (
            found.pop()
            if len(found) == 1 and len(sites) and all(' (inside ' in t for t in sites)
            else ''
        )

    @property
    def magic(self) -> str:
        """``'%mh_diff'``: the magic that ran a notebook step (empty for the program's)."""
        if not self.notebook:
            return ''
        site = next(iter(self.records.values())).site[len(NOTEBOOK_SITE) :].strip()
        return site.split(' ', 1)[0]

    @property
    def start(self) -> float:
        """The earliest entry time of any host (wall clock)."""
        return min(r.time for r in self.records.values())

    @property
    def last_host(self) -> int | None:
        """The host that arrived last (None with fewer than two known arrivals, or when the
        latest arrival is a tie: nobody was last, see `tied`)."""
        if len(self.lateness) < 2 or self.tied:
            return None
        return max(sorted(self.lateness), key=lambda p: self.lateness[p])

    @property
    def tied(self) -> tuple[int, ...]:
        """The hosts that share the latest known arrival exactly, when more than one does
        (every host, when all arrived together); empty otherwise."""
        if len(self.lateness) < 2:
            return ()
        latest = max(self.lateness.values())
        hosts = tuple(p for p, t in sorted(self.lateness.items()) if t == latest)
        return hosts if len(hosts) > 1 else ()

    @property
    def tie(self) -> str:
        """`tied` in words: ``'tied: processes 1-2'``, ``'tied: all arrived together'``;
        empty when one host was last."""
        if not self.tied:
            return ''
        if len(self.tied) == len(self.lateness):
            return 'tied: all arrived together'
        return f'tied: {fmt_hosts(self.tied)}'

    @property
    def first_host(self) -> int | None:
        """The host that arrived first (None with fewer than two known arrivals)."""
        if len(self.lateness) < 2:
            return None
        return min(sorted(self.lateness), key=lambda p: self.lateness[p])

    @property
    def skew(self) -> float:
        """Seconds between the first and the last known arrival (0.0 with fewer than two)."""
        return max(self.lateness.values()) if len(self.lateness) >= 2 else 0.0

    @property
    def complete(self) -> bool:
        """Every answering host passed it, with a known arrival, and at least two hosts did."""
        return (
            not self.waiting
            and not self.missing
            and len(self.lateness) >= 2
            and len(self.lateness) == len(self.records)
        )

    def describe(self) -> str:
        """``train_step call #41: process 3 last, +52 ms`` (or who it waits for)."""
        if self.waiting or self.missing:
            parts = []
            if self.waiting:
                parts.append(f'{fmt_hosts(self.waiting)} waiting at its check')
            if self.missing:
                parts.append(f'{fmt_hosts(self.missing)} not there yet')
            return f'{self.label}: ' + '; '.join(parts)
        clock = ' (wall clocks)' if self.clock_compared else ''
        if self.tied:
            return f'{self.label}: {self.tie}, +{fmt_seconds(self.skew)}{clock}'
        if self.last_host is None:
            return f'{self.label}: one process'
        return f'{self.label}: process {self.last_host} last, +{fmt_seconds(self.skew)}{clock}'


@dataclasses.dataclass(frozen=True)
class Stragglers:
    """Who arrives last, over a timeline's complete steps (`Timeline.stragglers`).

    Attributes:
        steps: complete steps counted (at least two hosts, every arrival known).
        counts: process -> in how many of them it arrived last.
        host: the straggler, or None when no host stands out (fewer than half
            of the steps, or not clearly above chance with two or three hosts).
        share: fraction of ``steps`` in which ``host`` (or, when ``host`` is
            None, the most frequent last host) arrived last.
        median_behind: median, over the steps in which that host arrived
            last, of how long after the first host it arrived (seconds).
        median_skew: median first-to-last spread over all counted steps.
        clock_compared: how many counted steps compared wall clocks.
        num_hosts: hosts taking part in the counted steps.
        notebook: complete steps left out: the ones the notebook's magics ran
            (``%mh_diff``, ``%mh_env``...) and the audit's exchanges
            (`TimelineStep.audit`); not the program's steps.
    """

    steps: int
    counts: Mapping[int, int]
    host: int | None
    share: float
    median_behind: float
    median_skew: float
    clock_compared: int
    num_hosts: int
    notebook: int = 0

    @property
    def most_often(self) -> int | None:
        """The host that arrived last most often (ties: the lowest process), or None."""
        if not self.counts:
            return None
        return max(sorted(self.counts), key=lambda p: self.counts[p])

    def _left_out(self) -> str:
        n = self.notebook
        if not n:
            return ''
        return f"; {n} step{'' if n == 1 else 's'} of the notebook's magics (%mh_diff...) left out"

    def __str__(self) -> str:
        return self._verdict() + self._left_out()

    def _verdict(self) -> str:
        if self.steps == 0:
            what = 'step of the program' if self.notebook else 'step'
            return f'no {what} with two or more processes recorded yet: no straggler to name'
        top = self.most_often
        if top is None:  # every counted step's latest arrival a tie
            return (
                f'no straggler over the last {self.steps} steps: in each the latest arrival '
                'was a tie (processes arrived together), so no process arrived last'
            )
        pct = f'{self.share * 100:.0f}%'
        if self.steps < MIN_STEPS:
            return (
                f'too few steps to name a straggler: {self.steps} of the {MIN_STEPS} it needs '
                f'(process {top} arrived last in {self.counts[top]} of {self.steps})'
            )
        clock = ''
        if self.clock_compared:
            clock = (
                f' (wall clocks compared in {self.clock_compared} of {self.steps} steps: '
                'clock skew between machines adds to those)'
            )
        if self.host is not None:
            return (
                f'process {self.host} arrived last in {pct} of the last {self.steps} steps '
                f'({self.counts[self.host]} of {self.steps}), median '
                f'+{fmt_seconds(self.median_behind)} after the first process' + clock
            )
        return (
            f'no consistent straggler over the last {self.steps} steps: the last to arrive '
            f'varies (most often process {top}, {pct}); median skew '
            f'{fmt_seconds(self.median_skew)}' + clock
        )


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Every host's flight records aligned into steps; who arrived late, by how much.

    Build it with `Timeline.build` (or `multihost.timeline()`, which gathers
    every host's records first).

    Attributes:
        steps: the aligned steps, oldest first (by first arrival). Steps at
            the start of the window that some host no longer holds (its last
            records begin later) are left out.
        num_processes: the number of processes in the job.
        hosts: the processes whose records are included (that answered).
    """

    steps: tuple[TimelineStep, ...]
    num_processes: int
    hosts: tuple[int, ...]

    @property
    def silent(self) -> tuple[int, ...]:
        """Processes that sent no records (did not answer)."""
        return tuple(p for p in range(self.num_processes) if p not in self.hosts)

    @property
    def origin(self) -> float:
        """The earliest entry time of any step (wall clock; 0.0 without steps)."""
        return min((s.start for s in self.steps), default=0.0)

    @property
    def clock_compared(self) -> bool:
        """Whether any step's lateness compares wall clocks (unchecked launches)."""
        return any(s.clock_compared for s in self.steps)

    # -- building ---------------------------------------------------------------------

    @classmethod
    def build(
        cls, records: Mapping[int, Sequence[FlightRecord]], num_processes: int | None = None
    ) -> Timeline:
        """Aligns every host's records into steps.

        Args:
            records: process -> its flight records, oldest first (as
                `multihost.flight_records` returns them).
            num_processes: processes in the job (default: the largest
                process index seen plus one); those absent from ``records``
                are `silent`.
        """
        hosts = tuple(sorted(int(p) for p in records))
        if num_processes is None:
            num_processes = hosts[-1] + 1 if hosts else 0
        grouped: dict[StepKey, dict[int, FlightRecord]] = {}
        # Per host and alignment class (the sequence, or one launch name's
        # calls): the lowest number it still holds, its window's start.
        oldest: dict[tuple[int, Any], int] = {}
        for p in hosts:
            for r in records[p]:
                key = _key(r)
                if key is None:
                    continue
                grouped.setdefault(key, {})[p] = r
                cls_, num = _class_and_number(key)
                oldest[p, cls_] = min(oldest.get((p, cls_), num), num)
        steps = []
        for key, recs in grouped.items():
            cls_, num = _class_and_number(key)
            missing = []
            outside = False
            expected = _participants(key, recs)
            for q in hosts:
                if q in recs or (expected is not None and q not in expected):
                    continue
                if (q, cls_) in oldest and oldest[q, cls_] > num:
                    outside = True  # before q's window: q's record of it dropped off
                    break
                missing.append(q)  # not there yet (or skipped: an interrupt realigned)
            if outside:
                continue
            steps.append(_step(key, recs, tuple(missing)))
        steps.sort(key=lambda s: (s.start, s.seq if s.seq is not None else -1))
        return cls(steps=tuple(steps), num_processes=int(num_processes), hosts=hosts)

    # -- summaries --------------------------------------------------------------------

    def stragglers(self) -> Stragglers:
        """Who arrived last how often, over the program's complete steps (see `Stragglers`):
        the collectives the notebook's magics ran (`TimelineStep.notebook`) are left out."""
        # A key wait is no rendezvous (one host waits for another's key): not counted.
        complete = [s for s in self.steps if s.complete and s.kind != SERVICE_WAIT]
        counted = [s for s in complete if not s.notebook and not s.audit]
        counts: dict[int, int] = {}
        for s in counted:
            last = s.last_host
            if last is not None:
                counts[last] = counts.get(last, 0) + 1
        n = len(counted)
        num_hosts = len({p for s in counted for p in s.records})
        top = max(sorted(counts), key=lambda p: counts[p]) if counts else None
        share = counts[top] / n if top is not None and n else 0.0
        # Named only when it stands out: at least half of the steps, and 1.5x
        # what chance would give (with two hosts, each is last half the time).
        stands_out = (
            top is not None and n >= MIN_STEPS and share >= max(0.5, 1.5 / max(num_hosts, 1))
        )
        behind = [s.skew for s in counted if s.last_host == top]
        return Stragglers(
            steps=n,
            counts=dict(sorted(counts.items())),
            host=top if stands_out else None,
            share=share,
            median_behind=statistics.median(behind) if behind else 0.0,
            median_skew=statistics.median(s.skew for s in counted) if counted else 0.0,
            clock_compared=sum(s.clock_compared for s in counted),
            num_hosts=num_hosts,
            notebook=len(complete) - len(counted),
        )

    def format(self, last: int = FORMAT_ROWS) -> str:
        """The straggler summary, then the newest ``last`` steps: slowest host and skew per step.

        Up to `MAX_HOST_COLUMNS` hosts, each host's lateness (ms after the
        first to arrive) gets a column. Skews marked ``*`` compare wall clocks.
        """
        lines = [str(self.stragglers())]
        if self.silent:
            lines.append(f'no records from {fmt_hosts(self.silent)} (no answer)')
        if not self.steps:
            lines.append('no steps recorded')
            return '\n'.join(lines)
        shown = self.steps[-last:] if last > 0 else ()
        if len(shown) < len(self.steps):
            lines.append(f'the newest {len(shown)} of {len(self.steps)} steps:')
        per_host = len(self.hosts) <= MAX_HOST_COLUMNS
        width = max(24, *(len(_row_label(s)) for s in shown)) if shown else 24
        head = f'{"step":<{width}}  {"last":<11} {"skew":>10}'
        if per_host:
            head += '   ' + ' '.join(f'{"p" + str(p):>8}' for p in self.hosts)
        lines.append(head)
        lines.extend(self._format_row(s, width, per_host) for s in shown)
        if per_host:
            lines.append('(per process: ms after the first process to arrive)')
        if any(s.notebook for s in shown):
            lines.append(
                '[%mh_...]: a collective the notebook ran, not the program: left out of the '
                'straggler verdict'
            )
        if any(s.clock_compared for s in shown):
            lines.append(
                '* unchecked launches (watch(..., check=False)): wall clocks compared, '
                'so clock skew between machines applies'
            )
        return '\n'.join(lines)

    def _format_row(self, s: TimelineStep, width: int, per_host: bool) -> str:
        """One step's row of `format`: label, last host, skew, then per host or what is wrong."""
        if s.complete:
            last_h = 'tied' if s.tied else f'process {s.last_host}'
            skew = f'+{fmt_seconds(s.skew)}' + ('*' if s.clock_compared else ' ')
        else:
            last_h, skew = '', ''
        row = f'{_row_label(s):<{width}}  {last_h:<11} {skew:>10}'
        if per_host:
            row += '   ' + ' '.join(_host_cell(s, p) for p in self.hosts)
        elif not s.complete:
            row += '   ' + s.describe().split(': ', 1)[-1]
        return row.rstrip()

    def __str__(self) -> str:
        return self.format()

    # -- Chrome trace -----------------------------------------------------------------

    def chrome_trace(self) -> dict[str, Any]:
        """The timeline as Chrome trace-event JSON (a dict; see `to_chrome_trace`)."""
        origin = self.origin
        events: list[dict[str, Any]] = []
        for p in self.hosts:
            events.append(_meta('process_name', p, {'name': f'process {p}'}))
            events.append(_meta('process_sort_index', p, {'sort_index': p}))
            events.append(_meta('thread_name', p, {'name': f'process {p}'}))
        for s in self.steps:
            last = s.last_host if s.complete else None
            for p, r in sorted(s.records.items()):
                args: dict[str, Any] = {
                    'site': r.site,
                    'state': r.state,
                    'after_first_ms': (round(s.lateness[p] * 1e3, 3) if p in s.lateness else None),
                    'arrived_last': p == last,
                    'step_skew_ms': round(s.skew * 1e3, 3),
                }
                if s.seq is not None:
                    args['seq'] = s.seq
                if r.kind == 'launch' or r.is_service:
                    args['call'] = r.call
                if r.timeout is not None:
                    args['timeout_s'] = r.timeout
                if r.thread:
                    args['thread'] = r.thread
                if s.clock_compared:
                    args['clock_compared'] = True
                if s.notebook:
                    args['notebook'] = s.magic  # the toolkit's, not the program's step
                timed = s.seq is not None or s.kind in SERVICE_KINDS
                dur = r.wait if (timed and r.wait is not None) else 0.0
                events.append(
                    {
                        'name': _row_label(s),
                        'cat': 'notebook' if s.notebook else r.kind,
                        'ph': 'X',
                        'ts': round((r.time - origin) * 1e6, 3),
                        'dur': round(max(dur, 0.0) * 1e6, 3),
                        'pid': p,
                        'tid': p,
                        'args': args,
                    }
                )
        return {
            'traceEvents': events,
            'displayTimeUnit': 'ms',
            'otherData': {
                'source': 'multihost.Timeline',
                'origin_unix_time': origin,
                'num_processes': self.num_processes,
                'stragglers': str(self.stragglers()),
                'clocks': (
                    "each process's own wall clock; clocks of different machines may be skewed"
                ),
            },
        }

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """Writes Chrome trace-event JSON: one track per host, for Perfetto or chrome://tracing.

        Each host is a track (``pid`` = ``tid`` = its process index, named
        ``process N``). A checked step is a complete event (``ph: 'X'``) from
        the host's arrival to its release: its duration is the host's wait at
        the cross-host check, so hosts that waited long for a straggler show
        long bars and the straggler a short one. An unchecked launch is a
        zero-length event at its call. ``args`` carry the call site, state,
        lateness after the first host, whether the host arrived last, and the
        step's skew.

        Times (``ts``, ``dur``) are microseconds since the timeline's first
        entry (``otherData.origin_unix_time``), each host on **its own
        clock**: on one machine they line up; clocks of different machines
        may be skewed, shifting a whole track (the waits and lateness are not
        affected: they come from each host's own wait).

        Returns:
            The path written.
        """
        path = os.fspath(path)
        with open(path, 'w', encoding='utf-8') as f:
            json.dump(self.chrome_trace(), f, separators=(',', ':'))
        return path


def _host_cell(s: TimelineStep, p: int) -> str:
    """Host ``p``'s cell of a step's row: ms after the first host, or why there is none."""
    if p in s.lateness:
        return f'{s.lateness[p] * 1e3:8.1f}'
    if p in s.waiting:
        return f'{"waiting":>8}'
    if p in s.missing:
        return f'{"absent":>8}'
    return f'{"?":>8}'


def _row_label(s: TimelineStep) -> str:
    """The step's label, marked ``[%mh_diff]`` when the notebook's magic ran it, ``[inside
    jax.device_put]`` when JAX made it (the user's line that called JAX: its records' site)."""
    if s.notebook:
        return f'{s.label} [{s.magic}]'
    return f'{s.label} [inside {s.inside}]' if s.inside else s.label


def _meta(name: str, p: int, args: dict[str, Any]) -> dict[str, Any]:
    return {'name': name, 'ph': 'M', 'pid': p, 'tid': p, 'args': args}


def _key(r: FlightRecord) -> StepKey | None:
    """How a record aligns across hosts, or None (an unchecked collective: nothing to align by)."""
    if r.seq is not None:
        return ('seq', r.seq)
    if r.lane:  # off the main thread: its lane and count there (`_threads`)
        lane, _, count = r.lane.rpartition('#')
        return ('lane', lane, int(count))
    if r.kind == 'launch' and r.call >= 0:
        return ('call', r.name, r.call)
    if r.kind in SERVICE_KINDS and r.call >= 0:
        return ('service', r.kind, r.name, r.call)
    return None


def _participants(key: StepKey, recs: Mapping[int, FlightRecord]) -> set[int] | None:
    """The hosts a step expects (None: every host): a subset barrier's processes (recorded in
    its digest), only the hosts that waited for a key (a key wait is each host's own)."""
    if key[0] != 'service':
        return None
    if key[1] == SERVICE_WAIT:
        return set(recs)
    subset = next(iter(recs.values())).digest
    return {int(p) for p in subset.split(',') if p.isdigit()} if subset else None


def _class_and_number(key: StepKey) -> tuple[Any, int]:
    """(the numbering the key belongs to, its number in it): ``'seq'`` or a launch's name."""
    if key[0] == 'seq':
        return 'seq', int(key[1])
    if key[0] == 'service':
        return ('service', key[1], key[2]), int(key[3])
    if key[0] == 'lane':
        return ('lane', key[1]), int(key[2])
    return ('call', key[1]), int(key[2])


def _step(key: StepKey, recs: dict[int, FlightRecord], missing: tuple[int, ...]) -> TimelineStep:
    first = recs[min(recs)]
    labels = {r.label for r in recs.values()}
    label = first.label if len(labels) == 1 else f'{first.label} (processes differ)'
    checked = key[0] in ('seq', 'lane')  # both wait at a cross-host check
    # A service barrier is a rendezvous: who arrived last waited least, as at a check.
    by_wait = checked or first.kind == SERVICE_BARRIER
    waiting = tuple(sorted(p for p, r in recs.items() if r.state == WAITING))
    if by_wait:
        waits = {p: r.wait for p, r in recs.items() if r.wait is not None}
        top = max(waits.values(), default=0.0)
        lateness = {p: max(top - w, 0.0) for p, w in waits.items()}
    else:
        t0 = min(r.time for r in recs.values())
        lateness = {p: r.time - t0 for p, r in recs.items()}
    return TimelineStep(
        label=label,
        kind=first.kind,
        name=first.name,
        seq=first.seq if checked else None,
        call=first.call,
        clock_compared=not by_wait,
        records=dict(sorted(recs.items())),
        lateness=dict(sorted(lateness.items())),
        waiting=waiting,
        missing=missing,
    )
