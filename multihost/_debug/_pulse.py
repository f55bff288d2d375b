"""The sampler behind `Pulse`: this host's CPU time and main-thread stack, about once a second.

A daemon thread (``multihost-pulse``, started with the debug thread, or by the first
`pulse` call) keeps the last `KEEP` samples: monotonic time, the process's CPU time
(`os.times`), the main thread's (``/proc/self/task/<tid>/stat`` on Linux) and a signature
of the main thread's Python stack (each frame's code object and line; the innermost
one's code object only, so a loop polling inside one function stands still). `pulse` compares
the newest sample with one about `WINDOW_S` older. Each sample costs tens of
microseconds; memory is bounded (`KEEP` tuples). Stdlib only.
"""

from __future__ import annotations

import collections
import os
import sys
import sysconfig
import threading
import time
from typing import Any, NamedTuple

from multihost._exchange import _bus
from multihost._models._pulse import Pulse

PERIOD_S = 1.0
WINDOW_S = 5.0
KEEP = 16
THREAD_NAME = 'multihost-pulse'
_TICK = os.sysconf('SC_CLK_TCK') if hasattr(os, 'sysconf') else 100


class _Sample(NamedTuple):
    t: float
    cpu: float
    main_cpu: float | None
    stack: int | None


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: collections.deque[_Sample] = collections.deque(maxlen=KEEP)
        self.thread: threading.Thread | None = None


_s = _State()


def _thread_cpu(native_id: int | None) -> float | None:
    """CPU seconds of one thread of this process (Linux ``/proc``), or None."""
    if native_id is None:
        return None
    try:
        with open(f'/proc/self/task/{native_id}/stat', 'rb') as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b')') + 2 :].split()  # after the command name, which may hold spaces
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)
    except (IndexError, ValueError):
        return None


_STDLIB = sysconfig.get_paths()['stdlib'] + os.sep


def _in_stdlib(filename: str) -> bool:
    """A file of Python's standard library (not an installed package), or a frozen one."""
    return (filename.startswith(_STDLIB) and 'packages' not in filename) or filename.startswith(
        '<frozen '
    )


#: Code objects of the toolkit's own signal handlers (`_triggers`): a stack taken while one
#: runs on a thread shows where the program was, the frame below it.
SIGNAL_HANDLERS: set[object] = set()


def below_handlers(frame: Any) -> Any:
    """``frame`` without the toolkit's signal handlers at its innermost end."""
    while frame is not None and frame.f_code in SIGNAL_HANDLERS:
        frame = frame.f_back
    return frame


def main_frame() -> Any:
    """The main thread's innermost frame (below a handler of ours), or None."""
    main = threading.main_thread().ident
    return below_handlers(sys._current_frames().get(main)) if main is not None else None


def main_frames(limit: int = 256) -> list[tuple[str, int, str, str]]:
    """The main thread's frames, innermost first, as ``(file, line, function, '')`` (no
    source read: cheap enough for a watchdog period), at most ``limit``."""
    frame = main_frame()
    frames: list[tuple[str, int, str, str]] = []
    while frame is not None and len(frames) < limit:
        frames.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name, ''))
        frame = frame.f_back
    return frames


def _stack_signature() -> int | None:
    frame = main_frame()
    if frame is None:
        return None
    # Python's own library at the innermost end left out (a poll loop calls
    # ``os.path.exists``, ``Event.wait``: Python code, in and out every turn), then the
    # innermost frame by its function only: a loop that polls in one function (sleep,
    # check, sleep) stands still; a call made or returned from anywhere else moves it.
    while frame.f_back is not None and _in_stdlib(frame.f_code.co_filename):
        frame = frame.f_back
    key: list[tuple[int, int]] = [(id(frame.f_code), -1)]
    frame, depth = frame.f_back, 1
    while frame is not None and depth < 64:
        key.append((id(frame.f_code), frame.f_lineno))
        frame, depth = frame.f_back, depth + 1
    return hash(tuple(key))


def sample() -> _Sample:
    times = os.times()
    return _Sample(
        time.monotonic(),
        times.user + times.system,
        _thread_cpu(threading.main_thread().native_id),
        _stack_signature(),
    )


def _run() -> None:
    while True:
        try:
            s = sample()
            with _s.lock:
                _s.samples.append(s)
        except Exception:  # a sample must never end the sampler
            pass
        time.sleep(PERIOD_S)


def ensure_started() -> None:
    """Starts the sampler thread unless it runs."""
    if _s.thread is not None and _s.thread.is_alive():
        return
    with _s.lock:
        if _s.thread is not None and _s.thread.is_alive():
            return
        _s.samples.append(sample())
        _s.thread = threading.Thread(target=_run, name=THREAD_NAME, daemon=True)
        _s.thread.start()


def pulse(window: float = WINDOW_S) -> Pulse | None:
    """This host's `Pulse` over about the last ``window`` seconds (now against the newest
    sample at least that old, else the oldest). Never waits: None when no sample is half a
    second old yet (the sampler just started: it starts with the debug thread, so a host
    asked has history), and when the main thread asks (its stack is the asking code)."""
    if threading.current_thread() is threading.main_thread():
        return None
    ensure_started()
    now = sample()
    with _s.lock:
        history = list(_s.samples)
    if not history or now.t - history[0].t < 0.5:
        return None
    old = [s for s in history if now.t - s.t >= window]
    ref = old[-1] if old else history[0]
    span = now.t - ref.t
    if span < 0.2:
        return None
    inside = [s for s in history if s.t >= ref.t] + [now]
    stacks = [s.stack for s in inside if s.stack is not None]
    moved = None if len(stacks) < 2 else len(set(stacks)) > 1
    main = None
    if now.main_cpu is not None and ref.main_cpu is not None:
        main = max(0.0, (now.main_cpu - ref.main_cpu) / span * 100)
    return Pulse(
        window=span,
        cpu=max(0.0, (now.cpu - ref.cpu) / span * 100),
        main_cpu=main,
        moved=moved,
        samples=len(inside),
    )


def _on_debug_start(client: object) -> None:
    ensure_started()  # history from the start: the first question has its window


def wire() -> None:
    """The sampler starts with the debug thread (`multihost._job._wiring`)."""
    _bus.on_start(_on_debug_start)
