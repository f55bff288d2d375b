"""A layout previewed on a TPU pod this machine does not have: `preview_layout`.

`jax.experimental.topologies` returns the real devices of a TPU topology (``'v5e:4x4'``,
``'v5p:2x2x4'``, two slices...) when libtpu is installed, with or without TPUs
(``JAX_PLATFORMS=cpu`` keeps the runtime on CPU); a `jax.ShapeDtypeStruct` sharded over them
is described like an array (`describe_layout`): which block lands on which chip and host,
bytes per chip and per host, how each mesh axis is wired.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
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


@contextlib.contextmanager
def _libtpu_quiet() -> Iterator[None]:
    """libtpu, loaded on a machine without TPUs, writes a page of warnings to the process's
    stderr (no accelerator type, no worker host names: expected here): they are held back,
    and shown only when the call fails."""
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
        saved = os.dup(fd)
    except (OSError, ValueError):  # no real stderr (some embedders): nothing to hold back
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        ok = False
        try:
            yield
            ok = True
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            if not ok:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors='replace'))


def _share_libtpu() -> None:
    """With the runtime kept off TPUs (``JAX_PLATFORMS`` without ``tpu``), a description
    needs no chip: libtpu is told not to take its one-process lock file
    (``ALLOW_MULTIPLE_LIBTPU_LOAD``), so previews in several processes (a notebook kernel
    and a test, two kernels) do not refuse each other. Left alone where a TPU may be used:
    the lock keeps two programs off one chip."""
    import jax

    platforms = os.environ.get('JAX_PLATFORMS') or getattr(jax.config, 'jax_platforms', None) or ''
    if platforms and 'tpu' not in platforms.lower().split(','):
        os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')


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
    _share_libtpu()
    try:
        with _libtpu_quiet():
            desc = topologies.get_topology_desc(topology_name=text, platform='tpu', **kwargs)
    except Exception as exc:  # jax raises RuntimeError/ValueError/JaxRuntimeError by version
        message = str(exc)
        if 'TPU support not installed' in message or 'Unknown backend' in message:
            raise RuntimeError(_libtpu_missing()) from None
        if 'lockfile' in message:
            raise RuntimeError(
                f'libtpu could not describe topology {text!r}: another process on this '
                'machine holds libtpu (a TPU program, or a preview run without '
                'JAX_PLATFORMS=cpu); set JAX_PLATFORMS=cpu in both, or end that process'
            ) from None
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


def _parse_spec(text: str) -> tuple[Any, ...]:
    """``"P('data', 'model')"``, ``"data,model"``, ``"(data,fsdp),None"`` -> spec entries."""
    body = text.strip()
    if len(body) > 1 and body[0] == body[-1] and body[0] in '\'"':
        body = body[1:-1].strip()
    if body.startswith('P(') and body.endswith(')'):
        body = body[2:-1]
    entries: list[Any] = []
    depth, current = 0, ''
    for ch in body + ',':
        if ch == ',' and depth == 0:
            entries.append(current.strip())
            current = ''
            continue
        depth += (ch == '(') - (ch == ')')
        current += ch
    out: list[Any] = []
    for e in entries:
        if e.startswith('(') and e.endswith(')'):
            names = tuple(n.strip().strip('\'"') for n in e[1:-1].split(',') if n.strip())
            out.append(names)
        elif e in ('None', ''):
            out.append(None)
        else:
            out.append(e.strip('\'"'))
    while out and out[-1] is None and entries[-1] == '':
        out.pop()
    return tuple(out)


def preview_from_text(
    topology: str,
    shape: str,
    dtype: str = 'float32',
    mesh: str = '',
    spec: str = '',
    num_slices: int = 1,
) -> Layout:
    """`preview_layout` from the words of a command line (``%mh_layout --topology``):
    ``shape='1024,512'``, ``mesh='data=4,model=4'``, ``spec="P('data', 'model')"`` (or
    ``'data,model'``, ``'(data,fsdp),None'``). Without ``mesh``: one axis ``'x'`` over
    every device.

    Raises:
        ValueError: a word that does not parse (the message shows the expected form).
    """
    try:
        dims = tuple(int(n) for n in shape.replace('x', ',').split(',') if n.strip())
    except ValueError:
        raise ValueError(f'--shape {shape!r}: give the sizes, e.g. --shape 1024,512') from None
    axes: list[tuple[str, int]] = []
    for part in (p for p in mesh.split(',') if p.strip()):
        name, eq, size = part.partition('=')
        if not eq or not size.strip().isdigit():
            raise ValueError(f'--mesh {mesh!r}: give NAME=SIZE pairs, e.g. --mesh data=4,model=4')
        axes.append((name.strip(), int(size)))
    if not axes:
        axes = [('x', len(topology_devices(topology, num_slices)))]
    entries = _parse_spec(spec) if spec else ()
    names = {a for a, _ in axes}
    for e in entries:
        for n in e if isinstance(e, tuple) else (e,):
            if n is not None and n not in names:
                raise ValueError(
                    f'--spec {spec!r} names axis {n!r}, which the mesh '
                    f'({", ".join(f"{a}={s}" for a, s in axes)}) does not have'
                )
    return preview_layout(
        dims, dtype, topology=topology, mesh=axes, spec=entries, num_slices=num_slices
    )
