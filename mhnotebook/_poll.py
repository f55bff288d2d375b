"""The notebook's waits: many hosts' ipyparallel results, and hosts moving on after a release.

`Poll`: `Session` waits for every call through it, and so does the JAX
start-up (`_cluster.jaxinit`); each adds its own reading of the results.
`moved_on`: after Step or Continue, `Session.moved_on` and
`AttachedJob.moved_on` wait in this one loop for the hosts to leave the
step table they were released from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mhnotebook._errors import RemoteFailure

if TYPE_CHECKING:
    from multihost import StepTable

__all__ = ['Poll', 'moved_on']

_SLICE = 0.05  # seconds between looks at the results
_TICK = 0.5  # seconds between ``on_tick`` calls


class Poll:
    """Collects ``pending`` (process index -> AsyncResult) until all are in or the deadline.

    Attributes:
        pending: every process waited for.
        left: those not answered yet (what is still running if `run` is cut short).
        results: process index -> value, for those that returned.
        failures: process index -> `RemoteFailure`, for those that raised.
        deadline: ``time.monotonic()`` at which `run` stops waiting; ``on_ready``
            may move it (nearer: the others of a dead host get a grace period).
    """

    def __init__(
        self,
        pending: Mapping[int, Any],
        timeout: float,
        *,
        on_ready: Callable[[int], None] | None = None,
        on_tick: Callable[[float], None] | None = None,
    ):
        """``on_ready(p)``: after process ``p``'s answer is taken; ``on_tick(elapsed)``:
        at the start, about every 0.5 s, and when `run` ends (not when interrupted)."""
        self.pending = dict(pending)
        self.left = dict(pending)
        self.results: dict[int, Any] = {}
        self.failures: dict[int, RemoteFailure] = {}
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self._on_ready = on_ready
        self._on_tick = on_tick

    def run(self) -> None:
        """Waits; on return, `left` holds the processes that did not answer in time."""
        next_tick = self.start
        while self.left:
            if self._on_tick is not None and time.monotonic() >= next_tick:
                self._on_tick(time.monotonic() - self.start)
                next_tick += _TICK
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                break
            for p, ar in list(self.left.items()):
                if ar.ready():
                    self._take(p, ar)
            if self.left:
                next(iter(self.left.values())).wait(min(_SLICE, max(remaining, 0)))
        if self._on_tick is not None:
            self._on_tick(time.monotonic() - self.start)

    def _take(self, p: int, ar: Any) -> None:
        del self.left[p]
        try:
            self.results[p] = ar.get(0)
        except Exception as exc:
            self.failures[p] = RemoteFailure.from_exception(p, exc)
        if self._on_ready is not None:
            self._on_ready(p)


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
