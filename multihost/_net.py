"""Addresses and ports: parse ``host:port``, find a route's source address, probe a free port.

Stdlib only, shared by both sides (the engine, `multihost.testing`, the
notebook's launcher and gather stream), so they read addresses alike.
"""

from __future__ import annotations

import socket
import uuid

__all__ = ['free_port', 'host_port', 'machine_id', 'route_source', 'split_url']


def split_url(url: str) -> tuple[str, int]:
    """``('10.0.0.1', 5555)`` from ``tcp://10.0.0.1:5555``; port 0 when there is none.

    Also ``host:5555``, ``[fd00::2]:5555``, ``user@host:22`` (an SSH host: the
    user part is dropped) and a bare IPv6 address (``fd00::2``: more than one
    colon without brackets is an address, never an address and a port).
    """
    rest = url.split('://', 1)[-1].rstrip('/').rsplit('@', 1)[-1]
    if rest.startswith('['):
        host, _, tail = rest[1:].partition(']')
        port = tail[1:] if tail.startswith(':') else ''
    elif rest.count(':') == 1:
        host, _, port = rest.partition(':')
    else:
        host, port = rest, ''
    return host, int(port) if port.isdigit() else 0


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[fd00::2]:1234``)."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def route_source(host: str, port: int = 0) -> str:
    """The local address this machine sends from to reach ``host`` (a UDP connect: no traffic).

    ``host`` is read by `split_url` (``user@host:port`` and URLs too); ``port``,
    if given, wins over one in ``host``.

    Raises:
        OSError: ``host`` does not resolve or no route reaches it; the message
            names the host and what to check.
    """
    name, given = split_url(host)
    port = port or given or 9  # any port: nothing is sent
    errors = []
    try:
        targets = socket.getaddrinfo(name, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        errors.append(f'it does not resolve here ({exc.strerror or exc})')
        targets = []
    for family, kind, proto, _, sockaddr in targets:
        with socket.socket(family, kind, proto) as s:
            try:
                s.connect(sockaddr)
                return str(s.getsockname()[0])
            except OSError as exc:
                errors.append(f'{sockaddr[0]}: {exc.strerror or exc}')
    raise OSError(
        f'no route from {socket.gethostname()} to {name!r}: '
        f'{"; ".join(errors) or "it resolves to no address"}. '
        'Check the host name or address, and that this machine has a route to it.'
    )


#: Ports tried before the kernel's own choice: below Linux's ephemeral range (32768 and up),
#: which every outgoing connection of this machine draws from, so a port probed here is not
#: taken by one a moment later (seen with two test workers: a coordinator's port gone).
_CALM_PORTS = (20000, 32000)


def _bindable(family: int, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = '127.0.0.1') -> int:
    """A TCP port that was free a moment ago on ``host``, an address of this machine.

    ``''``: every interface. Probed on the address the port will be listened
    on, so a port free elsewhere but taken there is not chosen. A random port
    below the ephemeral range first (also free on every interface: JAX's
    coordinator listens on all of them), else one the kernel picks.

    Raises:
        OSError: ``host`` is not an address of this machine (the message says so).
    """
    import random

    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError as exc:
            raise OSError(
                exc.errno,
                f'cannot bind a TCP port on {host!r} ({exc.strerror or exc}); '
                f'pass an address of {socket.gethostname()} (or "" for every interface)',
            ) from None
        fallback = int(s.getsockname()[1])
    for _ in range(20):
        port = random.randint(*_CALM_PORTS)
        if _bindable(family, host, port) and _bindable(socket.AF_INET, '', port):
            return port
    return fallback


def machine_id() -> str:
    """An id equal on processes of the same machine (boot id + hostname)."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = hex(uuid.getnode())
    return f'{socket.gethostname()}/{boot}'
