"""The layout view's HTML parts: header, legend, a block's shards, the blocks as HTML.

Pure functions of the model, shared by the live widget (`LayoutView`) and its
static picture (`blocks_html` stands in for the buttons where no kernel runs).
"""

from __future__ import annotations

import numpy as np

from mhnotebook.widgets._common import CSS, PALETTE, banner, esc, pre, swatch, text_color
from mhnotebook.widgets.layout.facets import LayoutFacets
from mhnotebook.widgets.layout.grid import SHARED_COLOR, GridBlock, LayoutGrid
from mhnotebook.widgets.layout.replicas import first_names, group_letter
from multihost._models import Layout, ReplicaGroup, ReplicaReport
from multihost._models._layout import Index, format_bytes, format_index
from multihost._text import fmt_hosts

#: More visible blocks than this (over all facets shown): no buttons, the block list only.
MAX_BUTTONS = 256
#: Hosts listed in the legend; the rest are summarised.
MAX_LEGEND = 32
#: Elements of a block's values printed in full (``np.array2string`` threshold).
VALUES_THRESHOLD = 200


def legend_html(layout: Layout, max_processes: int = MAX_LEGEND) -> str:
    """Hosts with their colour, bytes held and shard count (bounded)."""
    per_host = layout.bytes_per_process()
    shards: dict[int, int] = {}
    for s in layout.shards:
        shards[s.process_index] = shards.get(s.process_index, 0) + 1
    rows = []
    for p in sorted(per_host)[:max_processes]:
        rows.append(
            f'<tr class="mh-legend-host mh-host-{p}"><td>{swatch(p)} process {p}</td>'
            f'<td>{format_bytes(per_host[p])}</td><td>{shards.get(p, 0)}</td></tr>'
        )
    if len(per_host) > max_processes:
        rest = sorted(per_host)[max_processes:]
        sizes = [per_host[p] for p in rest]
        rows.append(
            f'<tr><td colspan="3">... {len(rest)} more processes, '
            f'{format_bytes(min(sizes))} to {format_bytes(max(sizes))} each</td></tr>'
        )
    if any(len(b.process_indices) > 1 for b in layout.blocks()):
        rows.append(
            '<tr class="mh-legend-shared"><td colspan="3"><span class="mh-swatch" style="'
            'display:inline-block;width:0.9em;height:0.9em;vertical-align:middle;border:1px '
            f'solid #0003;background:{SHARED_COLOR}"></span> several processes '
            '(see replicas)</td></tr>'
        )
    ratio = layout.stored_nbytes / layout.nbytes if layout.nbytes else 0
    foot = (
        f'{format_bytes(layout.stored_nbytes)} stored for {format_bytes(layout.nbytes)} '
        f'of data (x{ratio:.3g})'
    )
    if layout.num_processes > len(PALETTE):
        foot += f'; processes past {len(PALETTE)} get hues of their own (hover for names)'
    return (
        f'{CSS}<table class="mh-table mh-legend"><tr><th>process</th><th>bytes</th>'
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
        f'{layout.num_processes} process(es); {len(blocks)} distinct block(s), '
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
        odd = first_names(report.odd_devices, layout.device_name)
        verdict = banner(
            f'<b>replicas DIFFER</b> in {len(bad)} of {len(report.groups)} replicated block(s) '
            f'(undefined behaviour): odd {esc(fmt_hosts(report.odd_processes))}: {esc(odd)}; '
            'the replica matrix marks the odd replicas',
            'mh-flagged',
        )
    return CSS + text + verdict


def _group_text(layout: Layout, group: ReplicaGroup) -> str:
    """``'digest 1a2b… (majority) on process 0 · dev 0 (id 0), ...; digest ...'``."""
    parts = []
    for i, (digest, devices) in enumerate(group.digests.items()):
        names = first_names(devices, layout.device_name)
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


def block_tooltip(b: GridBlock) -> str:
    """A button's tooltip: index, who holds it, replicas, verdict."""
    return (
        f'{format_index(b.index)}: {b.label}'
        + (f', x{b.replica_count}' if b.replica_count > 1 else '')
        + (f'; {b.odd_text}' if b.flagged else '')
        + (f'; {b.mark}' if b.mark else '')
    )


def block_classes(b: GridBlock) -> list[str]:
    """A block's button classes: ``mh-layout-block``, one ``mh-host-<p>`` per host holding it,
    ``mh-layout-replicated``, ``mh-flagged``, ``mh-marked``."""
    cls = ['mh-layout-block', *(f'mh-host-{h}' for h in b.processes)]
    if b.replica_count > 1:
        cls.append('mh-layout-replicated')
    if b.flagged:
        cls.append('mh-flagged')
    if b.mark:
        cls.append('mh-marked')
    return cls


def block_text(b: GridBlock, form: int) -> str:
    """A block button's text: its label in ``form`` (see `label_form`), ``'⚠ '`` first when
    its replicas differ or it is marked."""
    return ('⚠ ' if b.flagged or b.mark else '') + (b.labels[form] if b.labels else '')


def grid_place(b: GridBlock, grid: LayoutGrid) -> tuple[str, str]:
    """A block's CSS ``grid-row`` and ``grid-column`` among its facet's block boundaries."""
    rows, cols = grid.row_cuts, grid.col_cuts
    return (
        f'{rows.index(b.rows[0]) + 1} / {rows.index(b.rows[1]) + 1}',
        f'{cols.index(b.cols[0]) + 1} / {cols.index(b.cols[1]) + 1}',
    )


def label_form(grid: LayoutGrid, facets: int) -> int:
    """Which label form (0 long, 1 short, 2 tiny) fits a facet's block buttons."""
    columns = max(len(grid.col_cuts) - 1, 1) * max(facets if facets > 1 else 1, 1)
    return 0 if columns <= 4 else 1 if columns <= 8 else 2


def grid_columns(grid: LayoutGrid) -> str:
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
        form = label_form(f.grid, n)
        cells = []
        for b in f.grid.blocks:
            cls = block_classes(b) + (['mh-selected'] if b.index == selected else [])
            row, column = grid_place(b, f.grid)
            style = (
                f'grid-row:{row};grid-column:{column};'
                f'background:{b.fill};color:{text_color(b.fill)}'
            )
            cells.append(
                f'<div class="{" ".join(cls)}" style="{style}" title="{esc(block_tooltip(b))}">'
                f'{esc(block_text(b, form))}</div>'
            )
        title = f'<div class="mh-layout-facet-title">{esc(f.title)}</div>' if f.title else ''
        parts.append(
            f'<div class="mh-layout-facet">{title}<div class="mh-layout-facet-grid" '
            f'style="grid-template-columns:{grid_columns(f.grid)}">'
            f'{"".join(cells)}</div></div>'
        )
    more = (
        f'<div class="mh-layout-facets-more">{esc(facets.more_text())}</div>' if facets.more else ''
    )
    return f'{CSS}<div class="mh-layout-facets">{"".join(parts)}</div>{more}'
