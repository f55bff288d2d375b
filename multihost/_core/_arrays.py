"""Host-local data <-> global `jax.Array` (docs/API.md §2, the two
conversion rows; §3 says exactly where they differ from JAX's).

Built on public JAX only: `Mesh.local_mesh`, `NamedSharding`,
`Sharding.devices_indices_map`, `jax.device_put` and
`jax.make_array_from_single_device_arrays` (which adopts the per-device
buffers it is given, so an input already laid out like the target is never
copied).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils as _jax_multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from multihost._exchange import _sequence

#: JAX's own conversions, captured at import: `multihost.install` replaces the
#: module's attributes with ours, and a tracer must still reach JAX's primitive
#: (no recursion, no second record).
_jax_to_global = _jax_multihost_utils.host_local_array_to_global_array
_jax_to_local = _jax_multihost_utils.global_array_to_host_local_array

_NONE_PSPEC = (
    '`None` is not a valid input to the pspecs argument. Please use '
    'jax.sharding.PartitionSpec() if you wanted to replicate your input.'
)


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, P)


def _flat_specs(what: str, tree: Any, pspecs: Any) -> list[Any]:
    """One pspec per leaf of ``tree``; ``pspecs`` may be any pytree prefix of it."""
    if pspecs is None:
        raise ValueError(_NONE_PSPEC)
    if isinstance(pspecs, P):  # the common case: one spec for every leaf
        return [pspecs] * len(jax.tree.leaves(tree))
    spec_leaves, spec_def = jax.tree.flatten(pspecs, is_leaf=_is_spec_leaf)
    try:
        # jaxlib ships no type stub for PyTreeDef, so mypy cannot see its methods.
        subtrees = spec_def.flatten_up_to(tree)  # type: ignore[attr-defined]
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f'{what} must be a PartitionSpec or a pytree of PartitionSpecs that '
            f'is a prefix of the inputs; got pspecs {pspecs!r} for inputs with '
            f'structure {jax.tree.structure(tree)}: {exc}'
        ) from None
    out: list[Any] = []
    for spec, sub in zip(spec_leaves, subtrees):
        if spec is None:
            raise ValueError(_NONE_PSPEC)
        if not isinstance(spec, P):
            raise TypeError(
                f'{what} leaves must be jax.sharding.PartitionSpec, '
                f'got {type(spec).__name__}: {spec!r}'
            )
        out.extend([spec] * len(jax.tree.leaves(sub)))
    return out


@functools.lru_cache(maxsize=64)
def _check_contiguous(mesh: Mesh) -> None:
    """Every process's devices must form a sub-box (sub-cube) of ``mesh``."""
    procs = np.vectorize(lambda d: d.process_index, otypes=[int])(mesh.devices)
    if not (procs == jax.process_index()).any():
        raise ValueError(
            f'global_mesh {dict(mesh.shape)} holds none of process '
            f"{jax.process_index()}'s devices; every process that calls this "
            'function must own part of the mesh.'
        )
    for p in np.unique(procs):
        where = np.argwhere(procs == p)
        lo, hi = where.min(axis=0), where.max(axis=0) + 1
        if math.prod((hi - lo).tolist()) != len(where):
            box = ', '.join(
                f'{ax}[{a}:{b}]' for ax, a, b in zip(mesh.axis_names, lo.tolist(), hi.tolist())
            )
            raise ValueError(
                f"global_mesh is not contiguous: process {int(p)}'s "
                f'{len(where)} devices do not form a sub-cube of the mesh '
                f'{dict(mesh.shape)} (they are spread over {box}, which holds '
                f'{math.prod((hi - lo).tolist())} devices). '
                'host_local_array_to_global_array and '
                "global_array_to_host_local_array need every host's devices to "
                'be one contiguous block of the mesh. Reorder the mesh devices '
                '(e.g. jax.make_mesh or np.array(jax.devices()).reshape(...) '
                'keeps each process contiguous), or build the global array '
                'directly with jax.make_array_from_callback or '
                'jax.make_array_from_single_device_arrays.'
            )


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _factors(mesh: Mesh, spec: P, ndim: int) -> list[int]:
    """Per dimension: how many hosts' blocks the global dimension is made of."""
    if len(spec) > ndim:
        raise ValueError(
            f'PartitionSpec {spec} has {len(spec)} entries but the '
            f'array has only {ndim} dimension(s).'
        )
    local = mesh.local_mesh.shape
    out = []
    for d in range(ndim):
        entry = spec[d] if d < len(spec) else None
        f = 1
        for ax in _axes(entry):
            if ax not in mesh.shape:
                raise ValueError(
                    f'PartitionSpec {spec} names axis {ax!r}, which '
                    f'is not in the mesh axes {mesh.axis_names}.'
                )
            f *= mesh.shape[ax] // local[ax]
        out.append(f)
    return out


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _is_float0(x: Any) -> bool:
    return getattr(x, 'dtype', None) == jax.dtypes.float0


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything about one (mesh, spec, shape) conversion that does not depend on the data."""

    global_sharding: NamedSharding
    local_sharding: NamedSharding
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    offset: tuple[int, ...]  # where this host's block starts in the global array


@functools.lru_cache(maxsize=1024)
def _plan(mesh: Mesh, spec: P, shape: tuple[int, ...], shape_is_local: bool) -> _Plan:
    _check_contiguous(mesh)
    factors = _factors(mesh, spec, len(shape))
    if shape_is_local:
        local_shape, global_shape = shape, tuple(n * f for n, f in zip(shape, factors))
    else:
        global_shape, local_shape = shape, tuple(n // f for n, f in zip(shape, factors))
    global_sharding = NamedSharding(mesh, spec)
    indices = global_sharding.addressable_devices_indices_map(global_shape).values()
    starts = [idx for idx in indices if idx is not None]  # typed Optional; never None here
    offset = tuple(min(idx[d].start or 0 for idx in starts) for d in range(len(global_shape)))
    return _Plan(
        global_sharding, NamedSharding(mesh.local_mesh, spec), global_shape, local_shape, offset
    )


def _same_sharding(x: jax.Array, sharding: NamedSharding) -> bool:
    return x.sharding == sharding or x.sharding.is_equivalent_to(sharding, x.ndim)


def _traced(x: Any, mesh: Mesh, spec: P, to_global: bool) -> Any:
    """A tracer (under `jax.jit`, `jax.vmap`, `jax.grad`...) goes to JAX's own conversion.

    JAX implements both conversions as primitives with abstract evaluation,
    batching and transpose rules, so handing the tracer to its public
    functions (which bind those primitives) keeps every transformation
    working exactly as with `jax.experimental.multihost_utils`. The mesh and
    the spec get the same checks, and errors, as concrete values.
    """
    _check_contiguous(mesh)
    _factors(mesh, spec, x.ndim)
    if to_global:
        return _jax_to_global(x, mesh, spec)
    return _jax_to_local(x, mesh, spec)


def _convert(x: Any, mesh: Mesh, spec: P, to_global: bool) -> Any:
    """One leaf, either way: what both conversions do before their own work."""
    if isinstance(x, jax.core.Tracer):
        return _traced(x, mesh, spec, to_global)
    if isinstance(x, jax.Array) and x.is_fully_addressable != to_global:
        return x  # already on the requested side
    if _is_key(x):  # convert the key data, wrap it again
        data = _convert(jax.random.key_data(x), mesh, spec, to_global)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if _is_float0(x):
        x = np.zeros(x.shape, dtype=bool)
    if not hasattr(x, 'shape'):
        x = np.asarray(x)
    plan = _plan(mesh, spec, tuple(x.shape), to_global)
    return (_to_global if to_global else _to_local)(x, spec, plan)


def _to_global(x: Any, spec: P, plan: _Plan) -> jax.Array:
    """This host's local data as its block of the global array."""
    if isinstance(x, jax.Array) and _same_sharding(x, plan.local_sharding):
        bufs = [s.data for s in x.addressable_shards]  # zero copy
        return jax.make_array_from_single_device_arrays(
            plan.global_shape, plan.global_sharding, bufs
        )
    # The host's devices form a box of the mesh (checked in _plan), so its
    # local data is the global array's block starting at `offset`: every
    # device's global index, shifted by it, indexes the local data. The
    # callback form puts all local pieces in one batched transfer.
    host = np.asarray(x)
    offset = plan.offset

    def local_piece(index: tuple[slice, ...] | None) -> np.ndarray:
        if index is None:  # JAX passes every addressable device's index
            raise ValueError('make_array_from_callback passed no index')
        return host[
            tuple(
                slice((s.start or 0) - o, None if s.stop is None else s.stop - o)
                for s, o in zip(index, offset)
            )
        ]

    return jax.make_array_from_callback(plan.global_shape, plan.global_sharding, local_piece)


def host_local_array_to_global_array(local_inputs: Any, global_mesh: Mesh, pspecs: Any) -> Any:
    """Converts host-local values to globally sharded `jax.Array` values.

    Each host passes its own local data (which may differ between hosts); the
    result is a global array sharded by ``NamedSharding(global_mesh, pspec)``
    in which every device holds its host's slice. Along dimensions sharded
    over mesh axes that span hosts, the global size is the local size times
    the number of hosts' blocks; with ``PartitionSpec()`` the value is
    replicated and the global shape equals the local one (hosts passing
    *different* data for a replicated spec is undefined behaviour that JAX
    never reports; `multihost.check_replicas` detects it).

    Traceable: under `jax.jit`, `jax.vmap` or `jax.grad` a tracer is handed to
    JAX's own primitive (as `jax.experimental.multihost_utils` does), so the
    result is JAX's.

    Args:
      local_inputs: a pytree of host-local values (numpy, `jax.Array`, PRNG key
        arrays, float0 arrays, tracers). A non-fully-addressable `jax.Array` is
        already global and is returned as is.
      global_mesh: a `jax.sharding.Mesh`. It *must* be contiguous: each host's
        devices form a sub-cube of the mesh.
      pspecs: a `PartitionSpec`, or a pytree of them that is a prefix of
        ``local_inputs``.

    Returns:
      A pytree of global `jax.Array` values.

    Raises:
      ValueError: ``pspecs`` is None (or holds None); the mesh is not
        contiguous; a pspec does not fit its array.
    """
    return _convert_tree('input pspecs', local_inputs, global_mesh, pspecs, to_global=True)


def _to_local(x: Any, spec: P, plan: _Plan) -> jax.Array:
    """This host's block of a global array, as a host-local array."""
    if isinstance(x, jax.Array):
        if not _same_sharding(x, plan.global_sharding):
            if _sequence.checking_enabled():
                _sequence.enter(
                    'global_array_to_host_local_array',
                    'reshard',
                    tree_digest=_sequence.digest((x.shape, str(x.dtype), spec)),
                )
            x = jax.device_put(x, plan.global_sharding)
        bufs = [s.data for s in x.addressable_shards]  # zero copy
    else:
        # A numpy value stands for the whole global array: keep this host's part.
        index = plan.global_sharding.addressable_devices_indices_map(x.shape)
        bufs = jax.device_put([x[i] for i in index.values()], list(index.keys()))
    return jax.make_array_from_single_device_arrays(plan.local_shape, plan.local_sharding, bufs)


def global_array_to_host_local_array(global_inputs: Any, global_mesh: Mesh, pspecs: Any) -> Any:
    """Converts global `jax.Array` values to this host's local part.

    The inverse of `host_local_array_to_global_array`: each host keeps the
    data on its own devices, as an array sharded by
    ``NamedSharding(global_mesh.local_mesh, pspec)``. No data is copied when
    the input is already sharded by ``NamedSharding(global_mesh, pspec)``.
    Traceable like `host_local_array_to_global_array`: tracers go to JAX's
    own primitive.

    Args:
      global_inputs: a pytree of global `jax.Array` values. A fully-addressable
        (host-local) array is returned as is.
      global_mesh: a contiguous `jax.sharding.Mesh` (each host's devices form
        a sub-cube).
      pspecs: a `PartitionSpec`, or a pytree of them that is a prefix of
        ``global_inputs``.

    Returns:
      A pytree of host-local `jax.Array` values.

    Raises:
      ValueError: ``pspecs`` is None (or holds None); the mesh is not
        contiguous; a pspec does not fit its array.
    """
    return _convert_tree('output pspecs', global_inputs, global_mesh, pspecs, to_global=False)


def _convert_tree(what: str, inputs: Any, mesh: Mesh, pspecs: Any, *, to_global: bool) -> Any:
    """Both conversions, leaf by leaf: ``pspecs`` checked and flattened against ``inputs``."""
    specs = _flat_specs(what, inputs, pspecs)
    leaves, treedef = jax.tree.flatten(inputs)
    return jax.tree.unflatten(
        treedef, [_convert(x, mesh, s, to_global) for x, s in zip(leaves, specs)]
    )
