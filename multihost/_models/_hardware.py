"""The hardware under a layout, as plain data: `DeviceInfo` (kind, chip coordinates, core on
chip, slice, process of one device) and `AxisLink`, the verdict on how one mesh axis is wired
(``'ICI ring of 4 along y'``, ``'ICI, not a ring'``, ``'within one host'``,
``'DCN across 2 slices'``).

Pure (numpy only): `multihost._checks._layout.describe_layout` reads the devices' attributes
where the platform has them (TPU: ``coords``, ``core_on_chip``, ``slice_index``; CPU devices
have none and their verdicts speak of hosts only).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Names of the chip-coordinate dimensions, in ``coords`` order.
COORD_NAMES = ('x', 'y', 'z')


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device as the hardware knows it.

    Attributes:
        id: ``jax.Device.id``.
        process_index: the process (host) driving it.
        kind: ``device_kind`` (``'TPU v5 lite'``, ``'cpu'``); ``''`` unknown.
        coords: the chip's position in the slice's torus (``(x, y, z)``);
            ``()`` where the platform has none (CPU).
        core_on_chip: the core's index on its chip (TPU v4 has two).
        slice_index: the slice (multi-slice jobs, joined by DCN); None where
            the platform has none.
    """

    id: int
    process_index: int
    kind: str = ''
    coords: tuple[int, ...] = ()
    core_on_chip: int = 0
    slice_index: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, 'id', int(self.id))
        set_(self, 'process_index', int(self.process_index))
        set_(self, 'kind', str(self.kind))
        set_(self, 'coords', tuple(int(c) for c in self.coords))
        set_(self, 'core_on_chip', int(self.core_on_chip))
        if self.slice_index is not None:
            set_(self, 'slice_index', int(self.slice_index))

    @property
    def chip(self) -> tuple[int, tuple[int, ...]]:
        """``(slice, coords)``: which chip (the cores of one chip share it)."""
        return (self.slice_index or 0, self.coords)

    def where(self) -> str:
        """``'TPU v5 lite chip (1,0,0)'``, ``'… core 1'``, ``'… slice 1'``; ``''`` for a device
        without coordinates."""
        if not self.coords:
            return ''
        text = f'{self.kind} chip ({",".join(map(str, self.coords))})'.strip()
        if self.core_on_chip:
            text += f' core {self.core_on_chip}'
        if self.slice_index is not None:
            text += f' slice {self.slice_index}'
        return text


#: Device object -> its `DeviceInfo`, so that the layouts of many arrays share one object per
#: device (a pytree's layouts pickle each device once); bounded (topology devices are new
#: objects per call).
_INFO_CACHE: dict[Any, DeviceInfo] = {}
_INFO_CACHE_MAX = 1 << 16


def _info_of(d: Any) -> DeviceInfo:
    coords = getattr(d, 'coords', None)
    slice_index = getattr(d, 'slice_index', None)
    return DeviceInfo(
        id=int(getattr(d, 'id')),  # noqa: B009  (any object with a device's fields)
        process_index=int(getattr(d, 'process_index', 0)),
        kind=str(getattr(d, 'device_kind', '') or ''),
        coords=tuple(coords) if coords is not None else (),
        core_on_chip=int(getattr(d, 'core_on_chip', 0) or 0),
        slice_index=None if slice_index is None else int(slice_index),
    )


def device_infos_from(devices: Sequence[Any]) -> tuple[DeviceInfo, ...]:
    """`DeviceInfo` of jax devices (or anything with their attributes), reading only what
    the platform has (``getattr`` with defaults: a CPU device has no ``coords``)."""
    out = []
    for d in devices:
        try:
            info = _INFO_CACHE.get(d)
        except TypeError:  # not hashable: no sharing
            out.append(_info_of(d))
            continue
        if info is None:
            if len(_INFO_CACHE) >= _INFO_CACHE_MAX:
                _INFO_CACHE.clear()
            info = _INFO_CACHE[d] = _info_of(d)
        out.append(info)
    return tuple(out)


# -- wraparound: which torus dimensions close into rings --------------------------------


def wraps(kind: str, extent: Sequence[int], dim: int) -> bool:
    """Whether dimension ``dim`` of a slice of ``extent`` chips has wraparound ICI links.

    As we read Google's Cloud TPU pages: TPU v4 and v5p slices of whole 4x4x4 cubes
    (every dimension a multiple of 4) are 3-D tori, smaller slices have no wraparound; v5e
    and v6e wrap only a full 16-chip pod dimension. Conservative on purpose: an unknown kind
    or shape gets no wraparound, so a verdict never claims a ring it cannot see.
    """
    n = int(extent[dim])
    k = kind.lower()
    if n < 3:
        return False
    if k in ('tpu v4', 'tpu v5', 'tpu v5p'):
        return len(extent) == 3 and all(int(m) % 4 == 0 for m in extent)
    if k.startswith('tpu v5 lite') or k.startswith('tpu v5e') or k.startswith('tpu v6'):
        return n == 16
    return False


def slice_extent(devices: Sequence[DeviceInfo], slice_index: int | None) -> tuple[int, ...]:
    """The chips' extent per coordinate in one slice (max coordinate + 1)."""
    coords = [d.coords for d in devices if d.slice_index == slice_index and d.coords]
    if not coords:
        return ()
    return tuple(int(v) + 1 for v in np.max(np.array(coords), axis=0))


def _hop(a: DeviceInfo, b: DeviceInfo, extent: tuple[int, ...]) -> int | None:
    """The coordinate dimension one ICI link from ``a`` to ``b`` runs along; -1 for two
    cores of one chip; None when they are not neighbours."""
    if a.chip == b.chip:
        return -1
    if a.slice_index != b.slice_index or len(a.coords) != len(b.coords):
        return None
    diff = [d for d, (u, v) in enumerate(zip(a.coords, b.coords)) if u != v]
    if len(diff) != 1:
        return None
    d = diff[0]
    step = abs(a.coords[d] - b.coords[d])
    if step == 1 or (d < len(extent) and step == extent[d] - 1 and wraps(a.kind, extent, d)):
        return d
    return None


@dataclasses.dataclass(frozen=True)
class AxisLink:
    """How one mesh axis is wired: what a collective over it rides.

    Attributes:
        name: the axis name.
        size: its size.
        hosts: the most distinct processes along one line of the axis.
        slices: the most distinct slices along one line (0: no slices known).
        chips: the most distinct chips along one line (0: no coordinates known).
        ring: whether every line is a closed loop of ICI neighbours.
        path: whether every line is a chain of ICI neighbours (a ring or a line).
        dims: the coordinate dimensions the lines run along (``'y'``, ``'x,y'``).
    """

    name: str
    size: int
    hosts: int
    slices: int = 0
    chips: int = 0
    ring: bool = False
    path: bool = False
    dims: str = ''

    @property
    def known(self) -> bool:
        return self.hosts > 0

    @property
    def verdict(self) -> str:
        """``'ICI ring of 4 along y'``, ``'ICI, not a ring'``, ``'within one host'``,
        ``'DCN across 2 slices'``; without chip coordinates (CPU) the hosts along it:
        ``'crosses hosts (4 along it)'``."""
        if not self.known:
            return 'unknown (no mesh devices)'
        if self.slices > 1:
            text = f'DCN across {self.slices} slices'
            if self.size > self.slices:
                text += ', ICI within each'
            return text
        if self.hosts <= 1 and (self.chips <= 1 or not self.path):
            return 'within one host' if self.chips != 1 or self.size == 1 else 'within one chip'
        if not self.chips:  # no coordinates: hosts are all we know
            return (
                f'crosses processes ({self.hosts} along it)'
                if self.hosts > 1
                else 'within a process'
            )
        hosts = f', {self.hosts} hosts' if self.hosts > 1 else ', within one host'
        along = f' along {self.dims}' if self.dims else ''
        if self.ring:
            return f'ICI ring of {self.chips}{along}{hosts}'
        if self.path:
            return f'ICI line of {self.chips}{along}, not a ring{hosts}'
        return f'ICI, not a ring{hosts}'

    @property
    def crosses_hosts(self) -> bool:
        return self.hosts > 1


def _line_link(
    line: list[DeviceInfo], extents: dict[int | None, tuple[int, ...]]
) -> tuple[Any, ...]:
    """(hosts, slices, chips, ring, path, dims) of one line of a mesh axis."""
    hosts = len({d.process_index for d in line})
    slices = len({d.slice_index for d in line}) if line[0].slice_index is not None else 0
    if not all(d.coords for d in line):
        return hosts, slices, 0, False, False, frozenset()
    chips: list[DeviceInfo] = []
    for d in line:  # consecutive cores of one chip count once
        if not chips or chips[-1].chip != d.chip:
            chips.append(d)
    nchips = len({d.chip for d in line})
    if len(chips) != nchips or nchips == 1:
        return hosts, slices, nchips, False, nchips == 1, frozenset()
    extent = extents.get(chips[0].slice_index, ())
    hops = [_hop(a, b, extent) for a, b in zip(chips, chips[1:])]
    path = all(h is not None for h in hops)
    close = _hop(chips[-1], chips[0], extent) if nchips > 2 else None
    ring = path and close is not None
    dims = frozenset(h for h in [*hops, close] if h is not None and h >= 0)
    return hosts, slices, nchips, ring, path, dims


def axis_links(
    mesh_axes: Sequence[tuple[str, int]],
    mesh_devices: Sequence[DeviceInfo | None],
    all_devices: Sequence[DeviceInfo] = (),
) -> tuple[AxisLink, ...]:
    """Per mesh axis, how its lines are wired (worst line decides). ``()`` without the mesh's
    devices. ``all_devices`` (default: the mesh's) give each slice's extent, which decides
    whether its dimensions wrap around."""
    sizes = tuple(n for _, n in mesh_axes)
    if not sizes or len(mesh_devices) != math.prod(sizes) or any(d is None for d in mesh_devices):
        return ()
    devs: list[DeviceInfo] = [d for d in mesh_devices if d is not None]
    pod = list(all_devices) or devs
    extents = {s: slice_extent(pod, s) for s in {d.slice_index for d in devs}}
    grid = np.arange(len(devs)).reshape(sizes)
    out = []
    for axis, (name, size) in enumerate(mesh_axes):
        lines = np.moveaxis(grid, axis, -1).reshape(-1, size)
        results = [_line_link([devs[i] for i in line], extents) for line in lines.tolist()]
        dims = frozenset().union(*(r[5] for r in results))
        out.append(
            AxisLink(
                name=name,
                size=size,
                hosts=max(r[0] for r in results),
                slices=max(r[1] for r in results),
                chips=max(r[2] for r in results),
                ring=all(r[3] for r in results),
                path=all(r[4] for r in results),
                dims=','.join(COORD_NAMES[d] if d < 3 else str(d) for d in sorted(dims)),
            )
        )
    return tuple(out)
