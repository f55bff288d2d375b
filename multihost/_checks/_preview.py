"""A layout previewed on a TPU pod this machine does not have: `preview_layout`.

`jax.experimental.topologies` returns the real devices of a TPU topology (``'v5e:4x4'``,
``'v5p:2x2x4'``, two slices...) when libtpu is installed, with or without TPUs
(``JAX_PLATFORMS=cpu`` keeps the runtime on CPU); a `jax.ShapeDtypeStruct` sharded over them
is described like an array (`describe_layout`): which block lands on which chip and host,
bytes per chip and per host, how each mesh axis is wired.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from multihost._checks._layout import describe_layout
from multihost._models._layout import Layout

_TOPOLOGY = re.compile(r'^(v\d+[a-z]*(?: lite)?):(\d+(?:x\d+)*)$')


def _libtpu_missing() -> str:
    return (
        'previewing a layout on a TPU topology needs libtpu on this machine (no TPU '
        "needed): pip install 'libtpu==0.0.42.*' for jax 0.10.2 (jax names its libtpu "
        'version in its setup.py), and keep JAX_PLATFORMS=cpu'
    )


def topology_devices(topology: str, num_slices: int = 1) -> list[Any]:
    """The devices of a TPU topology (``'v5e:4x4'``, ``'v4:2x2x2'``), slice by slice.

    Raises:
        ValueError: a malformed topology name (the message shows the form).
        RuntimeError: libtpu is missing (the message says what to install), or libtpu
            does not know the topology.
    """
    text = str(topology).strip()
    if not _TOPOLOGY.match(text):
        raise ValueError(
            f'topology {topology!r} is not of the form KIND:SHAPE, e.g. v5e:4x4, v5p:2x2x4, '
            'v4:2x2x2 (chips per dimension)'
        )
    if int(num_slices) < 1:
        raise ValueError(f'num_slices must be 1 or more, got {num_slices}')
    from jax.experimental import topologies

    kwargs = {'num_slices': int(num_slices)} if int(num_slices) > 1 else {}
    try:
        desc = topologies.get_topology_desc(topology_name=text, platform='tpu', **kwargs)
    except Exception as exc:  # jax raises RuntimeError/ValueError/JaxRuntimeError by version
        message = str(exc)
        if 'TPU support not installed' in message or 'Unknown backend' in message:
            raise RuntimeError(_libtpu_missing()) from None
        raise RuntimeError(
            f'libtpu could not describe topology {text!r} ({num_slices} slice(s)): '
            f'{message.splitlines()[0] if message else type(exc).__name__}'
        ) from None
    return sorted(desc.devices, key=lambda d: (getattr(d, 'slice_index', 0) or 0, d.id))


def _mesh_devices(devices: list[Any], sizes: tuple[int, ...], num_slices: int) -> np.ndarray:
    """The devices arranged as a mesh of ``sizes``: jax's topology-aware order
    (`mesh_utils.create_device_mesh`, hybrid with the first axis over slices for several
    slices), else device order (e.g. two cores per chip, which mesh_utils refuses)."""
    from jax.experimental import mesh_utils

    try:
        if num_slices > 1:
            if sizes[0] % num_slices:
                raise ValueError
            ici = (sizes[0] // num_slices, *sizes[1:])
            dcn = (num_slices,) + (1,) * (len(sizes) - 1)
            return np.asarray(
                mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
            ).reshape(sizes)
        return np.asarray(mesh_utils.create_device_mesh(sizes, devices=devices))
    except (AssertionError, ValueError, NotImplementedError):
        return np.array(devices, dtype=object).reshape(sizes)


def preview_layout(
    shape: Sequence[int],
    dtype: Any = 'float32',
    *,
    topology: str,
    mesh: Mapping[str, int] | Sequence[tuple[str, int]],
    spec: Any = (),
    num_slices: int = 1,
) -> Layout:
    """How an array would be laid out on a TPU pod, from a machine without one.

    Args:
        shape: the global shape.
        dtype: its dtype (``'bfloat16'``, ``jnp.float32``).
        topology: the pod, as ``KIND:SHAPE`` (``'v5e:4x4'``, ``'v5p:2x2x4'``).
        mesh: axis name -> size, in mesh order (``{'data': 4, 'model': 4}``); the
            sizes multiply to the number of devices. With ``num_slices`` > 1 the
            first axis runs over the slices (DCN) and its size is a multiple of them.
        spec: the partition spec: a `PartitionSpec` or what it is built from
            (``('data', 'model')``, ``(('data', 'fsdp'), None)``).
        num_slices: slices of ``topology`` joined by DCN.

    Returns:
        The `Layout` (its `Layout.devices` the whole pod, `Layout.axis_links`
        the wiring of each mesh axis).

    Raises:
        ValueError: a malformed topology, or a mesh whose sizes do not match the devices.
        RuntimeError: libtpu is missing (the message says what to install).
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = topology_devices(topology, num_slices)
    axes = tuple(mesh.items()) if isinstance(mesh, Mapping) else tuple(mesh)
    names = tuple(str(a) for a, _ in axes)
    sizes = tuple(int(n) for _, n in axes)
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f'mesh {dict(axes)} has {math.prod(sizes)} positions but {topology} x '
            f'{num_slices} slice(s) has {len(devices)} devices: make the sizes multiply '
            f'to {len(devices)}'
        )
    grid = _mesh_devices(devices, sizes, int(num_slices))
    pspec = spec if isinstance(spec, PartitionSpec) else PartitionSpec(*tuple(spec))
    sharding = NamedSharding(Mesh(grid, names), pspec)
    abstract = jax.ShapeDtypeStruct(tuple(int(n) for n in shape), dtype, sharding=sharding)
    return describe_layout(abstract)
