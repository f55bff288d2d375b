"""Collectives entered off the main thread: matched by barrier name, or by thread name and count.

The collective sequence (`_sequence`) numbers the main thread's collectives.
A background thread's collectives (orbax finalising an async save with
barriers) interleave with those differently on every host, so they take no
number there: a named barrier is matched by its name and how many times this
host used that name off the main thread (orbax's names are unique per call);
any other collective by its thread's name and how many such collectives
threads of that name entered (orbax names its threads, e.g. ``async_save``).
Each match is one `_kv.run_round` under ``mh/t/<lane hash>/<count>``, judged like
the main sequence's; each host publishes its latest call per thread under
``mh/th/<process>`` before waiting, so a timeout says where a missing host's
threads are. No skip-ahead: a lane's hosts move on together, late ones raise
the verdict they find. See docs/API.md §4.1, "Collectives off the main thread".
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from multihost import _recorder
from multihost._errors import BarrierTimeoutError, CoordinatorUnreachableError
from multihost._exchange import _kv, _sequence, _verdicts
from multihost._models._records import CollectiveRecord
from multihost._text import fmt_hosts, grouped_lines

#: Seconds after which process 0 deletes the keys of a name-matched barrier
#: that passed (a barrier moves no data: a host reading it after that finds
#: nothing to judge and passes, as it would have).
NAME_GRACE = 60.0
#: Threads whose latest call a host publishes (the most recently active ones).
_MAX_THREADS = 16
#: At most this many missing hosts' positions ride in a timeout verdict.
_MAX_POSITIONS = 256


class _Lanes:
    """Per-process state of the lanes off the main thread (entered from any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}  # lane -> collectives this host entered in it
        self.latest: dict[str, CollectiveRecord] = {}  # thread name -> its latest call
        self.passed: collections.deque[tuple[float, str]] = collections.deque()  # process 0


_lanes = _Lanes()


def lane_of(kind: str, name: str, thread: str) -> str:
    """What matches a collective of ``thread`` across hosts: ``'n:<name>'`` or ``'t:<thread>'``."""
    if kind == 'barrier' and name:
        return 'n:' + name[: _sequence._MAX_TEXT]
    return 't:' + thread[: _sequence._MAX_TEXT]


def round_dir(rec: CollectiveRecord) -> str:
    """The key directory of off-main collective ``rec``'s round (its stages live under it)."""
    lane_hash = hashlib.sha1(rec.lane.encode()).hexdigest()[:16]  # barrier ids stay unique
    return _kv.key('t', lane_hash, rec.seq)


def latest() -> dict[str, CollectiveRecord]:
    """Thread name -> the latest collective this process entered from a thread of that name."""
    with _lanes.lock:
        return dict(_lanes.latest)


def enter(
    kind: str,
    name: str,
    *,
    tree_digest: str,
    timeout: float | None,
    site: str,
    mismatch_prefix: str | None = None,
    payload: bytes | None = None,
    fail: str = '',
    read: bool = False,
    launch: _recorder.Entry | None = None,
) -> tuple[CollectiveRecord, dict[int, str]]:
    """`_sequence._enter` for a thread other than the main one: one round in the call's lane.

    Raises what `_sequence.enter` raises; a timeout names the missing hosts,
    where their main thread is and where their threads are.
    """
    thread = threading.current_thread().name
    lane = lane_of(kind, name, thread)
    pid = _kv.process_index()
    with _lanes.lock:
        n = _lanes.counts.get(lane, 0)
        _lanes.counts[lane] = n + 1
        rec = dataclasses.replace(
            _sequence._record(n, kind, name, tree_digest, site, pid, fail),
            lane=lane,
            thread=thread[: _sequence._MAX_TEXT],
        )
        _lanes.latest.pop(thread, None)  # re-inserted last: the dict is ordered by activity
        _lanes.latest[thread] = rec
        while len(_lanes.latest) > _MAX_THREADS:
            del _lanes.latest[next(iter(_lanes.latest))]
        mine = json.dumps([r.to_json() for r in _lanes.latest.values()])
    entry = launch or _recorder.note(kind, rec.name, seq=None, digest=tree_digest, site=rec.site)
    entry.thread, entry.lane = rec.thread, f'{lane}#{n}'
    client = _kv.client()
    if client is None:
        _recorder.finished(entry, wait=0.0, failed=bool(fail))
        return rec, {}
    # Its own timeout, else an installed call's wait (`_sequence.waiting`: patient ones log
    # each period and wait on), else MULTIHOST_TIMEOUT; as on the main thread.
    details = _timeout_details(client, rec)
    period, patience = _sequence._patience(rec, _sequence._timeout(timeout), details)
    t0 = time.monotonic()
    try:
        _kv.publish(client, _kv.key('th'), mine)  # where this host's threads are
        if pid == 0:
            _collect_garbage(client, rec)
        verdict, raw = _kv.run_round(
            client,
            _kv.Round(name=round_dir(rec), data=round_dir(rec) + '/d'),
            rec.to_json(payload),
            timeout=period,
            judge=_sequence._judge,
            on_timeout=details,
            read=read or payload is not None,
            patience=patience,
            agree=_sequence._agreement(rec),
        )
    except CoordinatorUnreachableError as exc:
        _recorder.finished(entry, failed=True)
        raise _verdicts.unreachable_error(exc, rec) from exc.__cause__
    except BaseException:
        _recorder.finished(entry, failed=True)
        raise
    wait = time.monotonic() - t0
    if not verdict.ok:
        _recorder.finished(entry, wait=wait, failed=True)
        if verdict.kind == 'timeout':
            raise _timeout_error(verdict.data, rec)
        raise _sequence._error(verdict, rec, mismatch_prefix)
    _recorder.finished(entry, wait=wait, failed=bool(fail))
    if pid == 0 and lane.startswith('n:'):
        with _lanes.lock:
            _lanes.passed.append((time.monotonic(), round_dir(rec)))
    return rec, raw


def _collect_garbage(client: Any, rec: CollectiveRecord) -> None:
    """Process 0 deletes the lane's round before last, and name rounds passed long ago.

    Safe like `_kv.collect_garbage`: when process 0 enters round ``n`` of a
    lane, every host has arrived at ``n - 1`` of it, so is done with ``n - 2``.
    """
    if rec.lane.startswith('t:') and rec.seq >= 2:
        _kv.delete(client, round_dir(dataclasses.replace(rec, seq=rec.seq - 2)) + '/')
    now = time.monotonic()
    old = []
    with _lanes.lock:
        while _lanes.passed and now - _lanes.passed[0][0] > NAME_GRACE:
            old.append(_lanes.passed.popleft()[1])
    for directory in old:
        _kv.delete(client, directory + '/')


def _side_positions(client: Any) -> dict[int, list[CollectiveRecord]]:
    """Process -> the latest call of each of its threads (one bounded read)."""
    out = {}
    for p, text in _kv.read_dir(client, _kv.key('th')).items():
        out[p] = [CollectiveRecord.from_json(r) for r in json.loads(text)]
    return out


def _timeout_details(client: Any, rec: CollectiveRecord) -> _kv.OnTimeout:
    """What a timeout verdict says: the call, and where the missing hosts' threads were."""

    def details(arrived: dict[int, str]) -> dict[str, Any]:
        missing = [p for p in range(_kv.process_count()) if p not in arrived][:_MAX_POSITIONS]
        main = _sequence.positions(client)
        side = _side_positions(client)
        return {
            'what': rec.describe(),
            'name': rec.name,
            'positions': {p: main[p].to_json() for p in missing if p in main},
            'threads': {p: [r.to_json() for r in side[p]] for p in missing if p in side},
        }

    return details


def _timeout_error(data: Mapping[str, Any], rec: CollectiveRecord) -> BarrierTimeoutError:
    """The error every host raises when an off-main collective timed out (from the verdict)."""
    missing = [int(p) for p in data['missing']]
    where = {int(p): CollectiveRecord.from_json(v) for p, v in data.get('positions', {}).items()}
    threads = {
        int(p): [CollectiveRecord.from_json(v) for v in vs]
        for p, vs in data.get('threads', {}).items()
    }
    state: dict[int, str] = {}
    for p in missing:
        last = where.get(p)
        parts = [
            f'main thread last reached {last.describe()}'
            if last is not None
            else f'position not carried (only {_MAX_POSITIONS} missing processes are)'
            if len(where) >= _MAX_POSITIONS
            else 'main thread reached no collective yet'
        ]
        same = [t for t in threads.get(p, []) if t.thread == rec.thread]
        if not same:
            parts.append(f'no thread named {rec.thread!r} entered a collective')
        parts += [f'thread {t.thread!r} last reached {t.describe()}' for t in threads.get(p, [])]
        state[p] = '; '.join(parts)
    lines = grouped_lines(state, what='distinct positions', attr='positions')
    timeout = float(data['timeout'])
    late = rec.process not in data['arrived']
    return BarrierTimeoutError(
        f'timed out after {timeout:g} s in {data.get("what", rec.describe())}: '
        f'{fmt_hosts(missing)} did not arrive (seen by process {data["by"]}).\n'
        + '\n'.join(lines)
        + (
            f'\nThis host (process {rec.process}) arrived after the others had given up.'
            if late
            else ''
        )
        + '\nOff the main thread, a barrier is matched across hosts by its name, any other '
        "collective by its thread's name and count: a host that never calls it (or calls "
        'it from a thread of another name) leaves the others waiting; look at its stack '
        '(multihost.where) or raise the timeout (timeout=..., or MULTIHOST_TIMEOUT).',
        name=rec.name,
        timeout=timeout,
        missing=missing,
        positions=where,
    )


def wire() -> None:
    """Collectives called off the main thread go through this module (`multihost._job._wiring`)."""
    _sequence.set_off_main(sys.modules[__name__])
