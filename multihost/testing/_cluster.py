"""Simulated hosts on one machine: N local JAX processes with D CPU devices each.

`LocalCluster` starts N worker processes (`_worker`), each configured with D CPU
devices and joined by `jax.distributed.initialize` on a free loopback port, then
runs Python functions in all of them at once and returns every process's result.
The test suite, the benchmarks and ``python -m multihost`` use it; so can any
user who wants to try multi-host code on a laptop.

Only the local simulated cluster assumes 127.0.0.1; nothing else does.

Every wait has a timeout. When one process fails or a call times out, each
process's Python stacks (faulthandler) and log are collected into the error,
and the whole cluster is killed, so nothing is left hanging.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
    wait,
)
from typing import Any, cast

from multihost._debug._control import _set_io_timeout
from multihost._net import free_port

__all__ = ['ClusterError', 'LocalCluster']


#: Seconds a connection to the cluster's listener has to authenticate and say its index.
_HANDSHAKE_S = 20.0


class ClusterError(RuntimeError):
    """A function failed or timed out in the local cluster.

    Attributes:
        errors: process index -> formatted traceback, for processes that raised.
        missing: process indices that did not answer in time.
        logs: process index -> the tail of that process's log.
    """

    def __init__(
        self, message: str, *, errors: dict[int, str], missing: list[int], logs: dict[int, str]
    ):
        super().__init__(message)
        self.errors = errors
        self.missing = missing
        self.logs = logs


@dataclasses.dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    log_path: str
    conn: Connection | None = None
    os_pid: int | None = None

    def connection(self) -> Connection:
        """The connection to the worker (set once it connected in `LocalCluster.start`)."""
        if self.conn is None:
            raise RuntimeError(f'process {self.index} has not connected to the LocalCluster')
        return self.conn


class LocalCluster:
    """N local JAX processes (simulated hosts) that run functions together.

    Args:
        n: number of processes (simulated hosts).
        devices_per_process: CPU devices per process.
        recoverable: set ``jax_enable_recoverability`` so survivors live on
            when a process dies (needed to observe `ProcessFailureError`).
        preemption_service: value of ``jax_enable_preemption_service``.
        heartbeat_timeout: seconds before the coordinator declares a silent
            process dead.
        start_timeout: seconds to wait for every process to come up.
        env: extra environment variables for the workers.
        log_dir: where per-process logs go (default: a new temp directory).
        init_backend: when False, the processes only run
            ``jax.distributed.initialize`` and leave the JAX backend cold until
            the caller's first JAX operation (as a host still loading data).

    Example::

        with LocalCluster(4, 2) as cluster:
            results = cluster.run(my_module.body)   # one result per process
    """

    def __init__(
        self,
        n: int = 4,
        devices_per_process: int = 2,
        *,
        recoverable: bool = False,
        preemption_service: bool = True,
        heartbeat_timeout: int = 100,
        start_timeout: float = 180.0,
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        init_backend: bool = True,
    ):
        if n < 1 or devices_per_process < 1:
            raise ValueError(
                f'need n >= 1 and devices_per_process >= 1, got {n}, {devices_per_process}'
            )
        self.n = n
        self.devices_per_process = devices_per_process
        self.recoverable = recoverable
        self.preemption_service = preemption_service
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self.env = dict(env or {})
        self.log_dir = log_dir or tempfile.mkdtemp(prefix='multihost-local-')
        self.init_backend = init_backend
        self._workers: list[_Worker] = []
        self._listener: Listener | None = None
        self._runs = 0
        self.broken = False

    # -- lifecycle -----------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while every process is running and usable."""
        return (
            bool(self._workers)
            and not self.broken
            and all(w.proc.poll() is None for w in self._workers)
        )

    def start(self) -> LocalCluster:
        """Starts the processes and waits until all have initialized JAX."""
        if self._workers:
            raise RuntimeError('LocalCluster already started; call stop() first.')
        authkey = secrets.token_bytes(16)
        # No authkey here: `_accept_all` authenticates each connection on a thread of its own,
        # with a deadline, so a stray peer cannot hold the others up (see there). A backlog for
        # every process: with Listener's default (1), the SYNs of processes connecting at once
        # are dropped and retried by TCP after 1, 3, 7, 15... s.
        self._listener = Listener(('127.0.0.1', 0), backlog=self.n + 8)
        host, port = self._listener.address
        coordinator = f'127.0.0.1:{free_port()}'
        env = {**os.environ, **self.env, 'PYTHONUNBUFFERED': '1'}
        for i in range(self.n):
            log_path = os.path.join(self.log_dir, f'process-{i}.log')
            cmd = [
                sys.executable,
                '-m',
                'multihost.testing',
                '--worker',
                f'{host}:{port}',
                authkey.hex(),
                str(i),
                str(self.n),
                str(self.devices_per_process),
                coordinator,
                str(int(self.recoverable)),
                str(int(self.preemption_service)),
                str(self.heartbeat_timeout),
                str(int(self.init_backend)),
            ]
            with open(log_path, 'wb') as log:
                proc = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            self._workers.append(_Worker(i, proc, log_path))
        try:
            self._accept_all(authkey)
            self._collect(lambda w: True, self.start_timeout, 'start', expect='ready')
        except BaseException:
            self.stop()
            raise
        return self

    def _accept_all(self, authkey: bytes) -> None:
        """Takes one authenticated connection from each process, each saying its index.

        The listener's port is an ephemeral one, which the kernel may have handed out before:
        a leftover peer of an earlier cluster (an ipyparallel engine reconnecting to its dead
        controller, say) can connect to it and then say nothing, or something else.
        `Listener.accept` would authenticate it on the accepting thread without a deadline,
        and every process behind it would wait for ever (a cluster of 8 whose last
        processes never get to `jax.distributed.initialize`). Each connection is
        authenticated on a thread of its own, within `_HANDSHAKE_S`, and dropped otherwise.
        """
        listener = self._listener
        if listener is None:
            raise RuntimeError('LocalCluster: no listener to accept processes on (not started)')
        taken: dict[int, Connection] = {}
        dropped: list[str] = []
        lock = threading.Lock()
        done = threading.Event()

        def admit(conn: Connection) -> None:
            # A peer that does not answer in time fails its read (as on the control socket).
            _set_io_timeout(conn, _HANDSHAKE_S)
            try:
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                index = conn.recv()
            except Exception as exc:  # noqa: BLE001  (any failure: not one of ours)
                conn.close()
                with lock:
                    dropped.append(type(exc).__name__)
                return
            _set_io_timeout(conn, None)  # ours: its replies may take as long as a test does
            with lock:
                if not isinstance(index, int) or not 0 <= index < self.n or index in taken:
                    conn.close()
                    dropped.append(f'index {index!r}')
                    return
                taken[index] = conn
                if len(taken) == self.n:
                    done.set()

        def accept() -> None:
            while not done.is_set():
                try:
                    conn = listener.accept()
                except OSError:  # closed: started, or given up
                    return
                threading.Thread(target=admit, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while not done.wait(0.2):
            dead = [w.index for w in self._workers if w.proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                listener.close()
                with lock:
                    why = (
                        f'process(es) {dead} exited'
                        if dead
                        else f'not every process connected within {self.start_timeout:g} s'
                    )
                    why += f' ({len(taken)} of {self.n} connected'
                    if dropped:
                        why += f'; dropped {len(dropped)} other connection(s): {dropped}'
                    why += ')'
                raise ClusterError(
                    f'LocalCluster failed to start: {why}.\n' + self._format_logs(),
                    errors={},
                    missing=dead,
                    logs=self.logs(),
                )
        for index, conn in taken.items():
            self._workers[index].conn = conn

    def stop(self) -> None:
        """Kills every process (idempotent)."""
        for w in self._workers:
            if w.proc.poll() is None:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for w in self._workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if w.conn is not None:
                w.conn.close()
        self._workers = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- running functions ---------------------------------------------------
    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float = 120.0,
        expect_exit: Iterable[int] = (),
        bracket: bool = True,
        **kwargs: Any,
    ) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` in every process at once.

        ``fn`` must be a module-level function (the workers import its file).

        Args:
            fn: the function to run.
            timeout: seconds to wait for every process.
            expect_exit: process indices expected to die during the call (no
                answer is awaited from them; their result is None).
            bracket: wrap the call in coordination-service barriers named after
                it, so processes that drift apart fail loudly.

        Returns:
            One result per process, in process-index order.

        Raises:
            ClusterError: a process raised, died unexpectedly, or did not answer
                within ``timeout``. The cluster is then stopped (``alive`` is
                False) unless every process answered.
        """
        if not self.alive:
            raise RuntimeError(
                'LocalCluster is not running (start() it, or it was '
                'stopped after an earlier failure).'
            )
        self._runs += 1
        path = os.path.abspath(fn.__code__.co_filename)
        msg = ('run', self._runs, path, fn.__qualname__, args, kwargs, bracket, timeout)
        expect = set(expect_exit)
        for w in self._workers:
            w.connection().send(msg)
        results = self._collect(lambda w: w.index not in expect, timeout, fn.__qualname__)
        if expect:
            self.broken = True  # processes died on purpose: restart before reuse
        return results

    def _collect(
        self, awaited: Callable[[_Worker], bool], timeout: float, what: str, expect: str = 'ok'
    ) -> list[Any]:
        pending = {w.connection(): w for w in self._workers if awaited(w)}
        results: list[Any] = [None] * self.n
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        grace_end: float | None = None
        while pending:
            left = deadline - time.monotonic()
            if errors and grace_end is None:  # one failed: the rest get a short grace period
                grace_end = time.monotonic() + 10.0
            if grace_end is not None:
                left = min(left, grace_end - time.monotonic())
            if left <= 0:
                break
            for ready in wait(list(pending), timeout=min(left, 1.0)):
                conn = cast(Connection, ready)  # wait() returns the objects it was given
                w = pending.pop(conn)
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    errors[w.index] = f'process {w.index} died (exit code {w.proc.poll()})'
                    continue
                if kind == expect:
                    results[w.index] = payload
                else:
                    errors[w.index] = payload
            for conn, w in list(pending.items()):
                if w.proc.poll() is not None and not conn.poll():
                    pending.pop(conn)
                    errors[w.index] = f'process {w.index} died (exit code {w.proc.returncode})'
        if not errors and not pending:
            return results
        missing = sorted(w.index for w in pending.values())
        self._dump_stacks(missing)
        logs = self.logs()
        self.broken = True
        self.stop()
        parts = [f'{what}: ']
        if errors:
            parts.append(f'process(es) {sorted(errors)} failed')
        if missing:
            parts.append(
                (' and ' if errors else '')
                + f'process(es) {missing} did not answer within {timeout:g} s'
            )
        text = ''.join(parts) + '.\n'
        for i, tb in sorted(errors.items()):
            text += f'\n--- process {i} error ---\n{tb}'
        text += '\n' + self._format_logs(logs)
        raise ClusterError(text, errors=errors, missing=missing, logs=logs)

    def _dump_stacks(self, indices: list[int]) -> None:
        for i in indices:
            w = self._workers[i]
            if w.proc.poll() is None:
                try:
                    os.kill(w.proc.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        if indices:
            time.sleep(1.0)

    def signal(self, index: int, sig: int) -> None:
        """Sends signal ``sig`` to process ``index`` (e.g. ``signal.SIGTERM``); nothing once
        it has ended (its pid may be another process's by then)."""
        self._workers[index].proc.send_signal(sig)

    # -- logs ----------------------------------------------------------------
    def logs(self, tail: int = 6000) -> dict[int, str]:
        """Process index -> the last ``tail`` characters of its log."""
        out = {}
        for w in self._workers:
            try:
                with open(w.log_path, 'rb') as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - tail))
                    out[w.index] = f.read().decode(errors='replace')
            except OSError as exc:
                out[w.index] = f'<no log: {exc}>'
        return out

    def _format_logs(self, logs: dict[int, str] | None = None) -> str:
        logs = self.logs() if logs is None else logs
        return ''.join(
            f'\n===== log of process {i} =====\n{text}' for i, text in sorted(logs.items())
        )
