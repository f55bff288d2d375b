"""Attach: under `multihost.install` with a control file, process 0 serves the control endpoint.

A patcher of `_install.patchers`. With ``control_file`` (``install(control_file=...)``,
``python -m multihost run --control-file PATH``, ``MULTIHOST_CONTROL_FILE``), `patch`
wraps ``jax.distributed.initialize`` (install runs before it); when it has
returned, it starts this process's debug thread (so that stacks, wavefront and
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
import functools
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from multihost import _jax_adapter
from multihost._debug import _control
from multihost._exchange import _bus, _kv
from multihost._job._options import InstallOptions
from multihost._models import _dumpfile

log = logging.getLogger('multihost')


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.original: Any = None  # JAX's jax.distributed.initialize, while patched
        self.patched: Any = None
        self.written: tuple[str, int] | None = None  # (path, this pid) once written
        self.address: tuple[str, int] | None = None


_state = _State()


def patch(options: InstallOptions) -> None:
    """With ``options.control_file``: serve once ``jax.distributed.initialize`` has returned.

    Replaces ``jax.distributed.initialize`` by a version that serves right
    after JAX's returns (the client exists before it connects: nothing may
    talk to the service until initialize is done); when JAX is initialized
    already, serves now. (`InstallOptions.resolve` checked the folder.)
    """
    path, address = options.control_file, options.control_address
    if not path:
        return
    import jax.distributed

    with _state.lock:
        if _state.original is not None:
            return
        original = _state.original = jax.distributed.initialize

        @functools.wraps(original)
        def initialize(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            _serve(path, address)
            return out

        _state.patched = jax.distributed.initialize = initialize
    if _jax_adapter.client() is not None:
        _serve(path, address)


def unpatch() -> None:
    """Puts JAX's initialize back and removes the connection file (the endpoint serves on)."""
    import jax.distributed

    with _state.lock:
        if _state.original is not None and jax.distributed.initialize is _state.patched:
            jax.distributed.initialize = _state.original
        _state.original = _state.patched = None
    remove_file()


def served() -> dict[str, Any] | None:
    """The connection file's path and the endpoint's address, once served here."""
    written, address = _state.written, _state.address
    if written is None or address is None:
        return None
    return {'control_file': written[0], 'address': address}


def _serve(path: str, address: str) -> None:
    """Every process: the debug thread; process 0: the endpoint and its file (once)."""
    if _state.address is not None:
        return
    try:
        _bus.start_debug_daemon()
        if _kv.process_index() != 0:
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
    except Exception as exc:  # the job runs on without an endpoint: say so once
        log.warning('multihost: no control endpoint (%s: %s)', type(exc).__name__, exc)


def _write(path: str, content: dict[str, Any]) -> None:
    """Writes ``content`` as JSON to ``path`` atomically, readable by this user only."""
    _dumpfile.write_atomic(path, json.dumps(content))
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
