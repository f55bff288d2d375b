"""The tree-diff view: which leaves differ on which hosts, and by how much.

A table of differing leaves x hosts (odd hosts highlighted, a numeric
summary per leaf; a global array's row names its block, and only the hosts
holding that block have a verdict), then one expandable section per leaf
with every host's shape, dtype, digest, difference statistics and, for small
leaves, values. Global leaves not compared on every host are listed under
the headline: "nothing to compare across hosts" (no block held by two
hosts) or "compared over its replicas". The HTML is built by pure functions
of the `multihost.TreeDiff` model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from mhnotebook.widgets._common import (
    CSS,
    View,
    add_classes,
    banner,
    close_widgets,
    esc,
    expect_model,
    pre,
    widget_html,
)
from multihost._models import LeafDiff, TreeDiff
from multihost._models._layout import format_index
from multihost._models._treediff import ULPS_SAID
from multihost._text import fmt_hosts

#: Differing leaves listed in the table and the expandable sections.
MAX_ROWS = 100
#: More hosts than this: only the odd and reference hosts get a column.
MAX_HOST_COLUMNS = 16
#: Majority hosts listed in a leaf's details besides the reference host.
MAX_DETAIL_MAJORITY = 3
#: Leaves whose details the static picture (a saved notebook) shows filled in.
STATIC_DETAILS = 10
#: Elements of a value printed in full (``np.array2string`` threshold).
VALUES_THRESHOLD = 64


def _sig(shape: tuple[int, ...] | None, dtype: str | None) -> str:
    return 'missing' if shape is None else f'{dtype}[{",".join(map(str, shape))}]'


def _num(x: float) -> str:
    return 'nan' if math.isnan(x) else f'{x:.3g}'


def _all_hosts(diff: TreeDiff) -> list[int]:
    hosts = {h for leaf in diff.leaves for h in leaf.shapes}
    return sorted(hosts) if hosts else list(range(diff.num_processes))


def host_columns(diff: TreeDiff, leaves: Sequence[LeafDiff]) -> tuple[list[int], bool]:
    """The hosts that get a column, and whether an "other hosts" column follows.

    Every host when there are at most `MAX_HOST_COLUMNS`; otherwise the odd
    hosts of the listed leaves and their reference hosts (bounded).
    """
    hosts = _all_hosts(diff)
    if len(hosts) <= MAX_HOST_COLUMNS:
        return hosts, False
    odd = sorted({h for leaf in leaves for h in leaf.odd_processes})
    refs = sorted({leaf.reference_process for leaf in leaves} - set(odd))
    chosen = sorted((odd + refs)[:MAX_HOST_COLUMNS])
    return chosen, len(chosen) < len(hosts)


def leaf_summary(leaf: LeafDiff) -> str:
    """The numeric summary of one leaf: counts, max abs diff, first index; or the variants.

    For a string (or other non-array) leaf: its values and the hosts holding each.
    """
    texts = leaf.text_values
    if texts is not None:
        parts = [f'{_text(v)} on {fmt_hosts(hs)}' for v, hs in list(texts.items())[:4]]
        return '; '.join(parts) + (f'; ... ({len(texts)} values)' if len(texts) > 4 else '')
    if leaf.kind == 'sharding':
        return leaf.placements()
    if leaf.kind != 'value':
        groups: dict[str, list[int]] = {}
        for h in sorted(leaf.shapes):
            groups.setdefault(_sig(leaf.shapes[h], leaf.dtypes.get(h)), []).append(h)
        parts = [
            f'{sig} on {fmt_hosts(hosts)}'
            for sig, hosts in sorted(groups.items(), key=lambda g: g[1][0])
        ]
        return '; '.join(parts[:4]) + (f'; ... ({len(parts)} variants)' if len(parts) > 4 else '')
    stats = [h for h in leaf.compared_processes if h in leaf.num_different]
    tie = 'no majority: ' if leaf.tie else ''
    if not stats:
        return f'{tie}bytes differ on {fmt_hosts(leaf.compared_processes)}'
    total = sum(leaf.num_different[h] for h in stats)
    diffs = [leaf.max_abs_diff[h] for h in stats]
    worst = math.nan if any(math.isnan(d) for d in diffs) else max(diffs)
    first = stats[0]
    size = math.prod(leaf.shapes[first] or ())
    ulps = [leaf.max_ulps[h] for h in stats if h in leaf.max_ulps]
    near = ulps and len(ulps) == len(stats) and max(ulps) < ULPS_SAID
    apart = f' ({max(ulps)} ulps)' if near else ''
    return (
        f'{tie}{total} element(s) differ ({leaf.num_different[first]} of {size} on process '
        f'{first}), max |diff| {_num(worst)}{apart}, first at {leaf.first_index[first]}'
    )


def _text(value: str, limit: int = 40) -> str:
    return repr(value[: limit - 3]) + '...' if len(value) > limit else repr(value)


def _cell(leaf: LeafDiff, host: int) -> tuple[str, str]:
    """(text, title) of one leaf x host cell."""
    if leaf.block is not None and host not in leaf.shapes:
        return '', 'does not hold this block'
    if leaf.kind == 'sharding':
        return f'placement {(leaf.digests.get(host) or "")[:8]}', ''
    if leaf.kind != 'value':
        return _sig(leaf.shapes.get(host), leaf.dtypes.get(host)), ''
    if leaf.text_values is not None and host in leaf.values:
        same = host not in leaf.compared_processes
        return _text(str(leaf.values[host])), 'same as the majority' if same else ''
    if host not in leaf.compared_processes:
        if leaf.tie:
            return 'reference', 'no majority: compared with this group (the lowest process)'
        return ('reference' if host == leaf.reference_process else '='), 'same as the majority'
    if host not in leaf.num_different:
        return 'bytes differ', ''
    return (
        f'{leaf.num_different[host]} differ, max |diff| {_num(leaf.max_abs_diff[host])}',
        f'first difference at index {leaf.first_index[host]}',
    )


#: Blocks of one leaf whose details a section shows (the rest are counted).
MAX_BLOCK_DETAILS = 4


def leaf_groups(leaves: Sequence[LeafDiff]) -> list[tuple[LeafDiff, ...]]:
    """The differing leaves by path, in order: a sharded leaf whose blocks differ is one
    entry (its `LeafDiff` per block, the model's unit, kept together)."""
    groups: dict[str, list[LeafDiff]] = {}
    for leaf in leaves:
        groups.setdefault(leaf.path, []).append(leaf)
    return [tuple(g) for g in groups.values()]


def _blocks_note(group: Sequence[LeafDiff]) -> str:
    """``'blocks [0:32], [32:64], ... (3 of its blocks differ)'`` for a group of several."""
    shown = ', '.join(format_index(leaf.block) for leaf in group[:3] if leaf.block is not None)
    more = ', ...' if len(group) > 3 else ''
    return f'blocks {shown}{more} ({len(group)} of its blocks differ)'


def diff_table_html(diff: TreeDiff, max_rows: int = MAX_ROWS) -> str:
    """The table of differing leaves x hosts; cells of odd hosts have class ``mh-odd-host``.

    Every cell has ``mh-host-<p>``, every row ``mh-leaf`` and a ``data-path``.
    """
    if diff.ok:
        return ''
    groups = leaf_groups(diff.leaves)
    leaves = [g[0] for g in groups[:max_rows]]
    several = {id(g[0]): g for g in groups if len(g) > 1}
    hosts, others = host_columns(diff, [leaf for g in groups[:max_rows] for leaf in g])
    odd_any = set(diff.odd_processes)
    head = ['<th>#</th><th>leaf</th><th>kind</th>']
    for h in hosts:
        cls = f'mh-host-{h}' + (' mh-odd-host' if h in odd_any else '')
        head.append(f'<th class="{cls}" data-host="{h}">process {h}</th>')
    if others:
        head.append('<th class="mh-other-hosts">other processes</th>')
    head.append('<th>summary</th>')
    rows = []
    for i, leaf in enumerate(leaves):
        where = f'<code>{esc(leaf.path)}</code>'
        group = several.get(id(leaf))
        if group is not None:  # one row per leaf: its differing blocks listed, the first shown
            where += f' <span class="mh-block">{esc(_blocks_note(group))}</span>'
        elif leaf.block is not None:
            where += f' <span class="mh-block">block {esc(format_index(leaf.block))}</span>'
        cells = [f'<td>{i}</td><td>{where}</td><td>{esc(leaf.kind)}</td>']
        for h in hosts:
            text, title = _cell(leaf, h)
            cls = f'mh-host-{h}' + (' mh-odd-host' if h in leaf.odd_processes else '')
            cells.append(f'<td class="{cls}" data-host="{h}" title="{esc(title)}">{esc(text)}</td>')
        if others:
            rest = [h for h in leaf.odd_processes if h not in hosts]
            cells.append(
                '<td class="mh-other-hosts">'
                + (esc(f'also odd: {fmt_hosts(rest)}') if rest else 'same as majority')
                + '</td>'
            )
        summary = leaf_summary(leaf)
        if group is not None and leaf.block is not None:
            summary = f'the first, block {format_index(leaf.block)}: {summary}'
        cells.append(f'<td>{esc(summary)}</td>')
        block = '' if leaf.block is None else f' data-block="{esc(format_index(leaf.block))}"'
        rows.append(
            f'<tr class="mh-leaf" data-path="{esc(leaf.path)}"{block}>{"".join(cells)}</tr>'
        )
    more = ''
    if len(groups) > max_rows:
        more = (
            f'<div>... and {len(groups) - max_rows} more differing leaves (all of '
            'them are in the TreeDiff: view.diff.leaves).</div>'
        )
    return (
        f'{CSS}<div class="mh-scroll"><table class="mh-table mh-treediff-grid">'
        f'<tr>{"".join(head)}</tr>{"".join(rows)}</table></div>{more}'
    )


def _group_title(group: Sequence[LeafDiff]) -> str:
    """A section's title: ``"['w']  [value]  odd: process 2"`` (its blocks when several)."""
    leaf = group[0]
    where = f'{leaf.path}  {_blocks_note(group)}' if len(group) > 1 else leaf.where
    odd = sorted({p for g in group for p in g.odd_processes})
    who = 'no majority' if all(g.tie for g in group) else f'odd: {fmt_hosts(odd)}'
    return f'{where}  [{leaf.kind}]  {who}'


def _group_detail_html(group: Sequence[LeafDiff]) -> str:
    """One leaf's section: each differing block's details (the first few; the rest counted)."""
    if len(group) == 1:
        return leaf_detail_html(group[0])
    parts = [
        f'<div class="mh-block-detail"><b>{esc(leaf.where)}</b>{leaf_detail_html(leaf)}</div>'
        for leaf in group[:MAX_BLOCK_DETAILS]
    ]
    if len(group) > MAX_BLOCK_DETAILS:
        parts.append(f'<div>... and {len(group) - MAX_BLOCK_DETAILS} more differing blocks '
                     '(view.diff.leaves has each).</div>')  # fmt: skip
    return ''.join(parts)


def _values_text(value: np.ndarray) -> str:
    return np.array2string(
        np.asarray(value), threshold=VALUES_THRESHOLD, edgeitems=3, max_line_width=100
    )


def leaf_detail_html(leaf: LeafDiff) -> str:
    """Every host's shape, dtype, digest, difference statistics and values for one leaf.

    Odd hosts are listed in full; of the majority, the reference host and a
    few others (the rest hold the same bytes).
    """
    majority = [h for h in sorted(leaf.shapes) if h not in leaf.compared_processes]
    shown_majority = [leaf.reference_process] + [
        h for h in majority if h != leaf.reference_process
    ][:MAX_DETAIL_MAJORITY]
    hosts = sorted(set(leaf.compared_processes) | (set(shown_majority) & set(leaf.shapes)))
    rows = []
    for h in hosts:
        odd = h in leaf.odd_processes
        role = 'odd' if odd else ('reference' if h == leaf.reference_process else 'majority')
        if leaf.tie:  # no majority: two sides, neither odd
            role = 'reference side' if h in leaf.majority_processes else 'other side'
        if h in leaf.values:
            value = pre(_values_text(leaf.values[h]))
        elif leaf.shapes.get(h) is None:
            value = '(missing)'
        else:
            value = '(not kept: more than 64 elements)'
        stats = (
            f'<td>{leaf.num_different[h]}</td><td>{_num(leaf.max_abs_diff[h])}</td>'
            f'<td>{leaf.first_index[h]}</td>'
            if h in leaf.num_different
            else '<td></td><td></td><td></td>'
        )
        cls = f'mh-host-{h}' + (' mh-odd-host' if odd else '')
        rows.append(
            f'<tr class="{cls}" data-host="{h}"><td class="{cls}">{h}</td><td>{role}</td>'
            f'<td>{esc(leaf.shapes.get(h))}</td><td>{esc(leaf.dtypes.get(h))}</td>'
            f'<td><code>{esc(leaf.digests.get(h))}</code></td>{stats}<td>{value}</td></tr>'
        )
    hidden = len(majority) - len([h for h in shown_majority if h in leaf.shapes])
    more = (
        f'<div>... {hidden} more majority process(es) hold the reference bytes.</div>'
        if hidden > 0
        else ''
    )
    return (
        f'{CSS}<div class="mh-leaf-detail"><div>{esc(leaf.describe())}</div>'
        '<table class="mh-table"><tr><th>process</th><th>role</th><th>shape</th>'
        '<th>dtype</th><th>digest</th><th>differing</th><th>max |diff|</th>'
        f'<th>first index</th><th>value</th></tr>{"".join(rows)}</table>{more}</div>'
    )


def global_leaves_html(diff: TreeDiff, max_rows: int = MAX_ROWS) -> str:
    """The global leaves not compared on every host, one row each (``mh-global-leaf``).

    A leaf with no block held by two hosts has class ``mh-not-compared`` and
    says "nothing to compare across hosts"; one compared over the replicas of
    its blocks only has ``mh-by-replicas``. Empty when there is none.
    """
    not_compared, by_replicas = set(diff.not_compared), set(diff.by_replicas)
    shown = [g for g in diff.global_leaves if g.path in not_compared | by_replicas]
    if not shown:
        return ''
    rows = []
    for g in shown[:max_rows]:
        if g.path in not_compared:
            cls, verdict = 'mh-not-compared', 'nothing to compare across processes'
            how = f'each of its {g.num_blocks} block(s) is held by one process'
        else:
            cls, verdict = 'mh-by-replicas', 'compared over its replicas'
            hosts = str(g.max_hosts) if g.min_hosts == g.max_hosts else f'up to {g.max_hosts}'
            how = (
                f'{g.num_compared} of {g.num_blocks} block(s), each among the {hosts} '
                'processes holding it'
            )
        rows.append(
            f'<tr class="mh-global-leaf {cls}" data-path="{esc(g.path)}">'
            f'<td><code>{esc(g.path)}</code></td><td>{verdict}</td><td>{esc(how)}</td></tr>'
        )
    more = (
        f'<div>... and {len(shown) - max_rows} more global leaves.</div>'
        if len(shown) > max_rows
        else ''
    )
    return (
        '<div class="mh-treediff-global"><div>Global arrays are compared block by block, '
        'across the processes holding the same block:</div><table class="mh-table">'
        '<tr><th>global leaf</th><th>compared</th><th>how</th></tr>'
        f'{"".join(rows)}</table>{more}</div>'
    )


def summary_html(diff: TreeDiff) -> str:
    """The headline: agreement, or how many leaves differ and the odd hosts.

    Then the global leaves not compared on every host (`global_leaves_html`).
    """
    notes = global_leaves_html(diff)
    if diff.ok:
        if diff.not_compared or diff.by_replicas:
            text = (
                f'all {diff.num_processes} processes agree on every leaf they can compare '
                f'({diff.num_leaves} leaves)'
            )
        else:
            text = f'all {diff.num_processes} processes agree on {diff.num_leaves} leaves'
        return CSS + banner(text, 'mh-ok') + notes
    return (
        CSS
        + banner(
            f'<b>{len(diff.differing_paths)} of {diff.num_leaves} leaves differ</b> across '
            f'{diff.num_processes} processes; '
            + (
                'odd processes: <span class="mh-odd-host">'
                f'{esc(fmt_hosts(diff.odd_processes))}</span>'
                if diff.odd_processes
                else 'no majority, so no process is odd'
            ),
            'mh-flagged',
        )
        + notes
    )


class TreeDiffView(View):
    """A `multihost.TreeDiff` as a table of differing leaves x hosts, with details per leaf.

    Args:
        diff: a `multihost.TreeDiff` (``multihost.tree_diff(tree)`` on the hosts).
        max_rows: differing leaves listed (the rest are counted).

    Stable CSS classes: ``mh-treediff`` (the view), ``mh-treediff-summary``,
    ``mh-treediff-table`` (cells ``mh-host-<p>``, odd ones ``mh-odd-host``),
    ``mh-treediff-details`` (an accordion, one section per leaf),
    ``mh-treediff-detail`` (a section's content, filled when expanded).
    """

    def __init__(self, diff: TreeDiff, *, max_rows: int = MAX_ROWS):
        self.max_rows = int(max_rows)
        self._summary = add_classes(widgets.HTML(), 'mh-treediff-summary')
        self._table = add_classes(widgets.HTML(), 'mh-treediff-table')
        self._details = add_classes(widgets.Accordion(), 'mh-treediff-details')
        self._details.observe(self._on_expand, 'selected_index')
        self.widget = add_classes(
            widgets.VBox([self._summary, self._table, self._details]), 'mh-treediff'
        )
        self.update(diff)

    @property
    def diff(self) -> TreeDiff:
        """The tree diff shown."""
        return self._diff

    def text(self) -> str:
        """The diff's own summary (`TreeDiff.summary`)."""
        return self._diff.summary()

    def static_html(self) -> str:
        """The widget's picture, the first `STATIC_DETAILS` leaves' details filled in.

        (The live view fills a leaf's section only when it is expanded.)
        """
        fill = {
            id(child): _group_detail_html(group)
            for child, group in list(zip(self._details.children, self._shown))[:STATIC_DETAILS]
            if not child.value
        }
        return widget_html(self.widget, fill)

    def update(self, diff: TreeDiff) -> None:
        """Shows another tree diff."""
        expect_model('TreeDiffView', diff, TreeDiff, 'multihost.tree_diff(tree) on every process')
        self._diff = diff
        self._shown = leaf_groups(diff.leaves)[: self.max_rows]  # one section per leaf
        self._summary.value = summary_html(diff)
        self._table.value = diff_table_html(diff, self.max_rows)
        old = self._details.children
        self._details.selected_index = None
        self._details.children = [
            add_classes(widgets.HTML(), 'mh-treediff-detail') for _ in self._shown
        ]
        self._details.titles = tuple(_group_title(group) for group in self._shown)
        self._details.layout.display = 'none' if diff.ok else 'flex'
        close_widgets(old)

    def expand(self, path: str | None) -> None:
        """Expands one leaf's section (None collapses).

        Raises:
            KeyError: no listed differing leaf has this path.
        """
        if path is None:
            self._details.selected_index = None
            return
        for i, group in enumerate(self._shown):
            if group[0].path == path:
                self._details.selected_index = i
                return
        raise KeyError(
            f'{path!r} is not a listed differing leaf; differing: '
            + ', '.join(group[0].path for group in self._shown[:8])
        )

    def _on_expand(self, change: dict[str, Any]) -> None:
        i = change['new']
        if i is None or i >= len(self._shown):
            return
        child = self._details.children[i]
        if not child.value:  # filled lazily: only the sections someone opens
            child.value = _group_detail_html(self._shown[i])
