"""Where every shard of an array lives, as plain data: `ShardInfo`, `LayoutBlock`, `Layout`.

Frozen dataclasses of ints, strings and tuples, and the index helpers views use
(`format_index`, `format_ranges`, `format_bytes`, `normalize_index`). The engines build a
`Layout` (`multihost._checks._layout.describe_layout`); the notebook draws it; tests and views
build one by hand (`Layout(...)` or `Layout.from_placements(...)`) without any device. Indices are
concrete ``(start, stop)`` pairs per dimension, in global coordinates (a 0-d array: ``()``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from multihost._models._hardware import AxisLink, DeviceInfo, axis_links
from multihost._text import runs

#: A normalized index: one ``(start, stop)`` pair per dimension.
Index = tuple[tuple[int, int], ...]
#: What `Layout.from_placements` accepts per dimension: a pair or a slice.
IndexLike = Sequence[tuple[int, int] | slice]

MAX_TEXT_BLOCKS = 16
MAX_TEXT_DEVICES = 4  # devices named per block in the text summary


# -- formatting helpers ---------------------------------------------------------------


def format_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``: sizes in the model's text summaries."""
    if n < 1024:
        return f'{n} B'
    value = float(n)
    for unit in ('KiB', 'MiB', 'GiB', 'TiB', 'PiB'):
        value /= 1024.0
        if value < 1024 or unit == 'PiB':
            return f'{value:.3g} {unit}'
    raise AssertionError('unreachable')


def format_index(index: Index) -> str:
    """``((0, 2), (0, 6))`` -> ``'[0:2, 0:6]'`` (``'[]'`` for a 0-d array)."""
    return '[' + ', '.join(f'{a}:{b}' for a, b in index) + ']'


def format_ranges(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 6]`` -> ``'0-2,5,6'``: sorted distinct integers, runs of 3+ as ranges."""
    return ','.join(runs(values, min_run=3))


#: The forms of `device_name`, longest first.
DEVICE_NAME_FORMS = ('long', 'short', 'tiny')


def device_name(
    process_index: int, local_index: int | None, device_id: int | None, form: str = 'long'
) -> str:
    """How every view names a device: ``'process 1 · dev 0 (id 2048)'``.

    ``process`` is the process index, ``dev`` the device's index among its
    process's devices (``jax.local_devices(process_index=process)``), ``id``
    the `jax.Device.id`. A value in host memory (``device_id`` None) is
    ``'process 1 · host memory'``.

    Args:
        process_index: the process (host) holding the device.
        local_index: the device's index on its host; None if unknown (then
            the id alone names it).
        device_id: ``jax.Device.id``, or None for host memory.
        form: ``'long'`` (``'process 1 · dev 0 (id 2048)'``), ``'short'``
            (``'process 1 · dev 0'``) or ``'tiny'`` (``'p1·d0'``).
    """
    if form not in DEVICE_NAME_FORMS:
        raise ValueError(f'form must be one of {DEVICE_NAME_FORMS}, got {form!r}')
    if device_id is None:
        return (
            f'p{process_index}·mem' if form == 'tiny' else f'process {process_index} · host memory'
        )
    if local_index is None:
        return (
            f'p{process_index}·#{device_id}'
            if form == 'tiny'
            else (f'process {process_index} · id {device_id}')
        )
    if form == 'tiny':
        return f'p{process_index}·d{local_index}'
    short = f'process {process_index} · dev {local_index}'
    return short if form == 'short' else f'{short} (id {device_id})'


def _format_spec(spec: Any) -> str:
    """A `PartitionSpec` as ``P('host', None)``, independent of JAX's repr."""

    def entry(e: Any) -> str:
        if e is None:
            return 'None'
        if isinstance(e, (tuple, list)):
            return '(' + ', '.join(repr(a) for a in e) + ')'
        return repr(e)

    return 'P(' + ', '.join(entry(e) for e in tuple(spec)) + ')'


# -- the model ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard of an array: one device's copy of one block.

    Attributes:
        index: the block this shard holds, as ``(start, stop)`` per dimension
            in global coordinates (``()`` for a 0-d array).
        device_id: ``jax.Device.id`` of the device holding it; None for a value
            in host memory (a numpy array described by `describe_layout`).
        process_index: the process (host) that owns the device.
        replica_id: 0 for the first device holding this index, 1 for the next,
            and so on, in the sharding's device order (the same numbering as
            ``jax.Shard.replica_id``).
        nbytes: bytes of this shard (block size times item size).
    """

    index: Index
    device_id: int | None
    process_index: int
    replica_id: int
    nbytes: int

    def __post_init__(self) -> None:
        try:
            index = tuple((int(a), int(b)) for a, b in self.index)
        except (TypeError, ValueError):
            raise TypeError(
                'ShardInfo.index must be a sequence of (start, stop) pairs, one per '
                f'dimension; got {self.index!r}'
            ) from None
        for a, b in index:
            if not 0 <= a <= b:
                raise ValueError(f'ShardInfo.index has an invalid range {a}:{b} in {index}')
        object.__setattr__(self, 'index', index)
        if self.device_id is not None:
            object.__setattr__(self, 'device_id', int(self.device_id))
        for name in ('process_index', 'replica_id', 'nbytes'):
            object.__setattr__(self, name, int(getattr(self, name)))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shard's shape (``stop - start`` per dimension)."""
        return tuple(b - a for a, b in self.index)

    @property
    def is_primary(self) -> bool:
        """Whether this is replica 0 of its block (the copy to read, e.g. for a gather)."""
        return self.replica_id == 0

    def describe(self) -> str:
        """``'device 3 (process 1) [0:2, 0:6] replica 1, 48 B'``."""
        where = 'host memory' if self.device_id is None else f'device {self.device_id}'
        return (
            f'{where} (process {self.process_index}) {format_index(self.index)} '
            f'replica {self.replica_id}, {format_bytes(self.nbytes)}'
        )


@dataclasses.dataclass(frozen=True)
class LayoutBlock:
    """One distinct index of an array, with every shard (replica) that holds it.

    Attributes:
        index: ``(start, stop)`` per dimension, as in `ShardInfo.index`.
        shards: the replicas holding this block, in replica-id order.
    """

    index: Index
    shards: tuple[ShardInfo, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The block's shape."""
        return tuple(b - a for a, b in self.index)

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the block."""
        return self.shards[0].nbytes if self.shards else 0

    @property
    def replica_count(self) -> int:
        """How many devices hold this block."""
        return len(self.shards)

    @property
    def device_ids(self) -> tuple[int | None, ...]:
        """Devices holding the block, in replica-id order."""
        return tuple(s.device_id for s in self.shards)

    @property
    def process_indices(self) -> tuple[int, ...]:
        """Sorted distinct processes holding the block."""
        return tuple(sorted({s.process_index for s in self.shards}))


@dataclasses.dataclass(frozen=True)
class Layout:
    """How an array is laid out over devices and hosts: every shard, everywhere.

    Build one with `describe_layout` (from an array), `Layout.from_placements`
    (from hand-written placements, computing replica ids and sizes), or the
    constructor (from `ShardInfo` objects).

    Attributes:
        shape: the global shape.
        dtype: the dtype's name (``'float32'``, ``'bfloat16'``, ``'key<fry>'``).
        shards: *all* shards of the global array (on every host, not only the
            addressable ones), in the sharding's device order.
        itemsize: bytes per element; default: ``np.dtype(dtype).itemsize``
            (required for dtypes numpy does not know, such as PRNG keys).
        mesh_axes: ``(name, size)`` per mesh axis, for a `NamedSharding`;
            ``()`` otherwise.
        mesh_device_ids: the mesh's device ids in row-major mesh order (the
            mesh's shape is given by ``mesh_axes``); ``()`` without a mesh.
        spec: the partition spec as text (``"P('host', None)"``); ``''``
            without a `NamedSharding`.
        sharding: the sharding's kind: its class name (``'NamedSharding'``,
            ``'SingleDeviceSharding'``, ...), or ``'numpy'`` for a host value.
        num_processes: how many processes the job has; default: one more than
            the highest process index in ``shards``.
        platform: the devices' platform (``'cpu'``, ``'gpu'``, ``'tpu'``), or
            ``'host'`` for a numpy value; ``''`` if unknown.
        local_indices: ``(device_id, index on its host)`` per device, the
            index in ``jax.local_devices(process_index=...)`` (what views
            call ``dev``); default: each process's devices in this layout,
            numbered in id order.
        devices: what the hardware says of each device (`DeviceInfo`: kind,
            chip coordinates, core on chip, slice, process): the devices of
            the sharding, and on a platform with chip coordinates every
            device of the job or topology (the chip grid draws them all);
            ``()`` when unknown (a layout built by hand).
    """

    shape: tuple[int, ...]
    dtype: str
    shards: tuple[ShardInfo, ...]
    itemsize: int = None  # type: ignore[assignment]  # filled in by __post_init__
    mesh_axes: tuple[tuple[str, int], ...] = ()
    mesh_device_ids: tuple[int, ...] = ()
    spec: str = ''
    sharding: str = ''
    num_processes: int = None  # type: ignore[assignment]  # filled in by __post_init__
    platform: str = ''
    local_indices: tuple[tuple[int, int], ...] = ()
    devices: tuple[DeviceInfo, ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, 'shape', tuple(int(n) for n in self.shape))
        set_(self, 'dtype', str(self.dtype))
        shards = tuple(self.shards)
        for s in shards:
            if not isinstance(s, ShardInfo):
                raise TypeError(
                    f'Layout.shards must hold ShardInfo objects, got {type(s).__name__}: {s!r}'
                )
            if len(s.index) != len(self.shape):
                raise ValueError(
                    f'shard index {format_index(s.index)} has {len(s.index)} '
                    f'dimension(s) but the array shape {self.shape} has {len(self.shape)}'
                )
            for (_, b), n in zip(s.index, self.shape):
                if b > n:
                    raise ValueError(
                        f'shard index {format_index(s.index)} is out of '
                        f'bounds for shape {self.shape}'
                    )
        set_(self, 'shards', shards)
        if self.itemsize is None:
            try:
                itemsize = np.dtype(self.dtype).itemsize
            except TypeError:
                raise TypeError(
                    f'numpy does not know dtype {self.dtype!r}: pass '
                    'Layout(..., itemsize=<bytes per element>)'
                ) from None
            set_(self, 'itemsize', int(itemsize))
        else:
            set_(self, 'itemsize', int(self.itemsize))
        set_(self, 'mesh_axes', tuple((str(a), int(n)) for a, n in self.mesh_axes))
        set_(self, 'mesh_device_ids', tuple(int(d) for d in self.mesh_device_ids))
        if self.num_processes is None:
            set_(self, 'num_processes', max((s.process_index for s in shards), default=0) + 1)
        else:
            set_(self, 'num_processes', int(self.num_processes))
        if self.local_indices:
            local = tuple(sorted((int(d), int(i)) for d, i in self.local_indices))
        else:
            per_process: dict[int, set[int]] = {}
            for s in shards:
                if s.device_id is not None:
                    per_process.setdefault(s.process_index, set()).add(s.device_id)
            local = tuple(
                sorted((d, i) for ids in per_process.values() for i, d in enumerate(sorted(ids)))
            )
        set_(self, 'local_indices', local)
        for d in self.devices:
            if not isinstance(d, DeviceInfo):
                raise TypeError(
                    f'Layout.devices must hold DeviceInfo objects, got {type(d).__name__}: {d!r}'
                )
        set_(self, 'devices', tuple(sorted(self.devices, key=lambda d: d.id)))

    @classmethod
    def from_placements(
        cls,
        shape: Sequence[int],
        dtype: Any,
        placements: Iterable[tuple[IndexLike, int | None, int]],
        **kwargs: Any,
    ) -> Layout:
        """A layout from ``(index, device_id, process_index)`` placements.

        Replica ids are numbered per distinct index in the order given (as JAX
        numbers them in device order) and shard sizes follow from the index
        and the item size. Handy for synthetic layouts::

            Layout.from_placements((4, 2), 'float32', [
                ([(0, 2), (0, 2)], 0, 0), ([(0, 2), (0, 2)], 1, 0),
                ([(2, 4), (0, 2)], 2, 1), ([(2, 4), (0, 2)], 3, 1)])

        Args:
            shape: the global shape.
            dtype: a dtype or its name.
            placements: per shard, its index (``(start, stop)`` pairs or slices
                per dimension, as ``Sharding.devices_indices_map`` returns),
                device id and process index.
            **kwargs: the other `Layout` fields (``itemsize``, ``mesh_axes``,
                ``spec``, ``num_processes``...).
        """
        shape = tuple(int(n) for n in shape)
        itemsize = kwargs.get('itemsize')
        if itemsize is None:
            try:
                itemsize = np.dtype(dtype).itemsize
            except TypeError:
                itemsize = getattr(dtype, 'itemsize', None)
            if itemsize is None:
                raise TypeError(f'numpy does not know dtype {dtype!r}: pass itemsize=')
            kwargs['itemsize'] = itemsize
        counts: collections.Counter[Index] = collections.Counter()
        shards = []
        for index, device_id, process_index in placements:
            idx = normalize_index(index, shape)
            shards.append(
                ShardInfo(
                    index=idx,
                    device_id=device_id,
                    process_index=process_index,
                    replica_id=counts[idx],
                    nbytes=math.prod(b - a for a, b in idx) * int(itemsize),
                )
            )
            counts[idx] += 1
        return cls(shape=shape, dtype=str(dtype), shards=tuple(shards), **kwargs)

    # -- sizes --

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements of the global array."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the global array."""
        return self.size * self.itemsize

    @property
    def stored_nbytes(self) -> int:
        """Bytes held by all devices together (replicas counted every time)."""
        return sum(s.nbytes for s in self.shards)

    @property
    def mesh_shape(self) -> dict[str, int]:
        """Mesh axis name -> size (empty without a mesh)."""
        return dict(self.mesh_axes)

    @property
    def processes(self) -> tuple[int, ...]:
        """Sorted distinct processes that hold at least one shard."""
        return tuple(sorted({s.process_index for s in self.shards}))

    @property
    def device_ids(self) -> tuple[int | None, ...]:
        """Devices holding a shard, in shard order."""
        return tuple(s.device_id for s in self.shards)

    def bytes_per_process(self) -> dict[int, int]:
        """Process index -> bytes its devices hold (replicas included).

        Every process of the job appears, with 0 when it holds nothing.
        """
        out = dict.fromkeys(range(self.num_processes), 0)
        for s in self.shards:
            out[s.process_index] = out.get(s.process_index, 0) + s.nbytes
        return out

    def bytes_per_device(self) -> dict[int | None, int]:
        """Device id -> bytes it holds."""
        out: dict[int | None, int] = {}
        for s in self.shards:
            out[s.device_id] = out.get(s.device_id, 0) + s.nbytes
        return out

    def shards_on(self, process_index: int) -> tuple[ShardInfo, ...]:
        """The shards held by one process, in shard order."""
        return tuple(s for s in self.shards if s.process_index == process_index)

    # -- devices and the mesh --

    @functools.cached_property
    def _local(self) -> dict[int, int]:
        return dict(self.local_indices)

    @functools.cached_property
    def _process_of(self) -> dict[int | None, int]:
        return {s.device_id: s.process_index for s in reversed(self.shards)}

    def local_index(self, device_id: int | None) -> int | None:
        """The device's index on its host (``dev`` in its name); None if unknown."""
        return self._local.get(device_id) if device_id is not None else None

    def device_process(self, device_id: int | None) -> int | None:
        """The process holding a device of this layout; None if no shard is on it."""
        return self._process_of.get(device_id)

    def device_name(self, device_id: int | None, form: str = 'long') -> str:
        """``'process 1 · dev 0 (id 2048)'`` (see `device_name`; forms long, short, tiny)."""
        process = self.device_process(device_id)
        return device_name(
            -1 if process is None else process, self.local_index(device_id), device_id, form
        )

    def devices_by_process(self) -> dict[int, tuple[int | None, ...]]:
        """Process -> its devices holding a shard, by index on the host (then id)."""
        out: dict[int, set[int | None]] = {}
        for s in self.shards:
            out.setdefault(s.process_index, set()).add(s.device_id)
        local = self._local

        def key(d: int | None) -> tuple[int, int]:
            return (-1, -1) if d is None else (local.get(d, 1 << 30), d)

        return {p: tuple(sorted(out[p], key=key)) for p in sorted(out)}

    @functools.cached_property
    def _infos(self) -> dict[int, DeviceInfo]:
        return {d.id: d for d in self.devices}

    def device_info(self, device_id: int | None) -> DeviceInfo | None:
        """What the hardware says of a device (kind, coords, core, slice); None if unknown."""
        return None if device_id is None else self._infos.get(device_id)

    @property
    def device_kind(self) -> str:
        """The devices' kind (``'TPU v5 lite'``; several joined by ``' + '``); ``''``."""
        return ' + '.join(sorted({d.kind for d in self.devices if d.kind}))

    @property
    def has_chips(self) -> bool:
        """Whether the devices have chip coordinates (TPU): the chip grid can be drawn."""
        return bool(self.devices) and all(d.coords for d in self.devices)

    def axis_links(self) -> tuple[AxisLink, ...]:
        """Per mesh axis, how it is wired (`AxisLink`: ICI ring or not, hosts, DCN slices);
        ``()`` without the mesh's devices. Without `devices` (a layout built by hand) the
        processes along each axis are all it knows."""
        mesh = [
            self._infos.get(d)
            or (
                DeviceInfo(id=d, process_index=self._process_of[d])
                if d in self._process_of
                else None
            )
            for d in self.mesh_device_ids
        ]
        return axis_links(self.mesh_axes, mesh, self.devices)

    def hardware_text(self) -> str:
        """``'TPU v5 lite: 16 chips (4x4) on 4 hosts'``, with slices and cores per chip where
        there are several; ``''`` without chip coordinates."""
        if not self.has_chips:
            return ''
        chips = {d.chip for d in self.devices}
        slices = sorted({d.chip[0] for d in self.devices})
        extent = np.max(np.array([d.coords for d in self.devices]), axis=0) + 1
        dims = [int(n) for n in extent]
        while len(dims) > 2 and dims[-1] == 1:  # a 2-D torus (v5e) has z = 0 everywhere
            dims.pop()
        shape = 'x'.join(map(str, dims))
        text = f'{self.device_kind}: {_n(len(chips), "chip")} ({shape}'
        text += f' per slice, {len(slices)} slices)' if len(slices) > 1 else ')'
        cores = len(self.devices) // max(len(chips), 1)
        if cores > 1:
            text += f', {cores} cores each'
        hosts = len({d.process_index for d in self.devices})
        return text + f' on {hosts} process{"es" if hosts != 1 else ""}'

    def chip_grid(self) -> Any:
        """The chips at their torus coordinates, coloured by host, with the blocks they hold
        (`multihost._models._chipgrid.ChipGrid`; ``str()`` is its text form); None without
        chip coordinates (CPU devices)."""
        from multihost._models._chipgrid import chip_grid

        return chip_grid(self)

    def device_where(self, device_id: int | None) -> str:
        """The device's name and, where known, its chip: ``'process 0 · dev 0 (id 0), TPU v5
        lite chip (0,0,0)'``."""
        info = self.device_info(device_id)
        name = self.device_name(device_id)
        return f'{name}, {info.where()}' if info is not None and info.coords else name

    def mesh_processes(self) -> tuple[int | None, ...]:
        """The process of every mesh position, row-major (None where unknown); ``()``
        without the mesh's devices."""
        return tuple(self._process_of.get(d) for d in self.mesh_device_ids)

    def mesh_axis_hosts(self) -> tuple[tuple[str, int], ...]:
        """``(axis, hosts)`` per mesh axis: the most distinct processes met along one
        line of that axis (1: the axis stays within a host; more: it crosses hosts).

        ``()`` without the mesh's devices (e.g. an abstract mesh).
        """
        sizes = tuple(n for _, n in self.mesh_axes)
        procs = self.mesh_processes()
        if not sizes or len(procs) != math.prod(sizes):
            return ()
        grid = np.array([-1 if p is None else p for p in procs], dtype=np.int64).reshape(sizes)
        out = []
        for axis, (name, _) in enumerate(self.mesh_axes):
            lines = np.moveaxis(grid, axis, -1).reshape(-1, sizes[axis])
            out.append((name, max((len(set(line.tolist())) for line in lines), default=0)))
        return tuple(out)

    @property
    def crossing_axes(self) -> tuple[str, ...]:
        """The mesh axes along which the process changes (collectives over them cross hosts)."""
        return tuple(a for a, n in self.mesh_axis_hosts() if n > 1)

    def mesh_text(self) -> str:
        """``'mesh host=4 crosses hosts (4 along it), dev=2 within a host'``; on chips with
        coordinates the wiring: ``'mesh data=4 ICI ring of 4 along y, 4 hosts; ...'``
        ('' without a mesh)."""
        if not self.mesh_axes:
            return ''
        links = {a.name: a for a in self.axis_links()}
        parts = []
        for a, n in self.mesh_axes:
            link = links.get(a)
            if link is None:
                parts.append(f'{a}={n}')
            elif link.chips or link.slices:
                parts.append(f'{a}={n} {link.verdict}')
            elif link.hosts > 1:
                parts.append(f'{a}={n} crosses processes ({link.hosts} along it)')
            else:
                parts.append(f'{a}={n} within a process')
        return 'mesh ' + ('; ' if self.has_chips else ', ').join(parts)

    # -- blocks and replicas --

    def blocks(self) -> tuple[LayoutBlock, ...]:
        """Distinct indices, in row-major order of their start, each with its replicas."""
        groups: dict[Index, list[ShardInfo]] = {}
        for s in self.shards:
            groups.setdefault(s.index, []).append(s)
        return tuple(
            LayoutBlock(index=idx, shards=tuple(sorted(g, key=lambda s: s.replica_id)))
            for idx, g in sorted(groups.items())
        )

    def replica_counts(self) -> dict[Index, int]:
        """Distinct index -> how many devices hold it."""
        return dict(collections.Counter(s.index for s in self.shards))

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every shard holds the whole array."""
        whole = tuple((0, n) for n in self.shape)
        return bool(self.shards) and all(s.index == whole for s in self.shards)

    def covers_exactly(self) -> bool:
        """Whether the distinct blocks tile the array: no element missing, none in two blocks."""
        indices = sorted({s.index for s in self.shards})
        if not indices:
            return self.size == 0
        # Cut every dimension at every block edge; count how many blocks cover each cell.
        cuts = [
            sorted({0, n, *(idx[d][0] for idx in indices), *(idx[d][1] for idx in indices)})
            for d, n in enumerate(self.shape)
        ]
        cover = np.zeros(tuple(len(c) - 1 for c in cuts), dtype=np.int64)
        for idx in indices:
            cell = tuple(
                slice(int(np.searchsorted(c, a)), int(np.searchsorted(c, b)))
                for c, (a, b) in zip(cuts, idx)
            )
            cover[cell] += 1
        return bool((cover == 1).all())

    # -- text --

    def headline(self) -> str:
        """One line: ``float32[8, 6] (192 B), NamedSharding P('x') on mesh (x=8)``."""
        shape = ', '.join(map(str, self.shape))
        text = f'{self.dtype}[{shape}] ({format_bytes(self.nbytes)})'
        if self.sharding:
            text += f', {self.sharding}'
        if self.spec:
            text += f' {self.spec}'
        if self.mesh_axes:
            text += ' on mesh (' + ', '.join(f'{a}={n}' for a, n in self.mesh_axes) + ')'
        return text

    def __str__(self) -> str:
        blocks = self.blocks()
        counts = sorted({b.replica_count for b in blocks})
        if not counts:
            replicas = '0'
        elif len(counts) == 1:
            replicas = str(counts[0])
        else:
            replicas = f'{counts[0]}..{counts[-1]}'
        lines = [
            self.headline(),
            f'  {len(self.shards)} shard(s) on {len(set(self.device_ids))} device(s) of '
            f'{len(self.processes)}/{self.num_processes} process(es); {len(blocks)} '
            f'distinct block(s), {replicas} replica(s) each',
        ]
        if self.has_chips:
            lines.append(f'  {self.hardware_text()}')
        if self.mesh_axes:
            lines.append(f'  {self.mesh_text()}')
        name = self.device_where if self.has_chips else self.device_name
        for b in blocks[:MAX_TEXT_BLOCKS]:
            devices = ('; ' if self.has_chips else ', ').join(
                name(d) for d in b.device_ids[:MAX_TEXT_DEVICES]
            )
            if b.replica_count > MAX_TEXT_DEVICES:
                devices += f', ... ({b.replica_count} in all)'
            lines.append(
                f'  {format_index(b.index)} {format_bytes(b.nbytes)} x{b.replica_count}: {devices}'
            )
        if len(blocks) > MAX_TEXT_BLOCKS:
            lines.append(f'  ... {len(blocks) - MAX_TEXT_BLOCKS} more block(s)')
        lines.append(
            '  bytes per process: '
            + ', '.join(f'{p}: {format_bytes(n)}' for p, n in self.bytes_per_process().items())
        )
        if self.has_chips:
            lines.append(f'  bytes per chip: {self.bytes_per_chip_text()}')
        return '\n'.join(lines)

    def bytes_per_chip(self) -> dict[tuple[int, tuple[int, ...]], int]:
        """``(slice, coords)`` -> bytes its cores hold, every chip of `devices` (0 for
        those holding none); ``{}`` without chip coordinates."""
        if not self.has_chips:
            return {}
        per_device = self.bytes_per_device()
        out: dict[tuple[int, tuple[int, ...]], int] = {}
        for d in self.devices:
            out[d.chip] = out.get(d.chip, 0) + per_device.get(d.id, 0)
        return out

    def bytes_per_chip_text(self) -> str:
        """``'4 MiB each (16 chips)'`` or ``'0 B to 8 MiB (largest on chip (0,0,0))'``."""
        per = self.bytes_per_chip()
        if not per:
            return ''
        sizes = set(per.values())
        if len(sizes) == 1:
            return f'{format_bytes(sizes.pop())} each ({_n(len(per), "chip")})'
        (s, coords), top = max(per.items(), key=lambda kv: kv[1])
        where = ','.join(map(str, coords)) + (f' slice {s}' if len(self.chips_slices) > 1 else '')
        return (
            f'{format_bytes(min(per.values()))} to {format_bytes(top)} '
            f'(largest on chip ({where}); {len(per)} chips)'
        )

    @property
    def chips_slices(self) -> tuple[int, ...]:
        """The slices of `devices` (``(0,)`` without slices)."""
        return tuple(sorted({d.chip[0] for d in self.devices}))


def _n(count: int, noun: str) -> str:
    """``'1 chip'``, ``'16 chips'``."""
    return f'{count} {noun}' + ('' if count == 1 else 's')


def normalize_index(index: IndexLike, shape: Sequence[int]) -> Index:
    """Slices or pairs per dimension -> concrete ``(start, stop)`` pairs.

    Raises:
        ValueError: wrong number of dimensions, or a slice with a step.
    """
    index = tuple(index)
    if len(index) != len(shape):
        raise ValueError(
            f'index {index!r} has {len(index)} entries for an array of shape {tuple(shape)}'
        )
    out = []
    for entry, n in zip(index, shape):
        if isinstance(entry, slice):
            start, stop, step = entry.indices(int(n))
            if step != 1:
                raise ValueError(f'strided shard index {entry} is not supported')
            out.append((start, max(start, stop)))
        else:
            a, b = entry
            out.append((int(a), int(b)))
    return tuple(out)
