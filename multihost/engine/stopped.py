"""The data tools on a job the notebook did not start, answered in each host's stopped frame.

An attached job (`mhnotebook.attach`) has no ipyparallel engines: its hosts'
main threads run the user's script. When they are stopped (paused at the step gate,
before a recorded launch, in a checked collective or barrier, in a
library's wait), each host's debug thread answers `%mh_allgather`,
`%mh_layout`, `%mh_diff`, `%mh_nonfinite`, `%mh_env` and `%mh_memory_census` with the same
engine functions a session's engines run (`multihost.engine`), over the
namespace of the main thread's *stopped frame*: the innermost frame of the
script (a frame of another library, of JAX or of ours is skipped), its
locals over its module's globals; `frames` lists the script's frames and a
frame number picks another. Names are parsed, never evaluated, as in every
magic. The tools read host copies of ready shards and launch nothing on a device
(`_checks._hostreads`): the devices of a stopped job are typically stuck inside the launch
one host never made, and a device program would queue behind it.

The tool runs on a thread of its own named ``multihost-inspect-<tag>``, the
tag the same on every host (the command's), so the collectives it makes
(replica checks, tree diffs) form a lane of their own (`_exchange._threads`)
and never take a number in the main thread's collective sequence. Bulk data
(a gather) streams from each host to the notebook over TCP, never through
the coordination service.

Process 0's control endpoint (`serve_control`) serves the method
``inspect``: one bus command (`_bus`) to every debug thread, whose replies
(pickled, base64 in JSON) it returns by process. Only the tools of the one
registry (`multihost.engine.tools.TOOLS`) that a stopped host may run can be asked for:
the control key grants inspection, not running code. A job started with
``--allow-exec`` (``install(allow_exec=True)``) also runs ``run_cell``: an attached
notebook's ``%%mh`` cell, in each host's stopped frame (`run_cell`), its output captured;
the host decides, never the notebook.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import secrets
import sys
import threading
import traceback
from types import FrameType
from typing import Any, Protocol

from multihost import _names, _recorder
from multihost._checks import _hostreads
from multihost._debug import _control, _hold, _stacks
from multihost._exchange import _bus, _kv
from multihost.engine import gather, tools
from multihost.engine.cell import _Exec, run_cell


class HeldOptions(Protocol):
    """What `patch` reads of `multihost._job._options.InstallOptions` (named here, not
    imported: `_job` stands above this room)."""

    @property
    def allow_exec(self) -> bool:
        """``--allow-exec``: an attached notebook may run code cells."""


__all__ = ['inspect', 'patch', 'run_cell', 'script_frames', 'unpatch']


#: The tools whose first argument is a name (probed on every host before any runs).
_NAMED = ('gather_meta', 'gather_send', 'gather_local', 'layout', 'diff', 'nonfinite')
#: Seconds the debug thread waits for a tool beyond the tool's own timeout.
_MARGIN_S = 10.0
#: The shortest wait for the hosts' states before a tool runs (whatever the tool's timeout).
_PROBE_MIN_S = 5.0
#: Names of a frame's locals listed by `frames` (the rest counted).
_MAX_NAMES = 40


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode()


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


def _main_stack() -> list[FrameType]:
    """The main thread's frames, innermost first (empty when it has none, at exit)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def _is_script(filename: str, internal: tuple[tuple[str, ...], str]) -> bool:
    """Whether ``filename`` is the user's program: not ours, JAX's, a library's or Python's."""
    if filename.startswith('<'):
        return False
    path = os.path.abspath(filename)
    packages, stdlib = internal
    if path.startswith(packages) or path.startswith(stdlib):
        return False
    return not any(d in path for d in (os.sep + 'site-packages' + os.sep, 'dist-packages'))


def script_frames() -> list[FrameType]:
    """The main thread's frames in the user's program, innermost first (frame 0 is the stopped one);
    on a host held on its error (`_debug._hold`), the frames of its traceback."""
    internal = _stacks.internal_dirs()
    stack = _hold.traceback_frames() if _hold.held_here() else _main_stack()
    return [f for f in stack if _is_script(f.f_code.co_filename, internal)]


def _site(frame: FrameType) -> str:
    code = frame.f_code
    return f'{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}'


def _state() -> dict[str, Any]:
    """Whether the main thread is stopped (inside a call of ours, JAX's or a library's) or
    running the program's own code, and where: ``{'stopped': bool, 'at': str, 'in': str}``."""
    error = _hold.held_here()
    if error is not None:
        frames = script_frames()
        at = _site(frames[0]) if frames else error['site']
        return {'stopped': True, 'at': at, 'in': f'held on its error: {_hold.describe(error)}'}
    told = _hold.held_error()
    because = {'because': _hold.describe(told)} if told is not None else {}
    stack = _main_stack()
    if not stack:
        return {'stopped': False, 'at': '', 'in': 'no main thread (the process is ending)'}
    internal = _stacks.internal_dirs()
    script = [f for f in stack if _is_script(f.f_code.co_filename, internal)]
    at = _site(script[0]) if script else ''
    if _is_script(stack[0].f_code.co_filename, internal):
        return {'stopped': False, 'at': at, 'in': 'its own code', **because}
    # The call it waits in: the innermost frame outside Python's own library (a threading
    # wait says little; the step gate, barrier or library call that waits says it all).
    stdlib = internal[1]
    inner = next((f for f in stack if not f.f_code.co_filename.startswith(stdlib)), stack[0])
    module = inner.f_globals.get('__name__', '') or os.path.basename(inner.f_code.co_filename)
    return {'stopped': True, 'at': at, 'in': f'{module}.{inner.f_code.co_name}', **because}


def _frames_info() -> list[dict[str, Any]]:
    out = []
    for n, frame in enumerate(script_frames()):
        names = sorted(k for k in frame.f_locals if not k.startswith('__'))
        out.append(
            {
                'n': n,
                'site': _site(frame),
                'file': frame.f_code.co_filename,
                'names': names[:_MAX_NAMES],
                'more': max(0, len(names) - _MAX_NAMES),
            }
        )
    return out


def _namespace(frame_no: int | str | None) -> dict[str, Any]:
    """The stopped frame's names: its module's globals, then its locals over them."""
    frames = script_frames()
    if not frames:
        raise gather.GatherError(
            'the main thread is in no frame of the program (it has not started or is ending)'
        )
    if isinstance(frame_no, str):  # a function's name: its innermost frame (hosts may differ)
        named = [i for i, f in enumerate(frames) if f.f_code.co_name == frame_no]
        if not named:
            sites = ', '.join(f'{i}: {_site(f)}' for i, f in enumerate(frames[:8]))
            raise gather.GatherError(f'no frame of function {frame_no!r} here ({sites})')
        frame_no = named[0]
    n = 0 if frame_no is None else int(frame_no)
    if not 0 <= n < len(frames):
        raise gather.GatherError(
            f'no frame {n}: the program has {len(frames)} frames here (0 = '
            f'{_site(frames[0])}, innermost); see job.frames()'
        )
    frame = frames[n]
    namespace = dict(frame.f_globals)
    if frame.f_locals is not frame.f_globals:
        namespace.update(frame.f_locals)
    namespace[_names.HELD_PLACE] = f'in frame {n} ({_site(frame)})'
    outer = f'; frame {n + 1} is {_site(frames[n + 1])}' if n + 1 < len(frames) else ''
    namespace[_names.HELD_HINT] = (
        f'job.frames() lists every frame and its names{outer} (frame=N, --frame N)'
    )
    return namespace


def _point(frame_no: int | str | None) -> dict[str, Any]:
    """Where this host's tool read (`_models._points.ReadPoint`'s JSON): the frame's line
    (chosen as `_namespace` chooses it) and how many times it launched each jitted function."""
    from multihost import _recorder
    from multihost._models._points import ReadPoint

    frames = script_frames()
    if isinstance(frame_no, str):
        frames = [f for f in frames if f.f_code.co_name == frame_no]
        frame_no = 0
    n = 0 if frame_no is None else int(frame_no)
    site = _site(frames[n]) if 0 <= n < len(frames) else ''
    return ReadPoint(_kv.process_index(), site, _recorder.call_counts()).to_json()


def _run_tool(order: dict[str, Any]) -> dict[str, Any]:
    """Runs the ordered tool on a thread named for the command (its lane), bounded."""
    name = order.get('fn')
    found = tools.TOOLS.get(str(name))
    if found is None or not found.on_stopped:
        known = sorted(t.name for t in tools.TOOLS.values() if t.on_stopped)
        return {'error': ['ValueError', f'no tool {name!r}; known: {known}', '']}
    fn, takes_namespace = found.function, found.namespace
    args, kwargs = _decode(order['args']) if order.get('args') else ((), {})
    timeout = float(order.get('seconds') or 60.0)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            with _recorder.reading_host_copies():  # never a device program (`_hostreads`)
                value = run()
            result['ok'] = _encode(value)
        except BaseException as exc:  # sent back, named by host
            result['error'] = [type(exc).__name__, str(exc), traceback.format_exc()]

    def run() -> Any:
        if takes_namespace:
            return fn(_namespace(order.get('frame')), *args, **kwargs)
        return fn(*args, **kwargs)

    tag = str(order.get('tag', 'x'))[:32]
    thread = threading.Thread(target=work, name=f'multihost-inspect-{tag}', daemon=True)
    thread.start()
    thread.join(timeout + _MARGIN_S)
    if thread.is_alive():
        why = f'{name} did not finish within {timeout + _MARGIN_S:g} s'
        if name == 'run_cell' and _interrupt(thread):  # a cell is the user's code: stop it
            why += '; it was interrupted (KeyboardInterrupt raised in it)'
        return {'error': ['TimeoutError', why, '']}
    return result


def _interrupt(thread: threading.Thread, wait: float = 5.0) -> bool:
    """Raises KeyboardInterrupt in ``thread`` (at its next Python instruction; a C call
    finishes first); whether it ended within ``wait`` seconds."""
    import ctypes

    if thread.ident is None:
        return False
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)
    )
    thread.join(wait)
    return not thread.is_alive()


def _probe(name: str, frame: int | str | None) -> str | None:
    """Why the value ``name`` names in ``frame`` cannot be read now (None: it can): missing,
    or a leaf donated to a launch (deleted) or produced by one that has not finished."""
    try:
        value, _ = gather.lookup(_namespace(frame), name, cuts=True)
    except gather.GatherError as exc:
        return str(exc)
    # Named with the launch it waits on, never waited for (`_checks._hostreads`); a stopped
    # host says which host and launch, and what to read instead (`_unfinished`).
    return _hostreads.unready(value, name, _unfinished)


def _unfinished(where: str) -> str:
    """Why ``where`` cannot be read on this host: the output of a launch it dispatched that
    waits for the stopped hosts (its inputs, a step's donated state, are gone), and what to
    read."""
    from multihost import _recorder

    me = _kv.process_index()
    record = _recorder.awaited_launch(me)
    launch = f'{record.name} call #{record.call}' if record is not None else 'a launch'
    return (
        f'{where} is, on process {me}, the output of {launch}, dispatched before the hosts '
        'stopped and unfinished (it waits for the stopped hosts: reading it would too). Read '
        'what the step started from on the hosts stopped before that launch, or its inputs here '
        'if the step did not donate them (donate_argnums); with --check-jit every host stops '
        'before its launch, its state readable'
    )


def _handle(client: Any, order: dict[str, Any]) -> str:
    """The bus command ``inspect`` on this host's debug thread."""
    only = order.get('only')
    if only is not None and _kv.process_index() not in only:
        return json.dumps({'skipped': True})
    op = order.get('op')
    if op == 'state':
        answer: dict[str, Any] = {'state': _state(), 'frames': _frames_info()}
        if order.get('probe') and answer['state']['stopped']:
            answer['unreadable'] = _probe(str(order['probe']), order.get('frame'))
        return json.dumps(answer)
    if op == 'call':
        state = _state()
        if not state['stopped'] and not order.get('running_ok'):
            return json.dumps({'running': state})
        try:
            point = _point(order.get('frame'))
        except Exception:  # where it read is a note: never the tool's failure
            point = None
        return json.dumps({**_run_tool(order), 'point': point})
    return json.dumps({'error': ['ValueError', f'unknown inspect op {op!r}', '']})


def inspect(
    op: str,
    *,
    fn: str = '',
    args: Any = ((), {}),
    frame: int | str | None = None,
    processes: list[int] | None = None,
    timeout: float = 60.0,
    running_ok: bool = False,
    probe: str | None = None,
) -> dict[int, dict[str, Any]]:
    """Process 0's control method: asks every host's debug thread (`_handle`), by process.

    ``op``: ``'state'`` (stopped or running, where, and the program's frames) or
    ``'call'`` (tool ``fn`` with ``args`` = (positional, keyword) in frame
    ``frame``). Each host's answer is a dict: ``{'ok': value}``, ``{'error':
    [type, message, traceback]}``, ``{'running': state}`` (not stopped; then no
    host ran the tool, and the stopped ones answer ``{'stopped': state}``), ``{'state':
    ..., 'frames': [...]}``; a host that did not answer in time is absent.
    """
    client = _bus.distributed()
    if client is None:
        raise RuntimeError('inspect needs a multi-process JAX job (jax.distributed)')
    params: dict[str, Any] = {
        'op': op,
        'fn': fn,
        'args': _encode(args) if op == 'call' else '',
        'frame': frame,
        'seconds': float(timeout),
        'tag': secrets.token_hex(6),
        'running_ok': bool(running_ok),
        'probe': probe,
    }
    if processes is not None:
        params['only'] = sorted(int(p) for p in processes)
    if op == 'call' and fn == 'run_cell' and not _Exec.allowed:  # said at once, stopped or not
        asked = list(range(_kv.process_count())) if processes is None else list(processes)
        try:
            run_cell({}, '')
        except PermissionError as exc:
            return {p: {'error': ['PermissionError', str(exc), '']} for p in asked}
    if op == 'call' and not running_ok:
        # Every host asked must be stopped before any runs the tool: a tool's collectives
        # (its own lane) would otherwise wait out their timeout for a host that runs on.
        name = args[0][0] if fn in _NAMED and args and args[0] else None
        # The probe's own bound, not the tool's: a short tool timeout (a cell's) must not
        # leave a loaded host too little time to say it is stopped.
        probe_s = max(_PROBE_MIN_S, min(timeout, _MARGIN_S))
        states = inspect('state', processes=processes, timeout=probe_s, probe=name, frame=frame)
        asked = list(range(_kv.process_count())) if processes is None else list(processes)
        if any(p not in states or not states[p]['state']['stopped'] for p in asked):
            # Nothing ran: each host's state (``running`` for those not stopped).
            return {
                p: {'running' if not a['state']['stopped'] else 'stopped': a['state']}
                for p, a in states.items()
            }
        unreadable = {p: a['unreadable'] for p, a in states.items() if a.get('unreadable')}
        if unreadable:  # nothing runs: a tool's collective would wait for the others
            return {
                p: {'error': ['GatherError', unreadable[p], '']}
                if p in unreadable
                else {'stopped': a['state']}
                for p, a in states.items()
            }
    wait = (timeout + 2 * _MARGIN_S) if op == 'call' else timeout
    replies, _ = _bus.command(client, 'inspect', wait, **params)
    out: dict[int, dict[str, Any]] = {}
    for p, raw in replies.items():
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {'error': ['ValueError', f'unreadable reply {raw[:80]!r}', '']}
        if answer.get('skipped'):
            continue
        if 'ok' in answer:
            answer['ok'] = _decode(answer['ok'])
        out[int(p)] = answer
    return out


def patch(options: HeldOptions) -> None:
    """An install patcher (`_job._install.patchers`): every host answers ``inspect``
    (``run_cell`` too with ``allow_exec``)."""
    _Exec.allowed = options.allow_exec
    _bus.register('inspect', _handle)
    _control.register_method('inspect', inspect)


def unpatch() -> None:
    """Undoes `patch` (a host no longer answers ``inspect``)."""
    _Exec.allowed = False
    _bus.unregister('inspect')
    _control.unregister_method('inspect')
