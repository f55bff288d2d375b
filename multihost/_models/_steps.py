"""The step table: host x step, what every host published at each collective step (plain data).

`StepTable` lists, for each collective step still visible in the coordination service, what every
host published there (kind, name, digest, call site) or that it has not arrived; whether the step
was released, passed, or is divergent (hosts about to call different things). The engines build
it (`multihost._debug._stepgate.step_table`), the notebook's stepper draws it.
"""

from __future__ import annotations

import collections
import dataclasses
import time as _time
from collections.abc import Iterable

from multihost._models._records import CollectiveRecord
from multihost._text import short_site


def _signature(rec: CollectiveRecord) -> tuple[str, str, str]:
    return (rec.kind, rec.name, rec.digest)


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective step (one sequence number) seen across every host.

    Attributes:
        seq: the step's position in the collective sequence.
        records: indexed by process: the record that host published at this
            step, or None if it has not arrived.
        released: the step was released (stepping); hosts that arrive pass the
            gate at once.
        passed: every host got through this step's barrier (some host has
            already published a later step).
        waiting: processes paused at this step's gate, waiting for its release.
    """

    seq: int
    records: tuple[CollectiveRecord | None, ...]
    released: bool = False
    passed: bool = False
    waiting: tuple[int, ...] = ()

    @property
    def arrived(self) -> tuple[int, ...]:
        """Processes that published a record at this step."""
        return tuple(p for p, r in enumerate(self.records) if r is not None)

    @property
    def missing(self) -> tuple[int, ...]:
        """Processes that have not arrived at this step."""
        return tuple(p for p, r in enumerate(self.records) if r is None)

    @property
    def complete(self) -> bool:
        """Every host has arrived."""
        return all(r is not None for r in self.records)

    @property
    def divergent(self) -> bool:
        """Hosts that arrived are about to call different collectives (kind, name or digest)."""
        return len({_signature(r) for r in self.records if r is not None}) > 1

    @property
    def majority(self) -> CollectiveRecord | None:
        """A record of the most common (kind, name, digest) among arrived hosts.

        Ties go to the lowest process index.
        """
        arrived = [r for r in self.records if r is not None]
        if not arrived:
            return None
        counts = collections.Counter(_signature(r) for r in arrived)
        best = max(counts.values())
        return next(r for r in arrived if counts[_signature(r)] == best)

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Arrived processes whose call differs from the majority's (empty unless divergent)."""
        ref = self.majority
        if ref is None:
            return ()
        return tuple(
            p
            for p, r in enumerate(self.records)
            if r is not None and _signature(r) != _signature(ref)
        )

    @property
    def status(self) -> str:
        """Where the step stands.

        ``'passed'``: every host is through. ``'released'``: hosts go through
        as they arrive. ``'paused'``: hosts wait at the gate for a release.
        ``'open'``: hosts that arrived went on to the barrier (stepping was
        off), waiting there for the others.
        """
        if self.passed:
            return 'passed'
        if self.released:
            return 'released'
        return 'paused' if self.waiting else 'open'


@dataclasses.dataclass(frozen=True)
class PausedLaunch:
    """A host paused by the step gate before a recorded launch (under `multihost.install`).

    Attributes:
        process: the host.
        n: the host's count of gated launches (its n-th).
        name: the jitted function's name.
        site: its call site (``file:line``).
        since: when the host started waiting (``time.time()``).
    """

    process: int
    n: int
    name: str
    site: str
    since: float = 0.0

    def describe(self) -> str:
        return f'p{self.process} before launch {self.name!r} @ {short_site(self.site)}'


@dataclasses.dataclass(frozen=True)
class StepTable:
    """Host x step: what every host published at the steps still in flight.

    The coordination service keeps the records of the current step and of the
    one before it (process 0 deletes older ones), so a table shows the step
    the hosts are at, and any divergence there *before* the hosts are released
    into a barrier that would fail or a device collective that would hang.
    A notebook that wants a longer history polls and merges tables.

    Attributes:
        num_processes: number of hosts.
        stepping: whether stepping is switched on (cluster-wide setting).
        steps: the visible steps, oldest first.
        positions: indexed by process: the latest step that host published,
            or None.
        released: every released step number, also steps no host has
            reached yet (released ahead).
        time: when the table was read (``time.time()``).
        launches: hosts paused before a recorded launch (under install), by process.
    """

    num_processes: int
    stepping: bool
    steps: tuple[Step, ...]
    positions: tuple[int | None, ...]
    released: tuple[int, ...] = ()
    time: float = 0.0
    launches: tuple[PausedLaunch, ...] = ()

    @classmethod
    def build(
        cls,
        records: Iterable[CollectiveRecord],
        released: Iterable[int],
        num_processes: int,
        stepping: bool,
        waiting: Iterable[tuple[int, int]] = (),
        time: float | None = None,
        launches: Iterable[PausedLaunch] = (),
    ) -> StepTable:
        """Builds a table (pure).

        Args:
            records: the published records (any order; several steps).
            released: released step numbers.
            num_processes: number of hosts.
            stepping: the stepping setting.
            waiting: (step, process) pairs of hosts paused at a step's gate.
            time: the reading time (default: now).
            launches: hosts paused before a recorded launch.
        """
        by_seq: dict[int, list[CollectiveRecord | None]] = {}
        positions: list[int | None] = [None] * num_processes
        for rec in records:
            if not 0 <= rec.process < num_processes:
                continue
            by_seq.setdefault(rec.seq, [None] * num_processes)[rec.process] = rec
            seen = positions[rec.process]
            if seen is None or rec.seq > seen:
                positions[rec.process] = rec.seq
        released = set(released)
        gated: dict[int, set[int]] = {}
        for k, p in waiting:
            gated.setdefault(k, set()).add(p)
        latest = max((p for p in positions if p is not None), default=None)
        steps = tuple(
            Step(
                seq=k,
                records=tuple(recs),
                released=k in released,
                passed=latest is not None and latest > k,
                waiting=tuple(sorted(gated.get(k, ()))),
            )
            for k, recs in sorted(by_seq.items())
        )
        return cls(
            num_processes=num_processes,
            stepping=bool(stepping),
            steps=steps,
            positions=tuple(positions),
            released=tuple(sorted(released)),
            time=_time.time() if time is None else time,
            launches=tuple(sorted(launches, key=lambda h: h.process)),
        )

    def step(self, seq: int) -> Step | None:
        """The step with sequence number ``seq``, if visible."""
        return next((s for s in self.steps if s.seq == seq), None)

    @property
    def pending(self) -> Step | None:
        """The first step where hosts wait for a release (status ``'paused'``)."""
        return next((s for s in self.steps if s.status == 'paused'), None)

    @property
    def next_release(self) -> int:
        """The step number `multihost.release` releases first.

        The pending step if there is one; otherwise the step after the
        furthest any host has published or any release reached (so repeated
        releases run ahead of the hosts, one step each).
        """
        pending = self.pending
        if pending is not None:
            return pending.seq
        reached = [p for p in self.positions if p is not None] + list(self.released)
        return max(reached) + 1 if reached else 0

    @property
    def divergent(self) -> tuple[Step, ...]:
        """The visible steps where hosts disagree."""
        return tuple(s for s in self.steps if s.divergent)

    def format(self) -> str:
        """A plain-text grid: one row per process, one column per step."""
        head = f'stepping {"on" if self.stepping else "off"}, {self.num_processes} process(es)'
        if self.launches:
            paused = self.launches
            head += f'\npaused before a launch: {", ".join(h.describe() for h in paused[:8])}'
            head += f' (+{len(paused) - 8} more)' if len(paused) > 8 else ''
        if not self.steps:
            return head + ', no collective in flight'
        cols = []
        for s in self.steps:
            mark = ' DIVERGENT' if s.divergent else ''
            cols.append(
                [f'#{s.seq} {s.status}{mark}']
                + [
                    (
                        '-- not arrived --'
                        if r is None
                        else (f'{r.kind}({r.name!r})' if r.name else r.kind)
                        + f' @ {short_site(r.site)}'
                    )
                    + (' [waiting]' if p in s.waiting else '')
                    + (' <-- differs' if p in s.odd_processes else '')
                    for p, r in enumerate(s.records)
                ]
            )
        rows = [['process'] + [f'p{p}' for p in range(self.num_processes)]]
        widths = [max(len(x) for x in rows[0])] + [max(len(x) for x in c) for c in cols]
        lines = [head]
        for i in range(self.num_processes + 1):
            cells = [rows[0][i]] + [c[i] for c in cols]
            lines.append('  '.join(x.ljust(w) for x, w in zip(cells, widths)).rstrip())
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format()
