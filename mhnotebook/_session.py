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
from typing import TYPE_CHECKING, Any

__all__ = [
    'HostDied',
    'HostGone',
    'HostInfo',
    'HostsError',
    'InterruptReport',
    'Session',
    'SessionInterrupted',
    'SessionError',
    'SessionTimeout',
    'connect',
    'start_local',
]

log = logging.getLogger('mhnotebook')

if TYPE_CHECKING:  # the notebook imports jax (multihost) and ipywidgets only when needed
    from mhnotebook._gather import ShmPool
    from mhnotebook.widgets import LayoutView, StepperView, TreeDiffView, WhereView
    from multihost import ControlClient, HostStacks, Layout, ReplicaReport, StepTable, TreeDiff


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


class HostDied(SessionError):
    """A host's engine process ended while it was running work of this session.

    Attributes:
        died: process index -> how it ended (``'exit code 1'``, ``'signal 9'``
            or ``'died'`` when the launcher does not know).
        finished: process indices that finished the work.
        pending: process indices still running it (left running).
        errors: process index -> error text, for hosts where the work raised.
    """

    def __init__(
        self,
        message: str,
        died: dict[int, str],
        finished: list[int],
        pending: list[int],
        errors: dict[int, str],
    ):
        super().__init__(message)
        self.died, self.finished, self.pending, self.errors = died, finished, pending, errors


class HostGone(SessionError):
    """A host of this session is dead and the operation needs every host.

    Attributes:
        dead: process index -> how it ended.
    """

    def __init__(self, message: str, dead: dict[int, str]):
        super().__init__(message)
        self.dead = dead


@dataclasses.dataclass(frozen=True)
class InterruptReport:
    """What an interrupt (`Session.interrupt`, or Ctrl-C while the notebook waits) did.

    Attributes:
        stopped: process indices whose work stopped (or that were idle).
        running: process indices still busy after the wait: blocked in native
            code (a device collective) that SIGINT cannot interrupt.
        where: process index -> `multihost.HostStacks` read just before the
            signal (where each host was), or None if they could not be read.
        position: the collective number every host was realigned to (the
            next collective lines up again), or None when not realigned.
        seconds: how long the hosts took to stop.
        waited: the seconds the hosts were given.
    """

    stopped: tuple[int, ...]
    running: tuple[int, ...]
    where: dict[int, Any] | None
    position: int | None
    seconds: float
    waited: float

    @property
    def message(self) -> str:
        """One line: who stopped, who did not and what to do about it."""
        text = f'interrupted: {_hosts(self.stopped)} stopped'
        if not self.running:
            return text + f' in {self.seconds:.1f} s.'
        return (
            text + f'; {_hosts(self.running)} did not stop within {self.waited:g} s '
            '(blocked in native code such as a device collective, which SIGINT cannot '
            'interrupt): %mh_cluster restart (session.restart()).'
        )


class SessionInterrupted(SessionError):
    """The notebook was interrupted while it waited; every host was sent SIGINT.

    Attributes:
        report: the `InterruptReport`.
    """

    def __init__(self, report: InterruptReport):
        super().__init__(report.message)
        self.report = report


def _hosts(processes: Sequence[int]) -> str:
    """``[2]`` -> ``'host 2'``; ``[0, 1, 3]`` -> ``'hosts 0, 1, 3'``; ``[]`` -> ``'no host'``."""
    ps = sorted(processes)
    if not ps:
        return 'no host'
    return ('host ' if len(ps) == 1 else 'hosts ') + ', '.join(map(str, ps))


def _how(code: int | None) -> str:
    if code is None:
        return 'died'
    return f'signal {-code}' if code < 0 else f'exit code {code}'


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


_DEATH_GRACE = 3.0  # seconds the other hosts get to finish after one died
_RECOVERABLE_HEARTBEAT = 10  # seconds; JAX's default of 100 is long to wait in a notebook


def host_local(layout: Any) -> bool:
    """Whether a `multihost.Layout` describes one host's own value (each host has its own)."""
    return layout.sharding == 'numpy' or (
        layout.num_processes > 1 and {s.process_index for s in layout.shards} <= {0}
    )


def _check_axes(name: str, shape: tuple[int, ...], axes: Any) -> tuple[int, ...] | None:
    """``axes`` as a tuple, checked against ``shape`` (the view displays 2 axes, 1 for 1-d)."""
    if axes is None:
        return None
    axes = (axes,) if isinstance(axes, int) else tuple(int(a) for a in axes)
    ndim = len(shape)
    want = min(ndim, 2)
    if (
        len(axes) == want
        and all(-ndim <= a < ndim for a in axes)
        and len({a % ndim for a in axes}) == want
    ):
        return axes
    pick = {
        0: 'none (it is 0-d)',
        1: 'one: 0',
        2: f'two different ones in 0..{ndim - 1}, e.g. 0,{ndim - 1}',
    }[want]
    raise ValueError(
        f'axes {",".join(map(str, axes))} do not fit {name}, an array of shape '
        f'{tuple(shape)}; pick {pick}.'
    )


def _positive_timeout(timeout: float | None, what: str = 'timeout') -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(
            f'{what} must be > 0 seconds (or None: no limit), got {timeout!r}; e.g. {what}=30'
        )


def _engine_died(err: BaseException) -> bool:
    """Whether an ipyparallel result error says its engine died."""
    return 'EngineError' in (getattr(err, 'ename', None) or '', type(err).__name__)


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

    _shm_pool: ShmPool | None  # shared-memory buffers of `allgather`, set by `_gather`

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
        self._control: ControlClient | None = None
        self._control_address: tuple[str, int] | None = None
        self._control_key = secrets.token_bytes(16)
        self._watchdog: Any = None  # kills a local cluster if this process dies (_cleanup)
        self._dead: dict[int, str] = {}  # process index -> how its engine ended
        self._stepping = False  # last step-gate setting seen (the hosts are asked first)
        self._unaligned = False  # an interrupt left hosts busy: realign once they are idle
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

    def _check(self, *, need_all: bool = True) -> list[int]:
        """The live process indices; raises if stopped, or if a host is dead and ``need_all``."""
        if self._stopped:
            raise SessionError(
                'this session is stopped; start a new one with '
                'mhnotebook.start_local(...) or %mh_cluster start.'
            )
        dead = self.dead
        if dead and need_all:
            first = min(dead)
            how = '' if dead[first] == 'died' else f' ({dead[first]})'
            raise HostGone(
                f'{_hosts(sorted(dead))} {"is" if len(dead) == 1 else "are"} gone{how}: '
                '%mh_cluster restart (session.restart()).',
                dead,
            )
        return [p for p in range(self.num_processes) if p not in dead]

    # -- dead hosts --------------------------------------------------------------
    @property
    def recoverable(self) -> bool:
        """Whether the hosts survive the death of one (``start_local(..., recoverable=True)``)."""
        return bool((self._start_options or {}).get('recoverable', False))

    @property
    def dead(self) -> dict[int, str]:
        """Process index -> how its engine ended (``'exit code 1'``, ``'signal 9'``, ``'died'``).

        Read fresh on every access: ipyparallel unregisters an engine within
        a fraction of a second of its death.
        """
        if not self._stopped:
            try:
                ids = set(self.client.ids)
            except Exception:  # the controller is gone: nothing more to learn
                ids = None
            for p, h in enumerate(self.processes):
                if p in self._dead:
                    continue
                if (ids is not None and h.engine_id not in ids) or self._exited(p):
                    self._dead[p] = _how(self._exit_code(p))
        return dict(self._dead)

    def _launcher(self, p: int) -> Any:
        """The ipyparallel launcher of process ``p``'s engine (local clusters only), or None."""
        pid = self.processes[p].pid
        try:
            engine_sets = list(self._cluster.engines.values()) if self._cluster else []
        except Exception:
            return None
        for engine_set in engine_sets:
            for launcher in getattr(engine_set, 'launchers', {}).values():
                if getattr(launcher, 'pid', None) == pid:
                    return launcher
        return None

    def _exited(self, p: int) -> bool:
        launcher = self._launcher(p)
        process = getattr(launcher, 'process', None)
        if process is None:
            return False
        try:
            return not process.is_running() or process.status() == 'zombie'
        except Exception:  # psutil.NoSuchProcess: reaped
            return True

    def _exit_code(self, p: int, wait: float = 1.0) -> int | None:
        """The exit code of process ``p``'s engine (negative: killed by that signal), if known."""
        process = getattr(self._launcher(p), 'process', None)
        if process is None:
            return None
        try:
            # psutil caches the code once its launcher's waiter thread reaped the process.
            code = process.wait(timeout=wait)
        except Exception:  # still running, or reaped by someone else
            return None
        return None if code is None else int(code)

    def _fate_note(self, died: Sequence[int]) -> str:
        """What happens to the other hosts after ``died`` died."""
        others = [p for p in range(self.num_processes) if p not in died and p not in self._dead]
        if not others:
            return ''
        if 0 in died:
            return (
                f" Host 0 ran JAX's coordination service: {_hosts(others)} can run no more "
                'collectives (and are terminated unless the session is recoverable): '
                '%mh_cluster restart.'
            )
        if self.recoverable:
            return (
                f' {_hosts(others).capitalize()} {"keeps" if len(others) == 1 else "keep"} '
                'running (recoverable): %%mh runs there '
                'and multihost.live_devices(jax.devices()) reports the survivors; '
                '%mh_cluster restart for a whole cluster again.'
            )
        heartbeat = (self._start_options or {}).get('heartbeat_timeout') or 100
        return (
            f" With JAX's default fate-sharing the coordination service will terminate "
            f'{_hosts(others)} too (within about {heartbeat:g} s, its heartbeat timeout): '
            '%mh_cluster restart; start with --recoverable '
            '(start_local(..., recoverable=True)) to keep survivors inspectable.'
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
            HostGone: a host it needs is dead.
            HostDied: a host died while running it.
            SessionInterrupted: the wait was interrupted (Ctrl-C); every host
                was sent SIGINT.
        """
        self._check(need_all=processes is None)
        if self._unaligned:
            self._realign_if_idle()
        procs = list(range(self.num_processes)) if processes is None else list(processes)
        if any(p in self._dead for p in procs):
            self._check()  # names the dead host(s)
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
        died: dict[int, str] = {}
        start = time.monotonic()
        deadline = start + timeout
        left = dict(pending)
        next_tick = start

        def state() -> dict[int, str]:
            return {
                p: (
                    'died'
                    if p in died
                    else 'error'
                    if p in errors
                    else 'done'
                    if p not in left
                    else 'running'
                )
                for p in pending
            }

        try:
            while left:
                if on_tick is not None and time.monotonic() >= next_tick:
                    on_tick(state(), time.monotonic() - start)
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
                            if _engine_died(exc):
                                died[p] = self._dead.setdefault(p, _how(self._exit_code(p)))
                                # The others get a moment to finish, not forever: they
                                # may be waiting for the dead host in a collective.
                                deadline = min(deadline, time.monotonic() + _DEATH_GRACE)
                            else:
                                errors[p] = _render_remote_error(exc)
                        if on_done is not None:
                            on_done(p)
                if left:
                    next(iter(left.values())).wait(min(0.05, max(remaining, 0)))
        except KeyboardInterrupt:
            # The kernel was interrupted (Jupyter's stop button, Ctrl-C): stop the hosts too.
            raise SessionInterrupted(self.interrupt(pending=left)) from None
        if on_tick is not None:
            on_tick(state(), time.monotonic() - start)
        if died:
            known = {p: how for p, how in died.items() if how != 'died'}
            if len(died) == 1:
                how = f' ({known[min(died)]})' if known else ''
            else:
                how = ' (' + '; '.join(f'{p}: {h}' for p, h in sorted(known.items())) + ')'
                how = how if known else ''
            still = f' {_hosts(sorted(left))} still running it.' if left else ''
            raise HostDied(
                f'{_hosts(sorted(died))} died{how} while running {what}.{still}'
                + self._fate_note(list(died)),
                died=died,
                finished=sorted(results),
                pending=sorted(left),
                errors=errors,
            )
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
                'running' | 'done' | 'error' | 'died', seconds elapsed).

        Returns:
            Process index -> that host's stdout.

        Raises:
            HostsError: the code raised on some hosts; ``.errors`` holds each
                host's traceback.
            SessionTimeout: not finished within ``timeout`` (the code keeps
                running on the engines).
            HostDied: a host died while running it (``.died`` says how).
            HostGone: a host is dead (in a recoverable session the code runs
                on the live hosts instead).
            SessionInterrupted: interrupted while waiting (every host was sent
                SIGINT; ``.report`` says who stopped).
        """
        _positive_timeout(timeout)
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
        max_bytes: int | None = None,
    ) -> Any:
        """The global value of engine variable ``name``, as numpy, in this process.

        Global `jax.Array`s (any sharding, any rank) come back whole; host-local
        arrays and scalars are stacked along a new axis 0, one row per process
        (like `multihost.process_allgather`); pytrees keep their structure.
        Each block travels once: only replica 0 of every distinct shard is
        sent, by the host that owns it, straight into its place.

        Args:
            name: a variable on the engines (``x`` or dotted ``state.params``),
                optionally with a subscript of ints and slices,
                ``'x[::4, :128]'``: the hosts slice the array and only the
                slice travels (parsed, never evaluated).
            timeout: seconds to wait for every host.
            transport: ``'shm'`` (engines write into shared memory; only when
                every engine runs on this machine), ``'zmq'`` (blocks travel as
                zero-copy messages), or ``'auto'``.
            progress: show a progress bar (default: for gathers over 64 MiB).
            max_bytes: refuse a result larger than this, before anything is
                allocated or sent (default: half of this machine's available
                memory, ``MemAvailable`` in ``/proc/meminfo``).

        Raises:
            multihost.engine.GatherError (through HostsError): unknown name or a
                value that cannot be gathered.
            SessionError: the result would be larger than ``max_bytes``.
        """
        from mhnotebook import _gather

        self._check()
        _positive_timeout(timeout)
        return _gather.allgather(
            self, name, timeout=timeout, transport=transport, progress=progress, max_bytes=max_bytes
        )

    def barrier(self, name: str, *, timeout: float | None = None) -> dict[int, dict[str, Any]]:
        """Runs a `multihost.barrier` on every host; per process index what happened.

        Each result has ``ok``, ``elapsed`` (seconds) and, on failure, ``error``
        and ``message`` (plus ``missing`` or ``names``).
        """
        _positive_timeout(timeout)
        wait = 60.0 + (timeout if timeout is not None else 600.0)
        results = self.call('multihost.engine.barrier', name, timeout, timeout=wait)
        return dict(enumerate(results))

    # -- diagnostics -----------------------------------------------------------
    def layout(
        self, name: str, *, check: bool = True, timeout: float = 120.0
    ) -> tuple[Layout, ReplicaReport | None]:
        """(`multihost.Layout`, `multihost.ReplicaReport` or None) of engine array ``name``.

        ``check`` digests every replica on every host (a collective) so
        replicas that disagree are flagged.
        """
        results = self.call('multihost.engine.layout', name, check, namespace=True, timeout=timeout)
        return results[0]

    def diff(self, name: str, *, timeout: float = 120.0) -> TreeDiff:
        """`multihost.TreeDiff` of engine value ``name`` across hosts (what differs, where)."""
        results = self.call(
            'multihost.engine.diff', name, timeout, namespace=True, timeout=timeout + 10
        )
        return results[0]

    @property
    def control(self) -> ControlClient:
        """A `multihost.ControlClient` to process 0's control endpoint (started on demand).

        It answers while every engine's main thread is busy, e.g. stuck in a
        collective: stacks, the step table, stepping on/off, releases.
        """
        self._check(need_all=False)
        if self._control is None:
            from multihost import ControlClient

            if self._control_address is None:
                _, port = self.call(
                    'multihost.engine.serve_control', self._control_key, processes=[0]
                )[0]
                self._control_address = (self.processes[0].address, port)
            self._control = ControlClient(self._control_address, self._control_key, timeout=15.0)
        return self._control

    def where(self, *, timeout: float = 10.0) -> dict[int, HostStacks]:
        """Per process index: its Python stacks and current collective (`multihost.HostStacks`).

        Works while the engines are busy or hung (through the control endpoint).
        Start it with `control` before running code that might hang.
        """
        self._check(need_all=not self.recoverable)
        return self.control.stacks(timeout=timeout)

    def step_table(self) -> StepTable:
        """The host x step table of the step gate (`multihost.StepTable`)."""
        self._check(need_all=not self.recoverable)
        table = self.control.step_table()
        self._stepping = bool(table.stepping)
        return table

    @property
    def stepping(self) -> bool:
        """Whether the step gate is on, as the hosts say.

        The setting lives in the coordination service, so `%mh_step`, the
        stepper's buttons and ``multihost.set_stepping`` in a cell all change
        the one value read here. If the hosts cannot be asked, the last
        value seen.
        """
        if not self._stopped:
            try:
                self.step_table()
            except Exception as exc:
                log.info('stepping: asking the hosts failed (%s); last known value', exc)
        return self._stepping

    def set_stepping(self, on: bool) -> None:
        """Turns the step gate on (every host pauses before each collective) or off."""
        self._check(need_all=not self.recoverable)
        self.control.set_stepping(on)
        self._stepping = bool(on)

    def release(self, steps: int = 1) -> tuple[int, ...]:
        """Releases the next ``steps`` gated collectives."""
        self._check(need_all=not self.recoverable)
        return self.control.release(steps)

    def release_all(self) -> tuple[int, ...]:
        """Turns stepping off and releases every waiting collective."""
        self._check(need_all=not self.recoverable)
        held = self.control.release_all()
        self._stepping = False
        return held

    def _moved_on(self, before: StepTable, timeout: float = 3.0) -> StepTable:
        """The step table once the hosts moved on from ``before`` after a release.

        Returns when every host arrived at a later gate, or when every host is
        idle (the cell ran to its end), or after ``timeout`` seconds with
        where they are then.
        """
        first_held = before.pending.seq if before.pending is not None else -1
        deadline = time.monotonic() + timeout
        while True:
            table = self.step_table()
            held = table.pending
            if held is not None and held.seq > first_held and held.complete:
                return table
            if time.monotonic() >= deadline or not self._busy(self._check(), None, 0.0):
                return table
            time.sleep(0.1)

    def execute_async(self, code: str) -> dict[int, Any]:
        """Starts ``code`` on every host and returns at once: process index -> AsyncResult.

        Used while stepping, so the notebook stays free to release steps.
        Collect with `wait_outputs`. In a recoverable session with dead
        hosts, runs on the live ones.
        """
        live = self._check(need_all=not self.recoverable)
        if self._unaligned:
            self._realign_if_idle()
        return {
            p: self.client[self.engine_ids[p]].execute(code, silent=False, block=False)
            for p in live
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
        _positive_timeout(timeout)
        try:
            self._wait(
                pending,
                float('inf') if timeout is None else timeout,
                'this cell',
                on_tick=on_status,
            )
        finally:
            outputs = {}
            for p, ar in pending.items():
                if ar.ready():
                    if p not in self._dead:
                        # The reply can come before the last output message (a dead
                        # engine sends no more).
                        ar.wait_for_output(5.0)
                    outputs[p] = ''.join(getattr(ar, 'stdout', '') or '')
            if echo:
                _echo(outputs)
        return outputs

    def interrupt(
        self, *, timeout: float = 5.0, pending: dict[int, Any] | None = None
    ) -> InterruptReport:
        """Sends SIGINT to every host and waits until their work stopped.

        Running Python code gets a KeyboardInterrupt; a host waiting at the
        step gate (or in any wait that wakes up at least every half second)
        reacts at once. A host blocked in native code, such as a device
        collective, may not react at all: it is named in the report (then
        `restart`). Once every host is idle, the hosts' collective counts are
        realigned (an interrupt can leave hosts having entered different
        numbers of collectives), so the next collective lines up, and the
        session is ready: the next cell is not aborted.

        Args:
            timeout: seconds to give the hosts to stop.
            pending: the interrupted work (process index -> AsyncResult), if
                known; otherwise whatever the hosts are running.

        Returns:
            An `InterruptReport`: who stopped, who did not, where each host
            was just before the signal.
        """
        live = self._check(need_all=False)
        where = None
        try:  # where each host is, before the signal moves it
            where = self.control.stacks(timeout=2.0)
        except Exception as exc:
            log.info('interrupt: no stacks (%s)', exc)
        t0 = time.monotonic()
        deadline = t0 + timeout
        targets = [self.engine_ids[p] for p in live]
        if targets:
            self.client.send_signal(signal.SIGINT, targets=targets, block=True)
        busy = self._busy(live, pending, deadline)
        seconds = time.monotonic() - t0
        position = None
        self._unaligned = bool(busy)  # then at the next call, once they are idle
        if not busy and live:
            self._settle(live, deadline + 5.0)
            position = self._realign(live)
        return InterruptReport(
            stopped=tuple(p for p in live if p not in busy),
            running=tuple(busy),
            where=where,
            position=position,
            seconds=seconds,
            waited=timeout,
        )

    def _busy(
        self, processes: list[int], pending: dict[int, Any] | None, deadline: float
    ) -> list[int]:
        """Waits until ``processes`` are idle (or ``deadline``); the ones still busy."""
        by_engine = {self.engine_ids[p]: p for p in processes}
        while True:
            busy = set()
            if pending:
                busy |= {p for p, ar in pending.items() if p in processes and not ar.ready()}
            try:
                queues = self.client.queue_status(targets=list(by_engine))
                busy |= {
                    by_engine[e]
                    for e, q in queues.items()
                    if e in by_engine and isinstance(q, dict) and q.get('queue', 0)
                }
            except Exception:  # an engine died meanwhile: the next round skips it
                dead = self.dead
                by_engine = {e: p for e, p in by_engine.items() if p not in dead}
                busy -= set(dead)
            if not busy or time.monotonic() >= deadline:
                return sorted(busy)
            time.sleep(0.05)

    def _settle(self, processes: list[int], deadline: float) -> None:
        """Returns once each host runs cells again.

        After a cell fails (here: the KeyboardInterrupt), an IPython kernel
        aborts execute requests that reach it within a short window
        (``TaskAborted``); one silent empty cell per host, repeated until it
        is not aborted, makes sure that window has closed.
        """
        left = list(processes)
        while left and time.monotonic() < deadline:
            probes = {
                p: self.client[self.engine_ids[p]].execute('', silent=True, block=False)
                for p in left
            }
            left = []
            for p, ar in probes.items():
                try:
                    ar.get(max(0.1, deadline - time.monotonic()))
                except Exception as exc:
                    if _engine_died(exc):
                        continue
                    left.append(p)  # aborted, or a late KeyboardInterrupt: again

    def _realign_if_idle(self) -> None:
        """Realigns after an interrupt that left hosts busy, once every host is idle."""
        live = self._check(need_all=False)
        if not self._busy(live, None, 0.0):
            self._unaligned = False
            self._settle(live, time.monotonic() + 5.0)
            self._realign(live)

    def _realign(self, processes: list[int]) -> int | None:
        """Moves every host's collective count to the largest; returns it."""
        self._unaligned = False
        try:
            positions = self.call(
                'multihost.engine.sequence_position', processes=processes, timeout=10.0
            )
            top = max(positions)
            if len(set(positions)) > 1:
                self.call(
                    'multihost.engine.realign_sequence', top, processes=processes, timeout=10.0
                )
            return top
        except (SessionError, HostsError) as exc:
            log.warning('interrupt: could not realign the collective sequence: %s', exc)
            return None

    # -- views -------------------------------------------------------------------
    def layout_view(self, name: str, *, values: bool = True, axes: Any = None) -> LayoutView:
        """A `LayoutView` of engine array ``name``: blocks by host, replicas checked.

        ``values`` also gathers the array so selecting a block shows its values.
        A host-local value (a numpy array, or a `jax.Array` on one host's
        devices) differs per host: the view shows process 0's (compare the
        hosts' copies with `diff`).

        Raises:
            ValueError: ``axes`` do not fit the array.
        """
        from mhnotebook.widgets import LayoutView

        layout, report = self.layout(name)
        axes = _check_axes(name, layout.shape, axes)
        data = None
        if values and layout.nbytes <= (256 << 20):
            if host_local(layout):
                # Only process 0's copy, which is the one `layout` describes.
                from mhnotebook import _gather

                part = self.call(
                    'multihost.engine.gather_local', name, namespace=True, processes=[0]
                )[0]
                data = _gather._assemble(_gather._plan([part]), [part])[0]
            else:
                data = self.allgather(name)
        return LayoutView(layout, report, data, axes=axes)

    def diff_view(self, name: str) -> TreeDiffView:
        """A `TreeDiffView` of engine value ``name`` across hosts."""
        from mhnotebook.widgets import TreeDiffView

        return TreeDiffView(self.diff(name))

    def where_view(self, *, timeout: float = 10.0) -> WhereView:
        """A refreshable `WhereView`: every host's current collective and stacks."""
        from mhnotebook.widgets import WhereView

        return WhereView(
            self.where(timeout=timeout), on_refresh=lambda: self.where(timeout=timeout)
        )

    def stepper_view(self) -> StepperView:
        """A `StepperView` wired to this session: Step, Continue (release all), Stop."""
        from mhnotebook.widgets import StepperView

        # After Step and Continue the view shows where the hosts went, not the
        # table of the instant of the release.
        def step() -> StepTable:
            before = self.step_table()
            self.release(1)
            return self._moved_on(before)

        def cont() -> StepTable:
            before = self.step_table()
            self.release_all()
            return self._moved_on(before)

        def stop() -> StepTable:
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
        """Per process index: engine id, host, whether it is alive and busy (queue status).

        A dead host has ``alive`` False and ``how`` (``'exit code 1'``,
        ``'signal 9'`` or ``'died'``).
        """
        self._check(need_all=False)
        dead = self.dead
        try:
            queue = self.client.queue_status()  # registered engines only
        except Exception as exc:
            log.warning('status: the controller did not answer: %s', exc)
            queue = {}
        out = {}
        for h in self.processes:
            q = queue.get(h.engine_id, {}) if h.process_index not in dead else {}
            out[h.process_index] = dict(
                engine_id=h.engine_id,
                hostname=h.hostname,
                pid=h.pid,
                alive=h.process_index not in dead,
                how=dead.get(h.process_index),
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
                self._kill_engines()
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

    @property
    def shape(self) -> tuple[int, int]:
        """(number of processes, devices per process)."""
        return self.num_processes, len(self.processes[0].local_devices) if self.processes else 0

    def reuse(self, n: int, devices_per_process: int, *, recoverable: bool = False) -> str:
        """Checks that this running session is what ``start_local(n, devices_per_process)`` gives.

        So running a notebook again (a second Run All on the same kernel)
        reuses the cluster instead of stopping at its start cell.

        Returns:
            A one-line note saying that it is reused.

        Raises:
            SessionError: a different shape or recoverability (stop or
                restart it), or a dead host (restart).
        """
        self._check(need_all=False)
        want = (int(n), int(devices_per_process))
        kind = 'recoverable ' if self.recoverable else ''
        have = f'a {kind}cluster of {self.shape[0]} hosts x {self.shape[1]} devices'
        if self.shape != want or self.recoverable != bool(recoverable):
            asked = f'{want[0]} x {want[1]}{" recoverable" if recoverable else ""}'
            raise SessionError(
                f'{have} is running, not {asked}: %mh_cluster stop it first, then start '
                '(or %mh_cluster restart to restart the running one as it is).'
            )
        self._check()  # a dead host: restart, do not reuse
        return f'%mh_cluster: reusing the running {have[2:]} (%mh_cluster restart for fresh hosts).'

    def _kill_engines(self) -> None:
        """SIGKILLs every engine of the local cluster, one by one.

        (ipyparallel's ``signal_engines`` stops at the first engine that is
        already dead, leaving the rest running.)
        """
        for engine_set in list(self._cluster.engines.values()):
            for launcher in list(getattr(engine_set, 'launchers', {}).values()):
                try:
                    launcher.signal(signal.SIGKILL)
                except Exception:  # already gone
                    pass

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
    *,
    recoverable: bool = False,
    heartbeat_timeout: int | None = None,
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
            recoverable=recoverable,
            heartbeat_timeout=heartbeat_timeout,
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
    recoverable: bool = False,
    heartbeat_timeout: int | None = None,
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
        recoverable: hosts survive the death of one. JAX's default is
            fate-sharing: once the coordination service notices a dead
            process (its heartbeat timeout), it terminates all the others.
            With ``recoverable`` the engines set ``jax_enable_recoverability``
            before ``jax.distributed.initialize`` and use a heartbeat timeout
            of 10 s, so survivors stay inspectable (``%%mh`` runs on them)
            and `multihost.live_devices` reports them.
        heartbeat_timeout: seconds before the coordination service declares a
            silent process dead (default: 10 with ``recoverable``, else JAX's 100).
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
    if heartbeat_timeout is None and recoverable:
        heartbeat_timeout = _RECOVERABLE_HEARTBEAT
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
            client,
            engine_ids,
            coordinator,
            devices_per_process,
            'cpu',
            left,
            show,
            coordinator,
            recoverable=recoverable,
            heartbeat_timeout=heartbeat_timeout,
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
            n=n,
            devices_per_process=devices_per_process,
            progress=progress,
            recoverable=recoverable,
            heartbeat_timeout=heartbeat_timeout,
            **cluster_options,
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
