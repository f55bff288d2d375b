"""Sessions: one ipyparallel engine per host, one JAX process per engine.

A `Session` talks to engines only through ipyparallel. What runs on an engine
lives in `multihost.engine` (installed there); the notebook ships a
two-line trampoline (`_trampoline`) that imports and calls it, so nothing
typed by the user is evaluated except the code of a ``%%mh`` cell.

It calls engines and waits for them (naming dead hosts, turning Ctrl-C into an
interrupt of every host); its data tools (`multihost.Layout`, `multihost.TreeDiff`,
...) are `_jobview.DataView`'s, over this class's transport hook (`_call_tool`:
the registry's engine tools through the trampoline); its life (the engines it is
made of, dead hosts, interrupts, stop and restart) is `_lifecycle.SessionLife`. It
builds no widgets (`_views` does) and starts no clusters (`_cluster` does, and hands
it the `Engines` it started).
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mhnotebook._errors import (
    HostsError,
    SessionInterruptedError,
    SessionTimeoutError,
    how_ended,
)
from mhnotebook._jobview import DataView, Frame, echo_outputs, seconds
from mhnotebook._lifecycle import Engines, HostInfo, LocalEngines, SessionLife, _track
from mhnotebook._poll import Forget, Poll
from mhnotebook._trampoline import call as _call
from mhnotebook._trampoline import call_ns as _call_ns
from mhnotebook._trampoline import tool as _tool
from multihost._text import fmt_hosts

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


#: The collectives library's connection report, one line per process the first time a
#: program spans processes on CPU devices (XLA's Gloo, through the engine's captured fd 1):
#: chatter above the lines that matter, never the user's own output or an error. Matched
#: anywhere, not at a line's start: the engine's pipe reader may forward it between a
#: ``print``'s text and its newline (the engine makes C's stdout line-buffered so that the
#: report comes whole: `multihost.engine.start.initialize`).
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


class Session(SessionLife, DataView):
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

    def __repr__(self) -> str:
        state = 'stopped' if self._stopped else f'{self.num_processes} processes'
        kind = 'local' if self._local is not None else 'connected'
        return f'<mhnotebook.Session {kind}, {state}, engines {self.engine_ids}>'

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
        # The transport hook (`DataView`): the trampoline runs the registry's tool on each
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
            f'{fmt_hosts(left)} did not answer within {waited:g} s: '
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
                f'{what}: {fmt_hosts(sorted(poll.left))} did not answer within '
                f'{timeout:g} s. They may be stuck in a collective: look with session.where() '
                '(%mh_where), or restart with session.restart() (%mh_cluster restart).',
                pending=sorted(poll.left),
                finished=sorted(set(pending) - set(poll.left)),
            )
        if poll.failures:
            first = min(poll.failures)
            raise HostsError(
                f'{what} failed on {fmt_hosts(sorted(poll.failures))}; process {first}:\n'
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

    def _run_cell(
        self,
        code: str,
        timeout: float | None,
        outputs: dict[int, str],
        on_status: Callable[[dict[int, str], float], None] | None,
    ) -> None:
        # The cell hook (`DataView.execute`): ipyparallel's execute on every engine,
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
        seconds(timeout)  # None: no limit
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

    # -- the data tools' hooks (`DataView`: allgather, layout, diff, nonfinite...) ---------
    def _gather_where(self) -> tuple[str | None, list[str]]:
        self._check()
        return controller_url(self.client), [h.machine for h in self.processes]

    def barrier(self, name: str, *, timeout: float | None = None) -> dict[int, dict[str, Any]]:
        """Runs a `multihost.barrier` on every host; per process index what happened.

        Each result has ``ok``, ``elapsed`` (seconds) and, on failure, ``error``
        and ``message`` (plus ``missing`` or ``names``).
        """
        seconds(timeout)  # None: no limit
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

    # -- the job view's hooks (`_jobview.JobView`: where, wavefront, flight_records, timeline,
    # the step gate) ---------------------------------------------------------------------------
    def _endpoint(self) -> ControlClient:
        # A recoverable session answers without its dead hosts (named in the answers).
        self._check(need_all=not self.recoverable)
        return self.control

    def _gone(self) -> dict[int, str]:
        """Dead hosts (a recoverable session goes on without them) -> why: nobody waits for them."""
        return {p: 'gone' if how == 'died' else f'gone ({how})' for p, how in self.dead.items()}

    def _hosts_idle(self) -> bool:
        return not self._busy(self._check(), None, 0.0)

    def _stop_paused(self) -> None:
        self.interrupt()  # hosts paused at the gate raise KeyboardInterrupt
