"""The layout visualizer: which device and host holds which block of an array.

Model to picture in three pure steps, each testable without a widget:

* `layout_grid` picks the two displayed axes and a position along every
  other axis, and returns the visible blocks as rectangles of the displayed
  plane, with their hosts, device ids, replica counts and replica verdicts;
* `render_layout_png` draws a `LayoutGrid` with matplotlib (Agg, no pyplot
  state), so the picture works in JupyterLab, Voila and a static export;
* `LayoutView` wires them to ipywidgets: axis dropdowns, one slider per
  other axis, a legend with bytes per host, and one button per visible
  block (coloured by host) that shows the block's shards and values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
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
    swatch,
    text_color,
    widget_html,
)
from multihost import Layout, LayoutBlock, ReplicaGroup, ReplicaReport
from multihost._layout import Index, format_bytes, format_index
from multihost._text import fmt_hosts

#: More visible blocks than this: no button grid, the block list only.
MAX_BUTTONS = 256
#: Hosts listed in the legend; the rest are summarised.
MAX_LEGEND = 32
#: More visible blocks than this: the picture draws no labels.
MAX_LABELS = 400
#: Stripes drawn for a block held by several hosts.
MAX_STRIPES = 8
#: Elements of a block's values printed in full (``np.array2string`` threshold).
VALUES_THRESHOLD = 200
#: Device ids spelled out in a block's label.
_MAX_LABEL_IDS = 4


def _device_label(device_ids: Sequence[int | None]) -> str:
    """``(0, 1)`` -> ``'0,1'``; long lists are cut: ``'0,1,2,3,+12'``; host memory: ``'host'``."""
    names = ['host' if d is None else str(d) for d in device_ids]
    if len(names) > _MAX_LABEL_IDS:
        return ','.join(names[:_MAX_LABEL_IDS]) + f',+{len(names) - _MAX_LABEL_IDS}'
    return ','.join(names)


@dataclasses.dataclass(frozen=True)
class GridBlock:
    """One block of a layout as drawn in the displayed plane.

    Attributes:
        block: the `multihost.LayoutBlock` (its index and every replica).
        rows: ``(start, stop)`` along the row axis (``(0, 1)`` for a 0-d or
            1-d array).
        cols: ``(start, stop)`` along the column axis (``(0, 1)`` for a 0-d array).
        processes: sorted processes holding the block; each gets a stripe of its colour.
        flagged: whether the block's replicas differ (from a `ReplicaReport`).
        odd_devices: devices whose replica differs from the block's majority.
        mark: why the caller marked the block (``layout_grid(marked=...)``,
            e.g. ``'3 NaN, 0 Inf on device 5'``); ``''`` when not marked.
            Marked blocks are drawn like flagged ones.
    """

    block: LayoutBlock
    rows: tuple[int, int]
    cols: tuple[int, int]
    processes: tuple[int, ...]
    flagged: bool = False
    odd_devices: tuple[int | None, ...] = ()
    mark: str = ''

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
    def label(self) -> str:
        """The device ids, short: ``'0,1'``."""
        return _device_label(self.device_ids)


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


def _normalize_axes(axes: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if ndim == 0:
        if axes not in (None, ()):
            raise ValueError(f'a 0-d array has no axes to display, got axes={axes!r}')
        return ()
    if axes is None:
        return (0,) if ndim == 1 else (0, 1)
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
        axes: ``(row_axis, column_axis)`` to display (default ``(0, 1)``);
            a 1-d array shows axis 0 as one row, a 0-d array one block.
            Negative axes count from the end.
        fixed: position (element index) along every other axis; default 0.
            A block is visible when it contains the position along each of them.
        report: a `multihost.ReplicaReport` of the same array: blocks whose
            replicas differ are flagged.
        marked: block index -> a note, for blocks to mark (drawn like
            flagged ones), e.g. those holding NaN (`multihost.NonfiniteLeaf.marked`).

    Returns:
        A `LayoutGrid`.

    Raises:
        ValueError: invalid axes, a position outside its axis, or a position
            given for a displayed axis.
    """
    layout, report = _split(layout, report)
    ndim = layout.ndim
    axes = _normalize_axes(axes, ndim)
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


# -- the picture ------------------------------------------------------------------------

_DPI = 100
_PLOT_FRACTION = 0.84  # of the figure's width (the rest: the y labels' margin)
_LEFT = 0.1  # the plot's left edge, as a fraction of the figure's width
_TITLE_IN, _XLABEL_IN, _NO_XLABEL_IN = 0.55, 0.5, 0.15  # margins (inches)
_ASPECT_0D, _ASPECT_1D = 0.3, 0.12  # plot height / width of a scalar, a vector
_ASPECT_MIN, _ASPECT_MAX = 0.2, 1.25  # bounds of a 2-d plot's height / width
_MAX_TITLE_CHARS = 95
_THIN_OUTLINES_ABOVE = 64  # blocks: beyond this many, outlines get thinner
_CHAR_PX, _LINE_PX, _LABEL_PAD_PX = 6.2, 12, 4  # 8-pt text: width per char, line height
_MAX_TICKS = 17


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Figure and plot size (inches) for a grid, and pixels per array element."""

    fig_w: float
    fig_h: float
    plot_w: float
    plot_h: float
    bottom: float

    @classmethod
    def of(cls, grid: LayoutGrid, width: int) -> _Geometry:
        ndim = grid.layout.ndim
        nrows, ncols = grid.extent
        if ndim == 0:
            ratio = _ASPECT_0D
        elif ndim == 1:
            ratio = _ASPECT_1D
        else:
            ratio = min(_ASPECT_MAX, max(_ASPECT_MIN, nrows / max(ncols, 1)))
        plot_w = width / _DPI * _PLOT_FRACTION
        plot_h = plot_w * ratio
        bottom = _XLABEL_IN if ndim else _NO_XLABEL_IN
        return cls(width / _DPI, plot_h + _TITLE_IN + bottom, plot_w, plot_h, bottom)

    def pixels_per_element(self, grid: LayoutGrid) -> tuple[float, float]:
        nrows, ncols = grid.extent
        return self.plot_w * _DPI / max(ncols, 1), self.plot_h * _DPI / max(nrows, 1)


def render_layout_png(
    grid: LayoutGrid | Layout | ReplicaReport, *, selected: Index | None = None, width: int = 640
) -> bytes:
    """Draws a layout grid as a PNG: blocks coloured by host, labelled with device ids.

    A block held by several hosts is striped in their colours; a block whose
    replicas differ is cross-hatched and marked ``!``; the selected block is
    outlined. Labels are drawn only where they fit. Uses matplotlib's Agg
    canvas directly (no pyplot, no global backend switch).

    Args:
        grid: a `LayoutGrid` (from `layout_grid`), or a layout or replica
            report (shown with the default axes and slice).
        selected: the index of a block to outline.
        width: the image's width in pixels.

    Returns:
        The PNG file's bytes.
    """
    from matplotlib.figure import Figure

    if not isinstance(grid, LayoutGrid):
        grid = layout_grid(grid)
    geo = _Geometry.of(grid, width)
    fig = Figure(figsize=(geo.fig_w, geo.fig_h), dpi=_DPI)
    ax = fig.add_axes((_LEFT, geo.bottom / geo.fig_h, _PLOT_FRACTION, geo.plot_h / geo.fig_h))
    nrows, ncols = grid.extent
    ax.set_xlim(0, max(ncols, 1))
    ax.set_ylim(max(nrows, 1), 0)  # row 0 at the top, as numpy prints
    headline = grid.layout.headline()
    if len(headline) > _MAX_TITLE_CHARS:
        headline = headline[: _MAX_TITLE_CHARS - 3] + '...'
    fig.suptitle(f'{headline}\n{grid.describe()}', fontsize=8, y=1 - 0.06 / geo.fig_h)
    _draw_blocks(ax, grid, selected)
    if len(grid.blocks) <= MAX_LABELS:
        _draw_labels(ax, grid, geo)
    _draw_axes(ax, grid)
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=_DPI)
    return buf.getvalue()


def _draw_blocks(ax: Any, grid: LayoutGrid, selected: Index | None) -> None:
    """Fills (striped by host), white outlines, hatching of flagged blocks, the selection."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    fills, fill_colors, outlines, flagged = [], [], [], []
    for b in grid.blocks:
        (y0, y1), (x0, x1) = b.rows, b.cols
        hosts = b.processes[:MAX_STRIPES] or (0,)
        step = (x1 - x0) / len(hosts)
        for j, h in enumerate(hosts):
            fills.append(Rectangle((x0 + j * step, y0), step, y1 - y0))
            fill_colors.append(host_color(h))
        outlines.append(Rectangle((x0, y0), x1 - x0, y1 - y0))
        if b.flagged or b.mark:
            flagged.append(Rectangle((x0, y0), x1 - x0, y1 - y0))
    ax.add_collection(PatchCollection(fills, facecolors=fill_colors, edgecolors='none'))
    thin = len(grid.blocks) > _THIN_OUTLINES_ABOVE
    ax.add_collection(
        PatchCollection(
            outlines, facecolors='none', edgecolors='white', linewidths=0.5 if thin else 1.5
        )
    )
    if flagged:
        ax.add_collection(
            PatchCollection(
                flagged, facecolors='none', edgecolors='black', hatch='x', linewidths=2.0
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
                linewidth=3.0,
                linestyle='--',
            )
        )


def _label_lines(b: GridBlock, w_px: float, h_px: float) -> list[str] | None:
    """The most informative label that fits the block ('dev 0,1' + 'x2', then '0,1'), or None."""
    mark = '! ' if b.flagged or b.mark else ''
    copies = [f'x{b.replica_count}'] if b.replica_count > 1 else []
    for lines in ([f'{mark}dev {b.label}'] + copies, [mark + b.label] + copies, [mark + b.label]):
        fits_w = w_px >= _CHAR_PX * max(len(s) for s in lines) + _LABEL_PAD_PX
        if fits_w and h_px >= _LINE_PX * len(lines) + 2:
            return lines
    return None


def _draw_labels(ax: Any, grid: LayoutGrid, geo: _Geometry) -> None:
    """Device labels where they fit; boxed on hatching or multi-colour stripes."""
    px_x, px_y = geo.pixels_per_element(grid)
    for b in grid.blocks:
        lines = _label_lines(b, (b.cols[1] - b.cols[0]) * px_x, (b.rows[1] - b.rows[0]) * px_y)
        if lines is None:
            continue
        boxed = bool(b.flagged or b.mark) or len(b.processes) > 1
        color = '#000000' if boxed else text_color(host_color(b.processes[0] if b.processes else 0))
        ax.text(
            (b.cols[0] + b.cols[1]) / 2,
            (b.rows[0] + b.rows[1]) / 2,
            '\n'.join(lines),
            ha='center',
            va='center',
            fontsize=8,
            linespacing=1.1,
            color=color,
            bbox=dict(facecolor='white', alpha=0.85, edgecolor='none', pad=1.5) if boxed else None,
        )


def _draw_axes(ax: Any, grid: LayoutGrid) -> None:
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
    ax.tick_params(labelsize=7, length=2)
    if ndim == 0:
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if len(grid.col_cuts) <= _MAX_TICKS:
        ax.set_xticks(grid.col_cuts)
    last = grid.axes[-1]
    ax.set_xlabel(f'dim {last} (size {grid.layout.shape[last]})', fontsize=8, labelpad=1)
    if ndim == 1:
        ax.set_yticks([])
        return
    if len(grid.row_cuts) <= _MAX_TICKS:
        ax.set_yticks(grid.row_cuts)
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
        verdict = banner(
            f'<b>replicas DIFFER</b> in {len(bad)} of {len(report.groups)} replicated block(s) '
            f'(undefined behaviour): odd {esc(fmt_hosts(report.odd_processes))}, odd device(s) '
            f'{esc(", ".join(map(str, report.odd_devices)))}; flagged blocks are hatched',
            'mh-flagged',
        )
    return CSS + text + verdict


def block_info_html(
    layout: Layout,
    index: Index,
    report: ReplicaReport | None = None,
    values: np.ndarray | None = None,
) -> str:
    """A block's shard info (index, devices, processes, replica ids, bytes) and values."""
    block = next((b for b in layout.blocks() if b.index == index), None)
    if block is None:
        raise ValueError(f'no block {format_index(index)} in this layout')
    group = None
    if report is not None:
        group = next((g for g in report.groups if g.index == index), None)
    digests = {r.device_id: r.digest for r in group.replicas} if group else {}
    odd = set(group.odd_devices) if group is not None and not group.ok else set()
    rows = []
    for s in block.shards:
        cls = ' class="mh-odd-host"' if s.device_id in odd else ''
        device = 'host memory' if s.device_id is None else s.device_id
        digest = esc(digests.get(s.device_id, '')) + (' (differs)' if s.device_id in odd else '')
        rows.append(
            f'<tr{cls}><td>{s.replica_id}</td><td>{device}</td>'
            f'<td>{swatch(s.process_index)} {s.process_index}</td>'
            f'<td>{format_bytes(s.nbytes)}</td>' + (f'<td>{digest}</td>' if group else '') + '</tr>'
        )
    head = (
        '<tr><th>replica</th><th>device</th><th>process</th><th>bytes</th>'
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
        parts.insert(1, banner(f'replicas differ: {esc(group.describe())}', 'mh-flagged'))
    if values is not None:
        part = values[tuple(slice(a, b) for a, b in index)]
        text = np.array2string(
            np.asarray(part), threshold=VALUES_THRESHOLD, edgeitems=3, max_line_width=100
        )
        parts.append(f'values (of the gathered array, shape {np.shape(part)}):' + pre(text))
    return CSS + '<div class="mh-block-info">' + ''.join(parts) + '</div>'


# -- the widget -------------------------------------------------------------------------

_HINT = 'Select a block (a button or the list) to see its shards and values.'


class LayoutView(View):
    """Interactive layout picture: pick two axes, slide along the others, select a block.

    Blocks are coloured by host and labelled with device ids; the legend
    gives bytes per host; with a `ReplicaReport`, blocks whose replicas
    differ are hatched. Every visible block also has a button (coloured by
    host) that shows its shard info and, with ``values``, its values.

    Args:
        layout: a `multihost.Layout` (``multihost.describe_layout(x)``), or a
            `multihost.ReplicaReport` (``multihost.check_replicas(x)``).
        report: a `ReplicaReport` of the same array, to flag blocks whose
            replicas disagree.
        values: the gathered global value (e.g. from ``%mh_allgather``), of
            the layout's shape, to show each block's values.
        axes: the axes to display first (default ``(0, 1)``).
        marked: block index -> a note, for blocks to mark (hatched like
            flagged ones, buttons ``mh-marked``), e.g. the blocks holding NaN.

    Stable CSS classes: ``mh-layout`` (the whole view), ``mh-layout-header``,
    ``mh-layout-controls``, ``mh-layout-axis``, ``mh-layout-slider`` (and
    ``mh-layout-slider-<axis>``), ``mh-layout-image``, ``mh-layout-legend``,
    ``mh-layout-select``, ``mh-layout-blocks``, ``mh-layout-block`` (one
    button per visible block, also ``mh-host-<p>`` per host holding it,
    ``mh-flagged``, ``mh-marked``, ``mh-selected``), ``mh-layout-info``.
    """

    _grid: LayoutGrid  # what `_render` drew last

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
        self._buttons: dict[Index, widgets.Button] = {}
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
        self._select = add_classes(widgets.Dropdown(description='block'), 'mh-layout-select')
        self._select.layout.width = '32em'
        self._select.observe(self._on_select, 'value')
        self._blocks = add_classes(widgets.GridBox(), 'mh-layout-blocks')
        self._info = add_classes(widgets.HTML(_HINT), 'mh-layout-info')
        controls = add_classes(
            widgets.HBox([self._rows, self._cols, self._slider_box]), 'mh-layout-controls'
        )
        controls.layout.flex_flow = 'row wrap'
        self.widget = add_classes(
            widgets.VBox(
                [
                    self._header,
                    controls,
                    widgets.HBox([self._image, self._legend]),
                    self._select,
                    self._blocks,
                    self._info,
                ]
            ),
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
        """What is displayed now (axes, slice, visible blocks)."""
        return self._grid

    @property
    def selected(self) -> Index | None:
        """The index of the selected block, or None."""
        return self._selected

    def static_html(self) -> str:
        """The widget's picture; without a selection, no hint about buttons it does not have."""
        hide = {} if self._selected is not None else {id(self._info): ''}
        return widget_html(self.widget, hide)

    def text(self) -> str:
        """The layout's text (and the replica report's), as `str(layout)` prints it."""
        if self._report is None:
            return str(self._layout)
        return f'{self._layout}\n{self._report}'

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
        self._grid = grid = layout_grid(
            self.layout, self._axes, fixed, self._report, marked=self._marked
        )
        if self._selected is not None and grid.find(self._selected) is None:
            self._selected = None
        self._slider_box.children = [self._sliders[d] for d, _ in grid.fixed]
        self._header.value = header_html(self.layout, self._report)
        self._legend.value = legend_html(self.layout)
        self._render_buttons()
        self._render_selection()

    def _render_buttons(self) -> None:
        grid = self._grid
        close_widgets(self._buttons.values())
        self._buttons = {}
        with self._hold():
            self._select.options = [
                (
                    f'{format_index(b.index)}  devices {b.label}  on '
                    f'{fmt_hosts(b.processes)}{"  (replicas differ)" if b.flagged else ""}'
                    + (f'  ({b.mark})' if b.mark else ''),
                    b.index,
                )
                for b in grid.blocks
            ]
        if len(grid.blocks) > MAX_BUTTONS:
            self._blocks.children = []
            self._blocks.layout.display = 'none'
            return
        self._blocks.layout.display = 'grid'
        self._blocks.layout.grid_template_columns = (
            f'repeat({max(len(grid.col_cuts) - 1, 1)}, minmax(3em, auto))'
        )
        self._blocks.layout.grid_gap = '2px'
        rows, cols = grid.row_cuts, grid.col_cuts
        for b in grid.blocks:
            color = host_color(b.processes[0] if b.processes else 0)
            button = widgets.Button(
                description=('⚠ ' if b.flagged or b.mark else '') + b.label,
                tooltip=(
                    f'{format_index(b.index)}: devices {b.label} on {fmt_hosts(b.processes)}, '
                    f'x{b.replica_count}'
                    + (', replicas differ' if b.flagged else '')
                    + (f', {b.mark}' if b.mark else '')
                ),
                layout=widgets.Layout(
                    width='auto',
                    height='auto',
                    min_height='28px',
                    grid_row=f'{rows.index(b.rows[0]) + 1} / {rows.index(b.rows[1]) + 1}',
                    grid_column=f'{cols.index(b.cols[0]) + 1} / {cols.index(b.cols[1]) + 1}',
                ),
            )
            button.style.button_color = color
            button.style.text_color = text_color(color)
            add_classes(button, 'mh-layout-block', *(f'mh-host-{h}' for h in b.processes))
            if b.flagged:
                button.add_class('mh-flagged')
            if b.mark:
                button.add_class('mh-marked')
            if b.flagged or b.mark:
                button.layout.border = '3px dashed #000000'
            button.on_click(lambda _b, index=b.index: self.select(index))
            self._buttons[b.index] = button
        self._blocks.children = list(self._buttons.values())

    def _render_selection(self) -> None:
        """What depends on the selection: the outline, the buttons, the list, the info."""
        self._image.value = render_layout_png(self._grid, selected=self._selected)
        for index, button in self._buttons.items():
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
