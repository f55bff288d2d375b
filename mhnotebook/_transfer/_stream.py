"""The notebook's end of a network gather: hosts stream raw blocks straight into the result.

A `Listener` is bound (once per session) to the address this machine uses
toward the ipyparallel controller, which is on the hosts' network. For each
gather the notebook makes a random token, hands it to the hosts through
ipyparallel (authenticated), and `Listener.receive` accepts one TCP connection
per host: the token, the host's process index, then the raw bytes of its
blocks in an order both sides know from the structure round. Each block is
read with ``recv_into`` directly into its place in the result (a block whose
place is not one contiguous span goes through one block-sized buffer).
Nothing received is ever unpickled, and a connection with a wrong token or
an unexpected process is dropped.

One thread multiplexes every connection (`selectors`), so 1,000 hosts cost
1,000 sockets, not 1,000 threads.
"""

from __future__ import annotations

import hmac
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

_HELLO = 20  # token (16 bytes) + process index (4 bytes)


def notebook_address(controller_url: str | None) -> str:
    """The address this machine uses to reach the controller (the hosts' network)."""
    from multihost._net import route_source

    if not controller_url:
        return '127.0.0.1'
    return route_source(controller_url)


class _Dest:
    """Where one block's bytes go: a view of the result, or a staging buffer copied there."""

    def __init__(self, place: np.ndarray):
        self.place = place
        if place.flags.c_contiguous:
            self.stage = None
            self.view = place.reshape(-1).view(np.uint8).data
        else:
            self.stage = np.empty(place.shape, place.dtype)
            self.view = self.stage.reshape(-1).view(np.uint8).data

    def done(self) -> None:
        if self.stage is not None:
            self.place[...] = self.stage
            self.stage = None


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.hello = bytearray()
        self.process: int | None = None
        self.dests: list[_Dest] = []
        self.pos = 0


class StreamError(Exception):
    """A host's stream ended early, or no stream came in time (the message says which)."""


class Listener:
    """A TCP listener on this machine's address toward the hosts (one per session)."""

    def __init__(self, address: str):
        family = socket.AF_INET6 if ':' in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(1024)
        self.sock.setblocking(False)
        self.address: tuple[str, int] = (address, self.sock.getsockname()[1])
        self.lock = threading.Lock()  # one gather at a time

    def close(self) -> None:
        self.sock.close()

    def receive(self, token: bytes, places: dict[int, Sequence[np.ndarray]]) -> _Receipt:
        """Starts receiving, in a thread, every host's blocks into ``places`` (in order).

        Call `_Receipt.finish` once the hosts have answered (it waits for the
        bytes still in flight), or `_Receipt.cancel`.
        """
        receipt = _Receipt(self, token, places)
        threading.Thread(target=receipt.run, name='mh-gather-stream', daemon=True).start()
        return receipt


class _Receipt:
    def __init__(self, listener: Listener, token: bytes, places: dict[int, Sequence[np.ndarray]]):
        self.listener, self.token = listener, token
        self.places = places
        self.left = {p: sum(a.nbytes for a in ps) for p, ps in places.items()}
        self.complete: set[int] = {p for p, n in self.left.items() if n == 0}
        self.errors: dict[int, str] = {}
        self.stop = threading.Event()
        self.finished = threading.Event()

    # -- the receiving thread ------------------------------------------------
    def run(self) -> None:
        sel = selectors.DefaultSelector()
        conns: dict[int, _Conn] = {}
        try:
            sel.register(self.listener.sock, selectors.EVENT_READ)
            while not self.stop.is_set() and len(self.complete) < len(self.places):
                for key, _ in sel.select(0.05):
                    if key.fileobj is self.listener.sock:
                        self._accept(sel, conns)
                    else:
                        self._read(sel, conns, conns[key.fd])
        except Exception as exc:  # reported by finish(), never lost in a thread
            self.errors[-1] = f'{type(exc).__name__}: {exc}'
        finally:
            for conn in conns.values():
                conn.sock.close()
            sel.close()
            self.finished.set()

    def _accept(self, sel: selectors.BaseSelector, conns: dict[int, _Conn]) -> None:
        try:
            sock, _ = self.listener.sock.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        conn = _Conn(sock)
        conns[sock.fileno()] = conn
        sel.register(sock, selectors.EVENT_READ)

    def _drop(self, sel: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        sel.unregister(conn.sock)
        del conns[conn.sock.fileno()]
        conn.sock.close()

    def _read(self, sel: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        if conn.process is None:
            try:
                chunk = conn.sock.recv(_HELLO - len(conn.hello))
            except BlockingIOError:
                return
            except OSError:
                chunk = b''
            if not chunk:
                self._drop(sel, conns, conn)
                return
            conn.hello += chunk
            if len(conn.hello) < _HELLO:
                return
            process = int.from_bytes(conn.hello[16:], 'big')
            known = process in self.places and process not in self.complete
            if not hmac.compare_digest(bytes(conn.hello[:16]), self.token) or not known:
                self._drop(sel, conns, conn)  # a stranger, or an old gather's host
                return
            conn.process = process
            conn.dests = [_Dest(a) for a in self.places[process] if a.nbytes]
            return
        while conn.dests:
            dest = conn.dests[0]
            try:
                n = conn.sock.recv_into(dest.view[conn.pos :])
            except BlockingIOError:
                return
            except OSError as exc:
                n, why = 0, str(exc)
            else:
                why = 'the connection closed'
            if n == 0:
                self.errors[conn.process] = (
                    f'process {conn.process} stopped sending with {self.left[conn.process]} '
                    f'bytes still due ({why})'
                )
                self._drop(sel, conns, conn)
                return
            conn.pos += n
            self.left[conn.process] -= n
            if conn.pos == len(dest.view):
                dest.done()
                conn.dests.pop(0)
                conn.pos = 0
        self.complete.add(conn.process)
        self._drop(sel, conns, conn)

    # -- the caller's side ---------------------------------------------------
    def finish(self, sent: dict[int, int], timeout: float) -> None:
        """Waits until every host in ``sent`` (process -> bytes it sent) has arrived.

        Raises:
            StreamError: a stream broke, or bytes a host sent did not arrive in time.
        """
        deadline = time.monotonic() + timeout
        while not self.finished.is_set():
            if all(p in self.complete for p in sent) or time.monotonic() >= deadline:
                break
            self.finished.wait(0.05)
        self.stop.set()
        self.finished.wait(5.0)
        bad = {p: why for p, why in self.errors.items() if p in sent or p == -1}
        missing = sorted(p for p in sent if p not in self.complete and p not in bad)
        if bad or missing:
            parts = [why for _, why in sorted(bad.items())]
            if missing:
                parts.append(
                    f'the blocks of process(es) {missing} did not arrive within {timeout:g} s '
                    'after they were sent'
                )
            raise StreamError('; '.join(parts))

    def cancel(self) -> None:
        self.stop.set()
        self.finished.wait(5.0)


def new_token() -> bytes:
    return secrets.token_bytes(16)


def result_places(
    plan: list[dict[str, Any]], metas: list[dict[str, Any]], results: list[np.ndarray]
) -> dict[int, list[np.ndarray]]:
    """Per process, the places its blocks go, in the order it sends them."""
    places: dict[int, list[np.ndarray]] = {}
    for meta in metas:
        p = meta['process']
        out = places.setdefault(p, [])
        for i, leaf in enumerate(plan):
            if leaf['kind'] == 'global':
                for idx in meta['leaves'][i]['blocks']:
                    out.append(results[i][tuple(slice(a, b) for a, b in idx)])
            else:
                out.append(results[i][p, ...])  # a view, also of a 0-d row
    return places
