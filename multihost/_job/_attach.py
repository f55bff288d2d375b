"""Attach: under `multihost.install` with a control file, process 0 serves the control endpoint.

A patcher of `_install.PATCHERS`. With ``control_file`` (``install(control_file=...)``,
``python -m multihost run --control-file PATH``, ``MULTIHOST_CONTROL_FILE``), `patch`
starts one daemon thread that waits for ``jax.distributed.initialize`` (it
polls the distributed state every `_POLL_S` seconds: install runs before
it), then starts this process's debug thread (so that stacks, wavefront and
stepping reach every host from the start, not only after its first checked
collective) and, on process 0 only, serves `_control.serve_control` on
``control_address`` (default loopback) with a fresh random key and writes the
connection file::

    {"address": ..., "port": ..., "key": <hex>, "pid": <os pid>,
     "num_processes": N, "started": <unix time>, "hostname": ...}

written atomically (a temporary file in the same folder, mode 0600, then
``os.replace``) and removed at a clean exit (``atexit``) or `unpatch`, when it
is still the one this process wrote. ``mhnotebook.attach(PATH)`` reads it.
A job killed with SIGKILL leaves it behind: attach then says the job is gone.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from multihost import _jax_adapter
from multihost._debug import _control
from multihost._exchange import _bus, _kv

#: How often the waiting thread looks for ``jax.distributed.initialize``'s client.
_POLL_S = 0.1
#: The interface bound unless ``control_address`` says otherwise.
LOOPBACK = '127.0.0.1'


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stop: threading.Event | None = None
        self.written: tuple[str, int] | None = None  # (path, this pid) once written
        self.address: tuple[str, int] | None = None


_state = _State()


def patch(options: Any) -> None:
    """Starts the waiting thread when ``options.control_file`` is set (nothing otherwise)."""
    path = getattr(options, 'control_file', None)
    if not path:
        return
    with _state.lock:
        if _state.stop is not None:
            return
        folder = os.path.dirname(path) or '.'
        if not os.path.isdir(folder):
            raise ValueError(
                f'control_file {path!r}: the folder {folder!r} does not exist; '
                'create it or give a path in an existing folder'
            )
        stop = _state.stop = threading.Event()
    address = getattr(options, 'control_address', None) or LOOPBACK
    threading.Thread(
        target=_serve_when_initialized,
        args=(path, address, stop),
        name='multihost-attach',
        daemon=True,
    ).start()


def unpatch() -> None:
    """Stops waiting and removes the connection file (the endpoint itself serves on)."""
    with _state.lock:
        if _state.stop is not None:
            _state.stop.set()
            _state.stop = None
    remove_file()


def served() -> dict[str, Any] | None:
    """The connection file's path and the endpoint's address, once served here."""
    written, address = _state.written, _state.address
    if written is None or address is None:
        return None
    return {'control_file': written[0], 'address': address}


def _serve_when_initialized(path: str, address: str, stop: threading.Event) -> None:
    while _jax_adapter.client() is None:
        if stop.wait(_POLL_S):
            return
    _bus.start_debug_daemon()
    if _kv.process_index() != 0 or stop.is_set():
        return
    key = secrets.token_bytes(32)
    host, port = _control.serve_control(key, (address, 0))
    if address not in ('', '0.0.0.0'):
        host = address
    _state.address = (host, port)
    _write(
        path,
        {
            'address': host,
            'port': port,
            'key': key.hex(),
            'pid': os.getpid(),
            'num_processes': _kv.process_count(),
            'started': time.time(),
            'hostname': socket.gethostname(),
        },
    )


def _write(path: str, content: dict[str, Any]) -> None:
    """Writes ``content`` as JSON to ``path`` atomically, readable by this user only."""
    tmp = f'{path}.{os.getpid()}.tmp'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, 'w') as f:
            json.dump(content, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _state.written = (path, os.getpid())


def remove_file() -> None:
    """Removes the connection file if this process wrote it and it still names this process."""
    written = _state.written
    if written is None or written[1] != os.getpid():
        return
    path = written[0]
    _state.written = None
    try:
        with open(path) as f:
            if json.load(f).get('pid') != os.getpid():
                return  # another job's file now
        os.unlink(path)
    except (OSError, ValueError):
        pass


atexit.register(remove_file)
