"""The collective sequence: every core collective is numbered, recorded and checked.

Each process counts the collectives it enters (barriers, gathers, broadcasts,
comparisons, array conversions that communicate). A correct multi-host program
enters the same collectives in the same order on every host, so the count is
the same everywhere and serves as a deterministic id: the coordination-service
barrier for collective number ``k`` is ``mh/b/<k>`` on every host. It cannot
drift silently: at every step the hosts compare what they are about to do, so
the first call where one host diverges raises on every host, naming each
host's call and call site.

Protocol for collective ``k`` (coordination service = the JAX distributed
runtime's key-value store, reached through `_jax_adapter`):

1. ``set mh/seq/<k mod SLOTS>/<pid> = record`` (kind, name, digest, call
   site, time, and k itself);
2. ``wait_at_barrier('mh/b/<k>', timeout)``;
3. ``dir_get mh/seq/<k mod SLOTS>/`` and compare every host's (kind, name,
   digest).

Three RPCs to the coordinator; no device work. With barrier stepping on
(`_debugd`), the host waits between 1 and 2 until step ``k`` is released.
On timeout the hosts read ``mh/seq/`` to tell who is missing and where each
host last was. Records live in a ring of `_SLOTS` slots, overwritten rather
than deleted (no extra RPC): a host can only overwrite slot ``k mod SLOTS``
at collective ``k + SLOTS``, after every host passed barrier ``k + 1`` and so
finished reading slot ``k``.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import contextvars
import dataclasses
import json
import os
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

from multihost import _jax_adapter
from multihost._errors import (
    BarrierMismatchError,
    BarrierTimeoutError,
    CollectiveMismatchError,
)

#: Default timeout (seconds) of every barrier and collective check, unless
#: ``MULTIHOST_TIMEOUT`` says otherwise. Generous on purpose: a real job may
#: legitimately keep one host busy (say, writing a checkpoint) for minutes
#: while the others wait. Debugging sessions set it lower.
DEFAULT_TIMEOUT = 600.0

_PREFIX = 'mh'
_RING_SIZE = 256
_SLOTS = 8  # key-value slots for records (see the module docstring)


def default_timeout() -> float:
    """The timeout used when none is given: ``MULTIHOST_TIMEOUT`` or `DEFAULT_TIMEOUT`."""
    raw = os.environ.get('MULTIHOST_TIMEOUT')
    if raw is None or raw == '':
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f'MULTIHOST_TIMEOUT must be a number of seconds, got {raw!r}. '
            'Unset it to use the default of '
            f'{DEFAULT_TIMEOUT:g} s.'
        ) from None
    if value <= 0:
        raise ValueError(f'MULTIHOST_TIMEOUT must be positive, got {raw!r}.')
    return value


def checking_enabled() -> bool:
    """Whether device collectives are sequence-checked (``MULTIHOST_CHECK``, on by default)."""
    return os.environ.get('MULTIHOST_CHECK', '1').strip().lower() not in ('0', 'false', 'off', 'no')


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    """One collective call as a host recorded it.

    Attributes:
        seq: position in this process's collective sequence (0-based).
        kind: which collective (``'barrier'``, ``'process_allgather'``, ...).
        name: barrier name, or a short description for other collectives.
        digest: hex digest of the tree structure, shapes and dtypes involved
            (empty for barriers).
        site: the caller's ``file:line`` outside `multihost`.
        time: wall-clock time (``time.time()``) when the call was entered.
        process: the process index that made the call.
    """

    seq: int
    kind: str
    name: str
    digest: str
    site: str
    time: float
    process: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(',', ':'))

    @classmethod
    def from_json(cls, text: str) -> CollectiveRecord:
        raw = json.loads(text)
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls)})

    def describe(self) -> str:
        """A one-line human description: ``sync_global_devices('ckpt') at train.py:42``."""
        what = f'{self.kind}({self.name!r})' if self.name else self.kind
        return f'{what} at {self.site} [#{self.seq}]'


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


def call_site() -> str:
    """``file:line`` of the innermost frame outside the `multihost` package."""
    override = _site_override.get()
    if override is not None:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(here + os.sep):
            return f'{filename}:{frame.f_lineno}'
        frame = frame.f_back
    return '<unknown>'


class _State:
    """Per-process sequence state; collectives are entered from one thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_seq = 0
        self.ring: collections.deque[CollectiveRecord] = collections.deque(maxlen=_RING_SIZE)
        self.current: CollectiveRecord | None = None


_state = _State()


def history() -> list[CollectiveRecord]:
    """The most recent collectives this process entered, oldest first."""
    with _state.lock:
        return list(_state.ring)


def current() -> CollectiveRecord | None:
    """The collective this process is in (or last entered)."""
    return _state.current


def _key(*parts: object) -> str:
    return '/'.join((_PREFIX, *map(str, parts)))


def _read_records(client: Any, directory: str) -> dict[int, CollectiveRecord]:
    out: dict[int, CollectiveRecord] = {}
    for _, value in client.key_value_dir_get(directory):
        rec = CollectiveRecord.from_json(value)
        out[rec.process] = rec
    return out


def positions(client: Any | None = None) -> dict[int, CollectiveRecord]:
    """Process index -> the latest collective each host published."""
    client = client or _jax_adapter.client()
    if client is None:
        return {}
    latest: dict[int, CollectiveRecord] = {}
    for _, value in client.key_value_dir_get(_key('seq') + '/'):
        rec = CollectiveRecord.from_json(value)
        if rec.process not in latest or rec.seq > latest[rec.process].seq:
            latest[rec.process] = rec
    return latest


def is_timeout(exc: BaseException) -> bool:
    """Whether a coordination-service error is a deadline (barrier or blocking get)."""
    text = str(exc)
    return (
        'DEADLINE_EXCEEDED' in text
        or 'timed out' in text.lower()
        or ('Barrier' in text and 'timeout' in text.lower())
    )


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
        timeout: seconds to wait for every host; default `default_timeout()`.
        site: call site to record; default: the caller outside `multihost`.
        mismatch_prefix: for barriers, the start of the mismatch message
            (``sync_global_devices`` keeps JAX's wording).

    Raises:
        BarrierTimeoutError: some host did not arrive within ``timeout``.
        BarrierMismatchError: hosts passed different barrier names.
        CollectiveMismatchError: hosts called different collectives, or the
            same one on differently shaped data.
    """
    return _enter(
        kind,
        name,
        tree_digest=tree_digest,
        timeout=timeout,
        site=site or call_site(),
        mismatch_prefix=mismatch_prefix,
    )[0]


def exchange(
    kind: str, name: str, payload: bytes, *, tree_digest: str, timeout: float | None = None
) -> dict[int, bytes]:
    """Like `enter`, and every host's ``payload`` rides along: process index -> bytes.

    For small data only (it travels through the coordinator, base64 in the
    record): the check and the data movement are one exchange, no device work.
    Requires more than one process.
    """
    _, raw = _enter(
        kind, name, tree_digest=tree_digest, timeout=timeout, site=call_site(), payload=payload
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
) -> tuple[CollectiveRecord, dict[int, str]]:
    """`enter`, also returning every host's raw published record (process -> JSON)."""
    import jax

    pid = jax.process_index()
    with _state.lock:
        seq = _state.next_seq
        _state.next_seq += 1
        rec = CollectiveRecord(
            seq=seq,
            kind=kind,
            name=name,
            digest=tree_digest,
            site=site,
            time=time.time(),
            process=pid,
        )
        _state.ring.append(rec)
        _state.current = rec
    client = _jax_adapter.client()
    if client is None or jax.process_count() == 1:
        return rec, {}
    timeout = default_timeout() if timeout is None else float(timeout)
    # The debug thread (stacks, stepping) listens from here on; cheap once
    # started. Imported here: `_debugd` builds on this module.
    from multihost import _debugd

    _debugd.ensure_started(client)
    gated = _debugd.before_arrival(client, rec)  # stepping on: "waiting at seq"
    # 1. publish (this is also the host's arrival in the step table)
    text = rec.to_json()
    if payload is not None:
        text = text[:-1] + ',"data":"' + base64.b64encode(payload).decode() + '"}'
    client.key_value_set(_key('seq', seq % _SLOTS, pid), text, allow_overwrite=True)
    # 1b. step gate: with stepping on, wait until step `seq` is released.
    _debugd.gate(client, rec, gated)
    # 2. wait for everyone (coordination-service barrier: it can time out)
    try:
        client.wait_at_barrier(_key('b', seq), max(1, int(timeout * 1000)))
    except Exception as exc:  # XlaRuntimeError; its type moved between versions
        if not is_timeout(exc):
            raise
        _raise_timeout(client, rec, timeout, exc)
    # 3. compare
    raw = {}
    calls = {}
    for _, value in client.key_value_dir_get(_key('seq', seq % _SLOTS) + '/'):
        r = CollectiveRecord.from_json(value)
        calls[r.process], raw[r.process] = r, value
    _check_same(rec, calls, mismatch_prefix)
    return rec, raw


def _check_same(
    rec: CollectiveRecord, calls: dict[int, CollectiveRecord], mismatch_prefix: str | None
) -> None:
    signature = {p: (c.kind, c.name, c.digest) for p, c in calls.items()}
    if len(set(signature.values())) <= 1:
        return
    lines = [f'  process {p}: {c.describe()}' for p, c in sorted(calls.items())]
    if all(c.kind == 'barrier' for c in calls.values()):
        names = {p: c.name for p, c in calls.items()}
        head = mismatch_prefix or f'barrier name mismatch ({rec.name!r})'
        raise BarrierMismatchError(
            f'{head}: hosts passed different barrier names at collective '
            f'#{rec.seq}:\n' + '\n'.join(lines),
            seq=rec.seq,
            calls=calls,
            names=names,
        )
    kinds = {c.kind for c in calls.values()}
    if len(kinds) > 1 or len({c.name for c in calls.values()}) > 1:
        why = 'hosts called different collectives'
    else:
        why = f'hosts called {rec.kind} on data of different structure, shapes or dtypes'
    head = f'collective sequence mismatch at #{rec.seq}: {why}'
    if mismatch_prefix and rec.kind == 'barrier':
        head = f'{mismatch_prefix}: {head}'
    raise CollectiveMismatchError(
        head
        + ':\n'
        + '\n'.join(lines)
        + ('\nEvery host must call the same collectives, in the same order, with the same shapes.'),
        seq=rec.seq,
        calls=calls,
    )


def _raise_timeout(
    client: Any, rec: CollectiveRecord, timeout: float, cause: BaseException
) -> None:
    import jax

    try:
        arrived = {
            p: r
            for p, r in _read_records(client, _key('seq', rec.seq % _SLOTS) + '/').items()
            if r.seq == rec.seq
        }
        where = positions(client)
    except Exception:  # the coordinator itself may be gone
        arrived, where = {rec.process: rec}, {}
    missing = [p for p in range(jax.process_count()) if p not in arrived]
    lines = []
    for p in missing:
        last = where.get(p)
        lines.append(
            f'  process {p}: last reached ' + (last.describe() if last else 'no collective yet')
        )
    what = rec.describe()
    raise BarrierTimeoutError(
        f'timed out after {timeout:g} s in {what}: process(es) {missing} did '
        'not arrive.\n' + '\n'.join(lines) + '\nA host that skips or reorders '
        'a collective, or is stuck in other work, leaves the others waiting; '
        'look at its stack (multihost.dump_stacks) or raise the timeout '
        '(timeout=..., or MULTIHOST_TIMEOUT).',
        name=rec.name,
        timeout=timeout,
        missing=missing,
        positions=where,
    ) from cause
