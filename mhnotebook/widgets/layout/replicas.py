"""The replica matrix: every replicated block against the devices holding it, pure.

`replica_matrix` lays the blocks held by more than one device out against
those devices (grouped by host, or one column per host when there are
many); with a `ReplicaReport`, each cell carries its digest group and odd
replicas are marked. `replica_matrix_html` and `replica_matrix_text` render it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

from mhnotebook.widgets._common import CSS, esc, swatch
from mhnotebook.widgets.layout.grid import layout_and_report
from multihost._models import Layout, LayoutBlock, ReplicaGroup, ReplicaReport
from multihost._models._layout import Index, format_index

T = TypeVar('T')

#: Replicated blocks (rows) in the replica matrix; those that differ come first.
MAX_MATRIX_ROWS = 16
#: Device columns in the replica matrix; beyond, one column per host (the matrix stays
#: about 600 px wide, beside the picture, so that no odd replica hides in a scroll).
MAX_MATRIX_DEVICES = 20
#: Host columns in the replica matrix; beyond, the first ones plus every odd host.
MAX_MATRIX_HOSTS = 16
#: Digest groups of the replica matrix: most common digest first.
GROUP_COLORS = ('#cfe8cf', '#f9c9a0', '#c6d4f2', '#ead0f2', '#f2ec9f', '#b8e6e6')
#: The fill of a replica cell without a report (nothing was compared).
UNCHECKED_COLOR = '#e4e4e4'


def first_names(items: Sequence[T], name: Callable[[T], str], shown: int = 4) -> str:
    """``'a, b, c, d, ... (9 in all)'``: the names of the first ``shown`` items, then the count."""
    text = ', '.join(name(x) for x in items[:shown])
    return text + (f', ... ({len(items)} in all)' if len(items) > shown else '')


def group_letter(rank: int) -> str:
    """``0`` -> ``'a'`` (the most common digest), ``1`` -> ``'b'``, ... ``26`` -> ``'a1'``."""
    return 'abcdefghijklmnopqrstuvwxyz'[rank % 26] + (str(rank // 26) if rank >= 26 else '')


@dataclasses.dataclass(frozen=True)
class ReplicaCell:
    """One replica in the matrix: a device's (or, per host, a host's) copies of a block.

    Attributes:
        process: the host holding the replica(s).
        device_ids: the devices behind the cell (one, or a host's for a host column).
        name: ``'process 1 · dev 0 (id 2048)'`` (or ``'process 1 · 2 devices'``).
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
        label: the header (``'0'``: dev 0 of its host; ``'process 3'``; ``'… 40'``: 40 hosts).
        title: the tooltip (``'process 1 · dev 0 (id 2048)'``).
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
        kind = 'processes' if self.per_host else 'devices'
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
            text += f'; {hidden} more processes in the … columns' + (
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
    layout, report = layout_and_report(layout, report)
    groups = {g.index: g for g in report.groups} if report is not None else {}
    replicated = [b for b in layout.blocks() if b.replica_count > 1]
    flagged = [b for b in replicated if b.index in groups and not groups[b.index].ok]
    blocks = _row_blocks(replicated, flagged, max_rows)
    columns, per_host = _columns(layout, blocks, groups, max_devices, max_hosts)
    return ReplicaMatrix(
        layout=layout,
        columns=columns,
        rows=tuple(_row(layout, b, groups.get(b.index), columns, per_host) for b in blocks),
        replicated=len(replicated),
        flagged=len(flagged),
        per_host=per_host,
        checked=report is not None,
    )


def _row_blocks(
    replicated: list[LayoutBlock], flagged: list[LayoutBlock], max_rows: int
) -> list[LayoutBlock]:
    """The rows' blocks, in block order: those that differ first, then the others, to
    ``max_rows`` (an odd replica is never cut off by agreeing blocks before it)."""
    keep = {b.index for b in flagged[:max_rows]}
    for b in replicated:
        if len(keep) >= max_rows:
            break
        keep.add(b.index)
    return [b for b in replicated if b.index in keep]


def _columns(
    layout: Layout,
    blocks: list[LayoutBlock],
    groups: dict[Index, ReplicaGroup],
    max_devices: int,
    max_hosts: int,
) -> tuple[tuple[ReplicaColumn, ...], bool]:
    """The columns, and whether each is a host: the devices holding the rows' blocks by host
    (one column per host beyond ``max_devices``), a gap column for each run of hosts left out."""
    devices: dict[int, set[int | None]] = {}
    for b in blocks:
        for s in b.shards:
            devices.setdefault(s.process_index, set()).add(s.device_id)
    by_host = layout.devices_by_process()
    ordered = {p: tuple(d for d in by_host.get(p, ()) if d in devices[p]) for p in sorted(devices)}
    per_host = sum(len(v) for v in ordered.values()) > max_devices
    shown = set(ordered)
    if per_host and len(ordered) > max_hosts:
        odd_hosts = {p for b in blocks if b.index in groups for p in groups[b.index].odd_processes}
        shown = set(list(ordered)[:max_hosts]) | odd_hosts
    columns: list[ReplicaColumn] = []
    skipped = 0
    for p, held in ordered.items():
        if p not in shown:
            skipped += 1
            continue
        if skipped:
            columns.append(_gap_column(p, skipped))
            skipped = 0
        columns += _host_columns(layout, p, held, per_host)
    if skipped:
        columns.append(_gap_column(-1, skipped))
    return tuple(columns), per_host


def _gap_column(process: int, hosts: int) -> ReplicaColumn:
    """The column standing for ``hosts`` hosts left out (before ``process``; -1: at the end)."""
    return ReplicaColumn(process, None, f'… {hosts}', f'{hosts} processes not shown', hosts)


def _host_columns(
    layout: Layout, process: int, devices: tuple[int | None, ...], per_host: bool
) -> list[ReplicaColumn]:
    """A host's columns: the host itself, or one per device it holds the rows' blocks on."""
    if per_host:
        return [
            ReplicaColumn(
                process, None, f'process {process}', f'process {process}: {len(devices)} device(s)'
            )
        ]
    columns = []
    for d in devices:
        local = layout.local_index(d)
        label = 'mem' if d is None else f'{local}' if local is not None else f'#{d}'
        columns.append(ReplicaColumn(process, d, label, layout.device_name(d)))
    return columns


def _row(
    layout: Layout,
    block: LayoutBlock,
    group: ReplicaGroup | None,
    columns: tuple[ReplicaColumn, ...],
    per_host: bool,
) -> ReplicaRow:
    """One block against every column: a cell where the column holds replicas of it, else None."""
    held: dict[tuple[int, int | None], list[int | None]] = {}
    for s in block.shards:
        key = (s.process_index, None if per_host else s.device_id)
        held.setdefault(key, []).append(s.device_id)
    rank: dict[str, int] = {}
    digest_of: dict[int | None, str] = {}
    odd: set[int | None] = set()
    if group is not None:
        rank = {d: i for i, d in enumerate(group.digests)}
        digest_of = {r.device_id: r.digest for r in group.replicas}
        odd = set(group.odd_devices) if not group.ok else set()
    cells: list[ReplicaCell | None] = []
    for c in columns:
        ids = held.get((c.process, c.device_id)) if not c.gap else None
        if not ids:
            cells.append(None)
            continue
        digests = tuple(digest_of[d] for d in ids if d in digest_of)
        cells.append(
            ReplicaCell(
                process=c.process,
                device_ids=tuple(ids),
                name=layout.device_name(ids[0])
                if len(ids) == 1
                else f'process {c.process} · {len(ids)} devices',
                groups=tuple(rank[h] for h in digests),
                digests=digests,
                odd=any(d in odd for d in ids),
            )
        )
    return ReplicaRow(
        block=block,
        cells=tuple(cells),
        flagged=group is not None and not group.ok,
        tied=group is not None and group.tied,
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
    head1, head2 = _head_html(matrix)
    body = []
    for row in matrix.rows:
        tds = ''.join(_cell_html(row, c, cell) for c, cell in zip(matrix.columns, row.cells))
        row_cls = 'mh-replica-row' + (' mh-flagged' if row.flagged else '')
        mark = ' ⚠' if row.flagged else ''
        body.append(
            f'<tr class="{row_cls}"><th>{esc(format_index(row.block.index))}{mark}</th>{tds}</tr>'
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


def _head_html(matrix: ReplicaMatrix) -> tuple[list[str], list[str]]:
    """The header rows' cells: hosts (and gaps), then devices (one cell only: per host)."""
    span = '' if matrix.per_host else ' rowspan="2"'
    head1 = ['<th>process</th>']
    head2 = ['<th>dev</th>']
    for _, group in itertools.groupby(matrix.columns, key=lambda c: (c.process, c.gap)):
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
        name = f'process {c0.process}' if len(members) > 1 else f'{c0.process}'
        head1.append(
            f'<th colspan="{len(members)}" class="mh-host-{c0.process}" '
            f'title="process {c0.process}">{swatch(c0.process)} {name}</th>'
        )
        head2 += [f'<th title="{esc(c.title)}">{esc(c.label)}</th>' for c in members]
    return head1, head2


def _cell_html(row: ReplicaRow, column: ReplicaColumn, cell: ReplicaCell | None) -> str:
    """One ``<td>``: a gap, an empty place, or a replica in its digest group's colour."""
    if column.gap:
        return '<td class="mh-replica-gap"></td>'
    if cell is None:
        return '<td class="mh-replica-empty"></td>'
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
    return (
        f'<td class="{" ".join(cls)}" style="background-color:{cell.color}" '
        f'title="{esc(title)}">{esc(cell.text)}</td>'
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
            parts.append(f'{key}: {first_names(names, str)}')
        lines.append(f'  {format_index(row.block.index)}: ' + '; '.join(parts))
    return '\n'.join(lines)
