"""The layout visualizer: which device and host holds which block of an array.

Model to picture in pure steps, each testable without a widget:

* `layout_grid` picks the two displayed axes and a position along every
  other axis, and returns the visible blocks as rectangles of the displayed
  plane, with their hosts, devices, replica counts and replica verdicts;
  `layout_facets` repeats it over the other axes (small multiples, one per
  distinct block range along them, at most `MAX_FACETS` at a time);
* `block_label` / `multihost._checks._layout.device_name` say which devices hold a
  block (``'host 1 · dev 0 (id 2048)'``);
* `replica_matrix` lays out every replicated block against the devices that
  hold it (cells grouped by digest, odd replicas marked), `mesh_axes_info`
  the mesh's axes and whether each crosses hosts;
* `render_layout_png` draws the facets with matplotlib (Agg, no pyplot
  state), so the picture works in JupyterLab, Voila and a static export;
  the replica matrix and the mesh are HTML tables (`replica_matrix_html`,
  `mesh_html`);
* `LayoutView` wires them to ipywidgets: axis dropdowns, sliders to page
  through facets when there are more than fit, a legend with bytes per
  host, and one button per visible block that shows its shards and values.

A block is drawn once, whatever its number of replicas: in its host's
colour when one host holds every copy, in a neutral grey when several do
(the replica matrix then says which devices, and which of them disagree).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from mhnotebook.widgets._common import (
    CSS,
    PALETTE,
    View,
    add_classes,
    banner,
    close_widgets,
    esc,
    host_color,
    pre,
    run_action,
    swatch,
    text_color,
    widget_html,
)
from multihost import Layout, LayoutBlock, LeafLayout, ReplicaGroup, ReplicaReport, TreeLayout
from multihost._checks._layout import Index, format_bytes, format_index, format_ranges
from multihost._text import fmt_hosts

#: More visible blocks than this (over all facets shown): no buttons, the block list only.
MAX_BUTTONS = 256
#: Hosts listed in the legend; the rest are summarised.
MAX_LEGEND = 32
#: More visible blocks than this: the picture draws no labels.
MAX_LABELS = 400
#: Facets (small multiples over the non-displayed axes) shown at a time.
MAX_FACETS = 16
#: Replicated blocks (rows) in the replica matrix; those that differ come first.
MAX_MATRIX_ROWS = 16
#: Device columns in the replica matrix; beyond, one column per host (the matrix stays
#: about 600 px wide, beside the picture, so that no odd replica hides in a scroll).
MAX_MATRIX_DEVICES = 20
#: Host columns in the replica matrix; beyond, the first ones plus every odd host.
MAX_MATRIX_HOSTS = 16
#: Mesh positions drawn in the mesh view's device table.
MAX_MESH_CELLS = 256
#: Elements of a block's values printed in full (``np.array2string`` threshold).
VALUES_THRESHOLD = 200
#: The fill of a block held by several hosts (not any host's colour).
SHARED_COLOR = '#c8c8c8'
#: Digest groups of the replica matrix: most common digest first.
GROUP_COLORS = ('#cfe8cf', '#f9c9a0', '#c6d4f2', '#ead0f2', '#f2ec9f', '#b8e6e6')
#: The fill of a replica cell without a report (nothing was compared).
UNCHECKED_COLOR = '#e4e4e4'
#: The outline of an odd replica in the replica matrix (its cells are digest colours, not
#: host colours, so red reads as "differs" there).
ODD_COLOR = '#d62728'
#: The outline of a block whose replicas differ (black: red is also host 3's colour).
FLAGGED_EDGE = '#000000'


def group_letter(rank: int) -> str:
    """``0`` -> ``'a'`` (the most common digest), ``1`` -> ``'b'``, ... ``26`` -> ``'a1'``."""
    return 'abcdefghijklmnopqrstuvwxyz'[rank % 26] + (str(rank // 26) if rank >= 26 else '')


def block_label(layout: Layout, block: LayoutBlock, form: str = 'long') -> str:
    """Which devices hold a block, as every part of the view says it.

    One device: ``'host 1 · dev 0 (id 2048)'``. Several devices of one host:
    ``'host 1 · dev 0,1 (ids 2048,2049)'``. Several hosts, the same devices on
    each: ``'8 replicas: dev 0,1 of hosts 0-3'``; otherwise
    ``'8 replicas on hosts 0-3'``. Pure (no widgets, no devices).

    Args:
        layout: the layout (it knows each device's index on its host).
        block: one of ``layout.blocks()``.
        form: ``'long'``, ``'short'`` (``'host 1 · dev 0'``, ``'x8 hosts 0-3'``)
            or ``'tiny'`` (``'h1·d0'``, ``'x8'``).
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
        where = f'hosts {format_ranges(hosts)}'
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
        return f'h{host}·d{devs}'
    if form == 'short':
        return f'host {host} · dev {devs}'
    return f'host {host} · dev {devs} (ids {format_ranges(ids)})'


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
        """Who holds the block: ``'host 1 · dev 0 (id 2048)'``, ``'8 replicas on hosts 0-3'``."""
        return self.labels[0] if self.labels else ''

    @property
    def odd_text(self) -> str:
        """``'2 of 8 replicas differ (host 2)'``; ``''`` when the replicas agree."""
        if not self.flagged:
            return ''
        return (
            f'{len(self.odd_devices)} of {self.replica_count} replicas differ '
            f'({"host" if len(self.odd_processes) == 1 else "hosts"} '
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


def _split(
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


def _normalize_axes(axes: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
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


def _positions(layout: Layout, axes: tuple[int, ...], fixed: Mapping[int, int] | None) -> dict:
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
    layout, report = _split(layout, report)
    ndim = layout.ndim
    axes = _normalize_axes(axes, ndim)
    positions = _positions(layout, axes, fixed)
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


# -- facets (small multiples over the non-displayed axes) --------------------------------


@dataclasses.dataclass(frozen=True)
class Facet:
    """One small multiple: the displayed plane where the other axes lie in one range each.

    Attributes:
        number: the facet's place among all facets (row-major over the
            non-displayed axes), from 0.
        ranges: ``(axis, (start, stop))`` per non-displayed axis: a range in
            which every block boundary is the same, so one picture holds for it.
        grid: the `LayoutGrid` of the plane (at each range's start).
    """

    number: int
    ranges: tuple[tuple[int, tuple[int, int]], ...]
    grid: LayoutGrid

    @property
    def title(self) -> str:
        """The facet's slice, numpy style: ``'[0:2, :, :]'`` (``''`` with no other axes)."""
        if not self.ranges:
            return ''
        ranges = dict(self.ranges)
        return (
            '['
            + ', '.join(
                (
                    f'{ranges[d][0]}'
                    if ranges[d][1] - ranges[d][0] == 1
                    else '{}:{}'.format(*ranges[d])
                )
                if d in ranges
                else ':'
                for d in range(self.grid.layout.ndim)
            )
            + ']'
        )


@dataclasses.dataclass(frozen=True)
class LayoutFacets:
    """What `layout_facets` returns: the facets shown, out of how many.

    Attributes:
        layout: the layout viewed.
        axes: the displayed axes (as in `LayoutGrid.axes`).
        facets: the facets shown (at most ``max_facets``), in order.
        total: how many facets the array has (the product of the number of
            ranges along each non-displayed axis; 1 for a 0-d to 2-d array).
        current: the number of the facet holding the requested position.
        report: the `ReplicaReport` that flagged blocks, if any.
    """

    layout: Layout
    axes: tuple[int, ...]
    facets: tuple[Facet, ...]
    total: int
    current: int = 0
    report: ReplicaReport | None = None

    @property
    def other_axes(self) -> tuple[int, ...]:
        """The non-displayed axes the facets run over."""
        return tuple(d for d in range(self.layout.ndim) if d not in self.axes)

    @property
    def more(self) -> int:
        """Facets not shown."""
        return self.total - len(self.facets)

    def describe(self) -> str:
        """``'4 facets over dim 0'``, ``'facets 17-32 of 40 over dims 0, 1'`` or ``''``."""
        if self.total <= 1 and not self.other_axes:
            return ''
        dims = ', '.join(map(str, self.other_axes))
        over = f'dim {dims}' if len(self.other_axes) == 1 else f'dims {dims}'
        if not self.more:
            return f'{self.total} facet{"s" if self.total != 1 else ""} over {over}'
        first, last = self.facets[0].number + 1, self.facets[-1].number + 1
        return f'facets {first}-{last} of {self.total} over {over}'

    def more_text(self) -> str:
        """``'+24 more facets: move the dim 0 slider'``; ``''`` when every facet is shown."""
        if not self.more:
            return ''
        dims = ', '.join(f'dim {d}' for d in self.other_axes)
        first, last = self.facets[0].number + 1, self.facets[-1].number + 1
        return (
            f'+{self.more} more facets not drawn (facets {first}-{last} of {self.total} '
            f'shown; the {dims} slider pages)'
        )


def _segments(layout: Layout, axis: int) -> tuple[tuple[int, int], ...]:
    """The ranges along ``axis`` between consecutive block boundaries."""
    n = layout.shape[axis]
    if n == 0:
        return ((0, 0),)
    cuts = sorted({0, n, *(v for b in layout.blocks() for v in b.index[axis])})
    return tuple(zip(cuts[:-1], cuts[1:]))


def layout_facets(
    layout: Layout | ReplicaReport,
    axes: int | Sequence[int] | None = None,
    fixed: Mapping[int, int] | None = None,
    report: ReplicaReport | None = None,
    *,
    marked: Mapping[Index, str] | None = None,
    max_facets: int = MAX_FACETS,
) -> LayoutFacets:
    """The small multiples of a layout: one `LayoutGrid` per range of the other axes.

    An array of rank 3 or more shows two axes (default: the last two); along
    every other axis, the block boundaries cut it into ranges, and each
    combination of ranges is one facet. Facets come in pages of
    ``max_facets``: the page shown holds the position ``fixed`` (default 0).
    A 0-d to 2-d array is one facet. Pure: no widgets, no devices.

    Args:
        layout: a `multihost.Layout` or a `multihost.ReplicaReport`.
        axes: the displayed axes (see `layout_grid`).
        fixed: a position along the other axes; its facet's page is shown.
        report: a `ReplicaReport` of the same array (flags blocks).
        marked: block index -> a note, for blocks to mark (see `layout_grid`).
        max_facets: facets per page.

    Returns:
        A `LayoutFacets`.
    """
    layout, report = _split(layout, report)
    axes = _normalize_axes(axes, layout.ndim)
    positions = _positions(layout, axes, fixed)
    others = [d for d in range(layout.ndim) if d not in axes]
    segments = [_segments(layout, d) for d in others]
    total = math.prod(len(s) for s in segments)
    current = 0
    for d, segs in zip(others, segments):
        p = positions.get(d, 0)
        k = next((i for i, (a, b) in enumerate(segs) if a <= p < b), 0)
        current = current * len(segs) + k
    max_facets = max(int(max_facets), 1)
    first = (current // max_facets) * max_facets
    facets = []
    chosen = itertools.islice(itertools.product(*segments), first, first + max_facets)
    for number, combo in enumerate(chosen, start=first):
        ranges = tuple(zip(others, combo))
        grid = layout_grid(layout, axes, {d: r[0] for d, r in ranges}, report, marked=marked)
        facets.append(Facet(number=number, ranges=ranges, grid=grid))
    return LayoutFacets(
        layout=layout,
        axes=axes,
        facets=tuple(facets),
        total=total,
        current=current,
        report=report,
    )


# -- the replica matrix ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReplicaCell:
    """One replica in the matrix: a device's (or, per host, a host's) copies of a block.

    Attributes:
        process: the host holding the replica(s).
        device_ids: the devices behind the cell (one, or a host's for a host column).
        name: ``'host 1 · dev 0 (id 2048)'`` (or ``'host 1 · 2 devices'``).
        groups: digest group per device of the cell (0: the most common
            digest); ``()`` without a report.
        digests: the digests, in the same order; ``()`` without a report.
        odd: whether a replica of the cell differs from the block's majority.
    """

    process: int
    device_ids: tuple[int | None, ...]
    name: str
    groups: tuple[int, ...] = ()
    digests: tuple[str, ...] = ()
    odd: bool = False

    @property
    def group(self) -> int | None:
        """The cell's digest group (an odd one wins when a host cell mixes); None: unchecked."""
        if not self.groups:
            return None
        return max(self.groups) if self.odd else min(self.groups)

    @property
    def color(self) -> str:
        """Its digest group's colour (`GROUP_COLORS`), `UNCHECKED_COLOR` without a report."""
        g = self.group
        return UNCHECKED_COLOR if g is None else GROUP_COLORS[g % len(GROUP_COLORS)]

    @property
    def text(self) -> str:
        """What the cell shows: its digest group's letter (``'a'``), ``''`` without a report."""
        g = self.group
        return '' if g is None else group_letter(g)


@dataclasses.dataclass(frozen=True)
class ReplicaColumn:
    """A column of the matrix: one device, one host (per-host columns), or a gap.

    Attributes:
        process: the host.
        device_id: the device; None for a host column or a gap.
        label: the header (``'0'``: dev 0 of its host; ``'host 3'``; ``'… 40'``: 40 hosts).
        title: the tooltip (``'host 1 · dev 0 (id 2048)'``).
        gap: how many hosts this column stands for without showing them (0: a real column).
    """

    process: int
    device_id: int | None
    label: str
    title: str
    gap: int = 0


@dataclasses.dataclass(frozen=True)
class ReplicaRow:
    """A replicated block against every column: a cell where it has a replica, else None."""

    block: LayoutBlock
    cells: tuple[ReplicaCell | None, ...]
    flagged: bool = False
    tied: bool = False


@dataclasses.dataclass(frozen=True)
class ReplicaMatrix:
    """Replicated blocks x the devices (or hosts) holding them: what `replica_matrix` returns.

    Attributes:
        layout: the layout.
        columns: devices grouped by host, in host then device order (or
            hosts, when there are more than `MAX_MATRIX_DEVICES` devices);
            gap columns stand for hosts left out.
        rows: the replicated blocks shown (those that differ first, then in
            block order, at most `MAX_MATRIX_ROWS`; shown in block order).
        replicated: how many blocks have more than one replica.
        flagged: how many of them have replicas that differ.
        per_host: whether a column is a host (else a device).
        checked: whether a report gave digests (else cells are neutral).
    """

    layout: Layout
    columns: tuple[ReplicaColumn, ...]
    rows: tuple[ReplicaRow, ...]
    replicated: int
    flagged: int
    per_host: bool
    checked: bool

    @property
    def more(self) -> int:
        """Replicated blocks not shown."""
        return self.replicated - len(self.rows)

    def cells(self) -> list[ReplicaCell]:
        """Every non-empty cell, row by row."""
        return [c for r in self.rows for c in r.cells if c is not None]

    def caption(self) -> str:
        """One line: what the matrix shows, and what is left out."""
        kind = 'hosts' if self.per_host else 'devices'
        text = (
            f'replicas: {len(self.rows)} replicated block{"s" if len(self.rows) != 1 else ""} x '
            f'{sum(1 for c in self.columns if not c.gap)} {kind}'
        )
        if self.checked:
            text += '; cells coloured by digest (a: the most common), odd replicas marked red'
        else:
            text += '; replicas not compared (no replica report)'
        hidden = sum(c.gap for c in self.columns)
        if hidden:
            text += f'; {hidden} more hosts in the … columns' + (
                ', none holding an odd replica of these blocks' if self.checked else ''
            )
        if self.more:
            text += (
                f'; {self.more} more replicated block{"s" if self.more != 1 else ""} not shown'
                + (' (those that differ come first)' if self.flagged else '')
            )
        return text


def replica_matrix(
    layout: Layout | ReplicaReport,
    report: ReplicaReport | None = None,
    *,
    max_rows: int = MAX_MATRIX_ROWS,
    max_devices: int = MAX_MATRIX_DEVICES,
    max_hosts: int = MAX_MATRIX_HOSTS,
) -> ReplicaMatrix:
    """Every replicated block against the devices holding it. Pure: no widgets.

    Rows are the blocks held by more than one device (at most ``max_rows``:
    those whose replicas differ first). Columns are the devices holding them,
    grouped by host; with more than ``max_devices`` devices, one column per
    host, and with more than ``max_hosts`` hosts, the first ones plus every
    host with an odd replica (gap columns stand for the others). With a
    report, each cell carries its digest group (0: the most common digest)
    and whether it is odd.
    """
    layout, report = _split(layout, report)
    groups = {g.index: g for g in report.groups} if report is not None else {}
    replicated = [b for b in layout.blocks() if b.replica_count > 1]
    flagged = [b for b in replicated if b.index in groups and not groups[b.index].ok]
    keep = {b.index for b in flagged[:max_rows]}
    for b in replicated:
        if len(keep) >= max_rows:
            break
        keep.add(b.index)
    rows_blocks = [b for b in replicated if b.index in keep]

    devices: dict[int, set[int | None]] = {}
    for b in rows_blocks:
        for s in b.shards:
            devices.setdefault(s.process_index, set()).add(s.device_id)
    by_host = layout.devices_by_process()
    ordered = {p: tuple(d for d in by_host.get(p, ()) if d in devices[p]) for p in sorted(devices)}
    per_host = sum(len(v) for v in ordered.values()) > max_devices
    odd_hosts = {p for b in rows_blocks if b.index in groups for p in groups[b.index].odd_processes}
    hosts = list(ordered)
    if per_host and len(hosts) > max_hosts:
        shown = set(hosts[:max_hosts]) | odd_hosts
    else:
        shown = set(hosts)

    columns: list[ReplicaColumn] = []
    skipped = 0
    for p in hosts:
        if p not in shown:
            skipped += 1
            continue
        if skipped:
            columns.append(
                ReplicaColumn(p, None, f'… {skipped}', f'{skipped} hosts not shown', skipped)
            )
            skipped = 0
        if per_host:
            n = len(ordered[p])
            columns.append(ReplicaColumn(p, None, f'host {p}', f'host {p}: {n} device(s)'))
        else:
            for d in ordered[p]:
                local = layout.local_index(d)
                label = 'mem' if d is None else f'{local}' if local is not None else f'#{d}'
                columns.append(ReplicaColumn(p, d, label, layout.device_name(d)))
    if skipped:
        columns.append(
            ReplicaColumn(-1, None, f'… {skipped}', f'{skipped} hosts not shown', skipped)
        )

    rows = []
    for b in rows_blocks:
        group = groups.get(b.index)
        rank: dict[str, int] = {}
        digest_of: dict[int | None, str] = {}
        odd: set[int | None] = set()
        if group is not None:
            rank = {d: i for i, d in enumerate(group.digests)}
            digest_of = {r.device_id: r.digest for r in group.replicas}
            odd = set(group.odd_devices) if not group.ok else set()
        held: dict[tuple[int, int | None], list[int | None]] = {}
        for s in b.shards:
            key = (s.process_index, None if per_host else s.device_id)
            held.setdefault(key, []).append(s.device_id)
        cells: list[ReplicaCell | None] = []
        for c in columns:
            ids = held.get((c.process, c.device_id)) if not c.gap else None
            if not ids:
                cells.append(None)
                continue
            digests = tuple(digest_of[d] for d in ids if d in digest_of)
            name = (
                layout.device_name(ids[0])
                if len(ids) == 1
                else f'host {c.process} · {len(ids)} devices'
            )
            cells.append(
                ReplicaCell(
                    process=c.process,
                    device_ids=tuple(ids),
                    name=name,
                    groups=tuple(rank[h] for h in digests),
                    digests=digests,
                    odd=any(d in odd for d in ids),
                )
            )
        rows.append(
            ReplicaRow(
                block=b,
                cells=tuple(cells),
                flagged=group is not None and not group.ok,
                tied=group is not None and group.tied,
            )
        )
    return ReplicaMatrix(
        layout=layout,
        columns=tuple(columns),
        rows=tuple(rows),
        replicated=len(replicated),
        flagged=len(flagged),
        per_host=per_host,
        checked=report is not None,
    )


def replica_matrix_html(matrix: ReplicaMatrix) -> str:
    """The matrix as an HTML table (``mh-replica-matrix``; ``''`` when nothing is replicated).

    Classes: ``mh-replica-row`` (``mh-flagged`` when its replicas differ),
    ``mh-replica-cell`` (one per replica, or per host's replicas; also
    ``mh-host-<p>``, ``mh-replica-group-<g>``, ``mh-replica-odd``),
    ``mh-replica-empty`` (a device without this block), ``mh-replica-gap``.
    """
    if not matrix.rows:
        return ''
    cols = matrix.columns
    span = '' if matrix.per_host else ' rowspan="2"'
    head1 = ['<th>host</th>']
    head2 = ['<th>dev</th>']
    for _, group in itertools.groupby(cols, key=lambda c: (c.process, c.gap)):
        members = list(group)
        c0 = members[0]
        if c0.gap:
            head1.append(
                f'<th{span} class="mh-replica-gap" title="{esc(c0.title)}">{esc(c0.label)}</th>'
            )
            continue
        if matrix.per_host:
            head1.append(
                f'<th class="mh-host-{c0.process}" title="{esc(c0.title)}">'
                f'{swatch(c0.process)}<br>{c0.process}</th>'
            )
            continue
        name = f'host {c0.process}' if len(members) > 1 else f'{c0.process}'
        head1.append(
            f'<th colspan="{len(members)}" class="mh-host-{c0.process}" '
            f'title="host {c0.process}">{swatch(c0.process)} {name}</th>'
        )
        head2 += [f'<th title="{esc(c.title)}">{esc(c.label)}</th>' for c in members]
    body = []
    for row in matrix.rows:
        tds = []
        for c, cell in zip(cols, row.cells):
            if c.gap:
                tds.append('<td class="mh-replica-gap"></td>')
            elif cell is None:
                tds.append('<td class="mh-replica-empty"></td>')
            else:
                cls = ['mh-replica-cell', f'mh-host-{cell.process}']
                if cell.group is not None:
                    cls.append(f'mh-replica-group-{cell.group}')
                if cell.odd:
                    cls.append('mh-replica-odd')
                title = f'{cell.name}: {format_index(row.block.index)}'
                if cell.digests:
                    title += ', digest ' + ', '.join(sorted(set(cell.digests)))
                if cell.odd:
                    title += ' (differs from the majority)'
                tds.append(
                    f'<td class="{" ".join(cls)}" style="background-color:{cell.color}" '
                    f'title="{esc(title)}">{esc(cell.text)}</td>'
                )
        row_cls = 'mh-replica-row' + (' mh-flagged' if row.flagged else '')
        mark = ' ⚠' if row.flagged else ''
        body.append(
            f'<tr class="{row_cls}"><th>{esc(format_index(row.block.index))}{mark}</th>'
            f'{"".join(tds)}</tr>'
        )
    note = ''
    if any(r.tied for r in matrix.rows if r.flagged):
        note = (
            '<div class="mh-replica-note">a tie: no digest has a majority; '
            "replica 0's digest counts as a</div>"
        )
    return (
        f'{CSS}<div class="mh-replica-box"><div class="mh-replica-caption">'
        f'{esc(matrix.caption())}</div><div class="mh-scroll">'
        f'<table class="mh-table mh-replica-matrix"><tr>{"".join(head1)}</tr>'
        f'{"<tr>" + "".join(head2) + "</tr>" if len(head2) > 1 else ""}{"".join(body)}'
        '</table></div>'
        f'{note}</div>'
    )


def replica_matrix_text(matrix: ReplicaMatrix) -> str:
    """The matrix in a few lines: per block, which devices hold which digest group (``''``
    without a report: the layout's own text already lists each block's devices)."""
    if not matrix.rows or not matrix.checked:
        return ''
    lines = [matrix.caption()]
    for row in matrix.rows:
        cells = [c for c in row.cells if c is not None]
        by: dict[str, list[str]] = {}
        for c in cells:
            key = c.text
            by.setdefault(key, []).append(c.name + (' (odd)' if c.odd else ''))
        parts = []
        for key, names in sorted(by.items()):
            shown = ', '.join(names[:4]) + (
                f', ... ({len(names)} in all)' if len(names) > 4 else ''
            )
            parts.append(f'{key}: {shown}')
        lines.append(f'  {format_index(row.block.index)}: ' + '; '.join(parts))
    return '\n'.join(lines)


# -- the mesh ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MeshAxisInfo:
    """One mesh axis: its size and whether moving along it changes the process.

    Attributes:
        name: the axis name.
        size: its size.
        hosts: the most distinct processes along one line of the axis (0:
            unknown, 1: within a host).
        sharded_dims: the array dimensions the partition spec shards over
            this axis.
    """

    name: str
    size: int
    hosts: int
    sharded_dims: tuple[int, ...] = ()

    @property
    def crosses_hosts(self) -> bool:
        """Whether a collective over this axis talks between hosts."""
        return self.hosts > 1

    @property
    def verdict(self) -> str:
        """``'crosses hosts (4 along it)'``, ``'within a host'`` or ``'unknown'``."""
        if self.hosts == 0:
            return 'unknown (no mesh devices)'
        return f'crosses hosts ({self.hosts} along it)' if self.hosts > 1 else 'within a host'


def _spec_axes(spec: str, ndim: int) -> dict[str, tuple[int, ...]]:
    """Mesh axis -> array dims it shards, parsed from the text of `Layout.spec`."""
    import ast

    text = spec.strip()
    if not (text.startswith('P(') and text.endswith(')')):
        return {}
    try:
        entries = ast.literal_eval('(' + text[2:-1] + ',)') if text[2:-1].strip() else ()
    except (ValueError, SyntaxError):
        return {}
    out: dict[str, list[int]] = {}
    for dim, e in enumerate(entries[:ndim]):
        for name in e if isinstance(e, tuple) else (e,):
            if isinstance(name, str):
                out.setdefault(name, []).append(dim)
    return {k: tuple(v) for k, v in out.items()}


def mesh_axes_info(layout: Layout) -> tuple[MeshAxisInfo, ...]:
    """Per mesh axis: size, hosts along it (crossing or not), dims it shards. ``()`` without a
    mesh. Pure."""
    hosts = dict(layout.mesh_axis_hosts())
    dims = _spec_axes(layout.spec, layout.ndim)
    return tuple(
        MeshAxisInfo(name=a, size=n, hosts=hosts.get(a, 0), sharded_dims=dims.get(a, ()))
        for a, n in layout.mesh_axes
    )


def mesh_html(layout: Layout, max_cells: int = MAX_MESH_CELLS) -> str:
    """The mesh view: axes (size, hosts along each, crossing or not) and devices by position.

    Classes: ``mh-mesh-view`` (the whole), ``mh-mesh-axes`` (the axis table;
    rows ``mh-mesh-axis`` with ``mh-crosses-hosts`` or ``mh-within-host``),
    ``mh-mesh-devices`` (mesh positions, cells ``mh-mesh-device`` coloured
    by host). ``''`` without a mesh.
    """
    axes = mesh_axes_info(layout)
    if not axes:
        return ''
    rows = []
    for a in axes:
        cls = 'mh-crosses-hosts' if a.crosses_hosts else 'mh-within-host' if a.hosts else ''
        dims = ', '.join(map(str, a.sharded_dims)) or '-'
        rows.append(
            f'<tr class="mh-mesh-axis {cls}"><td><b>{esc(a.name)}</b></td><td>{a.size}</td>'
            f'<td>{dims}</td><td>{esc(a.verdict)}</td></tr>'
        )
    parts = [
        '<div class="mh-mesh-caption">mesh: axes x devices x processes</div>',
        '<table class="mh-table mh-mesh-axes"><tr><th>axis</th><th>size</th>'
        f'<th>shards dim</th><th>hosts</th></tr>{"".join(rows)}</table>',
    ]
    ids = layout.mesh_device_ids
    sizes = tuple(a.size for a in axes)
    if ids and len(ids) == math.prod(sizes):
        parts.append(_mesh_devices_html(layout, axes, max_cells))
    return f'{CSS}<div class="mh-mesh-view">{"".join(parts)}</div>'


def _mesh_devices_html(layout: Layout, axes: tuple[MeshAxisInfo, ...], max_cells: int) -> str:
    """Mesh positions as a table: rows over the leading axes, columns the last (a 1-d mesh: a
    column), each cell the device there, coloured by its host."""
    sizes = tuple(a.size for a in axes)
    ids = np.array(layout.mesh_device_ids, dtype=object).reshape(sizes)
    if len(axes) == 1:
        grid = ids.reshape(-1, 1)
        row_names = [f'{axes[0].name}={i}' for i in range(sizes[0])]
        col_names = []
    else:
        grid = ids.reshape(-1, sizes[-1])
        leading = list(itertools.product(*(range(n) for n in sizes[:-1])))
        row_names = [', '.join(f'{a.name}={i}' for a, i in zip(axes[:-1], pos)) for pos in leading]
        col_names = [f'{axes[-1].name}={j}' for j in range(sizes[-1])]
    ncols = grid.shape[1]
    form = 'long' if ncols <= 2 else 'short' if ncols <= 4 else 'tiny'
    max_rows = max(1, max_cells // max(ncols, 1))
    body = []
    for r in range(min(grid.shape[0], max_rows)):
        tds = []
        for c in range(ncols):
            d = grid[r, c]
            p = layout.device_process(d)
            color = host_color(p) if p is not None else '#ffffff'
            name = layout.device_name(d, form)
            tds.append(
                f'<td class="mh-mesh-device mh-host-{p}" style="background-color:{color};'
                f'color:{text_color(color)}" title="{esc(layout.device_name(d))}">{esc(name)}</td>'
            )
        body.append(f'<tr><th>{esc(row_names[r])}</th>{"".join(tds)}</tr>')
    more = ''
    if grid.shape[0] > max_rows:
        more = (
            f'<div class="mh-mesh-more">+{grid.shape[0] - max_rows} more rows of the mesh '
            'not shown</div>'
        )
    head = ''
    if len(axes) > 1:
        head = '<tr><th></th>' + ''.join(f'<th>{esc(n)}</th>' for n in col_names) + '</tr>'
    return (
        f'<div class="mh-scroll"><table class="mh-table mh-mesh-devices">{head}'
        f'{"".join(body)}</table></div>{more}'
    )


# -- the picture ------------------------------------------------------------------------

_DPI = 100
_PLOT_FRACTION = 0.84  # of the figure's width (the rest: the y labels' margin)
_LEFT = 0.1  # the plot's left edge, as a fraction of the figure's width
_TITLE_IN, _XLABEL_IN, _NO_XLABEL_IN = 0.55, 0.5, 0.15  # margins (inches)
_FACET_TITLE_IN, _FACET_TICKS_IN, _FACET_GAP_IN = 0.24, 0.22, 0.32  # facet margins (inches)
_MORE_IN = 0.3  # the "+N more facets" line
_MAX_FACET_COLUMNS = 4
_ASPECT_0D, _ASPECT_1D = 0.3, 0.12  # plot height / width of a scalar, a vector
_ASPECT_MIN, _ASPECT_MAX = 0.2, 1.25  # bounds of a 2-d plot's height / width
_FACET_ASPECT_1D = 0.3  # a vector's facet is small: give its bar some height
_MAX_TITLE_CHARS = 95
_THIN_OUTLINES_ABOVE = 64  # blocks: beyond this many, outlines get thinner
_CHAR_PX, _LINE_PX, _LABEL_PAD_PX = 6.2, 12, 4  # 8-pt text: width per char, line height
_MAX_TICKS = 17
_MIN_TICK_PX = 22  # closer block boundaries: only the ends are ticked


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Where each facet's plot goes (inches) and how big the figure is."""

    fig_w: float
    fig_h: float
    plot_w: float  # one facet's plot
    plot_h: float
    columns: int
    rows: int
    top: float  # from the figure's top to the first facet's title
    row_h: float  # one row of facets: title, plot, ticks
    titled: bool

    @classmethod
    def of(cls, facets: LayoutFacets, width: int) -> _Geometry:
        n = max(len(facets.facets), 1)
        ndim = facets.layout.ndim
        grid = facets.facets[0].grid if facets.facets else None
        nrows, ncols = grid.extent if grid is not None else (1, 1)
        columns = 1 if n == 1 else min(n, _MAX_FACET_COLUMNS)
        rows = math.ceil(n / columns)
        avail = width / _DPI * _PLOT_FRACTION
        plot_w = (avail - (columns - 1) * _FACET_GAP_IN) / columns
        if ndim == 0:
            ratio = _ASPECT_0D
        elif ndim == 1:
            ratio = _ASPECT_1D if n == 1 else _FACET_ASPECT_1D
        else:
            ratio = min(_ASPECT_MAX, max(_ASPECT_MIN, nrows / max(ncols, 1)))
        plot_h = plot_w * ratio
        titled = n > 1 or bool(facets.other_axes)
        ticks = _FACET_TICKS_IN if rows > 1 else 0.0
        row_h = (_FACET_TITLE_IN if titled else 0.0) + plot_h + ticks
        bottom = (_XLABEL_IN if ndim else _NO_XLABEL_IN) + (_MORE_IN if facets.more else 0.0)
        fig_h = _TITLE_IN + rows * row_h - ticks + bottom
        return cls(width / _DPI, fig_h, plot_w, plot_h, columns, rows, _TITLE_IN, row_h, titled)

    def box(self, i: int) -> tuple[float, float, float, float]:
        """Facet ``i``'s plot as figure fractions ``(left, bottom, width, height)``."""
        r, c = divmod(i, self.columns)
        left_in = _LEFT * self.fig_w + c * (self.plot_w + _FACET_GAP_IN)
        top_in = self.top + r * self.row_h + (_FACET_TITLE_IN if self.titled else 0.0)
        bottom_in = self.fig_h - top_in - self.plot_h
        return (
            left_in / self.fig_w,
            bottom_in / self.fig_h,
            self.plot_w / self.fig_w,
            self.plot_h / self.fig_h,
        )

    def pixels_per_element(self, grid: LayoutGrid) -> tuple[float, float]:
        nrows, ncols = grid.extent
        return self.plot_w * _DPI / max(ncols, 1), self.plot_h * _DPI / max(nrows, 1)


def render_layout_png(
    grid: LayoutFacets | LayoutGrid | Layout | ReplicaReport,
    *,
    selected: Index | None = None,
    width: int = 640,
) -> bytes:
    """Draws a layout as a PNG: every block once, coloured by the host holding it.

    A block held by one host has its colour and names its device(s)
    (``'host 1 · dev 0 (id 2048)'``); a block held by several hosts is drawn
    once in a neutral grey (``'8 replicas on hosts 0-3'``; which replica is
    where, and which differ, is the replica matrix's job). A block whose
    replicas differ gets a red outline and says how many and on which hosts.
    An array of rank 3 or more is drawn as facets (small multiples over the
    non-displayed axes, at most `MAX_FACETS`, the rest counted). The
    selected block is outlined. Labels are drawn only where they fit. Uses
    matplotlib's Agg canvas directly (no pyplot, no global backend switch).

    Args:
        grid: `LayoutFacets` (from `layout_facets`), one `LayoutGrid` (from
            `layout_grid`), or a layout or replica report (its facets with
            the default axes).
        selected: the index of a block to outline.
        width: the image's width in pixels.

    Returns:
        The PNG file's bytes.
    """
    from matplotlib.figure import Figure

    if isinstance(grid, LayoutGrid):
        facets = LayoutFacets(
            layout=grid.layout,
            axes=grid.axes,
            facets=(Facet(0, (), grid),),
            total=1,
            report=grid.report,
        )
        title = grid.describe()
    else:
        facets = grid if isinstance(grid, LayoutFacets) else layout_facets(grid)
        title = _facets_title(facets)
    geo = _Geometry.of(facets, width)
    fig = Figure(figsize=(geo.fig_w, geo.fig_h), dpi=_DPI)
    headline = facets.layout.headline()
    if len(headline) > _MAX_TITLE_CHARS:
        headline = headline[: _MAX_TITLE_CHARS - 3] + '...'
    fig.suptitle(f'{headline}\n{title}', fontsize=8, y=1 - 0.06 / geo.fig_h)
    labels = sum(len(f.grid.blocks) for f in facets.facets) <= MAX_LABELS
    last_row = (len(facets.facets) - 1) // geo.columns
    for i, facet in enumerate(facets.facets):
        ax = fig.add_axes(geo.box(i))
        g = facet.grid
        nrows, ncols = g.extent
        ax.set_xlim(0, max(ncols, 1))
        ax.set_ylim(max(nrows, 1), 0)  # row 0 at the top, as numpy prints
        if geo.titled:
            ax.set_title(facet.title, fontsize=8, pad=3)
        _draw_blocks(ax, g, selected)
        if labels:
            _draw_labels(ax, g, geo)
        r, c = divmod(i, geo.columns)
        _draw_axes(ax, g, geo, xlabel=r == last_row, ylabel=c == 0)
    if facets.more:
        fig.text(
            0.5,
            0.12 / geo.fig_h,
            facets.more_text(),
            ha='center',
            va='bottom',
            fontsize=8,
            color='#444444',
        )
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=_DPI)
    return buf.getvalue()


def _facets_title(facets: LayoutFacets) -> str:
    """The second title line: the displayed axes, and the facets."""
    layout, axes = facets.layout, facets.axes
    if not axes:
        return 'scalar'
    if len(axes) == 1:
        text = 'dim 0 along one row'
    else:
        text = f'rows dim {axes[0]}, columns dim {axes[1]}'
    more = facets.describe()
    if more:
        text += f'; {more}'
    elif layout.ndim >= 1:
        text += ', ' + facets.facets[0].grid.slice_text() if facets.facets else ''
    return text


def _draw_blocks(ax: Any, grid: LayoutGrid, selected: Index | None) -> None:
    """One fill per block, white outlines, red outlines of blocks whose replicas differ, the
    selection."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    fills, colors, flagged, marked = [], [], [], []
    for b in grid.blocks:
        (y0, y1), (x0, x1) = b.rows, b.cols
        fills.append(Rectangle((x0, y0), x1 - x0, y1 - y0))
        colors.append(b.fill)
        if b.flagged:
            flagged.append(Rectangle((x0, y0), x1 - x0, y1 - y0))
        if b.mark:
            marked.append(Rectangle((x0, y0), x1 - x0, y1 - y0))
    thin = len(grid.blocks) > _THIN_OUTLINES_ABOVE
    ax.add_collection(
        PatchCollection(
            fills, facecolors=colors, edgecolors='white', linewidths=0.5 if thin else 1.5
        )
    )
    if marked:  # the whole block is what the caller marked (e.g. it holds NaN): hatch it
        ax.add_collection(
            PatchCollection(
                marked, facecolors='none', edgecolors='black', hatch='x', linewidths=2.0
            )
        )
    if flagged:
        ax.add_collection(
            PatchCollection(
                flagged, facecolors='none', edgecolors=FLAGGED_EDGE, linewidths=1.5 if thin else 3.5
            )
        )
    chosen = grid.find(selected) if selected is not None else None
    if chosen is not None:
        (y0, y1), (x0, x1) = chosen.rows, chosen.cols
        ax.add_patch(
            Rectangle(
                (x0, y0),
                x1 - x0,
                y1 - y0,
                facecolor='none',
                edgecolor='black',
                linewidth=2.5,
                linestyle='--',
            )
        )


def _label_candidates(b: GridBlock) -> list[list[str]]:
    """A block's labels, most informative first.

    Long (``'host 1 · dev 0 (id 2048)'``), then short (``'host 1 · dev 0'``),
    then tiny (``'h1·d0'``); a block whose replicas differ adds what differs,
    a marked block its mark.
    """
    labels = b.labels or ('',)
    long_, short, tiny = (list(labels) + [labels[-1]] * 3)[:3]
    if b.flagged:
        n_odd = len(b.odd_devices)
        candidates = [
            [long_, '! ' + b.odd_text],
            [short, '! ' + b.odd_text],
            [short, f'! {n_odd}/{b.replica_count} differ'],
            ['! ' + tiny],
            ['!'],
        ]
    else:
        candidates = [[long_], [short], [tiny]]
    if b.mark:  # the mark (which host's replica holds the NaN) first, then without it
        marked = [['! ' + lines[0], *lines[1:]] for lines in candidates[:-1]]
        candidates = [[*lines, b.mark] for lines in marked] + marked
        candidates += [['! ' + b.mark], ['!']] if not b.flagged else [['!']]
    return candidates


def _fits(lines: list[str], w_px: float, h_px: float) -> bool:
    fits_w = w_px >= _CHAR_PX * max(len(s) for s in lines) + _LABEL_PAD_PX
    return fits_w and h_px >= _LINE_PX * len(lines) + 2


def _label_lines(b: GridBlock, w_px: float, h_px: float, level: int = 0) -> list[str] | None:
    """The most informative label of the block, from candidate ``level`` on, that fits."""
    for lines in _label_candidates(b)[level:]:
        if _fits(lines, w_px, h_px):
            return lines
    return None


def _label_level(grid: LayoutGrid, px_x: float, px_y: float) -> int:
    """The most informative label form every plain block of the grid can show, so that
    blocks read alike (not one named with its id and its neighbour without)."""
    level = 0
    for b in grid.blocks:
        if b.flagged or b.mark:
            continue
        w, h = (b.cols[1] - b.cols[0]) * px_x, (b.rows[1] - b.rows[0]) * px_y
        best = next((i for i, c in enumerate(_label_candidates(b)) if _fits(c, w, h)), None)
        if best is not None:
            level = max(level, best)
    return level


def _draw_labels(ax: Any, grid: LayoutGrid, geo: _Geometry) -> None:
    """Labels where they fit, in one form for the whole grid; boxed on a block whose
    replicas differ or that is marked."""
    px_x, px_y = geo.pixels_per_element(grid)
    level = _label_level(grid, px_x, px_y)
    for b in grid.blocks:
        w, h = (b.cols[1] - b.cols[0]) * px_x, (b.rows[1] - b.rows[0]) * px_y
        lines = _label_lines(b, w, h, 0 if b.flagged or b.mark else level)
        if lines is None:
            continue
        boxed = bool(b.flagged or b.mark)
        ax.text(
            (b.cols[0] + b.cols[1]) / 2,
            (b.rows[0] + b.rows[1]) / 2,
            '\n'.join(lines),
            ha='center',
            va='center',
            fontsize=8,
            linespacing=1.1,
            color='#000000' if boxed else text_color(b.fill),
            bbox=dict(facecolor='white', alpha=0.9, edgecolor='none', pad=1.5) if boxed else None,
        )


def _ticks(cuts: tuple[int, ...], extent_px: float) -> list[int]:
    """Block boundaries as ticks, or just both ends when they would crowd."""
    if len(cuts) <= _MAX_TICKS and extent_px / max(len(cuts) - 1, 1) >= _MIN_TICK_PX:
        return list(cuts)
    return [cuts[0], cuts[-1]]


def _draw_axes(ax: Any, grid: LayoutGrid, geo: _Geometry, *, xlabel: bool, ylabel: bool) -> None:
    """Ticks at the block boundaries (when few), axis labels, the empty-array note."""
    ndim = grid.layout.ndim
    nrows, ncols = grid.extent
    if nrows == 0 or ncols == 0:
        ax.text(
            0.5,
            0.5,
            f'empty array, shape {grid.layout.shape}',
            transform=ax.transAxes,
            ha='center',
            va='center',
            fontsize=9,
        )
    ax.tick_params(labelsize=7, length=2, pad=1)
    if ndim == 0:
        ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.set_xticks(_ticks(grid.col_cuts, geo.plot_w * _DPI))
    last = grid.axes[-1]
    if xlabel:
        ax.set_xlabel(f'dim {last} (size {grid.layout.shape[last]})', fontsize=8, labelpad=1)
    if ndim == 1:
        ax.set_yticks([])
        return
    ax.set_yticks(_ticks(grid.row_cuts, geo.plot_h * _DPI))
    if ylabel:
        ax.set_ylabel(f'dim {grid.axes[0]} (size {nrows})', fontsize=8, labelpad=1)


# -- HTML parts -------------------------------------------------------------------------


def legend_html(layout: Layout, max_processes: int = MAX_LEGEND) -> str:
    """Hosts with their colour, bytes held and shard count (bounded)."""
    per_host = layout.bytes_per_process()
    shards: dict[int, int] = {}
    for s in layout.shards:
        shards[s.process_index] = shards.get(s.process_index, 0) + 1
    rows = []
    for p in sorted(per_host)[:max_processes]:
        rows.append(
            f'<tr class="mh-legend-host mh-host-{p}"><td>{swatch(p)} host {p}</td>'
            f'<td>{format_bytes(per_host[p])}</td><td>{shards.get(p, 0)}</td></tr>'
        )
    if len(per_host) > max_processes:
        rest = sorted(per_host)[max_processes:]
        sizes = [per_host[p] for p in rest]
        rows.append(
            f'<tr><td colspan="3">... {len(rest)} more hosts, '
            f'{format_bytes(min(sizes))} to {format_bytes(max(sizes))} each</td></tr>'
        )
    if any(len(b.process_indices) > 1 for b in layout.blocks()):
        rows.append(
            '<tr class="mh-legend-shared"><td colspan="3"><span class="mh-swatch" style="'
            'display:inline-block;width:0.9em;height:0.9em;vertical-align:middle;border:1px '
            f'solid #0003;background:{SHARED_COLOR}"></span> several hosts '
            '(see replicas)</td></tr>'
        )
    ratio = layout.stored_nbytes / layout.nbytes if layout.nbytes else 0
    foot = (
        f'{format_bytes(layout.stored_nbytes)} stored for {format_bytes(layout.nbytes)} '
        f'of data (x{ratio:.3g})'
    )
    if layout.num_processes > len(PALETTE):
        foot += f'; colours repeat every {len(PALETTE)} hosts'
    return (
        f'{CSS}<table class="mh-table mh-legend"><tr><th>host</th><th>bytes</th>'
        f'<th>shards</th></tr>{"".join(rows)}</table><div class="mh-legend-foot">'
        f'{esc(foot)}</div>'
    )


def header_html(layout: Layout, report: ReplicaReport | None) -> str:
    """The headline, block and replica counts, and the replica verdict."""
    blocks = layout.blocks()
    counts = sorted({b.replica_count for b in blocks})
    replicas = (
        str(counts[0]) if len(counts) == 1 else f'{counts[0]} to {counts[-1]}' if counts else '0'
    )
    text = (
        f'<b>{esc(layout.headline())}</b><br>{len(layout.shards)} shard(s) on '
        f'{len(set(layout.device_ids))} device(s) of {len(layout.processes)}/'
        f'{layout.num_processes} host(s); {len(blocks)} distinct block(s), '
        f'{replicas} replica(s) each'
    )
    if report is None:
        return CSS + text
    if not report.groups:
        verdict = banner('no block is replicated: nothing to compare', 'mh-ok')
    elif report.ok:
        verdict = banner(f'replicas agree ({len(report.groups)} replicated block(s))', 'mh-ok')
    else:
        bad = report.mismatches
        odd = ', '.join(layout.device_name(d) for d in report.odd_devices[:4])
        if len(report.odd_devices) > 4:
            odd += f', ... ({len(report.odd_devices)} in all)'
        verdict = banner(
            f'<b>replicas DIFFER</b> in {len(bad)} of {len(report.groups)} replicated block(s) '
            f'(undefined behaviour): odd {esc(fmt_hosts(report.odd_processes))}: {esc(odd)}; '
            'the replica matrix marks the odd replicas',
            'mh-flagged',
        )
    return CSS + text + verdict


def _group_text(layout: Layout, group: ReplicaGroup) -> str:
    """``'digest 1a2b… (majority) on host 0 · dev 0 (id 0), ...; digest ...'``."""
    parts = []
    for i, (digest, devices) in enumerate(group.digests.items()):
        names = ', '.join(layout.device_name(d) for d in devices[:4])
        if len(devices) > 4:
            names += f', ... ({len(devices)} in all)'
        tag = ' (majority)' if i == 0 and not group.tied else ''
        parts.append(f'{group_letter(i)}: digest {digest}{tag} on {names}')
    return '; '.join(parts)


def block_info_html(
    layout: Layout,
    index: Index,
    report: ReplicaReport | None = None,
    values: np.ndarray | None = None,
) -> str:
    """A block's shards (replica, device, bytes, digest) and values."""
    block = next((b for b in layout.blocks() if b.index == index), None)
    if block is None:
        raise ValueError(f'no block {format_index(index)} in this layout')
    group = None
    if report is not None:
        group = next((g for g in report.groups if g.index == index), None)
    digests = {r.device_id: r.digest for r in group.replicas} if group else {}
    letters = {d: group_letter(i) for i, d in enumerate(group.digests)} if group else {}
    odd = set(group.odd_devices) if group is not None and not group.ok else set()
    rows = []
    for s in block.shards:
        cls = ' class="mh-odd-host"' if s.device_id in odd else ''
        digest = digests.get(s.device_id, '')
        cell = (
            f'{letters[digest]}: {esc(digest)}' + (' (differs)' if s.device_id in odd else '')
            if digest
            else ''
        )
        rows.append(
            f'<tr{cls}><td>{s.replica_id}</td>'
            f'<td>{swatch(s.process_index)} {esc(layout.device_name(s.device_id))}</td>'
            f'<td>{format_bytes(s.nbytes)}</td>' + (f'<td>{cell}</td>' if group else '') + '</tr>'
        )
    head = (
        '<tr><th>replica</th><th>device</th><th>bytes</th>'
        + ('<th>digest</th>' if group else '')
        + '</tr>'
    )
    parts = [
        f'<b>block {esc(format_index(index))}</b> shape {block.shape}, '
        f'{format_bytes(block.nbytes)} per copy, {block.replica_count} replica(s) on '
        f'{esc(fmt_hosts(block.process_indices))}',
        f'<table class="mh-table mh-shards">{head}{"".join(rows)}</table>',
    ]
    if group is not None and not group.ok:
        parts.insert(
            1,
            banner(
                f'replicas differ in {esc(format_index(index))}: {esc(_group_text(layout, group))}',
                'mh-flagged',
            ),
        )
    if values is not None:
        part = values[tuple(slice(a, b) for a, b in index)]
        text = np.array2string(
            np.asarray(part), threshold=VALUES_THRESHOLD, edgeitems=3, max_line_width=100
        )
        parts.append(f'values (of the gathered array, shape {np.shape(part)}):' + pre(text))
    return CSS + '<div class="mh-block-info">' + ''.join(parts) + '</div>'


def _block_tooltip(b: GridBlock) -> str:
    """A button's tooltip: index, who holds it, replicas, verdict."""
    return (
        f'{format_index(b.index)}: {b.label}'
        + (f', x{b.replica_count}' if b.replica_count > 1 else '')
        + (f'; {b.odd_text}' if b.flagged else '')
        + (f'; {b.mark}' if b.mark else '')
    )


def _button_form(grid: LayoutGrid, facets: int) -> int:
    """Which label form (0 long, 1 short, 2 tiny) fits a facet's block buttons."""
    columns = max(len(grid.col_cuts) - 1, 1) * max(facets if facets > 1 else 1, 1)
    return 0 if columns <= 4 else 1 if columns <= 8 else 2


def _grid_columns(grid: LayoutGrid) -> str:
    """The CSS grid columns of a facet's blocks: one per block boundary interval."""
    return f'repeat({max(len(grid.col_cuts) - 1, 1)}, minmax(2.5em, auto))'


def blocks_html(facets: LayoutFacets, selected: Index | None = None) -> str:
    """The facets' blocks as static HTML: one ``mh-layout-block`` per block of each facet,
    placed like the buttons of the live widget (for pages without a kernel)."""
    parts = []
    n = len(facets.facets)
    if sum(len(f.grid.blocks) for f in facets.facets) > MAX_BUTTONS:
        return ''
    for f in facets.facets:
        grid = f.grid
        rows, cols = grid.row_cuts, grid.col_cuts
        form = _button_form(grid, n)
        cells = []
        for b in grid.blocks:
            cls = ['mh-layout-block', *(f'mh-host-{h}' for h in b.processes)]
            if b.replica_count > 1:
                cls.append('mh-layout-replicated')
            if b.flagged:
                cls.append('mh-flagged')
            if b.mark:
                cls.append('mh-marked')
            if b.index == selected:
                cls.append('mh-selected')
            style = (
                f'grid-row:{rows.index(b.rows[0]) + 1} / {rows.index(b.rows[1]) + 1};'
                f'grid-column:{cols.index(b.cols[0]) + 1} / {cols.index(b.cols[1]) + 1};'
                f'background:{b.fill};color:{text_color(b.fill)}'
            )
            label = b.labels[form] if b.labels else ''
            cells.append(
                f'<div class="{" ".join(cls)}" style="{style}" title="{esc(_block_tooltip(b))}">'
                f'{"⚠ " if b.flagged or b.mark else ""}{esc(label)}</div>'
            )
        title = f'<div class="mh-layout-facet-title">{esc(f.title)}</div>' if f.title else ''
        parts.append(
            f'<div class="mh-layout-facet">{title}<div class="mh-layout-facet-grid" '
            f'style="grid-template-columns:repeat({max(len(cols) - 1, 1)}, minmax(2.5em, auto))">'
            f'{"".join(cells)}</div></div>'
        )
    more = (
        f'<div class="mh-layout-facets-more">{esc(facets.more_text())}</div>' if facets.more else ''
    )
    return f'{CSS}<div class="mh-layout-facets">{"".join(parts)}</div>{more}'


# -- the widget -------------------------------------------------------------------------

_HINT = 'Select a block (a button or the list) to see its shards and values.'


class LayoutView(View):
    """Interactive layout picture: pick two axes, see the others as facets, select a block.

    Every block is drawn once: in its host's colour and named by its device
    (``'host 1 · dev 0 (id 2048)'``) when one host holds it, in grey when
    several hosts hold copies (``'8 replicas on hosts 0-3'``). Beside the
    picture, the replica matrix shows every replicated block against the
    devices holding it (with a `ReplicaReport`, cells coloured by digest and
    odd replicas marked), the mesh view shows the mesh's axes, devices and
    processes and which axes cross hosts, and the legend gives bytes per
    host. An array of rank 3 or more is shown as facets over the
    non-displayed axes (at most `MAX_FACETS`; sliders page through the rest).
    Every visible block also has a button that shows its shards and, with
    ``values``, its values.

    Args:
        layout: a `multihost.Layout` (``multihost.describe_layout(x)``), or a
            `multihost.ReplicaReport` (``multihost.check_replicas(x)``).
        report: a `ReplicaReport` of the same array, to flag blocks whose
            replicas disagree.
        values: the gathered global value (e.g. from ``%mh_allgather``), of
            the layout's shape, to show each block's values.
        axes: the axes to display first (default: the last two).
        marked: block index -> a note, for blocks to mark (hatched, buttons
            ``mh-marked``), e.g. the blocks holding NaN.

    Stable CSS classes: ``mh-layout`` (the whole view), ``mh-layout-header``,
    ``mh-layout-controls``, ``mh-layout-axis``, ``mh-layout-slider`` (and
    ``mh-layout-slider-<axis>``), ``mh-layout-image``, ``mh-layout-legend``,
    ``mh-layout-replicas`` (holding the table ``mh-replica-matrix``: cells
    ``mh-replica-cell``, ``mh-replica-odd``, ``mh-replica-empty``; see
    `replica_matrix_html`), ``mh-layout-mesh`` (holding ``mh-mesh-view``, see
    `mesh_html`), ``mh-layout-select``, ``mh-layout-blocks``,
    ``mh-layout-facet`` (one per facet shown, with ``mh-layout-facet-title``
    and ``mh-layout-facet-grid``), ``mh-layout-facets-more``,
    ``mh-layout-block`` (one button per block of each facet shown, also
    ``mh-host-<p>`` per host holding it, ``mh-layout-replicated``,
    ``mh-flagged``, ``mh-marked``, ``mh-selected``), ``mh-layout-info``. The static picture
    (`static_html`) keeps them, inside ``mh-layout-static``.
    """

    _grid: LayoutGrid  # the facet of the sliders' position, as `_render` drew it last
    _facets: LayoutFacets  # what `_render` drew last

    def __init__(
        self,
        layout: Layout | ReplicaReport,
        report: ReplicaReport | None = None,
        values: Any = None,
        *,
        axes: Sequence[int] | None = None,
        marked: Mapping[Index, str] | None = None,
    ):
        self._busy = False
        self._marked: Mapping[Index, str] = {}
        self._selected: Index | None = None
        self._sliders: list[widgets.IntSlider] = []
        self._buttons: dict[Index, widgets.Button] = {}  # the first button of each block
        self._all_buttons: list[tuple[Index, widgets.Button]] = []
        self._facet_boxes: list[widgets.Widget] = []
        self._layout: Layout | None = None

        self._header = add_classes(widgets.HTML(), 'mh-layout-header')
        self._rows = add_classes(widgets.Dropdown(description='rows'), 'mh-layout-axis')
        self._cols = add_classes(widgets.Dropdown(description='columns'), 'mh-layout-axis')
        for dd in (self._rows, self._cols):
            dd.layout.width = '14em'
            dd.style.description_width = '4.5em'
            dd.observe(self._on_axis, 'value')
        self._slider_box = widgets.HBox()
        self._image = add_classes(widgets.Image(format='png'), 'mh-layout-image')
        self._legend = add_classes(widgets.HTML(), 'mh-layout-legend')
        self._replicas = add_classes(widgets.HTML(), 'mh-layout-replicas')
        self._mesh = add_classes(widgets.HTML(), 'mh-layout-mesh')
        self._select = add_classes(widgets.Dropdown(description='block'), 'mh-layout-select')
        self._select.layout.width = '32em'
        self._select.observe(self._on_select, 'value')
        self._blocks = add_classes(widgets.GridBox(), 'mh-layout-blocks')
        self._info = add_classes(widgets.HTML(_HINT), 'mh-layout-info')
        controls = add_classes(
            widgets.HBox([self._rows, self._cols, self._slider_box]), 'mh-layout-controls'
        )
        controls.layout.flex_flow = 'row wrap'
        side = widgets.VBox([self._replicas, self._mesh, self._legend])
        picture = widgets.HBox([self._image, side])
        picture.layout.flex_flow = 'row wrap'
        picture.layout.align_items = 'flex-start'
        self.widget = add_classes(
            widgets.VBox([self._header, controls, picture, self._select, self._blocks, self._info]),
            'mh-layout',
        )
        self.update(layout, report, values, axes=axes, marked=marked)

    # -- public --

    @property
    def layout(self) -> Layout:
        """The layout shown."""
        if self._layout is None:  # only before __init__ has called update()
            raise RuntimeError('the LayoutView has no layout yet')
        return self._layout

    @property
    def report(self) -> ReplicaReport | None:
        """The replica report shown, if any."""
        return self._report

    @property
    def grid(self) -> LayoutGrid:
        """The plane at the sliders' position (axes, slice, visible blocks)."""
        return self._grid

    @property
    def facets(self) -> LayoutFacets:
        """The facets shown (one for a 0-d to 2-d array)."""
        return self._facets

    @property
    def matrix(self) -> ReplicaMatrix:
        """The replica matrix shown."""
        return self._matrix

    @property
    def selected(self) -> Index | None:
        """The index of the selected block, or None."""
        return self._selected

    def static_html(self) -> str:
        """The widget's picture: the blocks as HTML (not buttons); without a selection, no hint
        about buttons it does not have."""
        replace = {id(self._blocks): blocks_html(self._facets, self._selected)}
        if self._selected is None:
            replace[id(self._info)] = ''
        return f'<div class="mh-layout-static">{widget_html(self.widget, replace)}</div>'

    def text(self) -> str:
        """The layout's text (with the mesh), the replica matrix's and the replica report's."""
        parts = [str(self._layout)]
        matrix = replica_matrix_text(self._matrix)
        if matrix:
            parts.append(matrix)
        if self._report is not None:
            parts.append(str(self._report))
        return '\n'.join(parts)

    def update(
        self,
        layout: Layout | ReplicaReport,
        report: ReplicaReport | None = None,
        values: Any = None,
        *,
        axes: Sequence[int] | None = None,
        marked: Mapping[Index, str] | None = None,
    ) -> None:
        """Shows another layout (or the same one with a new report, values or marks).

        The displayed axes and slider positions are kept when the shape is
        the same, and so is the selection if the block still exists.
        """
        layout, report = _split(layout, report)
        if values is not None:
            values = np.asarray(values)
            if values.shape != layout.shape:
                raise ValueError(
                    f'values has shape {values.shape} but the layout describes an '
                    f'array of shape {layout.shape}'
                )
        same = self._layout is not None and self._layout.shape == layout.shape
        positions = [s.value for s in self._sliders] if same else [0] * layout.ndim
        if axes is None:
            axes = self._grid.axes if same else None
        axes = _normalize_axes(axes, layout.ndim)
        self._layout, self._report, self._values = layout, report, values
        self._marked = dict(marked or {})
        self._matrix = replica_matrix(layout, report)
        if self._selected is not None and all(b.index != self._selected for b in layout.blocks()):
            self._selected = None
        with self._hold():
            close_widgets(self._sliders)
            self._sliders = []
            for d, n in enumerate(layout.shape):
                s = add_classes(
                    widgets.IntSlider(
                        value=min(positions[d], max(n - 1, 0)),
                        min=0,
                        max=max(n - 1, 0),
                        description=f'dim {d}',
                        continuous_update=False,
                        disabled=n <= 1,
                    ),
                    'mh-layout-slider',
                    f'mh-layout-slider-{d}',
                )
                s.style.description_width = '3.5em'
                s.observe(self._on_slider, 'value')
                self._sliders.append(s)
            options = [(f'dim {d} ({n})', d) for d, n in enumerate(layout.shape)]
            show = 'flex' if layout.ndim >= 2 else 'none'
            for dd in (self._rows, self._cols):
                dd.layout.display = show
                dd.options = options if layout.ndim >= 2 else []
            if layout.ndim >= 2:
                self._rows.value, self._cols.value = axes
        self._axes = axes
        self._header.value = header_html(layout, report)
        self._legend.value = legend_html(layout)
        self._replicas.value = replica_matrix_html(self._matrix)
        self._replicas.layout.display = '' if self._matrix.rows else 'none'
        self._mesh.value = mesh_html(layout)
        self._mesh.layout.display = '' if self._mesh.value else 'none'
        self._render()

    def select(self, index: Index | GridBlock | LayoutBlock | None) -> None:
        """Selects a block (None clears), moving the sliders so that it is visible.

        Raises:
            ValueError: the layout has no block with this index.
        """
        if index is None:
            self._selected = None
            self._render_selection()
            return
        if isinstance(index, GridBlock | LayoutBlock):
            index = index.index
        try:
            index = tuple((int(a), int(b)) for a, b in index)
        except (TypeError, ValueError):
            raise TypeError(
                f'select expects a block index, ((start, stop), ...) per dimension, got {index!r}'
            ) from None
        if all(b.index != index for b in self.layout.blocks()):
            raise ValueError(
                f'the layout has no block {format_index(index)}; its blocks start '
                'at ' + ', '.join(format_index(b.index) for b in self.layout.blocks()[:6])
            )
        self._selected = index
        moved = False
        with self._hold():
            for d, _ in self._grid.fixed:
                a, b = index[d]
                if not a <= self._sliders[d].value < b and self.layout.shape[d]:
                    self._sliders[d].value = a
                    moved = True
        if moved:
            self._render()
        else:
            self._render_selection()

    # -- internals --

    @contextlib.contextmanager
    def _hold(self) -> Iterator[None]:
        """Programmatic widget changes inside do not trigger the observers."""
        busy, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = busy

    def _on_axis(self, change: dict[str, Any]) -> None:
        if self._busy:
            return
        rows, cols = self._rows.value, self._cols.value
        if rows == cols:  # picking the other dropdown's axis swaps the two
            with self._hold():
                if change['owner'] is self._rows:
                    self._cols.value = change['old']
                else:
                    self._rows.value = change['old']
            rows, cols = self._rows.value, self._cols.value
        self._axes = (rows, cols)
        self._render()

    def _on_slider(self, change: dict[str, Any]) -> None:
        if not self._busy:
            self._render()

    def _on_select(self, change: dict[str, Any]) -> None:
        if not self._busy:
            self.select(change['new'])

    def _render(self) -> None:
        """Everything that depends on the axes and the slice."""
        fixed = {d: s.value for d, s in enumerate(self._sliders) if d not in self._axes}
        self._facets = layout_facets(
            self.layout, self._axes, fixed, self._report, marked=self._marked
        )
        if self.layout.ndim <= 2:  # one facet: the plane itself
            self._grid = grid = self._facets.facets[0].grid
        else:
            self._grid = grid = layout_grid(
                self.layout, self._axes, fixed, self._report, marked=self._marked
            )
        if self._selected is not None and not any(
            f.grid.find(self._selected) for f in self._facets.facets
        ):
            self._selected = None
        self._slider_box.children = [self._sliders[d] for d, _ in grid.fixed]
        # every facet is drawn: the sliders only page through facets beyond MAX_FACETS
        self._slider_box.layout.display = 'flex' if self._facets.more else 'none'
        self._render_buttons()
        self._render_selection()

    def _render_buttons(self) -> None:
        """One button per block of each facet shown. A single untitled facet (a 0-d to 2-d
        array) is the block grid itself; several are one titled box each."""
        facets = self._facets
        close_widgets(self._facet_boxes)
        self._facet_boxes, self._buttons, self._all_buttons = [], {}, []
        seen: dict[Index, GridBlock] = {}
        for f in facets.facets:
            for b in f.grid.blocks:
                seen.setdefault(b.index, b)
        with self._hold():
            self._select.options = [
                (
                    f'{format_index(b.index)}  {b.label}'
                    + (f'  ({b.odd_text})' if b.flagged else '')
                    + (f'  ({b.mark})' if b.mark else ''),
                    b.index,
                )
                for b in seen.values()
            ]
        single = len(facets.facets) == 1 and not facets.facets[0].title
        for cls in ('mh-layout-facet', 'mh-layout-facet-grid'):
            if single:
                self._blocks.add_class(cls)
            else:
                self._blocks.remove_class(cls)
        if sum(len(f.grid.blocks) for f in facets.facets) > MAX_BUTTONS:
            self._blocks.children = []
            self._blocks.layout.display = 'none'
            return
        self._blocks.layout.display = 'grid'
        n = len(facets.facets)
        for f in facets.facets:
            buttons = [self._button(b, f.grid, _button_form(f.grid, n)) for b in f.grid.blocks]
            if single:
                self._facet_boxes = buttons
                self._blocks.layout.grid_template_columns = _grid_columns(f.grid)
                self._blocks.layout.grid_gap = '2px'
                break
            box = add_classes(widgets.GridBox(buttons), 'mh-layout-facet-grid')
            box.layout.grid_template_columns = _grid_columns(f.grid)
            box.layout.grid_gap = '2px'
            title = add_classes(widgets.HTML(f'<b>{esc(f.title)}</b>'), 'mh-layout-facet-title')
            self._facet_boxes.append(add_classes(widgets.VBox([title, box]), 'mh-layout-facet'))
        if not single:
            self._blocks.layout.grid_template_columns = (
                f'repeat({min(n, _MAX_FACET_COLUMNS)}, max-content)'
            )
            self._blocks.layout.grid_gap = '8px 16px'
        if facets.more:
            more = add_classes(widgets.HTML(esc(facets.more_text())), 'mh-layout-facets-more')
            more.layout.grid_column = '1 / -1'
            # spans every column without widening any: no width of its own for the tracks
            more.layout.width, more.layout.min_width = '0', '100%'
            self._facet_boxes.append(more)
        self._blocks.children = list(self._facet_boxes)

    def _button(self, b: GridBlock, grid: LayoutGrid, form: int) -> widgets.Button:
        rows, cols = grid.row_cuts, grid.col_cuts
        button = widgets.Button(
            description=('⚠ ' if b.flagged or b.mark else '')
            + (b.labels[form] if b.labels else ''),
            tooltip=_block_tooltip(b),
            layout=widgets.Layout(
                width='auto',
                height='auto',
                min_height='28px',
                grid_row=f'{rows.index(b.rows[0]) + 1} / {rows.index(b.rows[1]) + 1}',
                grid_column=f'{cols.index(b.cols[0]) + 1} / {cols.index(b.cols[1]) + 1}',
            ),
        )
        button.style.button_color = b.fill
        button.style.text_color = text_color(b.fill)
        add_classes(button, 'mh-layout-block', *(f'mh-host-{h}' for h in b.processes))
        if b.replica_count > 1:
            button.add_class('mh-layout-replicated')
        if b.flagged:
            button.add_class('mh-flagged')
            button.layout.border = f'3px solid {FLAGGED_EDGE}'
        if b.mark:
            button.add_class('mh-marked')
            button.layout.border = '3px dashed #000000'
        button.on_click(lambda _b, index=b.index: self.select(index))
        self._buttons.setdefault(b.index, button)
        self._all_buttons.append((b.index, button))
        return button

    def _render_selection(self) -> None:
        """What depends on the selection: the outline, the buttons, the list, the info."""
        self._image.value = render_layout_png(self._facets, selected=self._selected)
        for index, button in self._all_buttons:
            if index == self._selected:
                button.add_class('mh-selected')
                button.style.font_weight = 'bold'
            else:
                button.remove_class('mh-selected')
                button.style.font_weight = ''
        with self._hold():
            self._select.value = self._selected
        if self._selected is None:
            self._info.value = _HINT
        else:
            self._info.value = block_info_html(
                self.layout, self._selected, self._report, self._values
            )


# -- a whole pytree ---------------------------------------------------------------------

_TREE_HEAD = ('leaf', 'shape', 'dtype', 'spec', 'bytes per host', 'replicas')
_TREE_CSS = """<style>
.mh-tree-layout .mh-tree-leaf {text-align:left;font-family:var(--jp-code-font-family,monospace);
  font-size:12px}
.mh-tree-layout .mh-tree-cell {font-family:var(--jp-code-font-family,monospace);font-size:12px;
  align-self:center}
.mh-tree-cell.mh-replicas-agree {color:#1a7f1a} .mh-tree-cell.mh-replicas-differ {color:#d62728;
  font-weight:bold}
tr.mh-tree-row.mh-selected td {font-weight:bold}
</style>"""
#: Leaves shown as rows (widget and picture); the rest are counted (name a subtree for them).
MAX_TREE_ROWS = 200


def _tree_more(tree: TreeLayout) -> str:
    more = len(tree.leaves) - MAX_TREE_ROWS
    if more <= 0:
        return ''
    return (
        f'... {more} more leaves (of {len(tree.leaves)}); name a subtree to see them, e.g. '
        f'%mh_layout {tree.name}{tree.leaves[MAX_TREE_ROWS].path}'
    )


_TREE_HINT = 'Click a leaf to see its layout picture.'


def _replicas_class(leaf: LeafLayout) -> str:
    ok = leaf.replicas_ok
    return 'mh-replicas-differ' if ok is False else 'mh-replicas-agree' if ok else ''


def tree_layout_html(tree: TreeLayout, selected: str | None = None) -> str:
    """The tree's table as static HTML: one ``mh-tree-row`` per leaf (``mh-selected`` on
    ``selected``), cells ``mh-tree-cell``; a row whose replicas differ is ``mh-flagged``."""
    head = ''.join(f'<th>{esc(h)}</th>' for h in _TREE_HEAD)
    rows = []
    for leaf, cells in zip(tree.leaves[:MAX_TREE_ROWS], tree.rows()):
        cls = ['mh-tree-row']
        if leaf.replicas_ok is False:
            cls.append('mh-flagged')
        if leaf.path == selected:
            cls.append('mh-selected')
        tds = ''.join(
            f'<td class="mh-tree-cell{" " + _replicas_class(leaf) if i == 5 else ""}">'
            f'{"<code>" + esc(c) + "</code>" if i == 0 else esc(c)}</td>'
            for i, c in enumerate(cells)
        )
        rows.append(f'<tr class="{" ".join(cls)}" data-path="{esc(leaf.path)}">{tds}</tr>')
    return (
        f'{CSS}{_TREE_CSS}<div class="mh-tree-layout-head"><b>{esc(tree.headline())}</b></div>'
        f'<table class="mh-table mh-tree-layout-table"><tr>{head}</tr>{"".join(rows)}</table>'
        + (f'<div class="mh-tree-more">{esc(_tree_more(tree))}</div>' if _tree_more(tree) else '')
    )


class TreeLayoutView(View):
    """The layout of a whole pytree: one row per leaf; click a leaf for its layout picture.

    The table gives each leaf's path, shape, dtype, partition spec (or the
    sharding's kind), bytes per host and whether its replicas agree (rows
    whose replicas differ are flagged). A click on a leaf (its button in the
    first column) shows that leaf's `LayoutView` below the table. At most
    `MAX_TREE_ROWS` leaves are rows; the rest are counted (``mh-tree-more``).

    Args:
        tree: a `multihost.TreeLayout` (what ``%mh_layout TREE`` and
            `Session.layout` of a pytree return).
        values: optional ``path -> gathered value`` callback, asked when a
            leaf is shown so its blocks show their values (None: pictures only).

    Stable CSS classes: ``mh-tree-layout`` (the view), ``mh-tree-layout-head``,
    ``mh-tree-layout-table`` (a grid: header cells ``mh-tree-head``, then per
    leaf a ``mh-tree-leaf`` button, also ``mh-tree-row-<i>`` and ``mh-selected``
    once chosen, and cells ``mh-tree-cell``, the replicas cell
    ``mh-replicas-agree`` or ``mh-replicas-differ``), ``mh-tree-leaf-view``
    (holding the chosen leaf's ``mh-layout``). The static picture is an HTML
    table (`tree_layout_html`: rows ``mh-tree-row``) inside ``mh-tree-layout-static``.
    """

    def __init__(self, tree: TreeLayout, *, values: Any = None):
        self._values_of = values
        self._selected: str | None = None
        self._leaf_view: LayoutView | None = None
        self._buttons: dict[str, widgets.Button] = {}
        self._head = add_classes(widgets.HTML(), 'mh-tree-layout-head')
        self._table = add_classes(widgets.GridBox(), 'mh-tree-layout-table')
        self._table.layout.grid_template_columns = 'repeat(6, max-content)'
        self._table.layout.grid_gap = '1px 12px'
        self._table.layout.max_height = '32em'
        self._table.layout.overflow = 'auto'
        self._more = add_classes(widgets.HTML(), 'mh-tree-more')
        self._hint = add_classes(widgets.HTML(_TREE_HINT), 'mh-tree-hint')
        self._leaf_box = add_classes(widgets.VBox(), 'mh-tree-leaf-view')
        self.widget = add_classes(
            widgets.VBox([self._head, self._table, self._more, self._hint, self._leaf_box]),
            'mh-tree-layout',
        )
        self.update(tree)

    @property
    def tree(self) -> TreeLayout:
        """The tree layout shown."""
        return self._tree

    @property
    def selected(self) -> str | None:
        """The path of the leaf shown below the table, or None."""
        return self._selected

    @property
    def leaf_view(self) -> LayoutView | None:
        """The chosen leaf's `LayoutView`, or None."""
        return self._leaf_view

    def update(self, tree: TreeLayout) -> None:
        """Shows another tree layout (the chosen leaf is kept if the new tree has it)."""
        self._tree = tree
        self._head.value = CSS + _TREE_CSS + f'<b>{esc(tree.headline())}</b>'
        close_widgets(self._table.children)
        self._buttons = {}
        cells: list[widgets.Widget] = [
            add_classes(widgets.HTML(f'<b>{esc(h)}</b>'), 'mh-tree-head') for h in _TREE_HEAD
        ]
        for i, (leaf, row) in enumerate(zip(tree.leaves[:MAX_TREE_ROWS], tree.rows())):
            button = add_classes(
                widgets.Button(
                    description=leaf.path,
                    tooltip=f'{tree.name}{leaf.path}: show its layout',
                    disabled=leaf.layout is None,
                    layout=widgets.Layout(width='auto'),
                ),
                'mh-tree-leaf',
                f'mh-tree-row-{i}',
            )
            if leaf.replicas_ok is False:
                button.add_class('mh-flagged')
                button.style.button_color = '#ffd6d6'
            button.on_click(lambda _b, path=leaf.path: self.select(path))
            self._buttons[leaf.path] = button
            cells.append(button)
            for j, text in enumerate(row[1:], start=1):
                cell = add_classes(widgets.HTML(esc(text)), 'mh-tree-cell', f'mh-tree-row-{i}')
                if j == 5 and _replicas_class(leaf):
                    cell.add_class(_replicas_class(leaf))
                cells.append(cell)
        self._table.children = cells
        self._more.value = esc(_tree_more(tree))
        self._more.layout.display = '' if self._more.value else 'none'
        keep = self._selected
        self._selected = None
        if keep is not None and any(leaf.path == keep for leaf in tree.leaves):
            self.select(keep)
        else:
            self._show(None)

    def select(self, path: str | None) -> None:
        """Shows the layout of the leaf at ``path`` below the table (None: none).

        Raises:
            KeyError: the tree has no such leaf; ValueError: the leaf is not an array.
        """
        if path is not None:
            leaf = self._tree.leaf(path)
            if leaf.layout is None:
                raise ValueError(f'{self._tree.name}{path} is {leaf.note}: it has no layout')
        self._selected = path
        for p, button in self._buttons.items():
            if p == path:
                button.add_class('mh-selected')
                button.style.font_weight = 'bold'
            else:
                button.remove_class('mh-selected')
                button.style.font_weight = ''
        self._show(path)

    def _show(self, path: str | None) -> None:
        if self._leaf_view is not None:
            self._leaf_view.close()
            self._leaf_view = None
        if path is None:
            self._leaf_box.children = []
            self._hint.layout.display = ''
            return
        leaf = self._tree.leaf(path)
        assert leaf.layout is not None
        values, errors = None, list[str]()
        if self._values_of is not None:
            ok, values = run_action(lambda: self._values_of(path), 'its values', errors.append)
        note = f'({errors[0]})' if errors else ''
        self._leaf_view = LayoutView(leaf.layout, leaf.report, values)
        title = add_classes(
            widgets.HTML(f'<b>{esc(self._tree.name)}{esc(path)}</b> {esc(note)}'),
            'mh-tree-leaf-title',
        )
        self._leaf_box.children = [title, self._leaf_view.widget]
        self._hint.layout.display = 'none'

    def static_html(self) -> str:
        """The table as HTML rows, then the chosen leaf's static picture."""
        leaf = self._leaf_view.static_html() if self._leaf_view is not None else ''
        return (
            f'<div class="mh-tree-layout-static">'
            f'{tree_layout_html(self._tree, self._selected)}{leaf}</div>'
        )

    def text(self) -> str:
        """The tree's table as text, then the chosen leaf's layout."""
        parts = [str(self._tree)]
        if self._leaf_view is not None:
            parts.append(f'{self._tree.name}{self._selected}:\n{self._leaf_view.text()}')
        return '\n'.join(parts)
