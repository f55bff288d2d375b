"""The wavefront: how far every host got, read from the flight recorders while hosts are blocked.

Each host's debug thread (`_bus`) answers the ``front`` command from its own
flight recorder (`_recorder`): its last watched launch and last core
collective, the oldest launch whose output is not ready on device, whether
its main thread waits at a cross-host check, how long since it last
advanced (on its own clock) and the user frame its main thread is in.
`wavefront` issues the command from any one host, bounded by a timeout, and
returns a `Wavefront` whose `Wavefront.verdict` says in one line who is
where, e.g. ``processes 0-1, 3 are inside train_step call #412 (launched 48 s
ago, not done); process 2 never launched call #412: last at process_allgather
#411, now in user code at data.py:88 in load_shard, in time.sleep``. With no
watched launch pending and no check waited at, it says what each host's main
thread stack shows, grouped: ``processes 0-1, 3 are waiting in a
coordination-service barrier at orbax/...:309 in _fn (via
sync_global_processes), ...; process 2 is in user code at train.py:88 in load,
in time.sleep``.

``records`` answers with the host's last flight records (for timelines). The models
(`HostFront`, `Wavefront`, the verdict's words) live in `multihost._models._wavefront`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from multihost import _recorder
from multihost._debug import _hold, _pulse, _stacks
from multihost._exchange import _bus, _kv
from multihost._models._stacks import (
    phase_of,
    stack_activity,
)
from multihost._models._wavefront import (  # noqa: F401  (the models live there; re-exported)
    MAX_GROUPS,
    HostFront,
    Wavefront,
)
from multihost._recorder import FlightRecord

# -- this host's answer ---------------------------------------------------------------


def _main_stack() -> tuple[Any, ...] | None:
    """The main thread's frames (file, line, function, source), outermost first, or None."""
    import traceback

    main = threading.main_thread().ident
    frame = _pulse.main_frame()
    if frame is None:
        return None
    frames = tuple(
        (f.filename, f.lineno or 0, f.name, f.line or '')
        for f in traceback.extract_stack(frame)[-_stacks.MAX_FRAMES :]
    )
    ours = _stacks.our_dirs()
    if threading.get_ident() == main:  # the main thread asks (one process): not its wait
        while frames and frames[-1][0].startswith(ours):
            frames = frames[:-1]
    return frames


def front(
    process: int | None = None,
    main_frames: Sequence[Any] | None = None,
    *,
    collectives: bool = False,
) -> HostFront:
    """This host's `HostFront`, from its flight recorder (never blocks). ``main_frames``
    (file, line, function, source; outermost first): where the main thread is instead of
    its stack now (an uncaught error's traceback, when the main thread is in the hook).
    ``collectives``: with the pending launch's `CollectiveTable` (lowered again on the first
    ask, then cached by its executable; a dump stores it apart)."""
    pid = _kv.process_index() if process is None else process
    for _ in range(3):  # the records and the stack of one moment: again if the host moved on
        advanced = _recorder.last_advanced()
        now = time.time()
        records = _recorder.snapshot(pid)
        frames = tuple(main_frames) if main_frames is not None else _main_stack()
        if _recorder.last_advanced() == advanced:
            break
    last, waiting, background = _recorder.in_progress(records)
    last_launch = next((r for r in reversed(records) if r.is_launch), None)
    last_collective = next((r for r in reversed(records) if not r.is_launch), None)
    pending, unsure = None, None
    for r in reversed(records):  # back to the newest launch known done (or failed)
        if not r.is_launch:
            continue
        if r.state in (_recorder.DONE, _recorder.FAILED):
            break
        if r.state == _recorder.LAUNCHED:
            pending, unsure = r, None
        elif r.state == _recorder.UNKNOWN and pending is not None:
            unsure = r  # before the pending one, not known done: maybe the stuck one
    where = kind = activity = ''
    if frames is not None:
        where = _stacks.user_frame(frames)
        ours = _stacks.our_dirs()
        kind, activity = stack_activity(frames, ours, lambda f: _stacks.frame_here(f, ours))
    error = _hold.held_here()
    if error is not None:  # --hold-on-error: where it raised, and that it is held there
        where, kind = error['site'], 'held'
        # Not naming the process: the verdict groups the hosts held on the same error.
        activity = f'held on its error: raised {error["error"]} at {error["site"]}'
    # Not while its own call traces or compiles it: lowering it again would compile twice.
    table = _pending_table(pending) if collectives and not phase_of(kind, activity) else None
    return HostFront(
        collectives=table,
        process=pid,
        answered=True,
        hostname=socket.gethostname(),
        last=last,
        last_launch=last_launch,
        last_collective=last_collective,
        pending=pending,
        pending_age=now - pending.time if pending is not None else 0.0,
        pending_from=unsure,
        waiting=waiting,
        waiting_for=now - waiting.time if waiting is not None else 0.0,
        idle=now - _recorder.last_advanced(),
        calls=_recorder.call_counts(),
        where=where,
        activity=activity,
        activity_kind=kind,
        background=background,
        time=now,
        pulse=_pulse.pulse(),
    )


#: Makes the `CollectiveTable` of a pending launch record: the installed jit that knows the
#: launch's program lives above this room (`_job._launchtable.table_of`, connected by
#: `_job._wiring`); None: no table.
_table_source: Callable[[Any], Any] | None = None


def set_table_source(fn: Callable[[Any], Any] | None) -> None:
    """Where `front` gets a pending launch's collective table (`_job._wiring`)."""
    global _table_source
    _table_source = fn


def _pending_table(pending: Any) -> Any:
    """The `CollectiveTable` of launch record ``pending``; None when there is none or it
    cannot be made (an answer never fails for it)."""
    if pending is None or _table_source is None:
        return None
    try:
        return _table_source(pending)
    except Exception:
        return None


def wavefront(timeout: float = 10.0, *, gone: Mapping[int, str] | None = None) -> Wavefront:
    """How far every host got: its last launch and collective, what is not done, the verdict.

    Callable from any process and any thread, also while the others are
    blocked (in a device collective, a barrier, or user code): each host's
    debug thread answers from its flight recorder. A host that does not
    answer within ``timeout`` is reported silent, not waited for; the hosts
    in ``gone`` (process -> why, e.g. dead in a recoverable job) are not
    waited for at all, and silent with that reason.
    """
    client = _bus.distributed()
    if client is None:
        return Wavefront(hosts=(front(collectives=True),), time=time.time())
    gone = dict(gone or {})
    replies, daemons = _bus.command(client, 'front', timeout, skip=gone)
    hosts = []
    for p in range(_kv.process_count()):
        if p in replies:
            hosts.append(HostFront.from_json(replies[p]))
        else:
            why = gone.get(p) or (
                f'no answer within {timeout:g} s'
                if p in daemons
                else 'no debug thread yet (no collective or watched call so far)'
            )
            hosts.append(HostFront(process=p, answered=False, error=why))
    return Wavefront(hosts=tuple(hosts), time=time.time())


#: Largest number of records one host sends per `flight_records` call.
MAX_RECORDS = _recorder.CAPACITY


def flight_records(
    last: int = 200, timeout: float = 10.0, *, gone: Collection[int] = ()
) -> dict[int, list[FlightRecord]]:
    """Every host's last ``last`` flight records (process -> records, oldest first).

    Answered by each host's debug thread, so it works while hosts are blocked;
    hosts that do not answer within ``timeout`` are absent; the hosts in
    ``gone`` (known to be gone, e.g. dead in a recoverable job) are not
    waited for at all.
    """
    last = max(0, min(int(last), MAX_RECORDS))
    client = _bus.distributed()
    if client is None:
        return {_kv.process_index(): _recorder.snapshot(_kv.process_index(), last)}
    replies, _ = _bus.command(client, 'records', timeout, skip=gone, last=last)
    return {p: [FlightRecord(*r) for r in json.loads(v)] for p, v in sorted(replies.items())}


def _on_records(client: Any, order: dict[str, Any]) -> str:
    last = max(0, min(int(order.get('last', 200)), MAX_RECORDS))
    recs = _recorder.snapshot(_kv.process_index(), last)
    return json.dumps([dataclasses.astuple(r) for r in recs], separators=(',', ':'))


def wire() -> None:
    """The debug thread answers 'front' and 'records' (`multihost._job._wiring`)."""
    _bus.register('front', lambda client, order: front(collectives=True).to_json())
    _bus.register('records', _on_records)
