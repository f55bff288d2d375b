"""A small authenticated control endpoint: stacks and stepping from outside the JAX job.

A notebook kernel is not a JAX process, and ipyparallel cannot run code on
an engine whose main thread is busy (blocked in a barrier, paused at a step).
`serve_control` starts a listener, served by daemon threads of any one JAX
process, that answers `ControlClient` calls with `where`,
`step_table`, `set_stepping`, `release` and `release_all`, whatever that
process's main thread is doing.

The wire is stdlib `multiprocessing.connection` (pickled tuples over TCP),
authenticated by an HMAC challenge on a shared ``authkey`` in both
directions before anything is unpickled. Every wait, on both sides, has a
timeout: socket timeouts during the handshake, a poll before each reply.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Callable, Collection, Mapping
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

from multihost._debug import _stacks, _stepgate, _wavefront
from multihost._exchange import _bus
from multihost._models._audit import AuditReport
from multihost._models._stacks import HostStacks
from multihost._models._steps import StepTable
from multihost._models._wavefront import Wavefront
from multihost._recorder import FlightRecord

_HANDSHAKE_TIMEOUT = 10.0
_SEND_TIMEOUT = 30.0


def _info() -> dict[str, Any]:
    import jax

    return {
        'process': jax.process_index(),
        'num_processes': jax.process_count(),
        'hostname': socket.gethostname(),
        'os_pid': os.getpid(),
    }


#: The wire's command names ('stacks', 'records') stay as they were, so a client and a job of
#: different versions still understand each other; the Python names are the features' nouns.
_METHODS: dict[str, Callable[..., Any]] = {
    'info': _info,
    'stacks': _stacks.where,
    'wavefront': _wavefront.wavefront,
    'records': _wavefront.flight_records,
    'step_table': _stepgate.step_table,
    'set_stepping': _stepgate.set_stepping,
    'release': _stepgate.release,
    'release_all': _stepgate.release_all,
}
_BUILTIN = frozenset(_METHODS)


def register_method(name: str, fn: Callable[..., Any]) -> None:
    """Adds endpoint method ``name`` (a room above this one serves it: `engine.stopped`)."""
    _METHODS[name] = fn


def unregister_method(name: str) -> None:
    """Removes a method `register_method` added (the built-in ones stay)."""
    if name not in _BUILTIN:
        _METHODS.pop(name, None)


def _set_io_timeout(conn: Connection, seconds: float | None) -> None:
    """Bounds every blocking read/write on ``conn``'s socket (None: no bound).

    SO_RCVTIMEO/SO_SNDTIMEO keep the file descriptor blocking (which
    `Connection` needs) yet make a stalled read fail with an OSError.
    """
    sec = 0.0 if seconds is None else max(seconds, 0.001)
    tv = struct.pack('ll', int(sec), int((sec - int(sec)) * 1e6))
    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    finally:
        s.close()  # closes the duplicate only


class _Server:
    def __init__(self, listener: Listener, authkey: bytes):
        self.listener = listener
        self.authkey = authkey

    def accept_loop(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except OSError:
                return  # listener closed
            threading.Thread(
                target=self.serve, args=(conn,), daemon=True, name='multihost-control-conn'
            ).start()

    def serve(self, conn: Connection) -> None:
        try:
            _set_io_timeout(conn, _HANDSHAKE_TIMEOUT)
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
        except (OSError, EOFError, AuthenticationError):
            conn.close()
            return
        with conn:
            while True:
                _set_io_timeout(conn, None)  # an idle client may keep the connection
                try:
                    method, kwargs = conn.recv()
                except (EOFError, OSError, ValueError, TypeError):
                    return
                try:
                    fn = _METHODS[method]
                except (KeyError, TypeError):
                    reply = ('error', f'unknown method {method!r}; known: {sorted(_METHODS)}')
                else:
                    try:
                        reply = ('ok', fn(**kwargs))
                    except Exception as exc:  # sent back to the caller
                        reply = ('error', f'{type(exc).__name__}: {exc}')
                _set_io_timeout(conn, _SEND_TIMEOUT)
                try:
                    conn.send(reply)
                except OSError:
                    return


def serve_control(authkey: bytes, address: tuple[str, int] = ('', 0)) -> tuple[str, int]:
    """Serves stacks and stepping to `ControlClient` from this process's daemon threads.

    Call it on any one JAX process (typically process 0) after
    ``jax.distributed.initialize``; the endpoint keeps answering while this
    process's main thread is blocked. Every call of every client acts on the
    whole cluster (through the coordination service).

    Args:
        authkey: the shared secret (bytes, e.g. ``secrets.token_bytes(16)``);
            clients must present the same one.
        address: ``(host, port)`` to bind; the default binds every interface
            on a free port.

    Returns:
        ``(host, port)`` to connect to: the bound host, or this machine's host
        name when bound to every interface.
    """
    if not isinstance(authkey, bytes) or not authkey:
        raise TypeError(f'authkey must be non-empty bytes, got {type(authkey).__name__}')
    _bus.start_debug_daemon()
    # No authkey on the Listener: each connection is authenticated in its own
    # thread, under a timeout, so a silent client cannot block accept().
    bind_host, bind_port = address
    listener = Listener((bind_host, bind_port), family='AF_INET')
    server = _Server(listener, authkey)
    threading.Thread(target=server.accept_loop, daemon=True, name='multihost-control').start()
    host, port = listener.address
    if host in ('', '0.0.0.0'):
        host = socket.gethostname()
    return host, port


def _gone(gone: Any) -> dict[str, Any]:
    """``gone`` as a keyword argument, only when there is any (an older endpoint takes none)."""
    if not gone:
        return {}
    return {'gone': dict(gone) if isinstance(gone, Mapping) else sorted(gone)}


class ControlClient:
    """Talks to a `serve_control` endpoint: stacks and stepping from a notebook.

    Works while every engine's main thread is blocked. Every call waits at
    most its own timeout plus ``timeout`` for the answer, then raises
    `TimeoutError` (and reconnects on the next call).

    Args:
        address: ``(host, port)`` returned by `serve_control`.
        authkey: the same bytes given to `serve_control`.
        timeout: seconds to connect, and the margin allowed on top of each
            call's own timeout for the answer.

    Example::

        with ControlClient(address, key) as ctl:
            ctl.set_stepping(True)
            print(ctl.step_table())
            ctl.release()
    """

    def __init__(self, address: tuple[str, int], authkey: bytes, *, timeout: float = 30.0):
        if not isinstance(authkey, bytes) or not authkey:
            raise TypeError(f'authkey must be non-empty bytes, got {type(authkey).__name__}')
        self.address = (str(address[0]), int(address[1]))
        self.timeout = float(timeout)
        self._authkey = authkey
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._connect()

    def _connect(self) -> Connection:
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout)
        except TimeoutError:
            raise TimeoutError(
                f'could not connect to the control endpoint {self.address} '
                f'within {self.timeout:g} s'
            ) from None
        sock.settimeout(None)
        conn = Connection(sock.detach())
        try:
            _set_io_timeout(conn, self.timeout)
            answer_challenge(conn, self._authkey)
            deliver_challenge(conn, self._authkey)
        except AuthenticationError:
            conn.close()
            raise AuthenticationError(
                f'the control endpoint {self.address} refused the authkey; pass the '
                'bytes given to multihost.serve_control'
            ) from None
        except (OSError, EOFError) as exc:
            conn.close()
            raise TimeoutError(
                f'the control endpoint {self.address} did not complete '
                f'the handshake within {self.timeout:g} s ({exc!r})'
            ) from None
        self._conn = conn
        return conn

    def _call(self, method: str, wait: float, **kwargs: Any) -> Any:
        with self._lock:
            conn = self._conn or self._connect()
            try:
                _set_io_timeout(conn, self.timeout)
                conn.send((method, kwargs))
                ready = conn.poll(wait + self.timeout)
                if ready:
                    status, value = conn.recv()
            except (OSError, EOFError) as exc:
                self.close()
                raise ConnectionError(
                    f'control endpoint {self.address}: {method} failed: {exc!r}'
                ) from exc
            if not ready:
                self.close()  # a late answer must not be read as the next one
                raise TimeoutError(
                    f'control endpoint {self.address}: no answer to {method} '
                    f'within {wait + self.timeout:g} s'
                )
        if status != 'ok':
            raise RuntimeError(f'control endpoint {self.address}: {method} failed: {value}')
        return value

    def info(self) -> dict[str, Any]:
        """The serving process: its index, the process count, host name and OS pid."""
        return self._call('info', 0.0)

    def where(
        self, timeout: float = 10.0, *, gone: Mapping[int, str] | None = None
    ) -> dict[int, HostStacks]:
        """Every host's stacks and current collective (see `multihost.where`)."""
        return self._call('stacks', timeout, timeout=timeout, **_gone(gone))

    def wavefront(
        self, timeout: float = 10.0, *, gone: Mapping[int, str] | None = None
    ) -> Wavefront:
        """How far every host got (see `multihost.wavefront`)."""
        return self._call('wavefront', timeout, timeout=timeout, **_gone(gone))

    def flight_records(
        self, last: int = 200, timeout: float = 10.0, *, gone: Collection[int] = ()
    ) -> dict[int, list[FlightRecord]]:
        """Every host's last flight records (see `multihost.flight_records`)."""
        return self._call('records', timeout, last=last, timeout=timeout, **_gone(gone))

    def audit(self, *, timeout: float = 10.0) -> AuditReport:
        """What the job's audit found (see `multihost.audit_report`; process 0's, which
        holds every finding: all hosts compare the same tables)."""
        return self._call('audit', timeout)

    def step_table(self) -> StepTable:
        """The host x step table (see `multihost.step_table`)."""
        return self._call('step_table', 0.0)

    def set_stepping(self, on: bool, *, timeout: float = 10.0) -> tuple[int, ...]:
        """Switches stepping on or off (see `multihost.set_stepping`)."""
        return self._call('set_stepping', timeout, on=bool(on), timeout=timeout)

    def release(self, steps: int = 1) -> tuple[int, ...]:
        """Releases the next ``steps`` steps (see `multihost.release`)."""
        return self._call('release', 0.0, steps=int(steps))

    def release_all(self, *, timeout: float = 10.0) -> tuple[int, ...]:
        """Stepping off, every waiting step released (see `multihost.release_all`)."""
        return self._call('release_all', timeout, timeout=timeout)

    def inspect(
        self,
        op: str,
        *,
        fn: str = '',
        args: Any = ((), {}),
        frame: int | str | None = None,
        processes: list[int] | None = None,
        timeout: float = 60.0,
    ) -> dict[int, dict[str, Any]]:
        """Every host's answer from its stopped frame (see `multihost.engine.stopped.inspect`).

        Needs a job installed with `multihost.install` (``multihost run``): its hosts
        answer the data tools of `mhnotebook.AttachedJob` from their debug threads.
        """
        wait = timeout + 25.0 if op == 'call' else timeout + 5.0
        return self._call(
            'inspect',
            wait,
            op=op,
            fn=fn,
            args=args,
            frame=frame,
            processes=processes,
            timeout=timeout,
        )

    def close(self) -> None:
        """Closes the connection (idempotent; the next call reconnects)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
