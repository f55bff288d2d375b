"""Cluster sessions: one ipyparallel engine per host, one JAX process per engine.

A `Session` talks to engines only through ipyparallel. What runs on an engine
lives in `multihost.engine` (installed there); the notebook ships a
two-line trampoline that imports and calls it, so nothing typed by the user is
evaluated except the code of a ``%%mh`` cell.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import secrets
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    'HostInfo',
    'HostsError',
    'Session',
    'SessionError',
    'SessionTimeout',
    'connect',
    'start_local',
]

log = logging.getLogger('mhnotebook')


class SessionError(RuntimeError):
    """A session could not start, connect, or reach its engines (the message says what to do)."""


class SessionTimeout(SessionError):
    """Hosts did not finish in time; the work keeps running on them.

    Attributes:
        pending: process indices still running.
        finished: process indices that finished.
    """

    def __init__(self, message: str, pending: list[int], finished: list[int]):
        super().__init__(message)
        self.pending = pending
        self.finished = finished


class HostsError(RuntimeError):
    """Code failed on one or more hosts.

    Attributes:
        errors: process index -> that host's error text (with its traceback).
    """

    def __init__(self, message: str, errors: dict[int, str]):
        super().__init__(message)
        self.errors = errors


@dataclasses.dataclass(frozen=True)
class HostInfo:
    """One host of the session.

    Attributes:
        process_index: the JAX process index the engine reported.
        engine_id: the ipyparallel engine id (not necessarily equal to the above).
        hostname: the engine's host name.
        address: the engine's address as other hosts reach it.
        machine: an id equal for engines on the same machine.
        pid: the engine's OS process id.
        local_devices: ids of the JAX devices this host owns.
    """

    process_index: int
    engine_id: int
    hostname: str
    address: str
    machine: str
    pid: int
    local_devices: tuple[int, ...]


# -- the trampolines shipped to engines ------------------------------------------
# They only import an installed function on the engine and call it; `_call_ns`
# passes the engine's user namespace (where %%mh cells define variables).


def _call(qualname: str, *args: Any, **kwargs: Any) -> Any:
    import importlib

    module, _, attr = qualname.rpartition('.')
    return getattr(importlib.import_module(module), attr)(*args, **kwargs)


def _call_ns(qualname: str, *args: Any, **kwargs: Any) -> Any:
    import importlib

    from IPython import get_ipython

    module, _, attr = qualname.rpartition('.')
    namespace = get_ipython().user_ns  # the engine's user namespace
    return getattr(importlib.import_module(module), attr)(namespace, *args, **kwargs)


_live_sessions: weakref.WeakSet[Session] = weakref.WeakSet()
_atexit_registered = False


def _track(session: Session) -> None:
    # Registered after ipyparallel is imported, so it runs before ipyparallel's
    # own exit hook (atexit is LIFO) and can kill engines JAX keeps alive.
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_stop_all)
        _atexit_registered = True
    _live_sessions.add(session)


def _stop_all() -> None:
    for session in list(_live_sessions):
        try:
            session.stop()
        except Exception:  # interpreter is exiting; best effort
            pass


def _echo(outputs: dict[int, str]) -> None:
    for p, text in sorted(outputs.items()):
        if text:
            print(f'[host {p}] ' + text.rstrip('\n').replace('\n', f'\n[host {p}] '))


def _render_remote_error(err: BaseException) -> str:
    tb = getattr(err, 'traceback', None)
    if tb:
        return str(tb)
    return f'{type(err).__name__}: {err}'


class Session:
    """A set of hosts (ipyparallel engines) that each run one JAX process.

    Create one with `start_local` (simulated hosts on this machine) or
    `connect` (an existing ipyparallel cluster anywhere). Use it as a context
    manager or call `stop()`; sessions still running at interpreter exit are
    stopped.

    Attributes:
        client: the ipyparallel `Client`.
        engine_ids: engine ids ordered by `jax.process_index()` (as reported
            by the engines; never assumed equal to engine ids).
        processes: `HostInfo` per process index.
    """

    def __init__(
        self,
        client: Any,
        processes: Sequence[HostInfo],
        *,
        cluster: Any = None,
        start_options: dict[str, Any] | None = None,
    ):
        self.client = client
        self.processes: tuple[HostInfo, ...] = tuple(
            sorted(processes, key=lambda h: h.process_index)
        )
        self.engine_ids: list[int] = [h.engine_id for h in self.processes]
        self._cluster = cluster
        self._start_options = start_options
        self._stopped = False
        self._lock = threading.Lock()
        self._control: Any = None
        self._control_address: tuple[str, int] | None = None
        self._control_key = secrets.token_bytes(16)
        self._watchdog: Any = None  # kills a local cluster if this process dies (_cleanup)
        _track(self)

    # -- basics ----------------------------------------------------------------
    @property
    def num_processes(self) -> int:
        return len(self.processes)

    @property
    def running(self) -> bool:
        return not self._stopped

    def __repr__(self) -> str:
        state = 'stopped' if self._stopped else f'{self.num_processes} hosts'
        kind = 'local' if self._cluster is not None else 'connected'
        return f'<mhnotebook.Session {kind}, {state}, engines {self.engine_ids}>'

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _check(self) -> None:
        if self._stopped:
            raise SessionError(
                'this session is stopped; start a new one with '
                'mhnotebook.start_local(...) or %mh_cluster start.'
            )

    # -- calling engines -------------------------------------------------------
    def call(
        self,
        qualname: str,
        *args: Any,
        namespace: bool = False,
        timeout: float = 60.0,
        processes: Sequence[int] | None = None,
        on_done: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Calls installed function ``qualname`` on every host; results by process index.

        Args:
            qualname: dotted name of a function importable on the engines.
            namespace: pass the engine's user namespace as the first argument.
            timeout: seconds to wait for every host.
            processes: only these process indices (default: all).
            on_done: called with each process index as its host finishes.

        Raises:
            HostsError: the function raised on some hosts (all their tracebacks).
            SessionError: some host did not answer within ``timeout``.
        """
        self._check()
        procs = list(range(self.num_processes)) if processes is None else list(processes)
        tramp = _call_ns if namespace else _call
        pending = {
            p: self.client[self.engine_ids[p]].apply_async(tramp, qualname, *args, **kwargs)
            for p in procs
        }
        return self._wait(pending, timeout, qualname, on_done)

    def _wait(
        self,
        pending: dict[int, Any],
        timeout: float,
        what: str,
        on_done: Callable[[int], None] | None = None,
        on_tick: Callable[[dict[int, str], float], None] | None = None,
    ) -> list[Any]:
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        start = time.monotonic()
        deadline = start + timeout
        left = dict(pending)
        next_tick = start
        while left:
            if on_tick is not None and time.monotonic() >= next_tick:
                state = {
                    p: ('error' if p in errors else 'done' if p not in left else 'running')
                    for p in pending
                }
                on_tick(state, time.monotonic() - start)
                next_tick += 0.5
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for p, ar in list(left.items()):
                if ar.ready():
                    del left[p]
                    try:
                        results[p] = ar.get(0)
                    except Exception as exc:
                        errors[p] = _render_remote_error(exc)
                    if on_done is not None:
                        on_done(p)
            if left:
                next(iter(left.values())).wait(min(0.05, max(remaining, 0)))
        if on_tick is not None:
            state = {
                p: ('error' if p in errors else 'done' if p not in left else 'running')
                for p in pending
            }
            on_tick(state, time.monotonic() - start)
        if left:
            raise SessionTimeout(
                f'{what}: host(s) {sorted(left)} did not answer within {timeout:g} s. '
                'They may be stuck in a collective: look with session.where() '
                '(%mh_where), or restart with session.restart() (%mh_cluster restart).',
                pending=sorted(left),
                finished=sorted(set(pending) - set(left)),
            )
        if errors:
            first = min(errors)
            raise HostsError(
                f'{what} failed on host(s) {sorted(errors)}; host {first}:\n{errors[first]}', errors
            )
        return [results[p] for p in sorted(results)]

    def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        echo: bool = True,
        on_status: Callable[[dict[int, str], float], None] | None = None,
    ) -> dict[int, str]:
        """Runs ``code`` on every host (the way a ``%%mh`` cell does).

        Args:
            code: Python source run in each engine's namespace.
            timeout: seconds to wait (None: wait until done).
            echo: print each host's output, labelled by process index.
            on_status: called about twice a second with (process index ->
                'running' | 'done' | 'error', seconds elapsed).

        Returns:
            Process index -> that host's stdout.

        Raises:
            HostsError: the code raised on some hosts; ``.errors`` holds each
                host's traceback.
            SessionTimeout: not finished within ``timeout`` (the code keeps
                running on the engines).
        """
        self._check()
        return self.wait_outputs(
            self.execute_async(code), timeout=timeout, echo=echo, on_status=on_status
        )

    def push(self, values: dict[str, Any], *, per_process: bool = False) -> None:
        """Sets variables on every host (``per_process``: each value is a list by process)."""
        self._check()
        for p, e in enumerate(self.engine_ids):
            ns = {k: (v[p] if per_process else v) for k, v in values.items()}
            self.client[e].push(ns, block=True)

    # -- gather ----------------------------------------------------------------
    def allgather(
        self,
        name: str,
        *,
        timeout: float = 600.0,
        transport: str = 'auto',
        progress: bool | None = None,
    ) -> Any:
        """The global value of engine variable ``name``, as numpy, in this process.

        Global `jax.Array`s (any sharding, any rank) come back whole; host-local
        arrays and scalars are stacked along a new axis 0, one row per process
        (like `multihost.process_allgather`); pytrees keep their structure.
        Each block travels once: only replica 0 of every distinct shard is
        sent, by the host that owns it, straight into its place.

        Args:
            name: a variable on the engines (``x`` or dotted ``state.params``).
            timeout: seconds to wait for every host.
            transport: ``'shm'`` (engines write into shared memory; only when
                every engine runs on this machine), ``'zmq'`` (blocks travel as
                zero-copy messages), or ``'auto'``.
            progress: show a progress bar (default: for gathers over 64 MiB).

        Raises:
            multihost.engine.GatherError (through HostsError): unknown name or a
                value that cannot be gathered.
        """
        from mhnotebook import _gather

        self._check()
        return _gather.allgather(
            self, name, timeout=timeout, transport=transport, progress=progress
        )

    def barrier(self, name: str, *, timeout: float | None = None) -> dict[int, dict[str, Any]]:
        """Runs a `multihost.barrier` on every host; per process index what happened.

        Each result has ``ok``, ``elapsed`` (seconds) and, on failure, ``error``
        and ``message`` (plus ``missing`` or ``names``).
        """
        wait = 60.0 + (timeout if timeout is not None else 600.0)
        results = self.call('multihost.engine.barrier', name, timeout, timeout=wait)
        return dict(enumerate(results))

    # -- diagnostics -----------------------------------------------------------
    def layout(self, name: str, *, check: bool = True, timeout: float = 120.0) -> tuple[Any, Any]:
        """(`multihost.Layout`, `multihost.ReplicaReport` or None) of engine array ``name``.

        ``check`` digests every replica on every host (a collective) so
        replicas that disagree are flagged.
        """
        results = self.call('multihost.engine.layout', name, check, namespace=True, timeout=timeout)
        return results[0]

    def diff(self, name: str, *, timeout: float = 120.0) -> Any:
        """`multihost.TreeDiff` of engine value ``name`` across hosts (what differs, where)."""
        results = self.call(
            'multihost.engine.diff', name, timeout, namespace=True, timeout=timeout + 10
        )
        return results[0]

    @property
    def control(self) -> Any:
        """A `multihost.ControlClient` to process 0's control endpoint (started on demand).

        It answers while every engine's main thread is busy, e.g. stuck in a
        collective: stacks, the step table, stepping on/off, releases.
        """
        self._check()
        if self._control is None:
            from multihost import ControlClient

            if self._control_address is None:
                _, port = self.call(
                    'multihost.engine.serve_control', self._control_key, processes=[0]
                )[0]
                self._control_address = (self.processes[0].address, port)
            self._control = ControlClient(self._control_address, self._control_key, timeout=15.0)
        return self._control

    def where(self, *, timeout: float = 10.0) -> dict[int, Any]:
        """Per process index: its Python stacks and current collective (`multihost.HostStacks`).

        Works while the engines are busy or hung (through the control endpoint).
        Start it with `control` before running code that might hang.
        """
        return self.control.stacks(timeout=timeout)

    def step_table(self) -> Any:
        """The host x step table of the step gate (`multihost.StepTable`)."""
        return self.control.step_table()

    def set_stepping(self, on: bool) -> None:
        """Turns the step gate on (every host pauses before each collective) or off."""
        self.control.set_stepping(on)

    def release(self, steps: int = 1) -> tuple[int, ...]:
        """Releases the next ``steps`` gated collectives."""
        return self.control.release(steps)

    def release_all(self) -> tuple[int, ...]:
        """Turns stepping off and releases every waiting collective."""
        return self.control.release_all()

    def execute_async(self, code: str) -> dict[int, Any]:
        """Starts ``code`` on every host and returns at once: process index -> AsyncResult.

        Used while stepping, so the notebook stays free to release steps.
        Collect with `wait_outputs`.
        """
        self._check()
        return {
            p: self.client[e].execute(code, silent=False, block=False)
            for p, e in enumerate(self.engine_ids)
        }

    def wait_outputs(
        self,
        pending: dict[int, Any],
        *,
        timeout: float | None = None,
        echo: bool = True,
        on_status: Callable[[dict[int, str], float], None] | None = None,
    ) -> dict[int, str]:
        """Waits for `execute_async` results; like `execute` from there on."""
        try:
            self._wait(
                pending, float('inf') if timeout is None else timeout, 'execute', on_tick=on_status
            )
        finally:
            outputs = {}
            for p, ar in pending.items():
                if ar.ready():
                    # The reply can come before the last output message.
                    ar.wait_for_output(5.0)
                    outputs[p] = ''.join(getattr(ar, 'stdout', '') or '')
            if echo:
                _echo(outputs)
        return outputs

    def interrupt(self) -> None:
        """Sends SIGINT to every engine: running code gets a KeyboardInterrupt.

        A host waiting at the step gate reacts within half a second; a host
        blocked inside a native XLA collective may not react at all (then
        `restart`).
        """
        self._check()
        self.client.send_signal(signal.SIGINT, targets=self.engine_ids, block=True)

    # -- views -------------------------------------------------------------------
    def layout_view(self, name: str, *, values: bool = True, axes: Any = None) -> Any:
        """A `LayoutView` of engine array ``name``: blocks by host, replicas checked.

        ``values`` also gathers the array so selecting a block shows its values.
        """
        from mhnotebook.widgets import LayoutView

        layout, report = self.layout(name)
        data = None
        if values and layout.nbytes <= (256 << 20):
            data = self.allgather(name)
        return LayoutView(layout, report, data, axes=axes)

    def diff_view(self, name: str) -> Any:
        """A `TreeDiffView` of engine value ``name`` across hosts."""
        from mhnotebook.widgets import TreeDiffView

        return TreeDiffView(self.diff(name))

    def where_view(self, *, timeout: float = 10.0) -> Any:
        """A refreshable `WhereView`: every host's current collective and stacks."""
        from mhnotebook.widgets import WhereView

        return WhereView(
            self.where(timeout=timeout), on_refresh=lambda: self.where(timeout=timeout)
        )

    def stepper_view(self) -> Any:
        """A `StepperView` wired to this session: Step, Continue (release all), Stop."""
        from mhnotebook.widgets import StepperView

        def step() -> Any:
            self.release(1)
            return self.step_table()

        def cont() -> Any:
            self.release_all()
            return self.step_table()

        def stop() -> Any:
            self.interrupt()  # hosts held at the gate raise KeyboardInterrupt
            self.set_stepping(False)
            return self.step_table()

        return StepperView(
            self.step_table(),
            on_step=step,
            on_continue=cont,
            on_stop=stop,
            on_refresh=self.step_table,
        )

    # -- lifecycle -------------------------------------------------------------
    def status(self) -> dict[int, dict[str, Any]]:
        """Per process index: engine id, host, and whether the engine is busy (queue status)."""
        self._check()
        queue = self.client.queue_status(targets=self.engine_ids)
        out = {}
        for h in self.processes:
            q = queue.get(h.engine_id, {})
            out[h.process_index] = dict(
                engine_id=h.engine_id,
                hostname=h.hostname,
                pid=h.pid,
                busy=bool(q.get('tasks', 0) or q.get('queue', 0)),
                queued=q.get('queue', 0),
            )
        return out

    def stop(self) -> None:
        """Stops the session: closes the client, and stops the cluster if this session started it.

        Idempotent.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        _live_sessions.discard(self)
        if self._control is not None:
            self._control.close()
            self._control = None
        pool = getattr(self, '_shm_pool', None)
        if pool is not None:
            pool.close()
            self._shm_pool = None
        try:
            self.client.close()
        except Exception:
            pass
        if self._cluster is not None:
            try:
                # JAX's preemption service catches SIGTERM (a preemption notice),
                # so engines of a local cluster are killed outright, and
                # ipyparallel's warnings about the non-zero exit (with each
                # engine's whole log) are expected noise here.
                self._cluster.log.setLevel(logging.ERROR)
                self._cluster.signal_engines_sync(signal.SIGKILL)
            except Exception:
                pass
            try:
                self._cluster.stop_cluster_sync()
            except Exception as exc:
                log.warning('stopping the local cluster failed: %s', exc)
        if self._watchdog is not None:
            from mhnotebook import _cleanup

            watchdog, self._watchdog = self._watchdog, None
            _cleanup.stop_watchdog(watchdog)  # it kills any straggler of the cluster

    def restart(self, *, timeout: float = 180.0) -> Session:
        """Replaces every engine by a fresh one (JAX cannot re-initialize in place).

        Only for sessions made by `start_local`; for a connected cluster,
        restart its engines with your launcher and `connect` again.
        """
        if self._start_options is None:
            raise SessionError(
                'restart() works for sessions made by start_local; for a '
                'connected cluster restart the engines with its launcher '
                'and call mhnotebook.connect(...) again.'
            )
        self.stop()
        fresh = start_local(**{**self._start_options, 'timeout': timeout})
        _live_sessions.discard(fresh)
        self.__dict__.update({k: v for k, v in fresh.__dict__.items()})
        self._stopped = False
        _live_sessions.add(self)
        return self


# -- construction ----------------------------------------------------------------


class _Progress:
    """A one-line progress display: a widget in a notebook, a line on a terminal."""

    def __init__(self, enabled: bool, label: str):
        self.enabled = enabled
        self.handle = None
        self.last = label
        if enabled:
            try:
                from IPython import get_ipython
                from IPython.display import display

                if get_ipython() is not None:
                    self.handle = display({'text/plain': label}, raw=True, display_id=True)
            except ImportError:
                pass
            if self.handle is None:
                print(label, file=sys.stderr, flush=True)

    def update(self, text: str) -> None:
        if not self.enabled or text == self.last:
            return
        self.last = text
        if self.handle is not None:
            self.handle.update({'text/plain': text}, raw=True)
        else:
            print(text, file=sys.stderr, flush=True)


def _hosts_from_infos(infos: dict[int, dict[str, Any]]) -> list[HostInfo]:
    return [
        HostInfo(
            process_index=i['process_index'],
            engine_id=e,
            hostname=i['hostname'],
            address=i['address'],
            machine=i['machine'],
            pid=i['pid'],
            local_devices=tuple(i.get('local_devices', ())),
        )
        for e, i in infos.items()
    ]


def _initialize(
    client: Any,
    engine_ids: list[int],
    coordinator: str,
    devices: int | None,
    platform: str | None,
    timeout: float,
    progress: _Progress,
    bind: str | None = None,
) -> dict[int, dict[str, Any]]:
    n = len(engine_ids)
    pending = {}
    for pid, e in enumerate(engine_ids):
        pending[e] = client[e].apply_async(
            _call,
            'multihost.engine.initialize',
            coordinator,
            n,
            pid,
            devices,
            platform=platform,
            initialization_timeout=int(max(timeout, 10)),
            coordinator_bind_address=bind,
        )
    infos: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while len(infos) + len(errors) < n and time.monotonic() < deadline:
        for e, ar in pending.items():
            if e in infos or e in errors or not ar.ready():
                continue
            try:
                infos[e] = ar.get(0)
            except Exception as exc:
                errors[e] = _render_remote_error(exc)
        progress.update(f'mhnotebook: JAX initialized on {len(infos)}/{n} hosts')
        time.sleep(0.05)
    if errors or len(infos) < n:
        missing = sorted(set(engine_ids) - set(infos) - set(errors))
        detail = ''.join(f'\n--- engine {e} ---\n{t}' for e, t in errors.items())
        raise SessionError(
            f'jax.distributed.initialize failed (coordinator {coordinator}): '
            f'engines {sorted(errors)} raised, engines {missing} did not finish within '
            f'{timeout:g} s.{detail}\nCheck that every engine can reach the coordinator '
            f'address (pass coordinator="host:port" to choose it); it listens on '
            f'{bind or "every interface"} only (coordinator_bind="[::]:PORT": every interface).'
        )
    return infos


def _start_control(session: Session, host: str) -> None:
    # Up front: once a cell hangs, engine 0 can no longer be asked to start it.
    # It listens on ``host`` only: loopback for a local cluster, else the
    # address of process 0 this kernel reaches it at.
    try:
        # Every host's debug thread, so stacks and stepping reach hosts that
        # have not entered a collective yet.
        session.call('multihost.start_debug_daemon')
        address = session.call(
            'multihost.engine.serve_control', session._control_key, host, processes=[0]
        )[0]
        session._control_address = (str(address[0]), int(address[1]))
        session.control  # noqa: B018 - connects
    except Exception:
        session.stop()
        raise


def start_local(
    n: int = 4,
    devices_per_process: int = 2,
    *,
    timeout: float = 180.0,
    progress: bool = True,
    **cluster_options: Any,
) -> Session:
    """Starts ``n`` local ipyparallel engines, each a JAX process with CPU devices.

    Each engine sets ``jax_num_cpu_devices`` and joins ``jax.distributed`` on
    a free loopback port (a local simulated cluster is the only place that
    uses 127.0.0.1). Every port of the cluster (ipyparallel's, JAX's
    coordination service, the control endpoint) listens on loopback only.

    The cluster dies with this process: a watchdog process (see
    `mhnotebook._cleanup`) SIGKILLs the controller and engines within a
    second when this process ends in any way, ``kill -9`` included.

    Args:
        n: number of simulated hosts (engines).
        devices_per_process: CPU devices per host.
        timeout: seconds for the engines to come up and initialize JAX.
        progress: show progress while starting.
        **cluster_options: passed to `ipyparallel.Cluster`.

    Raises:
        SessionError: an engine did not come up in time (nothing is left running).
    """
    import ipyparallel as ipp

    from multihost.local import free_port

    if n < 1 or devices_per_process < 1:
        raise ValueError(
            f'need n >= 1 and devices_per_process >= 1, got n={n}, '
            f'devices_per_process={devices_per_process}'
        )
    show = _Progress(
        progress, f'mhnotebook: starting {n} engines x {devices_per_process} CPU devices ...'
    )
    from mhnotebook import _cleanup

    _cleanup.sweep_shm()  # shared memory left by kernels that died
    t0 = time.monotonic()
    cluster_options.setdefault('log_level', logging.WARNING)
    # A cluster id of its own: the watchdog finds the cluster's processes by it.
    options = dict(cluster_options)
    options.setdefault('cluster_id', f'mhnb-{os.getpid()}-{secrets.token_hex(4)}')
    cluster = ipp.Cluster(n=n, **options)
    log_dir = os.path.join(cluster.profile_dir, 'log')
    os.makedirs(log_dir, exist_ok=True)
    watchdog = _cleanup.start_watchdog(
        cluster.cluster_id,
        cluster.profile_dir,
        os.path.join(log_dir, f'mhnotebook-watchdog-{cluster.cluster_id}.log'),
    )
    try:
        cluster.start_cluster_sync()
        client = cluster.connect_client_sync()
        try:
            # interactive=False: no tqdm widget (a saved notebook could not show it); the
            # progress line above says how far the start is.
            client.wait_for_engines(n, timeout=timeout, interactive=False)
        except TimeoutError:
            raise SessionError(
                f'only {len(client.ids)} of {n} engines came up within '
                f'{timeout:g} s; see the engine logs in '
                f'{cluster.profile_dir}/log'
            ) from None
        engine_ids = sorted(client.ids)[:n]
        show.update(
            f'mhnotebook: {n} engines up in {time.monotonic() - t0:.1f} s; initializing JAX ...'
        )
        left = max(10.0, timeout - (time.monotonic() - t0))
        coordinator = f'127.0.0.1:{free_port()}'
        infos = _initialize(
            client, engine_ids, coordinator, devices_per_process, 'cpu', left, show, coordinator
        )
        if not _cleanup.watchdog_ready(watchdog, 10.0):
            log.warning(
                'mhnotebook: the watchdog of the local cluster did not start (see %s); '
                'its engines may outlive a crash of this process.',
                log_dir,
            )
    except BaseException:
        try:
            cluster.stop_cluster_sync()
        except Exception:
            pass
        _cleanup.stop_watchdog(watchdog)
        raise
    session = Session(
        client,
        _hosts_from_infos(infos),
        cluster=cluster,
        start_options=dict(
            n=n, devices_per_process=devices_per_process, progress=progress, **cluster_options
        ),
    )
    session._watchdog = watchdog
    _start_control(session, '127.0.0.1')
    show.update(
        f'mhnotebook: {n} hosts x {devices_per_process} devices ready in '
        f'{time.monotonic() - t0:.1f} s (engines {session.engine_ids})'
    )
    return session


def connect(
    url_file: str | None = None,
    *,
    profile: str | None = None,
    cluster_id: str | None = None,
    n: int | None = None,
    coordinator: str | None = None,
    coordinator_bind: str | None = None,
    devices_per_process: int | None = None,
    platform: str | None = None,
    timeout: float = 120.0,
    progress: bool = True,
) -> Session:
    """Attaches to an existing ipyparallel cluster, started by any launcher (ssh, mpi, slurm...).

    If JAX is not distributed on the engines yet, initializes it: engine ids
    in ascending order become process indices, and the coordinator runs on
    the first engine's host (on a port free there) unless ``coordinator`` is
    given. The coordination service (unauthenticated) listens on that
    address only, and so does process 0's control endpoint (authenticated).
    Engines it did not start are never stopped or killed by this session.

    Args:
        url_file: the client connection file (``ipcontroller-client.json``).
        profile: ipython profile name (alternative to ``url_file``).
        cluster_id: cluster id within the profile.
        n: wait until this many engines are registered.
        coordinator: ``host:port`` for `jax.distributed.initialize`.
        coordinator_bind: ``host:port`` the coordination service listens on
            (default: ``coordinator`` itself; ``'[::]:PORT'``: every interface).
        devices_per_process: CPU devices to simulate per engine (testing only).
        platform: force a JAX platform on the engines (e.g. ``'cpu'``).
        timeout: seconds to wait for engines and initialization.
        progress: show progress while connecting.

    Raises:
        SessionError: no engines, a mix of initialized and uninitialized
            engines, or initialization failed.
    """
    import ipyparallel as ipp

    from mhnotebook import _cleanup

    _cleanup.sweep_shm()  # shared memory left by kernels that died
    show = _Progress(progress, 'mhnotebook: connecting to the ipyparallel cluster ...')
    kwargs = {
        k: v
        for k, v in dict(url_file=url_file, profile=profile, cluster_id=cluster_id).items()
        if v is not None
    }
    client = ipp.Client(timeout=timeout, **kwargs)
    try:
        if n is not None:
            client.wait_for_engines(n, timeout=timeout, interactive=False)
        engine_ids = sorted(client.ids)
        if not engine_ids:
            raise SessionError(
                'the cluster has no engines; start some (ipcluster engines '
                '-n N) or pass n=N to wait for them.'
            )
        infos = dict(
            zip(engine_ids, client[engine_ids].apply_sync(_call, 'multihost.engine.engine_info'))
        )
        ready = [e for e, i in infos.items() if i['initialized']]
        if ready and len(ready) != len(engine_ids):
            raise SessionError(
                f'JAX is distributed on engines {ready} but not on '
                f'{sorted(set(engine_ids) - set(ready))}; restart the engines.'
            )
        if not ready:
            if coordinator is None:
                first = engine_ids[0]
                port = client[first].apply_sync(_call, 'multihost.engine.free_port')
                coordinator = f'{infos[first]["address"]}:{port}'
            infos = _initialize(
                client,
                engine_ids,
                coordinator,
                devices_per_process,
                platform,
                timeout,
                show,
                coordinator_bind or coordinator,
            )
        counts = {i['process_count'] for i in infos.values()}
        if counts != {len(engine_ids)}:
            raise SessionError(
                f'engines report process_count {sorted(counts)} but the cluster '
                f'has {len(engine_ids)} engines; one engine per JAX process '
                'is required.'
            )
    except BaseException:
        client.close()
        raise
    session = Session(client, _hosts_from_infos(infos))
    _start_control(session, session.processes[0].address)
    show.update(
        f'mhnotebook: connected to {session.num_processes} hosts (engines {session.engine_ids})'
    )
    return session
