"""JAX on the engines: the coordinator placed on process 0, `jax.distributed` joined everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mhnotebook._cluster.progress import Progress
from mhnotebook._errors import RemoteFailure, SessionError
from mhnotebook._poll import Poll
from mhnotebook._session import HostInfo, controller_url
from mhnotebook._trampoline import call as _call

__all__ = ['engine_infos', 'hosts_from_infos', 'initialize', 'place_coordinator']


def hosts_from_infos(infos: dict[int, dict[str, Any]]) -> list[HostInfo]:
    return [
        HostInfo(
            process_index=i['process_index'],
            engine_id=e,
            hostname=i['hostname'],
            address=i['address'],
            machine=i['machine'],
            pid=i['pid'],
            local_devices=tuple(i.get('local_devices', ())),
        )
        for e, i in infos.items()
    ]


def initialize(
    client: Any,
    engine_ids: list[int],
    *,
    coordinator: str,
    timeout: float,
    progress: Progress,
    bind: str | None = None,
    devices: int | None = None,
    platform: str | None = None,
    recoverable: bool = False,
    heartbeat_timeout: int | None = None,
    placed: str = '',
) -> dict[int, dict[str, Any]]:
    """Runs `multihost.engine.initialize` on every engine (the i-th becomes process i).

    ``bind``: the address the coordination service listens on (None: the
    ``coordinator`` address itself). ``placed`` says how the coordinator
    address was chosen (for the error). Returns engine id -> `engine_info`.
    """
    n = len(engine_ids)
    bind = bind or coordinator
    pending = {
        pid: client[e].apply_async(
            _call,
            'multihost.engine.initialize',
            coordinator,
            n,
            pid,
            devices,
            platform=platform,
            initialization_timeout=int(max(timeout, 10)),
            coordinator_bind_address=bind,
            recoverable=recoverable,
            heartbeat_timeout=heartbeat_timeout,
        )
        for pid, e in enumerate(engine_ids)
    }

    def tick(_elapsed: float) -> None:
        progress.update(f'mhnotebook: JAX initialized on {len(poll.results)}/{n} processes')

    poll = Poll(pending, timeout, on_tick=tick)
    poll.run()
    if poll.failures or poll.left:
        failed = {engine_ids[p]: f for p, f in sorted(poll.failures.items())}
        missing = sorted(engine_ids[p] for p in poll.left)
        detail = ''.join(f'\n--- engine {e} ---\n{f.text}' for e, f in failed.items())
        raise SessionError(
            f'jax.distributed.initialize failed (coordinator {coordinator}'
            f'{"; " + placed if placed else ""}): '
            f'engines {sorted(failed)} raised, engines {missing} did not finish within '
            f'{timeout:g} s.{detail}\nCheck that every engine can reach the coordinator '
            f'address (pass coordinator="host:port" to choose it); it listens on '
            f'{bind} only (coordinator_bind="[::]:PORT": every interface).'
        )
    return {engine_ids[p]: info for p, info in sorted(poll.results.items())}


def engine_infos(client: Any, engine_ids: list[int]) -> dict[int, dict[str, Any]]:
    """`multihost.engine.engine_info` of each engine (address: the one toward the controller)."""
    results = client[engine_ids].apply_sync(
        _call, 'multihost.engine.engine_info', controller_url(client)
    )
    return dict(zip(engine_ids, results, strict=True))


def place_coordinator(client: Any, first: int, info: Mapping[str, Any]) -> tuple[str, str]:
    """``(coordinator, how)``: engine ``first``'s address toward the controller, a port free there.

    Engine ``first`` becomes process 0 and hosts the coordination service. Its
    address is the one it uses to reach the controller (`multihost.engine.
    controller_address`): every other host reaches the controller, so it is
    on their network, unlike a host name. The port is probed on engine
    ``first``, bound to that very address.
    """
    from multihost._net import host_port

    address = str(info['address'])
    how = f'engine {first} (process 0): {info.get("address_from", "its address")}'
    try:
        port = client[first].apply_sync(_call, 'multihost.engine.free_port', address)
    except Exception as exc:
        raise SessionError(
            f'cannot place the JAX coordinator on engine {first} at {address} ({how}): probing '
            f'a free port there failed: {RemoteFailure.from_exception(0, exc).evalue}. Pass '
            'coordinator="HOST:PORT" with an address of that host every host reaches.'
        ) from None
    return host_port(address, int(port)), f'{how}; port {port} probed free there'
