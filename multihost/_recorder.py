"""The flight recorder: a bounded ring of what this host launched and entered, read only when asked.

Every core collective (`_sequence`) and every watched launch (`_watch`)
leaves one entry: what it was, where it was called from, when, how long the
host waited at the cross-host check, and, for a launch, a weak reference to
one of its outputs. Nothing polls: whether a launch finished on device is
found when someone asks (`snapshot`), by ``jax.Array.is_ready()`` of that
output. An output that was collected, donated or deleted reads
``'unknown'``.

Memory is bounded: the last `CAPACITY` entries per host. Entries are small
slotted objects (no JSON, no dataclass) on the hot path; `FlightRecord`, the
frozen model, is built only when read.

Depends on the standard library only (imported by `_sequence`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
import weakref
from typing import Any

#: Entries kept per host (older ones drop off).
CAPACITY = 2000

#: A launch's state: output exists and is not ready / ready / nothing to ask.
LAUNCHED, DONE, UNKNOWN, FAILED = 'launched', 'done', 'unknown', 'failed'
#: A collective's state: waiting at the check / through it / it raised.
WAITING, PASSED = 'waiting', 'passed'


@dataclasses.dataclass(frozen=True)
class FlightRecord:
    """One entry of a host's flight recorder.

    Attributes:
        n: position in this host's flight record (0-based; every entry counts).
        kind: ``'launch'`` for a watched call, else the core collective
            (``'barrier'``, ``'process_allgather'``, ...).
        name: the watched function's name, or the collective's name.
        call: launches: this host's call number of ``name`` (0-based), the
            same on every host that runs the same program; collectives: -1.
        seq: the collective sequence number when the entry was checked across
            hosts (core collectives, watched launches with ``check=True``),
            else None.
        digest: launches: digest of the input signature (structure, shapes,
            dtypes, shardings, static arguments); collectives: of the data.
        fingerprint: the compiled executable's fingerprint (jitted launches),
            else empty.
        site: the caller's ``file:line``.
        time: wall-clock time (``time.time()``) of the call, on this host's clock.
        wait: seconds this host waited at the cross-host check (the last host
            to arrive waits least); None when unchecked or still waiting.
        state: ``'waiting'`` (at the cross-host check), ``'launched'``
            (output not ready on device), ``'done'``,
            ``'unknown'`` (output collected, donated or not an array),
            ``'failed'`` (raised); collectives: ``'waiting'``, ``'passed'``
            or ``'failed'``.
        process: the host's process index.
        spans: launches recorded by `multihost.install`: whether the computation
            spans devices of more than one process (None when not known: other
            launches, collectives, or a call whose outputs hold no array yet).
    """

    n: int
    kind: str
    name: str
    call: int
    seq: int | None
    digest: str
    fingerprint: str
    site: str
    time: float
    wait: float | None
    state: str
    process: int
    spans: bool | None = None

    @property
    def is_launch(self) -> bool:
        return self.kind == 'launch'

    @property
    def label(self) -> str:
        """``train_step call #412`` (a launch's call number, labelled) or ``barrier('x') #57``
        (the collective sequence number: a bare ``#`` is always that one)."""
        if self.is_launch:
            return f'{self.name} call #{self.call}'
        what = f'{self.kind}({self.name!r})' if self.name else self.kind
        return what if self.seq is None else f'{what} #{self.seq}'

    def describe(self) -> str:
        return f'{self.label} at {self.site}'

    def to_json(self) -> str:
        return json.dumps(dataclasses.astuple(self), separators=(',', ':'))

    @classmethod
    def from_json(cls, text: str) -> FlightRecord:
        return cls(*json.loads(text))


class Entry:
    """One recorded call (mutable, slotted: the hot path builds and updates it)."""

    __slots__ = (
        'n',
        'kind',
        'name',
        'call',
        'seq',
        'digest',
        'fingerprint',
        'site',
        'time',
        'wait',
        'state',
        'out',
        'returned',
        'spans',
    )

    def __init__(
        self,
        n: int,
        kind: str,
        name: str,
        call: int,
        seq: int | None,
        digest: str,
        fingerprint: str,
        site: str,
        state: str,
    ) -> None:
        self.n = n
        self.kind = kind
        self.name = name
        self.call = call
        self.seq = seq
        self.digest = digest
        self.fingerprint = fingerprint
        self.site = site
        self.time = time.time()
        self.wait: float | None = None
        self.state = state
        self.out: weakref.ref[Any] | None = None
        self.returned = False  # a launch's call has returned (its output is known)
        self.spans: bool | None = None  # the launch spans devices of other processes

    def current_state(self) -> str:
        """The state now: a launch's output asked whether it is ready (never blocks)."""
        if self.state != LAUNCHED:
            return self.state
        if not self.returned:
            return LAUNCHED  # still inside the call (a synchronous launch blocks there)
        ref = self.out
        out = ref() if ref is not None else None
        if out is None:
            return UNKNOWN
        try:
            if out.is_deleted():
                return UNKNOWN  # donated or deleted
            if out.is_ready():
                self.state, self.out = DONE, None  # done for good: drop the reference
                return DONE
        except Exception:
            return UNKNOWN
        return LAUNCHED

    def record(self, process: int) -> FlightRecord:
        return FlightRecord(
            n=self.n,
            kind=self.kind,
            name=self.name,
            call=self.call,
            seq=self.seq,
            digest=self.digest,
            fingerprint=self.fingerprint,
            site=self.site,
            time=self.time,
            wait=self.wait,
            state=self.current_state(),
            process=process,
            spans=self.spans,
        )


class _Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ring: collections.deque[Entry] = collections.deque(maxlen=CAPACITY)
        self.count = 0
        self.calls: dict[str, int] = {}
        self.advanced = time.time()  # when this host last entered or left a recorded call


_rec = _Recorder()


def note(
    kind: str,
    name: str,
    *,
    seq: int | None,
    digest: str,
    site: str,
    fingerprint: str = '',
    checked: bool = True,
) -> Entry:
    """Adds an entry (a launch about to start, or a collective being entered) and returns it.

    Checked entries start ``'waiting'`` (at the cross-host check); an
    unchecked launch starts ``'launched'``.
    """
    launch = kind == 'launch'
    with _rec.lock:
        n = _rec.count
        _rec.count += 1
        call = -1
        if launch:
            call = _rec.calls.get(name, 0)
            _rec.calls[name] = call + 1
        entry = Entry(
            n, kind, name, call, seq, digest, fingerprint, site, WAITING if checked else LAUNCHED
        )
        _rec.ring.append(entry)
    _rec.advanced = entry.time
    return entry


def finished(entry: Entry, *, wait: float | None = None, failed: bool = False) -> None:
    """Through the cross-host check after waiting ``wait`` s (or it raised).

    A collective is then ``'passed'``; a launch ``'launched'`` (about to be).
    """
    entry.wait = wait
    if failed:
        entry.state = FAILED
    elif entry.state == WAITING:
        entry.state = LAUNCHED if entry.kind == 'launch' else PASSED
    _rec.advanced = time.time()


def launched(entry: Entry, output: Any) -> None:
    """A launch returned: keep a weak reference to ``output`` (a `jax.Array`) to ask later."""
    try:
        entry.out = None if output is None else weakref.ref(output)
    except TypeError:  # not weak-referenceable: nothing to ask later
        entry.out = None
    entry.returned = True
    _rec.advanced = time.time()


def snapshot(process: int, last: int | None = None) -> list[FlightRecord]:
    """This host's last ``last`` entries (all kept when None), oldest first, states read now."""
    with _rec.lock:
        entries = list(_rec.ring)
    if last is not None:
        entries = entries[-last:] if last > 0 else []
    return [e.record(process) for e in entries]


def last_advanced() -> float:
    """Wall-clock time this host last entered or left a recorded call."""
    return _rec.advanced


def reset() -> None:
    """Forgets every entry and call count (tests; a fresh session)."""
    with _rec.lock:
        _rec.ring.clear()
        _rec.count = 0
        _rec.calls.clear()
        _rec.advanced = time.time()


def call_counts() -> tuple[tuple[str, int], ...]:
    """Watched function name -> how many times this host launched it (sorted by name)."""
    with _rec.lock:
        return tuple(sorted(_rec.calls.items()))
