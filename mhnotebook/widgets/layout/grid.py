"""The layout's grid model: the blocks visible in one 2-D view of an array, pure.

`layout_grid` picks the two displayed axes and a position along every other
axis, and returns the visible blocks as rectangles of the displayed plane,
with their hosts, devices, replica counts and replica verdicts;
`block_label` says which devices hold a block (``'process 1 · dev 0 (id 2048)'``).
A block is drawn once, whatever its number of replicas: in its host's colour
when one host holds every copy, in a neutral grey (`SHARED_COLOR`) when
several do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from mhnotebook.widgets._common import host_color
from multihost._models import Layout, LayoutBlock, ReplicaGroup, ReplicaReport
from multihost._models._layout import Index, format_ranges

#: The fill of a block held by several hosts (not any host's colour).
SHARED_COLOR = '#c8c8c8'
#: The outline of a block whose replicas differ (black: red is also host 3's colour).
FLAGGED_EDGE = '#000000'


def block_label(layout: Layout, block: LayoutBlock, form: str = 'long') -> str:
    """Which devices hold a block, as every part of the view says it.

    One device: ``'process 1 · dev 0 (id 2048)'``. Several devices of one host:
    ``'process 1 · dev 0,1 (ids 2048,2049)'``. Several hosts, the same devices on
    each: ``'8 replicas: dev 0,1 of processes 0-3'``; otherwise
    ``'8 replicas on processes 0-3'``. Pure (no widgets, no devices).

    Args:
        layout: the layout (it knows each device's index on its host).
        block: one of ``layout.blocks()``.
        form: ``'long'``, ``'short'`` (``'process 1 · dev 0'``, ``'x8 processes 0-3'``)
            or ``'tiny'`` (``'p1·d0'``, ``'x8'``).
    """
    if form not in ('long', 'short', 'tiny'):
        raise ValueError(f"form must be 'long', 'short' or 'tiny', got {form!r}")
    n = block.replica_count
    if n == 0:
        return 'no device'
    if n == 1:
        return layout.device_name(block.shards[0].device_id, form)
    hosts = block.process_indices
    if len(hosts) > 1:
        if form == 'tiny':
            return f'x{n}'
        per_host: dict[int, set[int | None]] = {}
        for s in block.shards:
            per_host.setdefault(s.process_index, set()).add(layout.local_index(s.device_id))
        sets = {frozenset(v) for v in per_host.values()}
        where = f'processes {format_ranges(hosts)}'
        if len(sets) == 1 and None not in next(iter(sets)):
            devs = format_ranges(i for i in next(iter(sets)) if i is not None)
            if form == 'short':
                return f'x{n} dev {devs} of {where}'
            return f'{n} replicas: dev {devs} of {where}'
        if form == 'short':
            return f'x{n} {where}'
        return f'{n} replicas on {where}'
    (host,) = hosts
    ids = [d for d in block.device_ids if d is not None]
    locals_ = [layout.local_index(d) for d in ids]
    if len(ids) != n or any(i is None for i in locals_):  # host memory or unknown indices
        names = ', '.join(layout.device_name(d, 'tiny') for d in block.device_ids)
        return f'x{n}' if form == 'tiny' else f'x{n}: {names}'
    devs = format_ranges(i for i in locals_ if i is not None)
    if form == 'tiny':
        return f'p{host}·d{devs}'
    if form == 'short':
        return f'process {host} · dev {devs}'
    return f'process {host} · dev {devs} (ids {format_ranges(ids)})'


@dataclasses.dataclass(frozen=True)
class GridBlock:
    """One block of a layout as drawn in the displayed plane.

    Attributes:
        block: the `multihost.LayoutBlock` (its index and every replica).
        rows: ``(start, stop)`` along the row axis (``(0, 1)`` for a 0-d or
            1-d array).
        cols: ``(start, stop)`` along the column axis (``(0, 1)`` for a 0-d array).
        processes: sorted processes holding the block.
        flagged: whether the block's replicas differ (from a `ReplicaReport`).
        odd_devices: devices whose replica differs from the block's majority.
        mark: why the caller marked the block (``layout_grid(marked=...)``,
            e.g. ``'3 NaN, 0 Inf on device 5'``); ``''`` when not marked.
            Marked blocks are hatched (the whole block is what is marked).
        labels: `block_label` in its ``long``, ``short`` and ``tiny`` forms.
        odd_processes: processes holding an odd replica.
    """

    block: LayoutBlock
    rows: tuple[int, int]
    cols: tuple[int, int]
    processes: tuple[int, ...]
    flagged: bool = False
    odd_devices: tuple[int | None, ...] = ()
    mark: str = ''
    labels: tuple[str, ...] = ()
    odd_processes: tuple[int, ...] = ()

    @property
    def index(self) -> Index:
        """The block's index in the array, ``(start, stop)`` per dimension."""
        return self.block.index

    @property
    def replica_count(self) -> int:
        """How many devices hold the block."""
        return self.block.replica_count

    @property
    def device_ids(self) -> tuple[int | None, ...]:
        """Devices holding the block, in replica-id order."""
        return self.block.device_ids

    @property
    def colors(self) -> tuple[str, ...]:
        """One colour per host holding the block (`processes` order)."""
        return tuple(host_color(h) for h in self.processes)

    @property
    def fill(self) -> str:
        """The block's one fill: its host's colour, or `SHARED_COLOR` when several hosts hold it."""
        if len(self.processes) == 1:
            return host_color(self.processes[0])
        return SHARED_COLOR if self.processes else host_color(0)

    @property
    def label(self) -> str:
        """Who holds the block: ``'process 1 · dev 0 (id 2048)'``, ``'8 replicas on processes
        0-3'``."""
        return self.labels[0] if self.labels else ''

    @property
    def odd_text(self) -> str:
        """``'2 of 8 replicas differ (process 2)'``; ``''`` when the replicas agree."""
        if not self.flagged:
            return ''
        return (
            f'{len(self.odd_devices)} of {self.replica_count} replicas differ '
            f'({"process" if len(self.odd_processes) == 1 else "processes"} '
            f'{format_ranges(self.odd_processes)})'
        )


@dataclasses.dataclass(frozen=True)
class LayoutGrid:
    """The blocks visible in one 2-D view of a layout (what `layout_grid` returns).

    Attributes:
        layout: the `multihost.Layout` viewed.
        axes: the displayed axes: ``(row_axis, column_axis)``; ``(0,)`` for a
            1-d array (one row); ``()`` for a 0-d array (one block).
        fixed: ``(axis, position)`` for every other axis, in axis order: the
            slice shown.
        blocks: the visible blocks, row-major by their position.
        extent: ``(rows, columns)`` of the displayed plane, in elements.
        row_cuts: sorted block boundaries along the row axis (0 and the
            extent included).
        col_cuts: the same along the column axis.
        report: the `ReplicaReport` that flagged blocks, if any.
    """

    layout: Layout
    axes: tuple[int, ...]
    fixed: tuple[tuple[int, int], ...]
    blocks: tuple[GridBlock, ...]
    extent: tuple[int, int]
    row_cuts: tuple[int, ...]
    col_cuts: tuple[int, ...]
    report: ReplicaReport | None = None

    def find(self, index: Index) -> GridBlock | None:
        """The visible block with this index, or None."""
        return next((b for b in self.blocks if b.index == index), None)

    @property
    def flagged(self) -> tuple[GridBlock, ...]:
        """The visible blocks whose replicas differ."""
        return tuple(b for b in self.blocks if b.flagged)

    @property
    def marked(self) -> tuple[GridBlock, ...]:
        """The visible blocks the caller marked (``layout_grid(marked=...)``)."""
        return tuple(b for b in self.blocks if b.mark)

    def slice_text(self) -> str:
        """The slice shown, numpy style: ``'[:, :, 3]'`` (``'[]'`` for a 0-d array)."""
        fixed = dict(self.fixed)
        return (
            '['
            + ', '.join(str(fixed[d]) if d in fixed else ':' for d in range(self.layout.ndim))
            + ']'
        )

    def describe(self) -> str:
        """The displayed axes and the slice: ``'rows dim 0, columns dim 2, [:, 3, :]'``."""
        if not self.axes:
            return 'scalar'
        if len(self.axes) == 1:
            return f'dim 0 along one row, {self.slice_text()}'
        return f'rows dim {self.axes[0]}, columns dim {self.axes[1]}, {self.slice_text()}'


def layout_and_report(
    layout: Layout | ReplicaReport, report: ReplicaReport | None
) -> tuple[Layout, ReplicaReport | None]:
    """Accepts a `ReplicaReport` in place of the layout (its layout and itself)."""
    if isinstance(layout, ReplicaReport):
        if report is not None and report is not layout:
            raise ValueError('pass the ReplicaReport once: as the layout or as report=')
        report = layout
        layout = layout.layout
    if not isinstance(layout, Layout):
        raise TypeError(
            'expected a multihost.Layout (multihost.describe_layout(x)) or a '
            'multihost.ReplicaReport (multihost.check_replicas(x)), got '
            f'{type(layout).__module__}.{type(layout).__qualname__}'
        )
    if report is not None:
        if not isinstance(report, ReplicaReport):
            raise TypeError(
                'report must be a multihost.ReplicaReport, got '
                f'{type(report).__module__}.{type(report).__qualname__}'
            )
        if report.layout.shape != layout.shape:
            raise ValueError(
                f'the report describes an array of shape {report.layout.shape}, '
                f'the layout one of shape {layout.shape}'
            )
    return layout, report


def default_axes(ndim: int) -> tuple[int, ...]:
    """The displayed axes by default: the last two (numpy prints an N-d array as
    matrices of its last two dimensions; the leading ones become facets)."""
    if ndim == 0:
        return ()
    if ndim == 1:
        return (0,)
    return (ndim - 2, ndim - 1)


def normalize_axes(axes: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if ndim == 0:
        if axes not in (None, ()):
            raise ValueError(f'a 0-d array has no axes to display, got axes={axes!r}')
        return ()
    if axes is None:
        return default_axes(ndim)
    if isinstance(axes, int | np.integer):
        axes = (int(axes),)
    axes = tuple(int(a) for a in axes)
    want = 1 if ndim == 1 else 2
    if len(axes) != want:
        raise ValueError(f'a {ndim}-d array displays {want} axis/axes, got axes={axes!r}')
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f'axis {a} is out of range for a {ndim}-d array')
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f'the two displayed axes must differ, got axes={axes!r}')
    return axes


def fixed_positions(layout: Layout, axes: tuple[int, ...], fixed: Mapping[int, int] | None) -> dict:
    ndim = layout.ndim
    positions = {}
    for d, p in dict(fixed or {}).items():
        d, p = int(d), int(p)
        if not -ndim <= d < ndim:
            raise ValueError(f'fixed axis {d} is out of range for a {ndim}-d array')
        d %= ndim
        if d in axes:
            raise ValueError(f'axis {d} is displayed; it cannot also be fixed at {p}')
        if not 0 <= p < max(layout.shape[d], 1):
            raise ValueError(
                f'position {p} is outside axis {d} of size {layout.shape[d]} '
                f'(valid: 0..{max(layout.shape[d] - 1, 0)})'
            )
        positions[d] = p
    return positions


def layout_grid(
    layout: Layout | ReplicaReport,
    axes: int | Sequence[int] | None = None,
    fixed: Mapping[int, int] | None = None,
    report: ReplicaReport | None = None,
    *,
    marked: Mapping[Index, str] | None = None,
) -> LayoutGrid:
    """The blocks of ``layout`` visible in one 2-D view. Pure: no widgets, no devices.

    Args:
        layout: a `multihost.Layout`, or a `multihost.ReplicaReport` (its
            layout, with its verdicts).
        axes: ``(row_axis, column_axis)`` to display (default: the last two,
            `default_axes`); a 1-d array shows axis 0 as one row, a 0-d array
            one block. Negative axes count from the end.
        fixed: position (element index) along every other axis; default 0.
            A block is visible when it contains the position along each of them.
        report: a `multihost.ReplicaReport` of the same array: blocks whose
            replicas differ are flagged.
        marked: block index -> a note, for blocks to mark (hatched), e.g.
            those holding NaN (`multihost.NonfiniteLeaf.marked`).

    Returns:
        A `LayoutGrid`.

    Raises:
        ValueError: invalid axes, a position outside its axis, or a position
            given for a displayed axis.
    """
    layout, report = layout_and_report(layout, report)
    ndim = layout.ndim
    axes = normalize_axes(axes, ndim)
    positions = fixed_positions(layout, axes, fixed)
    fixed_t = tuple((d, positions.get(d, 0)) for d in range(ndim) if d not in axes)

    bad: dict[Index, ReplicaGroup] = {}
    if report is not None:
        bad = {g.index: g for g in report.mismatches}
    marks = {tuple((int(a), int(b)) for a, b in k): str(v) for k, v in (marked or {}).items()}
    blocks = []
    for block in layout.blocks():
        if not all(
            layout.shape[d] == 0 or block.index[d][0] <= p < block.index[d][1] for d, p in fixed_t
        ):
            continue
        if ndim == 0:
            rows, cols = (0, 1), (0, 1)
        elif ndim == 1:
            rows, cols = (0, 1), block.index[0]
        else:
            rows, cols = block.index[axes[0]], block.index[axes[1]]
        group = bad.get(block.index)
        blocks.append(
            GridBlock(
                block=block,
                rows=rows,
                cols=cols,
                processes=block.process_indices,
                flagged=group is not None,
                odd_devices=group.odd_devices if group else (),
                mark=marks.get(block.index, ''),
                labels=tuple(block_label(layout, block, f) for f in ('long', 'short', 'tiny')),
                odd_processes=group.odd_processes if group else (),
            )
        )
    blocks.sort(key=lambda b: (b.rows, b.cols))
    if ndim == 0:
        extent = (1, 1)
    elif ndim == 1:
        extent = (1, layout.shape[0])
    else:
        extent = (layout.shape[axes[0]], layout.shape[axes[1]])
    row_cuts = tuple(sorted({0, extent[0], *(v for b in blocks for v in b.rows)}))
    col_cuts = tuple(sorted({0, extent[1], *(v for b in blocks for v in b.cols)}))
    return LayoutGrid(
        layout=layout,
        axes=axes,
        fixed=fixed_t,
        blocks=tuple(blocks),
        extent=extent,
        row_cuts=row_cuts,
        col_cuts=col_cuts,
        report=report,
    )
