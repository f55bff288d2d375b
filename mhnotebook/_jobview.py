"""One protocol for every job view: a `Session`, an `AttachedJob` and a `PostMortem`.

The three answer the same questions about a multi-host job: where every host
is (`JobView.where`), how far each got (`wavefront`), its flight records and
their `timeline`, and the step gate (`step_table`, `set_stepping`,
`release`, `release_all`, `moved_on`, `stop_stepping`). `JobView` is the
type the views (`_views`) and magics take; `JobViewBase` implements it once
over a few hooks, so the three classes differ only where they really do:

* where the answers come from: `_endpoint` (a live job's control endpoint;
  a `PostMortem` overrides the read hooks `_stacks`, `_wavefront`,
  `_records` to read its dump files instead);
* who is known to be gone (`_gone`: a recoverable session's dead hosts, not
  waited for), how a connection that broke mid-question reads
  (`_answering`: an attached job says its job is gone), whether every host is
  idle (`_hosts_idle`: a session knows its engines' queues) and what Stop
  does beyond turning the gate off (`_stop_held`: a session interrupts).

What a view can do is its `features` (`supports`): a read-only view (a
post-mortem) has no ``'step'``, and every stepping call raises one line,
`UnsupportedError`, saying why and what to use instead. Further tools
(gathers, layouts, diffs) join as features of their own, refused the same
way by views that lack them.

`moved_on` (the wait after Step or Continue) lives here too: stepping's own
loop, shared by every view that steps.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from mhnotebook._errors import SessionError

if TYPE_CHECKING:
    from multihost import (
        AuditReport,
        ControlClient,
        EnvDiff,
        FlightRecord,
        HostStacks,
        Layout,
        MemoryCensus,
        NonfiniteReport,
        ReplicaReport,
        StepTable,
        Timeline,
        TreeDiff,
        TreeLayout,
        Wavefront,
    )

__all__ = [
    'DataView',
    'FEATURES',
    'JobView',
    'JobViewBase',
    'OLD_FEATURES',
    'UnsupportedError',
    'moved_on',
]

log = logging.getLogger('mhnotebook')

#: The features a job view may have, by the methods that need them:
#: ``'where'``, ``'wavefront'``, ``'flight_records'`` (and `JobView.timeline`, built
#: from them) read; ``'step'`` is the step gate (`JobView.step_table`,
#: `set_stepping`, `release`, `release_all`, `moved_on`, `stop_stepping`); ``'data'`` are
#: the data tools of a `DataView` (`allgather`, `layout`, `diff`, `nonfinite`, `env_diff`,
#: `memory_census`), answered by live hosts.
FEATURES = ('where', 'wavefront', 'flight_records', 'step', 'data')
#: Features' old names `JobView.supports` still takes.
OLD_FEATURES = {'records': 'flight_records'}

#: Seconds a live view waits for the hosts' answers unless told otherwise.
ANSWER_TIMEOUT = 10.0


class UnsupportedError(SessionError):
    """A job view was asked for what it cannot do (a post-mortem cannot step).

    One line: what was asked, why this view cannot, what to use instead.

    Attributes:
        feature: the feature asked for (one of `FEATURES`).
        kind: the view's kind (``'post-mortem'``, ...).
    """

    def __init__(self, message: str, feature: str = '', kind: str = ''):
        super().__init__(message)
        self.feature = feature
        self.kind = kind


@runtime_checkable
class JobView(Protocol):
    """What every job view answers (`Session`, `AttachedJob`, `PostMortem`).

    Attributes:
        kind: ``'session'``, ``'attached job'`` or ``'post-mortem'`` (for messages).
        features: what it can do (see `FEATURES`); `supports` asks.
        live: the answers come from running hosts (False: from files).
    """

    kind: ClassVar[str]
    features: ClassVar[frozenset[str]]
    live: ClassVar[bool]

    @property
    def num_processes(self) -> int:
        """The job's process count."""
        ...

    @property
    def running(self) -> bool:
        """Whether it still reaches the hosts (a post-mortem never does)."""
        ...

    def supports(self, feature: str) -> bool: ...

    def where(self, *, timeout: float = ANSWER_TIMEOUT) -> dict[int, HostStacks]: ...

    def wavefront(self, *, timeout: float = ANSWER_TIMEOUT) -> Wavefront: ...

    def flight_records(
        self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT
    ) -> dict[int, list[FlightRecord]]: ...

    def records(
        self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT
    ) -> dict[int, list[FlightRecord]]: ...  # the old name of flight_records

    def timeline(self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT) -> Timeline: ...

    def audit(self, *, timeout: float = ANSWER_TIMEOUT) -> AuditReport: ...

    def step_table(self) -> StepTable: ...

    @property
    def stepping(self) -> bool: ...

    def set_stepping(self, on: bool) -> None: ...

    def release(self, steps: int = 1) -> tuple[int, ...]: ...

    def release_all(self) -> tuple[int, ...]: ...

    def moved_on(self, before: StepTable, timeout: float = 3.0) -> StepTable: ...

    def stop_stepping(self) -> StepTable: ...


@runtime_checkable
class DataView(JobView, Protocol):
    """A job view whose hosts answer the data tools (feature ``'data'``): a `Session`
    (its engines) and an `AttachedJob` (each host's held frame); the data views
    (`mhnotebook._views`: layout, diff, non-finite, env, memory) take one. A post-mortem
    has none: its hosts are gone.
    """

    def call(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Runs an engine function (``'multihost.engine.gather_local'``...) on the hosts."""
        ...

    def allgather(
        self, name: str, *, timeout: float = 600.0, max_bytes: int | None = None
    ) -> Any: ...

    def layout(
        self, name: str, *, check: bool = True, timeout: float = 120.0
    ) -> tuple[Layout | TreeLayout, ReplicaReport | None]: ...

    def diff(self, name: str, *, timeout: float = 120.0) -> TreeDiff: ...

    def nonfinite(self, name: str, *, timeout: float = 120.0) -> NonfiniteReport: ...

    def env_diff(self, *, timeout: float = 120.0) -> EnvDiff: ...

    def memory_census(self, *, timeout: float = 120.0) -> MemoryCensus: ...


def _check_timeout(timeout: float) -> float:
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f'timeout must be > 0 seconds, got {timeout!r}; e.g. timeout=30')
    return float(timeout)


class JobViewBase:
    """`JobView` implemented once; the classes give the hooks (see the module docstring).

    A subclass sets `kind`, `features` and `live`, and gives `_endpoint` (or,
    read-only, overrides `_stacks`, `_wavefront` and `_records`) and
    `_process_count`.
    """

    kind: ClassVar[str] = 'job'
    features: ClassVar[frozenset[str]] = frozenset(FEATURES)
    live: ClassVar[bool] = True
    #: The step gate's last setting seen (the hosts are asked first).
    _stepping: bool = False

    # -- hooks ----------------------------------------------------------------------------
    def _process_count(self) -> int:
        raise NotImplementedError

    def _is_running(self) -> bool:
        raise NotImplementedError

    def _endpoint(self) -> ControlClient:
        """The control endpoint, after the view's own checks (stopped, dead hosts...)."""
        raise NotImplementedError

    def _gone(self) -> dict[int, str]:
        """Hosts known to be gone -> why: named in the answers, not waited for."""
        return {}

    def _answering(self) -> AbstractContextManager[None]:
        """Wraps every question to the hosts (turns a broken connection into one line)."""
        return contextlib.nullcontext()

    def _hosts_idle(self) -> bool:
        """Whether every host is known idle (a cell ran to its end): `moved_on` stops."""
        return False

    def _stop_held(self) -> None:
        """What Stop does to the hosts held at the gate before stepping goes off."""

    def _unsupported(self, feature: str) -> str:
        """Why this view lacks ``feature`` and what to use instead (one line)."""
        return f'a {self.kind} cannot do {feature!r}'

    def _require(self, feature: str) -> None:
        if feature not in self.features:
            raise UnsupportedError(self._unsupported(feature), feature, self.kind)

    # -- reads (hooks a read-only view overrides) -------------------------------------------
    def _stacks(self, timeout: float) -> dict[int, HostStacks]:
        with self._answering():
            return self._endpoint().where(timeout=timeout, gone=self._gone())

    def _wavefront(self, timeout: float) -> Wavefront:
        with self._answering():
            return self._endpoint().wavefront(timeout=timeout, gone=self._gone())

    def _records(self, last: int, timeout: float) -> dict[int, list[FlightRecord]]:
        with self._answering():
            return self._endpoint().flight_records(last=last, timeout=timeout, gone=self._gone())

    def _audit(self, timeout: float) -> AuditReport:
        with self._answering():
            return self._endpoint().audit(timeout=timeout)

    # -- the protocol -----------------------------------------------------------------------
    def supports(self, feature: str) -> bool:
        """Whether this view has ``feature`` (one of `FEATURES`)."""
        feature = OLD_FEATURES.get(feature, feature)
        if feature not in FEATURES:
            raise ValueError(f'unknown feature {feature!r}; one of {", ".join(FEATURES)}')
        return feature in self.features

    def audit(self, *, timeout: float = ANSWER_TIMEOUT) -> AuditReport:
        """What the job's audit (``multihost run --audit``) found: `multihost.AuditReport`
        (``enabled`` False for a job run without it)."""
        return self._audit(_check_timeout(timeout))

    def where(self, *, timeout: float = ANSWER_TIMEOUT) -> dict[int, HostStacks]:
        """Per process index: its Python stacks and current collective (`multihost.HostStacks`).

        A live view asks every host's debug thread through the control
        endpoint, so it works while every main thread is busy or hung; hosts
        that do not answer within ``timeout`` seconds are named, not waited
        for. A post-mortem returns what the hosts dumped (``timeout`` waits
        for nothing there: the files are read at once).
        """
        self._require('where')
        return self._stacks(_check_timeout(timeout))

    def wavefront(self, *, timeout: float = ANSWER_TIMEOUT) -> Wavefront:
        """How far every host got: last watched launch and collective, what is not done, and
        a verdict in one line (`multihost.Wavefront`); ``timeout`` as in `where`."""
        self._require('wavefront')
        return self._wavefront(_check_timeout(timeout))

    def flight_records(
        self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT
    ) -> dict[int, list[FlightRecord]]:
        """Every host's last ``last`` flight records (`multihost.FlightRecord`), oldest first."""
        self._require('flight_records')
        if not (isinstance(last, int) and last >= 0):
            raise ValueError(f'last must be a count of records >= 0, got {last!r}; e.g. last=200')
        return self._records(last, _check_timeout(timeout))

    def timeline(self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT) -> Timeline:
        """Every host's last ``last`` flight records aligned into a `multihost.Timeline`.

        Who arrived last at each collective and watched launch, by how much,
        and which host is late most often (``str(timeline.stragglers())``);
        hosts without records are silent.
        """
        from multihost import Timeline

        return Timeline.build(
            self.flight_records(last=last, timeout=timeout), self._process_count()
        )

    #: The old name of `flight_records` (the same method).
    records = flight_records

    # -- the step gate ------------------------------------------------------------------------
    def step_table(self) -> StepTable:
        """The host x step table of the step gate (`multihost.StepTable`), with the hosts
        held before a launch."""
        self._require('step')
        with self._answering():
            table = self._endpoint().step_table()
        self._stepping = bool(table.stepping)
        return table

    @property
    def stepping(self) -> bool:
        """Whether the step gate is on, as the hosts say.

        The setting lives in the job's coordination service, so `%mh_step`,
        the stepper's buttons and ``multihost.set_stepping`` in a cell all
        change the one value read here. If the hosts cannot be asked, the
        last value seen; a view that cannot step says False.
        """
        if 'step' in self.features and self._is_running():
            try:
                self.step_table()
            except Exception as exc:
                log.info('stepping: asking the hosts failed (%s); last known value', exc)
        return self._stepping

    def set_stepping(self, on: bool) -> None:
        """Turns the step gate on (every host pauses before each collective and watched
        launch) or off."""
        self._require('step')
        with self._answering():
            self._endpoint().set_stepping(on)
        self._stepping = bool(on)

    def release(self, steps: int = 1) -> tuple[int, ...]:
        """Releases the next ``steps`` gated collectives (held launches count as one)."""
        self._require('step')
        with self._answering():
            return self._endpoint().release(steps)

    def release_all(self) -> tuple[int, ...]:
        """Turns stepping off and releases every waiting collective and launch."""
        self._require('step')
        with self._answering():
            held = self._endpoint().release_all()
        self._stepping = False
        return held

    def moved_on(self, before: StepTable, timeout: float = 3.0) -> StepTable:
        """The step table once the hosts moved on from ``before`` after a release.

        Returns when every host arrived at a later gate or past the launches
        it was held before, when every host is idle (a session: the cell ran
        to its end), or after ``timeout`` seconds with where they are then.
        """
        self._require('step')
        return moved_on(self.step_table, before, timeout, idle=self._hosts_idle)

    def stop_stepping(self) -> StepTable:
        """The stepper's Stop: turns stepping off and returns the step table.

        A `Session` first interrupts its hosts (those held at the gate raise
        KeyboardInterrupt); an attached job was not started here, so its
        hosts are only let go.
        """
        self._require('step')
        self._stop_held()
        self.set_stepping(False)
        return self.step_table()


# -- the wait after Step / Continue ------------------------------------------------------------


def _left(before: StepTable, table: StepTable) -> bool:
    """Whether the hosts of ``table`` moved on from ``before``: every host at a later
    gate, or hosts held before launches again and none of them the launches held then."""
    first_held = before.pending.seq if before.pending is not None else -1
    held = table.pending
    if held is not None and held.seq > first_held and held.complete:
        return True
    was = {(h.process, h.n) for h in before.launches}
    now = {(h.process, h.n) for h in table.launches}
    return bool(was and now and not now & was)


def moved_on(
    read: Callable[[], StepTable],
    before: StepTable,
    timeout: float,
    *,
    idle: Callable[[], bool] | None = None,
) -> StepTable:
    """The step table (``read()``) once the hosts moved on from ``before`` after a release.

    Returns when every host arrived at a later gate, when the hosts held
    before launches in ``before`` are all past them and others (or the same
    hosts at later launches) are held, when ``idle()`` says every host is
    idle (the cell ran to its end), or after ``timeout`` seconds with where
    they are then.
    """
    deadline = time.monotonic() + timeout
    while True:
        table = read()
        if _left(before, table) or time.monotonic() >= deadline:
            return table
        if idle is not None and idle():
            return table
        time.sleep(0.1)
