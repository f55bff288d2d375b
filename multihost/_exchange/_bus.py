"""The command bus: a debug thread per process answers commands, even while the main one blocks.

The thread long-polls the key-value store (through `_kv`) for the next command
number; an issuer numbers a command, writes it and collects the replies of the
threads listening before that number, each wait bounded (hosts that do not
answer are reported). What a command does is registered by the module owning
it (`register`). Keys ``mh/ctl/``, ``mh/rep/``, ``mh/dmn/``: see
docs/ARCHITECTURE.md, "Debug thread, stacks and the step gate", and its key map.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from multihost import _jax_adapter
from multihost._exchange import _kv

# Long-poll slice: the idle debug thread costs its host about two RPCs per
# _IDLE_SLICE_S (fewer than the coordination service's own heartbeats), and a
# command number lost by a dying issuer is skipped after two slices.
_IDLE_SLICE_S = 30.0
THREAD_NAME = 'multihost-debug'

#: Command name -> handler ((client, the command's order) -> JSON reply, or (reply, a
#: callable run once the reply is stored)), filled by the owning modules.
_HANDLERS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {}
#: Run (with the client) when the thread starts, after the command counter is
#: read and before the thread registers: state a command may have changed.
_ON_START: list[Callable[[Any], None]] = []


def register(
    cmd: str,
    handler: Callable[[Any, dict[str, Any]], Any],
    on_start: Callable[[Any], None] | None = None,
) -> None:
    """Registers what command ``cmd`` does (and state to read when a thread starts).

    The handler gets the client and the command's order (``cmd``, ``by``,
    ``time`` and the parameters given to `command`) and returns the reply.
    """
    _HANDLERS[cmd] = handler
    if on_start is not None:
        _ON_START.append(on_start)


def on_start(fn: Callable[[Any], None]) -> None:
    """Runs ``fn(client)`` whenever a debug thread starts (before it registers)."""
    if fn not in _ON_START:
        _ON_START.append(fn)


def unregister(cmd: str) -> None:
    """Forgets what command ``cmd`` does (a thread then answers it ``{"unknown": cmd}``)."""
    _HANDLERS.pop(cmd, None)


def _key(*parts: object) -> str:
    return _kv.key(*parts)


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client: Any = None
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()


_state = _State()


def _at_exit() -> None:
    """Ends the debug thread before the interpreter finalizes (see `_jax_adapter.exit_cleanup`).

    Registered at import, right after JAX's own exit handler in the usual order (``import jax``
    then ``multihost``; ``python -m multihost run`` imports both first), so it runs just
    before JAX's; it does nothing unless the debug thread runs.
    """
    thread = _state.thread
    if thread is None or not thread.is_alive():
        return
    _state.stop.set()
    try:
        _jax_adapter.exit_cleanup()  # cancels the thread's long-poll
    finally:
        thread.join(timeout=5.0)


atexit.register(_at_exit)


def thread_ident() -> int | None:
    """The debug thread's ident (None before it starts)."""
    return _state.thread.ident if _state.thread is not None else None


def distributed() -> Any | None:
    """The coordination client when more than one process runs, else None."""
    return _kv.client()


# -- the daemon thread -------------------------------------------------------------


def start_debug_daemon() -> bool:
    """Starts this process's debug thread, if not running yet.

    It starts by itself the first time the process enters a multi-host
    collective; call this right after ``jax.distributed.initialize`` to make
    a process reachable (stacks, stepping) before its first collective.

    Returns:
        True when the thread runs; False in a single process (nothing to do).
    """
    client = distributed()
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
        pid = _kv.process_index()
        # Order matters (see command): read the counter, then the state the
        # commands change (the stepping flag), then register. A command
        # numbered <= since was issued after its state was written, so the
        # state read here already reflects it.
        since = _kv.increment(client, _key('ctl', 'n'), 0)
        for read_state in _ON_START:
            read_state(client)
        _kv.put(
            client,
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
        )
        stop = threading.Event()
        thread = threading.Thread(
            target=_loop, args=(client, pid, since + 1, stop), name=THREAD_NAME, daemon=True
        )
        _state.client, _state.thread, _state.stop = client, thread, stop
        thread.start()


def _current_client(client: Any) -> bool:
    return _jax_adapter.client() is client


def _loop(client: Any, pid: int, g: int, stop: threading.Event) -> None:
    """Handles commands g, g+1, ... until the distributed session ends."""
    misses, backoff = 0, 0.5
    while not stop.is_set():
        try:
            raw = _kv.poll(client, _key('ctl', g), _IDLE_SLICE_S)  # the idle long-poll
        except Exception:
            if stop.is_set() or not _current_client(client):
                return  # jax.distributed.shutdown() (CANCELLED) or a new session
            stop.wait(backoff)  # the coordinator is unreachable: retry, slowly
            backoff = min(backoff * 2, 30.0)
            continue
        if raw is None:
            # A command number whose issuer died before writing it would
            # block every later command: skip it after two idle slices.
            try:
                counter = _kv.increment(client, _key('ctl', 'n'), 0)
            except Exception:
                counter = g
            misses = misses + 1 if counter > g else 0
            if misses >= 2:
                g, misses = g + 1, 0
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
        order = json.loads(raw)
        cmd = order.get('cmd')
    except (ValueError, AttributeError):
        order, cmd = {}, None
    handler = _HANDLERS.get(cmd) if isinstance(cmd, str) else None
    reply = handler(client, order) if handler is not None else json.dumps({'unknown': cmd})
    after = None
    if isinstance(reply, tuple):  # (reply, what to do once it is stored): `_fate` ends the host
        reply, after = reply
    _reply(client, pid, g, reply, order)
    if after is not None:
        after()


def _reply(client: Any, pid: int, g: int, reply: str, order: dict[str, Any]) -> None:
    """Stores ``reply`` in its batch of ``mh/rep/<g>/`` and counts it (see `_collect`).

    The offset counter ``n`` places the reply: its batch is where its first
    byte falls, so a batch holds at most `_batch_bytes()` plus one reply (each
    directory read <= `_kv.MAX_BYTES`). The host whose answer is the last one
    the issuer expects (counter ``d``) writes ``all`` with the total.
    """
    size, inline = len(reply.encode()), _inline()
    size = (size if size <= inline else _HEADER) + _KEY_BYTES
    end = _kv.increment(client, _key('rep', g, 'n'), size)
    _kv.put(client, _key('rep', g, (end - size) // _batch_bytes(), pid), reply, inline=inline)
    if pid in order.get('skip', ()) or not isinstance(order.get('expect'), int):
        return
    if _kv.increment(client, _key('rep', g, 'd'), 1) == order['expect']:
        total = _kv.increment(client, _key('rep', g, 'n'), 0)
        _kv.put(client, _key('rep', g, 'all'), str(total))


def command(
    client: Any,
    cmd: str,
    timeout: float,
    *,
    skip: Collection[int] = (),
    gone: Callable[[], Collection[int]] | None = None,
    **params: Any,
) -> tuple[dict[int, str], dict[int, dict]]:
    """Issues ``cmd`` (with JSON-able ``params``) to every debug thread; returns (replies, threads).

    Waits at most ``timeout`` seconds (plus a few RPCs) for the replies of the
    threads registered before the command; the rest are simply absent. The
    processes in ``skip`` (known to be gone) are not waited for at all; ``gone``
    (asked about once a second while replies are missing) names processes known to
    have ended since: once every missing one is among them, the wait ends.
    """
    ensure_started(client)  # so that this process answers too
    g = _kv.increment(client, _key('ctl', 'n'), 1)
    # The threads registered before g answer it (they read the counter first).
    daemons: dict[int, dict] = {}
    for value in _kv.read_dir(client, _key('dmn')).values():
        info = json.loads(value)
        daemons[int(info['process'])] = info
    expected = sorted(p for p, info in daemons.items() if info['since'] < g and p not in skip)
    order = {
        **params,
        'cmd': cmd,
        'by': _kv.process_index(),
        'time': time.time(),
        'expect': len(expected),
        'skip': sorted(skip),
    }
    _kv.put(client, _key('ctl', g), json.dumps(order))
    replies = _collect(client, g, expected, time.monotonic() + timeout, gone)
    _kv.delete(client, _key('rep', g) + '/')
    return replies, daemons


def _collect(
    client: Any,
    g: int,
    expected: list[int],
    deadline: float,
    gone: Callable[[], Collection[int]] | None = None,
) -> dict[int, str]:
    """The replies to command ``g``, read in bounded batches, until ``deadline``.

    Each replier adds its reply's size to the counter ``mh/rep/<g>/n``; the
    value places it in batch ``mh/rep/<g>/<offset // _batch_bytes()>/<pid>``
    (replies inline up to `_inline()`, larger ones chunked), so each directory
    read of a batch is <= 1 MiB. The last expected replier writes
    ``mh/rep/<g>/all`` (the total). The issuer waits for that one key (native
    slices of 0.5 s growing to 2 s: a SIGINT lands within 2 s), then reads
    each batch once: ~total / 0.94 MiB + 5 RPCs whatever N (41 measured for
    200 flight records of 1,000 hosts, 30 MB; 10 for their stacks). Out of time (a silent host),
    it reads the counter and every batch once, and returns what came.
    """
    root = _key('rep', g)
    if gone is None:
        written = _kv.wait_get(client, root + '/all', deadline, longest=_MAX_WAIT_SLICE)
    else:  # a second at a time: the missing ones may have ended meanwhile
        written = None
        while (left := deadline - time.monotonic()) > 0:
            step = time.monotonic() + min(left, _GONE_CHECK_S)
            written = _kv.wait_get(client, root + '/all', step, longest=_MAX_WAIT_SLICE)
            if written is not None:
                break
            so_far: dict[int, str] = {}
            _sweep(client, root, _kv.increment(client, root + '/n', 0), so_far, 0)
            missing = {p for p in expected if p not in so_far}
            if missing and missing <= set(gone()):
                return so_far
    total = int(written) if written is not None else _kv.increment(client, root + '/n', 0)
    replies: dict[int, str] = {}
    read = _sweep(client, root, total, replies, 0)
    gap = _SWEEP_GAP
    # 'all' came early (a host not listed, or one in skip, answered too): sweep again, spaced.
    while (left := deadline - time.monotonic()) > 0 and any(p not in replies for p in expected):
        time.sleep(min(gap, left))
        gap = min(gap * 2, _MAX_SWEEP_GAP)
        read = _sweep(client, root, _kv.increment(client, root + '/n', 0), replies, 0)
    if len(replies) < _kv.process_count():  # a late reply of a thread not yet listed
        now = _kv.increment(client, root + '/n', 0)
        if now > total:
            _sweep(client, root, now, replies, max(0, read - 1))
    return replies


def _sweep(client: Any, root: str, total: int, replies: dict[int, str], first: int) -> int:
    """Reads batches ``first``.. of ``total`` counted bytes into ``replies``; returns the end."""
    batch = _batch_bytes()
    end = (total + batch - 1) // batch
    for b in range(first, end):
        replies.update(_kv.read_dir(client, f'{root}/{b}', skip=replies))
    return end


#: Bytes counted for a chunked reply's header and for every reply's key.
_HEADER, _KEY_BYTES = 128, 64


def _inline() -> int:
    """Largest reply stored inline in its batch (64 KiB of a 1 MiB read; larger ones are
    chunked, one RPC per chunk). Read from `_kv.MAX_BYTES` when used, as `_kv` bounds are."""
    return max(256, _kv.MAX_BYTES // 16)


def _batch_bytes() -> int:
    """Bytes of replies that start in one batch: with the last reply and the keys, one read
    of the batch is <= `_kv.MAX_BYTES`."""
    return _kv.MAX_BYTES - _inline() - _HEADER - _KEY_BYTES


_SWEEP_GAP = 0.05  # first wait before sweeping again after an early 'all' (doubling)
_GONE_CHECK_S = 1.0  # how often `command`'s ``gone`` is asked while replies are missing
_MAX_SWEEP_GAP = 1.0
_MAX_WAIT_SLICE = 2.0
