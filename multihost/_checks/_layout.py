"""Where every shard of an array lives: the layout model.

`describe_layout` (local, no communication, any host) returns a `Layout`
listing *every* shard of the global array (not just this host's) with its
index, device, process, replica id and size, plus the mesh and partition
spec. Whether the replicas agree is `_replicas.check_replicas`
(a collective).

The model (`ShardInfo`, `LayoutBlock`, `Layout`) and the index helpers live in
`multihost._models._layout` (plain, picklable data, no jax); this module re-exports them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import numpy as np

from multihost._models._hardware import DeviceInfo, device_infos_from
from multihost._models._layout import (  # noqa: F401  (the models live there; re-exported)
    DEVICE_NAME_FORMS,
    MAX_TEXT_BLOCKS,
    MAX_TEXT_DEVICES,
    Index,
    IndexLike,
    Layout,
    LayoutBlock,
    ShardInfo,
    _format_spec,
    device_name,
    format_bytes,
    format_index,
    format_ranges,
    normalize_index,
)

# -- describe_layout --------------------------------------------------------------------


def _is_jax_array(x: Any) -> bool:
    import jax

    return isinstance(x, jax.Array)


def _itemsize(dtype: Any) -> int:
    size = getattr(dtype, 'itemsize', None)
    return int(size) if size is not None else int(np.dtype(dtype).itemsize)


def _local_indices(index_map: Any) -> tuple[tuple[int, int], ...]:
    """``(device id, index in jax.local_devices(process_index=p))`` for the given devices."""
    import jax

    wanted = {d.id for d in index_map}
    platform = getattr(next(iter(index_map), None), 'platform', None)
    try:
        devices = jax.devices(platform)
    except RuntimeError:  # a platform this process cannot list: default numbering
        return ()
    count: collections.Counter[int] = collections.Counter()
    out = []
    for d in devices:
        if d.id in wanted:
            out.append((int(d.id), count[d.process_index]))
        count[d.process_index] += 1
    return tuple(out)


def _is_abstract(x: Any) -> bool:
    """A `jax.ShapeDtypeStruct` (or alike) with a concrete sharding: a layout to preview."""
    return (
        hasattr(x, 'shape')
        and hasattr(x, 'dtype')
        and hasattr(getattr(x, 'sharding', None), 'devices_indices_map')
    )


def _device_infos(sharding: Any, index_map: Any) -> tuple[DeviceInfo, ...]:
    """The sharding's devices and, on a platform with chip coordinates, every device this
    process can list of that platform (the whole pod for the chip grid)."""
    import jax

    devices: dict[int, Any] = {d.id: d for d in index_map}
    mesh_devices = getattr(getattr(sharding, 'mesh', None), 'devices', None)
    if mesh_devices is not None:
        devices.update((d.id, d) for d in np.asarray(mesh_devices).flat)
    first = next(iter(devices.values()), None)
    if first is not None and getattr(first, 'coords', None) is not None:
        try:
            devices.update((d.id, d) for d in jax.devices(first.platform))
        except RuntimeError:  # topology devices (no such backend here): the mesh's own
            pass
    return device_infos_from(list(devices.values()))


def _layout_of_sharded(shape: tuple[int, ...], dtype: Any, sharding: Any) -> Layout:
    """The `Layout` of an array (concrete or abstract) of ``shape`` under ``sharding``."""
    import jax
    from jax.sharding import NamedSharding

    index_map = sharding.devices_indices_map(shape)
    placements = [(idx, d.id, d.process_index) for d, idx in index_map.items()]
    infos = _device_infos(sharding, index_map)
    fields: dict[str, Any] = dict(
        sharding=type(sharding).__name__,
        num_processes=max(
            jax.process_count(), 1 + max((d.process_index for d in infos), default=0)
        ),
        itemsize=_itemsize(dtype),
        devices=infos,
    )
    first = next(iter(index_map), None)
    fields['platform'] = str(getattr(first, 'platform', ''))
    fields['local_indices'] = _local_indices(index_map) or _own_numbering(infos)
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        fields['mesh_axes'] = tuple((str(a), int(n)) for a, n in mesh.shape.items())
        devices = getattr(mesh, 'devices', None)  # an AbstractMesh has none
        if devices is not None:
            fields['mesh_device_ids'] = tuple(int(d.id) for d in np.asarray(devices).flat)
        fields['spec'] = _format_spec(sharding.spec)
    return Layout.from_placements(shape, str(dtype), placements, **fields)


def _own_numbering(infos: Iterable[DeviceInfo]) -> tuple[tuple[int, int], ...]:
    """Devices numbered per process in id order (what ``jax.local_devices`` gives on a
    pod): for devices of a topology this process cannot list."""
    count: collections.Counter[int] = collections.Counter()
    out = []
    for d in sorted(infos, key=lambda d: d.id):
        out.append((d.id, count[d.process_index]))
        count[d.process_index] += 1
    return tuple(out)


def describe_layout(arr: Any) -> Layout:
    """Describes where every shard of ``arr`` lives. Local: no communication.

    Works on any host for a global (non-fully-addressable) or host-local
    `jax.Array` of any rank and any sharding: the layout lists the shards of
    *every* device, computed from the sharding alone. Every host describing
    the same global array gets an equal `Layout`.

    Args:
        arr: a `jax.Array`; a `jax.ShapeDtypeStruct` with a sharding (a
            layout previewed, e.g. over the devices of a TPU topology from
            `jax.experimental.topologies`: see `multihost.preview_layout`);
            or a numpy array (or numpy/Python scalar), which is described as
            a single shard in this process's host memory (``device_id``
            None, ``sharding`` ``'numpy'``).

    On TPU the layout knows each device's kind, chip coordinates, core and
    slice (`Layout.devices`) and how every mesh axis is wired
    (`Layout.axis_links`: ICI ring or not, hosts, DCN slices).

    Returns:
        A `Layout`.

    Raises:
        TypeError: ``arr`` is neither a `jax.Array` nor a numpy value (a
            pytree, for instance: map over its leaves instead).
    """
    import jax

    if _is_jax_array(arr) or _is_abstract(arr):
        return _layout_of_sharded(tuple(arr.shape), arr.dtype, arr.sharding)
    if isinstance(arr, (np.ndarray, np.generic, bool, int, float, complex)):
        value = np.asarray(arr)
        whole = tuple((0, n) for n in value.shape)
        return Layout.from_placements(
            value.shape,
            str(value.dtype),
            [(whole, None, jax.process_index())],
            sharding='numpy',
            num_processes=jax.process_count(),
            platform='host',
            itemsize=value.dtype.itemsize,
        )
    raise TypeError(
        'describe_layout expects a jax.Array or a numpy array, got '
        f'{type(arr).__module__}.{type(arr).__qualname__}'
        + (
            '; for a pytree, map over its leaves: jax.tree.map(multihost.describe_layout, tree)'
            if isinstance(arr, (list, tuple, dict))
            else ''
        )
    )
