"""The flight recorder: a bounded ring of what this host launched and entered, read only when asked.

Every core collective (`_sequence`), every watched launch (`_watch`) and,
once installed, every barrier or key wait a library makes on the
coordination-service client itself (`_job._service`: kinds `SERVICE_BARRIER`,
`SERVICE_WAIT`) leaves one entry: what it was, where it was called from, when, how long the
host waited at the cross-host check, and, for a launch, weak references to
two of its outputs (the first and the last: a step's donated state and its
loss). Nothing polls: whether a launch finished on device is found when
someone asks (`snapshot`), by ``jax.Array.is_ready()`` of an output still
alive, and then whether it failed there (a ready output whose
``block_until_ready`` raises: ``'failed'``). When every kept output was
collected, donated or deleted, a later launch of the same thread on the
same devices that is done says this one is done too (a device runs its
programs in order); otherwise it reads ``'unknown'`` (the wavefront then
says "somewhere in calls #N..#M", `HostFront.pending_from`). A launch's age counts from when its
device could start it (`FlightRecord.started`: its dispatch, or the end of
the launch before it, as first seen), not from its dispatch: queue time is
not stuck time.

`reading_host_copies` marks a thread whose reads must not queue device work
behind a recorded launch (the data tools on a held job: `_checks._hostreads`).

Memory is bounded: the last `CAPACITY` entries per host. Entries are small
slotted objects (no JSON, no dataclass) on the hot path; `FlightRecord`, the
frozen model, is built only when read.

Depends on the standard library only (imported by `_sequence`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

#: Entries kept per host (older ones drop off).
CAPACITY = 2000

#: A launch's state: output exists and is not ready / ready / nothing to ask.
LAUNCHED, DONE, UNKNOWN, FAILED = 'launched', 'done', 'unknown', 'failed'
#: A collective's state: waiting at the check / through it / it raised.
WAITING, PASSED = 'waiting', 'passed'
#: Kinds of a library's own calls on the coordination-service client (a barrier,
#: a blocking key read): ``'waiting'`` while inside the call, then passed or failed.
SERVICE_BARRIER, SERVICE_WAIT = 'service_barrier', 'service_wait'
SERVICE_KINDS = frozenset({SERVICE_BARRIER, SERVICE_WAIT})


@dataclasses.dataclass(frozen=True)
class FlightRecord:
    """One entry of a host's flight recorder.

    Attributes:
        n: position in this host's flight record (0-based; every entry counts).
        kind: ``'launch'`` for a watched call, ``'service_barrier'`` /
            ``'service_wait'`` for a library's own barrier or blocking key
            read on the coordination-service client, else the core
            collective (``'barrier'``, ``'process_allgather'``, ...).
        name: the watched function's name, the collective's name, or the
            service barrier's id / the key waited for.
        call: launches and service calls: this host's call number of
            ``name`` in its kind (0-based), the same on every host that runs
            the same program; collectives: -1.
        seq: the collective sequence number when the entry was checked across
            hosts (core collectives, watched launches with ``check=True``),
            else None.
        digest: launches: digest of the input signature (structure, shapes,
            dtypes, shardings, static arguments); collectives: of the data;
            service barriers: the processes of a subset barrier (``'0,2'``;
            empty: every process).
        fingerprint: the compiled executable's fingerprint (jitted launches),
            else empty.
        site: the caller's ``file:line``.
        time: wall-clock time (``time.time()``) of the call, on this host's clock.
        wait: seconds this host waited at the cross-host check (the last host
            to arrive waits least), or inside a service call; None when
            unchecked or still waiting.
        state: ``'waiting'`` (at the cross-host check), ``'launched'``
            (output not ready on device), ``'done'``,
            ``'unknown'`` (output collected, donated or not an array),
            ``'failed'`` (raised); collectives: ``'waiting'``, ``'passed'``
            or ``'failed'``.
        process: the host's process index.
        timeout: service calls: the timeout the library passed (seconds);
            else None.
        thread: the name of the thread that made the call when it is not
            the main thread (orbax finalises saves from its own threads);
            empty for the main thread.
        lane: off the main thread, what matches the call across hosts and its
            count there (``'n:ckpt_3#0'``: the barrier name's first use;
            ``'t:async_save#4'``: that thread name's fifth collective; see
            `_threads`); else empty.
        spans: launches recorded by `multihost.install`: whether the computation
            spans devices of more than one process (None when not known: other
            launches, collectives, or a call whose outputs hold no array yet).
        started: launches: when (``time.time()``) its device could start it:
            its dispatch, or the end of the launch before it on this thread
            as first seen (a launch queued behind another has not started:
            None while that one runs); its age counts from here. Else None.
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
    timeout: float | None = None
    thread: str = ''
    lane: str = ''
    spans: bool | None = None
    started: float | None = None

    @property
    def is_launch(self) -> bool:
        return self.kind == 'launch'

    @property
    def is_service(self) -> bool:
        """A library's own barrier or key wait on the coordination-service client."""
        return self.kind in SERVICE_KINDS

    @property
    def label(self) -> str:
        """``train_step call #412`` (a launch's call number, labelled), ``barrier('x') #57``
        (the collective sequence number: a bare ``#`` is always that one), ``service
        barrier 'ckpt_3'`` (a library's own barrier; ``call #1`` when the id repeats)."""
        if self.is_launch:
            return f'{self.name} call #{self.call}'
        if self.kind == SERVICE_BARRIER:
            again = f' call #{self.call}' if self.call > 0 else ''
            return f'service barrier {self.name!r}{again}'
        if self.kind == SERVICE_WAIT:
            return f'service wait for key {self.name!r}'
        what = f'{self.kind}({self.name!r})' if self.name else self.kind
        if self.thread:
            what += f' [thread {self.thread!r}]'
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
        'timeout',
        'thread',
        'lane',
        'spans',
        'outs',
        'devices',
        'done_at',
        'prev',
        'done_prev',
        'keep',
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
        self.out: weakref.ref[Any] | None = None  # the first output (see `outs`)
        self.outs: tuple[weakref.ref[Any], ...] = ()  # the outputs asked (first, last)
        self.devices: Any = None  # the first output's sharding (whose devices it ran on)
        self.done_at: float | None = None  # when first seen done (or failed)
        self.prev: Entry | None = None  # this thread's launch before it (dropped once done)
        self.done_prev: float | None = None  # when that one was first seen ended
        self.keep: Any = None  # a small output held (strongly) while the launch is recent
        self.returned = False  # a launch's call has returned (its output is known)
        self.timeout: float | None = None
        self.thread = ''  # set off the main thread (`_threads`, `_job._service`)
        self.lane = ''
        self.spans: bool | None = None  # the launch spans devices of other processes

    def current_state(self) -> str:
        """The state now: a launch's outputs asked whether they are ready (never blocks).

        An output still alive that is ready says done, or failed when its buffers hold
        the launch's error (``block_until_ready`` of a ready array returns at once, or
        raises). Every output gone (collected, donated, deleted): ``'unknown'`` here;
        `_infer` may still tell it from the launches after it.
        """
        if self.state != LAUNCHED:
            return self.state
        if not self.returned:
            return LAUNCHED  # still inside the call (a synchronous launch blocks there)
        alive = False
        for ref in self.outs:
            out = ref()
            try:
                if out is None or out.is_deleted():
                    continue  # collected, donated or deleted: ask another
                alive = True
                if not out.is_ready():
                    continue
                try:
                    out.block_until_ready()  # ready: returns at once, or raises its error
                except Exception:
                    return self._end(FAILED)
                return self._end(DONE)
            except Exception:
                continue
        return LAUNCHED if alive else UNKNOWN

    def _end(self, state: str) -> str:
        """Done (or failed) for good: the references dropped."""
        self.state, self.out, self.outs, self.keep = state, None, (), None
        self.done_at = time.time()
        return state

    def started(self) -> float | None:
        """When its device could start it: its dispatch, or when the launch before it
        (this thread's) was first seen ended; None while that one still runs."""
        if self.kind != 'launch':
            return None
        prev = self.prev
        if prev is None:
            return self.time
        state = prev.current_state()
        if state == LAUNCHED:
            return None  # queued behind it: not started
        self.prev = None  # settled: no chain of references kept
        if prev.done_at is not None:
            self.done_prev = prev.done_at
        return max(self.time, self.done_prev or self.time)  # unknown: its dispatch

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
            timeout=self.timeout,
            thread=self.thread,
            lane=self.lane,
            spans=self.spans,
            started=self.started() if self.kind == 'launch' else None,
        )


class _Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ring: collections.deque[Entry] = collections.deque(maxlen=CAPACITY)
        self.count = 0
        self.calls: dict[str, int] = {}
        self.service_calls: dict[tuple[str, str], int] = {}
        self.advanced = time.time()  # when this host last entered or left a recorded call
        self.moved_on = 0.0  # when its main thread last got through one (passed, returned)
        self.recent: dict[str, collections.deque[Entry]] = {}  # thread -> newest launches


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
    timeout: float | None = None,
    thread: str = '',
) -> Entry:
    """Adds an entry (a launch about to start, a collective or service call being entered).

    Checked entries start ``'waiting'`` (at the cross-host check, or inside
    a service call); an unchecked launch starts ``'launched'``.
    """
    launch = kind == 'launch'
    with _rec.lock:
        n = _rec.count
        _rec.count += 1
        call = -1
        if launch:
            call = _rec.calls.get(name, 0)
            _rec.calls[name] = call + 1
        elif kind in SERVICE_KINDS:
            call = _rec.service_calls.get((kind, name), 0)
            _rec.service_calls[kind, name] = call + 1
        entry = Entry(
            n, kind, name, call, seq, digest, fingerprint, site, WAITING if checked else LAUNCHED
        )
        if timeout is not None:
            entry.timeout = timeout
        if thread:
            entry.thread = thread
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
    if not failed and not entry.thread:
        _rec.moved_on = _rec.advanced


#: Bytes up to which a launch's last output is held strongly while the launch is among its
#: thread's `KEEP_RECENT` newest: a step's loss, dropped by the user (``float(loss)``)
#: while the state output is donated to the next step, still tells when the step ended.
KEEP_BYTES = 4096
KEEP_RECENT = 8


def _ref(x: Any) -> weakref.ref[Any] | None:
    try:
        return None if x is None else weakref.ref(x)
    except TypeError:  # not weak-referenceable: nothing to ask later
        return None


def launched(entry: Entry, output: Any, last: Any = None) -> None:
    """A launch returned: weak references to ``output`` (its first `jax.Array`) and ``last``
    (its last: rarely donated, unlike a train state) to ask later; a small ``last`` is held
    while the launch is recent (`KEEP_BYTES`). Remembers this thread's launch before it."""
    refs = tuple(r for r in (_ref(output), _ref(last)) if r is not None)
    entry.out = refs[0] if refs and output is not None else None
    entry.outs = refs
    entry.devices = getattr(output, 'sharding', None)
    if last is not None and getattr(last, 'nbytes', KEEP_BYTES + 1) <= KEEP_BYTES:
        entry.keep = last
    with _rec.lock:
        recent = _rec.recent.setdefault(entry.thread, collections.deque())
        entry.prev = recent[-1] if recent else None
        recent.append(entry)
        if len(recent) > KEEP_RECENT:
            recent.popleft().keep = None
    entry.returned = True
    _rec.advanced = time.time()
    if not entry.thread:
        _rec.moved_on = _rec.advanced


def _same_devices(a: Entry, b: Entry) -> bool:
    if a.devices is None or b.devices is None or a.devices is b.devices:
        return True
    try:
        return bool(a.devices.device_set == b.devices.device_set)
    except Exception:
        return True


def _infer(entries: list[Entry]) -> None:
    """In-order completion: a launch whose outputs are all gone is done when a later launch
    of its thread, on the same devices, is done (a device runs its programs in order)."""
    later_done: dict[str, list[Entry]] = {}
    for e in reversed(entries):
        if e.kind != 'launch' or not e.returned:
            continue
        state = e.current_state()
        done = later_done.setdefault(e.thread, [])
        if state == DONE:
            done.append(e)
        elif state == UNKNOWN and any(_same_devices(e, d) for d in done):
            e._end(DONE)


def moved_on_since(t: float) -> bool:
    """Whether this host's main thread got through a recorded call (a collective or service
    call passed, a launch returned) after wall-clock time ``t``: what it was in then is over."""
    return _rec.moved_on > t


def record_of(n: int, process: int) -> FlightRecord | None:
    """Entry ``n`` of this host's flight record, its state read now; None once it has left
    the ring (`CAPACITY` later calls)."""
    with _rec.lock:
        entries = list(_rec.ring)
    _infer(entries[-RECENT:])
    for e in reversed(entries):
        if e.n == n:
            return e.record(process)
        if e.n < n:
            break
    return None


def snapshot(process: int, last: int | None = None) -> list[FlightRecord]:
    """This host's last ``last`` entries (all kept when None), oldest first, states read now."""
    with _rec.lock:
        entries = list(_rec.ring)
    if last is not None:
        entries = entries[-last:] if last > 0 else []
    _infer(entries)
    return [e.record(process) for e in entries]


def awaited_launch(process: int) -> FlightRecord | None:
    """The main thread's oldest launch after its newest known done (or failed) whose call has
    returned but whose outputs are not ready on device (a device wait: a collective whose
    peer has not come; the launches after it queue behind it), among its last `RECENT`
    entries; None when the newest known is done (a launch still inside its call, compiling or
    blocking, is not one)."""
    with _rec.lock:
        entries = list(_rec.ring)[-RECENT:]
    _infer(entries)
    oldest = None  # after a run-ahead, the oldest one in flight is the one running
    for e in reversed(entries):
        if e.kind != 'launch' or e.thread:
            continue
        state = e.current_state()
        if state in (DONE, FAILED):
            break
        if state == LAUNCHED and e.returned:
            oldest = e
    return None if oldest is None else oldest.record(process)


def inside_call(process: int) -> FlightRecord | None:
    """The main thread's newest entry when it is a launch whose call has not returned (the
    thread is in jit's call: tracing, compiling, or running a synchronous launch, which is how
    XLA:CPU runs one on a process with one device: a collective whose peer never comes blocks
    there); else None."""
    with _rec.lock:
        entries = list(_rec.ring)[-RECENT:]
    main = next((e for e in reversed(entries) if not e.thread), None)
    if main is None or main.kind != 'launch' or main.returned or main.state != LAUNCHED:
        return None
    return main.record(process)


def in_flight(process: int) -> list[FlightRecord]:
    """This host's launches (any thread) whose call returned and whose outputs are not
    ready on device yet, oldest first, among its last `RECENT` entries."""
    with _rec.lock:
        entries = list(_rec.ring)[-RECENT:]
    _infer(entries)
    return [
        e.record(process)
        for e in entries
        if e.kind == 'launch' and e.returned and e.current_state() == LAUNCHED
    ]


class _Reads(threading.local):
    host_copies = False


_reads = _Reads()


@contextlib.contextmanager
def reading_host_copies(on: bool = True) -> Iterator[None]:
    """In this thread (with ``on``), the data tools read host copies of ready shards and
    enqueue no device work (`_checks._hostreads`): a device program would queue behind a
    launch in flight (a stuck step), a copy of a ready buffer does not."""
    before, _reads.host_copies = _reads.host_copies, bool(on) or _reads.host_copies
    try:
        yield
    finally:
        _reads.host_copies = before


def host_copies_only() -> bool:
    """Whether this thread reads host copies only (inside `reading_host_copies`)."""
    return _reads.host_copies


#: How many of its last entries a host reads to say what it waits in (`in_progress`).
RECENT = 64


def in_progress(
    records: list[FlightRecord],
) -> tuple[FlightRecord | None, FlightRecord | None, tuple[FlightRecord, ...]]:
    """(the newest record, the main thread's newest if it is still waiting, the calls still
    in progress on other threads, oldest first) of ``records`` (oldest first).

    A library's background thread (orbax finalising a save) may wait in a service barrier
    while the main thread runs on: that wait is not the main thread's.
    """
    last = records[-1] if records else None
    main = next((r for r in reversed(records) if not r.thread), None)
    waiting = main if main is not None and main.state == WAITING else None
    # Another thread's wait: a library's service call, or a collective off the main thread.
    background = tuple(r for r in records if r.thread and r.state == WAITING)
    return last, waiting, background


def last_advanced() -> float:
    """Wall-clock time this host last entered or left a recorded call."""
    return _rec.advanced


def reset() -> None:
    """Forgets every entry and call count (tests; a fresh session)."""
    with _rec.lock:
        _rec.ring.clear()
        _rec.count = 0
        _rec.calls.clear()
        _rec.service_calls.clear()
        _rec.recent.clear()
        _rec.advanced = time.time()
        _rec.moved_on = 0.0


def call_counts() -> tuple[tuple[str, int], ...]:
    """Watched function name -> how many times this host launched it (sorted by name)."""
    with _rec.lock:
        return tuple(sorted(_rec.calls.items()))
