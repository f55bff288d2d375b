"""Where this engine is: its machine, its address toward the controller, its JAX state.

The address helpers both sides share (`split_url`, `host_port`,
`route_source`, `free_port`) live in `multihost._net` (stdlib only, also used
by `multihost.testing`); they are re-exported here for the notebook.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from multihost._net import free_port, host_port, machine_id, route_source, split_url

__all__ = [
    'controller_address',
    'engine_info',
    'free_port',
    'host_port',
    'machine_id',
    'route_source',
    'split_url',
]


def _host_address() -> str:
    """This host's address from its host name, or the default route's (no controller known)."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET)
        ips = [i[4][0] for i in infos]  # AF_INET: (ip, port) pairs
        addrs = [ip for ip in ips if isinstance(ip, str) and not ip.startswith('127.')]
        if addrs:
            return addrs[0]
    except OSError:
        pass
    # Fall back to the address of the default route's interface.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(('10.255.255.255', 1))
            return s.getsockname()[0]
        except OSError:
            return name


# The controller's registration URL as the notebook's connection file gives it
# (`engine_info(controller=...)`), kept so later calls agree with the first.
_controller_hint: str | None = None


def _engine_registration_url() -> str | None:
    """The URL this ipyparallel engine registered at (its own connection info), if any.

    Read from the running ``IPEngine`` application only if ipyparallel is
    already loaded (this package never imports it).
    """
    import sys

    app = getattr(sys.modules.get('ipyparallel.engine.app'), 'IPEngine', None)
    try:
        if app is None or not app.initialized():
            return None
        return str(app.instance().registration_url) or None
    except Exception:  # not an engine application, or an older ipyparallel
        return None


def controller_address(controller: str | None = None) -> tuple[str, str]:
    """The address this engine uses to reach the ipyparallel controller, and how it was found.

    Other hosts reach this host at that address (the controller's network is
    the cluster's network), unlike its host name, which may resolve to
    loopback or not at all on the other hosts. Tried in order: the URL this
    engine registered at, then ``controller`` (the notebook's connection
    info); failing both, the host name's address or the default route's.

    Returns:
        ``(address, how)``; ``how`` says what was tried, for error messages.
    """
    global _controller_hint
    if controller:
        _controller_hint = controller
    tried = []
    candidates = [
        (_engine_registration_url(), 'the URL this engine registered at'),
        (_controller_hint, "the controller's URL in the notebook's connection file"),
    ]
    for url, what in candidates:
        if not url:
            continue
        host, port = split_url(url)
        try:
            address = route_source(host, port)
        except OSError as exc:
            tried.append(f'the controller at {host} ({what}) is out of reach: {exc}')
            continue
        return address, f'the address this host uses to reach the controller at {host} ({what})'
    address = _host_address()
    tried.append(f'fell back to the address of host name {socket.gethostname()!r}: {address}')
    return address, '; '.join(tried)


def engine_info(controller: str | None = None) -> dict[str, Any]:
    """Where this engine runs and whether JAX is distributed here yet.

    ``address`` is the address this engine uses to reach the controller
    (`controller_address`; ``controller``: the controller's URL as the
    notebook knows it, tried after the engine's own); ``address_from`` says
    how it was found; once JAX is distributed, ``coordinator`` is the
    coordination service's address.
    """
    import sys

    address, how = controller_address(controller)
    info: dict[str, Any] = dict(
        pid=os.getpid(),
        hostname=socket.gethostname(),
        address=address,
        address_from=how,
        machine=machine_id(),
        python=sys.version.split()[0],
        initialized=False,
    )
    if 'jax' in sys.modules:
        from multihost import _jax_adapter

        if _jax_adapter.client() is not None:
            import jax

            info.update(
                initialized=True,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                local_devices=[d.id for d in jax.local_devices()],
                jax=jax.__version__,
                backend=jax.default_backend(),
                coordinator=_jax_adapter.coordinator_address(),
            )
    return info
