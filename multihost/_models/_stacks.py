"""Where one host is: its threads' stacks and what it waits at (`HostStacks`), plain data.

A frame is classified by its file name alone (`frame_package`, `is_cell`, `cell_number`): user
code and notebook cells, or a framework (ipyparallel, ipykernel, IPython, tornado, asyncio, zmq,
the standard library, jax, multihost...) whose frames a view folds away; `stack_activity` says in
words what a stack is doing. Standard library only: the engines build these models
(`multihost._debug._stacks`) and the notebook's where view draws them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from multihost._cells import cell_number, is_cell
from multihost._models._pulse import WAITING_KINDS, Pulse
from multihost._models._records import CollectiveRecord
from multihost._recorder import SERVICE_BARRIER, SERVICE_WAIT, FlightRecord
from multihost._text import fmt_duration

#: One stack frame: (file name, line number, function name, source line).
Frame = tuple[str, int, str, str]

# -- frames: user code or framework (pure functions of the file name) -------------------

#: Packages whose frames are framework, not the user's, wherever they are
#: installed (also editable checkouts, found by a directory of that name).
FRAMEWORKS = frozenset(
    {
        'ipyparallel',
        'ipykernel',
        'IPython',
        'jupyter_client',
        'jupyter_core',
        'traitlets',
        'comm',
        'debugpy',
        'tornado',
        'zmq',
        'jax',
        'jaxlib',
        'jax_plugins',
        'multihost',
        'mhnotebook',
    }
)

# Cells (ipykernel's <tmp>/ipykernel_<pid>/<hash>.py, <ipython-input-<n>-<hash>>): `_cells`.
_FROZEN = re.compile(r'^<frozen ([\w.]+)>$')
# .../lib/python3.11/<module>..., also .../lib/python3.13t/ and Windows' ...\Lib\<module>
_STDLIB = re.compile(r'[/\\](?:lib[/\\]python\d+(?:\.\d+)?t?|Lib)[/\\]([^/\\]+)')
_SITE = re.compile(r'[/\\](?:site|dist)-packages[/\\]([^/\\]+)')


def _module(name: str) -> str:
    name = name.split('.', 1)[0]
    return name[:-3] if name.endswith('.py') else name


#: Our own packages: recognised by the directories a host reports (``ours``), never by a
#: file's name; without them (synthetic stacks), by a directory of that name.
OURS = frozenset({'multihost', 'mhnotebook'})


def _within(filename: str, ours: Sequence[str]) -> str | None:
    """The name of the package directory in ``ours`` that holds ``filename``, or None."""
    for d in ours:
        if filename.startswith(d):
            return re.split(r'[/\\]', d.rstrip('/\\'))[-1]
    return None


def frame_package(filename: str, ours: Sequence[str] = ()) -> str | None:
    """The framework a frame's file belongs to, or None for user code (pure).

    Framework: the standard library (named by its module: ``asyncio``,
    ``threading``, ``runpy``...), ``<frozen ...>`` modules, anything
    installed in ``site-packages`` / ``dist-packages`` (named by its top
    package) and the packages in `FRAMEWORKS` wherever they are. User code:
    notebook cells, other files, ``<string>`` and other exec'd code.

    ``ours``: the directories (ending in a separator) of this toolkit's
    packages on the host that took the stack. When given, a frame is ours
    only if its file is inside one of them: a user's ``multihost/`` folder
    or ``multihost.py`` is the user's.
    """
    return _package(filename, tuple(ours))


@functools.lru_cache(maxsize=8192)  # a view asks for the same files of every host's stack
def _package(filename: str, ours: tuple[str, ...]) -> str | None:
    if is_cell(filename):
        return None
    m = _FROZEN.match(filename)
    if m:
        return _module(m.group(1))
    if filename.startswith('<'):
        return None
    mine = _within(filename, ours)
    if mine is not None:
        return mine
    m = _SITE.search(filename)
    if m:
        return _module(m.group(1))
    parts = re.split(r'[/\\]', filename)
    for part in parts[:-1]:
        if part in FRAMEWORKS and not (ours and part in OURS):
            return part
    m = _STDLIB.search(filename)
    if m:
        return _module(m.group(1))
    return None


def display_path(filename: str, ours: Sequence[str] = ()) -> str:
    """A frame's file, short but never mistaken for ours (pure).

    ``/venv/.../site-packages/orbax/checkpoint/_src/multihost/multihost.py`` ->
    ``orbax/checkpoint/_src/multihost/multihost.py`` (from its package);
    ``/tmp/proj/multihost.py`` -> ``proj/multihost.py`` (a file or folder named
    like one of ours keeps its parent folder); ``/home/u/train.py`` ->
    ``train.py``; our own files -> ``multihost/_exchange/_kv.py``.
    """
    parts = [p for p in re.split(r'[/\\]', filename) if p]
    if not parts:
        return filename
    mine = _within(filename, ours)
    if mine is not None:
        return f'{mine}/{parts[-1]}'
    m = _SITE.search(filename)
    if m:
        return re.sub(r'\\', '/', filename[m.start(1) :])
    stem = parts[-1][:-3] if parts[-1].endswith('.py') else parts[-1]
    if len(parts) > 1 and (stem in OURS or parts[-2] in OURS):
        return f'{parts[-2]}/{parts[-1]}'
    return parts[-1]


# -- what a main thread's stack says it does (pure) ----------------------------------------

# Calls into the coordination service's client (C++: the innermost Python frame's source
# line names them).
_COORD = re.compile(r'\b(wait_at_barrier|blocking_key_value_get\w*|key_value_dir_get\w*)\s*\(')
_COORD_WORDS = {
    'wait_at_barrier': 'waiting in a coordination-service barrier',
    'blocking_key_value_get': 'waiting for a coordination-service key',
    'key_value_dir_get': 'reading coordination-service keys',
}
#: Functions of jax that wait for devices or other hosts (a collective, a device-to-host
#: copy, a dispatch that blocks): a stack ending in jax through one of them is waiting.
DEVICE_WAITS = frozenset(
    {
        'block_until_ready',
        '_single_device_array_to_np_array',
        '__array__',
        '_value',
        'device_get',
        'process_allgather',
        'broadcast_one_to_all',
        'sync_global_devices',
        'assert_equal',
        '_pjit_call_impl',
        '_pjit_call_impl_python',
        'call_impl_cache_miss',
        'cache_miss',
        'apply_primitive',
        'wait_until_ready',
    }
)
_JAX = frozenset({'jax', 'jaxlib', 'jax_plugins'})
#: Functions of jax that trace a jitted function, and those that lower and compile it (any
#: frame of ``jax/_src/compiler.py`` compiles too): a host inside one is busy and will come.
_TRACING = frozenset({'_trace_for_jit', 'trace_to_jaxpr', 'trace_to_jaxpr_dynamic'})
_COMPILING = frozenset(
    {'_pjit_lower', 'lower_sharding_computation', 'lower_jaxpr_to_module', 'from_hlo'}
)
#: Kinds that are busy even without a user frame on the stack.
_BUSY = frozenset({'coordination', 'device', 'jax'})
_SLEEP = re.compile(r'\bsleep\s*\(')
#: Standard-library modules a main thread waits in for input or output.
_IO = frozenset({'socket', 'selectors', 'ssl', 'select', 'subprocess', 'http', 'urllib', 'io'})
_LOCKS = frozenset({'threading', 'queue', 'concurrent', 'multiprocessing'})


def frame_words(frame: Frame, ours: Sequence[str] = ()) -> str:
    """``'train.py:88 in load'``, ``'orbax/checkpoint/...py:309 in _fn'``, ``'a notebook cell,
    line 3'``, ``'Cell In[4], line 3'`` (pure; `HostStacks.frame_label` also numbers cells)."""
    filename, lineno, func, _ = frame
    if is_cell(filename):
        n = cell_number(filename)
        cell = 'a notebook cell' if n is None else f'Cell In[{n}]'
        return f'{cell}, line {lineno}' + ('' if func == '<module>' else f' in {func}')
    return f'{display_path(filename, ours)}:{lineno} in {func}'


def stack_activity(
    frames: Sequence[Frame],
    ours: Sequence[str] = (),
    label: Any = None,
) -> tuple[str, str]:
    """What a main thread is doing, from its stack alone: ``(kind, words)`` (pure).

    ``kind`` is ``'coordination'`` (in the coordination service's barrier or
    key wait, e.g. called by orbax), ``'device'`` (inside a JAX collective or
    device wait: ``block_until_ready``, a device-to-host copy, a dispatch),
    ``'jax'`` (elsewhere in JAX: tracing, compiling), ``'sleep'``, ``'io'``,
    ``'lock'`` (a threading wait), ``'user'`` (running user code), ``'idle'``
    (no user frame: an engine's event loop) or ``''`` (no frames). ``words``
    follow "process 2 is" and name the place with its package
    (`display_path`), e.g. ``'waiting in a coordination-service barrier at
    orbax/checkpoint/_src/multihost/multihost.py:309 in _fn (via
    sync_global_processes), called from ckpt.py:12 in save'`` or ``'in user
    code at train.py:88 in load, in time.sleep'``. Durations are left out, so
    hosts in the same state say the same words.

    ``label``: how to name a frame (default `frame_words`).
    """
    if not frames:
        return '', ''
    stack = _Stack(frames, ours, label)
    return stack.coordination() or stack.jit() or stack.jax() or stack.user()


#: How the words for a host inside jit's trace or compile go on (`_Stack.jit`).
JITTED = 'a jitted function'


def phase_of(kind: str, words: str) -> str:
    """The `jit_phase` that `stack_activity`'s ``(kind, words)`` tell (pure), else ``''``."""
    if kind == 'jax':
        for phase in ('compiling', 'tracing'):
            if words.startswith(f'{phase} {JITTED}'):
                return phase
    return ''


def jit_phase(frames: Sequence[Frame]) -> str:
    """``'compiling'`` when a stack is inside jit's lowering or XLA's compile, ``'tracing'``
    when inside jit's tracing of the function, else ``''`` (pure; the frames' order and
    source lines do not matter). Such a host is busy, not waiting for another: jit's call
    frames (``cache_miss``, ``_pjit_call_impl``) alone would say a device wait."""
    phase = ''
    for filename, _, func, _ in frames:
        path = filename.replace('\\', '/')
        if '/jax/_src/' not in path:
            continue
        if path.endswith('/jax/_src/compiler.py') or func in _COMPILING:
            return 'compiling'
        if func in _TRACING:
            phase = 'tracing'
    return phase


class _Stack:
    """One main thread's stack, read from the innermost frame out (`stack_activity`'s parts)."""

    def __init__(self, frames: Sequence[Frame], ours: Sequence[str], label: Any) -> None:
        self.frames = frames
        self.name = label or (lambda f: frame_words(f, ours))
        self.pkgs = [frame_package(f[0], ours) for f in frames]
        users = [i for i, p in enumerate(self.pkgs) if p is None]
        self.top = users[-1] if users else -1  # the innermost user frame

    def tail(self, i: int, via: str = '') -> str:
        """`` (via f)`` (the library function the user called), ``, called from <user frame>``."""
        if not via and self.top + 1 < i:
            via = self.frames[self.top + 1][2]
        out = f' (via {via})' if via else ''
        if self.top >= 0 and self.top != i:
            out += f', called from {self.name(self.frames[self.top])}'
        return out

    def coordination(self) -> tuple[str, str] | None:
        """In the coordination service's barrier or key wait (below the innermost user frame)."""
        frames = self.frames
        for i in range(len(frames) - 1, max(self.top, 0) - 1, -1):
            m = _COORD.search(frames[i][3] or '')
            if m:
                call = m.group(1)
                what = next(w for k, w in _COORD_WORDS.items() if call.startswith(k))
                return 'coordination', f'{what} at {self.name(frames[i])}' + self.tail(i)
        return None

    def jit(self) -> tuple[str, str] | None:
        """Tracing or compiling a jitted function (`jit_phase`): at the innermost user frame
        (the call, or the traced function's line)."""
        phase = jit_phase(self.frames)
        if not phase:
            return None
        what = f'{phase} {JITTED}'
        if self.top < 0:
            return 'jax', what
        return 'jax', f'{what} at {self.name(self.frames[self.top])}'

    def jax(self) -> tuple[str, str] | None:
        """Inside JAX: a device wait or collective, or elsewhere."""
        pkgs, frames = self.pkgs, self.frames
        if pkgs[-1] not in _JAX:
            return None
        j = len(frames) - 1
        while j > 0 and pkgs[j - 1] in _JAX:
            j -= 1
        run = frames[j:]
        if any(f[2] in DEVICE_WAITS for f in run):
            kind, what = 'device', 'inside a JAX collective or device wait'
        else:
            kind, what = 'jax', f'inside JAX ({run[-1][2]})'
        if j == 0:
            return kind, what
        return kind, f'{what} at {self.name(frames[j - 1])}' + self.tail(j - 1, run[0][2])

    def user(self) -> tuple[str, str]:
        """Idle, or in user code: sleeping, in I/O, waiting on a lock, or running."""
        frames, top, inner = self.frames, self.top, self.pkgs[-1]
        if top < 0:  # an idle engine's event loop, a daemon's wait: nothing of the user's
            return 'idle', 'idle (no user code running)'
        here = self.name(frames[top])
        where = f'in user code at {here}'
        last = frames[-1]
        if _SLEEP.search(last[3] or '') or (inner == 'time' and last[2] == 'sleep'):
            return 'sleep', f'{where}, in time.sleep'
        if inner in _IO:
            return 'io', f'{where}, in {inner} I/O ({last[2]})'
        if inner in _LOCKS:
            return 'lock', f'{where}, waiting in {inner} ({last[2]})'
        if top == len(frames) - 1:
            return 'user', f'running user code at {here}'
        return 'user', f'running user code at {here}, in {inner} ({last[2]})'


def is_user_frame(frame: Frame, ours: Sequence[str] = ()) -> bool:
    """Whether a frame is the user's (a cell or a file outside every framework)."""
    return frame_package(frame[0], ours) is None


def framework_summary(frames: Sequence[Frame], names: int = 3) -> str:
    """``'37 framework frames (ipyparallel, ipykernel, asyncio, ...)'``: the folded line.

    Packages are named most frequent first, at most ``names`` of them.
    """
    counts = collections.Counter(p for p in (frame_package(f[0]) for f in frames) if p is not None)
    n = sum(counts.values())
    head = f'{n} framework frame{"" if n == 1 else "s"}'
    if not counts:
        return head
    top = [p for p, _ in counts.most_common(names)]
    more = ', ...' if len(counts) > names else ''
    return f'{head} ({", ".join(top)}{more})'


def display_site(site: str, ours: Sequence[str] = ()) -> str:
    """A recorded ``file:line`` (or ``file:line in f``) with its file shortened (`display_path`)."""
    path, sep, line = site.rpartition(':') if ' in ' not in site else site.partition(':')
    if not sep:
        return site
    return display_path(path, ours) + sep + line


def waiting_words(rec: FlightRecord, ours: Sequence[str] = ()) -> str:
    """What follows "waiting" for an entry not yet left (pure): ``"at barrier('x') #7"``, ``"in
    service barrier 'ckpt' at orbax/checkpoint/.../multihost.py:318"``, ``"for service key 'k'
    at f.py:3"`` (a library's own calls on the coordination service name their call site)."""
    if rec.kind == SERVICE_BARRIER:
        where = f'in {rec.label}'
    elif rec.kind == SERVICE_WAIT:
        where = f'for service key {rec.name!r}'
    elif rec.is_launch:
        return f'at the cross-host check of launch {rec.label}'
    else:
        return f'at {rec.label}'
    thread = f' (thread {rec.thread!r})' if rec.thread else ''
    return f'{where} at {display_site(rec.site, ours)}{thread}'


def background_words(records: Sequence[FlightRecord], now: float, ours: Sequence[str] = ()) -> str:
    """``"; also waiting in service barrier 'x' at f.py:3 (thread 'save') for 4 s"`` per
    service call another thread is inside (empty when none; ``now``: the host's clock)."""
    return ''.join(
        f'; also waiting {waiting_words(r, ours)} for {fmt_duration(max(now - r.time, 0.0))}'
        for r in records
    )


def _what(kind: str, name: str) -> str:
    return f'{kind}({name!r})' if name else kind


@dataclasses.dataclass(frozen=True)
class ThreadStack:
    """One Python thread's stack.

    Attributes:
        name: the thread's name (``threading``), or ``'<unknown>'``.
        ident: the thread's identifier.
        main: whether it is the main thread.
        daemon: whether it is a daemon thread.
        frames: outermost first, as (file, line, function, source line).
    """

    name: str
    ident: int
    main: bool
    daemon: bool
    frames: tuple[Frame, ...]

    @property
    def stack(self) -> str:
        """The stack formatted like a traceback."""
        return self.format()

    def format(self, cells: Mapping[str, int] | None = None) -> str:
        """The stack formatted like a traceback; a cell as IPython's tracebacks name it,
        ``Cell In[4], line 3, in f``, when ``cells`` (file -> count) or its name numbers it."""
        out = []
        for filename, lineno, func, line in self.frames:
            n = None
            if is_cell(filename):
                n = (cells or {}).get(filename)
                n = cell_number(filename) if n is None else n
            head = f'Cell In[{n}]' if n is not None else f'File "{filename}"'
            out.append(f'  {head}, line {lineno}, in {func}\n')
            if line:
                out.append(f'    {line}\n')
        return ''.join(out)


@dataclasses.dataclass(frozen=True)
class HostStacks:
    """Where one host is: its threads' stacks, what it waits at, what it is doing.

    Attributes:
        process: the host's process index.
        answered: whether the host's debug thread answered in time. When
            False, ``threads`` is empty, ``error`` says why, and ``current``
            is the last collective the host published to the coordination
            service (if any).
        hostname: the machine's name.
        os_pid: the operating-system process id.
        current: the collective the main thread last entered (it may have
            left it long ago: ``waiting`` says whether it is there now).
        gate: the step whose release the host is waiting for (stepping), or None.
        stepping: whether stepping is on in that process.
        where: the main thread's innermost frame in user code (outside
            multihost, jax and the standard library), ``file:line in function``.
        threads: every Python thread's stack (the debug thread itself excluded).
        time: when the stacks were taken (``time.time()``).
        error: why there is no answer (empty when ``answered``).
        waiting: the flight-recorder entry whose cross-host check (barrier,
            collective, watched launch) the main thread waits at now, or None.
        waiting_for: seconds it has waited there (the host's clock).
        last: the newest flight-recorder entry (what the host last entered).
        idle: seconds since the host last entered or left a recorded call.
        cells: file name -> the execution count the host's IPython gave that
            cell, for the cells in ``threads``.
        engine: the host is an ipyparallel engine (its cell numbers count the
            cells the engine ran, as the tracebacks of a failed ``%%mh`` cell
            do, not the notebook's ``In[n]``).
        ours: the directories of this toolkit's packages on that host: frames
            there are ours (`frame_package`); a file elsewhere named like them
            is not.
        background: service calls (a library's own barriers and key waits)
            still in progress on threads other than the main thread, oldest
            first.
        held_error: the host is held on its own error (``--hold-on-error``):
            ``"raised ValueError('bad batch') at train.py:74"`` (the row names the host).
        pulse: its CPU share and whether its main thread's stack moved over the last
            few seconds (`Pulse`), or None (not sampled).
    """

    process: int
    answered: bool
    hostname: str = ''
    os_pid: int = 0
    current: CollectiveRecord | None = None
    gate: int | None = None
    stepping: bool = False
    where: str = ''
    threads: tuple[ThreadStack, ...] = ()
    time: float = 0.0
    error: str = ''
    waiting: FlightRecord | None = None
    waiting_for: float = 0.0
    last: FlightRecord | None = None
    idle: float = 0.0
    cells: tuple[tuple[str, int], ...] = ()
    engine: bool = False
    ours: tuple[str, ...] = ()
    background: tuple[FlightRecord, ...] = ()
    held_error: str = ''
    pulse: Pulse | None = None

    @property
    def main_thread(self) -> ThreadStack | None:
        """The main thread's stack, if it was taken."""
        return next((t for t in self.threads if t.main), None)

    # -- frames in words ------------------------------------------------------------------

    def cell_name(self, filename: str) -> str | None:
        """``'Cell In[4]'`` (as the host's IPython numbered the cell, the words of its
        tracebacks), ``'a notebook cell'`` (a cell's file it did not number) or None."""
        if not is_cell(filename):
            return None
        n = dict(self.cells).get(filename)
        if n is None:
            n = cell_number(filename)
        if n is None:
            return 'a notebook cell'
        return f'Cell In[{n}]'

    def frame_label(self, frame: Frame) -> str:
        """``'Cell In[4], line 3'``, ``'Cell In[4], line 3 in f'``, ``'data.py:88 in load'``."""
        filename, lineno, func, _ = frame
        cell = self.cell_name(filename)
        if cell is not None:
            inside = '' if func == '<module>' else f' in {func}'
            return f'{cell}, line {lineno}{inside}'
        return f'{display_path(filename, self.ours)}:{lineno} in {func}'

    def thread_text(self, thread: ThreadStack) -> str:
        """A thread's stack like a traceback, its cells as this host's IPython numbered them."""
        return thread.format(dict(self.cells))

    def user_frames(self, thread: ThreadStack | None = None) -> tuple[Frame, ...]:
        """The user's frames of a thread (default: the main thread), outermost first."""
        t = self.main_thread if thread is None else thread
        return () if t is None else tuple(f for f in t.frames if is_user_frame(f, self.ours))

    @property
    def main_activity(self) -> tuple[str, str]:
        """What the main thread's stack says it does: `stack_activity` (kind, words)."""
        main = self.main_thread
        if main is None:
            return '', ''
        return stack_activity(main.frames, self.ours, self.frame_label)

    @property
    def at(self) -> str:
        """The main thread's innermost user frame in words (`frame_label`), or ``where``."""
        frames = self.user_frames()
        return self.frame_label(frames[-1]) if frames else self.where

    # -- what the host is doing -------------------------------------------------------------

    @property
    def activity(self) -> str:
        """``'no answer'``, ``'paused'`` (step gate), ``'waiting'`` (cross-host check),
        ``'running'`` (user code), ``'idle'`` (no user code on the main thread) or
        ``'unknown'`` (no main-thread stack)."""
        if not self.answered:
            return 'no answer'
        if self.gate is not None:
            return 'paused'
        if self.waiting is not None:
            return 'waiting'
        main = self.main_thread
        if main is None:
            return 'running' if self.where else 'unknown'
        return 'running' if self.user_frames() else 'idle'

    def describe_doing(self, waited: str | None = None, idle: str | None = None) -> str:
        """`doing`, with the durations given as text (a group shows its range), and the
        service calls other threads are inside."""
        return self._main_doing(waited, idle) + background_words(
            self.background, self.time, self.ours
        )

    def _main_doing(self, waited: str | None, idle: str | None) -> str:
        waited = fmt_duration(self.waiting_for) if waited is None else waited
        idle = fmt_duration(self.idle) if idle is None else idle
        activity = self.activity
        if self.held_error and activity != 'no answer':
            return f'held on its error: {self.held_error} (--hold-on-error; release_all ends it)'
        if activity == 'no answer':
            last = self.current
            why = self.error if self.error.startswith('no answer') else f'no answer: {self.error}'
            return why + (
                f'; last published {_what(last.kind, last.name)} #{last.seq}' if last else ''
            )
        if activity == 'paused':
            c = self.current
            what = f' ({_what(c.kind, c.name)})' if c is not None and c.seq == self.gate else ''
            return f'waiting for release of #{self.gate}{what}' + (
                f' for {waited}' if self.waiting is not None else ''
            )
        if activity == 'waiting':
            w = self.waiting
            assert w is not None
            return f'waiting {waiting_words(w, self.ours)} for {waited}'
        kind, words = self.main_activity
        compiling = bool(phase_of(kind, words))
        if kind not in ('', 'user', 'idle') and (activity == 'running' or kind in _BUSY):
            head = words  # in a device wait, a coordination-service barrier, time.sleep...
        elif activity == 'running':
            head = f'running user code at {self.at}'
        elif activity == 'idle':
            head = 'idle (no user code running)'
        else:
            head = 'main thread not seen'
        return head + self._last_words(idle, compiling)

    def _last_words(self, idle: str, compiling: bool = False) -> str:
        last = self.last
        if last is not None:
            what = 'launch' if last.is_launch else 'collective'
            # A launch whose output is not ready: the host may be inside it, or ahead of it
            # (async dispatch); either way the device has not finished it. Unless the stack
            # is still in jit's compile: the call has not launched it yet.
            busy = ''
            if last.is_launch and last.state == 'launched':
                busy = ', being compiled' if compiling else ', not done on device'

            return f', last {what} {last.label} ({idle} ago{busy})'
        c = self.current
        if c is not None:
            ago = ''
            if self.time and c.time:
                ago = f' (entered {fmt_duration(self.time - c.time)} ago)'
            return f', last collective {_what(c.kind, c.name)} #{c.seq}{ago}'
        return ', no collective yet'

    @property
    def doing(self) -> str:
        """What the host is doing now, in words.

        ``"waiting at barrier('after-eval') #7 for 12 s"``, ``"waiting for
        release of #5 (barrier('x')) for 3 s"`` (stepping), ``"running user
        code at cell 4, line 3, last collective barrier('x') #4 (20 s ago)"``,
        ``"idle (no user code running), ..."``, ``"no answer: ..."``.
        """
        return self.describe_doing()

    @property
    def state(self) -> tuple[Any, ...]:
        """What hosts in the same state share (durations aside): the key views group by.

        Same activity and: the same step gate, the same check waited at, or
        the same innermost user frame and last recorded call; and the same
        service calls in progress on other threads.
        """
        main = self._main_state()
        if not self.background:
            return main
        return (*main, tuple((r.kind, r.name, r.call, r.thread) for r in self.background))

    def _main_state(self) -> tuple[Any, ...]:
        # No call sites or cell paths in the key: a cell's file is in a directory
        # named after each host's pid.
        activity = self.activity
        c = self.current
        cur = None if c is None else (c.seq, c.kind, c.name)
        if activity == 'no answer':
            return (activity, self.error, cur)
        if activity == 'paused':
            return (activity, self.gate, cur)
        if activity == 'waiting':
            w = self.waiting
            assert w is not None
            return (activity, w.kind, w.name, w.call, w.seq)
        frames = self.user_frames()
        last = self.last
        return (
            activity,
            self.main_activity[0],
            self._frame_key(frames[-1]) if frames else self.where,
            None if last is None else (last.kind, last.name, last.call, last.seq),
            cur if last is None else None,
        )

    def _frame_key(self, frame: Frame) -> tuple[Any, ...]:
        filename, lineno, func, _ = frame
        cell = self.cell_name(filename)
        if cell is not None:  # same code, same name: <tmp>/ipykernel_<pid>/<hash>.py
            return (cell, re.split(r'[/\\]', filename)[-1], lineno, func)
        return (filename, lineno, func)

    # -- text --------------------------------------------------------------------------------

    def format(self) -> str:
        """Plain text: a header saying what the host is doing, then every thread's stack."""
        head = f'process {self.process}'
        if self.hostname:
            head += f' ({self.hostname}, pid {self.os_pid})'
        head += f': {self.doing}'
        waits = self.waiting is not None or self.main_activity[0] in WAITING_KINDS
        if self.pulse is not None and self.answered and not waits:
            head += f'; {self.pulse.words}'
        if not self.answered:
            last = self.current
            return head + (f'\n  last collective: {last.describe()}' if last else '')
        parts = [
            head,
            f'  last collective entered: {self.current.describe()}' if self.current else '',
            f'  where: {self.where}' if self.where else '',
        ]
        for t in self.threads:
            parts.append(f'Thread {t.name!r}{" (main)" if t.main else ""}:\n{self.thread_text(t)}')
        return '\n'.join(p for p in parts if p)

    def __str__(self) -> str:
        return self.format()

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d['current'] = None if self.current is None else dataclasses.asdict(self.current)
        d['threads'] = [dataclasses.asdict(t) for t in self.threads]
        for f in ('waiting', 'last'):
            rec = d[f]
            d[f] = None if rec is None else dataclasses.astuple(rec)
        d['background'] = [dataclasses.astuple(r) for r in self.background]
        d['pulse'] = None if self.pulse is None else self.pulse.to_dict()
        return json.dumps(d, separators=(',', ':'))

    @classmethod
    def from_json(cls, text: str) -> HostStacks:
        d: dict[str, Any] = json.loads(text)
        d['pulse'] = Pulse.from_dict(d.get('pulse'))
        if d.get('current') is not None:
            d['current'] = CollectiveRecord(**d['current'])
        d['threads'] = tuple(
            ThreadStack(**{**t, 'frames': tuple(tuple(f) for f in t['frames'])})
            for t in d.get('threads', ())
        )
        for f in ('waiting', 'last'):
            if d.get(f) is not None:
                d[f] = FlightRecord(*d[f])
        d['cells'] = tuple((str(k), int(v)) for k, v in d.get('cells', ()))
        d['ours'] = tuple(str(x) for x in d.get('ours', ()))
        d['background'] = tuple(FlightRecord(*r) for r in d.get('background', ()))
        return cls(**d)
