"""Stacks written from C, where Python cannot write: ``DIR/process-<i>.stacks.txt``.

Two cases leave a host unable to write its JSON dump: a C call that keeps the GIL (no
Python runs: neither the debug thread nor a Python signal handler answers until it
returns), and a fatal error (JAX aborts every host whose coordination service is gone,
at once, when process 0 dies; a segfault in native code). `faulthandler` writes every
thread's Python stack from C into one file opened beforehand (once the process index is
known, `arm`), for:

- the dump signal: `faulthandler.register` (chained to Python's own handler, so the
  JSON dump still follows when the GIL comes back);
- the GIL watchdog: `faulthandler.dump_traceback_later`, re-armed by the hang watchdog
  thread every period (`rearm`). When no Python thread can run for the hang limit, the
  watchdog is not re-armed and faulthandler's own C thread writes every stack;
- a fatal signal (SIGABRT, SIGSEGV, ...): `faulthandler.enable` (when the program has
  not enabled it itself), which then lets the signal end the process as before.

The file starts with one header line this module writes (process, count, pid, the main
thread's id, the hang limit); faulthandler appends its blocks after it. `read_dirs`
parses it back for ``analyze`` and ``postmortem`` (`NativeStacks`: the main thread's
latest frames, what wrote them, when).
"""

from __future__ import annotations

import atexit
import dataclasses
import faulthandler
import glob
import os
import re
import threading
from collections.abc import Iterable
from typing import IO

HEADER = '# multihost faulthandler stacks'
_HEAD = re.compile(
    r'^# multihost faulthandler stacks: '
    r'process (\d+) of (\d+), pid (\d+), main thread (0x[0-9a-f]+)'
)
_THREAD = re.compile(r'^(?:Current thread|Thread) (0x[0-9a-f]+)')
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def file_name(process: int) -> str:
    return f'process-{process}.stacks.txt'


class _Armed:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.file: IO[str] | None = None
        self.signum: int | None = None
        self.hang = 0.0
        self.header = 0  # bytes of the header line
        self.fatal = False  # faulthandler.enable is ours (to undo in disarm)


_a = _Armed()


def arm(directory: str, process: int, count: int, signum: int | None, hang: float) -> str | None:
    """Opens ``directory/process-<i>.stacks.txt`` (truncated: this run's only) and registers
    the dump signal with faulthandler; the path, or None when it cannot be written."""
    with _a.lock:
        if _a.file is not None:
            return _a.file.name
        path = os.path.join(directory, file_name(process))
        try:
            os.makedirs(directory, exist_ok=True)
            f = open(path, 'w')  # noqa: SIM115 (kept open: faulthandler writes to its fd)
            main = threading.main_thread().ident or 0
            f.write(
                f'{HEADER}: process {process} of {count}, pid {os.getpid()}, '
                f'main thread 0x{main:016x}, hang {hang:g} s\n'
            )
            f.flush()
            header = os.fstat(f.fileno()).st_size
        except OSError:
            return None
        _a.file, _a.hang, _a.header = f, hang, header
        atexit.register(disarm)  # a clean exit leaves no empty file
        if not faulthandler.is_enabled():  # the program's own choice stays
            try:
                faulthandler.enable(file=f, all_threads=True)
                _a.fatal = True
            except (RuntimeError, ValueError, OSError):
                pass
        if signum is not None:
            try:  # after Python's handler is set: faulthandler chains to it
                faulthandler.register(signum, file=f, all_threads=True, chain=True)
                _a.signum = signum
            except (RuntimeError, ValueError, OSError):
                pass
        return path


def rearm() -> None:
    """Pushes the GIL watchdog back by the hang limit (the hang watchdog calls it each period)."""
    f = _a.file
    if f is not None and _a.hang > 0:
        try:
            faulthandler.dump_traceback_later(_a.hang, repeat=False, file=f, exit=False)
        except (RuntimeError, ValueError, OSError):
            pass


def disarm() -> None:
    """Stops both writers (at exit, or when dumps are turned off); the file is removed when
    neither wrote to it (a run where nothing went wrong leaves no file)."""
    with _a.lock:
        if _a.file is None:
            return
        faulthandler.cancel_dump_traceback_later()
        if _a.signum is not None:
            try:
                faulthandler.unregister(_a.signum)
            except (RuntimeError, ValueError):
                pass
        _a.signum = None
        if _a.fatal:
            faulthandler.disable()
            _a.fatal = False
        f, _a.file = _a.file, None
        try:
            empty = os.fstat(f.fileno()).st_size <= _a.header  # only this module's header
            f.close()
            if empty:
                os.unlink(f.name)
        except (OSError, ValueError):
            pass


@dataclasses.dataclass(frozen=True)
class NativeStacks:
    """One host's faulthandler file, read back.

    Attributes:
        path: the file.
        process: its process index.
        pid: its OS process id.
        written: when it was last written (the file's modification time).
        frames: the main thread's frames in the latest block, innermost first
            (``(file, line, function)``); empty when the main thread was not in it.
        by_watchdog: the GIL watchdog wrote in this run (no Python thread ran for
            ``hang`` seconds), not only the dump signal.
        hang: the watchdog's limit, seconds.
        fatal: the fatal error that ended the process (``'Aborted'``, ``'Segmentation
            fault'``: faulthandler's words), or empty.
        num_processes: the job's size, from the header.
    """

    path: str
    process: int
    pid: int
    written: float
    frames: tuple[tuple[str, int, str], ...]
    by_watchdog: bool
    hang: float
    fatal: str = ''
    num_processes: int = 0


def parse(text: str, path: str = '<stacks>', written: float = 0.0) -> NativeStacks | None:
    """The latest main-thread block of a stacks file; None if it holds none (or no header)."""
    lines = text.splitlines()
    head = _HEAD.match(lines[0]) if lines else None
    if head is None:
        return None
    hang = re.search(r'hang ([0-9.]+) s', lines[0])
    main = int(head.group(4), 16)
    latest: list[tuple[str, int, str]] | None = None
    watchdog = False
    current: list[tuple[str, int, str]] | None = None
    fatal = ''
    for line in lines[1:]:
        if line.startswith('Fatal Python error: '):
            fatal = line[len('Fatal Python error: ') :].strip()
            current = None
            continue
        if line.startswith('Timeout ('):
            watchdog = True
            current = None
            continue
        m = _THREAD.match(line)
        if m is not None:
            current = [] if int(m.group(1), 16) == main else None
            if current is not None:
                latest = current
            continue
        f = _FRAME.match(line)
        if f is not None and current is not None:
            current.append((f.group(1), int(f.group(2)), f.group(3)))
    if latest is None:
        return None
    return NativeStacks(
        path=path,
        process=int(head.group(1)),
        pid=int(head.group(3)),
        written=written,
        frames=tuple(latest),
        by_watchdog=watchdog,
        fatal=fatal,
        num_processes=int(head.group(2)),
        hang=float(hang.group(1)) if hang else 0.0,
    )


def read_dirs(directories: Iterable[str]) -> list[NativeStacks]:
    """Every ``process-*.stacks.txt`` with a main-thread block (the newest per process)."""
    out: dict[int, NativeStacks] = {}
    for d in directories:
        for path in sorted(glob.glob(os.path.join(d, 'process-*.stacks.txt'))):
            try:
                with open(path, errors='replace') as f:
                    text = f.read()
                got = parse(text, path, os.path.getmtime(path))
            except OSError:
                continue
            old = out.get(got.process) if got is not None else None
            if got is not None and (old is None or got.written > old.written):
                out[got.process] = got
    return [out[p] for p in sorted(out)]
