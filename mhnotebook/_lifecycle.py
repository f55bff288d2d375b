"""A session's life: the engines it is made of, who died, interrupts, stop and restart.

`SessionLife` is the part of a `Session` (`_session`) that is not calling tools: the
cluster it holds (`Engines`, `HostInfo`, a `LocalEngines` it started), whether it is
stopped or a host is dead (`_check`, `dead`, `recoverable`, `_died`: the error of a
death mid-call), interrupting every host (`interrupt`: SIGINT, the wait until they
stopped, the realignment of their collective counts), and the lifecycle (`status`,
`stop`, `shape`, `reuse`, `restart`; sessions still running at interpreter exit are
stopped). A `Session` gives it `call`, `control` and `_take_engines`.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self

from mhnotebook._errors import (
    HostDiedError,
    HostGoneError,
    InterruptReport,
    SessionError,
    fate_note,
    how_ended,
)
from mhnotebook._interrupt import realign, settle, wait_idle
from multihost._text import fmt_hosts

if TYPE_CHECKING:
    from mhnotebook._poll import Poll
    from multihost import ControlClient

__all__ = ['Engines', 'HostInfo', 'LocalEngines', 'SessionLife']

log = logging.getLogger('mhnotebook')


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


_live_sessions: weakref.WeakSet[SessionLife] = weakref.WeakSet()
_atexit_registered = False


def _track(session: SessionLife) -> None:
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


class SessionLife:
    """A session's life (see the module docstring): a mixin of `Session`, which sets the
    attributes below (`Session._take_engines`) and gives `call`, `control`, `_take_engines`."""

    client: Any
    processes: tuple[HostInfo, ...]
    engine_ids: list[int]
    _local: LocalEngines | None
    _lock: threading.Lock
    _stopped: bool
    _dead: dict[int, str]
    _unaligned: bool
    _control: ControlClient | None
    _gathers: Any

    # -- what a `Session` gives ------------------------------------------------------------
    def call(self, qualname: str, *args: Any, **kwargs: Any) -> list[Any]:
        raise NotImplementedError

    @property
    def control(self) -> ControlClient:
        raise NotImplementedError

    def _take_engines(self, engines: Engines) -> None:
        raise NotImplementedError

    @property
    def num_processes(self) -> int:
        return len(self.processes)

    @property
    def running(self) -> bool:
        return not self._stopped

    def __enter__(self) -> Self:
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
                f'{fmt_hosts(sorted(dead))} {"is" if len(dead) == 1 else "are"} gone{how}: '
                '%mh_cluster restart (session.restart()).',
                dead,
            )
        return [p for p in range(self.num_processes) if p not in dead]

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

    def _died(self, poll: Poll, died: dict[int, str], what: str) -> HostDiedError:
        """The error for hosts that died while running ``what`` (how, who still runs it)."""
        known = {p: how for p, how in died.items() if how != 'died'}
        if len(died) == 1:
            how = f' ({known[min(died)]})' if known else ''
        else:
            how = ' (' + '; '.join(f'{p}: {h}' for p, h in sorted(known.items())) + ')'
            how = how if known else ''
        still = f' {fmt_hosts(sorted(poll.left))} still running it.' if poll.left else ''
        return HostDiedError(
            f'{fmt_hosts(sorted(died))} died{how} while running {what}.{still}'
            + self._fate_note(list(died)),
            died=died,
            finished=sorted(poll.results),
            pending=sorted(poll.left),
            failures=poll.failures,
        )

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
        have = f'a {kind}cluster of {self.shape[0]} processes x {self.shape[1]} devices'
        if self.shape != want or self.recoverable != bool(recoverable):
            asked = f'{want[0]} x {want[1]}{" recoverable" if recoverable else ""}'
            raise SessionError(
                f'{have} is running, not {asked}: %mh_cluster stop it first, then start '
                '(or %mh_cluster restart to restart the running one as it is).'
            )
        self._check()  # a dead host: restart, do not reuse
        return (
            f'%mh_cluster: reusing the running {have[2:]} '
            '(%mh_cluster restart for fresh processes).'
        )

    def restart(self, *, timeout: float = 180.0) -> Self:
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
