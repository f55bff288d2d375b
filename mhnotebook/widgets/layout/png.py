"""The layout picture: `render_layout_png` draws the facets with matplotlib.

Agg canvas directly (no pyplot state), so the picture works in JupyterLab,
Voila and a static export. Labels are drawn only where they fit, in one form
for the whole grid.
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

from mhnotebook.widgets._common import text_color
from mhnotebook.widgets.layout.facets import MAX_FACET_COLUMNS, Facet, LayoutFacets, layout_facets
from mhnotebook.widgets.layout.grid import FLAGGED_EDGE, GridBlock, LayoutGrid
from multihost._models import Layout, ReplicaReport
from multihost._models._layout import Index

#: More visible blocks than this: the picture draws no labels.
MAX_LABELS = 400
_DPI = 100
_PLOT_FRACTION = 0.84  # of the figure's width (the rest: the y labels' margin)
_LEFT = 0.1  # the plot's left edge, as a fraction of the figure's width
_TITLE_IN, _XLABEL_IN, _NO_XLABEL_IN = 0.55, 0.5, 0.15  # margins (inches)
_FACET_TITLE_IN, _FACET_TICKS_IN, _FACET_GAP_IN = 0.24, 0.22, 0.32  # facet margins (inches)
_MORE_IN = 0.3  # the "+N more facets" line
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
        columns = 1 if n == 1 else min(n, MAX_FACET_COLUMNS)
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
    (``'process 1 · dev 0 (id 2048)'``); a block held by several hosts is drawn
    once in a neutral grey (``'8 replicas on processes 0-3'``; which replica is
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

    fills = [_rect(b) for b in grid.blocks]
    colors = [b.fill for b in grid.blocks]
    flagged = [_rect(b) for b in grid.blocks if b.flagged]
    marked = [_rect(b) for b in grid.blocks if b.mark]
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
        ax.add_patch(
            _rect(chosen, facecolor='none', edgecolor='black', linewidth=2.5, linestyle='--')
        )


def _rect(b: GridBlock, **style: Any) -> Any:
    """The block's rectangle in a facet's plot (x: its columns, y: its rows)."""
    from matplotlib.patches import Rectangle

    (y0, y1), (x0, x1) = b.rows, b.cols
    return Rectangle((x0, y0), x1 - x0, y1 - y0, **style)


def _label_candidates(b: GridBlock) -> list[list[str]]:
    """A block's labels, most informative first.

    Long (``'process 1 · dev 0 (id 2048)'``), then short (``'process 1 · dev 0'``),
    then tiny (``'p1·d0'``); a block whose replicas differ adds what differs,
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
