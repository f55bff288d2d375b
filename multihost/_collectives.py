"""Broadcast, gather, compare and barrier across hosts (SPEC §2, first four rows).

Device collectives run on a one-device-per-process mesh: each host puts its
data on one local device and XLA gathers or reduces across hosts. JAX's own
implementation uses every local device (so every byte is copied and moved D
times); the result is the same and we move 1/D of the data.

Jitted helpers are cached per mesh/sharding (`functools.lru_cache`), so a
repeated call with the same shapes and dtypes hits JAX's compile cache and
compiles once.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from multihost import _jax_adapter, _sequence

_PROCESS_AXIS = 'processes'


@functools.lru_cache(maxsize=None)
def _process_mesh(process_count: int) -> Mesh:
    """A 1-D mesh holding the first local device of every process, in process order."""
    devices = [jax.local_devices(process_index=p)[0] for p in range(process_count)]
    return Mesh(np.array(devices), (_PROCESS_AXIS,))


def _identity(xs):
    return xs


def _sum_over_processes(xs):
    return [jnp.sum(x, axis=0, dtype=x.dtype) for x in xs]


# Module-level jit objects with fixed out_shardings: built once per mesh so
# repeated calls with the same avals hit the compile cache.
@functools.lru_cache(maxsize=None)
def _gather_fn(sharding: NamedSharding):
    return jax.jit(_identity, out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _sum_fn(sharding: NamedSharding):
    return jax.jit(_sum_over_processes, out_shardings=sharding)


def _is_global(x: Any) -> bool:
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def _tree_digest(kind: str, treedef: Any, leaves: list[Any], extra: Any = None) -> str:
    sig = [(tuple(np.shape(x)), str(getattr(x, 'dtype', type(x).__name__)))
           for x in leaves]
    return _sequence.digest((kind, str(treedef), sig, extra))


def _stack_on_processes(host_arrays: list[np.ndarray]) -> list[jax.Array]:
    """Each host's array becomes one shard of a global array sharded over processes."""
    mesh = _process_mesh(jax.process_count())
    sharding = NamedSharding(mesh, P(_PROCESS_AXIS))
    device = jax.local_devices()[0]
    n = jax.process_count()
    bufs = jax.device_put(host_arrays, device)
    return [
        jax.make_array_from_single_device_arrays((n * b.shape[0], *b.shape[1:]),
                                                 sharding, [b])
        for b in bufs
    ]


def _replicated_like(x: jax.Array) -> NamedSharding:
    if isinstance(x.sharding, NamedSharding):
        return NamedSharding(x.sharding.mesh, P())
    devices = _jax_adapter.device_assignment(x.sharding)
    return NamedSharding(Mesh(np.array(devices), ('devices',)), P())


def _gather_global(x: jax.Array) -> np.ndarray:
    sharding = _replicated_like(x)
    with jax.set_mesh(sharding.mesh):
        out = _gather_fn(sharding)(x)
    return np.asarray(out.addressable_data(0))


def process_allgather(in_tree: Any, tiled: bool = False) -> Any:
    """Gathers data from every process.

    Args:
      in_tree: pytree of arrays (numpy, host-local or global `jax.Array`,
        scalars). Each array *must* have the same shape on every host.
      tiled: whether to concatenate (True) or stack (False, the default) the
        hosts' arrays along a leading axis.

    Returns:
      A pytree of numpy arrays:
        * a global, non-fully-addressable `jax.Array` is gathered to its full
          global value (only with ``tiled=True``);
        * a numpy or fully-addressable array ``x`` becomes
          ``(num_processes, *x.shape)`` when stacked, or
          ``(num_processes * x.shape[0], *x.shape[1:])`` when tiled;
        * a scalar is always stacked to ``(num_processes,)``.

    Raises:
      ValueError: a non-fully-addressable array with ``tiled=False``.
      CollectiveMismatchError: hosts passed trees of different structure,
        shapes or dtypes (checked before any device collective).
    """
    leaves, treedef = jax.tree.flatten(in_tree)
    for x in leaves:
        if _is_global(x) and not tiled:
            raise ValueError(
                'Gathering global non-fully-addressable arrays only supports'
                ' tiled=True')
    if jax.process_count() == 1:
        outs = []
        for x in leaves:
            a = np.asarray(x)
            outs.append(a if tiled and a.ndim > 0 else np.expand_dims(a, 0))
        return jax.tree.unflatten(treedef, outs)

    if _sequence.checking_enabled():
        _sequence.enter('process_allgather', f'tiled={tiled}',
                        tree_digest=_tree_digest('allgather', treedef, leaves, tiled))
    local_idx = [i for i, x in enumerate(leaves) if not _is_global(x)]
    host_arrays = []
    for i in local_idx:
        a = np.asarray(leaves[i])
        if a.ndim == 0 or not tiled:
            a = np.expand_dims(a, 0)
        host_arrays.append(a)
    outs: list[Any] = [None] * len(leaves)
    if host_arrays:
        mesh = _process_mesh(jax.process_count())
        replicated = NamedSharding(mesh, P())
        with jax.set_mesh(mesh):
            gathered = _gather_fn(replicated)(_stack_on_processes(host_arrays))
        for i, g in zip(local_idx, gathered):
            outs[i] = np.asarray(g.addressable_data(0))
    for i, x in enumerate(leaves):
        if outs[i] is None:
            outs[i] = _gather_global(x)
    return jax.tree.unflatten(treedef, outs)


def broadcast_one_to_all(in_tree: Any, is_source: bool | None = None) -> Any:
    """Broadcasts data from a source host (host 0 by default) to every host.

    Args:
      in_tree: pytree of arrays; each array *must* have the same shape on
        every host.
      is_source: whether the caller is the source. Only the source host
        contributes data. If None, process 0 is the source.

    Returns:
      A pytree matching ``in_tree`` whose leaves are numpy arrays holding the
      source host's data.

    Raises:
      CollectiveMismatchError: hosts passed trees of different structure,
        shapes or dtypes.
    """
    leaves, treedef = jax.tree.flatten(in_tree)
    if jax.process_count() == 1:
        return jax.tree.unflatten(treedef, [np.asarray(x) for x in leaves])
    if is_source is None:
        is_source = jax.process_index() == 0
    if _sequence.checking_enabled():
        _sequence.enter('broadcast_one_to_all', '',
                        tree_digest=_tree_digest('broadcast', treedef, leaves))
    host_arrays = []
    for x in leaves:
        a = np.asarray(x)
        if not is_source:
            a = np.zeros_like(a)
        host_arrays.append(np.expand_dims(a, 0))
    mesh = _process_mesh(jax.process_count())
    replicated = NamedSharding(mesh, P())
    with jax.set_mesh(mesh):
        summed = _sum_fn(replicated)(_stack_on_processes(host_arrays))
    return jax.tree.unflatten(
        treedef, [np.asarray(s.addressable_data(0)) for s in summed])


def sync_global_devices(name: str, *, timeout: float | None = None) -> None:
    """Creates a barrier across all hosts/devices.

    Unlike JAX's (a device collective that waits forever), this barrier runs
    on the coordination service and can time out, naming who is missing.

    Args:
      name: the barrier's name; every host must pass the same one.
      timeout: seconds to wait for every host; default ``MULTIHOST_TIMEOUT``
        or `multihost.DEFAULT_TIMEOUT`.

    Raises:
      BarrierMismatchError: (an ``AssertionError``) hosts passed different
        names; raised on every host, listing each host's name.
      BarrierTimeoutError: (a ``TimeoutError``) some host did not arrive.
    """
    if not isinstance(name, str):
        raise TypeError(f'sync_global_devices name must be a str, got {type(name).__name__}')
    _sequence.enter('barrier', name, timeout=timeout,
                    mismatch_prefix=f"sync_global_devices name mismatch ('{name}')")


def barrier(name: str, *, timeout: float | None = None) -> None:
    """A named, timed barrier across every host (see `sync_global_devices`)."""
    if not isinstance(name, str):
        raise TypeError(f'barrier name must be a str, got {type(name).__name__}')
    _sequence.enter('barrier', name, timeout=timeout)


def _leaf_bytes(x: Any) -> np.ndarray:
    if _is_global(x):
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def _crc(a: np.ndarray) -> int:
    a = np.ascontiguousarray(a)
    return zlib.crc32(a.view(np.uint8).reshape(-1).data) if a.size else 0


def assert_equal(in_tree: Any, fail_message: str = '') -> None:
    """Verifies that all the hosts have the same tree of values.

    Args:
      in_tree: pytree of arrays. Global arrays are compared by their first
        addressable shard (as JAX does).
      fail_message: start of the error message.

    Raises:
      AssertionError: on every host, when any host's values differ.
    """
    leaves, treedef = jax.tree.flatten(in_tree)
    if jax.process_count() == 1:
        return
    arrays = [_leaf_bytes(x) for x in leaves]
    structure = repr((str(treedef), [(a.shape, str(a.dtype)) for a in arrays]))
    values = 0
    for a in arrays:
        values = zlib.crc32(_crc(a).to_bytes(4, 'little'), values)
    fingerprint = np.array([zlib.crc32(structure.encode()), values], dtype=np.uint32)
    prints = process_allgather(fingerprint)  # (num_processes, 2)
    if (prints == prints[0]).all():
        return
    bad_hosts = sorted({int(p) for p in np.nonzero((prints != prints[0]).any(axis=1))[0]})
    raise AssertionError(
        f'{fail_message}. Expected: values equal to process 0 on every host; '
        f'got different values on process(es) {bad_hosts}.')
