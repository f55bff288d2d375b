"""Many simulated hosts on one machine: forked clients of one real coordination service.

A process with ``jax`` imported is ~180 MB, so 256 full processes do not fit
on a small machine. This harness imports ``jax`` and ``multihost`` once, checks
that nothing has started a thread (so no gRPC, no backend) yet, and forks N
children. Each child calls ``jax.distributed.initialize(address, N, i)`` (a
real client; child 0 also hosts the real coordination service, as process 0
of a job does) and runs checks that need no JAX backend: everything rides on
the key-value store (`sync_global_devices`, a sequence-checked small
`broadcast_one_to_all` / `process_allgather` carried by the exchange,
`assert_equal` of a small equal tree). The backend is never started (checked).
Then every host holds 200 local flight records and host 0 issues
`where`, `wavefront` and `flight_records(200)` while the others wait in
a real barrier (their debug threads, started in each child after the fork,
answer); only host 0's main-thread RPCs are counted (``--no-issuers`` skips).

Measured per check and host, with the harness's own instrumentation (not
`_kv`'s): the child replaces its distributed state's client by `Counting`, a
proxy that counts every RPC multihost makes and the bytes of every reply
(keys and values the service sent back) and request, and times each RPC.
Bytes and RPCs *served* are the sums over hosts (every reply comes from the
one service). The service's own CPU is estimated as process 0's CPU time
minus the median of the other hosts' (process 0 runs the service and a host).

Used by ``bench/scale.py --many`` and ``tests/jobs/test_scale_harness.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

#: Checks in table order.
CHECKS = ('sync_global_devices', 'broadcast (small)', 'allgather (small)', 'assert_equal (small)')
#: Debug-bus issuers, called by host 0 while every other host waits in a barrier.
ISSUERS = ('where', 'wavefront', 'flight_records')
#: The issuers' reply timeout: N debug threads answer on 2 cores (the default 10 s is for machines).
ISSUE_TIMEOUT_S = 300.0
#: Reading the reply size of these client methods (the rest reply with nothing or a number).
_READS = ('key_value_try_get', 'key_value_try_get_bytes', 'blocking_key_value_get')


def _size(x: Any) -> int:
    if isinstance(x, (str, bytes)):
        return len(x)
    if isinstance(x, (list, tuple)):
        return sum(_size(i) for i in x)
    return 0


class Counting:
    """The coordination-service client, counting RPCs and bytes (a proxy, thread-safe)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._lock = threading.Lock()
        #: When set, only this thread's RPCs are counted (the issuer's, not its debug thread's).
        self.thread: int | None = None
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.rpcs = 0
            self.read = 0
            self.sent = 0
            self.rpc_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._real, name)
        if not callable(fn):
            return fn

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.thread is not None and threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                with self._lock:
                    self.rpcs += 1
                    self.sent += sum(_size(a) for a in args if isinstance(a, (str, bytes)))
                    self.rpc_s.append(dt)
            with self._lock:
                if name == 'key_value_dir_get' or name == 'key_value_dir_get_bytes':
                    self.read += sum(len(k) + len(v) for k, v in out)
                elif name in _READS:
                    self.read += _size(out)
            return out

        return counted


def _checks() -> dict[str, Callable[[], Any]]:
    import numpy as np

    import multihost

    small = {'w': np.arange(8, dtype=np.float32), 'b': np.float32(1.0)}
    return {
        'sync_global_devices': lambda: multihost.sync_global_devices('many'),
        'broadcast (small)': lambda: multihost.broadcast_one_to_all(small),
        'allgather (small)': lambda: multihost.process_allgather(np.int32(7)),
        'assert_equal (small)': lambda: multihost.assert_equal(small),
    }


def _issuers() -> dict[str, Callable[[], int]]:
    """Each issuer, returning how many hosts answered."""
    import multihost

    t = ISSUE_TIMEOUT_S
    return {
        'where': lambda: sum(s.answered for s in multihost.where(timeout=t).values()),
        'wavefront': lambda: sum(h.answered for h in multihost.wavefront(timeout=t).hosts),
        'flight_records': lambda: len(multihost.flight_records(200, timeout=t)),
    }


#: Flight records each host holds before the issuers run (`flight_records(200)` reads them all).
RECORDS = 200


def _fill_recorder(k: int) -> None:
    """``k`` local records of a watched training step, as a training loop leaves (no RPC)."""
    import hashlib

    from multihost import _recorder

    for s in range(k):
        digest = hashlib.sha256(b'train_step').hexdigest()[:16]
        entry = _recorder.note(
            'launch',
            'train_step',
            seq=None,
            digest=digest,
            site='train.py:123 in main',
            fingerprint=hashlib.sha256(str(s % 2).encode()).hexdigest()[:16],
        )
        _recorder.finished(entry, wait=0.001)
        _recorder.launched(entry, None)


def _issue(i: int, reps: int, counting: Counting, together: Callable[[str], None]) -> Any:
    """Host 0 issues every debug command ``reps`` times; the others wait in one barrier."""
    import multihost

    multihost.start_debug_daemon()  # already running (the checks' enter hook started it)
    _fill_recorder(RECORDS)
    together('debug-ready')
    if i != 0:
        together('issued')  # blocked in a real barrier: the debug thread answers
        return None
    issuers = _issuers()
    out: dict[str, list[dict[str, float]]] = {k: [] for k in issuers}
    issuers['wavefront']()  # warm-up (one command: the bus and every handler are imported)
    for _ in range(reps):
        for name, fn in issuers.items():
            counting.reset()
            counting.thread = threading.get_ident()
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                answered = fn()
            finally:
                counting.thread = None
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            out[name].append(
                {
                    'wall': wall,
                    'cpu': cpu,
                    'rpcs': counting.rpcs,
                    'read': counting.read,
                    'sent': counting.sent,
                    'answered': answered,
                }
            )
    together('issued')
    return out


def _child(i: int, n: int, address: str, reps: int, out_path: str, issue: bool = True) -> None:
    """One simulated host: initialize, run every check ``reps`` times, write its counts."""
    import jax

    from multihost import _jax_adapter

    # 1,000 clients on 2 cores (shared): generous heartbeat and shutdown bounds, or a host
    # starved for 100 s is declared dead and aborts (seen once at 1,000 hosts, load ~80).
    jax.distributed.initialize(
        address,
        num_processes=n,
        process_id=i,
        initialization_timeout=600,
        heartbeat_timeout_seconds=900,
        shutdown_timeout_seconds=900,
    )
    state = _jax_adapter.distributed_state()
    real = state.client
    counting = Counting(real)
    state.client = counting

    def together(tag: str) -> None:  # not counted: the real client
        real.wait_at_barrier(f'many/{tag}', 600_000)

    checks = _checks()
    result: dict[str, Any] = {k: [] for k in checks}
    for name, fn in checks.items():  # warm-up
        together(f'w/{name}')
        fn()
    for r in range(reps):
        for name, fn in checks.items():
            together(f'{r}/{name}')
            counting.reset()
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rpc = sorted(counting.rpc_s)
            result[name].append(
                {
                    'wall': wall,
                    'cpu': cpu,
                    'rpcs': counting.rpcs,
                    'read': counting.read,
                    'sent': counting.sent,
                    'rpc_median': rpc[len(rpc) // 2] if rpc else 0.0,
                }
            )
    result['issuers'] = _issue(i, reps, counting, together) if issue else None
    result['backend_started'] = _jax_adapter.backends_started()
    together('measured')  # the parent reads PSS now
    with open(f'{out_path}.tmp', 'w') as f:
        json.dump(result, f)
    os.rename(f'{out_path}.tmp', out_path)
    together('written')
    state.client = real
    jax.distributed.shutdown()


def _pss_kib(pid: int) -> int:
    with open(f'/proc/{pid}/smaps_rollup') as f:
        for line in f:
            if line.startswith('Pss:'):
                return int(line.split()[1])
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


def prepare() -> None:
    """Imports what the children run and checks that no thread (gRPC, backend) exists yet."""
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')  # else numpy starts a BLAS thread
    os.environ.setdefault('MULTIHOST_TIMEOUT', '600')
    import jax  # noqa: F401

    import multihost  # noqa: F401
    from multihost import _jax_adapter

    _checks()
    threads = len(os.listdir('/proc/self/task'))
    if threads != 1 or _jax_adapter.client() is not None or _jax_adapter.backends_started():
        raise RuntimeError(
            f'cannot fork simulated hosts: this process already runs {threads} threads '
            '(gRPC or a backend started); run the harness in a fresh process.'
        )


def run(n: int, reps: int = 5, timeout: float = 1800.0, issue: bool = True) -> dict[str, Any]:
    """Runs N forked hosts; per check, per-rep lists over hosts, plus PSS and timings."""
    prepare()
    address = f'127.0.0.1:{_free_port()}'
    tmp = tempfile.mkdtemp(prefix='manyhost-')
    t0 = time.perf_counter()
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _child(i, n, address, reps, os.path.join(tmp, str(i)), issue)
            except BaseException as exc:  # noqa: BLE001 - a child must exit, never return
                print(f'host {i}: {type(exc).__name__}: {exc}', file=sys.stderr, flush=True)
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    pss = peak = 0
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(codes) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f'{n} simulated hosts did not finish within {timeout:.0f} s')
            for pid in pids:
                if pid in codes:
                    continue
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
            if not codes:  # all alive: sample the total PSS
                try:
                    now = sum(_pss_kib(p) for p in pids)
                except OSError:
                    now = 0
                peak = max(peak, now)
                pss = now or pss
            time.sleep(0.5)
    finally:
        for pid in pids:
            if pid not in codes:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    elapsed = time.perf_counter() - t0
    failed = [i for i, p in enumerate(pids) if codes.get(p) != 0]
    if failed:
        raise RuntimeError(f'simulated hosts {failed[:10]} failed (of {n}); see stderr')
    per = []
    for i in range(n):
        with open(os.path.join(tmp, str(i))) as f:
            per.append(json.load(f))
        os.remove(os.path.join(tmp, str(i)))
    os.rmdir(tmp)
    return {'n': n, 'reps': reps, 'per': per, 'pss_peak_kib': peak, 'elapsed_s': elapsed}


def summarize(raw: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per check: medians over reps of per-host and service-wide figures."""
    per, reps = raw['per'], raw['reps']
    out: dict[str, dict[str, float]] = {}
    med = statistics.median
    for name in CHECKS:
        rows = [[host[name][r] for host in per] for r in range(reps)]

        def over(f: Callable[[list[dict[str, float]]], float], rows: Any = rows) -> float:
            return float(med(f(row) for row in rows))

        out[name] = {
            'read_median': over(lambda row: med(h['read'] for h in row)),
            'read_max': over(lambda row: max(h['read'] for h in row)),
            'served_bytes': over(lambda row: sum(h['read'] for h in row)),
            'sent_bytes': over(lambda row: sum(h['sent'] for h in row)),
            'served_rpcs': over(lambda row: sum(h['rpcs'] for h in row)),
            'wall_ms': over(lambda row: max(h['wall'] for h in row)) * 1e3,
            'rpc_ms': over(lambda row: med(h['rpc_median'] for h in row)) * 1e3,
            'cpu_ms': over(lambda row: med(h['cpu'] for h in row)) * 1e3,
            'service_cpu_ms': over(lambda row: row[0]['cpu'] - med(h['cpu'] for h in row[1:]))
            * 1e3,
        }
    return out


def summarize_issuers(raw: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per issuer (host 0): medians over reps of its RPCs, bytes read, wall, CPU, answers."""
    issued = raw['per'][0].get('issuers')
    if not issued:
        return {}
    med = statistics.median
    return {
        name: {
            'rpcs': float(med(r['rpcs'] for r in rows)),
            'rpcs_max': float(max(r['rpcs'] for r in rows)),
            'read_bytes': float(med(r['read'] for r in rows)),
            'wall_ms': float(med(r['wall'] for r in rows)) * 1e3,
            'cpu_ms': float(med(r['cpu'] for r in rows)) * 1e3,
            'answered_min': float(min(r['answered'] for r in rows)),
        }
        for name, rows in issued.items()
    }


def measure(n: int, reps: int = 3, issue: bool = True) -> dict[str, Any]:
    """`run` and `summarize`: one JSON-able record (what ``bench/scale.py --many`` reads)."""
    raw = run(n, reps, issue=issue)
    return {
        'issuers': summarize_issuers(raw),
        'n': n,
        'reps': reps,
        'pss_mib': raw['pss_peak_kib'] / 1024,
        'elapsed_s': raw['elapsed_s'],
        'backend_started': any(host['backend_started'] for host in raw['per']),
        'checks': summarize(raw),
    }


if __name__ == '__main__':
    # python bench/manyhost.py N [REPS] [--no-issuers]: one JSON line (in a fresh process).
    args = [a for a in sys.argv[1:] if a != '--no-issuers']
    n = int(args[0]) if args else 16
    reps = int(args[1]) if len(args) > 1 else 3
    print(json.dumps(measure(n, reps, issue='--no-issuers' not in sys.argv)))
