"""Sessions: one ipyparallel engine per host, one JAX process per engine.

A `Session` talks to engines only through ipyparallel. What runs on an engine
lives in `multihost.engine` (installed there); the notebook ships a
two-line trampoline (`_trampoline`) that imports and calls it, so nothing
typed by the user is evaluated except the code of a ``%%mh`` cell.

It calls engines, waits for them (naming dead hosts, turning Ctrl-C into an
interrupt of every host) and returns models (`multihost.Layout`,
`multihost.TreeDiff`, ...); it builds no widgets (`_views` does) and starts
no clusters (`_cluster` does, and hands it the `Engines` it started).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import re
import secrets
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mhnotebook._errors import (
    HostDiedError,
    HostGoneError,
    HostsError,
    InterruptReport,
    SessionError,
    SessionInterruptedError,
    SessionTimeoutError,
    fate_note,
    how_ended,
    processes_phrase,
)
from mhnotebook._interrupt import realign, settle, wait_idle
from mhnotebook._jobview import DataViewBase, Frame, echo_outputs
from mhnotebook._poll import Forget, Poll
from mhnotebook._trampoline import call as _call
from mhnotebook._trampoline import call_ns as _call_ns
from mhnotebook._trampoline import tool as _tool

__all__ = ['Engines', 'HostInfo', 'LocalEngines', 'Session']

log = logging.getLogger('mhnotebook')

if TYPE_CHECKING:  # the notebook imports jax (multihost) only when needed
    from multihost import ControlClient
    from multihost.engine.tools import Tool


def controller_url(client: Any) -> str | None:
    """The controller's registration URL as the client's connection info gives it."""
    # ipyparallel keeps the parsed connection info (urls filled in) on the client.
    config = getattr(client, '_config', None)
    url = config.get('registration') if isinstance(config, dict) else None
    return str(url) if url else None


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


class LocalEngines(Protocol):
    """What a session needs of a cluster it started itself (`_cluster.local.StartedCluster`)."""

    @property
    def options(self) -> dict[str, Any]:
        """The `start_local` arguments it was started with."""

    def exited(self, pid: int) -> bool:
        """Whether the engine with OS process id ``pid`` has ended."""

    def exit_code(self, pid: int, wait: float = 1.0) -> int | None:
        """That engine's exit code (negative: the signal), if known within ``wait`` seconds."""

    def stop(self) -> None:
        """Kills the engines and stops the cluster (and its watchdog)."""

    def left_running(self, wait: float = 3.0) -> list[int]:
        """Pids of its processes still alive after `stop` (empty: nothing left running)."""

    def relaunch(self, timeout: float) -> Engines:
        """A fresh cluster started with the same options."""


@dataclasses.dataclass(frozen=True)
class Engines:
    """Engines with JAX initialized on each: what a `Session` is made of.

    Attributes:
        client: the ipyparallel `Client`.
        processes: `HostInfo` per engine (any order).
        control_host: the address process 0's control endpoint listens on
            (None: process 0's address).
        local: the cluster, when the session started it (`start_local`).
    """

    client: Any
    processes: Sequence[HostInfo]
    control_host: str | None = None
    local: LocalEngines | None = None


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


#: The collectives library's connection report, one line per process the first time a
#: program spans processes on CPU devices (XLA's Gloo, through the engine's captured fd 1):
#: chatter above the lines that matter, never the user's own output or an error. Matched
#: anywhere, not at a line's start: the engine's pipe reader may forward it between a
#: ``print``'s text and its newline (the engine makes C's stdout line-buffered so that the
#: report comes whole: `multihost.engine.calls.initialize`).
_GLOO_CHATTER = re.compile(
    r'\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. '
    r'Expected number of connected peer ranks is : \d+\n?'
)


def _quiet(text: str) -> str:
    """``text`` without the collectives library's connection chatter (`_GLOO_CHATTER`)."""
    return _GLOO_CHATTER.sub('', text) if '[Gloo]' in text else text


_DEATH_GRACE = 3.0  # seconds the other hosts get to finish after one died
#: Seconds an engine tool's answer may come after the tool's own timeout (the wait for it).
_TOOL_MARGIN = 10.0
#: Seconds past a bounded call's own timeout before a host that has not answered is taken
#: to be busy with another task (its call still queued: then withdrawn).
_ANSWER_GRACE = 2.0
#: ``Session.barrier`` / ``%mh_barrier`` without a timeout: as the core's (`MULTIHOST_TIMEOUT`'s
#: default; an interrupt ends it sooner).
DEFAULT_BARRIER_TIMEOUT = 600.0


def _state(p: int, poll: Poll, died: dict[int, str]) -> str:
    """Process ``p``'s state in a wait: 'died', 'error', 'done' or 'running'."""
    if p in died:
        return 'died'
    if p in poll.failures:
        return 'error'
    return 'running' if p in poll.left else 'done'


def _positive_timeout(timeout: float | None, what: str = 'timeout') -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(
            f'{what} must be > 0 seconds (or None: no limit), got {timeout!r}; e.g. {what}=30'
        )


class Session(DataViewBase):
    """A set of hosts (ipyparallel engines) that each run one JAX process.

    A `JobView` (`_jobview`) with every feature: where, wavefront, flight_records,
    timeline and the step gate, read through process 0's control endpoint,
    plus what only engines can do (call, execute, gather, layout, diff...).

    Create one with `start_local` (simulated hosts on this machine) or
    `connect` (an existing ipyparallel cluster anywhere). Use it as a context
    manager or call `stop()`; sessions still running at interpreter exit are
    stopped. Making one starts process 0's control endpoint (once a cell
    hangs it is too late).

    Attributes:
        client: the ipyparallel `Client`.
        engine_ids: engine ids ordered by `jax.process_index()` (as reported
            by the engines; never assumed equal to engine ids).
        processes: `HostInfo` per process index.
    """

    kind = 'session'
    live = True

    client: Any
    processes: tuple[HostInfo, ...]
    engine_ids: list[int]

    def __init__(self, engines: Engines):
        self._lock = threading.Lock()
        _track(self)
        self._take_engines(engines)

    def _take_engines(self, engines: Engines) -> None:
        """Sets every attribute that belongs to one cluster; the only place they are set.

        Used by the constructor and by `restart`, which attaches fresh engines
        to this same object. Starts the hosts' debug threads and process 0's
        control endpoint; if that fails, stops the session and raises.
        """
        self.client = engines.client
        self.processes = tuple(sorted(engines.processes, key=lambda h: h.process_index))
        self.engine_ids = [h.engine_id for h in self.processes]
        self._local = engines.local
        self._stopped = False
        self._control: ControlClient | None = None
        self._control_address: tuple[str, int] | None = None
        self._control_key = secrets.token_bytes(16)
        self._dead: dict[int, str] = {}  # process index -> how its engine ended
        self._stepping = False  # last step-gate setting seen (the hosts are asked first)
        self._unaligned = False  # an interrupt left hosts busy: realign once they are idle
        self._gathers: Any = None  # a `_gather.GatherState`, made by the first gather
        self._forget = Forget(engines.client)  # results read leave ipyparallel's caches
        host = engines.control_host
        self._serve_control(self.processes[0].address if host is None else host)

    def _serve_control(self, host: str) -> None:
        # Up front: once a cell hangs, engine 0 can no longer be asked to start it.
        # It listens on ``host`` only: loopback for a local cluster, else the
        # address of process 0 this kernel reaches it at.
        try:
            # Every host's debug thread, so stacks and stepping reach hosts that
            # have not entered a collective yet.
            self.call('multihost.start_debug_daemon')
            address = self.call(
                'multihost.engine.serve_control', self._control_key, host, processes=[0]
            )[0]
            self._control_address = (str(address[0]), int(address[1]))
            self.control  # noqa: B018 - connects
        except Exception:
            self.stop()
            raise

    # -- basics ----------------------------------------------------------------
    @property
    def num_processes(self) -> int:
        return len(self.processes)

    @property
    def running(self) -> bool:
        return not self._stopped

    def __repr__(self) -> str:
        state = 'stopped' if self._stopped else f'{self.num_processes} hosts'
        kind = 'local' if self._local is not None else 'connected'
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
            raise HostGoneError(
                f'{processes_phrase(sorted(dead))} {"is" if len(dead) == 1 else "are"} gone{how}: '
                '%mh_cluster restart (session.restart()).',
                dead,
            )
        return [p for p in range(self.num_processes) if p not in dead]

    # -- dead hosts --------------------------------------------------------------
    @property
    def recoverable(self) -> bool:
        """Whether the hosts survive the death of one (``start_local(..., recoverable=True)``)."""
        return self._local is not None and bool(self._local.options.get('recoverable', False))

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
                exited = self._local is not None and self._local.exited(h.pid)
                if (ids is not None and h.engine_id not in ids) or exited:
                    self._dead[p] = how_ended(self._exit_code(p))
        return dict(self._dead)

    def _exit_code(self, p: int, wait: float = 1.0) -> int | None:
        """The exit code of process ``p``'s engine (local clusters only), if known."""
        if self._local is None:
            return None
        return self._local.exit_code(self.processes[p].pid, wait)

    def _fate_note(self, died: Sequence[int]) -> str:
        """What happens to the other hosts after ``died`` died."""
        others = [p for p in range(self.num_processes) if p not in died and p not in self._dead]
        heartbeat = (self._local.options if self._local else {}).get('heartbeat_timeout') or 100
        return fate_note(died, others, recoverable=self.recoverable, heartbeat=heartbeat)

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
            HostsError: the function raised on some hosts (``.failures``: each
                host's ``ename``, ``evalue`` and traceback).
            SessionError: some host did not answer within ``timeout``.
            HostGoneError: a host it needs is dead.
            HostDiedError: a host died while running it.
            SessionInterruptedError: the wait was interrupted (Ctrl-C); every host
                was sent SIGINT.
        """
        tramp = _call_ns if namespace else _call
        return self._run(tramp, qualname, args, kwargs, timeout, processes, on_done)

    def _call_tool(
        self,
        tool: Tool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        timeout: float,
        frame: Frame,
        processes: list[int] | None,
        on_done: Callable[[int], None] | None,
    ) -> list[Any]:
        # The transport hook (`DataViewBase`): the trampoline runs the registry's tool on each
        # engine, the namespace the engine's (``frame`` is None: `in_frame` refused others).
        del frame
        wait = timeout + _TOOL_MARGIN
        return self._run(_tool, tool.name, args, kwargs, wait, processes, on_done)

    def _run(
        self,
        tramp: Callable[..., Any],
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float,
        processes: Sequence[int] | None,
        on_done: Callable[[int], None] | None,
    ) -> list[Any]:
        """``tramp(name, *args, **kwargs)`` on the hosts, waited for (see `call`)."""
        pending = self._submit(tramp, name, args, kwargs, processes)
        try:
            return self._wait(pending, timeout, name, on_done)
        except SessionTimeoutError as exc:
            raise SessionTimeoutError(
                f'{name}: {self._withdraw(pending, exc.pending, timeout)}',
                pending=exc.pending,
                finished=exc.finished,
            ) from None
        finally:
            self._forget.retire(pending.values())

    def _submit(
        self,
        tramp: Callable[..., Any],
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        processes: Sequence[int] | None,
    ) -> dict[int, Any]:
        """Sends ``tramp(name, *args, **kwargs)`` (a trampoline: an installed function by
        its dotted name, or an engine tool by its name) to the hosts (all, or ``processes``)."""
        self._check(need_all=processes is None)
        if self._unaligned:
            self._realign_if_idle()
        procs = list(range(self.num_processes)) if processes is None else list(processes)
        if any(p in self._dead for p in procs):
            self._check()  # names the dead host(s)
        self._forget.purge()
        return {
            p: self.client[self.engine_ids[p]].apply_async(tramp, name, *args, **kwargs)
            for p in procs
        }

    def _withdraw(self, pending: dict[int, Any], left: Sequence[int], waited: float) -> str:
        """After a call timed out: withdraws it from the hosts ``left`` that have not run it
        (their engines are busy with another task, so it waits in their queues and would
        run there later, stale: ipyparallel aborts a queued task); the sentence saying so
        and what those hosts run."""
        for p in left:
            try:
                pending[p].abort()
            except Exception:  # started meanwhile, or done: nothing queued to withdraw
                pass
        self._unaligned = True  # the others' collective count moved on: realign once idle
        return (
            f'{processes_phrase(left)} did not answer within {waited:g} s: '
            f'{self.busy_note(left)}; the call was withdrawn there, so it never runs late '
            '(%mh_where shows where they are).'
        )

    def busy_note(self, processes: Sequence[int]) -> str:
        """``process 3 is busy in Cell In[4], line 2`` (its innermost user frame, asked of its
        debug thread, which answers while the engine is busy), or why that is unknown."""
        try:
            stacks = self.where(timeout=3.0)
        except Exception as exc:  # no control endpoint, or it did not answer
            return f'busy or stuck (where they are is unknown: {exc})'
        parts = []
        for p in processes:
            st = stacks.get(p)
            if st is None or getattr(st, 'error', None):
                parts.append(f'process {p} is busy or stuck (its stacks did not come)')
            else:
                parts.append(f'process {p} is busy in {st.where}')
        return '; '.join(parts)

    def _wait(
        self,
        pending: dict[int, Any],
        timeout: float,
        what: str,
        on_done: Callable[[int], None] | None = None,
        on_tick: Callable[[dict[int, str], float], None] | None = None,
    ) -> list[Any]:
        """The results of ``pending`` (process index -> AsyncResult) by process index.

        Raises, in this order: `HostDiedError` (a host died meanwhile), `SessionTimeoutError`
        (some did not answer within ``timeout``), `HostsError` (some raised).
        """
        poll, died = self._collect(pending, timeout, on_done, on_tick)
        if died:
            raise self._died(poll, died, what)
        if poll.left:
            raise SessionTimeoutError(
                f'{what}: host(s) {sorted(poll.left)} did not answer within {timeout:g} s. '
                'They may be stuck in a collective: look with session.where() '
                '(%mh_where), or restart with session.restart() (%mh_cluster restart).',
                pending=sorted(poll.left),
                finished=sorted(set(pending) - set(poll.left)),
            )
        if poll.failures:
            first = min(poll.failures)
            raise HostsError(
                f'{what} failed on host(s) {sorted(poll.failures)}; host {first}:\n'
                f'{poll.failures[first].text}',
                poll.failures,
            )
        return [poll.results[p] for p in sorted(poll.results)]

    def _collect(
        self,
        pending: dict[int, Any],
        timeout: float,
        on_done: Callable[[int], None] | None,
        on_tick: Callable[[dict[int, str], float], None] | None,
    ) -> tuple[Poll, dict[int, str]]:
        """Waits for ``pending``: the `Poll` and the hosts that died meanwhile (how).

        A host whose engine died is taken out of the failures; the others then
        get `_DEATH_GRACE` seconds, not forever (they may be waiting for it in
        a collective). Ctrl-C interrupts every host still running.
        """
        died: dict[int, str] = {}

        def ready(p: int) -> None:
            failure = poll.failures.get(p)
            if failure is not None and failure.engine_died:
                del poll.failures[p]
                died[p] = self._dead.setdefault(p, how_ended(self._exit_code(p)))
                poll.deadline = min(poll.deadline, time.monotonic() + _DEATH_GRACE)
            if on_done is not None:
                on_done(p)

        def tick(elapsed: float) -> None:
            if on_tick is not None:
                on_tick({p: _state(p, poll, died) for p in pending}, elapsed)

        poll = Poll(pending, timeout, on_ready=ready, on_tick=None if on_tick is None else tick)
        try:
            poll.run()
        except KeyboardInterrupt:
            # The kernel was interrupted (Jupyter's stop button, Ctrl-C): stop the hosts too.
            raise SessionInterruptedError(self.interrupt(pending=poll.left)) from None
        return poll, died

    def _died(self, poll: Poll, died: dict[int, str], what: str) -> HostDiedError:
        """The error for hosts that died while running ``what`` (how, who still runs it)."""
        known = {p: how for p, how in died.items() if how != 'died'}
        if len(died) == 1:
            how = f' ({known[min(died)]})' if known else ''
        else:
            how = ' (' + '; '.join(f'{p}: {h}' for p, h in sorted(known.items())) + ')'
            how = how if known else ''
        still = f' {processes_phrase(sorted(poll.left))} still running it.' if poll.left else ''
        return HostDiedError(
            f'{processes_phrase(sorted(died))} died{how} while running {what}.{still}'
            + self._fate_note(list(died)),
            died=died,
            finished=sorted(poll.results),
            pending=sorted(poll.left),
            failures=poll.failures,
        )

    def _run_cell(
        self,
        code: str,
        timeout: float | None,
        outputs: dict[int, str],
        on_status: Callable[[dict[int, str], float], None] | None,
    ) -> None:
        # The cell hook (`DataViewBase.execute`): ipyparallel's execute on every engine,
        # waited for until it ends when ``timeout`` is None.
        self._collect_outputs(self.execute_async(code), timeout, outputs, on_status)

    def push(self, values: dict[str, Any], *, per_process: bool = False) -> None:
        """Sets variables on every host (``per_process``: each value is a list by process)."""
        self._check()
        for p, e in enumerate(self.engine_ids):
            ns = {k: (v[p] if per_process else v) for k, v in values.items()}
            self.client[e].push(ns, block=True)

    def execute_async(self, code: str) -> dict[int, Any]:
        """Starts ``code`` on every host and returns at once: process index -> AsyncResult.

        Used while stepping, so the notebook stays free to release steps.
        Collect with `wait_outputs`. In a recoverable session with dead
        hosts, runs on the live ones.
        """
        live = self._check(need_all=not self.recoverable)
        if self._unaligned:
            self._realign_if_idle()
        self._forget.purge()
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
        outputs: dict[int, str] = {}
        try:
            self._collect_outputs(pending, timeout, outputs, on_status)
        finally:
            if echo:
                echo_outputs(outputs)
        return outputs

    def _collect_outputs(
        self,
        pending: dict[int, Any],
        timeout: float | None,
        outputs: dict[int, str],
        on_status: Callable[[dict[int, str], float], None] | None,
    ) -> None:
        """Waits for a cell's ``pending`` results (None: until done), filling ``outputs``
        with what each finished host printed, also when the wait raises."""
        try:
            self._wait(
                pending,
                float('inf') if timeout is None else timeout,
                'this cell',
                on_tick=on_status,
            )
        finally:
            for p, ar in pending.items():
                if ar.ready():
                    if p not in self._dead:
                        # The reply can come before the last output message (a dead
                        # engine sends no more).
                        ar.wait_for_output(5.0)
                    outputs[p] = _quiet(''.join(getattr(ar, 'stdout', '') or ''))
            self._forget.retire(pending.values())

    # -- the data tools' hooks (`DataViewBase`: allgather, layout, diff, nonfinite...) ---------
    def _gather_where(self) -> tuple[str | None, list[str]]:
        self._check()
        return controller_url(self.client), [h.machine for h in self.processes]

    def barrier(self, name: str, *, timeout: float | None = None) -> dict[int, dict[str, Any]]:
        """Runs a `multihost.barrier` on every host; per process index what happened.

        Each result has ``ok``, ``elapsed`` (seconds) and, on failure, ``error``
        and ``message`` (plus ``missing`` or ``names``).
        """
        _positive_timeout(timeout)
        # Every host's barrier is bounded by ``timeout``: a host not answering a few seconds
        # after it never ran it (its engine is busy with another task).
        wait = _ANSWER_GRACE + (timeout if timeout is not None else DEFAULT_BARRIER_TIMEOUT)
        pending = self._submit(_call, 'multihost.engine.barrier', (name, timeout), {}, None)
        try:
            return dict(zip(sorted(pending), self._wait(pending, wait, 'barrier')))
        except SessionTimeoutError as exc:
            note = self._withdraw(pending, exc.pending, wait)
            out = {p: pending[p].get(0) for p in exc.finished}
            for p in exc.pending:
                out[p] = dict(ok=False, error='busy', message=note, elapsed=wait, busy=True)
            return dict(sorted(out.items()))
        finally:
            self._forget.retire(pending.values())

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

    # -- the job view's hooks (`_jobview.JobViewBase`: where, wavefront, flight_records, timeline,
    # the step gate) ---------------------------------------------------------------------------
    def _process_count(self) -> int:
        return self.num_processes

    def _is_running(self) -> bool:
        return not self._stopped

    def _endpoint(self) -> ControlClient:
        # A recoverable session answers without its dead hosts (named in the answers).
        self._check(need_all=not self.recoverable)
        return self.control

    def _gone(self) -> dict[int, str]:
        """Dead hosts (a recoverable session goes on without them) -> why: nobody waits for them."""
        return {p: 'gone' if how == 'died' else f'gone ({how})' for p, how in self.dead.items()}

    def _hosts_idle(self) -> bool:
        return not self._busy(self._check(), None, 0.0)

    def _stop_held(self) -> None:
        self.interrupt()  # hosts held at the gate raise KeyboardInterrupt

    # -- interrupts --------------------------------------------------------------
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
            where = self.control.where(timeout=2.0)
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
            settle(self.client, self._engines_of(live), deadline + 5.0)
            self._unaligned = False
            position = realign(self.call, live)
        return InterruptReport(
            stopped=tuple(p for p in live if p not in busy),
            running=tuple(busy),
            where=where,
            position=position,
            seconds=seconds,
            waited=timeout,
            finished=tuple(p for p in live if pending is not None and p not in pending),
        )

    def _engines_of(self, processes: Sequence[int]) -> dict[int, int]:
        return {p: self.engine_ids[p] for p in processes}

    def _busy(
        self, processes: list[int], pending: dict[int, Any] | None, deadline: float
    ) -> list[int]:
        """Waits until ``processes`` are idle (or ``deadline``); the ones still busy."""
        return wait_idle(
            self.client, self._engines_of(processes), pending, deadline, lambda: self.dead
        )

    def _realign_if_idle(self) -> None:
        """Realigns after an interrupt that left hosts busy, once every host is idle."""
        live = self._check(need_all=False)
        if not self._busy(live, None, 0.0):
            self._unaligned = False
            settle(self.client, self._engines_of(live), time.monotonic() + 5.0)
            realign(self.call, live)

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

    def stop(self) -> str:
        """Stops the session: closes the client, and stops the cluster if this session started it.

        Idempotent.

        Returns:
            One line saying what was stopped and whether anything is left running
            (``%mh_cluster stop`` prints it).
        """
        with self._lock:
            if self._stopped:
                return 'the session was stopped already: nothing of it is running.'
            self._stopped = True
        n, d = self.shape
        what = f'{n} process{"es" * (n != 1)} x {d} device{"s" * (d != 1)}'
        _live_sessions.discard(self)
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._gathers is not None:
            self._gathers.close()
        try:
            self.client.close()
        except Exception:
            pass
        if self._local is None:
            return (
                f'disconnected from the cluster of {what}; its engines were started elsewhere '
                'and keep running (stop them with the launcher that started them).'
            )
        self._local.stop()  # engines, cluster, and the watchdog
        left = self._local.left_running()
        if left:
            pids = ' '.join(map(str, left))
            return f'stopped the cluster of {what}, but pids {pids} still run: kill -9 {pids}'
        return (
            f'stopped the cluster of {what}: its engines, controller and watchdog ended; '
            'nothing of it is left running.'
        )

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

    def restart(self, *, timeout: float = 180.0) -> Session:
        """Replaces every engine by a fresh one (JAX cannot re-initialize in place).

        The session stays the same object: the fresh engines are attached to
        it (`_take_engines` resets every per-cluster attribute), so whoever holds it
        (a variable, the magics) keeps working. Only for sessions made by
        `start_local`; for a connected cluster, restart its engines with your
        launcher and `connect` again.
        """
        local = self._local
        if local is None:
            raise SessionError(
                'restart() works for sessions made by start_local; for a '
                'connected cluster restart the engines with its launcher '
                'and call mhnotebook.connect(...) again.'
            )
        self.stop()
        self._take_engines(local.relaunch(timeout))
        _track(self)
        return self
