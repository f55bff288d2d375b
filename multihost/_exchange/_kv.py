"""The one key-value exchange every cross-host step of `multihost` uses.

The only module that talks to the coordination service of
``jax.distributed`` (reached through `_jax_adapter`): values and reads bounded
by `MAX_BYTES` (larger values chunked), process indices parsed from keys in one
place (`read_dir`), and the round (`run_round`: publish, wait for every host, read
everyone's values, one verdict for all hosts). Every wait is sliced (`SLICE`)
and has a deadline. See docs/ARCHITECTURE.md, "One key-value exchange".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from multihost import _jax_adapter
from multihost._errors import CoordinatorUnreachableError

#: Largest value stored under one key and largest directory read (bytes).
MAX_BYTES = 1 << 20
#: Longest single native wait (seconds): how soon a SIGINT is noticed.
SLICE = 0.5
#: How long hosts that saw a failure wait for each other to have read it.
ACK_TIMEOUT = 2.0
#: How much longer than a host's own deadline its waiter stays in the round's barrier.
_SERVICE_GRACE = 5.0
#: Longest interval between two looks at the verdict while waiting (seconds).
_LOOK_MAX = 4.0
#: The barrier wait of a patient round (`run_round`'s ``patience``): the longest
#: a blocking wait can be (int32 milliseconds, 24.8 days), i.e. as long as any job runs.
_PATIENT_BARRIER = (2**31 - 1) / 1000
#: Rounds among more hosts than this agree through one digest key (`run_round`'s
#: ``agree``); up to this many, reading every record (<= ~1 KiB) is cheaper
#: than the digest's extra RPC on the critical path (docs/SCALE.md). The
#: default; ``MULTIHOST_DIGEST_ABOVE`` sets it (read once, at import: `DIGEST_ABOVE`).
DEFAULT_DIGEST_ABOVE = 4


def digest_above(raw: str | None) -> int:
    """`DIGEST_ABOVE` from the text of ``MULTIHOST_DIGEST_ABOVE`` (None or empty: the default).

    A testing and tuning knob: ``0`` puts every round of two or more hosts on
    the digest path (the reliability tests run so at 4 hosts).
    """
    if raw is None or raw.strip() == '':
        return DEFAULT_DIGEST_ABOVE
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f'MULTIHOST_DIGEST_ABOVE must be a whole number of hosts >= 0, got {raw!r}: rounds '
            'among more hosts than it agree through one digest (0: always); unset it for the '
            f'default of {DEFAULT_DIGEST_ABOVE}.'
        )
    return value


#: The number of hosts above which rounds agree through a digest (see `digest_above`).
DIGEST_ABOVE = digest_above(os.environ.get('MULTIHOST_DIGEST_ABOVE'))
#: Every key `multihost` writes starts with this.
PREFIX = 'mh'
#: Rounds are grouped in epochs of this many collectives; process 0 deletes
#: the epoch before last when a new epoch starts (one RPC per epoch).
EPOCH = 64

_CHUNK_MARK = '\x00chunks:'
#: The entry a host that gave up or was interrupted adds to a round's agreement
#: directory before it writes its verdict: the round is no longer one digest.
_GAVE_UP = '!'


@dataclass
class Counters:
    """What this process asked of the coordination service (cheap ints; tests and benches).

    Attributes:
        rpcs: calls made (sets, gets, directory reads, increments; not barriers).
        bytes_read: bytes of values (and keys of directory reads) received.
        values_written: values stored (chunks included).
        bytes_written: bytes of values stored.
    """

    rpcs: int = 0
    bytes_read: int = 0
    values_written: int = 0
    bytes_written: int = 0

    def snapshot(self) -> Counters:
        return Counters(self.rpcs, self.bytes_read, self.values_written, self.bytes_written)

    def since(self, before: Counters) -> Counters:
        """What was counted after ``before`` (a `snapshot`)."""
        return Counters(
            self.rpcs - before.rpcs,
            self.bytes_read - before.bytes_read,
            self.values_written - before.values_written,
            self.bytes_written - before.bytes_written,
        )


#: This process's counts (module-level; read with ``COUNTERS.snapshot()``).
COUNTERS = Counters()


def _count_read(*texts: str | bytes) -> None:
    COUNTERS.rpcs += 1
    COUNTERS.bytes_read += sum(len(t) for t in texts)


def _count_write(text: str | bytes) -> None:
    COUNTERS.rpcs += 1
    COUNTERS.values_written += 1
    COUNTERS.bytes_written += len(text)


#: Prefix of a value published by a host paused at the step gate: seen, not arrived.
PAUSED = '\x01paused:'


def key(*parts: object) -> str:
    """``key('seq', 3, 1)`` -> ``'mh/seq/3/1'``."""
    return '/'.join((PREFIX, *map(str, parts)))


def stamp_says_done(raw: str | None) -> bool:
    """A liveness stamp (``key('alive', p)``, `_job._fate`) that says its host ended (its
    program's end, or ended by fate-sharing): never taken for lost."""
    return bool(raw) and str(raw).startswith('done')


def process_index() -> int:
    """This process's index, from the distributed state (never initializes the backend)."""
    return int(_jax_adapter.distributed_state().process_id)


def process_count() -> int:
    """The number of processes, from the distributed state (never initializes the backend)."""
    state = _jax_adapter.distributed_state()
    return int(state.num_processes) if state.client is not None else 1


def client() -> Any | None:
    """The coordination-service client when more than one process runs, else None."""
    c = _jax_adapter.client()
    if c is None or process_count() == 1:
        return None
    return c


# -- errors of the coordination service --------------------------------------------


def classify(exc: BaseException) -> str:
    """``'timeout'``, ``'exists'``, ``'missing'``, ``'unreachable'`` or ``'other'``.

    The client raises one exception type (whose module moved between JAX
    versions) carrying a gRPC status name in its text; this reads it once.
    """
    text = str(exc)
    head = text.split(':', 1)[0]
    if head == 'DEADLINE_EXCEEDED' or 'timed out' in text[:200].lower():
        return 'timeout'
    if head == 'ALREADY_EXISTS':
        return 'exists'
    if head == 'NOT_FOUND':
        return 'missing'
    if head in ('UNAVAILABLE', 'CANCELLED', 'ABORTED') or 'Socket closed' in text:
        return 'unreachable'
    return 'other'


def is_timeout(exc: BaseException) -> bool:
    """Whether a coordination-service error is a deadline (barrier or blocking get)."""
    return classify(exc) == 'timeout'


def unreachable(during: str) -> CoordinatorUnreachableError:
    """The one-line error for a coordination service that is gone."""
    address = _jax_adapter.coordinator_address() or 'its address'
    return CoordinatorUnreachableError(
        f'the coordination service on process 0 ({address}) is unreachable ({during}): '
        'process 0 has exited or crashed, or the network to it is down.',
        during=during,
    )


_calls = threading.local()  # this thread's count of coordination-service RPCs


def rpc_count() -> int:
    """How many coordination-service RPCs this thread has made through `_kv` so far
    (measures an issuer's reads; a difference of two calls is what a step cost)."""
    return int(getattr(_calls, 'n', 0))


@contextlib.contextmanager
def _rpc(during: str, n: int = 1) -> Iterator[None]:
    """Turns an unreachable coordination service into `CoordinatorUnreachableError`
    (and counts the ``n`` RPCs made inside, `rpc_count`)."""
    _calls.n = getattr(_calls, 'n', 0) + n
    try:
        yield
    except Exception as exc:
        if classify(exc) == 'unreachable':
            raise unreachable(during) from exc
        raise


# -- bounded values ----------------------------------------------------------------


def dir_cap(num_processes: int) -> int:
    """Largest value stored inline in a directory every one of ``num_processes`` hosts writes to.

    Three quarters of a directory read are for the hosts' values; the rest
    leaves room for the verdicts of failed rounds kept beside them (and the
    keys). 786 bytes at 1,000 hosts; larger values are chunked.
    """
    return max(256, (MAX_BYTES * 3 // 4) // max(1, num_processes))


def _dir_cap() -> int:
    return dir_cap(process_count())


def _chunk_root(k: str) -> str:
    """Where the chunks of ``k`` go: beside its directory (``a/b/5`` -> ``a/b~c/5``).

    Not under the directory itself (a directory read must not see them), but
    under the same parent, so they are deleted with it (e.g. an epoch).
    """
    parent, _, leaf = k.rstrip('/').rpartition('/')
    return parent + '~c/' + leaf


def layout(value: str, inline: int, root: str = '') -> tuple[str, list[bytes]]:
    """What `put` stores for ``value``: the text under the key itself, and the chunks.

    A value of at most ``inline`` bytes is stored as it is; a larger one as a
    short header (``root``: where its chunks go) plus chunks of at most
    `MAX_BYTES`, each read back with one RPC. Pure: the message sizes of an
    exchange can be computed from it (`docs/SCALE.md`).
    """
    if len(value) <= inline and len(value.encode()) <= inline:
        return value, []
    raw = value.encode()
    chunks = [raw[start : start + MAX_BYTES] for start in range(0, len(raw), MAX_BYTES)]
    return f'{_CHUNK_MARK}{len(chunks)}:{root}', chunks


def put(c: Any, k: str, value: str, *, once: bool = False, inline: int | None = None) -> bool:
    """Stores ``value`` under ``k``; values larger than ``inline`` are chunked.

    Args:
        once: first writer wins: returns False (and writes nothing) when ``k``
            exists already. Otherwise overwrites.
        inline: the largest value stored under ``k`` itself (default `MAX_BYTES`).

    Returns:
        True when this call wrote ``k``.
    """
    with _rpc(f'writing {k}'):
        value, chunks = layout(value, MAX_BYTES if inline is None else inline, _chunk_root(k))
        for i, chunk in enumerate(chunks):
            _count_write(chunk)
            c.key_value_set_bytes(f'{_chunk_root(k)}/{i}', chunk, True)
        try:
            _count_write(value)
            c.key_value_set(k, value, allow_overwrite=not once)
        except Exception as exc:
            if once and classify(exc) == 'exists':
                return False
            raise
    return True


def _resolve(c: Any, value: str) -> str:
    """Reassembles a chunked value (one bounded read per chunk)."""
    if not value.startswith(_CHUNK_MARK):
        return value
    n, root = value[len(_CHUNK_MARK) :].split(':', 1)
    with _rpc(f'reading {root}', int(n)):
        parts = [c.key_value_try_get_bytes(f'{root}/{i}') for i in range(int(n))]
    for part in parts:
        _count_read(part)
    return b''.join(parts).decode()


def get(c: Any, k: str) -> str | None:
    """The value under ``k``, or None when there is none (one RPC, no wait)."""
    try:
        with _rpc(f'reading {k}'):
            value = c.key_value_try_get(k)
    except Exception as exc:
        _count_read()
        if classify(exc) == 'missing':
            return None
        raise
    _count_read(value)
    return _resolve(c, value)


def wait_get(c: Any, k: str, deadline: float, *, longest: float = SLICE) -> str | None:
    """Waits for ``k`` until ``deadline`` (``time.monotonic()``); None if it never came.

    Waits in native slices of `SLICE` seconds, doubling up to ``longest``
    (default: `SLICE` throughout), so a SIGINT lands within ``longest``; a
    longer wait makes fewer RPCs (an issuer waiting seconds for 1,000 hosts).
    """
    wait = SLICE
    while (left := deadline - time.monotonic()) > 0:
        value = poll(c, k, min(left, wait))
        if value is not None:
            return value
        wait = min(wait * 2, longest)
    return None


def _listing(c: Any, directory: str) -> list[tuple[str, str]]:
    """One bounded read of ``directory``: (key relative to it, raw value) pairs."""
    prefix = directory.rstrip('/') + '/'
    with _rpc(f'reading {prefix}'):
        items = c.key_value_dir_get(prefix)
    _count_read(*(k for k, _ in items), *(v for _, v in items))
    return [(k[len(prefix) :].strip('/'), v) for k, v in items if k.startswith(prefix)]


def read_dir(c: Any, directory: str, skip: Container[int] = ()) -> dict[int, str]:
    """``process index -> value`` of the keys directly under ``directory``.

    Bounded: values written with `publish` are at most a share of `MAX_BYTES`
    inline; larger ones are fetched chunk by chunk, except those of the
    processes in ``skip`` (already read: left out).
    """
    return {
        int(rest): _resolve(c, v)
        for rest, v in _listing(c, directory)
        if rest.isdigit() and int(rest) not in skip
    }


def read_nested_dir(c: Any, directory: str) -> dict[tuple[int, int], str]:
    """``(k, process) -> value`` of the keys ``<directory>/<k>/<process>`` (one bounded read)."""
    out = {}
    for rest, v in _listing(c, directory):
        parts = rest.split('/')
        if len(parts) == 2 and all(part.isdigit() for part in parts):
            out[(int(parts[0]), int(parts[1]))] = _resolve(c, v)
    return out


def poll(c: Any, k: str, seconds: float) -> str | None:
    """One native wait of up to ``seconds`` for ``k`` (None on timeout); for background threads.

    The main thread uses `wait_get` (short slices, so a SIGINT lands); a
    background thread may long-poll to save RPCs.
    """
    try:
        with _rpc(f'waiting for {k}'):
            value = c.blocking_key_value_get(k, max(1, int(seconds * 1000)))
    except Exception as exc:
        _count_read()
        if classify(exc) == 'timeout':
            return None
        raise
    _count_read(value)
    return _resolve(c, value)


def publish(c: Any, directory: str, value: str) -> None:
    """Stores this process's ``value`` at ``<directory>/<process index>`` (bounded)."""
    put(c, f'{directory.rstrip("/")}/{process_index()}', value, inline=_dir_cap())


def delete(c: Any, prefix: str) -> None:
    """Deletes a key or a whole directory (best effort: the service may be gone)."""
    with contextlib.suppress(Exception):
        c.key_value_delete(prefix)


def increment(c: Any, k: str, by: int = 1) -> int:
    """Atomically adds ``by`` to the counter ``k``; returns the new value."""
    COUNTERS.rpcs += 1
    with _rpc(f'counting at {k}'):
        return int(c.key_value_increment(k, by))


def arrive(c: Any, name: str, n: int) -> str | None:
    """Counts this process in at barrier ``name`` of ``n``; the key to wait for, or None.

    A barrier made of keys under ``name``, not the coordination service's own:
    the service keeps every barrier id it has seen for good (about 0.9 KB of
    process 0's memory each, measured on jax 0.10.2: bench/soak.py), while
    these keys live in a round's directory and go with it (`collect_garbage`),
    so a job checking collectives for days leaves process 0 flat. Each caller
    counts itself in ``name/n``; the n-th (of a use: a name used again pairs
    the k-th calls of every host, as the service's barrier counters do) writes
    ``name/all<k>`` and is through (None); the others wait for that key.
    """
    COUNTERS.rpcs += 1
    with _rpc(f'arriving at {name}'):
        count = int(c.key_value_increment(f'{name}/n', 1))
    done = f'{name}/all{(count - 1) // n}'
    if count % n:
        return done
    _count_write('1')
    with _rpc(f'completing {name}'):
        c.key_value_set(done, '1')
    return None


def wait_through(c: Any, done: str | None, seconds: float) -> None:
    """Waits (at most ``seconds``) for the barrier key `arrive` named; raises the
    service's deadline error (`classify`: ``'timeout'``) when the time passes first."""
    if done is not None:
        _count_read()
        c.blocking_key_value_get(done, max(1, int(seconds * 1000)))


def barrier(c: Any, name: str, n: int, seconds: float) -> None:
    """`arrive` and `wait_through`: ``n`` processes meet at ``name`` (at most ``seconds``)."""
    wait_through(c, arrive(c, name, n), seconds)


def ack(c: Any, name: str, processes: list[int], timeout: float = ACK_TIMEOUT) -> bool:
    """A barrier of ``processes`` only, bounded by ``timeout``; False if it did not complete."""
    if process_index() not in processes or len(processes) < 2:
        return True
    try:
        barrier(c, name, len(processes), timeout)
    except Exception:
        return False
    return True


# -- epochs: where a collective's keys live, and their cleanup -----------------------


def epoch_dir(seq: int) -> str:
    """The key directory of collective ``seq``'s rounds."""
    return key('e', seq // EPOCH)


def collect_garbage(c: Any, seq: int) -> None:
    """On process 0, when collective ``seq`` starts an epoch, deletes the epoch before last.

    Safe: when process 0 enters ``seq`` every host has arrived at ``seq - 1``,
    so every host has finished with every round before ``seq - 1``.
    """
    if seq % EPOCH == 0 and seq >= 2 * EPOCH and process_index() == 0:
        delete(c, epoch_dir(seq - 2 * EPOCH) + '/')


# -- the round -----------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A round's outcome, the same on every host.

    Attributes:
        ok: every host arrived and the judge found nothing wrong.
        kind: ``'ok'``, ``'timeout'``, ``'interrupted'`` or the judge's
            failure kind (``'mismatch'``, ``'failed'``, ...).
        data: the failure's details (JSON-able), as written by whoever wrote
            the verdict: e.g. for a timeout ``arrived``, ``missing``,
            ``positions``, ``by`` and ``timeout``.
    """

    ok: bool
    kind: str
    data: Mapping[str, Any]

    @classmethod
    def parse(cls, text: str) -> Verdict:
        if text == 'ok':
            return cls(True, 'ok', {})
        raw = json.loads(text)
        return cls(False, raw.get('kind', 'failed'), raw)

    @staticmethod
    def failure(kind: str, **data: Any) -> str:
        return json.dumps({'kind': kind, **data}, separators=(',', ':'))


#: A judge reads every host's published value (process -> text) and returns
#: None when all is well, else a failure verdict made with `Verdict.failure`.
Judge = Callable[[dict[int, str]], str | None]
#: Adds details to a timeout verdict: (arrived values: process -> text) -> JSON-able
#: fields (e.g. where each missing host was); `run_round` adds ``arrived``,
#: ``missing``, ``by`` and ``timeout``.
OnTimeout = Callable[[dict[int, str]], dict[str, Any]]
#: Told, each time another ``timeout`` passes in a patient round, who has arrived
#: (process -> value) and how long this host has waited (seconds).
Patience = Callable[[dict[int, str], float], None]


@dataclass(frozen=True)
class Round:
    """One exchange among all processes.

    Attributes:
        name: the round's key directory (its barrier and acknowledgement).
        data: the directory hosts publish their values into (the sequence
            ring's slot, or a directory of the round's own).
        id: names the round inside ``data`` (its verdict is ``data/v/<id>``).
        belongs: whether a published value belongs to this round (a ring slot
            also holds older rounds' values); default: all do.
    """

    name: str
    data: str
    id: str = 'r'
    belongs: Callable[[str], bool] | None = None

    @property
    def verdict_key(self) -> str:
        return f'{self.data.rstrip("/")}/v/{self.id}'

    @property
    def agree_dir(self) -> str:
        """Where hosts create ``<digest>`` keys (first writer wins): one entry = all agree."""
        return f'{self.name.rstrip("/")}/g'

    def give_up(self, c: Any) -> None:
        """Marks the round failed for hosts that read only its agreement directory.

        Written before a timeout or interrupted verdict, so that a host which
        would have seen that verdict in a full read sees two entries and reads
        in full.
        """
        with contextlib.suppress(Exception):
            put(c, f'{self.agree_dir}/{_GAVE_UP}', '', once=True)

    def agreed(self, c: Any, digest: str) -> bool:
        """Creates ``digest``'s key (first writer wins; cheap when it exists)."""
        return put(c, f'{self.agree_dir}/{digest}', '', once=True)

    def one_digest(self, c: Any) -> bool:
        """One bounded read of the agreement directory: whether it holds exactly one digest."""
        return len(_listing(c, self.agree_dir)) == 1

    def arrived(self, c: Any) -> dict[int, str]:
        """The values published for this round by hosts that have arrived (not held)."""
        return self.read(c)[0]

    def read(self, c: Any) -> tuple[dict[int, str], str | None]:
        """One bounded read of the directory: the arrived values, and the verdict if any."""
        values: dict[int, str] = {}
        verdict = None
        for rest, value in _listing(c, self.data):
            if rest == f'v/{self.id}':
                verdict = _resolve(c, value)
                continue
            if not rest.isdigit():
                continue  # older verdicts, chunks: not a host's value
            v = _resolve(c, value)
            if not v.startswith(PAUSED) and (self.belongs is None or self.belongs(v)):
                values[int(rest)] = v
        return values, verdict


def agreement(text: str) -> str:
    """The key-safe digest of what hosts must agree on (`run_round`'s ``agree``)."""
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


class _Done:
    """The outcome of a call made by a waiter thread (a bare lock: the cheapest wake-up)."""

    __slots__ = ('_lock', 'error')

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._lock.acquire()  # released when the call is done

    def set(self) -> None:
        self._lock.release()

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, timeout: float) -> bool:
        if self._lock.acquire(timeout=max(0.0, timeout)):
            self._lock.release()
            return True
        return False


class _Waiter(threading.Thread):
    """A thread that makes native waits (barriers) for the main thread, which stays interruptible.

    Waiters are reused: one is normally enough; a waiter whose barrier is
    abandoned (its host timed out or was interrupted) stays busy until the
    coordination service ends that barrier, and another is started meanwhile.
    """

    _idle: list[_Waiter] = []
    _lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__(name='multihost-waiter', daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], _Done]] = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        while True:
            fn, done = self.jobs.get()
            try:
                fn()
            except BaseException as exc:  # handed to the main thread
                done.error = exc
            with _Waiter._lock:  # idle again before the main thread wakes
                _Waiter._idle.append(self)
            done.set()

    @classmethod
    def call(cls, fn: Callable[[], object]) -> _Done:
        done = _Done()
        with cls._lock:
            waiter = cls._idle.pop() if cls._idle else None
        (waiter or cls()).jobs.put((fn, done))
        return done


def _barrier_in_background(c: Any, name: str, seconds: float) -> _Done:
    """Arrives at barrier ``name`` (this thread: one quick RPC) and waits in a waiter thread."""
    done = arrive(c, name, process_count())
    if done is None:  # the last to arrive: through already
        through = _Done()
        through.set()
        return through
    return _Waiter.call(lambda: wait_through(c, done, seconds))


def run_round(
    c: Any,
    rnd: Round,
    value: str | None,
    *,
    timeout: float,
    judge: Judge | None = None,
    on_timeout: OnTimeout,
    read: bool = False,
    before_arrival: Callable[[], None] | None = None,
    patience: Patience | None = None,
    agree: str | None = None,
    read_unless_agreed: bool = False,
) -> tuple[Verdict, dict[int, str]]:
    """Publishes ``value``, waits for every host, returns the shared verdict (and values).

    The success path is the round's `barrier` (keys in the round's directory,
    made by a waiter thread, so this thread waits in `SLICE` slices and a
    SIGINT lands)
    followed by one read of the round's directory, in which every host finds
    everyone's values and judges them alike. Failures go through the verdict
    key ``data/v/<id>``, written once: a host whose own deadline passes writes
    who is missing; an interrupted host writes that. A waiting host looks for
    it between slices (at growing intervals, from 0.5 s up to 4 s); a late
    host finds it in its read (its barrier completes at once: the hosts that
    gave up had counted themselves in).

    Args:
        c: the coordination client.
        rnd: where the round's keys live.
        value: this host's value (None: already published by the caller).
        timeout: seconds from now until this host gives up waiting.
        judge: run by every host on everyone's values (alike everywhere):
            None when all is well, else a failure verdict.
        on_timeout: details for the timeout verdict, from the values that arrived.
        read: also return everyone's values (on success).
        before_arrival: the step gate: with it, the value is first published
            marked `PAUSED` (seen, not arrived), the gate runs, then the value
            is published as arrived.
        patience: keep waiting past ``timeout`` (the installed calls of
            `multihost.install`, which wait as long as JAX's would): each time
            another ``timeout`` passes, ``patience(arrived, waited)`` is told
            and the wait goes on, until every host arrives or another host
            writes a verdict. The barrier is waited for `_PATIENT_BARRIER`.
        agree: what the judge needs to agree on, when equal everywhere means
            success (`agreement` of it names a key in `Round.agree_dir`,
            created first-writer-wins). After the barrier a host reads only
            that directory: one entry is success (O(1) bytes per host, O(N)
            at the service); more than one (a difference, a failure marked
            unique, a host that gave up) reads everything and judges as
            without it. With ``read`` the digest is still written (other
            hosts may rely on it) but everything is read. Used only among
            more than `DIGEST_ABOVE` hosts.
        read_unless_agreed: return everyone's values unless the agreement
            directory alone said success (then ``{}``: every host's ``agree``
            was the same; with ``agree`` = the value, every value is this
            host's own).

    Returns:
        ``(verdict, values)``. A failed verdict has been acknowledged by every
        host that arrived in time (or `ACK_TIMEOUT` passed) before this returns.

    Raises:
        KeyboardInterrupt: after recording an ``interrupted`` verdict (unless
            one was written already), so the others stop too.
        CoordinatorUnreachableError: the coordination service is gone.
    """
    start = time.monotonic()
    deadline = start + timeout
    digests = _arrive(c, rnd, value, before_arrival, agree)
    # The barrier's wait outlives this host's own deadline, which decides.
    barrier_for = _PATIENT_BARRIER if patience is not None else timeout + _SERVICE_GRACE
    values: dict[int, str] = {}
    try:
        done = _barrier_in_background(c, f'{rnd.name}/b', barrier_for)
        text = _wait(c, done, deadline, rnd.verdict_key)
        while patience is not None and text is None and not done.is_set():
            patience(rnd.arrived(c), time.monotonic() - start)
            deadline += timeout
            text = _wait(c, done, deadline, rnd.verdict_key)
        error = done.error
        if text is None and done.is_set() and error is None:  # everyone arrived
            if digests and not read and rnd.one_digest(c):
                return Verdict(True, 'ok', {}), {}
            values, text = rnd.read(c)
            if text is None:
                text = (judge(values) if judge is not None else None) or 'ok'
        elif text is None and error is not None:
            if classify(error) == 'unreachable':
                raise unreachable(f'waiting at {rnd.name}') from error
            if classify(error) != 'timeout':
                raise error
        if text is None:  # this host's deadline passed, or the barrier was dropped
            text = _timeout_verdict(c, rnd, timeout, on_timeout)
    except KeyboardInterrupt:
        _interrupted(c, rnd)
        raise
    return _settled(c, rnd, Verdict.parse(text), values, read or read_unless_agreed)


def _interrupted(c: Any, rnd: Round) -> None:
    """`run_round` interrupted on this host: leave the round and say so in its verdict (the
    first verdict stays), so the others stop too."""
    rnd.give_up(c)
    with contextlib.suppress(Exception):
        put(
            c,
            rnd.verdict_key,
            Verdict.failure('interrupted', by=process_index(), arrived=[]),
            once=True,
        )


def _settled(
    c: Any, rnd: Round, verdict: Verdict, values: dict[int, str], keep: bool
) -> tuple[Verdict, dict[int, str]]:
    """`run_round`'s answer: on success the values if asked for (``keep``); a failure is
    first acknowledged by every host that arrived (judged: all of them)."""
    if verdict.ok:
        return verdict, values if keep else {}
    participants = verdict.data.get('arrived')
    if participants is None:  # judged: everyone had arrived
        participants = list(range(process_count()))
    ack(c, f'{rnd.name}/ack', [int(p) for p in participants])
    return verdict, values


def _arrive(
    c: Any,
    rnd: Round,
    value: str | None,
    before_arrival: Callable[[], None] | None,
    agree: str | None,
) -> bool:
    """Publishes this host's value (held first, with a step gate) and its digest; whether one."""
    if before_arrival is not None:
        # Held at the step gate: visible (the step table shows it) but not arrived.
        if value is not None:
            publish(c, rnd.data, PAUSED + value)
        before_arrival()
    if value is not None:
        publish(c, rnd.data, value)
    if agree is None or process_count() <= DIGEST_ABOVE:
        return False  # few hosts: everyone's records are as small as a digest's read
    rnd.agreed(c, agreement(agree))  # with ``read`` too: other hosts may read only digests
    return True


def _wait(c: Any, done: _Done, deadline: float, verdict_key: str) -> str | None:
    """Waits for the barrier in slices; a verdict seen meanwhile, or None (barrier or deadline)."""
    look_at = time.monotonic() + SLICE
    interval = SLICE
    while True:
        now = time.monotonic()
        if now >= deadline:
            return None
        if done.wait(min(SLICE, deadline - now)):
            return None
        if time.monotonic() >= look_at:  # waited a while: has someone given up?
            verdict = get(c, verdict_key)
            if verdict is not None:
                return verdict
            interval = min(interval * 2, _LOOK_MAX)
            look_at = time.monotonic() + interval


def _timeout_verdict(c: Any, rnd: Round, timeout: float, on_timeout: OnTimeout) -> str:
    """The round's verdict once this host gave up: an existing one, or a new timeout verdict."""
    arrived, existing = rnd.read(c)
    if existing is not None:
        return existing
    mine = Verdict.failure(
        'timeout',
        by=process_index(),
        timeout=timeout,
        arrived=sorted(arrived),
        missing=[p for p in range(process_count()) if p not in arrived],
        **on_timeout(arrived),
    )
    rnd.give_up(c)
    if not put(c, rnd.verdict_key, mine, once=True):
        return get(c, rnd.verdict_key) or mine
    _drop_stale_verdicts(c, rnd)
    return mine


def _drop_stale_verdicts(c: Any, rnd: Round) -> None:
    """Deletes verdicts of rounds long past that share ``rnd``'s directory (a ring slot).

    Only failures write verdicts, so this runs on the error path only; rounds
    more than `EPOCH` collectives old are past caring.
    """
    if not rnd.id.isdigit():
        return
    prefix = rnd.data.rstrip('/') + '/v/'
    with contextlib.suppress(Exception):
        for k, _ in c.key_value_dir_get(prefix):
            old = k[len(prefix) :]
            if old.isdigit() and int(old) < int(rnd.id) - EPOCH:
                delete(c, k)
