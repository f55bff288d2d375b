"""One wakeup fd for the signals ``multihost run`` must see while the main thread is blocked.

Python runs a signal's handler only when the main thread gets back to bytecode: a main
thread inside XLA's execute, a device collective or a C extension's call runs none. Python's
C-level handler also writes the signal's number to the fd given to `signal.set_wakeup_fd`
(for every signal whose handler is Python's, ``SIGINT``'s default one included); one daemon
thread reads it and calls each subscriber of that signal at once: the dump signal
(`_triggers`), Ctrl-C on a blocked main thread (`_interrupt`). A wakeup fd someone else set
first (asyncio's) is kept: then nothing subscribes, and the Python handlers alone act when
the main thread gets back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

_lock = threading.Lock()
_subscribers: dict[int, list[Callable[[int], None]]] = {}


class _State:
    reads: bool | None = None  # None: not tried yet; False: another wakeup fd was there


_state = _State()


def subscribe(signum: int, callback: Callable[[int], None]) -> bool:
    """``callback(count)`` runs on the watcher thread each time ``signum`` arrives (``count``:
    how many arrived together); whether it will (False: called off the main thread before
    the watcher started, or another wakeup fd was set first). Idempotent per callback."""
    with _lock:
        if not _start():
            return False
        subs = _subscribers.setdefault(signum, [])
        if callback not in subs:
            subs.append(callback)
        return True


def unsubscribe(signum: int, callback: Callable[[int], None]) -> None:
    with _lock:
        subs = _subscribers.get(signum, [])
        if callback in subs:
            subs.remove(callback)


def _start() -> bool:
    """The watcher thread and its wakeup fd, once (`signal.set_wakeup_fd`: main thread only)."""
    if _state.reads is not None:
        return _state.reads
    if threading.current_thread() is not threading.main_thread():
        return False  # not settled: a later call from the main thread may start it
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        old = -2
    if old != -1:  # someone else's wakeup fd: kept
        if old >= 0:
            signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        _state.reads = False
        return False
    threading.Thread(target=_read, args=(r,), name='multihost-signals', daemon=True).start()
    _state.reads = True
    return True


def _read(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            return
        if not data:
            return
        with _lock:
            subs = [(s, list(cbs)) for s, cbs in _subscribers.items()]
        for signum, callbacks in subs:
            count = data.count(signum)
            for callback in callbacks if count else ():
                try:
                    callback(count)
                except Exception as exc:  # a subscriber's failure never stops the watcher
                    print(f'multihost: on signal {signum}: {exc}', file=sys.stderr)
