"""After an interrupt: wait until the hosts are idle, close IPython's abort window, realign.

`Session.interrupt` sends SIGINT to every host and then uses these three
steps. They reach the engines through the ipyparallel client and the
session's ``call`` they are given; they know nothing of sessions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from mhnotebook._errors import HostsError, RemoteFailure, SessionError

log = logging.getLogger('mhnotebook')


def wait_idle(
    client: Any,
    engines: Mapping[int, int],
    pending: Mapping[int, Any] | None,
    deadline: float,
    dead: Callable[[], Mapping[int, str]],
) -> list[int]:
    """Waits until the hosts ``engines`` (process index -> engine id) are idle, or ``deadline``.

    A host is busy while its work in ``pending`` (process index ->
    AsyncResult) is not done or its engine's queue is not empty.

    Returns:
        The process indices still busy.
    """
    by_engine = {e: p for p, e in engines.items()}
    while True:
        left = set()
        if pending:
            left |= {p for p, ar in pending.items() if p in engines and not ar.ready()}
        try:
            queues = client.queue_status(targets=list(by_engine))
            left |= {
                by_engine[e]
                for e, q in queues.items()
                if e in by_engine and isinstance(q, dict) and q.get('queue', 0)
            }
        except Exception:  # an engine died meanwhile: the next round skips it
            gone = dead()
            by_engine = {e: p for e, p in by_engine.items() if p not in gone}
            left -= set(gone)
        if not left or time.monotonic() >= deadline:
            return sorted(left)
        time.sleep(0.05)


def settle(client: Any, engines: Mapping[int, int], deadline: float) -> None:
    """Returns once each host (process index -> engine id) runs cells again.

    After a cell fails (here: the KeyboardInterrupt), an IPython kernel
    aborts execute requests that reach it within a short window
    (``TaskAborted``); one silent empty cell per host, repeated until it
    is not aborted, makes sure that window has closed.
    """
    left = list(engines)
    while left and time.monotonic() < deadline:
        probes = {p: client[engines[p]].execute('', silent=True, block=False) for p in left}
        left = []
        for p, ar in probes.items():
            try:
                ar.get(max(0.1, deadline - time.monotonic()))
            except Exception as exc:
                if RemoteFailure.from_exception(p, exc).engine_died:
                    continue
                left.append(p)  # aborted, or a late KeyboardInterrupt: again


def realign(call: Callable[..., list[Any]], processes: list[int]) -> int | None:
    """Moves every host's collective count to the largest; returns it (None if that failed)."""
    try:
        positions = call('multihost.engine.sequence_position', processes=processes, timeout=10.0)
        top = max(positions)
        if len(set(positions)) > 1:
            call('multihost.engine.realign_sequence', top, processes=processes, timeout=10.0)
        return int(top)
    except (SessionError, HostsError) as exc:
        log.warning('interrupt: could not realign the collective sequence: %s', exc)
        return None
