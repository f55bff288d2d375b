"""The debug thread: stack dumps and barrier stepping, also while the main thread is blocked.

Every process runs one daemon thread (started the first time the process
enters a multi-host collective, or by `start_debug_daemon`). It waits for
commands in the coordination service's key-value store, so it answers while
the main thread is stuck in a barrier, a device collective or user code (the
GIL is released in all of those). It never polls: it blocks in one long-poll
``blocking_key_value_get`` for the next command number: about two RPCs per
thirty seconds when idle, so it scales to hundreds of hosts.

Keys (``mh/`` prefix, coordination service of ``jax.distributed``)::

    mh/ctl/n            command counter (key_value_increment by the issuer)
    mh/ctl/<g>          command number g: {"cmd": "stacks" | "stepping", ...}
    mh/rep/<g>/<pid>    process pid's reply to command g (deleted by the issuer)
    mh/dmn/<pid>        process pid's debug thread is listening to commands > "since"
    mh/step/on          "1" while stepping is on (read at start and on "stepping")
    mh/step/go/<k>      step k is released
    mh/step/wait/<k>/<pid>  pid waits at step k's gate (written before its arrival)
    mh/seq/<k>/<pid>    (from `_sequence`) what pid called at step k: its arrival

An issuer (any thread of any process, or the control endpoint serving a
notebook) takes a number from the counter, writes the command, and collects
the replies of the debug threads registered before that number, each wait
bounded by its timeout; hosts that do not answer are reported, never waited
for forever.

The step gate runs in `_sequence.enter` around the host's arrival at step k
(the record it publishes) and before the barrier: while stepping is on (a
process-local flag: zero RPCs when off), the host marks itself waiting,
publishes its arrival, and waits until ``mh/step/go/<k>`` appears or stepping
is switched off.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import sysconfig
import threading
import time
from typing import Any

from multihost import _jax_adapter, _kv, _sequence
from multihost._debugmodel import HostStacks, StepTable, ThreadStack
from multihost._errors import StepTimeoutError

#: Default timeout (seconds) of the step gate, unless ``MULTIHOST_STEP_TIMEOUT``
#: says otherwise: how long a host waits for a step to be released.
DEFAULT_STEP_TIMEOUT = 3600.0

# Long-poll slices. The idle debug thread costs its host about two RPCs per
# _IDLE_SLICE_S (fewer than the coordination service's own heartbeats), and a
# command number lost by a dying issuer is skipped after two slices. The gate's
# waiter only runs while its host is paused at a step.
_IDLE_SLICE_S = 30.0
_SLICE_S = 10.0
_MAX_FRAMES = 200
_THREAD_NAME = 'multihost-debug'


def _key(*parts: object) -> str:
    return _sequence._key(*parts)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def step_timeout() -> float:
    """The step gate's timeout: ``MULTIHOST_STEP_TIMEOUT`` or `DEFAULT_STEP_TIMEOUT`."""
    raw = os.environ.get('MULTIHOST_STEP_TIMEOUT', '')
    if raw == '':
        return DEFAULT_STEP_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f'MULTIHOST_STEP_TIMEOUT must be a number of seconds, got {raw!r}.'
        ) from None
    if value <= 0:
        raise ValueError(f'MULTIHOST_STEP_TIMEOUT must be positive, got {raw!r}.')
    return value


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client: Any = None
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.stepping = False  # read by the gate without a lock: a bool is atomic
        self.gate: tuple[int, threading.Event] | None = None


_state = _State()


def _process_index() -> int:
    return _kv.process_index()  # never initializes the backend


def _process_count() -> int:
    return _kv.process_count()


def _distributed() -> Any | None:
    """The coordination client when more than one process runs, else None."""
    client = _jax_adapter.client()
    if client is None or _process_count() == 1:
        return None
    return client


# -- the daemon thread -------------------------------------------------------------


def start_debug_daemon() -> bool:
    """Starts this process's debug thread, if not running yet.

    It starts by itself the first time the process enters a multi-host
    collective; call this right after ``jax.distributed.initialize`` to make
    a process reachable (stacks, stepping) before its first collective.

    Returns:
        True when the thread runs; False in a single process (nothing to do).
    """
    client = _distributed()
    if client is None:
        return False
    ensure_started(client)
    return True


def ensure_started(client: Any) -> None:
    """Starts the debug thread for ``client`` unless it runs (cheap when it does).

    Synchronous on first call: when it returns, the thread listens to every
    command issued from now on and the stepping flag is current.
    """
    if _state.client is client and _state.thread is not None and _state.thread.is_alive():
        return
    with _state.lock:
        if _state.client is client and _state.thread is not None and _state.thread.is_alive():
            return
        if _state.thread is not None:  # an earlier jax.distributed session
            _state.stop.set()
        pid = _process_index()
        # Order matters (see _command): read the counter, then the flag, then
        # register. A command numbered <= since was issued after its state
        # was written, so the flag read here already reflects it.
        since = client.key_value_increment(_key('ctl', 'n'), 0)
        _state.stepping = _try_get(client, _key('step', 'on')) == '1'
        client.key_value_set(
            _key('dmn', pid),
            json.dumps(
                {
                    'process': pid,
                    'since': since,
                    'hostname': socket.gethostname(),
                    'os_pid': os.getpid(),
                    'time': time.time(),
                }
            ),
            allow_overwrite=True,
        )
        stop = threading.Event()
        thread = threading.Thread(
            target=_loop, args=(client, pid, since + 1, stop), name=_THREAD_NAME, daemon=True
        )
        _state.client, _state.thread, _state.stop = client, thread, stop
        thread.start()


def _try_get(client: Any, key: str) -> str | None:
    try:
        return client.key_value_try_get(key)
    except Exception:  # NOT_FOUND (an XlaRuntimeError)
        return None


def _current_client(client: Any) -> bool:
    return _jax_adapter.client() is client


def _loop(client: Any, pid: int, g: int, stop: threading.Event) -> None:
    """Handles commands g, g+1, ... until the distributed session ends."""
    misses, backoff = 0, 0.5
    while not stop.is_set():
        try:
            raw = client.blocking_key_value_get(_key('ctl', g), _ms(_IDLE_SLICE_S))
        except Exception as exc:
            if stop.is_set() or not _current_client(client):
                return  # jax.distributed.shutdown() (CANCELLED) or a new session
            if _sequence.is_timeout(exc):
                # A command number whose issuer died before writing it would
                # block every later command: skip it after two idle slices.
                try:
                    counter = client.key_value_increment(_key('ctl', 'n'), 0)
                except Exception:
                    counter = g
                misses = misses + 1 if counter > g else 0
                if misses >= 2:
                    g, misses = g + 1, 0
                continue
            stop.wait(backoff)  # the coordinator is unreachable: retry, slowly
            backoff = min(backoff * 2, 30.0)
            continue
        misses, backoff = 0, 0.5
        try:
            _handle(client, pid, g, raw)
        except Exception:  # never let one bad command kill the thread
            if not _current_client(client):
                return
        g += 1


def _handle(client: Any, pid: int, g: int, raw: str) -> None:
    try:
        cmd = json.loads(raw).get('cmd')
    except (ValueError, AttributeError):
        cmd = None
    if cmd == 'stacks':
        reply = capture(pid).to_json()
    elif cmd == 'stepping':
        _apply_stepping(_try_get(client, _key('step', 'on')) == '1')
        reply = json.dumps({'stepping': _state.stepping})
    else:
        reply = json.dumps({'unknown': cmd})
    client.key_value_set(_key('rep', g, pid), reply, allow_overwrite=True)


def _apply_stepping(on: bool) -> None:
    with _state.lock:
        _state.stepping = on
        if not on and _state.gate is not None:
            _state.gate[1].set()  # stepping off releases this host's gate


def _command(client: Any, cmd: str, timeout: float) -> tuple[dict[int, str], dict[int, dict]]:
    """Issues ``cmd`` to every debug thread; returns (replies, registered threads).

    Waits at most ``timeout`` seconds (plus two RPCs) for the replies of the
    threads registered before the command; the rest are simply absent.
    """
    ensure_started(client)  # so that this process answers too
    g = client.key_value_increment(_key('ctl', 'n'), 1)
    client.key_value_set(
        _key('ctl', g),
        json.dumps({'cmd': cmd, 'by': _process_index(), 'time': time.time()}),
        allow_overwrite=True,
    )
    daemons: dict[int, dict] = {}
    for value in _kv.read_dir(client, _key('dmn')).values():
        info = json.loads(value)
        daemons[int(info['process'])] = info
    expected = sorted(p for p, info in daemons.items() if info['since'] < g)
    replies: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    for p in expected:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            replies[p] = client.blocking_key_value_get(_key('rep', g, p), _ms(left))
        except Exception as exc:
            if not _sequence.is_timeout(exc):
                raise
            break  # out of time: pick up whoever answered below
    prefix = _key('rep', g)
    for p, value in _kv.read_dir(client, prefix).items():
        replies.setdefault(p, value)
    _kv.delete(client, prefix + '/')
    return replies, daemons


# -- stacks ----------------------------------------------------------------------------


def _internal_dirs() -> tuple[tuple[str, ...], str]:
    """(package dirs of multihost, jax, jaxlib; the standard library's dir)."""
    import jax

    dirs = [
        os.path.dirname(os.path.abspath(__file__)),
        os.path.dirname(os.path.abspath(jax.__file__)),
    ]
    try:
        import jaxlib

        dirs.append(os.path.dirname(os.path.abspath(jaxlib.__file__)))
    except ImportError:  # pragma: no cover - jax always brings jaxlib
        pass
    stdlib = os.path.abspath(sysconfig.get_paths()['stdlib']) + os.sep
    return tuple(d + os.sep for d in dirs), stdlib


def _user_frame(frames: tuple) -> str:
    """``file:line in function`` of the innermost frame in user code.

    Skips multihost, jax, jaxlib and the standard library (but not packages
    installed under it), so a host blocked in a barrier shows the line that
    called it.
    """
    packages, stdlib = _internal_dirs()
    for filename, lineno, func, _ in reversed(frames):
        path = os.path.abspath(filename)
        if filename.startswith('<frozen') or path.startswith(packages):
            continue
        if path.startswith(stdlib) and not any(
            d in path for d in ('site-packages', 'dist-packages')
        ):
            continue
        return f'{filename}:{lineno} in {func}'
    return ''


def capture(process: int | None = None) -> HostStacks:
    """This process's stacks (every Python thread but the debug thread) and collective."""
    import traceback

    me = _state.thread.ident if _state.thread is not None else None
    main_ident = threading.main_thread().ident
    by_ident = {t.ident: t for t in threading.enumerate()}
    threads = []
    where = ''
    for ident, frame in sys._current_frames().items():
        if ident == me and threading.get_ident() == me:
            continue  # the debug thread answering this request
        summary = traceback.extract_stack(frame)[-_MAX_FRAMES:]
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
            where = _user_frame(frames)
    threads.sort(key=lambda t: (not t.main, t.name))
    gate = _state.gate
    return HostStacks(
        process=_process_index() if process is None else process,
        answered=True,
        hostname=socket.gethostname(),
        os_pid=os.getpid(),
        current=_sequence.current(),
        gate=gate[0] if gate is not None else None,
        stepping=_state.stepping,
        where=where,
        threads=tuple(threads),
        time=time.time(),
    )


def dump_stacks(timeout: float = 10.0) -> dict[int, HostStacks]:
    """Every host's Python stacks and current collective, also from blocked hosts.

    Callable from any process and any thread, including while the main
    threads are blocked in a barrier or collective: each host's debug thread
    answers. A host that does not answer within ``timeout`` is reported, not
    waited for.

    Args:
        timeout: seconds to wait for the answers.

    Returns:
        Process index -> `HostStacks`, for every process. A host that did not
        answer has ``answered=False``, an ``error`` saying why and, as
        ``current``, the last collective it published.
    """
    client = _distributed()
    if client is None:
        return {_process_index(): capture()}
    replies, daemons = _command(client, 'stacks', timeout)
    out: dict[int, HostStacks] = {}
    where: dict[int, Any] | None = None
    for p in range(_process_count()):
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
            error = (
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
                error=(
                    'no debug thread: the process has not entered a multihost collective '
                    'yet (call multihost.start_debug_daemon() after jax.distributed.initialize)'
                ),
            )
    return out


# -- stepping --------------------------------------------------------------------------


def stepping_enabled() -> bool:
    """Whether this process pauses before each collective (as its debug thread last heard)."""
    return _state.stepping


def set_stepping(on: bool, *, timeout: float = 10.0) -> tuple[int, ...]:
    """Switches barrier stepping on or off on every host.

    With stepping on, each host publishes its arrival at every barrier or
    collective and waits there until that step is released (`release`,
    `release_all`); `step_table` shows who arrived where. Switching it off
    releases every host waiting at a step. Callable from any process and any
    thread; the setting is kept in the coordination service, so a process
    whose debug thread starts later picks it up.

    Args:
        on: the new setting.
        timeout: seconds to wait for every host's confirmation.

    Returns:
        The processes whose debug thread confirmed the change in time. In a
        single process there is nothing to pause; returns ``(0,)``.
    """
    client = _distributed()
    if client is None:
        _apply_stepping(bool(on))
        return (_process_index(),)
    if on:
        # A fresh session: forget releases made ahead during an earlier one.
        client.key_value_delete(_key('step', 'go') + '/')
    client.key_value_set(_key('step', 'on'), '1' if on else '0', allow_overwrite=True)
    replies, _ = _command(client, 'stepping', timeout)
    confirmed = []
    for p, reply in replies.items():
        try:
            if json.loads(reply).get('stepping') == bool(on):
                confirmed.append(p)
        except (ValueError, AttributeError):
            pass
    return tuple(sorted(confirmed))


def step_table() -> StepTable:
    """The host x step table of the collectives in flight (see `StepTable`).

    Callable from any process and thread, while the hosts wait at a step.
    """
    client = _distributed()
    if client is None:
        cur = _sequence.current()
        return StepTable(
            num_processes=1,
            stepping=_state.stepping,
            steps=(),
            positions=(cur.seq if cur else None,),
            time=time.time(),
        )
    records = _sequence.all_records(client)
    released = list(_kv.read_dir(client, _key('step', 'go')))
    waiting = []
    for key, _ in client.key_value_dir_get(_key('step', 'wait') + '/'):
        try:
            k, p = key.rsplit('/', 2)[-2:]
            waiting.append((int(k), int(p)))
        except ValueError:
            pass
    on = _try_get(client, _key('step', 'on')) == '1'
    return StepTable.build(records, released, _process_count(), on, waiting)


def release(steps: int = 1) -> tuple[int, ...]:
    """Releases the next ``steps`` steps (`StepTable.next_release` onwards).

    Hosts waiting at a released step go on into its barrier; a step released
    before the hosts arrive lets them through without pausing.

    Returns:
        The step numbers released (empty in a single process).
    """
    if steps < 1:
        raise ValueError(f'steps must be >= 1, got {steps!r}')
    client = _distributed()
    if client is None:
        return ()
    first = step_table().next_release
    released = tuple(range(first, first + steps))
    for k in released:
        client.key_value_set(_key('step', 'go', k), '1', allow_overwrite=True)
    return released


def release_all(*, timeout: float = 10.0) -> tuple[int, ...]:
    """Switches stepping off and releases every step a host is waiting at.

    Returns:
        The step numbers that were held and are now released.
    """
    client = _distributed()
    if client is None:
        _apply_stepping(False)
        return ()
    held = tuple(s.seq for s in step_table().steps if s.status == 'held')
    set_stepping(False, timeout=timeout)
    # Hosts whose debug thread did not confirm are released through the keys.
    for k in held:
        client.key_value_set(_key('step', 'go', k), '1', allow_overwrite=True)
    return held


def before_arrival(client: Any, rec: _sequence.CollectiveRecord) -> bool:
    """First half of the step gate, before the host publishes its arrival at ``rec.seq``.

    With stepping on, marks this host as waiting at the step's gate, so that
    whoever sees the arrival also sees that the host waits for a release.
    Zero RPCs when stepping is off.

    Returns:
        Whether the host is to wait at the gate (pass it to `gate`).
    """
    if not _state.stepping:
        return False
    client.key_value_set(_key('step', 'wait', rec.seq, rec.process), '1', allow_overwrite=True)
    return True


def gate(client: Any, rec: _sequence.CollectiveRecord, gated: bool) -> bool:
    """The step gate: waits until step ``rec.seq`` is released (or stepping goes off).

    Called by `_sequence.enter` after the record (the arrival) was published
    and before the barrier, with the result of `before_arrival`.

    Returns:
        Whether the host waited at the gate.

    Raises:
        StepTimeoutError: the step was not released within
            ``MULTIHOST_STEP_TIMEOUT`` seconds.
    """
    if not gated:
        return False
    released = threading.Event()
    with _state.lock:
        on = _state.stepping
        if on:
            _state.gate = (rec.seq, released)
    if not on:
        _clear_wait(client, rec)
        return False
    timeout = step_timeout()
    try:
        if rec.process == 0 and rec.seq > 0:
            # Everyone passed barrier seq-1 (we are here), so nobody waits on
            # its release key any more.
            try:
                client.key_value_delete(_key('step', 'go', rec.seq - 1))
            except Exception:
                pass
        threading.Thread(
            target=_wait_release,
            args=(client, rec.seq, released),
            name=f'multihost-gate-{rec.seq}',
            daemon=True,
        ).start()
        deadline = time.monotonic() + timeout
        # A local wait (no RPC), in short slices so Ctrl-C gets through.
        while not released.wait(0.5):
            if time.monotonic() > deadline:
                raise StepTimeoutError(
                    f'step gate: step #{rec.seq} ({rec.describe()}) was not released '
                    f'within {timeout:g} s. Stepping is on: release it with '
                    'multihost.release() or multihost.release_all() (or a '
                    'ControlClient), or raise MULTIHOST_STEP_TIMEOUT.',
                    seq=rec.seq,
                    timeout=timeout,
                )
    finally:
        with _state.lock:
            _state.gate = None
        released.set()  # stops the waiter thread after its current slice
        _clear_wait(client, rec)
    return True


def _clear_wait(client: Any, rec: _sequence.CollectiveRecord) -> None:
    try:
        client.key_value_delete(_key('step', 'wait', rec.seq, rec.process))
    except Exception:  # the coordinator may be gone; the key is only informative
        pass


def _wait_release(client: Any, seq: int, released: threading.Event) -> None:
    key = _key('step', 'go', seq)
    while not released.is_set():
        try:
            client.blocking_key_value_get(key, _ms(_SLICE_S))
        except Exception as exc:
            if not _current_client(client):
                return
            if not _sequence.is_timeout(exc):
                released.wait(1.0)
            continue
        released.set()
        return
