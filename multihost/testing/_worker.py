"""The worker of a `LocalCluster`: one simulated host (``python -m multihost.testing --worker``).

It connects back to the cluster over an authenticated `multiprocessing.connection`,
sets its CPU device count and joins ``jax.distributed.initialize``, says it is
ready, then runs module-level functions on request (loading their file by its
path), each bracketed by coordination-service barriers named after the call when
asked, and sends back the result or the formatted traceback. SIGUSR1 writes every
thread's stack to its log (faulthandler), which `LocalCluster` collects on failure.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client
from typing import Any

_loaded: dict[str, Any] = {}


def _load(path: str) -> Any:
    mod = _loaded.get(path)
    if mod is None:
        name = f'_multihost_testing_{abs(hash(path)):x}'
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f'cannot load a Python module from {path}')
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _loaded[path] = mod
    return mod


def _resolve(path: str, qualname: str) -> Callable[..., Any]:
    obj = _load(path)
    for part in qualname.split('.'):
        obj = getattr(obj, part)
    return obj


def _harness_barrier(client: Any | None, name: str, timeout: float) -> None:
    if client is None:
        raise RuntimeError(f'{name}: JAX has no coordination service (not distributed)')
    client.wait_at_barrier(name, max(1000, int(timeout * 1000)))


def _worker_main(argv: list[str]) -> None:
    (address, authkey, index_arg, n_arg, devices_arg, coordinator) = argv[:6]
    (recoverable, preemption, heartbeat) = argv[6:9]
    init_backend = argv[9:] != ['0']
    index, n, devices = int(index_arg), int(n_arg), int(devices_arg)
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    host, port = address.rsplit(':', 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(authkey))
    conn.send(index)
    try:
        import multihost

        multihost._load()  # the whole drop-in, as on a host that uses one of its names
        import jax

        jax.config.update('jax_platforms', 'cpu')
        jax.config.update('jax_num_cpu_devices', devices)
        jax.config.update('jax_enable_recoverability', bool(int(recoverable)))
        jax.config.update('jax_enable_preemption_service', bool(int(preemption)))
        jax.distributed.initialize(
            coordinator_address=coordinator,
            coordinator_bind_address=coordinator,  # loopback only, not JAX's [::]
            num_processes=n,
            process_id=index,
            heartbeat_timeout_seconds=int(heartbeat),
            initialization_timeout=120,
        )
        # Without init_backend the backend stays cold until the test's own
        # first JAX operation (a host still loading data, say).
        info = {
            'process_index': jax.process_index() if init_backend else index,
            'devices': [d.id for d in jax.local_devices()] if init_backend else [],
            'pid': os.getpid(),
        }
    except BaseException:
        conn.send(('error', traceback.format_exc()))
        raise
    conn.send(('ready', info))
    from multihost import _jax_adapter

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == 'stop':
            break
        _, run_id, path, qualname, args, kwargs, bracket, timeout = msg
        try:
            fn = _resolve(path, qualname)
            if bracket:
                _harness_barrier(_jax_adapter.client(), f'harness/{run_id}/start', timeout)
            result = fn(*args, **kwargs)
            if bracket:
                _harness_barrier(_jax_adapter.client(), f'harness/{run_id}/end', timeout)
            reply = ('ok', result)
        except BaseException:
            reply = ('error', traceback.format_exc())
        sys.stdout.flush()
        try:
            conn.send(reply)
        except Exception:  # unpicklable result
            conn.send(('error', traceback.format_exc()))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str]) -> None:
    """``python -m multihost.testing --worker ...`` (what `LocalCluster` starts)."""
    if len(argv) > 1 and argv[1] == '--worker':
        _worker_main(argv[2:])
    else:
        sys.exit('usage: python -m multihost.testing --worker ... (started by LocalCluster)')
