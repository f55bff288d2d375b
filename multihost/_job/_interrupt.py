"""Ctrl-C (SIGINT) on a process whose main thread is blocked in native code (`install`).

Python raises ``KeyboardInterrupt`` only when the main thread gets back to bytecode. A main
thread blocked in a device collective (XLA:CPU runs a launch inside its call when a process
has one device), in a coordination-service wait or in a C extension's call never does, so
Ctrl-C on a job hung there did nothing at all. Now, when a SIGINT's Python handler has not
run `GRACE_S` after the signal arrived (`_wakeup` sees it at once):

- the process says on stderr where its main thread is blocked, writes its ``interrupt``
  dump (dumps on) and asks for a second Ctrl-C;
- a second Ctrl-C while it is still blocked ends the process at once with exit code 130,
  the other processes told as for an uncaught ``KeyboardInterrupt`` (`_fate.interrupted`).

A main thread that gets back meanwhile raises ``KeyboardInterrupt`` as always (the program's
own ``except KeyboardInterrupt`` runs: a blocked wait is not cut short by the first Ctrl-C).
A program that sets its own SIGINT handler keeps it, and none of this applies.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from multihost._debug import _pulse
from multihost._job import _wakeup
from multihost._job._options import InstallOptions

#: Seconds a SIGINT may wait for the main thread's Python handler before it counts as blocked.
GRACE_S = 2.0


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled = -1.0  # when (monotonic) the Python handler last ran
        self.warned = -1.0  # when the blocked main thread was last reported (first Ctrl-C)


_s = _State()


def patch(options: InstallOptions) -> None:
    """Our SIGINT handler and the watcher's callback, when SIGINT is still Python's default
    and this is the main thread (a program's own handler is left alone)."""
    del options
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    if _wakeup.subscribe(signal.SIGINT, _arrived):
        signal.signal(signal.SIGINT, _on_sigint)


def unpatch() -> None:
    _wakeup.unsubscribe(signal.SIGINT, _arrived)
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is _on_sigint
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _on_sigint(signum: int, frame: Any) -> None:
    """The main thread got back to bytecode: Python's own handler (KeyboardInterrupt)."""
    with _s.lock:
        _s.handled = time.monotonic()
    signal.default_int_handler(signum, frame)


def _arrived(count: int) -> None:
    """On the watcher thread: a second Ctrl-C after a report ends the process now; else the
    main thread gets `GRACE_S` to handle it."""
    del count
    at = time.monotonic()
    with _s.lock:
        second = _s.warned >= 0 and _s.handled < _s.warned
    if second and _ours():
        _end_now()
        return
    threading.Thread(target=_check, args=(at,), name='multihost-interrupt', daemon=True).start()


def _ours() -> bool:
    return signal.getsignal(signal.SIGINT) is _on_sigint


def _check(at: float) -> None:
    """`GRACE_S` after a Ctrl-C: reports a main thread still blocked; a Ctrl-C pressed again
    before that report (two quick presses) ends the process once the first is reported."""
    from multihost._job import _fate

    time.sleep(GRACE_S)
    with _s.lock:
        if _s.handled >= at or not _ours() or _fate.leaving():
            return  # it got back (KeyboardInterrupt raised there), the program's own
            # handler took SIGINT, or the process is ending already
        again = _s.warned >= 0
        if not again:
            _s.warned = time.monotonic()
    if again:
        _end_now()
    else:
        _report()


def _user_site(frames: list[tuple[str, int, str, str]]) -> tuple[str, str]:
    """(``file:line``, function) of the innermost frame of the program itself, in
    ``frames`` (innermost first, `_pulse.main_frames`)."""
    from multihost._debug import _stacks
    from multihost._models._stacks import is_user_frame

    ours = _stacks.our_dirs()
    user = next((f for f in frames if is_user_frame(f, ours)), None)
    return ('?', '?') if user is None else (f'{user[0]}:{user[1]}', user[2])


def _report() -> None:
    """The first Ctrl-C, still not handled: where the main thread is blocked, the dump."""
    from multihost._job import _dump, _fate
    from multihost._text import short_site

    frames = _pulse.main_frames()
    try:
        where = _fate.position()
    except Exception:
        where = f'at {short_site(_user_site(frames)[0])}'
    print(
        f'multihost: Ctrl-C (SIGINT) not handled for {GRACE_S:.0f} s: the main thread is '
        f'blocked in native code, {where}, and Python raises KeyboardInterrupt only once it '
        'returns. Press Ctrl-C again to end this process now (exit code 130; the other '
        'processes are told).',
        file=sys.stderr,
        flush=True,
    )
    details = {'error': 'KeyboardInterrupt', 'message': '', 'thread': 'MainThread'}
    _dump.interrupted_while_blocked({**details, 'traceback': [list(f) for f in frames[::-1]]})


def _end_now() -> None:
    """The second Ctrl-C while still blocked: the others told, this process ends (130)."""
    from multihost._job import _fate

    site, function = _user_site(_pulse.main_frames())
    print(
        'multihost: Ctrl-C again while the main thread is still blocked: ending this process '
        '(exit code 130)',
        file=sys.stderr,
        flush=True,
    )
    _fate.interrupted(site, function)
