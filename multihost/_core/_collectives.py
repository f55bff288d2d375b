"""Broadcast, gather, compare and barrier across hosts (docs/API.md §2, first four rows).

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
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from multihost import _jax_adapter, _recorder, _structure
from multihost._exchange import _sequence

_PROCESS_AXIS = 'processes'
_Tree = TypeVar('_Tree')


@functools.cache
def _process_mesh(process_count: int) -> Mesh:
    """A 1-D mesh holding the first local device of every process, in process order."""
    devices = [jax.local_devices(process_index=p)[0] for p in range(process_count)]
    return Mesh(np.array(devices), (_PROCESS_AXIS,))


# The process-wide distributed state (`jax.distributed.initialize` fills it in;
# never replaced): read per collective without a function call.
_STATE = _jax_adapter.distributed_state()


def _process_count() -> int:
    """The number of processes, without starting the JAX backend when `jax.distributed` runs.

    A collective's sequence check must come before anything that starts the
    backend (see `process_allgather`); without a distributed client, JAX's count.
    """
    state = _STATE
    return state.num_processes if state.client is not None else jax.process_count()


def _process_index() -> int:
    """This process's index, like `_process_count` (no backend start when distributed)."""
    state = _STATE
    return state.process_id if state.client is not None else jax.process_index()


def _identity(xs: _Tree) -> _Tree:
    return xs


def _sum_over_processes(xs: list[jax.Array]) -> list[jax.Array]:
    return [jnp.sum(x, axis=0, dtype=x.dtype) for x in xs]


# Module-level jit objects with fixed out_shardings: built once per mesh so
# repeated calls with the same avals hit the compile cache.
@functools.cache
def _gather_fn(sharding: NamedSharding) -> Callable[[Any], Any]:
    return jax.jit(_identity, out_shardings=sharding)


@functools.cache
def _sum_fn(sharding: NamedSharding) -> Callable[[list[jax.Array]], list[jax.Array]]:
    return jax.jit(_sum_over_processes, out_shardings=sharding)


def _is_global(x: Any) -> bool:
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def _tree_digest(kind: str, treedef: Any, leaves: list[Any], extra: Any = None) -> str:
    sig = [(tuple(np.shape(x)), str(getattr(x, 'dtype', type(x).__name__))) for x in leaves]
    return _sequence.digest((kind, _structure.structure(treedef), sig, extra))


def _stack_on_processes(host_arrays: list[np.ndarray]) -> list[jax.Array]:
    """Each host's array becomes one shard of a global array sharded over processes."""
    mesh = _process_mesh(jax.process_count())
    sharding = NamedSharding(mesh, P(_PROCESS_AXIS))
    device = jax.local_devices()[0]
    n = jax.process_count()
    bufs = jax.device_put(host_arrays, device)
    return [
        jax.make_array_from_single_device_arrays((n * b.shape[0], *b.shape[1:]), sharding, [b])
        for b in bufs
    ]


def _mesh_of(x: jax.Array) -> Mesh:
    """The mesh of ``x``'s NamedSharding, else a 1-D mesh of its devices."""
    if isinstance(x.sharding, NamedSharding) and isinstance(x.sharding.mesh, Mesh):
        return x.sharding.mesh
    devices = _jax_adapter.device_assignment(x.sharding)
    return Mesh(np.array(devices), ('devices',))


def _gather_global(x: jax.Array) -> np.ndarray:
    """General path: XLA replicates the array over all its devices."""
    mesh = _mesh_of(x)
    with jax.set_mesh(mesh):
        out = _gather_fn(NamedSharding(mesh, P()))(x)
    return np.asarray(out.addressable_data(0))


Box = tuple[tuple[int, int], ...]


def _norm(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple((s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape))


@functools.lru_cache(maxsize=256)
def _process_boxes(sharding: Any, shape: tuple[int, ...], n: int) -> tuple[Box, ...] | None:
    """Per process, the box of the global array its devices hold, when every
    process's shards tile one box and all boxes have the same shape; else None."""
    per_process: dict[int, set[Box]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        per_process.setdefault(device.process_index, set()).add(_norm(index, shape))
    boxes = []
    for p in range(n):
        blocks = per_process.get(p)
        if not blocks:
            return None
        box = tuple(
            (min(b[d][0] for b in blocks), max(b[d][1] for b in blocks)) for d in range(len(shape))
        )
        volume = sum(np.prod([hi - lo for lo, hi in b], dtype=np.int64) for b in blocks)
        if volume != np.prod([hi - lo for lo, hi in box], dtype=np.int64):
            return None
        boxes.append(box)
    if len({tuple(hi - lo for lo, hi in b) for b in boxes}) != 1:
        return None
    return tuple(boxes)


def _host_block(x: jax.Array, box: Box) -> np.ndarray:
    """This host's box of ``x``, assembled from its addressable shards (one replica each)."""
    out = np.empty([hi - lo for lo, hi in box], dtype=x.dtype)
    seen = set()
    for shard in x.addressable_shards:
        idx = _norm(shard.index, x.shape)
        if idx in seen:
            continue
        seen.add(idx)
        out[tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(idx, box))] = shard.data
    return out


#: Below this many bytes in all (every host's share together), a gather or
#: broadcast of host-local data travels inside the sequence check's own
#: key-value exchange: one coordinator round trip, no device collective.
#: Base64 in the records makes it 4/3 larger: 512 KiB keeps every host's
#: record inline (three quarters of `_kv.MAX_BYTES` per directory read, for up
#: to a few hundred hosts; beyond, records are chunked: still correct).
SMALL_EXCHANGE_BYTES = 512 << 10


def _canonical(x: Any) -> np.ndarray:
    """``x`` as numpy with the dtype a device transfer would give it (x64 off: int64 -> int32)."""
    a = np.asarray(x)
    dtype = jax.dtypes.canonicalize_dtype(a.dtype)
    return a if a.dtype == dtype else a.astype(dtype)


def _fits_exchange(arrays: list[np.ndarray]) -> bool:
    """Whether every host's share together, at device dtypes, fits `SMALL_EXCHANGE_BYTES`.

    Decided from shapes and dtypes only, so large data is never converted here.
    """
    if any(a.dtype == object for a in arrays):
        return False
    per_host = sum(a.size * jax.dtypes.canonicalize_dtype(a.dtype).itemsize for a in arrays)
    return per_host * _process_count() <= SMALL_EXCHANGE_BYTES


def _split(payload: bytes, like: list[np.ndarray]) -> list[np.ndarray]:
    out, offset = [], 0
    for a in like:
        out.append(np.frombuffer(payload, a.dtype, a.size, offset).reshape(a.shape))
        offset += a.nbytes
    return out


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
    if not tiled and any(_is_global(x) for x in leaves):
        raise ValueError('Gathering global non-fully-addressable arrays only supports tiled=True')
    # Up to the check, nothing may start the JAX backend: a cold host's
    # backend start waits for every other host's, which may be in another
    # collective (then nobody would ever say so).
    if _process_count() == 1:
        return jax.tree.unflatten(treedef, _allgather_single(leaves, tiled))
    checked = _sequence.checking_enabled()
    digest = _tree_digest('allgather', treedef, leaves, tiled) if checked else ''
    if checked and not any(_is_global(x) for x in leaves):
        host = [np.asarray(x) for x in leaves]
        if _fits_exchange(host):
            return jax.tree.unflatten(treedef, _allgather_by_exchange(host, tiled, digest))
    if checked:
        _sequence.enter('process_allgather', f'tiled={tiled}', tree_digest=digest)
    return jax.tree.unflatten(treedef, _allgather_on_devices(leaves, tiled))


def _allgather_single(leaves: list[Any], tiled: bool) -> list[np.ndarray]:
    """One process: each leaf as numpy, stacked to a leading axis of 1 unless tiled."""
    local = []
    for x in leaves:
        a = np.asarray(x)
        local.append(a if tiled and a.ndim > 0 else np.expand_dims(a, 0))
    return local


def _allgather_by_exchange(host: list[np.ndarray], tiled: bool, digest: str) -> list[np.ndarray]:
    """Small host-local data: the bytes ride in the sequence check's own exchange (no device)."""
    mine = [_canonical(a) for a in host]
    mine = [a if tiled and a.ndim > 0 else a[None] for a in mine]
    payloads = _sequence.exchange(
        'process_allgather',
        f'tiled={tiled}',
        b''.join(a.tobytes() for a in mine),
        tree_digest=digest,
    )
    per_host = [_split(payloads[p], mine) for p in range(_process_count())]
    return [np.concatenate([h[i] for h in per_host]) for i in range(len(mine))]


def _allgather_on_devices(leaves: list[Any], tiled: bool) -> list[np.ndarray]:
    """The device path: one block per host on the process mesh, XLA's replication otherwise.

    Host-local leaves and global arrays whose hosts hold equal boxes travel
    together in one jitted gather (1/D of XLA's replicate-everywhere traffic);
    an array every host holds whole is read locally; the rest is replicated by
    XLA over its own devices (`_gather_global`).
    """
    n, pid = jax.process_count(), jax.process_index()
    outs: list[Any] = [None] * len(leaves)
    stacked_idx, host_arrays, boxes_of = [], [], {}
    for i, x in enumerate(leaves):
        if not _is_global(x):
            a = np.asarray(x)
            if a.ndim == 0 or not tiled:
                a = np.expand_dims(a, 0)
        else:
            boxes = _process_boxes(x.sharding, tuple(x.shape), n)
            if boxes is None:
                continue  # general path below
            if all(b == tuple((0, d) for d in x.shape) for b in boxes):
                outs[i] = _host_block(x, boxes[pid])  # every host holds all of it
                continue
            boxes_of[i] = boxes
            a = _host_block(x, boxes[pid])[None]
        stacked_idx.append(i)
        host_arrays.append(a)
    if host_arrays:
        for i, g in zip(stacked_idx, _gather_on_process_mesh(host_arrays)):
            outs[i] = g if i not in boxes_of else _place_boxes(g, leaves[i].shape, boxes_of[i])
    for i, x in enumerate(leaves):
        if outs[i] is None:
            outs[i] = _gather_global(x)
    return outs


def _gather_on_process_mesh(host_arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Every host's arrays stacked along the process axis, replicated back to numpy."""
    mesh = _process_mesh(jax.process_count())
    replicated = NamedSharding(mesh, P())
    with jax.set_mesh(mesh):
        gathered = _gather_fn(replicated)(_stack_on_processes(host_arrays))
    return [np.asarray(g.addressable_data(0)) for g in gathered]


def _place_boxes(
    per_host: np.ndarray, shape: tuple[int, ...], boxes: tuple[Box, ...]
) -> np.ndarray:
    """The global value from one gathered block per host (``per_host[p]`` is host p's box)."""
    full = np.empty(shape, dtype=per_host.dtype)
    for p, box in enumerate(boxes):
        full[tuple(slice(lo, hi) for lo, hi in box)] = per_host[p]
    return full


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
    # No backend start before the check (see `process_allgather`).
    if _process_count() == 1:
        return jax.tree.unflatten(treedef, [np.asarray(x) for x in leaves])
    if is_source is None:
        is_source = _process_index() == 0
    checked = _sequence.checking_enabled()
    digest = _tree_digest('broadcast', treedef, leaves) if checked else ''
    host = [np.asarray(x) for x in leaves]
    # A thread reading host copies (`_recorder.reading_host_copies`: a data tool while a
    # launch may hold the device) never takes the device path, whatever the size.
    if (checked and _fits_exchange(host)) or _recorder.host_copies_only():
        mine = [_canonical(a) for a in host]
        # Only sources send data; the result is the sum of the sources' leaves
        # (as JAX's psum-based broadcast computes it).
        payloads = _sequence.exchange(
            'broadcast_one_to_all',
            '',
            b''.join(a.tobytes() for a in mine) if is_source else b'',
            tree_digest=digest,
            sources_only=True,
        )
        sources = [_split(b, mine) for _, b in sorted(payloads.items()) if b]
        outs = []
        for i, a in enumerate(mine):
            if not sources:
                outs.append(np.zeros_like(a))
            elif len(sources) == 1:
                outs.append(sources[0][i].copy())
            else:
                outs.append(np.sum(np.stack([src[i] for src in sources]), axis=0, dtype=a.dtype))
        return jax.tree.unflatten(treedef, outs)
    if checked:
        _sequence.enter('broadcast_one_to_all', '', tree_digest=digest)
    host_arrays = []
    for a in host:
        if not is_source:
            a = np.zeros_like(a)
        host_arrays.append(np.expand_dims(a, 0))
    mesh = _process_mesh(jax.process_count())
    replicated = NamedSharding(mesh, P())
    with jax.set_mesh(mesh):
        summed = _sum_fn(replicated)(_stack_on_processes(host_arrays))
    return jax.tree.unflatten(treedef, [np.asarray(s.addressable_data(0)) for s in summed])


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
    _sequence.enter(
        'barrier',
        name,
        timeout=timeout,
        mismatch_prefix=f"sync_global_devices name mismatch ('{name}')",
    )


def barrier(name: str, *, timeout: float | None = None) -> None:
    """A named, timed barrier across every host (see `sync_global_devices`)."""
    if not isinstance(name, str):
        raise TypeError(f'barrier name must be a str, got {type(name).__name__}')
    _sequence.enter('barrier', name, timeout=timeout)
