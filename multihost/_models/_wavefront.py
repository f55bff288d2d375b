"""The wavefront, as plain data: how far every host got (`HostFront`, `Wavefront`; gathered by
`multihost._debug._wavefront.wavefront`), with the verdict in words.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from multihost._models._chipgrid import ChipGrid, collective_grid
from multihost._models._colltable import CollectiveOp, CollectiveTable, waiting_in
from multihost._models._pulse import WAITING_KINDS, Pulse
from multihost._models._stacks import background_words, display_path, phase_of, waiting_words
from multihost._recorder import FlightRecord
from multihost._text import fmt_duration, fmt_hosts


@dataclasses.dataclass(frozen=True)
class HostFront:
    """Where one host's flight recorder says it is.

    Attributes:
        process: the host's process index.
        answered: whether the host's debug thread answered in time.
        hostname: the machine's name.
        last: the newest entry of any kind (what the host last did).
        last_launch: the newest watched launch.
        last_collective: the newest core collective.
        pending: the oldest launch whose output is not ready on device
            (async dispatch lets a host run ahead of it), or None.
        pending_age: seconds since ``pending`` was launched (host's clock).
        pending_from: when launches before ``pending`` (after the newest known
            done) cannot be told done (their outputs donated or collected and no
            later one done), the oldest of them: the device is "somewhere in
            calls #N..#M"; else None.
        waiting: the entry whose cross-host check the main thread waits at, or None.
        waiting_for: seconds it has waited there.
        idle: seconds since the host last entered or left a recorded call.
        calls: watched function name -> how many times this host launched it.
        where: the main thread's innermost user frame, ``file:line in function``.
        activity: what the main thread's stack says it does, in words, durations
            aside (`_stacks.stack_activity`): ``'waiting in a
            coordination-service barrier at orbax/...:309 in _fn (via
            sync_global_processes), called from ckpt.py:12 in save'``, ``'in user
            code at train.py:88 in load, in time.sleep'``...
        activity_kind: its kind: ``'coordination'``, ``'device'``, ``'jax'``,
            ``'sleep'``, ``'io'``, ``'lock'``, ``'user'`` (empty: not seen).
        error: why there is no answer (empty when ``answered``).
        background: service calls (a library's own barriers and key waits on
            the coordination service) in progress on other threads, oldest first.
        time: when the host answered (its clock).
        pulse: its CPU share and whether its main thread's stack moved over the last
            few seconds (`Pulse`: busy told from wedged), or None (not sampled).
        collectives: the collective table of ``pending``'s program (`CollectiveTable`), when
            the installed jit launched it and the host was asked for it (`wavefront`, a
            dump's own ``collectives``); else None.
    """

    process: int
    answered: bool
    hostname: str = ''
    last: FlightRecord | None = None
    last_launch: FlightRecord | None = None
    last_collective: FlightRecord | None = None
    pending: FlightRecord | None = None
    pending_age: float = 0.0
    waiting: FlightRecord | None = None
    waiting_for: float = 0.0
    idle: float = 0.0
    calls: tuple[tuple[str, int], ...] = ()
    where: str = ''
    activity: str = ''
    activity_kind: str = ''
    error: str = ''
    background: tuple[FlightRecord, ...] = ()
    time: float = 0.0
    pulse: Pulse | None = None
    pending_from: FlightRecord | None = None
    collectives: CollectiveTable | None = None

    @property
    def jit_phase(self) -> str:
        """``'compiling'`` or ``'tracing'`` when the main thread is inside jit's compile or
        trace of a function (`_stacks.jit_phase`: busy, it will come; its launch is in its
        call, not on a device), else ``''``."""
        return phase_of(self.activity_kind, self.activity)

    def launched(self, name: str) -> int:
        """How many times this host launched ``name``."""
        return dict(self.calls).get(name, 0)

    @property
    def doing(self) -> str:
        """What the host is doing now, in words."""
        if not self.answered:  # the error says it: 'no answer within 10 s', ...
            return self.error or 'no answer'
        return self._main_doing() + background_words(self.background, self.time)

    def _main_doing(self) -> str:
        if self.waiting is not None:
            return f'waiting {waiting_words(self.waiting)} for {fmt_duration(self.waiting_for)}'
        if self.pending is not None and self.jit_phase:
            ago = fmt_duration(self.pending_age)
            at = f', at {self.where}' if self.where else ''
            return f'{self.jit_phase} {self.pending.label} (called {ago} ago){at}'
        if self.pending is not None and self.pending_from is not None:
            old, new = self.pending_from, self.pending
            span = f'{new.name} calls #{old.call}..#{new.call}'
            if old.name != new.name:
                span = f'{old.label} .. {new.label}'
            return (
                f"somewhere in {span} not done on device (the earlier ones' outputs are "
                f'gone: donated or collected; launched {fmt_duration(self.pending_age)} ago)'
                + (f', now at {self.where}' if self.where else '')
            )
        if self.pending is not None:
            return (
                f'{self.pending.label} not done on device '
                f'(launched {fmt_duration(self.pending_age)} ago)'
                + (f', now at {self.where}' if self.where else '')
            )
        last = f', last {self.last.label} {fmt_duration(self.idle)} ago' if self.last else ''
        return (self.activity or f'running user code at {self.where or "?"}') + last

    def to_json(self) -> str:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not isinstance(getattr(self, f.name), (FlightRecord, CollectiveTable))
        }
        for f in ('last', 'last_launch', 'last_collective', 'pending', 'waiting', 'pending_from'):
            rec = getattr(self, f)
            d[f] = None if rec is None else dataclasses.astuple(rec)
        d['background'] = [dataclasses.astuple(r) for r in self.background]
        d['pulse'] = None if self.pulse is None else self.pulse.to_dict()
        table = self.collectives
        d['collectives'] = None if table is None else dataclasses.asdict(table)
        return json.dumps(d, separators=(',', ':'))

    @classmethod
    def from_json(cls, text: str) -> HostFront:
        d = json.loads(text)
        d['pulse'] = Pulse.from_dict(d.get('pulse'))
        if d.get('collectives') is not None:
            d['collectives'] = CollectiveTable.from_dict(d['collectives'])
        for f in ('last', 'last_launch', 'last_collective', 'pending', 'waiting', 'pending_from'):
            if d.get(f) is not None:
                d[f] = FlightRecord(*d[f])
        d['calls'] = tuple((str(k), int(v)) for k, v in d.get('calls', ()))
        d['background'] = tuple(FlightRecord(*r) for r in d.get('background', ()))
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Wavefront:
    """Every host's `HostFront`, and the verdict about the oldest launch not done.

    Attributes:
        hosts: one `HostFront` per process, in process order.
        time: when it was read (``time.time()`` of the asking host).
    """

    hosts: tuple[HostFront, ...]
    time: float = 0.0

    @property
    def silent(self) -> tuple[int, ...]:
        """Hosts that did not answer."""
        return tuple(h.process for h in self.hosts if not h.answered)

    @property
    def target(self) -> FlightRecord | None:
        """The oldest launch not done on device on any host (what the verdict is about)."""
        pending = [h.pending for h in self.hosts if h.answered and h.pending is not None]
        return min(pending, key=lambda r: (r.time, r.process)) if pending else None

    def groups(self) -> dict[str, tuple[int, ...]]:
        """``'inside'``, ``'past'``, ``'never'`` (launched the target or not), ``'silent'``."""
        target = self.target
        out: dict[str, list[int]] = {'inside': [], 'past': [], 'never': [], 'silent': []}
        for h in self.hosts:
            if not h.answered:
                out['silent'].append(h.process)
            elif target is None:
                continue
            elif h.launched(target.name) <= target.call:
                out['never'].append(h.process)
            elif h.pending is not None and (
                h.pending.name != target.name or h.pending.call <= target.call
            ):
                out['inside'].append(h.process)
            else:
                out['past'].append(h.process)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def verdict(self) -> str:
        """One line: who is inside the oldest launch not done, who never launched it, and where."""
        parts: list[str] = []
        target = self.target
        answered = [h for h in self.hosts if h.answered]
        if target is not None:
            parts += self._target_parts(target)
        else:
            waiting: dict[str, list[HostFront]] = {}
            running: list[HostFront] = []
            for h in answered:
                if h.waiting is not None:
                    waiting.setdefault(waiting_words(h.waiting), []).append(h)
                else:
                    running.append(h)
            for words, hs in waiting.items():
                longest = fmt_duration(max(h.waiting_for for h in hs))
                parts.append(f'{_are([h.process for h in hs])} waiting {words} for {longest}')
            if waiting:
                elsewhere = _grouped(running, _position)
                for ps, position in elsewhere[:MAX_GROUPS]:
                    parts.append(f'{_are(ps)} not there: {position}')
                parts.extend(_more(elsewhere))
            elif answered:
                # Nothing watched is pending and no check is waited at: say what the stacks
                # show (a JAX collective, a library's coordination-service barrier, user code).
                states = _grouped(answered, _activity)
                for ps, words in states[:MAX_GROUPS]:
                    parts.append(f'{_are(ps)} {words}')
                parts.extend(_more(states))
        if self.silent:
            parts.append(f'{_are(self.silent)} silent (dead, frozen, or no debug thread)')
        return '; '.join(parts) or 'no process answered'

    def stuck_collective(self) -> tuple[CollectiveTable, CollectiveOp, tuple[int, ...]] | None:
        """(the table of the launch the leading hosts are inside, the first cross-host
        collective in it that needs a host that never launched it, those hosts) when the
        verdict names one; else None."""
        target = self.target
        if target is None:
            return None
        g = self.groups()
        inside = [self.hosts[p] for p in g['inside'] if not self.hosts[p].jit_phase]
        table = _launch_table(inside, target.label)
        op = table.first_holding(g['never']) if table is not None and g['never'] else None
        return (table, op, g['never']) if table is not None and op is not None else None

    def stuck_grid(self) -> ChipGrid | None:
        """The pod under `stuck_collective` (`_chipgrid.collective_grid`: each chip labelled
        with its group, the hosts it waits for marked); None without one or without chip
        coordinates (CPU)."""
        stuck = self.stuck_collective()
        return None if stuck is None else collective_grid(*stuck)

    def _target_parts(self, target: FlightRecord) -> list[str]:
        """The verdict's parts about the oldest launch not done: who is inside it (and the
        collective they wait in, when the table is known), tracing or compiling it, past it,
        and who never launched it."""
        parts: list[str] = []
        g = self.groups()
        inside = [self.hosts[p] for p in g['inside']]
        what = target.label
        launching = [h for h in inside if not h.jit_phase]
        if launching:
            age = max(h.pending_age for h in launching)
            launched = f'launched {fmt_duration(age)} ago'
            ps = [h.process for h in launching]
            parts.append(f'{_are(ps)} inside {what} ({launched}, not done)')
            wait = waiting_in(_launch_table(launching, what), g['never'])
            if wait:  # the collective under the launch: where they wait at the latest
                parts[-1] += f', waiting {wait}'
        for phase in ('tracing', 'compiling'):  # its call has not launched it yet
            hs = [h for h in inside if h.jit_phase == phase]
            if hs:
                called = fmt_duration(max(h.pending_age for h in hs))
                parts.append(
                    f'{_are([h.process for h in hs])} {phase} {what} (called {called} ago)'
                )
        if g['past']:
            parts.append(f'{_are(g["past"])} past it')
        never = _grouped([self.hosts[p] for p in g['never']], _position)
        for ps, position in never[:MAX_GROUPS]:
            parts.append(f'{fmt_hosts(ps)} never launched call #{target.call}: {position}')
        parts.extend(_more(never))
        return parts

    def format(self) -> str:
        """The verdict, then one line per host saying what it is doing."""
        lines = [self.verdict]
        for h in self.hosts:
            lines.append(f'  process {h.process}: {h.doing}{_pulse_words(h)}')
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format()


def _launch_table(hosts: list[HostFront], label: str) -> CollectiveTable | None:
    """The collective table of launch ``label`` from the first of ``hosts`` (inside it, not
    tracing or compiling) that holds one; None when none does."""
    tables = [h.collectives for h in hosts if h.pending and h.pending.label == label]
    return next((t for t in tables if t is not None), None)


def _are(processes: Any) -> str:
    ps = list(processes)
    return f'{fmt_hosts(ps)} {"is" if len(ps) == 1 else "are"}'


#: Groups of hosts (same words) a verdict names; the rest are counted.
MAX_GROUPS = 8


def _grouped(hosts: list[HostFront], words: Any) -> list[tuple[list[int], str]]:
    """Hosts grouped by ``words(host)``, largest group first (ties: lowest process)."""
    groups: dict[str, list[int]] = {}
    for h in hosts:
        groups.setdefault(words(h), []).append(h.process)
    return sorted(((ps, w) for w, ps in groups.items()), key=lambda g: (-len(g[0]), g[0][0]))


def _more(groups: list[tuple[list[int], str]]) -> list[str]:
    if len(groups) <= MAX_GROUPS:
        return []
    rest = [p for ps, _ in groups[MAX_GROUPS:] for p in ps]
    return [f'{fmt_hosts(rest)} in {len(groups) - MAX_GROUPS} more states']


def _activity(h: HostFront) -> str:
    if h.activity:
        return h.activity + _also(h)
    where = f'running user code at {_display_site(h.where)}' if h.where else 'in no user code'
    return where + _also(h)


def _position(h: HostFront) -> str:
    last = f'last at {h.last.label}' if h.last is not None else 'nothing recorded yet'
    if h.waiting is not None:
        return f'{last}, waiting at its check for {fmt_duration(h.waiting_for)}' + _also(h)
    if h.activity:
        return f'{last}, now {h.activity}' + _brief(h) + _also(h)
    return last + (f', now at {_display_site(h.where)}' if h.where else '') + _brief(h) + _also(h)


def _brief(h: HostFront) -> str:
    """``, wedged (no CPU, stack unchanged)``: busy or wedged in the verdict, for a host not
    waiting for the others (no figures: hosts in a group share the words)."""
    if h.pulse is None or h.activity_kind in WAITING_KINDS:
        return ''
    return f', {h.pulse.brief}'


def _pulse_words(h: HostFront) -> str:
    """``; 0% CPU over the last 5 s, stack unchanged: wedged`` on a host's own line (not
    for a host waiting for the others: at a check, a service barrier, a device wait)."""
    if h.pulse is None or not h.answered or h.waiting is not None:
        return ''
    if h.activity_kind in WAITING_KINDS:
        return ''
    return f'; {h.pulse.words}'


def _also(h: HostFront) -> str:
    """``, and waiting in service barrier 'x' at f.py:3 (thread 'save')`` per service call
    another thread is inside (no durations: hosts in the same state say the same words)."""
    return ''.join(f', and waiting {waiting_words(r)}' for r in h.background)


def _display_site(where: str) -> str:
    """``/long/path/data.py:88 in load_shard`` -> ``data.py:88 in load_shard`` (a file named
    like ours keeps its folder: `_stacks.display_path`)."""
    path, sep, rest = where.partition(':')
    return display_path(path) + sep + rest
