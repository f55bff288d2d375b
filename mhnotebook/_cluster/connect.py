"""`connect`: a session on an ipyparallel cluster started elsewhere (JAX initialized if not yet)."""

from __future__ import annotations

import os
from typing import Any

from mhnotebook._cleanup import sweep_shm
from mhnotebook._cluster.jaxinit import (
    engine_infos,
    hosts_from_infos,
    initialize,
    place_coordinator,
)
from mhnotebook._cluster.progress import Progress
from mhnotebook._errors import SessionError
from mhnotebook._session import Engines, Session, controller_url
from mhnotebook._trampoline import call as _call

__all__ = ['connect']


def connect(
    url_file: str | None = None,
    *,
    profile: str | None = None,
    cluster_id: str | None = None,
    n: int | None = None,
    coordinator: str | None = None,
    coordinator_bind: str | None = None,
    devices_per_process: int | None = None,
    platform: str | None = None,
    timeout: float = 120.0,
    progress: bool = True,
) -> Session:
    """Attaches to an existing ipyparallel cluster, started by any launcher (ssh, mpi, slurm...).

    If JAX is not distributed on the engines yet, initializes it: engine ids
    in ascending order become process indices, and the coordinator runs on
    the first engine, at the address that engine uses to reach the
    ipyparallel controller (on a port probed free there), unless
    ``coordinator`` is given. The coordination service (unauthenticated)
    listens on that address only, and so does process 0's control endpoint
    (authenticated). Engines it did not start are never stopped or killed by
    this session.

    Args:
        url_file: the client connection file (``ipcontroller-client.json``,
            or ``ipcontroller-<cluster_id>-client.json``) the controller wrote.
        profile: ipython profile name (alternative to ``url_file``).
        cluster_id: cluster id within the profile.
        n: wait until this many engines are registered.
        coordinator: ``host:port`` for `jax.distributed.initialize`.
        coordinator_bind: ``host:port`` the coordination service listens on
            (default: ``coordinator`` itself; ``'[::]:PORT'``: every interface).
        devices_per_process: CPU devices to simulate per engine (testing only).
        platform: force a JAX platform on the engines (e.g. ``'cpu'``).
        timeout: seconds to wait for engines and initialization.
        progress: show progress while connecting.

    Raises:
        SessionError: no engines, a mix of initialized and uninitialized
            engines, or initialization failed (the message says where the
            coordinator was placed and why).
        OSError: the connection file is missing.
    """
    import ipyparallel as ipp

    sweep_shm()  # shared memory left by kernels that died
    show = Progress(progress, 'mhnotebook: connecting to the ipyparallel cluster ...')
    kwargs = {k: v for k, v in dict(profile=profile, cluster_id=cluster_id).items() if v}
    if url_file is not None:
        url_file = os.path.abspath(os.path.expanduser(os.fspath(url_file)))
        if not os.path.exists(url_file):
            raise OSError(f'connection file {url_file} not found; is the controller running?')
    # ipyparallel 8+ takes the connection file as its first argument
    # (`connection_info`); its `url_file=` keyword is ignored.
    client = ipp.Client(url_file, timeout=timeout, **kwargs)
    try:
        engine_ids = _engine_ids(client, n, timeout)
        infos = engine_infos(client, engine_ids)
        ready = [e for e, i in infos.items() if i['initialized']]
        if ready and len(ready) != len(engine_ids):
            raise SessionError(
                f'JAX is distributed on engines {ready} but not on '
                f'{sorted(set(engine_ids) - set(ready))}; restart the engines.'
            )
        if not ready:
            placed = 'given'
            if coordinator is None:
                coordinator, placed = place_coordinator(client, engine_ids[0], infos[engine_ids[0]])
            infos = initialize(
                client,
                engine_ids,
                coordinator=coordinator,
                timeout=timeout,
                progress=show,
                bind=coordinator_bind,
                devices=devices_per_process,
                platform=platform,
                placed=placed,
            )
        else:  # JAX was initialized elsewhere: install there too (a no-op if done)
            client[engine_ids].apply_sync(_call, 'multihost.engine.install')
        counts = {i['process_count'] for i in infos.values()}
        if counts != {len(engine_ids)}:
            raise SessionError(
                f'engines report process_count {sorted(counts)} but the cluster '
                f'has {len(engine_ids)} engines; one engine per JAX process '
                'is required.'
            )
    except BaseException:
        client.close()
        raise
    session = Session(Engines(client, hosts_from_infos(infos)))
    show.update(
        f'mhnotebook: connected to {session.num_processes} processes (engines {session.engine_ids})'
    )
    return session


def _engine_ids(client: Any, n: int | None, timeout: float) -> list[int]:
    """The cluster's engine ids, ascending, once ``n`` of them registered (when given)."""
    if n is not None:
        try:
            client.wait_for_engines(n, timeout=timeout, interactive=False)
        except TimeoutError:
            raise SessionError(
                f'only {len(client.ids)} of {n} engines registered within {timeout:g} s '
                f"(controller {controller_url(client)}); see the engines' logs."
            ) from None
    engine_ids = sorted(client.ids)
    if not engine_ids:
        raise SessionError(
            'the cluster has no engines; start some (ipcluster engines '
            '-n N) or pass n=N to wait for them.'
        )
    return engine_ids
