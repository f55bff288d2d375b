"""Audit while it runs: duplicate data, replica drift and the first non-finite, found the launch
they happen at, off the main thread.

Under `multihost.install(audit=N)` (``multihost run --audit[=N]``, ``MULTIHOST_AUDIT=N``) the
installed jit (`_jit`) hands this module every recorded launch whose computation spans
processes. The first `FIRST` launches of each jitted function, then every N-th, are audited:

1. the launch's array arguments and results are handed to the audit thread
   (``multihost-audit``); it waits until the results are ready and reads every block this host
   holds: its fingerprint (`_checks.fingerprint.digests`: XXH3 at memory speed for data in
   host memory, the exact kernel on an accelerator), whether it holds NaN or Inf (floating
   dtypes), and, for a fresh input, whether it is constant;
2. the hosts share those tables in one exchange of the audit thread's own lane
   (`_sequence.exchange` off the main thread: the step never waits for the other hosts);
3. every host compares the same tables, so every host finds the same things: replicas of
   one block that differ (**drift**), blocks of a fresh input held by different processes
   that are identical (**duplicate**), the first launch whose results hold NaN or Inf and
   which processes' inputs held some (**nonfinite**). Each finding is printed once
   (``multihost audit: ...`` on stderr), kept in `report` and noted in the flight records.

A *fresh* input is an argument no recorded launch produced (a batch from
``make_array_from_process_local_data``, ``device_put``, numpy): the outputs of every recorded
launch are remembered by weak reference while the audit is on. Constant blocks (zeros,
padding, a mask of ones), blocks under `MIN_DUP_BYTES`, PRNG keys and inputs a launch donated
(deleted by the time they are read) are never duplicate data.

The one wait on the main thread: before the next launch of an audited function, until the
audit thread has read the previous launch's results (that launch may donate them). It is
counted in the report (``waited``). Findings are reported, not fatal.

With ``--audit-replay`` (`enable`'s ``replay``) each audited launch waits for its verdict (as
with ``--audit-raise``), so every host learns a finding at the same launch; the first drift or
NaN finding holds the next launch of that function on every host, before it runs, and
replays it there (`multihost.replay` with ``canonical=True``: the drift has already moved the
inputs, so every replica is given one replica's values and the launch is run again, then op
by op, to the first operation where the hosts part). Every host prints the verdict, keeps it
in the report (``replays``) and, given a dump directory, writes it there as
``replay-<process>.json`` (`multihost analyze` reads it); then the launch runs as it would
have (``--audit-raise`` raises after the replay).

The job's end (`finish`): in ``jax.distributed.shutdown()`` (wrapped while the audit is on)
and at the interpreter's exit, whichever comes first, every host first waits (at most
`CLOSE_WAIT`) until the launches it read are shared and compared, so all hosts finish the
same rounds before process 0's coordination service goes away; what could not be compared
in time is named (``not audited``); then the summary line, always.
"""

from __future__ import annotations

import atexit
import collections
import functools
import hashlib
import json
import sys
import threading
import time
import weakref
from typing import Any

import jax
import numpy as np

from multihost import _recorder
from multihost._debug import _control
from multihost._defaults import AUDIT_EVERY, AUDIT_FIRST, audit_every
from multihost._models._audit import (
    AUDIT_THREAD,
    AuditFinding,
    AuditReport,
    drift_detail,
    odd_ones,
)
from multihost._models._layout import format_index
from multihost._text import fmt_hosts

#: Launches of each function audited from its first call; then every N-th (`_defaults`).
FIRST, DEFAULT_EVERY = AUDIT_FIRST, AUDIT_EVERY
every_from = audit_every
#: Blocks of a fresh input smaller than this are never called duplicate data.
MIN_DUP_BYTES = 64
#: How long the audit thread waits for the other hosts' tables of one launch.
EXCHANGE_TIMEOUT = 300.0
#: How long a launch waits for the audit thread to have read the previous one's results.
READ_WAIT = 60.0
#: Audited launches queued and not yet read, at most (beyond: the audit stops).
MAX_QUEUED = 16
#: Blocks named in one finding's line.
_MAX_BLOCKS = 2


class _Item:
    """One audited launch, from the main thread to the audit thread."""

    __slots__ = ('name', 'call', 'site', 'fn', 'args', 'kwargs', 'out', 'read', 'done', 'at')

    def __init__(self, name: str, call: int, site: str, fn: Any, args: tuple, kwargs: dict,
                 out: Any) -> None:  # fmt: skip
        self.name, self.call, self.site, self.fn = name, call, site, fn
        self.args, self.kwargs, self.out = args, kwargs, out
        self.read = threading.Event()
        self.done = threading.Event()  # shared and compared (or the audit stopped)
        self.at = time.time()


class _State:
    def __init__(self) -> None:
        self.every = 0
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.counts: dict[str, int] = {}
        self.produced: dict[int, weakref.ref] = {}
        self.produced_mark = 8192  # `produced`'s size at which dead references are dropped
        self.queue: collections.deque[_Item] = collections.deque()
        self.tables: collections.deque[tuple[Any, ...]] = collections.deque()
        self.last: dict[str, _Item] = {}  # function name -> its latest audited launch
        self.findings: list[AuditFinding] = []
        self.seen: set[tuple[str, str, str]] = set()
        self.audited = 0
        self.leaves = 0
        self.seconds = 0.0
        self.waited = 0.0
        self.stopped = ''
        self.names: dict[int, tuple[Any, list[str] | None]] = {}
        self.log_dir: str | None = None
        self.raise_ = False  # --audit-raise
        self.pending: AuditFinding | None = None  # the finding the next launch raises
        self.threads: list[threading.Thread] = []
        self.closing = False  # the program ends: the threads finish and return
        self.sharing = False  # the sharing thread is in an exchange
        self.log: Any = None  # the `_auditlog.Writer`, made at the first audited launch
        self.current: _Item | None = None  # the launch the sharing thread shares now
        self.finished = ''  # where the job ended (`finish`): nothing more is audited
        self.unaudited: list[str] = []  # launches read, not compared when the job ended
        self.jax_shutdown: Any = None  # JAX's jax.distributed.shutdown, while wrapped
        self.replay = False  # --audit-replay
        self.replay_dir: str | None = None  # where replay-<process>.json is written
        self.replay_asked = False  # a finding asked for the one replay of the job
        self.replay_due: dict[str, AuditFinding] = {}  # function -> the finding to replay
        self.replays: list[str] = []  # each replay's verdict, as printed


_state = _State()


def enable(
    every: int,
    log_dir: str | None = None,
    raise_: bool = False,
    replay: bool = False,
    replay_dir: str | None = None,
) -> None:
    """Turns the audit on (N = ``every``) or off (0), with its log of fresh inputs in
    ``log_dir`` (`_auditlog`); ``raise_``: a finding raises at the next launch; ``replay``:
    the first drift or NaN finding replays the next launch of its function, the verdict
    written to ``replay_dir`` too (when given). Called by `_jit.patch`."""
    _state.every = int(every)
    _state.raise_ = bool(raise_) and every > 0
    _state.replay = bool(replay) and every > 0
    _state.replay_dir = replay_dir if _state.replay else None
    _state.log_dir = log_dir if every else None
    if every and not _state.threads:
        _state.stopped = ''
    _wrap_shutdown(every > 0)


def _wrap_shutdown(on: bool) -> None:
    """Puts `_shutdown` in place of ``jax.distributed.shutdown`` (on), or JAX's back (off)."""
    import jax.distributed

    if on and _state.jax_shutdown is None:
        _state.jax_shutdown = jax.distributed.shutdown
        jax.distributed.shutdown = _shutdown
    elif not on and _state.jax_shutdown is not None:
        if jax.distributed.shutdown is _shutdown:
            jax.distributed.shutdown = _state.jax_shutdown
        _state.jax_shutdown = None


def _shutdown(*args: Any, **kwargs: Any) -> Any:
    """``jax.distributed.shutdown()`` while the audit is on: the audit finishes first (every
    host does so before it enters JAX's shutdown barrier, so the coordination service stays
    until all of them compared the same launches), then JAX's."""
    finish('jax.distributed.shutdown()')
    original = _state.jax_shutdown
    if original is None:  # unwrapped meanwhile: JAX's, as the module holds it now
        import jax.distributed

        original = jax.distributed.shutdown
    try:
        return original(*args, **kwargs)
    finally:
        for t in _state.threads:  # one left in an exchange leaves it now (the service ended)
            t.join(2.0)


def enabled() -> bool:
    return _state.every > 0 and not _state.stopped


# -- the main thread's part: a few dictionary operations per launch ------------------------


def before(name: str, fn: Any = None, args: tuple = (), kwargs: dict | None = None) -> None:
    """Before a launch of ``name`` (JAX's jitted ``fn`` on ``args`` and ``kwargs``): with
    ``--audit-replay``, a finding that asked for it replays it first (`_replay_held`); with
    ``--audit-raise``, a finding raises `AuditError`; its previous audited launch's results
    have been read (it may donate them)."""
    if _state.replay_due and name in _state.replay_due and fn is not None:
        _replay_held(name, fn, args, kwargs or {})
    _raise_pending()
    item = _state.last.get(name)
    if item is None or item.read.is_set():
        return
    t0 = time.perf_counter()
    item.read.wait(READ_WAIT)
    _state.waited += time.perf_counter() - t0


def after(name: str, site: str, fn: Any, spans: bool | None, args: tuple, kwargs: dict,
          out: Any) -> None:  # fmt: skip
    """After a recorded launch: its outputs are remembered (not fresh); an audited one queued."""
    produced = _state.produced
    for leaf in jax.tree_util.tree_leaves(out):
        try:
            produced[id(leaf)] = weakref.ref(leaf)
        except TypeError:
            pass
    if len(produced) > _state.produced_mark:  # dead ones out, now and then (amortised)
        for k in [k for k, r in produced.items() if r() is None]:
            del produced[k]
        _state.produced_mark = max(8192, 2 * len(produced))
    if not spans or _state.stopped or _state.finished:
        return
    n = _state.counts.get(name, 0)
    _state.counts[name] = n + 1
    if n >= FIRST and (n - FIRST) % _state.every:
        return
    item = _Item(name, n, site, fn, args, kwargs, out)
    with _state.cond:
        if len(_state.queue) >= MAX_QUEUED or len(_state.tables) >= MAX_TABLES:
            behind = True
        else:
            behind = False
            _state.queue.append(item)
            _state.last[name] = item
            _state.cond.notify_all()
            if not _state.threads:
                _state.threads = [
                    threading.Thread(target=_read_all, name='multihost-audit-read', daemon=True),
                    threading.Thread(target=_share_all, name=THREAD, daemon=True),
                ]
                for t in _state.threads:
                    t.start()
                atexit.register(_close)  # after jax.distributed's: runs before it
    if behind:  # skipping one would put this host out of step with the others: stop
        _stop(f'it fell behind ({MAX_QUEUED} launches unread or {MAX_TABLES} unshared)')
    elif _state.raise_ or _state.replay:
        # --audit-raise: the audited launch waits for its verdict, so a finding raises at the
        # launch it was found at, its inputs (the batch that held the NaN) still in the frame.
        # --audit-replay: so every host learns a finding at the same launch, and replays the
        # same next one.
        item.done.wait(READ_WAIT + EXCHANGE_TIMEOUT)
        _raise_pending()


def _raise_pending() -> None:
    """With ``--audit-raise``: the first finding raises `AuditError`, once, on this host; its
    message is the finding's headline (its line in full was printed once, before)."""
    if _state.pending is None or _state.replay_due:  # a replay first, then the raise
        return
    finding, _state.pending = _state.pending, None
    from multihost._errors import AuditError

    raise AuditError(
        f'multihost audit: {finding.headline()} (--audit-raise: raised at that launch)',
        finding=finding,
    )


# -- the audit's threads: one reads (the step may wait for it), one shares (nobody waits) ----

#: The sharing thread's name: the lane its exchanges take (`_exchange._threads`).
THREAD = AUDIT_THREAD
#: Tables read and not yet shared, at most.
MAX_TABLES = 256


def _wait_for(queue: collections.deque[Any]) -> bool:
    """Under ``_state.cond``: waits until ``queue`` holds something (True) or the program
    ends with it empty (False: `_close`)."""
    while not queue and not _state.closing:
        _state.cond.wait()
    return bool(queue)


def _read_all() -> None:
    """Reads each queued launch's blocks as soon as it is queued, then hands the table on."""
    while True:
        with _state.cond:
            if not _wait_for(_state.queue):
                return
            item = _state.queue[0]
        t0 = time.perf_counter()
        ready = 0.0
        try:
            paths, table, ready = _read(item)
        except Exception as exc:  # the audit never breaks the job: it stops, saying why
            paths, table = [], []
            _stop(_why(exc))
        finally:
            item.read.set()
            item.args, item.kwargs, item.out = (), {}, None
        _state.seconds += time.perf_counter() - t0 - ready
        with _state.cond:
            if _state.queue and _state.queue[0] is item:
                _state.queue.popleft()
            if not _state.stopped:
                _state.tables.append((item.name, item.call, item.site, item.at, paths, table,
                                      item))  # fmt: skip
            else:
                item.done.set()
            _state.cond.notify_all()


def _share_all() -> None:
    """Shares each table with the other hosts (in order: the lane's count matches), compares."""
    while True:
        with _state.cond:
            if not _wait_for(_state.tables):
                return
            *got, item = _state.tables.popleft()
            _state.sharing = True
            _state.current = item
        try:
            _share(*got)
        except Exception as exc:
            _stop(_why(exc))
        finally:
            item.done.set()
            with _state.cond:
                _state.sharing = False
                _state.current = None
                _state.cond.notify_all()


#: Seconds the job's end waits for the audit to share what it read (every host has the
#: same launches to share: they finish together).
CLOSE_WAIT = 30.0


def _close() -> None:
    """At exit (before JAX's own shutdown, registered after it): `finish`. A thread left
    inside a call into JAX's C++ code while the interpreter finalizes would abort the
    process."""
    finish("the program's exit")


def finish(at: str) -> None:
    """The job ends (``at``: where, in words): the audit shares and compares every launch
    it read (bounded: `CLOSE_WAIT`; every host has the same launches to share, so the hosts
    finish the same rounds together), says plainly which it could not, prints its summary
    line, and its threads end. Once: later launches are not audited, later calls return."""
    with _state.cond:
        if _state.finished or not _state.threads:
            _state.finished = _state.finished or at
            return
        _state.finished = at
    deadline = time.monotonic() + CLOSE_WAIT
    with _state.cond:
        if _drain(deadline):
            left: list[str] = []
        else:
            items = [item for *_, item in _state.tables]
            items = [*([_state.current] if _state.current else []), *items, *_state.queue]
            left = [f'{item.name} call #{item.call}' for item in items]
        _state.closing = True
        _state.cond.notify_all()
    if left:
        _state.unaudited = left
        _stop(
            f'the job ended ({at}) before the hosts compared its last {len(left)} audited '
            f'launch{"es" * (len(left) > 1)}, waited {CLOSE_WAIT:g} s: not audited: '
            f'{", ".join(left)} (not every host shared its tables in time: a host ended '
            f'without this, or is stuck)',
            ending=True,
        )
    for name, finding in _state.replay_due.items():
        print(
            f'multihost audit: not replayed: {name} was not launched again after '
            f'{finding.headline()}',
            file=sys.stderr,
            flush=True,
        )
    _summary()
    for t in _state.threads:
        t.join(max(0.0, deadline - time.monotonic()) + 1.0)


def _drain(deadline: float) -> bool:
    """Under ``_state.cond``: waits until every launch read or queued is shared and compared
    (True), the audit stopped, or the monotonic ``deadline`` passes (False)."""
    while (_state.queue or _state.tables or _state.sharing) and not _state.stopped:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _state.cond.wait(min(left, 0.1))
    return True


def _summary() -> None:
    """The audit's last line at the job's end, always: what it audited, and that it found
    nothing (a clean run says so) or how many findings its lines above named; when it
    stopped early or left launches unaudited, that too (its line above said why)."""
    found = len(_state.findings)
    said = f'{found} finding{"s" * (found != 1)} (said above)' if found else 'no findings'
    if _state.unaudited:
        said += f'; {len(_state.unaudited)} not audited (said above)'
    elif _state.stopped:
        said += '; then it stopped (said above): later launches not audited'
    print(
        f'multihost audit: {_state.audited} launches audited on process {_process()} '
        f'({_state.leaves} array leaves compared across hosts): {said}',
        file=sys.stderr,
        flush=True,
    )


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f'{type(exc).__name__}: {text[0]}' if text else type(exc).__name__


def _stop(why: str, ending: bool = False) -> None:
    """The audit stops on this host (``why``, said once). Once the job's end has begun
    (`finish`) only ``ending`` (its own verdict) stops it: an exchange that fails then,
    because JAX's shutdown ended it, is not news."""
    with _state.cond:
        if _state.stopped or (_state.closing and not ending):
            return
        _state.stopped = why
        for item in _state.queue:
            item.read.set()
            item.done.set()
        for *_, item in _state.tables:
            item.done.set()
        _state.queue.clear()
        _state.tables.clear()
        _state.cond.notify_all()
    print(f'multihost audit: stopped on process {_process()}: {why}', file=sys.stderr, flush=True)


def _process() -> int:
    try:
        return jax.process_index()
    except Exception:
        return 0


def _share(name: str, call: int, site: str, at: float, paths: list[str], table: list[Any]) -> None:
    from multihost._exchange import _sequence

    if _state.log_dir is not None:
        if _state.log is None:
            from multihost._job import _auditlog

            _state.log = _auditlog.Writer(_state.log_dir, _process(), jax.process_count())
        _state.log.append(name, call, paths, table)

    payload = json.dumps({'p': _process(), 'b': table}, separators=(',', ':')).encode()
    shape = hashlib.sha1(f'{name}#{call}:{len(paths)}'.encode()).hexdigest()[:16]
    shared = _sequence.exchange(
        'allgather', f'audit {name}', payload, tree_digest=shape, timeout=EXCHANGE_TIMEOUT
    )
    tables = {p: json.loads(raw.decode())['b'] for p, raw in shared.items()}
    if not tables:  # one process: nothing to compare with
        tables = {_process(): table}
    t0 = time.perf_counter()
    found = compare(name, call, site, paths, tables, at=at)
    _state.seconds += time.perf_counter() - t0
    _state.audited += 1
    _state.leaves += len(paths)
    for finding in found:
        _report(finding)


def _report(finding: AuditFinding) -> None:
    # once each: drift and duplicates per launch function and argument, the first NaN per run
    nonfinite = finding.check == 'nonfinite'
    key = ('nonfinite', '', '') if nonfinite else (finding.check, finding.launch, finding.path)
    with _state.lock:
        if key in _state.seen:
            return
        _state.seen.add(key)
        _state.findings.append(finding)
        if _state.raise_ and _state.pending is None and len(_state.findings) == 1:
            _state.pending = finding  # the first finding ends the job (--audit-raise)
        if _state.replay and not _state.replay_asked and finding.check != 'duplicate':
            _state.replay_asked = True  # one replay a job: its cost is bounded
            _state.replay_due[finding.launch] = finding
    print(f'multihost audit: {finding.format()}', file=sys.stderr, flush=True)
    entry = _recorder.note(
        'audit', finding.check, seq=None, digest='', site=finding.site, checked=False
    )
    entry.thread = AUDIT_THREAD


def _replay_held(name: str, fn: Any, args: tuple, kwargs: dict) -> None:
    """``--audit-replay``: the launch of ``name`` about to run, held on every host (every host
    reaches it: the finding came at the same launch everywhere) and replayed before it runs.
    The verdict is printed, kept and written; a replay that fails says why, and the job goes
    on either way."""
    from multihost._checks._replay import replay

    finding = _state.replay_due.pop(name)
    call = _state.counts.get(name, 0)
    head = f'replay of {name} call #{call}, the launch after {finding.headline()}'
    print(
        f'multihost audit: replaying {name} call #{call} on every host before it runs ...',
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    verdict = ''
    try:
        result = replay(fn, *args, canonical=True, **kwargs)
        text, verdict = result.describe(), result.verdict
    except Exception as exc:  # the job goes on: the replay is a diagnosis, never the cause
        text = f'the replay failed on process {_process()}: {type(exc).__name__}: {exc}'.strip()
    seconds = time.perf_counter() - t0
    said = f'{head} ({seconds:.1f} s):\n  ' + text.replace('\n', '\n  ')
    _state.replays.append(said)
    print(f'multihost audit: {said}', file=sys.stderr, flush=True)
    if _state.replay_dir:
        _write_replay(name, call, finding, verdict, text, seconds)


def _write_replay(
    name: str, call: int, finding: AuditFinding, verdict: str, text: str, seconds: float
) -> None:
    """``<dump dir>/replay-<process>.json``, atomically; a failure to write is said, not
    raised."""
    import os

    doc = {
        'kind': 'multihost-replay',
        'process': _process(),
        'launch': name,
        'call': call,
        'finding': finding.to_json(),
        'verdict': verdict,
        'text': text,
        'seconds': round(seconds, 3),
    }
    path = os.path.join(_state.replay_dir or '.', f'replay-{_process()}.json')
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + '.tmp', 'w') as f:
            json.dump(doc, f, indent=1)
        os.replace(path + '.tmp', path)
    except OSError as exc:
        print(f'multihost audit: the replay could not be written to {path}: {exc}',
              file=sys.stderr, flush=True)  # fmt: skip


def _arg_names(fn: Any, n_args: int) -> list[str]:
    """Names of a function's first ``n_args`` positional parameters (``args[i]`` past them)."""
    from multihost._checks._replay import arg_names, positional_names

    key = id(fn)
    hit = _state.names.get(key)
    if hit is None or hit[0] is not fn:
        hit = _state.names[key] = (fn, positional_names(fn))
    return arg_names(hit[1], n_args)


def _leaves(item: _Item) -> list[tuple[str, Any, bool]]:
    """(path as a user writes it, leaf, is a fresh input) of the launch's arrays, arguments
    first, then results."""
    out: list[tuple[str, Any, bool]] = []
    roots = list(zip(_arg_names(item.fn, len(item.args)), item.args))
    roots += [(k, v) for k, v in sorted(item.kwargs.items())]
    for root, value in roots:
        leaves, paths = _paths(root, value)
        for path, leaf in zip(paths, leaves):
            if isinstance(leaf, (jax.Array, np.ndarray)):
                ref = _state.produced.get(id(leaf))
                fresh = ref is None or ref() is not leaf
                out.append((path, leaf, fresh))
    leaves, paths = _paths('result', item.out)
    for path, leaf in zip(paths, leaves):
        if isinstance(leaf, jax.Array):
            out.append((path, leaf, False))
    return out


#: Leaf paths as a user writes them, by root name and tree structure (the same each launch).
_PATHS: dict[tuple[str, Any], list[str]] = {}


def _paths(root: str, value: Any) -> tuple[list[Any], list[str]]:
    """``value``'s leaves and their paths (``root`` + `jax.tree_util.keystr`), the paths
    remembered per tree structure (written once, not at every audited launch)."""
    leaves, treedef = jax.tree_util.tree_flatten(value)
    try:
        got = _PATHS.get((root, treedef))
    except TypeError:  # a structure that cannot be a key: written each time
        got, treedef = None, None
    if got is None:
        keystr = jax.tree_util.keystr
        got = [root + keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(value)[0]]
        if treedef is not None:
            if len(_PATHS) > 1024:
                _PATHS.clear()
            _PATHS[(root, treedef)] = got
    return leaves, got


def _read(item: _Item) -> tuple[list[str], list[Any], float]:
    """This host's table of the launch: per leaf ``[fresh, [[block, [digests], nonfinite,
    skip], ...]]`` (skip: never duplicate data: constant, small, a key); and the seconds it
    waited for the results to be ready (not audit work: the launch's own)."""
    from multihost._checks import fingerprint

    leaves = _leaves(item)
    paths = [p for p, _, _ in leaves]
    t0 = time.perf_counter()
    live = [leaf for _, leaf, _ in leaves if isinstance(leaf, jax.Array) and not leaf.is_deleted()]
    try:  # the results exist once the launch ran; one wait for all (one call into the runtime)
        jax.block_until_ready(live)
    except Exception:  # one failed, or was donated since: each on its own
        for leaf in live:
            try:
                leaf.block_until_ready()
            except Exception:
                pass
    ready = time.perf_counter() - t0
    held = _held(leaves)
    # One pass per block: its digest, NaN/Inf and constant flags (on an accelerator one
    # program per group of blocks, one copy of the results to the host: `fingerprint`).
    datas = [data for _, _, data, _ in held]
    wanted = [f and d.nbytes >= MIN_DUP_BYTES for _, _, d, f in held]
    prints = fingerprint.digests_with_flags(datas, constant=wanted) if held else []
    blocks: list[dict[str, list[Any]]] = [{} for _ in leaves]
    for (i, key, data, fresh), (digest, bad, same) in zip(held, prints):
        skip = not fresh or data.nbytes < MIN_DUP_BYTES or not data.size or same
        entry = blocks[i].setdefault(key, [key, [], False, True])
        if digest[:17] not in entry[1]:
            entry[1].append(digest[:17])
        entry[2] = entry[2] or bad
        entry[3] = entry[3] and skip
    table = [[bool(fresh), list(b.values())] for (_, _, fresh), b in zip(leaves, blocks)]
    return paths, table, ready


def _held(leaves: list[tuple[str, Any, bool]]) -> list[tuple[int, str, Any, bool]]:
    """(leaf, block, its data, fresh) of each block this host holds of ``leaves``."""
    held: list[tuple[int, str, Any, bool]] = []
    for i, (_, leaf, fresh) in enumerate(leaves):
        try:
            held += [(i, key, data, fresh) for key, data in _blocks(leaf)]
        except Exception:  # donated to a launch while it was read, or not readable here
            pass  # compared nowhere (a host that could read it has no one to compare with)
    return held


@functools.lru_cache(maxsize=4096)
def _whole(shape: tuple[int, ...]) -> str:
    """The block index text of a whole leaf of ``shape`` (as `_blocks` writes any block)."""
    return format_index(tuple((0, int(d)) for d in shape))


@functools.lru_cache(maxsize=256)
def _is_key(dtype: Any) -> bool:
    """Whether ``dtype`` is a PRNG key's (remembered: jax's test is slow for every leaf)."""
    return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))


def _blocks(leaf: Any) -> list[tuple[str, Any]]:
    """(block index text, this host's data of it) for each block this host holds."""
    from multihost._checks import fingerprint

    if isinstance(leaf, np.ndarray):
        if leaf.dtype == object:
            return []
        return [('all', leaf)]
    if leaf.is_deleted():
        return []  # donated to a launch since
    key = _is_key(leaf.dtype)
    if not key and fingerprint.one_device(leaf.sharding):
        # one block, the whole leaf: no Shard objects built (most leaves of a one-chip job)
        if fingerprint.in_host_memory(leaf):
            view = np.asarray(leaf)
            return [(_whole(leaf.shape), view if view.flags.c_contiguous else leaf)]
        return [(_whole(leaf.shape), leaf)]
    host = fingerprint.in_host_memory(leaf)
    shards = []
    for s in leaf.addressable_shards:
        data = jax.random.key_data(s.data) if key else s.data
        if host:  # a zero-copy view: read at memory speed, digests as the array's own
            view = np.asarray(data)
            data = view if view.flags.c_contiguous else data
        shards.append((s, data))
    out = []
    shape = leaf.shape
    for shard, data in shards:
        index = tuple(
            (sl.start or 0, shape[d] if sl.stop is None else sl.stop)
            for d, sl in enumerate(shard.index[: len(shape)])
        )
        out.append((format_index(index), data))
    return out


# -- comparing the tables (every host the same) ---------------------------------------------


class _Leaf:
    """One leaf of an audited launch, as every process's table holds it."""

    def __init__(self) -> None:
        self.holders: dict[str, dict[str, list[int]]] = {}  # block -> digest -> processes
        self.fresh = True
        self.flagged: list[int] = []  # processes with NaN or Inf in it
        self.by_digest: dict[str, list[tuple[str, int]]] = {}  # candidates: digest -> (block, p)


def _gather(i: int, tables: dict[int, list[Any]]) -> _Leaf:
    leaf = _Leaf()
    for p, table in sorted(tables.items()):
        if i >= len(table):
            continue
        fresh, blocks = table[i]
        leaf.fresh = leaf.fresh and bool(fresh)
        for key, digests, bad, skip in blocks:
            for d in digests:
                leaf.holders.setdefault(key, {}).setdefault(d, []).append(p)
            if bad:
                leaf.flagged.append(p)
            if not skip and len(digests) == 1:
                leaf.by_digest.setdefault(digests[0], []).append((key, p))
    return leaf


def _drift(leaf: _Leaf) -> tuple[tuple[int, ...], str] | None:
    """(the odd processes, the detail) when replicas of a block differ."""
    drifted = []
    for key, digests in leaf.holders.items():
        kinds = {d.startswith('x') for d in digests}  # two definitions never compare
        if len(digests) > 1 and len(kinds) == 1:
            drifted.append((key, *odd_ones(digests)))
    if not drifted:
        return None
    key, odd, right = drifted[0]
    detail = drift_detail(key, odd, right)
    if len(drifted) > 1:
        detail += f' (and {len(drifted) - 1} more block(s))'
    return tuple(sorted({p for _, o, _ in drifted for p in o})), detail


def _duplicates(leaf: _Leaf) -> tuple[tuple[int, ...], str] | None:
    """(the processes, the detail) when different blocks of a fresh input held by different
    processes are identical."""
    if not leaf.fresh:
        return None
    dups = []
    for held in leaf.by_digest.values():
        if len({k for k, _ in held}) > 1 and len({p for _, p in held}) > 1:
            dups.append(sorted(held, key=lambda kp: (kp[1], kp[0])))
    if not dups:
        return None
    first = dups[0]
    named = ' and '.join(f'{k} of process {p}' for k, p in first[:_MAX_BLOCKS])
    detail = f'is the same data in blocks {named}'
    if len(first) > _MAX_BLOCKS:
        detail += f' (and {len(first) - _MAX_BLOCKS} more)'
    if len(dups) > 1:
        detail += f'; {len(dups) - 1} more set(s) of identical blocks'
    procs = tuple(sorted({p for held in dups for _, p in held}))
    return procs, f'{detail} ({fmt_hosts(procs)} feed identical data)'


def _nonfinite(paths: list[str], leaves: list[_Leaf]) -> tuple[str, tuple[int, ...], str] | None:
    """(the first result holding NaN or Inf, its processes, the detail naming the inputs)."""
    outs = [i for i, p in enumerate(paths) if p.startswith('result') and leaves[i].flagged]
    if not outs:
        return None
    i = outs[0]
    procs = tuple(sorted(set(leaves[i].flagged)))
    inputs = [j for j, p in enumerate(paths) if not p.startswith('result') and leaves[j].flagged]
    fresh = [j for j in inputs if leaves[j].fresh]
    named = [f'{paths[j]} on {fmt_hosts(leaves[j].flagged)}' for j in (fresh or inputs)[:3]]
    if fresh:
        why = 'fresh inputs holding NaN or Inf: ' + '; '.join(named)
    elif inputs:
        why = 'inputs holding NaN or Inf (none fresh): ' + '; '.join(named)
    else:
        why = 'no input held any: it arose in this launch'
    return paths[i], procs, f'holds NaN or Inf on {fmt_hosts(procs)}; {why}'


def compare(
    name: str,
    call: int,
    site: str,
    paths: list[str],
    tables: dict[int, list[Any]],
    *,
    at: float = 0.0,
) -> list[AuditFinding]:
    """The findings of one audited launch from every process's table (see `_read`)."""
    found: list[AuditFinding] = []
    leaves = [_gather(i, tables) for i in range(len(paths))]
    for path, leaf in zip(paths, leaves):
        for check, hit in (('drift', _drift(leaf)), ('duplicate', _duplicates(leaf))):
            if hit is not None:
                found.append(AuditFinding(check, name, call, site, path, hit[0], hit[1], at))
    bad = _nonfinite(paths, leaves)
    if bad is not None:
        found.append(AuditFinding('nonfinite', name, call, site, bad[0], bad[1], bad[2], at))
    return found


def report(wait: float = 0.0) -> AuditReport:
    """This host's audit so far (`multihost.audit_report`).

    Args:
        wait: seconds to wait first, at most, for the launches already audited here to be
            shared and compared (at a job's end: its last launches are still being shared,
            with every host, which all call it there). 0: at once.
    """
    if wait > 0 and _state.threads:
        with _state.cond:
            _drain(time.monotonic() + float(wait))
    with _state.lock:
        findings = tuple(_state.findings)
    return AuditReport(
        process=_process(),
        enabled=_state.every > 0,
        every=_state.every,
        first=FIRST,
        audited=_state.audited,
        leaves=_state.leaves,
        findings=findings,
        stopped=_state.stopped,
        seconds=round(_state.seconds, 6),
        waited=round(_state.waited, 6),
        replays=tuple(_state.replays),
    )


def _serve_report(**_: Any) -> AuditReport:
    return report()


def wire() -> None:
    """The control endpoint answers `ControlClient.audit` with this host's (process 0's)
    report (`multihost._job._wiring`)."""
    _control.register_method('audit', _serve_report)
