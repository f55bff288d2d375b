"""The pod as it is built, as plain data: `chip_grid` places a layout's chips at their torus
coordinates, one plane per slice and z layer (`ChipPlane`), each chip with its host and the
block(s) its cores hold (`Chip`); `ChipGrid.text` is its text form.

Blocks are named by their place in the block grid: ``'2,1'`` is the third block along the
first sharded dimension and the second along the next (dimensions cut in one block are left
out; ``'*'`` is the whole array). Chips that hold the same label hold copies of one block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from multihost._models._colltable import CollectiveOp, CollectiveTable
from multihost._models._hardware import COORD_NAMES, DeviceInfo
from multihost._text import fmt_hosts

#: ``(start, stop)`` per dimension (as `multihost._models._layout.Index`).
Index = tuple[tuple[int, int], ...]
#: A `multihost.Layout` (typed loosely: `_layout` imports this module, not the reverse).
Layout = Any

#: Planes `ChipGrid.text` draws; the rest are counted.
MAX_TEXT_PLANES = 8


@dataclasses.dataclass(frozen=True)
class Chip:
    """One chip: where it is, which host drives it, what its cores hold.

    Attributes:
        slice_index: its slice (0 without slices).
        coords: its torus coordinates.
        process: the process driving it.
        device_ids: its cores' device ids, by core.
        labels: the block label of each core holding part of the array (``''`` for a
            core that holds none), by core.
        nbytes: bytes of the array its cores hold.
    """

    slice_index: int
    coords: tuple[int, ...]
    process: int
    device_ids: tuple[int, ...]
    labels: tuple[str, ...]
    nbytes: int

    @property
    def label(self) -> str:
        """The block(s) it holds: ``'2,1'``, ``'0,1|0,1'`` for two cores, ``''`` for none."""
        held = [x for x in self.labels if x]
        if not held:
            return ''
        return held[0] if len(set(held)) == 1 and len(held) == 1 else '|'.join(self.labels)


@dataclasses.dataclass(frozen=True)
class ChipPlane:
    """One 2-D grid of chips: a slice's chips at one z (a 2-D torus has one).

    Attributes:
        slice_index: the slice.
        z: the layer (``None`` for a 2-D torus).
        width / height: chips along x (columns) and y (rows).
        chips: row-major (y, then x), None where no chip is known.
    """

    slice_index: int
    z: int | None
    width: int
    height: int
    chips: tuple[Chip | None, ...]

    def at(self, x: int, y: int) -> Chip | None:
        return self.chips[y * self.width + x]

    def title(self, slices: int) -> str:
        parts = [f'slice {self.slice_index}'] if slices > 1 else []
        if self.z is not None:
            parts.append(f'z={self.z}')
        return ', '.join(parts)


@dataclasses.dataclass(frozen=True)
class ChipGrid:
    """A layout's chips, plane by plane (`chip_grid`).

    Attributes:
        kind: the device kind (``'TPU v5 lite'``).
        planes: slice-major, then z.
        hosts: how many hosts the chips belong to.
        block_dims: the array dimensions the labels count blocks along.
        cores: cores per chip.
    """

    kind: str
    planes: tuple[ChipPlane, ...]
    hosts: int
    block_dims: tuple[int, ...]
    cores: int = 1
    #: What a cell says, when not a layout's blocks (`collective_grid`'s groups).
    legend_text: str = ''
    #: Processes whose chips are marked (a collective's hosts that never launched it).
    marked: tuple[int, ...] = ()
    #: A line above the grid (the collective a picture is of).
    caption: str = ''

    @property
    def slices(self) -> int:
        return len({p.slice_index for p in self.planes})

    @property
    def chips(self) -> tuple[Chip, ...]:
        return tuple(c for p in self.planes for c in p.chips if c is not None)

    def legend(self) -> str:
        """What a cell says: ``'cell: pN = process N, then block number along dims 0,
        1; . = holds none'``."""
        if self.legend_text:
            return self.legend_text
        if not self.block_dims:
            what = '* = the whole array'
        else:
            dims = ', '.join(map(str, self.block_dims))
            what = f'block number along dim{"s" if len(self.block_dims) > 1 else ""} {dims}'
        cores = ', one per core (a|b)' if self.cores > 1 else ''
        return f'cell: pN = process N, then {what}{cores}; . = holds none'

    def text(self) -> str:
        """The grids as text: one per plane, x across, y down, each cell ``p3 2,1``."""
        total = len(self.chips)
        lines = [
            f'chips: {self.kind or "devices"}, {total} chip{"s" * (total != 1)} on '
            f'{self.hosts} process{"es" * (self.hosts != 1)}'
            + (f' in {self.slices} slices' if self.slices > 1 else ''),
            f'  {self.legend()}',
        ]
        if self.caption:
            lines.insert(0, self.caption)
        for plane in self.planes[:MAX_TEXT_PLANES]:
            cells = [
                [_cell_text(plane.at(x, y)) for x in range(plane.width)]
                for y in range(plane.height)
            ]
            width = max([len(c) for row in cells for c in row] + [4])
            title = plane.title(self.slices)
            lines.append(f'  {title}:' if title else '  grid:')
            head = ' ' * 6 + ' '.join(f'x={x}'.ljust(width) for x in range(plane.width))
            lines.append(head.rstrip())
            for y, row in enumerate(cells):
                lines.append((f'  y={y}'.ljust(6) + ' '.join(c.ljust(width) for c in row)).rstrip())
        if len(self.planes) > MAX_TEXT_PLANES:
            lines.append(f'  ... {len(self.planes) - MAX_TEXT_PLANES} more planes')
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.text()


def _cell_text(chip: Chip | None) -> str:
    if chip is None:
        return ''
    return f'p{chip.process} {chip.label or "."}'


def block_labels(layout: Layout) -> tuple[dict[Index, str], tuple[int, ...]]:
    """Block index -> its label (its place along every dimension cut in several blocks),
    and those dimensions."""
    blocks = layout.blocks()
    starts = [sorted({b.index[d][0] for b in blocks}) for d in range(layout.ndim)]
    dims = tuple(d for d in range(layout.ndim) if len(starts[d]) > 1)
    labels = {}
    for b in blocks:
        labels[b.index] = ','.join(str(starts[d].index(b.index[d][0])) for d in dims) or '*'
    return labels, dims


def chip_grid(layout: Layout) -> ChipGrid | None:
    """The layout's chips at their coordinates; None without chip coordinates (CPU devices:
    the block picture is the view there)."""
    if not layout.has_chips:
        return None
    labels, dims = block_labels(layout)
    held: dict[int, str] = {}
    size: dict[int, int] = {}
    for s in layout.shards:
        if s.device_id is not None:
            held[s.device_id] = labels[s.index]
            size[s.device_id] = size.get(s.device_id, 0) + s.nbytes
    return grid_of(layout.devices, held, size, kind=layout.device_kind, block_dims=dims)


def grid_of(
    devices: Sequence[DeviceInfo],
    held: Mapping[int, str],
    size: Mapping[int, int],
    *,
    kind: str,
    block_dims: tuple[int, ...] = (),
    **more: Any,
) -> ChipGrid | None:
    """``devices`` (with chip coordinates) at their coordinates, each core labelled
    ``held[id]`` ('' for none) and holding ``size[id]`` bytes; ``more``: `ChipGrid`'s
    optional fields. None without devices."""
    by_chip: dict[tuple[int, tuple[int, ...]], list] = {}
    for d in devices:
        by_chip.setdefault(d.chip, []).append(d)
    if not by_chip:
        return None
    chips = {}
    for key, devs in by_chip.items():
        devs.sort(key=lambda d: d.core_on_chip)
        chips[key] = Chip(
            slice_index=key[0],
            coords=key[1],
            process=devs[0].process_index,
            device_ids=tuple(d.id for d in devs),
            labels=tuple(held.get(d.id, '') for d in devs),
            nbytes=sum(size.get(d.id, 0) for d in devs),
        )
    planes = []
    for sl in sorted({k[0] for k in chips}):
        coords = [k[1] for k in chips if k[0] == sl]
        width = max(c[0] for c in coords) + 1
        height = max((c[1] for c in coords if len(c) > 1), default=0) + 1
        zs = sorted({c[2] for c in coords if len(c) > 2}) or [0]
        for z in zs:
            cells = tuple(
                chips.get((sl, _coords(x, y, z, len(coords[0]))))
                for y in range(height)
                for x in range(width)
            )
            planes.append(ChipPlane(sl, z if len(zs) > 1 else None, width, height, cells))
    return ChipGrid(
        kind=kind,
        planes=tuple(planes),
        hosts=len({c.process for c in chips.values()}),
        block_dims=block_dims,
        cores=max(len(v) for v in by_chip.values()),
        **more,
    )


def collective_grid(
    table: CollectiveTable, op: CollectiveOp, waiting_for: Sequence[int] = ()
) -> ChipGrid | None:
    """The pod under collective ``op`` of ``table``: each chip labelled with the group of
    ``op`` its cores are in (``g0``, ``g1``, ...; '' for none), the chips of
    ``waiting_for`` (the processes that never launched it) marked. None where the table
    has no chip coordinates (CPU devices)."""
    if not table.devices:
        return None
    group_of = {d: k for k, g in enumerate(op.groups) for d in g}
    held = {d.id: f'g{group_of[d.id]}' if d.id in group_of else '' for d in table.devices}
    ids = {d.id for d in table.devices}
    n = len({k for d, k in group_of.items() if d in ids})
    waits = f'; dashed: {fmt_hosts(waiting_for)}, never launched it' if waiting_for else ''
    legend = f'cell: pN = process N, then gK = in group K of #{op.index} ({n} groups); . = in none'
    return grid_of(
        table.devices,
        held,
        {},
        kind=next((d.kind for d in table.devices if d.kind), ''),
        legend_text=legend + waits,
        marked=tuple(sorted(waiting_for)),
        caption=f'#{op.index} {op.words()}',
    )


def _coords(x: int, y: int, z: int, n: int) -> tuple[int, ...]:
    return (x, y, z)[:n] if n <= 3 else (x, y, z) + (0,) * (n - 3)


__all__ = [
    'COORD_NAMES', 'Chip', 'ChipGrid', 'ChipPlane', 'block_labels', 'chip_grid', 'collective_grid',
    'grid_of',
]  # fmt: skip
