"""The notebook's wait for many hosts' ipyparallel results.

`Poll`: `Session` waits for every call through it, and so does the JAX
start-up (`_cluster.jaxinit`); each adds its own reading of the results.
(The wait after Step or Continue, `moved_on`, is stepping's: `_jobview`.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from mhnotebook._errors import RemoteFailure

__all__ = ['Poll']

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
