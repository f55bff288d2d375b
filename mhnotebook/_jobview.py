"""One protocol for every job view: a `Session`, an `AttachedJob` and a `PostMortem`.

The three answer the same questions about a multi-host job: where every host
is (`JobView.where`), how far each got (`wavefront`), its flight records and
their `timeline`, and the step gate (`step_table`, `set_stepping`,
`release`, `release_all`, `moved_on`, `stop_stepping`). `JobView` is the
class the three inherit and the type the views (`_views`) and magics take; it
answers every question once over a few hooks, so the three classes differ only
where they really do:

* where the answers come from: `_endpoint` (a live job's control endpoint;
  a `PostMortem` overrides the read hooks `_stacks`, `_wavefront`,
  `_records` to read its dump files instead);
* who is known to be gone (`_gone`: a recoverable session's dead hosts, not
  waited for), how a connection that broke mid-question reads
  (`_answering`: an attached job says its job is gone), whether every host is
  idle (`_hosts_idle`: a session knows its engines' queues) and what Stop
  does beyond turning the gate off (`_stop_paused`: a session interrupts).

What a view can do is its `features` (`supports`): a read-only view (a
post-mortem) has no ``'step'``, and every stepping call raises one line,
`UnsupportedError`, saying why and what to use instead.

The data tools (feature ``'data'``: `allgather`, `layout`, `diff`, `nonfinite`,
`env_diff`, `memory_census`) and `execute` are `DataView`'s, written once over
one transport hook, `_call_tool`: run an engine tool of the one registry
(`multihost.engine.tools`) on the hosts, with its timeout and the frame to read
names in. A `Session` runs it on its engines, an `AttachedJob` in its stopped hosts'
frames; a post-mortem has no data tools. One timeout policy: ``timeout=None`` is
the tool's default in the registry, and each transport adds its own margin.

`moved_on` (the wait after Step or Continue) lives here too: stepping's own
loop, shared by every view that steps.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

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
        Replay,
        ReplicaReport,
        StepTable,
        Timeline,
        TreeDiff,
        TreeLayout,
        Wavefront,
    )
    from multihost.engine.tools import Tool

__all__ = [
    'DataView',
    'DataView',
    'FEATURES',
    'Frame',
    'JobView',
    'JobView',
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

#: Seconds a live view waits for the hosts' answers unless told otherwise.
ANSWER_TIMEOUT = 10.0

#: A frame of the program on each host of an attached job: its number (0: innermost) or a
#: function's name; None: the view's own (``job.frame``, 0 unless set).
Frame = int | str | None


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


def seconds(timeout: float | None, default: float | None = None) -> float | None:
    """A ``timeout`` argument in seconds: ``default`` for None, else a number > 0; a
    ValueError naming the bad value otherwise. The one check of every view, the session and
    (through `_magics._options.check_timeout`) the magics."""
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f'timeout must be > 0 seconds, got {timeout!r}; e.g. timeout=30')
    return float(timeout)


def _within(timeout: float | None, default: float) -> float:
    """`seconds` where there is always a limit (``default`` for None)."""
    got = seconds(timeout, default)
    return default if got is None else got


def _answer_within(timeout: float | None) -> float:
    return _within(timeout, ANSWER_TIMEOUT)


class JobView:
    """What every job view answers (`Session`, `AttachedJob`, `PostMortem`), written once;
    the classes give the hooks (see the module docstring). The views and magics take it.

    Attributes:
        kind: ``'session'``, ``'attached job'`` or ``'post-mortem'`` (for messages).
        features: what it can do (see `FEATURES`); `supports` asks.
        live: the answers come from running hosts (False: from files).

    A subclass sets `kind`, `features`, `live` and `num_processes`, gives `running` unless it
    never reaches a host, and gives `_endpoint` (or, read-only, overrides `_stacks`,
    `_wavefront` and `_records`).
    """

    kind: ClassVar[str] = 'job'
    features: ClassVar[frozenset[str]] = frozenset(FEATURES)
    live: ClassVar[bool] = True
    #: The step gate's last setting seen (the hosts are asked first).
    _stepping: bool = False
    if TYPE_CHECKING:  # a subclass's attribute, field or property

        @property
        def num_processes(self) -> int:
            """The job's process count."""

    @property
    def running(self) -> bool:
        """Whether it still reaches the hosts; False here: a view that never reaches one (a
        post-mortem) keeps it, a live one says."""
        return False

    # -- hooks ----------------------------------------------------------------------------
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

    def _stop_paused(self) -> None:
        """What Stop does to the hosts paused at the gate before stepping goes off."""

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
        if feature not in FEATURES:
            raise ValueError(f'unknown feature {feature!r}; one of {", ".join(FEATURES)}')
        return feature in self.features

    def audit(self, *, timeout: float = ANSWER_TIMEOUT) -> AuditReport:
        """What the job's audit (``multihost run --audit``) found: `multihost.AuditReport`
        (``enabled`` False for a job run without it)."""
        return self._audit(_answer_within(timeout))

    def where(self, *, timeout: float = ANSWER_TIMEOUT) -> dict[int, HostStacks]:
        """Per process index: its Python stacks and current collective (`multihost.HostStacks`).

        A live view asks every host's debug thread through the control
        endpoint, so it works while every main thread is busy or hung; hosts
        that do not answer within ``timeout`` seconds are named, not waited
        for. A post-mortem returns what the hosts dumped (``timeout`` waits
        for nothing there: the files are read at once).
        """
        self._require('where')
        return self._stacks(_answer_within(timeout))

    def wavefront(self, *, timeout: float = ANSWER_TIMEOUT) -> Wavefront:
        """How far every host got: last watched launch and collective, what is not done, and
        a verdict in one line (`multihost.Wavefront`); ``timeout`` as in `where`."""
        self._require('wavefront')
        return self._wavefront(_answer_within(timeout))

    def flight_records(
        self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT
    ) -> dict[int, list[FlightRecord]]:
        """Every host's last ``last`` flight records (`multihost.FlightRecord`), oldest first."""
        self._require('flight_records')
        if not (isinstance(last, int) and last >= 0):
            raise ValueError(f'last must be a count of records >= 0, got {last!r}; e.g. last=200')
        return self._records(last, _answer_within(timeout))

    def timeline(self, *, last: int = 200, timeout: float = ANSWER_TIMEOUT) -> Timeline:
        """Every host's last ``last`` flight records aligned into a `multihost.Timeline`.

        Who arrived last at each collective and watched launch, by how much,
        and which host is late most often (``str(timeline.stragglers())``);
        hosts without records are silent.
        """
        from multihost._models import Timeline

        return Timeline.build(self.flight_records(last=last, timeout=timeout), self.num_processes)

    # -- the step gate ------------------------------------------------------------------------
    def step_table(self) -> StepTable:
        """The host x step table of the step gate (`multihost.StepTable`), with the hosts
        paused before a launch."""
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
        if 'step' in self.features and self.running:
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
        """Releases the next ``steps`` gated collectives (paused launches count as one)."""
        self._require('step')
        with self._answering():
            return self._endpoint().release(steps)

    def release_all(self) -> tuple[int, ...]:
        """Turns stepping off and releases every waiting collective and launch."""
        self._require('step')
        with self._answering():
            released = self._endpoint().release_all()
        self._stepping = False
        return released

    def moved_on(self, before: StepTable, timeout: float = 3.0) -> StepTable:
        """The step table once the hosts moved on from ``before`` after a release.

        Returns when every host arrived at a later gate or past the launches
        it was paused before, when every host is idle (a session: the cell ran
        to its end), or after ``timeout`` seconds with where they are then.
        """
        self._require('step')
        return moved_on(self.step_table, before, timeout, idle=self._hosts_idle)

    def stop_stepping(self) -> StepTable:
        """The stepper's Stop: turns stepping off and returns the step table.

        A `Session` first interrupts its hosts (those paused at the gate raise
        KeyboardInterrupt); an attached job was not started here, so its
        hosts are only let go.
        """
        self._require('step')
        self._stop_paused()
        self.set_stepping(False)
        return self.step_table()


class DataView(JobView):
    """A job view whose hosts answer the data tools (feature ``'data'``): a `Session` (its
    engines) and an `AttachedJob` (each host's stopped frame); the data views
    (`mhnotebook._views`: layout, diff, non-finite, env, memory) take one. A post-mortem
    has none: its hosts are gone. Every data tool and `execute` are written here once, over
    one transport hook; ``frame`` is the stopped frame an attached job reads names in (a
    session has one namespace: it refuses ``frame``).

    A live view whose hosts run engine tools (`Session`, `AttachedJob`) gives
    `_call_tool` (run a tool of the one registry, `multihost.engine.tools`, on the
    hosts, with its timeout and the frame to read names in), `_gather_where` (where
    a gather's blocks go) and, where it differs, `_transport` and `_run_cell`. One
    timeout policy: ``timeout=None`` is the tool's default in the registry (a
    session's cell: until it ends); the transport adds its own margin to its wait.
    """

    # -- the data tools (feature 'data'): every one once, over the transport hook -------------
    #: Whether ``frame=`` picks something here (an attached job's stopped frames); a view
    #: without frames refuses any frame but None.
    has_frames: ClassVar[bool] = False
    #: The ``frame=`` of the data call under way (`in_frame`; None: the view's own).
    _frame: Frame = None
    #: The gathers' state (listener, pools, plans), made by the first gather.
    _gathers: Any = None
    #: The read points of the data call under way (`_combining`), one list per tool run.
    _points: list[Any]
    _depth = 0
    #: The last data call's words when the hosts were read at different points ('' when
    #: not, and always on a view whose hosts say nothing of where they read).
    apart: str = ''

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
        """The transport hook: runs ``tool`` on the hosts (all, or ``processes``) with the
        names of ``frame``; results by process index. ``timeout`` is the tool's own bound:
        the transport adds its margin to its wait (a host's answer comes after the tool)."""
        raise NotImplementedError

    def _gather_where(self) -> tuple[str | None, list[str]]:
        """The gather hook: where the hosts reach this notebook (a URL) and each process's
        machine id (equal ids: one machine, shared memory)."""
        raise NotImplementedError

    def _transport(self, transport: str, progress: bool | None) -> tuple[str, bool | None]:
        """The gather transport and progress bar this view can use for those asked."""
        return transport, progress

    def _run_cell(
        self,
        code: str,
        timeout: float | None,
        outputs: dict[int, str],
        on_status: Callable[[dict[int, str], float], None] | None,
    ) -> None:
        """The cell hook: runs ``code`` on every host (``timeout`` None: the default of what
        runs it), filling ``outputs`` (process -> what it printed) as hosts finish."""
        outs = self.call_tool('run_cell', code, timeout=timeout)
        outputs.update(enumerate(outs))

    def call_tool(
        self,
        name: str,
        *args: Any,
        timeout: float | None = None,
        processes: Sequence[int] | None = None,
        on_done: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Runs engine tool ``name`` (one of `multihost.engine.tools.TOOLS`: ``'layout'``,
        ``'gather_meta'``...) on every host (or ``processes``); results by process index.

        ``timeout``: seconds the tool may take (None: its default in the registry);
        ``on_done`` is called with each process index as its host answers (a session).
        """
        found = _tool(name)
        self._require('data')
        limit = _within(timeout, found.timeout)
        wanted = None if processes is None else [int(p) for p in processes]
        return self._call_tool(
            found,
            args,
            kwargs,
            timeout=limit,
            frame=self._frame,
            processes=wanted,
            on_done=on_done,
        )

    @contextlib.contextmanager
    def in_frame(self, frame: Frame) -> Iterator[Any]:
        """The data tools read frame ``frame`` inside the block (an attached job: see
        `frames`); None: as before. A view without frames refuses any other."""
        if frame is None:
            yield self
            return
        if not self.has_frames:
            raise ValueError(
                f"frame= is for an attached job (its hosts' stopped frames); a {self.kind}'s "
                f'hosts have one namespace, got frame={frame!r}'
            )
        if isinstance(frame, bool) or not (
            (isinstance(frame, int) and frame >= 0) or (isinstance(frame, str) and frame)
        ):
            raise ValueError(
                'frame must be a frame number >= 0 or a function name (see job.frames()), '
                f'got {frame!r}'
            )
        before, self._frame = self._frame, frame
        try:
            yield self
        finally:
            self._frame = before

    @contextlib.contextmanager
    def _combining(self) -> Iterator[None]:
        """A data call that combines the hosts' values: when the hosts were read at different
        points (`multihost._models._points.apart`; the hook records each tool run's points),
        one line says so after it, and `apart` keeps it."""
        if self._depth:
            yield
            return
        self._points, self._depth = [], 1
        try:
            yield
        finally:
            self._depth = 0
            if self._points:
                from multihost._models._points import apart

                said = [apart(points) for points in self._points]
                self.apart = next((w for w in said if w), '')
            else:
                self.apart = ''
            if self.apart:
                print(f'note: {self.apart}')

    def _one(self, name: str, *args: Any, timeout: float | None, frame: Frame) -> Any:
        """Tool ``name``'s answer (every host answers the same model: process 0's)."""
        with self.in_frame(frame), self._combining():
            return self.call_tool(name, *args, timeout=timeout)[0]

    def allgather(
        self,
        name: str,
        *,
        timeout: float | None = None,
        transport: str = 'auto',
        progress: bool | None = None,
        max_bytes: int | None = None,
        frame: Frame = None,
    ) -> Any:
        """The global value of ``name`` on the hosts, as numpy, in this process.

        Global `jax.Array` values (any sharding, any rank) come back whole; host-local
        arrays and scalars are stacked along a new axis 0, one row per process
        (like `multihost.process_allgather`); pytrees keep their structure.
        Each block travels once: only replica 0 of every distinct shard is
        sent, by the host that owns it, straight into its place.

        Args:
            name: a value on the hosts: a variable, then attributes and
                constant subscripts (``x``, ``state.params.embed``,
                ``state.params['embed']``, ``state.opt_state[0]``),
                optionally ending with a cut of ints and slices,
                ``'x[::4, :128]'``: the hosts slice the array and only the
                slice travels (parsed, never evaluated). PRNG key leaves
                come back as key arrays (`mhnotebook.KeyData` without jax).
            timeout: seconds to wait for every host (None: the gather tools' default,
                600 s).
            transport: ``'shm'`` (engines write into shared memory; only when
                every engine runs on this machine), ``'tcp'`` (each host
                streams its blocks over one connection to this notebook,
                read straight into place), ``'zmq'`` (blocks ride
                ipyparallel's replies through the controller), or ``'auto'``
                (``shm`` on one machine, else ``tcp``, else ``zmq`` once a
                host could not reach this notebook). An attached job streams
                over ``tcp`` (``'auto'`` or ``'tcp'``).
            progress: show a progress bar (default: for gathers over 64 MiB; never
                on an attached job).
            max_bytes: refuse a result larger than this, before anything is
                allocated or sent (default: half of this machine's available
                memory, ``MemAvailable`` in ``/proc/meminfo``).
            frame: an attached job's stopped frame to read ``name`` in (see `in_frame`).

        Raises:
            multihost.engine.GatherError (through HostsError): unknown name or a
                value that cannot be gathered.
            SessionError: the result would be larger than ``max_bytes``.
        """
        from mhnotebook._transfer._gather import GatherState, allgather

        self._require('data')
        limit = _within(timeout, _tool('gather_meta').timeout)
        transport, progress = self._transport(transport, progress)
        url, machines = self._gather_where()
        if self._gathers is None:  # kept between gathers, closed with the view
            self._gathers = GatherState(url)
        with self.in_frame(frame), self._combining():
            return allgather(
                self.call_tool,
                name,
                machines=machines,
                state=self._gathers,
                timeout=limit,
                transport=transport,
                progress=progress,
                max_bytes=max_bytes,
            )

    def layout(
        self, name: str, *, check: bool = True, timeout: float | None = None, frame: Frame = None
    ) -> tuple[Layout | TreeLayout, ReplicaReport | None]:
        """(`multihost.Layout`, `multihost.ReplicaReport` or None) of array ``name``.

        For a pytree, (`multihost.TreeLayout`, None): a row per leaf, each
        leaf's replicas checked with ``check``. ``check`` digests every replica
        on every host (a collective) so replicas that disagree are flagged.
        """
        return self._one('layout', name, check, timeout=timeout, frame=frame)

    def diff(self, name: str, *, timeout: float | None = None, frame: Frame = None) -> TreeDiff:
        """`multihost.TreeDiff` of value ``name`` across hosts (what differs, where)."""
        limit = _within(timeout, _tool('diff').timeout)
        return self._one('diff', name, limit, timeout=limit, frame=frame)

    def nonfinite(
        self, name: str, *, timeout: float | None = None, frame: Frame = None
    ) -> NonfiniteReport:
        """`multihost.NonfiniteReport` of value ``name``: which shards hold NaN or Inf.

        Every host counts NaN and Inf in its own shards; only the offending
        shards' records travel (`multihost.nonfinite`).
        """
        limit = _within(timeout, _tool('nonfinite').timeout)
        return self._one('nonfinite', name, limit, timeout=limit, frame=frame)

    def replay(
        self,
        fn: str,
        *args: str,
        again: int = 2,
        canonical: bool = False,
        timeout: float | None = None,
        frame: Frame = None,
    ) -> Replay:
        """`multihost.Replay` of engine function ``fn`` called on engine values ``args``:
        where the hosts' replicas of that launch part (inputs, runs again, op by op).

        On an attached job, names are read in each host's stopped frame (``frame``): a job
        held before the launch (``--check-jit --hold-on-error``, the step gate) still holds
        its arguments; one held inside a launch, or after it donated them, cannot replay it."""
        limit = _within(timeout, _tool('replay').timeout)
        return self._one('replay', fn, list(args), again, canonical, limit, timeout=limit,
                         frame=frame)  # fmt: skip

    def env_diff(self, *, timeout: float | None = None) -> EnvDiff:
        """`multihost.EnvDiff`: versions, flags, config and code that differ between hosts."""
        limit = _within(timeout, _tool('env_diff').timeout)
        return self.call_tool('env_diff', limit, timeout=limit)[0]

    def memory_census(self, *, timeout: float | None = None, frame: Frame = None) -> MemoryCensus:
        """`multihost.MemoryCensus`: device and live-array memory per host, and what only
        some hold; arrays are named by the names (namespace, stopped frame) that refer to them."""
        limit = _within(timeout, _tool('memory_census').timeout)
        return self._one('memory_census', limit, timeout=limit, frame=frame)

    def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        echo: bool = True,
        on_status: Callable[[dict[int, str], float], None] | None = None,
        frame: Frame = None,
    ) -> dict[int, str]:
        """Runs ``code`` on every host (the way a ``%%mh`` cell does).

        Args:
            code: Python source: run in each engine's namespace (a session), or in
                each host's stopped frame over a copy of its names (an attached job
                started with ``--allow-exec``; every host must be stopped).
            timeout: seconds to wait. None: the default of what runs it: a session's
                engines run a cell until it ends (Ctrl-C interrupts every host), an
                attached job's hosts run it with the ``run_cell`` tool, 60 s (its debug
                thread answers nothing else meanwhile).
            echo: print each host's output, labelled by process index (also what the
                hosts that finished printed when others failed).
            on_status: a session calls it about twice a second with (process index ->
                'running' | 'done' | 'error' | 'died', seconds elapsed).
            frame: an attached job's stopped frame (see `in_frame`).

        Returns:
            Process index -> that host's stdout.

        Raises:
            HostsError: the code raised on some hosts; ``.failures`` holds each
                host's ``ename``, ``evalue`` and traceback (``.errors`` the text).
            SessionTimeoutError: not finished within ``timeout`` (a session: the code
                keeps running on the engines).
            HostDiedError, HostGoneError, SessionInterruptedError: a session's hosts
                died, are dead, or the wait was interrupted (see `Session`).
            SessionError: an attached job's host runs its own code (stop it first).
        """
        self._require('data')
        if not isinstance(code, str):
            raise ValueError(f'execute needs the code to run (a str), got {type(code).__name__}')
        limit = seconds(timeout)
        outputs: dict[int, str] = {}
        try:
            with self.in_frame(frame):
                self._run_cell(code, limit, outputs, on_status)
        finally:
            if echo:
                echo_outputs(outputs)
        return outputs


def echo_outputs(outputs: dict[int, str]) -> None:
    """Prints each host's output, every line labelled ``[process N]``."""
    for p, text in sorted(outputs.items()):
        if text:
            print(f'[process {p}] ' + text.rstrip('\n').replace('\n', f'\n[process {p}] '))


def _tool(name: str) -> Tool:
    """Engine tool ``name`` of the one registry (`multihost.engine.tools`)."""
    from multihost.engine.tools import tool

    return tool(name)


# -- the wait after Step / Continue ------------------------------------------------------------


def _left(before: StepTable, table: StepTable) -> bool:
    """Whether the hosts of ``table`` moved on from ``before``: every host at a later
    gate, or hosts paused before launches again and none of them the launches paused then."""
    first_paused = before.pending.seq if before.pending is not None else -1
    paused = table.pending
    if paused is not None and paused.seq > first_paused and paused.complete:
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

    Returns when every host arrived at a later gate, when the hosts paused
    before launches in ``before`` are all past them and others (or the same
    hosts at later launches) are paused, when ``idle()`` says every host is
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
