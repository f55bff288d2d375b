"""Stack capture: every host's Python stacks and current collective, also from blocked hosts.

Each host's debug thread (`_bus`) answers the ``stacks`` command with
`capture`; `where` issues it and waits, bounded, for every answer.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from multihost import _cells, _recorder
from multihost._cells import is_cell
from multihost._debug import _hold, _pulse, _stepgate
from multihost._exchange import _bus, _kv, _sequence
from multihost._models._stacks import Frame, HostStacks, ThreadStack, frame_words

MAX_FRAMES = 200
#: The multihost package's directory (this file is in one of its rooms).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def internal_dirs() -> tuple[tuple[str, ...], str]:
    """(package dirs of multihost, jax, jaxlib; the standard library's dir)."""
    import jax

    dirs = [
        _PACKAGE,
        os.path.dirname(os.path.abspath(jax.__file__)),
    ]
    try:
        import jaxlib

        dirs.append(os.path.dirname(os.path.abspath(jaxlib.__file__)))
    except ImportError:  # pragma: no cover - jax always brings jaxlib
        pass
    stdlib = os.path.abspath(sysconfig.get_paths()['stdlib']) + os.sep
    return tuple(d + os.sep for d in dirs), stdlib


def our_dirs() -> tuple[str, ...]:
    """The directories of this toolkit's packages here (multihost; mhnotebook if imported),
    each ending in a separator: frames inside them are ours, by path, never by file name."""
    dirs = [_PACKAGE + os.sep]
    nb = sys.modules.get('mhnotebook')  # never imported here
    nb_file = getattr(nb, '__file__', None)
    if nb_file:
        dirs.append(os.path.dirname(os.path.abspath(nb_file)) + os.sep)
    return tuple(dirs)


def user_frame(frames: tuple) -> str:
    """``file:line in function`` of the innermost frame in user code (a notebook cell:
    ``Cell In[4], line 3``, as this host's IPython numbered it).

    Skips multihost, jax, jaxlib and the standard library (but not packages
    installed under it), so a host blocked in a barrier shows the line that
    called it.
    """
    packages, stdlib = internal_dirs()
    for filename, lineno, func, _ in reversed(frames):
        path = os.path.abspath(filename)
        if filename.startswith('<frozen') or path.startswith(packages):
            continue
        if path.startswith(stdlib) and not any(
            d in path for d in ('site-packages', 'dist-packages')
        ):
            continue
        return _cells.place(filename, lineno, func)  # a cell: Cell In[4], line 3
    return ''


def frame_here(frame: Frame, ours: tuple[str, ...] = ()) -> str:
    """A frame in words, on the host that took it: `frame_words`, with a cell this host's
    IPython numbered as it says it (``Cell In[4], line 3``)."""
    filename, lineno, func, _ = frame
    if is_cell(filename) and _cells.cell_count(filename) is not None:
        return _cells.place(filename, lineno, func)
    return frame_words(frame, ours)


def _cell_counts(filenames: set[str]) -> tuple[tuple[str, int], ...]:
    """The execution counts this process's IPython gave the cells ``filenames`` (if any)."""
    counts = ((f, _cells.cell_count(f)) for f in sorted(filenames))
    return tuple((f, n) for f, n in counts if n is not None)


def _is_engine() -> bool:
    """Whether this process is an ipyparallel engine (its cells are numbered by the engine)."""
    ipython = sys.modules.get('IPython')
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, 'kernel', None)
    return kernel is not None and type(kernel).__module__.startswith('ipyparallel')


def capture(process: int | None = None, main_frames: Sequence[Any] | None = None) -> HostStacks:
    """This process's stacks (every Python thread but the debug thread), collective, and what
    its main thread waits at (its flight recorder's newest entry, if still waiting).
    ``main_frames`` (file, line, function, source; outermost first) stand for the main
    thread's (an uncaught error's traceback, when the main thread is in the hook)."""
    import traceback

    me = _bus.thread_ident()
    main_ident = threading.main_thread().ident
    by_ident = {t.ident: t for t in threading.enumerate()}
    threads = []
    where = ''
    for ident, frame in sys._current_frames().items():
        if ident == me and threading.get_ident() == me:
            continue  # the debug thread answering this request
        if ident == main_ident and main_frames is not None:
            frames = tuple(tuple(f) for f in main_frames)[-MAX_FRAMES:]
        else:
            summary = traceback.extract_stack(_pulse.below_handlers(frame))[-MAX_FRAMES:]
            frames = tuple((f.filename, f.lineno or 0, f.name, f.line or '') for f in summary)
        t = by_ident.get(ident)
        threads.append(
            ThreadStack(
                name=t.name if t else '<unknown>',
                ident=ident,
                main=ident == main_ident,
                daemon=bool(t.daemon) if t else True,
                frames=frames,
            )
        )
        if ident == main_ident:
            where = user_frame(frames)
    threads.sort(key=lambda t: (not t.main, t.name))
    gate = _stepgate.paused_at()
    pid = _kv.process_index() if process is None else process
    now = time.time()
    last, waiting, background = _recorder.in_progress(_recorder.snapshot(pid, _recorder.RECENT))
    cells = {f[0] for t in threads for f in t.frames if is_cell(f[0])}
    error = _hold.held_here()
    if error is not None:  # held on its error: where it raised, not where it waits
        where = error['site']
    return HostStacks(
        # Not naming the process: hosts held on the same error group into one row.
        held_error=f'raised {error["error"]} at {error["site"]}' if error is not None else '',
        process=pid,
        answered=True,
        hostname=socket.gethostname(),
        os_pid=os.getpid(),
        current=_sequence.current(),
        gate=gate,
        stepping=_stepgate.stepping_enabled(),
        where=where,
        threads=tuple(threads),
        time=now,
        waiting=waiting,
        waiting_for=now - waiting.time if waiting is not None else 0.0,
        background=background,
        last=last,
        idle=now - _recorder.last_advanced(),
        cells=_cell_counts(cells) if cells else (),
        engine=_is_engine(),
        ours=our_dirs(),
        pulse=_pulse.pulse(),
    )


def where(timeout: float = 10.0, *, gone: Mapping[int, str] | None = None) -> dict[int, HostStacks]:
    """Every host's Python stacks and current collective, also from blocked hosts.

    Callable from any process and any thread, including while the main
    threads are blocked in a barrier or collective: each host's debug thread
    answers. A host that does not answer within ``timeout`` is reported, not
    waited for.

    Args:
        timeout: seconds to wait for the answers.
        gone: processes known to be gone (e.g. dead in a recoverable job),
            each with why: not waited for; the reason is their ``error``.

    Returns:
        Process index -> `HostStacks`, for every process. A host that did not
        answer has ``answered=False``, an ``error`` saying why and, as
        ``current``, the last collective it published.
    """
    client = _bus.distributed()
    if client is None:
        return {_kv.process_index(): capture()}
    gone = dict(gone or {})
    replies, daemons = _bus.command(client, 'stacks', timeout, skip=gone)
    out: dict[int, HostStacks] = {}
    where: dict[int, Any] | None = None
    for p in range(_kv.process_count()):
        if p in replies:
            out[p] = HostStacks.from_json(replies[p])
            continue
        if where is None:
            try:
                where = _sequence.positions(client)
            except Exception:
                where = {}
        if p in daemons:
            info = daemons[p]
            error = gone.get(p) or (
                f'no answer within {timeout:g} s (process dead, frozen, or its '
                'debug thread stopped)'
            )
            out[p] = HostStacks(
                process=p,
                answered=False,
                hostname=info.get('hostname', ''),
                os_pid=info.get('os_pid', 0),
                current=where.get(p),
                error=error,
            )
        else:
            out[p] = HostStacks(
                process=p,
                answered=False,
                current=where.get(p),
                error=gone.get(p)
                or (
                    'no debug thread: the process has not entered a multihost collective '
                    'yet (call multihost.start_debug_daemon() after jax.distributed.initialize)'
                ),
            )
    return out


def wire() -> None:
    """The debug thread answers 'stacks' (`multihost._job._wiring`)."""
    _bus.register('stacks', lambda client, order: capture(_kv.process_index()).to_json())
