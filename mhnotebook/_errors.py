"""What goes wrong in a session, as exceptions and records (no ipyparallel, no jax).

Remote errors arrive structured: ipyparallel's `RemoteError` carries the
exception's class name (``ename``), message (``evalue``), traceback and the
engine it came from (``engine_info``); `RemoteFailure.from_exception` keeps
those fields per host, and nothing is parsed back out of traceback text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from multihost._text import fmt_hosts

__all__ = [
    'HostDiedError',
    'HostGoneError',
    'HostsError',
    'InterruptReport',
    'RemoteFailure',
    'SessionError',
    'SessionInterruptedError',
    'SessionTimeoutError',
    'fate_note',
    'how_ended',
]


@dataclasses.dataclass(frozen=True)
class RemoteFailure:
    """One host's failure, as ipyparallel reported it.

    Attributes:
        process: the host's process index.
        ename: the exception's class name (``'GatherError'``,
            ``'KeyboardInterrupt'``; ``'EngineError'`` when the engine died).
        evalue: the exception's message.
        traceback: the host's formatted traceback ('' when there is none).
        engine_id: the ipyparallel engine id it came from, if known.
    """

    process: int
    ename: str
    evalue: str
    traceback: str = ''
    engine_id: int | None = None

    @classmethod
    def from_exception(cls, process: int, exc: BaseException) -> RemoteFailure:
        """The record of ``exc``, a result's error for process ``process``.

        A `RemoteError` gives its ``ename``, ``evalue``, ``traceback`` and
        ``engine_info``; any other exception (raised in this process, such as
        ipyparallel's ``TaskAborted`` or a local ``EngineError``) its class
        name and message.
        """
        ename = getattr(exc, 'ename', None)
        if ename is None:
            return cls(process, type(exc).__name__, str(exc))
        info = getattr(exc, 'engine_info', None) or {}
        engine = info.get('engine_id')
        return cls(
            process,
            str(ename),
            str(getattr(exc, 'evalue', '') or ''),
            str(getattr(exc, 'traceback', '') or ''),
            engine if isinstance(engine, int) else None,
        )

    @property
    def summary(self) -> str:
        """``'ename: evalue'``."""
        return f'{self.ename}: {self.evalue}'

    @property
    def text(self) -> str:
        """The traceback, or the summary when there is none (for display)."""
        return self.traceback or self.summary

    @property
    def engine_died(self) -> bool:
        """Whether it says the host's engine died (not that its code raised)."""
        return self.ename == 'EngineError'


class SessionError(RuntimeError):
    """A session could not start, connect, or reach its engines (the message says what to do)."""


class SessionTimeoutError(SessionError, TimeoutError):
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
        failures: process index -> that host's `RemoteFailure` (``ename``,
            ``evalue``, ``traceback``).
        errors: process index -> that host's error text (its traceback), for display.
    """

    def __init__(self, message: str, failures: Mapping[int, RemoteFailure]):
        super().__init__(message)
        self.failures: dict[int, RemoteFailure] = dict(failures)
        self.errors: dict[int, str] = {p: f.text for p, f in self.failures.items()}


class HostDiedError(SessionError):
    """A host's engine process ended while it was running work of this session.

    Attributes:
        died: process index -> how it ended (``'exit code 1'``, ``'signal 9'``
            or ``'died'`` when the launcher does not know).
        finished: process indices that finished the work.
        pending: process indices still running it (left running).
        failures: process index -> `RemoteFailure`, for hosts where the work raised.
        errors: process index -> error text, for hosts where the work raised.
    """

    def __init__(
        self,
        message: str,
        died: dict[int, str],
        finished: list[int],
        pending: list[int],
        failures: Mapping[int, RemoteFailure],
    ):
        super().__init__(message)
        self.died, self.finished, self.pending = died, finished, pending
        self.failures: dict[int, RemoteFailure] = dict(failures)
        self.errors: dict[int, str] = {p: f.text for p, f in self.failures.items()}


class HostGoneError(SessionError):
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
        finished: among ``stopped``, the hosts whose part of the interrupted work had
            already finished when the interrupt came (known when the work is).
    """

    stopped: tuple[int, ...]
    running: tuple[int, ...]
    where: dict[int, Any] | None
    position: int | None
    seconds: float
    waited: float
    finished: tuple[int, ...] = ()

    @property
    def message(self) -> str:
        """One line: who stopped, who did not and what to do about it."""
        worked = [p for p in self.stopped if p not in self.finished]
        if worked or not self.stopped:
            text = f'interrupted: {fmt_hosts(worked)} stopped'
        else:
            text = 'interrupted: nothing was running'
        if not self.running:
            text += f' in {self.seconds:.1f} s' if worked else ''
        done = f' ({fmt_hosts(self.finished)} had already finished)' if worked else ''
        text += done if self.finished else ''
        if not self.running:
            return text + '.'
        return (
            text + f'; {fmt_hosts(self.running)} did not stop within {self.waited:g} s '
            '(blocked in native code such as a device collective, which SIGINT cannot '
            'interrupt): %mh_cluster restart (session.restart()).'
        )


class SessionInterruptedError(SessionError):
    """The notebook was interrupted while it waited; every host was sent SIGINT.

    Attributes:
        report: the `InterruptReport`.
    """

    def __init__(self, report: InterruptReport):
        super().__init__(report.message)
        self.report = report


def how_ended(code: int | None) -> str:
    """An exit code (negative: the signal that killed it) as ``'exit code 1'`` / ``'signal 9'``."""
    if code is None:
        return 'died'
    return f'signal {-code}' if code < 0 else f'exit code {code}'


def fate_note(
    died: Sequence[int], others: Sequence[int], *, recoverable: bool, heartbeat: float
) -> str:
    """What happens to the ``others`` (still alive) after ``died`` died."""
    if not others:
        return ''
    if 0 in died:
        return (
            " Process 0 ran JAX's coordination service: "
            f'{fmt_hosts(others)} can run no more collectives'
            ' (and are terminated unless the session is recoverable): '
            '%mh_cluster restart.'
        )
    if recoverable:
        return (
            f' {fmt_hosts(others).capitalize()} {"keeps" if len(others) == 1 else "keep"} '
            'running (recoverable): %%mh runs there '
            'and multihost.live_devices(jax.devices()) reports the survivors; '
            '%mh_cluster restart for a whole cluster again.'
        )
    return (
        f" With JAX's default fate-sharing the coordination service will terminate "
        f'{fmt_hosts(others)} too (within about {heartbeat:g} s, its heartbeat timeout): '
        '%mh_cluster restart; start with --recoverable '
        '(start_local(..., recoverable=True)) to keep survivors inspectable.'
    )
