"""The collective sequence: every core collective is numbered, recorded and checked.

Collective ``k`` is one `_kv.run_round`: each host publishes its record (kind,
name, digest, call site) in ring slot ``k mod _SLOTS``, waits at the
collective's barrier, and judges every host's record alike; a timeout or a
skipped collective goes through a verdict key, so the next common collective
lines up. No device work, and the JAX backend is never initialized here. See
docs/ARCHITECTURE.md, "The collective sequence".
"""

from __future__ import annotations

import base64
import collections
import contextlib
import contextvars
import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

import jax
import jaxlib

from multihost import _cells, _recorder
from multihost._defaults import DEFAULT_TIMEOUT, timeout_from_env
from multihost._errors import (
    CoordinatorUnreachableError,
    HostFailedError,
)
from multihost._exchange import _kv, _verdicts
from multihost._models._records import (  # noqa: F401  (the models live there; re-exported)
    CollectiveRecord,
)
from multihost._text import fmt_hosts

_RING_SIZE = 256
_SLOTS = 8  # key-value slots for records, a ring overwritten (a host at k + 8: all read k)
_MAX_TEXT = 300  # names and call sites are cut to this many characters
_MAX_CALLS = 16  # ... and at most this many distinct calls of the hosts that arrived


def default_timeout() -> float:
    """The timeout used when none is given: ``MULTIHOST_TIMEOUT`` or `DEFAULT_TIMEOUT`."""
    timeout = timeout_from_env()
    return DEFAULT_TIMEOUT if timeout is None else timeout


_wait_for: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    'multihost_wait_for', default=None
)

#: Where a patient wait (`waiting` with `math.inf`) reports, once per period.
#: A WARNING: with no logging configured, Python's last-resort handler prints it to stderr.
log = logging.getLogger('multihost')


@contextlib.contextmanager
def waiting(timeout: float) -> Iterator[None]:
    """Within this block, collectives given no timeout wait ``timeout`` seconds.

    `math.inf` (the calls `multihost.install` installs, which wait as long as
    JAX's would): they never give up, and every `default_timeout()` seconds
    log one line naming who is missing and where they are (`log`).
    """
    token = _wait_for.set(float(timeout))
    try:
        yield
    finally:
        _wait_for.reset(token)


def _timeout(timeout: float | None) -> float:
    """The wait of a collective: its own ``timeout``, else `waiting`'s, else `default_timeout()`."""
    if timeout is None:
        timeout = _wait_for.get()
    return default_timeout() if timeout is None else float(timeout)


def checking_enabled() -> bool:
    """Whether device collectives are sequence-checked (``MULTIHOST_CHECK``, on by default)."""
    return os.environ.get('MULTIHOST_CHECK', '1').strip().lower() not in ('0', 'false', 'off', 'no')


def digest(obj: Any) -> str:
    """A short stable hex digest of ``repr(obj)`` (structures, shapes, dtypes)."""
    return format(zlib.crc32(repr(obj).encode()), '08x')


_site_override: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    'multihost_call_site', default=None
)


@contextlib.contextmanager
def called_from(site: str) -> Iterator[None]:
    """Within this block, collectives record ``site`` as their call site.

    For callers whose own frames say nothing useful, e.g. the notebook's
    ``%mh_diff params`` arriving through ipyparallel.
    """
    token = _site_override.set(site)
    try:
        yield
    finally:
        _site_override.reset(token)


def site_override() -> str | None:
    """The site `called_from` set for this context, or None (for callers that walk frames)."""
    return _site_override.get()


def call_site() -> str:
    """``file:line`` of the innermost frame outside the `multihost` package and JAX (a notebook
    cell: ``Cell In[4], line 3``, numbered by this host's IPython, `_cells.place`).

    A collective JAX itself made (``jax.device_put`` of data for other processes checks it
    with ``assert_equal``) is placed at the user's line that called into JAX, and says so:
    ``Cell In[4], line 3 (inside jax.device_put)``.
    """
    override = _site_override.get()
    if override is not None:
        return override
    frame: FrameType | None = sys._getframe(1)
    entered = ''  # the outermost JAX function seen since the last of ours: what the user called
    while frame is not None:
        filename = frame.f_code.co_filename
        where = _WHERE.get(filename)
        if where is None:
            where = _WHERE[filename] = _where(filename)
        if where == 'user':
            site = _cells.place(filename, frame.f_lineno)
            return f'{site} (inside {entered})' if entered else site
        if where == 'jax':
            entered = _public_name(frame)
        else:
            entered = ''
        frame = frame.f_back
    return '<unknown>'


#: The multihost package's directory (this file is in one of its rooms).
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: JAX's package directories (jax, jaxlib): frames there are JAX's, not the user's.
_JAX_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__ or '')) + os.sep for m in (jax, jaxlib)
)
#: File name -> 'ours' (the multihost package), 'jax' or 'user' (call_site's cache).
_WHERE: dict[str, str] = {}


def _where(filename: str) -> str:
    path = os.path.abspath(filename)
    if path.startswith(_HERE):
        return 'ours'
    return 'jax' if path.startswith(_JAX_DIRS) else 'user'


def _public_name(frame: FrameType) -> str:
    """``jax.device_put`` for JAX's function of that frame (``jax._src.api``'s ``device_put``):
    the name a user knows; ``jax.numpy.sum`` for ``jax._src.numpy``'s."""
    module = str(frame.f_globals.get('__name__', 'jax'))
    name = frame.f_code.co_name
    if module.startswith('jax._src.numpy'):
        return f'jax.numpy.{name}'
    if module.startswith('jax._src') or module == 'jax':
        return f'jax.{name}'
    return f'{module}.{name}'


class _State:
    """Per-process sequence state: the main thread's collectives (other threads': `_threads`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_seq = 0
        self.ring: collections.deque[CollectiveRecord] = collections.deque(maxlen=_RING_SIZE)
        self.current: CollectiveRecord | None = None


_state = _State()
#: The thread whose collectives this sequence numbers (others: `_threads`).
_MAIN_THREAD = threading.main_thread().ident


def history() -> list[CollectiveRecord]:
    """The most recent collectives this process entered, oldest first."""
    with _state.lock:
        return list(_state.ring)


def current() -> CollectiveRecord | None:
    """The collective this process is in (or last entered)."""
    return _state.current


def _key(*parts: object) -> str:
    return _kv.key(*parts)


def _slot_dir(seq: int) -> str:
    return _kv.key('seq', seq % _SLOTS)


def all_records(client: Any) -> list[CollectiveRecord]:
    """Every record in the ring (one bounded read per slot), held ones included."""
    return [
        CollectiveRecord.from_json(value.removeprefix(_kv.PAUSED))
        for slot in range(_SLOTS)
        for value in _kv.read_dir(client, _slot_dir(slot)).values()
    ]


def _starts(prefix: str) -> Callable[[str], bool]:
    return lambda value: value.startswith(prefix)


def positions(client: Any | None = None) -> dict[int, CollectiveRecord]:
    """Process index -> the latest collective each host published."""
    client = client or _kv.client()
    if client is None:
        return {}
    latest: dict[int, CollectiveRecord] = {}
    for rec in all_records(client):
        if rec.process not in latest or rec.seq > latest[rec.process].seq:
            latest[rec.process] = rec
    return latest


def enter(
    kind: str,
    name: str = '',
    *,
    tree_digest: str = '',
    timeout: float | None = None,
    site: str | None = None,
    mismatch_prefix: str | None = None,
) -> CollectiveRecord:
    """Record collective ``kind`` and, with more than one process, check it against every host.

    Returns once every host has entered the same collective (a barrier).

    Args:
        kind: the collective's name (``'barrier'``, ``'process_allgather'``...).
        name: the barrier name or a short description.
        tree_digest: digest of the structure/shapes/dtypes the hosts must agree on.
        timeout: seconds to wait for every host; default: `waiting`'s, else
            `default_timeout()`. `math.inf`: never give up, logging every
            `default_timeout()` who is missing (`waiting`).
        site: call site to record; default: the caller outside `multihost`.
        mismatch_prefix: for barriers, the start of the mismatch message
            (``sync_global_devices`` keeps JAX's wording).

    Raises:
        BarrierTimeoutError: some host did not arrive within ``timeout``.
        BarrierMismatchError: hosts passed different barrier names.
        CollectiveMismatchError: hosts called different collectives, or the
            same one on differently shaped data.
        HostFailedError: some host could not take part (see `fail_turn`).
        CollectiveInterruptedError: another host was interrupted here.
        CoordinatorUnreachableError: the coordination service is gone.
    """
    return _enter(
        kind,
        name,
        tree_digest=tree_digest,
        timeout=timeout,
        site=site or call_site(),
        mismatch_prefix=mismatch_prefix,
    )[0]


def fail_turn(kind: str, name: str, reason: str, *, timeout: float | None = None) -> NoReturn:
    """Takes this host's turn in collective ``kind`` without being able to do it.

    For a host that cannot take part (a name it does not define, a value it
    cannot convert): it still enters the collective with its reason, so every
    host raises the same `HostFailedError` at once, naming each host's
    reason, and the sequence stays aligned. Always raises.
    """
    _enter(kind, name, tree_digest='', timeout=timeout, site=call_site(), fail=reason)
    raise HostFailedError(  # one process: nobody to tell
        f'{kind} failed on process {_kv.process_index()}: {reason}',
        seq=position() - 1,
        reasons={_kv.process_index(): reason},
    )


def exchange(
    kind: str,
    name: str,
    payload: bytes,
    *,
    tree_digest: str,
    timeout: float | None = None,
    sources_only: bool = False,
) -> dict[int, bytes]:
    """Like `enter`, and every host's ``payload`` rides along: process index -> bytes.

    For small data only (it travels through the coordinator, base64 in the
    record, chunked by `_kv` beyond its per-host bound): the check and the
    data movement are one exchange, no device work. Requires more than one
    process. ``sources_only`` (a broadcast: most payloads are empty): above
    `_kv.DIGEST_ABOVE` hosts on the main thread, non-empty payloads go beside
    the round (``<round>/src/<pid>``) and the round agrees through its digest,
    so a host reads the sources' payloads, not every host's record; the result
    then holds the hosts with a non-empty payload only.
    """
    beside = (
        sources_only
        and threading.get_ident() == _MAIN_THREAD
        and _kv.process_count() > _kv.DIGEST_ABOVE
    )
    _, raw = _enter(
        kind,
        name,
        tree_digest=tree_digest,
        timeout=timeout,
        site=call_site(),
        payload=payload,
        beside=beside,
    )
    return {p: base64.b64decode(json.loads(v)['data']) for p, v in raw.items()}


def _enter(
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
    beside: bool = False,
) -> tuple[CollectiveRecord, dict[int, str]]:
    """`enter`, also returning every host's raw published record (process -> JSON).

    ``launch``: the flight-recorder entry of a watched launch being checked
    (it gets the sequence number and the wait); otherwise a collective entry
    is added here. Off the main thread, the collective takes no number in
    this sequence: `_threads` matches it by barrier name or thread name.
    """
    if threading.get_ident() != _MAIN_THREAD and _off_main is not None:
        return _off_main.enter(
            kind,
            name,
            tree_digest=tree_digest,
            timeout=timeout,
            site=site,
            mismatch_prefix=mismatch_prefix,
            payload=payload,
            fail=fail,
            read=read,
            launch=launch,
        )
    pid = _kv.process_index()
    with _state.lock:
        seq = _state.next_seq
        _state.next_seq += 1
        rec = _record(seq, kind, name, tree_digest, site, pid, fail)
        _state.ring.append(rec)
        _state.current = rec
    entry = launch or _recorder.note(kind, rec.name, seq=seq, digest=tree_digest, site=rec.site)
    if launch is not None:
        launch.seq = seq
    client = _kv.client()
    if client is None:
        _recorder.finished(entry, wait=0.0, failed=bool(fail))
        return rec, {}
    timeout = _timeout(timeout)
    t0: float | None = None  # the wait starts after the enter hook (stepping, a test's delay)
    while True:
        verdict, raw, started = _take_turn(client, rec, timeout, entry, payload, read, beside)
        t0 = started if t0 is None else t0
        if verdict.ok:
            break
        if not _skipped(verdict, rec):
            _recorder.finished(entry, wait=time.monotonic() - t0, failed=True)
            raise _error(verdict, rec, mismatch_prefix)
        # This host skipped collective ``rec.seq`` (the others gave up on it,
        # and it called something else): it takes its turn where they are now.
        seq, verdict = _skip_ahead(client, rec)
        with _state.lock:
            _state.next_seq = seq + 1
            moved = dataclasses.replace(rec, seq=seq)
            if _state.ring and _state.ring[-1] is rec:
                _state.ring[-1] = moved
            rec = _state.current = moved
        entry.seq = seq
        if not verdict.ok:  # late at a later collective, which failed without it
            _recorder.finished(entry, wait=time.monotonic() - t0, failed=True)
            raise _error(verdict, rec, mismatch_prefix)
    _recorder.finished(entry, wait=time.monotonic() - t0, failed=bool(fail))
    return rec, raw


def _record(
    seq: int, kind: str, name: str, tree_digest: str, site: str, pid: int, fail: str
) -> CollectiveRecord:
    return CollectiveRecord(
        seq=seq,
        kind=kind,
        name=name[:_MAX_TEXT],
        digest=tree_digest,
        site=site[-_MAX_TEXT:],
        time=time.time(),
        process=pid,
        fail=fail[:_MAX_TEXT],
    )


def _take_turn(
    client: Any,
    rec: CollectiveRecord,
    timeout: float,
    entry: _recorder.Entry,
    payload: bytes | None,
    read: bool,
    beside: bool = False,
) -> tuple[_kv.Verdict, dict[int, str], float]:
    """One round of collective ``rec``: publish its record, wait for every host, judge.

    Also returns when this host's wait began (`time.monotonic`, after the enter hook).
    ``beside``: a non-empty ``payload`` is published before the round under
    ``<round>/src`` (with the record), the round itself carries none and
    agrees through its digest; on success those are the values returned.
    """
    seq = rec.seq
    _kv.collect_garbage(client, seq)
    # The debug thread (stacks, stepping) listens from here on (cheap once
    # started); with stepping on, the host marks itself waiting at the gate.
    gate = _enter_hook(client, rec) if _enter_hook is not None else None
    started = time.monotonic()
    beside_dir = f'{_round_of(seq).name}/src'
    if beside:
        if payload:  # a source: its data is there before it arrives
            _kv.publish(client, beside_dir, rec.to_json(payload))
        payload = None
    text = rec.to_json(payload)
    details = _timeout_details(client, rec, rec.describe())
    period, patience = _patience(rec, timeout, details)
    # Publish (also this host's arrival in the step table), pass the step
    # gate, wait for every host; every host judges everyone's records.
    try:
        verdict, raw = _kv.run_round(
            client,
            _round_of(seq),
            text,
            timeout=period,
            judge=_judge,
            on_timeout=details,
            read=read or payload is not None,
            before_arrival=gate,
            patience=patience,
            agree=_agreement(rec),
        )
        if beside and verdict.ok:
            raw = _kv.read_dir(client, beside_dir)
        return verdict, raw, started
    except CoordinatorUnreachableError as exc:
        _recorder.finished(entry, failed=True)
        raise _verdicts.unreachable_error(exc, rec) from exc.__cause__
    except BaseException:
        _recorder.finished(entry, failed=True)
        raise


def _round_of(seq: int) -> _kv.Round:
    """Where collective ``seq``'s round lives: its barrier, its ring slot, its verdict key."""
    return _kv.Round(
        name=f'{_kv.epoch_dir(seq)}/{seq}',
        data=_slot_dir(seq),
        id=str(seq),
        belongs=_starts(f'{{"seq":{seq},'),  # records are JSON, "seq" first
    )


def _agreement(rec: CollectiveRecord) -> str:
    """What `_judge` passes when equal on every host: the signature; a failing host's is its own."""
    if rec.fail:
        return f'fail/{rec.process}'
    return json.dumps(_signature(rec))


def _signature(rec: CollectiveRecord) -> list[str]:
    """What hosts must agree on at a collective: (kind, name, digest), as a JSON-able list."""
    return [rec.kind, rec.name, rec.digest]


def _skipped(verdict: _kv.Verdict, rec: CollectiveRecord) -> bool:
    """Whether this host skipped the collective that ``verdict`` (a failure at ``rec.seq``) ended.

    Only a timeout verdict of a collective's own round, written before this
    host arrived, says so: the others gave up on a collective this host did
    not call. It carries what they called there (``calls``); a host whose own
    call is one of those is late at that collective (it raises the verdict),
    any other host skipped it (it takes its turn at the others' next one).
    """
    data = verdict.data
    if verdict.kind != 'timeout' or data.get('stage') or 'calls' not in data:
        return False
    if rec.process in data.get('arrived', ()):
        return False
    return _signature(rec) not in data['calls']


def _skip_ahead(client: Any, rec: CollectiveRecord) -> tuple[int, _kv.Verdict]:
    """Where a host that skipped collective ``rec.seq`` takes its turn, and that turn's verdict.

    The others went on to ``rec.seq + 1``; if they gave up there too (and this
    host skipped that one as well), further. One read of a verdict key per
    collective they failed without this host; the first collective with no
    verdict is where they wait now (``'ok'``: this host joins that round),
    and a collective whose verdict this host is late for ends it there
    (that verdict: it raises it).
    """
    seq = rec.seq
    while True:
        seq += 1
        text = _kv.get(client, _round_of(seq).verdict_key)
        if text is None:
            return seq, _kv.Verdict.parse('ok')
        _kv.collect_garbage(client, seq)  # an epoch this host jumps over is still cleaned up
        verdict = _kv.Verdict.parse(text)
        if not _skipped(verdict, dataclasses.replace(rec, seq=seq)):
            return seq, verdict


def share(
    rec: CollectiveRecord,
    stage: str,
    value: str,
    *,
    timeout: float | None = None,
    what: str = '',
    same: bool = False,
    agree: str | None = None,
) -> dict[int, str]:
    """A further exchange inside collective ``rec``: every host's ``value`` (process -> text).

    For collectives that move data after their check (`tree_diff`'s
    fingerprints, `check_replicas`' digests): one `_kv.run_round` under the
    collective's keys (cleaned up with its epoch), with the same verdict on
    every host when a host does not arrive. ``what`` names the stage in a
    timeout's message (default: ``stage``); a host missing there that is
    inside ``rec`` is said to be busy before the stage (not elsewhere).
    ``same``: values are expected equal everywhere (a digest): above
    `_kv.DIGEST_ABOVE` hosts they are agreed on through the round's agreement
    directory, so equal values cost a host O(1) bytes (every host's value is
    then its own); only differing ones are read.
    ``agree``: like ``same``, but hosts agree on ``agree`` instead of their
    (differing) values: when every host's ``agree`` is the same, above
    `_kv.DIGEST_ABOVE` hosts nobody reads the values and this returns ``{}``;
    otherwise everyone's values, as without it.

    Raises:
        BarrierTimeoutError: some host did not arrive within ``timeout``.
        CollectiveInterruptedError: another host was interrupted here.
    """
    client = _kv.client()
    if client is None:
        return {rec.process: value}
    rnd = _kv.Round(name=stage_dir(rec, stage), data=f'{stage_dir(rec, stage)}/d')

    where = _timeout_details(client, rec, f'{rec.describe()} ({what or stage})', stage=True)
    period, patience = _patience(rec, _timeout(timeout), where)
    agree_on = value if same else agree
    verdict, values = _kv.run_round(
        client,
        rnd,
        value,
        timeout=period,
        on_timeout=where,
        read=agree_on is None,
        read_unless_agreed=agree_on is not None,
        patience=patience,
        agree=agree_on,
    )
    if not verdict.ok:
        raise _error(verdict, rec, None)
    if same and not values:  # the agreement directory held one digest: all alike
        return dict.fromkeys(range(_kv.process_count()), value)
    return values


def stage_dir(rec: CollectiveRecord, stage: str) -> str:
    """The key directory of the `share` round ``stage`` of collective ``rec``.

    A host may store further keys of that stage under it (not under ``/d``,
    the round's values), e.g. one large value the round's other hosts read on
    demand; they are deleted with the collective's epoch.
    """
    if rec.lane and _off_main is not None:
        return f'{_off_main.round_dir(rec)}/{stage}'
    return f'{_kv.epoch_dir(rec.seq)}/{rec.seq}/{stage}'


def check_launch(
    name: str,
    digest: str,
    *,
    new: bool,
    site: str,
    entry: _recorder.Entry,
    timeout: float | None = None,
) -> tuple[CollectiveRecord, dict[int, str], bool]:
    """A watched launch's turn in the collective sequence (see `_watch`).

    One round like a core collective's: every host publishes (``'launch'``,
    function name, signature digest) and whether it sees this signature for
    the first time; a mismatch raises `CollectiveMismatchError` on every
    host, before launch.

    Returns:
        (this host's record, every host's published record as JSON (parse
        with `CollectiveRecord.from_json` when needed), whether any host is
        new to the signature: then every host goes on to compare
        fingerprints).
    """
    rec, raw = _enter(
        'launch',
        name,
        tree_digest=digest,
        timeout=timeout,
        site=site,
        payload=b'n' if new else b'',
        launch=entry,
    )
    if not raw:  # one process
        return rec, {rec.process: rec.to_json()}, new
    return rec, raw, any(_NEW_MARK in v for v in raw.values())


#: What a record published with the "new signature" payload holds (the same
#: JSON `CollectiveRecord.to_json` writes): found by substring, nothing parsed.
_NEW_MARK = json.dumps({'data': base64.b64encode(b'n').decode()}, separators=(',', ':'))[1:-1]


#: Set by `_stepgate` when it is imported (`multihost` imports it): runs as a
#: host enters a collective, starts the debug thread and, with stepping on,
#: returns the step gate to pass before the host counts as arrived.
_enter_hook: Callable[[Any, CollectiveRecord], Callable[[], None] | None] | None = None


#: Set by `_threads` when it is imported (`multihost` imports it): the
#: module that enters collectives called off the main thread (`enter`) and
#: says where their keys live (`round_dir`).
_off_main: Any = None


def set_off_main(module: Any) -> None:
    """Installs the module that handles collectives off the main thread (see `_threads`)."""
    global _off_main
    _off_main = module


def set_enter_hook(hook: Callable[[Any, CollectiveRecord], Callable[[], None] | None]) -> None:
    """Installs the enter hook (the debug thread and the step gate; see `_stepgate`)."""
    global _enter_hook
    _enter_hook = hook


def _timeout_details(
    client: Any, rec: CollectiveRecord, what: str, *, stage: bool = False
) -> _kv.OnTimeout:
    """What a timeout verdict of ``rec``'s round says: the call, and where the missing hosts were.

    At most `_verdicts.MAX_POSITIONS` positions (a bounded verdict); the message names
    every missing host anyway. ``stage``: a further round inside ``rec``
    (`share`), where a missing host may be inside ``rec`` itself. A
    collective's own round also records what the hosts that arrived called
    (``calls``: their distinct (kind, name, digest), at most `_MAX_CALLS`), so
    that a host arriving later can tell whether it is late at this collective
    or skipped it (`_skipped`).
    """

    def details(arrived: dict[int, str]) -> dict[str, Any]:
        where = positions(client)
        missing = sorted(p for p in where if p not in arrived)[: _verdicts.MAX_POSITIONS]
        out: dict[str, Any] = {
            'what': what,
            'name': rec.name,
            'positions': {p: where[p].to_json() for p in missing},
        }
        doing = _doing_of(client, missing[: _verdicts.MAX_DOING])
        if doing:
            out['doing'] = doing
        if stage:
            out['stage'] = True
        else:
            calls = [_signature(rec)]
            for value in arrived.values():
                sig = _signature(CollectiveRecord.from_json(value))
                if sig not in calls and len(calls) < _MAX_CALLS:
                    calls.append(sig)
            out['calls'] = calls
        return out

    return details


def _doing_of(client: Any, missing: list[int]) -> dict[int, str]:
    """What each of ``missing`` was doing by its liveness stamp (``mh/alive/<p>``, written
    every few seconds by the fate watcher under `multihost.install`): process -> words
    (``: in time.sleep at train.py:93, 0% CPU over the last 5 s, ...``, or ``(as of 3 s
    before): ...`` for an older stamp); hosts with no stamp
    are absent. One read per host, at most `_verdicts.MAX_DOING` of them."""
    out: dict[int, str] = {}
    for p in missing:
        try:
            raw = _kv.get(client, _kv.key('alive', p))
        except Exception:
            return out
        if not raw:
            continue
        if _kv.stamp_says_done(raw):
            out[p] = ': its program had ended'
            continue
        try:
            stamp = json.loads(raw)
        except ValueError:
            continue
        if isinstance(stamp, dict) and stamp.get('doing'):
            age = time.time() - float(stamp.get('t') or time.time())
            when = f' (as of {age:.0f} s before)' if age >= 1.5 else ''
            out[p] = f'{when}: {str(stamp["doing"])[:300]}'
    return out


def _patience(
    rec: CollectiveRecord, timeout: float, details: _kv.OnTimeout
) -> tuple[float, _kv.Patience | None]:
    """A round's (timeout, patience): `math.inf` waits on, reporting every `default_timeout()`."""
    if not math.isinf(timeout):
        return timeout, None
    period = default_timeout()

    def report(arrived: dict[int, str], waited: float) -> None:
        data = {
            'missing': [p for p in range(_kv.process_count()) if p not in arrived],
            **details(arrived),
        }
        log.warning(
            'multihost: still waiting after %.0f s in %s: %s did not arrive; %s. Waiting on, '
            "as JAX's own call would (a timeout, multihost.install(timeout=...) or "
            'MULTIHOST_TIMEOUT, makes it raise instead).',
            waited,
            data['what'],
            fmt_hosts(data['missing']),
            '; '.join(line.strip() for line in _verdicts.missing_lines(data, rec)),
        )

    return period, report


def _judge(values: dict[int, str]) -> str | None:
    """Run once, by the last host to arrive: a failure verdict, or None when all agree."""
    calls = {p: CollectiveRecord.from_json(v) for p, v in values.items()}
    failed = {p: c.fail for p, c in calls.items() if c.fail}
    if failed:
        return _kv.Verdict.failure('failed', reasons=failed, records=_verdicts.records_json(calls))
    signature = {p: (c.kind, c.name, c.digest) for p, c in calls.items()}
    if len(set(signature.values())) <= 1:
        return None
    return _kv.Verdict.failure('mismatch', records=_verdicts.records_json(calls))


#: Called with every timeout or mismatch error just before it is raised (`_job._dump`).
ERROR_HOOKS: list[Callable[[Exception], None]] = []


def _error(verdict: _kv.Verdict, rec: CollectiveRecord, mismatch_prefix: str | None) -> Exception:
    exc = _verdicts.error_of(verdict, rec, mismatch_prefix)
    for hook in ERROR_HOOKS:
        hook(exc)
    return exc


def position() -> int:
    """The number of the next collective this process will enter."""
    with _state.lock:
        return _state.next_seq


def realign(seq: int) -> None:
    """Moves this process's next collective number forward to ``seq`` (never back).

    After an interrupt, hosts may have entered different numbers of
    collectives; the notebook reads every host's `position` and realigns all
    of them at the largest, so the next collective lines up again.
    """
    with _state.lock:
        if seq > _state.next_seq:
            _state.next_seq = int(seq)
