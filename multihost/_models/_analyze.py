"""``multihost analyze DIR...``: the verdict from the dumps a job left (pure functions).

`analyze` turns `_dumpfile.Dump` s into a frozen `Verdict`; `Verdict.lines`
says it in at most `MAX_LINES` lines at any number of hosts (hosts grouped as
ranges). The culprit is a host whose position is *behind* or *different*
(it never reached the collective the others wait in, or called another one
there), never the one that wrote first: a host that dumped because its
timeout fired is healthy when it stands where the rest stand.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from multihost._models._colltable import (
    all_inside_words,
    by_program,
    parting_lines,
    stuck_words,
)
from multihost._models._dumpfile import Dump, DumpFormatError, read_dirs
from multihost._models._native import NativeStacks
from multihost._models._native import read_dirs as read_native_dirs
from multihost._models._pulse import WAITING_KINDS
from multihost._models._stacks import HostStacks, frame_package
from multihost._models._wavefront import HostFront
from multihost._recorder import FlightRecord
from multihost._text import (
    SOURCE_PATHS_FIX,
    dirs_by_host,
    failure_phrase,
    first_line,
    fmt_duration,
    fmt_hosts,
    short_site,
)

MAX_LINES = 20
MAX_GROUPS = 5  # positions shown; more are counted on one line


@dataclasses.dataclass(frozen=True)
class Group:
    """Hosts at one position: ``what`` in words, for at most ``since`` seconds at their dumps."""

    processes: tuple[int, ...]
    what: str
    since: float | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the dumps say.

    Attributes:
        num_processes: the job's size (the largest ``num_processes`` of the dumps).
        dumped: processes with a dump.
        missing: processes without one (``no dump from process 7``).
        gone: process -> why another host's dump says it is gone.
        triggers: trigger -> the processes that dumped for it.
        target: where the leading hosts wait (the record label), or empty.
        in_launch: the target is a jitted launch the leading hosts are inside, not done
            on device (no checked collective waits): a host that never made that call
            is behind.
        waiting: the hosts waiting at ``target``.
        behind: hosts that never arrived at ``target``, grouped by where they are.
        mismatches: for a mismatch: each distinct call and who made it.
        elsewhere: the other positions (hosts not waiting, not behind).
        straggler: the host furthest behind, or None.
        straggler_why: why it is the straggler.
        cause: the first failure, when a host raised or exited with an error
            (``process 2 raised ValueError('bad batch') at train.py:118``), from its
            own dump or, when it left none, from the others' ``peer`` dumps.
        native: what the hosts' faulthandler stacks say (`_native`): a lost coordination
            service, hosts ended by a fatal error, hosts that held the GIL.
        audit: what the audit (``--audit``) had found, each finding once
            (``audit: replica drift at train_step call #2 ...``).
        went_on: when every dump is a hang dump (or written at one's request) and each
            hang's wait went on afterwards (a slow host came): ``not a hang: ...``, and the
            hosts behind are slow, not culprits; else empty.
        never_ends: why the launch every host is inside can never end, when the dumps say
            (`_source_paths`: one file at different paths on jax >= 0.12 with CPU
            devices); else empty. Also under a cause (Ctrl-C is how such a hang ends).
        collective: when hosts are inside a launch that others never launched and a dump
            holds the launch's collective table: the first of its cross-host collectives
            that needs a host behind (`_colltable.stuck_words`); else empty.
        memory: when every dumped host is inside one launch: each host's device memory as
            its allocator reported it when it dumped (`memory_words`), or that the backend
            reports none; else empty.
        parting: when the dumps hold tables of the launch that differ between hosts (hosts
            that compiled different programs): where their cross-host collectives part,
            each side with its line (`_colltable.parting_lines`); else empty.
    """

    num_processes: int
    dumped: tuple[int, ...]
    missing: tuple[int, ...]
    gone: dict[int, str]
    triggers: dict[str, tuple[int, ...]]
    target: str = ''
    waiting: Group | None = None
    behind: tuple[Group, ...] = ()
    mismatches: tuple[Group, ...] = ()
    elsewhere: tuple[Group, ...] = ()
    straggler: int | None = None
    straggler_why: str = ''
    cause: str = ''
    in_launch: bool = False
    native: tuple[str, ...] = ()
    audit: tuple[str, ...] = ()
    went_on: str = ''
    never_ends: str = ''
    collective: str = ''
    parting: tuple[str, ...] = ()
    memory: str = ''

    @property
    def culprits(self) -> tuple[int, ...]:
        """The hosts behind or different (never one that is where the others are)."""
        out = {p for g in self.behind for p in g.processes}
        if self.mismatches:
            minority = sorted(self.mismatches, key=lambda g: len(g.processes))[:-1]
            out.update(p for g in minority for p in g.processes)
        return tuple(sorted(out))

    def lines(self) -> list[str]:
        return format_verdict(self)

    def __str__(self) -> str:
        return '\n'.join(self.lines())


def _key_of(rec: FlightRecord) -> tuple[str, str, int | None, int]:
    return (rec.kind, rec.name, rec.seq, rec.call)


def _raised(d: Dump) -> str:
    """``raised ValueError('bad batch') at train.py:118`` for an exception dump, else ''."""
    if d.trigger != 'exception':
        return ''
    error = d.details.get('error', 'an error')
    message = first_line(d.details.get('message', ''))
    own = _own_frames(d)
    site = f' at {short_site(f"{own[-1][0]}:{own[-1][1]}")}' if own else ''
    if error == 'SystemExit':
        return f'exited with code {message}{site}'
    return f'raised {error}({message!r}){site}'


def _own_frames(d: Dump) -> list[Any]:
    """The traceback's frames of the program, outermost first: not ours or runpy's, nor a
    library's (JAX's ``array.py in _value`` under ``float(loss)`` is the program's line that
    called it); when only such frames are left, those not ours."""
    frames = d.details.get('traceback') or []
    own = [f for f in frames if '/multihost/' not in str(f[0]) and 'runpy' not in str(f[0])]
    program = [f for f in own if not any(m in str(f[0]) for m in _LIBRARIES)]
    return program or own


#: Where a library's or Python's own file lives (`_fate` reads the same marks).
_LIBRARIES = ('/site-packages/', '/dist-packages/', '/lib/python', '<frozen ')


def _interrupted(d: Dump) -> str:
    """``interrupted at train.py:93 in <module>: time.sleep(60)`` for an ``interrupt`` dump
    (its traceback's innermost frame of the program), else ''."""
    if d.trigger != 'interrupt':
        return ''
    own = _own_frames(d)
    if not own:
        return 'interrupted'
    file, line, fn, text = (list(own[-1]) + ['', '', '', ''])[:4]
    code = f': {str(text).strip()}' if str(text).strip() else ''
    return f'interrupted at {short_site(f"{file}:{line}")} in {fn}{code}'


def _cause(dumps: Sequence[Dump], stacks: Sequence[NativeStacks] = ()) -> str:
    """The first failure: an exception dump (earliest), else what the ``peer`` dumps say."""
    lost = [d for d in dumps if d.trigger == 'lost' and d.details.get('lost') is not None]
    if lost:
        held = {s.process: s for s in stacks if s.by_watchdog}
        return _lost_line(lost[0].details, {d.process for d in dumps}, held)
    raised = sorted((d for d in dumps if _raised(d)), key=lambda d: d.trigger_time)
    if raised:
        return f'process {raised[0].process} {_raised(raised[0])}'
    stopped = sorted(d.process for d in dumps if d.trigger == 'interrupt')
    if stopped:  # Ctrl-C on the job: the dumps say where each host was then
        at = _clock(min(d.trigger_time for d in dumps if d.trigger == 'interrupt'))
        were = 'was' if len(stopped) == 1 else 'were'
        return (
            f'{fmt_hosts(stopped)} {were} interrupted (KeyboardInterrupt: Ctrl-C or SIGINT) '
            f'at {at}; where each host was then:'
        )
    for d in dumps:
        if d.trigger == 'peer':
            early = d.details.get('early')
            source = early if early is not None else d.details.get('by')
            own = source in {x.process for x in dumps}
            return failure_phrase(dict(d.details)) + ('' if own else ' (its own dump is missing)')
    return ''


def _source_paths(dumps: Sequence[Dump], launch: FlightRecord) -> str:
    """Why every host is inside the same launch and it never ends, when the hosts called it
    from the same line of one file at different paths (a directory per host, as per-host
    staging does) on jax >= 0.12 with CPU devices: there a program's collectives meet only
    within one executable, and the paths make the executables differ (measured: jax 0.12.1
    hung in the first all-reduce, 0.10.2 did not). '' otherwise."""
    sites = {
        d.process: d.front.pending.site
        for d in dumps
        if d.front.pending is not None
        and (d.front.pending.name, d.front.pending.call) == (launch.name, launch.call)
    }
    if len(sites) < 2 or len(sites) != len(dumps) or len(dumps) != dumps[0].num_processes:
        return ''
    if not all(collectives_keyed_by_program(d.jax_version, d.platform) for d in dumps):
        return ''
    if len({s.rsplit(':', 1)[0] for s in sites.values()}) < 2:
        return ''
    if len({short_site(s) for s in sites.values()}) != 1:
        return ''
    jax_version = max((d.jax_version for d in dumps), key=_version)
    return (
        f'{fmt_hosts(sites)} called {launch.label} from {short_site(sites[min(sites)])} at '
        f'different paths ({dirs_by_host(sites)}). On jax {jax_version} with CPU devices '
        "the source paths make each host's executable different, and a program's "
        'collectives meet only within one executable: this launch never ends. '
        + SOURCE_PATHS_FIX
        + ' (multihost run --check-jit says this before the launch)'
    )


def collectives_keyed_by_program(jax_version: str, platform: str) -> bool:
    """Whether a program's collectives meet only within one executable across hosts there:
    measured with CPU devices, two hosts running one script from two directories
    (executables that differ only in source paths) hung in the first all-reduce on jax
    0.12.1, not on jax 0.10.2 (their executables differ there too)."""
    return platform == 'cpu' and _version(jax_version) >= (0, 12)


def _version(text: str) -> tuple[int, int]:
    """``'0.12.1'`` -> ``(0, 12)``; unreadable: ``(0, 0)``."""
    try:
        major, minor = (int(v) for v in text.split('.')[:2])
    except ValueError:
        return (0, 0)
    return (major, minor)


def _lost_line(details: Any, dumped: set[int], held: dict[int, NativeStacks] | None = None) -> str:
    """``process 2 was lost at 07:02:11 (no dump: killed or its machine gone); last seen at
    train_step call #5 at train.py:120`` from a survivor's ``lost`` dump. A host whose GIL
    watchdog wrote its stacks (``held``) was alive, its Python stopped: said so."""
    p = details.get('lost')
    at = time.strftime('%H:%M:%S', time.localtime(float(details.get('lost_at') or 0)))
    if held and p in held:
        return (
            f'process {p} was taken for lost at {at} (no liveness stamp for '
            f'{details.get("silent")} s): it was alive but held the GIL, no Python of it ran '
            f'({os.path.basename(held[p].path)})'
        )
    why = 'no dump: killed or its machine gone' if p not in dumped else 'its last stamp'
    last = f'; last seen at {details["last"]}' if details.get('last') else ''
    return f'process {p} was lost at {at} (its last heartbeat; {why}){last}'


def _clock(t: float) -> str:
    return time.strftime('%H:%M:%S', time.localtime(t))


def position(d: Dump) -> tuple[str, float | None]:
    """Where ``d``'s host was, in words, and for how long (None: not known)."""
    if _raised(d):
        return _raised(d), None
    if _interrupted(d):
        return _interrupted(d), None
    if d.trigger == 'peer' and d.details.get('early') == d.process:  # it had ended (0)
        return str(d.details.get('where')), None
    if d.trigger in ('lost', 'peer') and d.details.get('where'):
        if d.trigger == 'lost':
            because = f'process {d.details.get("lost")} was lost'
        elif d.details.get('early') is not None:
            because = f'process {d.details["early"]} ended early (exit code 0)'
        elif d.process in (d.details.get('missing') or ()):
            because = f'process {d.details.get("by")} timed out waiting for it'
        elif d.details.get('error') == 'KeyboardInterrupt':
            because = f'process {d.details.get("by")} was interrupted'
        else:
            because = f'process {d.details.get("by")} failed'
        if d.asked is not None:  # the moment the others missed it, kept by this later dump
            then, since = position(d.asked)
            at, ended = _clock(d.asked.trigger_time), _clock(d.trigger_time)
            return f'when missed at {at}: {then}; never arrived: ended at {ended}, {because}', since
        # Its front at that moment (what it was doing, busy or wedged), then why it ended.
        then, since = _front_position(d)
        return f'{then}; then ended: {because}', since
    return _front_position(d)


def _front_position(d: Dump) -> tuple[str, float | None]:
    f = d.front
    if f.pending is not None and f.waiting is None and f.jit_phase:  # not launched yet
        brief = f', {f.pulse.brief}' if f.pulse is not None else ''
        site = short_site(f.pending.site)
        return f'{f.jit_phase} {f.pending.label} at {site} (not launched yet){brief}', f.pending_age
    if f.pending is not None and f.waiting is None:
        return (
            f'inside {f.pending.label} at {short_site(f.pending.site)} (not done on device)',
            f.pending_age,
        )
    where = f.where or (d.stacks.where if d.stacks is not None else '')
    # Busy or wedged (no figures: hosts in a group share the words).
    waits = f.waiting is not None or f.activity_kind in WAITING_KINDS
    brief = f', {f.pulse.brief}' if f.pulse is not None and not waits else ''
    if f.activity:
        return f.activity + brief, f.idle
    last = f' (last {f.last.label})' if f.last is not None else ''
    return f'in user code at {where or "?"}{last}{brief}', f.idle


def _arrived_late(d: Dump, at: FlightRecord) -> str:
    """``when missed at 07:02:11: in user code at train.py:93 in <module>, in time.sleep,
    wedged (...); arrived at 07:02:51 (40 s later)`` for a host the others timed out
    waiting for, whose own wait there timed out after it arrived."""
    arrived = f'arrived at {_clock(at.time)}'
    if d.asked is None:
        return f'{arrived}, after the others had given up'
    then, _ = position(d.asked)
    missed = d.asked.trigger_time
    late = f' ({fmt_duration(at.time - missed)} later)' if at.time >= missed else ''
    return f'when missed at {_clock(missed)}: {then}; {arrived}{late}'


def _at(d: Dump) -> tuple[FlightRecord | None, float]:
    """The record ``d``'s main thread waits in (or, for a timeout or mismatch dump, the one
    that just failed there), and for how long (seconds, at the dump)."""
    f = d.front
    if f.waiting is not None:
        return f.waiting, f.waiting_for
    last = next((r for r in reversed(d.records) if not r.thread), None)
    if (
        d.trigger in ('timeout', 'mismatch', 'interrupt')
        and last is not None
        and last.state == 'failed'
    ):
        return last, max(0.0, d.trigger_time - last.time)
    return None, 0.0


def at_dump(d: Dump) -> tuple[HostFront, HostStacks]:
    """``d``'s wavefront position and stacks as `analyze` reads them.

    A host that dumped at its own timeout or mismatch wrote the dump while the
    error was built, once its wait had ended: its front and stacks say it runs
    (user code, the error's frames), yet it was waiting in the check that failed
    there (`_at`). It is given that entry as ``waiting``, so the wavefront and
    the where view say what ``python -m multihost analyze`` says.
    """
    f, stacks = d.front, d.stacks
    at, waited = _at(d)
    if at is None or f.waiting is not None:
        return f, stacks
    f = dataclasses.replace(f, waiting=at, waiting_for=waited)
    if stacks is not None and stacks.waiting is None:
        stacks = dataclasses.replace(stacks, waiting=at, waiting_for=waited)
    return f, stacks


def _target(dumps: Sequence[Dump]) -> FlightRecord | None:
    """The record the most advanced group waits in (highest sequence number, most hosts)."""
    counts: collections.Counter[tuple[str, str, int | None, int]] = collections.Counter()
    recs: dict[tuple[str, str, int | None, int], FlightRecord] = {}
    for d in dumps:
        w = _at(d)[0]
        if w is not None:
            k = _key_of(w)
            counts[k] += 1
            recs.setdefault(k, w)
    if not counts:
        return None
    best = max(counts, key=lambda k: (k[2] if k[2] is not None else -1, counts[k]))
    return recs[best]


def _launch_target(dumps: Sequence[Dump]) -> FlightRecord | None:
    """The furthest launch hosts are inside (not done on device), when no host waits at a
    check: the hosts stuck in a jitted step's device collective."""
    pending = [d.front.pending for d in dumps if d.front.pending is not None and _at(d)[0] is None]
    if not pending:
        return None
    return max(pending, key=lambda r: (r.call, r.name))


def _calls_of(d: Dump, name: str) -> int:
    """The last call number of launch ``name`` on ``d``'s main thread (-1: none recorded)."""
    calls = [r.call for r in d.records if r.kind == 'launch' and r.name == name and not r.thread]
    if d.front.pending is not None and d.front.pending.name == name:
        calls.append(d.front.pending.call)
    return max(calls, default=-1)


def _placed_in_launch(
    dumps: Sequence[Dump], target: FlightRecord
) -> tuple[Placed, Placed, Placed, dict[int, int]]:
    """`_placed` for a launch target: inside it, never made that call, elsewhere."""
    inside: Placed = []
    behind: Placed = []
    elsewhere: Placed = []
    lag: dict[int, int] = {}
    for d in dumps:
        f = d.front
        if f.pending is not None and (f.pending.name, f.pending.call) == (target.name, target.call):
            inside.append((d.process, target.label, f.pending_age))
            continue
        what, since = position(d)
        call = _calls_of(d, target.name)
        if call < target.call:
            behind.append((d.process, _behind_words(f, what), since))
            lag[d.process] = call
        else:
            elsewhere.append((d.process, what, since))
    return inside, behind, elsewhere, lag


def _mismatch_groups(dumps: Sequence[Dump]) -> tuple[Group, ...]:
    """From the mismatch triggers' details: each distinct call (describe) and its processes."""
    calls: dict[str, set[int]] = collections.defaultdict(set)
    for d in dumps:
        if d.trigger != 'mismatch':
            continue
        for p, c in dict(d.details.get('calls') or {}).items():
            calls[str(c.get('describe', c)) if isinstance(c, dict) else str(c)].add(int(p))
    return tuple(
        Group(tuple(sorted(ps)), what)
        for what, ps in sorted(calls.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    )


def _grouped(items: Iterable[tuple[int, str, float | None]]) -> tuple[Group, ...]:
    by: dict[str, list[tuple[int, float | None]]] = collections.defaultdict(list)
    for p, what, since in items:
        by[what].append((p, since))
    groups = []
    for what, members in by.items():
        times = [s for _, s in members if s is not None]
        groups.append(Group(tuple(sorted(p for p, _ in members)), what, max(times, default=None)))
    return tuple(sorted(groups, key=lambda g: (-len(g.processes), g.processes[0])))


MAX_NATIVE_LINES = 4
LEADER_LOST = 'process 0 (the coordination service) was lost'


def native_lines(stacks: Sequence[NativeStacks], dumps: Sequence[Dump]) -> tuple[str, ...]:
    """What the hosts' faulthandler stacks (`_native`) say, a few lines at most.

    A fatal error (JAX aborts the hosts whose coordination service is gone; a segfault):
    the hosts it ended, grouped, and, when they were aborted and process 0 left nothing,
    that process 0 (the service) was lost. A held GIL: a block from the GIL watchdog
    means no Python thread ran for its limit; a block from the dump signal counts when no
    JSON dump followed within a second (the signal's Python handler could not run).
    """
    by = {d.process: d for d in dumps}
    out: list[str] = []
    fatal: dict[tuple[str, str], list[NativeStacks]] = collections.defaultdict(list)
    held: list[str] = []
    for s in stacks:
        # The innermost frame of the program itself (not of multihost, JAX or Python).
        own = [f for f in s.frames if frame_package(f[0]) is None] or list(s.frames)
        file, line, function = own[0] if own else ('?', 0, '?')
        site = f'{short_site(f"{file}:{line}")} in {function}' if own else 'no Python frame'
        d = by.get(s.process)
        if s.fatal and (d is None or d.written <= s.written):
            fatal[(s.fatal, site)].append(s)
            if s.by_watchdog:  # it held the GIL before the fatal error
                held.append(
                    f'process {s.process} held the GIL (no Python ran for {s.hang:g} s) at '
                    f'{site} until it was ended ({os.path.basename(s.path)})'
                )
            continue
        late = None if d is None else d.written - s.written
        if not s.by_watchdog and late is not None and late < 1.0:
            continue  # the signal's JSON dump followed at once: Python ran
        if late is None:
            follow = 'no JSON dump followed'
        elif late >= 1.0:
            follow = f'its JSON dump followed {fmt_duration(late)} later'
        else:
            follow = 'its JSON dump followed'
        how = f'no Python ran for {s.hang:g} s' if s.by_watchdog else 'signalled'
        held.append(
            f'process {s.process} held the GIL ({how}) at {site}, stacks at '
            f'{_clock(s.written)} in {os.path.basename(s.path)}; {follow}'
        )
    ended = [s for group in fatal.values() for s in group]
    aborted = sorted(s.process for s in ended if s.fatal == 'Aborted')
    leader_left_nothing = 0 not in by and all(s.process != 0 for s in stacks)
    if aborted and leader_left_nothing:
        at = _clock(min(s.written for s in ended if s.fatal == 'Aborted'))
        out.append(
            f'{LEADER_LOST} at about {at} (no dump): JAX '
            f'aborted {fmt_hosts(aborted)} then (a lost service ends every host at once)'
        )
    for (what, site), group in sorted(fatal.items(), key=lambda kv: -len(kv[1])):
        ps = sorted(s.process for s in group)
        were = 'was' if len(ps) == 1 else 'were'
        out.append(
            f'{fmt_hosts(ps)} {were} ended by a fatal error ({what}) at '
            f'{_clock(max(s.written for s in group))}, main thread at {site} (*.stacks.txt)'
        )
    out.extend(held)
    if len(out) > MAX_NATIVE_LINES:
        rest = len(out) - MAX_NATIVE_LINES + 1
        out = out[: MAX_NATIVE_LINES - 1] + [f'{rest} more lines in the *.stacks.txt files']
    return tuple(out)


Placed = list[tuple[int, str, float | None]]


def _behind_words(f: HostFront, what: str) -> str:
    """``last at barrier('data') #411, now <what>`` for a host behind the target."""
    last = f'last at {f.last.label}' if f.last is not None else 'no recorded call yet'
    now = (
        '; '
        if what.startswith('when missed at ')
        else ', then '
        if what.startswith('interrupted')
        else ', now '
    )
    return f'{last}{now}{what}'


def _placed(
    dumps: Sequence[Dump], target: FlightRecord | None, said_missing: set[int]
) -> tuple[Placed, Placed, Placed, dict[int, int]]:
    """Each dumped host placed: (waiting at ``target``, behind it, elsewhere, and how far
    behind: the sequence number of its last collective)."""
    waiting_at: Placed = []
    behind: Placed = []
    elsewhere: Placed = []
    lag: dict[int, int] = {}
    for d in dumps:
        f = d.front
        at, waited = _at(d)
        there = target is not None and at is not None and _key_of(at) == _key_of(target)
        if there and d.process in said_missing and at is not None:
            # The others gave up on it, and it came later: where it was when they missed it
            # (kept from their dump request, when it got one) and when it arrived.
            behind.append((d.process, _arrived_late(d, at), None))
            lag[d.process] = at.seq - 1 if at.seq is not None else -1
            continue
        if there and target is not None:
            waiting_at.append((d.process, target.label, waited))
            continue
        what, since = position(d)
        last_seq = f.last_collective.seq if f.last_collective is not None else None
        is_behind = target is not None and (
            target.seq is None or last_seq is None or last_seq < target.seq
        )
        is_behind = is_behind or d.process in said_missing
        if is_behind:
            behind.append((d.process, _behind_words(f, what), since))
            lag[d.process] = last_seq if last_seq is not None else -1
        else:
            elsewhere.append((d.process, what, since))
    return waiting_at, behind, elsewhere, lag


def _collective_words(
    dumps: Sequence[Dump], launch: Any, waiting: Sequence[Group], behind: Sequence[Any]
) -> tuple[str, tuple[str, ...]]:
    """(`Verdict.collective`, `Verdict.parting`) from the dumps' tables of ``launch``."""
    if launch is None:
        return '', ()
    tables = {
        d.process: d.collectives[launch.label] for d in dumps if launch.label in d.collectives
    }
    parting = parting_lines(tables, launch.label)
    if not waiting:
        return '', parting
    known = by_program(tables)  # the most hosts' program, else a table without rows
    table = known[0][1] if known else next(iter(tables.values()), None)
    if not behind:  # every host inside: which collective each is in is not in the dumps
        return (all_inside_words(table, launch.label) if table is not None else ''), parting
    late = [p for p, _, _ in behind]
    return stuck_words(table, launch.label, waiting[0].processes, late), parting


def analyze(dumps: Sequence[Dump], stacks: Sequence[NativeStacks] = ()) -> Verdict:
    """The verdict of ``dumps`` (one per process; `_dumpfile.read_dirs`) and of the
    faulthandler stacks (`_native.read_dirs`) when there are any."""
    if not dumps and not stacks:
        raise DumpFormatError('no dump files (process-*.json) in the directories given')
    if not dumps:
        n = max(max(s.num_processes, s.process + 1) for s in stacks)
        return Verdict(
            num_processes=n,
            dumped=(),
            missing=tuple(range(n)),
            gone={},
            triggers={},
            native=native_lines(stacks, ()),
        )
    n = max(d.num_processes for d in dumps)
    dumped = tuple(sorted(d.process for d in dumps))
    missing = tuple(sorted(set(range(n)) - set(dumped)))
    gone: dict[int, str] = {}
    triggers: dict[str, list[int]] = collections.defaultdict(list)
    said_missing: set[int] = set()
    for d in dumps:
        triggers[d.trigger].append(d.process)
        for p, why in d.gone.items():
            gone.setdefault(p, why)
        if d.trigger == 'timeout':
            said_missing.update(int(p) for p in d.details.get('missing') or ())
    for s in stacks:  # a host that held the GIL could not answer: say why
        if s.process in gone and s.by_watchdog:
            gone[s.process] = 'did not answer the dump request: it held the GIL'
    target = _target(dumps)
    launch = _launch_target(dumps) if target is None else None
    if launch is not None:
        target = launch
        waiting_at, behind, elsewhere, lag = _placed_in_launch(dumps, launch)
    else:
        waiting_at, behind, elsewhere, lag = _placed(dumps, target, said_missing)
    for p in sorted(said_missing - set(dumped)):
        behind.append((p, 'no dump (the others timed out waiting for it)', None))
        lag.setdefault(p, -2)
    if target is not None and not behind:  # the hosts without a dump are not where the rest are
        held = {s.process for s in stacks if s.by_watchdog}
        for p in missing:
            why = f'gone ({gone[p]})' if p in gone else 'no dump'
            why = 'held the GIL (no dump; its stacks from C)' if p in held else why
            behind.append((p, why, None))
            lag.setdefault(p, -2)
    native = native_lines(stacks, dumps)
    cause = _cause(dumps, stacks)
    never_ends = _source_paths(dumps, launch) if launch is not None and not behind else ''
    if cause and 'CoordinatorUnreachableError' in cause and native and LEADER_LOST in native[0]:
        cause = ''  # a consequence: the lost service leads (the error stays in its host's line)
    waiting = _grouped(waiting_at)
    went_on = _went_on(dumps)
    straggler, why = None, ''
    if lag:
        straggler = min(lag, key=lambda p: (lag[p], p))
        unit = f'call of {launch.name}' if launch is not None else 'collective'
        why = 'furthest behind' + (
            f' (its last {unit} #{lag[straggler]})' if lag[straggler] >= 0 else ''
        )
    collective, parting = _collective_words(dumps, launch, waiting, behind)
    memory = memory_words(dumps) if launch is not None and waiting and not behind else ''
    return Verdict(
        num_processes=n,
        dumped=dumped,
        missing=missing,
        gone=gone,
        triggers={k: tuple(sorted(v)) for k, v in sorted(triggers.items())},
        target=target.describe() if target is not None else '',
        waiting=waiting[0] if waiting else None,
        behind=_grouped(behind),
        mismatches=_mismatch_groups(dumps),
        elsewhere=_grouped(elsewhere),
        straggler=straggler,
        straggler_why=why,
        cause=cause,
        in_launch=launch is not None,
        native=native,
        audit=audit_lines(dumps),
        went_on=went_on,
        never_ends=never_ends,
        collective=collective,
        parting=parting,
        memory=memory,
    )


def _gib(n: float) -> str:
    return f'{n / 2**30:.1f}'


def memory_words(dumps: Sequence[Dump]) -> str:
    """Each dumped host's device memory when it dumped, from its allocator (the host's view:
    no device was asked): ``device memory per chip, from each host's allocator: processes 0-3:
    12.1 of 15.7 GiB in use (peak 13.0 GiB; 4 chips each)``, hosts with the same figures
    together; that the backend reports none (CPU); '' without dumps."""
    if not dumps:
        return ''
    said: dict[str, list[int]] = {}
    quiet: list[int] = []
    for d in sorted(dumps, key=lambda d: d.process):
        rows = [r for r in d.memory if r[1] is not None]
        if not rows:
            quiet.append(d.process)
            continue
        used = [int(r[1] or 0) for r in rows]
        limits = [int(r[3]) for r in rows if r[3]]
        peaks = [int(r[2]) for r in rows if r[2] is not None]
        lo, hi = _gib(min(used)), _gib(max(used))
        text = lo if lo == hi else f'{lo}-{hi}'
        text += f' of {_gib(max(limits))} GiB' if limits else ' GiB'
        text += ' in use'
        extra = [f'peak {_gib(max(peaks))} GiB'] if peaks else []
        extra.append(f'{len(rows)} chip{"s" if len(rows) > 1 else ""} each')
        said.setdefault(f'{text} ({"; ".join(extra)})', []).append(d.process)
    if not said:
        kinds = sorted({d.platform for d in dumps if d.platform})
        backend = f'the {"/".join(kinds)} backend' if kinds else 'the backend (not started)'
        return f'device memory: not reported by {backend}'
    parts = [f'{fmt_hosts(ps)}: {text}' for text, ps in sorted(said.items(), key=lambda x: x[1])]
    parts = parts[:3] + ([f'{len(parts) - 3} more groups'] if len(parts) > 3 else [])
    if quiet:
        parts.append(f'{fmt_hosts(quiet)}: not reported')
    return "device memory per chip, from each host's allocator: " + '; '.join(parts)


def _went_on(dumps: Sequence[Dump]) -> str:
    """``not a hang: barrier('first') #2 went on at 10:44:49, after 7 s (processes 0-1
    dumped for a hang after 3 s); the dumps show that moment`` when every hang dump's wait
    went on (`_triggers._went_on`) and nothing else was dumped for; else ''."""
    hangs = [d for d in dumps if d.trigger == 'hang']
    if not hangs or any(d.trigger not in ('hang', 'request') for d in dumps):
        return ''
    if not all(d.details.get('went_on') for d in hangs):
        return ''
    labels = {str(d.details.get('record')) for d in hangs}
    label = labels.pop() if len(labels) == 1 else 'the waits'
    at = _clock(max(float(d.details['went_on']) for d in hangs))
    lasted = fmt_duration(max(float(d.details.get('lasted') or 0) for d in hangs))
    after = fmt_duration(min(float(d.details.get('waited') or 0) for d in hangs))
    who = fmt_hosts(sorted(d.process for d in hangs))
    return (
        f'not a hang: {label} went on at {at}, after {lasted} ({who} dumped for a hang '
        f'after {after}); the dumps show that moment'
    )


#: Audit findings said at most (the rest counted).
MAX_AUDIT_LINES = 3


def audit_lines(dumps: Sequence[Dump]) -> tuple[str, ...]:
    """Each audit finding of the dumps once (every host holds the same ones)."""
    seen: dict[tuple[str, str, str], str] = {}
    for d in dumps:
        for f in d.audit.findings if d.audit is not None else ():
            seen.setdefault((f.check, f.launch, f.path), f.format())
    out = [f'audit: {text}' for text in seen.values()]
    if len(out) > MAX_AUDIT_LINES:
        rest = len(out) - MAX_AUDIT_LINES + 1
        out = out[: MAX_AUDIT_LINES - 1] + [f'audit: {rest} more findings (audit_report())']
    return tuple(out)


def _since(g: Group) -> str:
    return f' (for {fmt_duration(g.since)})' if g.since is not None else ''


def _groups_lines(head: str, groups: Sequence[Group], room: int) -> list[str]:
    out = [f'{head}{fmt_hosts(g.processes)}: {g.what}{_since(g)}' for g in groups[:room]]
    if len(groups) > room:
        rest = [p for g in groups[room:] for p in g.processes]
        out.append(f'{head}{fmt_hosts(rest)}: {len(groups) - room} more positions')
    return out


def _target_lines(v: Verdict) -> list[str]:
    """Where the leading hosts are: inside a launch (and its collective), at a wait, ahead."""
    if v.waiting is not None and v.in_launch:
        are = 'is' if len(v.waiting.processes) == 1 else 'are'
        inside = (
            f'{fmt_hosts(v.waiting.processes)} {are} inside {v.target} (not done on device)'
            f'{_since(v.waiting)}'
        )
        return [inside] + [line for line in (v.collective, v.memory) if line]
    if v.waiting is not None:
        return [f'{fmt_hosts(v.waiting.processes)} wait in {v.target}{_since(v.waiting)}']
    return [f'the furthest hosts are in {v.target}'] if v.target else []


def format_verdict(v: Verdict) -> list[str]:
    """`Verdict` -> at most `MAX_LINES` lines."""
    why = '; '.join(f'{k}: {fmt_hosts(ps)}' for k, ps in v.triggers.items())
    lines = [v.cause] if v.cause else []
    if v.never_ends:
        lines.append(v.never_ends)
    if v.went_on:
        lines.append(v.went_on)
    lines.extend(v.native)
    written = f' (written for {why})' if why else ''
    lines.append(f'{len(v.dumped)} dumps of {v.num_processes} processes{written}')
    if v.missing:
        lines.append(f'no dump from {fmt_hosts(v.missing)}')
    by_reason: dict[str, list[int]] = collections.defaultdict(list)
    for p, reason in v.gone.items():
        by_reason[reason].append(p)
    for reason, ps in sorted(by_reason.items())[:2]:
        lines.append(f'gone, say the others: {fmt_hosts(ps)}: {reason}')
    if v.culprits:
        lines.append(f'{"slow" if v.went_on else "culprit"}: {fmt_hosts(v.culprits)}')
    lines += _target_lines(v)
    lines += v.parting
    if v.behind:
        head = 'never launched it: ' if v.in_launch else 'never arrived there: '
        lines += _groups_lines(head, v.behind, MAX_GROUPS)
    if v.mismatches:
        lines.append("mismatch, each side's call:")
        lines += _groups_lines('  ', v.mismatches, 4)
    if v.elsewhere:
        lines += _groups_lines('', v.elsewhere, max(1, MAX_LINES - len(lines) - 2))
    if v.straggler is not None:
        lines.append(f'straggler: process {v.straggler} ({v.straggler_why})')
    lines.extend(v.audit)
    if len(lines) > MAX_LINES:
        lines = lines[: MAX_LINES - 1] + [f'... {len(lines) - MAX_LINES + 1} more lines']
    return lines


#: The name in messages when run as ``python -m multihost analyze`` (``multihost`` passes its own).
PROG = 'python -m multihost analyze'


def report(dirs: Sequence[str], prog: str = PROG) -> int:
    """Prints the verdict of the dumps in ``dirs``, then the replays the audit wrote there
    (``--audit-replay``); a bad or missing file: one line, 2."""
    try:
        replays = replay_lines(dirs)
        dumps, stacks = read_dirs(dirs), read_native_dirs(dirs)
        verdict = analyze(dumps, stacks) if dumps or stacks or not replays else None
    except DumpFormatError as exc:
        print(f'{prog}: {exc}', file=sys.stderr)
        return 2
    if verdict is not None:
        print(verdict)
    for line in replays:
        print(line)
    return 0


def replay_lines(dirs: Sequence[str]) -> list[str]:
    """The replays of ``replay-<process>.json`` in ``dirs`` (`_audit`'s ``--audit-replay``):
    each verdict once, with the processes that wrote it (every host gets the same one)."""
    by_text: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, 'replay-*.json'))):
            try:
                with open(path) as f:
                    doc = json.load(f)
                process, launch, call = int(doc['process']), doc['launch'], int(doc['call'])
                finding, text = doc['finding'], str(doc['text'])
                head = (
                    f"replay of {launch} call #{call} (after the audit's "
                    f'{finding["check"]} at call #{finding["call"]})'
                )
                seconds = float(doc['seconds'])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise DumpFormatError(f'{path}: not a replay file ({exc})') from None
            by_text.setdefault((head, text), []).append((process, seconds))
    return [
        f'{head}, said by {fmt_hosts([p for p, _ in said])} '
        f'(it took {max(t for _, t in said):.1f} s):\n  ' + text.replace('\n', '\n  ')
        for (head, text), said in by_text.items()
    ]
