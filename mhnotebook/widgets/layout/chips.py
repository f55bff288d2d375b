"""The chip grid: the pod's chips at their torus coordinates, coloured by host, labelled with
the blocks they hold (`multihost._models._chipgrid.ChipGrid`), as HTML (`chip_grid_html`) and
as a picture (`render_chip_grid_png`).

Colours never wrap around (`host_color`: the palette's, then a hue of its own per host), and a
thick line runs between chips of different hosts, so 64 hosts of a v5e-256 stay apart.
"""

from __future__ import annotations

import io
import math
from typing import Any

from mhnotebook.widgets._common import CSS, esc, host_color, text_color
from multihost._models._chipgrid import Chip, ChipGrid, ChipPlane
from multihost._models._layout import format_bytes
from multihost._text import fmt_hosts

_CELL_PX = 46  # a chip's square in the HTML grid, up to 8 chips across
_MIN_CELL_PX = 22
_HOST_EDGE = '#111111'


def host_colors(n: int) -> tuple[str, ...]:
    """``n`` distinct fills, one per host, as every view colours them (`host_color`: the
    palette's, then a hue of its own per host; no wrap-around)."""
    return tuple(host_color(p) for p in range(n))


def _colors(grid: ChipGrid) -> dict[int, str]:
    hosts = sorted({c.process for c in grid.chips})
    colors = host_colors(max(hosts, default=0) + 1)
    return {p: colors[p] for p in hosts}


def _chip_title(chip: Chip) -> str:
    coords = ','.join(map(str, chip.coords))
    ids = ', '.join(map(str, chip.device_ids))
    held = chip.label or 'nothing'
    return (
        f'chip ({coords}) slice {chip.slice_index}, process {chip.process}, device id(s) '
        f'{ids}: block {held}, {format_bytes(chip.nbytes)}'
    )


def _edges(plane: ChipPlane, x: int, y: int) -> str:
    """CSS borders of a chip: thick where the neighbour belongs to another host."""
    chip = plane.at(x, y)
    sides = []
    for side, (dx, dy) in (('top', (0, -1)), ('right', (1, 0)), ('bottom', (0, 1)),
                           ('left', (-1, 0))):  # fmt: skip
        nx, ny = x + dx, y + dy
        other = plane.at(nx, ny) if 0 <= nx < plane.width and 0 <= ny < plane.height else None
        thick = other is None or chip is None or other.process != chip.process
        sides.append(f'border-{side}:{3 if thick else 1}px solid {_HOST_EDGE if thick else "#fff"}')
    return ';'.join(sides)


def chip_grid_html(grid: ChipGrid | None) -> str:
    """The chip grid as HTML tables, one per plane (slice, z layer).

    Classes: ``mh-chip-grid`` (the whole), ``mh-chip-plane`` (one plane, with
    ``mh-chip-plane-title``), ``mh-chip`` (a chip's cell, also ``mh-host-<p>``,
    ``mh-chip-empty`` where it holds none of the array, ``mh-chip-marked`` on a marked host:
    `ChipGrid.marked`), ``mh-chip-title`` (the grid's caption, when it has one). ``''``
    without chips.
    """
    if grid is None:
        return ''
    colors = _colors(grid)
    widest = max((p.width for p in grid.planes), default=1)
    cell = max(_MIN_CELL_PX, min(_CELL_PX, 368 // max(widest, 1)))
    font = 11 if cell >= 40 else 9 if cell >= 30 else 7
    longest = max((len(c.label) for c in grid.chips), default=0)
    show_labels = longest <= (cell - 2) // (font * 0.6)  # every label fits, or none is drawn
    planes = []
    for plane in grid.planes:
        rows = []
        for y in range(plane.height):
            tds = []
            for x in range(plane.width):
                chip = plane.at(x, y)
                if chip is None:
                    tds.append('<td class="mh-chip mh-chip-none"></td>')
                    continue
                fill = colors[chip.process]
                label = chip.label if show_labels else ''
                cls = f'mh-chip mh-host-{chip.process}' + ('' if chip.label else ' mh-chip-empty')
                mark = ''
                if chip.process in grid.marked:  # a host the collective waits for
                    cls += ' mh-chip-marked'
                    mark = f'outline:3px dashed {text_color(fill)};outline-offset:-7px;'
                tds.append(
                    f'<td class="{cls}" title="{esc(_chip_title(chip))}" style="width:{cell}px;'
                    f'height:{cell}px;background:{fill};color:{text_color(fill)};'
                    f'font-size:{font}px;text-align:center;padding:0;{_edges(plane, x, y)};'
                    f'{mark}">{esc(label)}</td>'
                )
            rows.append(f'<tr>{"".join(tds)}</tr>')
        title = plane.title(grid.slices)
        planes.append(
            '<div class="mh-chip-plane" style="display:inline-block;margin:0 12px 8px 0;'
            f'vertical-align:top"><div class="mh-chip-plane-title">{esc(title)}</div>'
            f'<table style="border-collapse:collapse">{"".join(rows)}</table></div>'
        )
    head = (
        f'<div class="mh-chip-caption"><b>chips</b>: {esc(grid.kind)}, {len(grid.chips)} chips '
        f'on {grid.hosts} processes (colour: process; x across, y down); '
        f'{esc(grid.legend().split("then ", 1)[-1])}</div>'
    )
    if grid.caption:
        head = f'<div class="mh-chip-title"><b>{esc(grid.caption)}</b></div>' + head
    return f'{CSS}<div class="mh-chip-grid">{head}{_host_legend(colors)}{"".join(planes)}</div>'


def _host_legend(colors: dict[int, str], most: int = 32) -> str:
    """A swatch per host (``mh-chip-legend``), up to ``most`` hosts (then the tooltips)."""
    if len(colors) > most:
        return (
            '<div class="mh-chip-legend">processes: hover a chip for its process, chip and '
            'devices</div>'
        )
    items = ''.join(
        f'<span style="display:inline-block;margin-right:8px"><span style="display:inline-block;'
        f'width:0.9em;height:0.9em;vertical-align:middle;background:{c};border:1px solid #0003">'
        f'</span> p{p}</span>'
        for p, c in sorted(colors.items())
    )
    return f'<div class="mh-chip-legend" style="margin:2px 0 4px">{items}</div>'


def render_chip_grid_png(grid: ChipGrid, title: str = '', width: int = 720) -> bytes:
    """The chip grid as a PNG: one square per chip at its coordinates, one panel per plane
    (slice, z layer), filled by host, thick lines between hosts, the block labels where they
    fit (a 16x16 grid keeps them at a small size)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    colors = _colors(grid)
    n = len(grid.planes)
    columns = min(n, 4)
    rows = math.ceil(n / columns)
    pw = max(p.width for p in grid.planes)
    ph = max(p.height for p in grid.planes)
    panel = (width / 100 - 0.3 * (columns + 1)) / columns
    cell_in = panel / pw
    fig_h = 0.9 + rows * (cell_in * ph + 0.45)
    fig = Figure(figsize=(width / 100, fig_h), dpi=100)
    head = (
        title or grid.caption or f'{grid.kind}: {len(grid.chips)} chips on {grid.hosts} processes'
    )
    what = grid.legend().split('then ', 1)[-1].split(';')[0]
    if grid.marked:
        what += f'; dashed outline: {fmt_hosts(grid.marked)}, never launched it'
    legend = (
        'x across, y down; colour: process (pN in its corner), thick lines between processes\n'
        f'label: {what}'
    )
    fig.suptitle(f'{head}\n{legend}', fontsize=8, y=1 - 0.08 / fig_h)
    font = max(4.0, min(9.0, cell_in * 72 / 4.2))
    for i, plane in enumerate(grid.planes):
        r, c = divmod(i, columns)
        left = (0.3 + c * (panel + 0.3)) / (width / 100)
        bottom = 1 - (0.75 + (r + 1) * (cell_in * ph + 0.45) - 0.2) / fig_h
        ax = fig.add_axes(
            (left, bottom, cell_in * plane.width / (width / 100), cell_in * plane.height / fig_h)
        )
        ax.set_xlim(0, plane.width)
        ax.set_ylim(plane.height, 0)
        ax.set_xticks([x + 0.5 for x in range(plane.width)], [str(x) for x in range(plane.width)])
        ax.set_yticks([y + 0.5 for y in range(plane.height)], [str(y) for y in range(plane.height)])
        ax.tick_params(length=0, labelsize=6, pad=1)
        for spine in ax.spines.values():
            spine.set_visible(False)
        t = plane.title(grid.slices)
        if t:
            ax.set_title(t, fontsize=8, pad=2)
        for y in range(plane.height):
            for x in range(plane.width):
                chip = plane.at(x, y)
                if chip is None:
                    continue
                fill = colors[chip.process]
                ax.add_patch(Rectangle((x, y), 1, 1, facecolor=fill, edgecolor='white', lw=0.6))
                if chip.label:
                    ax.text(x + 0.5, y + 0.5, chip.label, ha='center', va='center',
                            fontsize=font, color=text_color(fill))  # fmt: skip
                if chip.process in grid.marked:
                    ax.add_patch(Rectangle((x + 0.1, y + 0.1), 0.8, 0.8, fill=False,
                                           edgecolor=text_color(fill), lw=2,
                                           linestyle='--'))  # fmt: skip
        _host_lines(ax, plane)
        _host_names(ax, plane, colors, max(3.5, font * 0.75))
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=100)
    return buf.getvalue()


def _host_names(ax: Any, plane: ChipPlane, colors: dict[int, str], size: float) -> None:
    """``pN`` in the top-left corner of each host's first chip of the plane."""
    seen: set[int] = set()
    for y in range(plane.height):
        for x in range(plane.width):
            chip = plane.at(x, y)
            if chip is None or chip.process in seen:
                continue
            seen.add(chip.process)
            fill = text_color(colors[chip.process])
            ax.text(x + 0.06, y + 0.06, f'p{chip.process}', ha='left', va='top',
                    fontsize=size, color=fill, alpha=0.85)  # fmt: skip


def _host_lines(ax: Any, plane: ChipPlane) -> None:
    """Thick lines between chips of different hosts, and round the plane."""
    segments = []
    for y in range(plane.height):
        for x in range(plane.width):
            chip = plane.at(x, y)
            p = None if chip is None else chip.process
            if x + 1 < plane.width:
                q = plane.at(x + 1, y)
                if (None if q is None else q.process) != p:
                    segments.append(((x + 1, y), (x + 1, y + 1)))
            if y + 1 < plane.height:
                q = plane.at(x, y + 1)
                if (None if q is None else q.process) != p:
                    segments.append(((x, y + 1), (x + 1, y + 1)))
    w, h = plane.width, plane.height
    segments += [((0, 0), (w, 0)), ((w, 0), (w, h)), ((w, h), (0, h)), ((0, h), (0, 0))]
    from matplotlib.collections import LineCollection

    ax.add_collection(LineCollection(segments, colors=_HOST_EDGE, linewidths=2.2))
