"""The notebook's wait for many hosts' ipyparallel results.

`Poll`: `Session` waits for every call through it, and so does the JAX
start-up (`_cluster.jaxinit`); each adds its own reading of the results.
(The wait after Step or Continue, `moved_on`, is stepping's: `_jobview`.)
`Forget`: once read, the toolkit's own results leave ipyparallel's caches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mhnotebook._errors import RemoteFailure

__all__ = ['Forget', 'Poll']

_SLICE = 0.05  # seconds between looks at the results
_TICK = 0.5  # seconds between ``on_tick`` calls
_HUB_BATCH = 64  # results forgotten in the client before the hub is told, in one request
_KEEP = 1024  # at most this many read results wait to be forgotten (the rest are let go)
_HUB_TRIES, _HUB_RETRY_S = 20, 0.5  # a batch the hub refused: told again this often, this apart


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


class Forget:
    """Makes ipyparallel forget the results the toolkit has read, so a long session stays flat.

    The client keeps every result with its metadata (``Client.results``, ``metadata``,
    ``history``) and the hub keeps it in its database (up to 1,024 records or 1 GB), unless
    purged. `retire` takes the AsyncResults a call is done with; `purge` (run before the
    next call is sent) drops those that are done from the client, and tells the hub in
    batches, on a thread of its own (the hub's reply has no timeout in ipyparallel; the
    notebook never waits for it). The user's own ipyparallel results are left alone.
    """

    def __init__(self, client: Any):
        self._client = client
        self._read: list[Any] = []  # AsyncResults the toolkit is done with
        self._hub: list[str] = []  # msg_ids dropped from the client, not yet from the hub
        self._lock = threading.Lock()  # the batch below, shared with the telling thread
        self._telling = False  # a thread is telling the hub

    def retire(self, results: Iterable[Any]) -> None:
        """``results`` (AsyncResults) were read: forget them at the next `purge`."""
        self._read.extend(results)
        del self._read[:-_KEEP]

    def purge(self) -> None:
        """Drops every retired result that is done from the client; tells the hub by batch."""
        done: list[Any] = []
        waiting: list[Any] = []
        for ar in self._read:
            (done if ar.ready() else waiting).append(ar)
        self._read = waiting
        if not done:
            return
        ids = [m for ar in done for m in ar.msg_ids]
        client = self._client
        try:
            client.purge_local_results(jobs=ids)
        except Exception:  # outstanding after all: let them go, never fail a call for this
            return
        gone = set(ids)
        client.history[:] = [m for m in client.history if m not in gone]
        with self._lock:
            self._hub.extend(ids)
            del self._hub[:-_KEEP]
            if len(self._hub) < _HUB_BATCH or self._telling:
                return  # a telling thread already running takes these too
            self._telling = True
        threading.Thread(target=self._tell_hub, name='mhnotebook-purge', daemon=True).start()

    def _tell_hub(self) -> None:
        """Tells the hub every full batch, including those that came while it was telling."""
        tries = 0
        while True:
            with self._lock:
                if len(self._hub) < _HUB_BATCH:
                    self._telling = False
                    return
                batch, self._hub = self._hub, []
            try:
                self._client.purge_hub_results(jobs=batch)
                tries = 0
            except Exception:
                # The hub refuses the whole batch while it still counts one of them as pending
                # (under load it lags behind the client), or it is gone: the batch goes back,
                # to be told again shortly (a few times), then at the next purge.
                with self._lock:
                    self._hub[:0] = batch
                    del self._hub[:-_KEEP]
                tries += 1
                if tries >= _HUB_TRIES:
                    with self._lock:
                        self._telling = False
                    return
                time.sleep(_HUB_RETRY_S)
