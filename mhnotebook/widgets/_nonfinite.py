"""The non-finite view: which shards hold NaN or Inf, on which host and device, in a picture.

A `multihost.NonfiniteReport` drawn as: a verdict line; a table of the
offending shards (leaf, block, host, device, NaN, Inf, first position); for a
pytree, a table of the offending leaves and a choice among them; and the
layout picture of the chosen leaf (`LayoutView`) with its offending blocks
marked. Pure functions of the model; text/plain is the report's own text.
"""

from __future__ import annotations

import ipywidgets as widgets

from mhnotebook.widgets._common import (
    CSS,
    View,
    add_classes,
    banner,
    esc,
    expect_model,
    swatch,
    widget_html,
)
from mhnotebook.widgets.layout.view import LayoutView
from multihost._models import NonfiniteLeaf, NonfiniteReport, NonfiniteShard
from multihost._models._layout import format_index

#: Offending shards listed in the table (the report's text has the same bound per host).
MAX_ROWS = 64
#: Offending leaves listed (and offered for the picture).
MAX_LEAVES = 32


def _device(s: NonfiniteShard) -> str:
    if s.device is None:
        return 'host memory'
    local = '' if s.local_device is None else f' · dev {s.local_device}'
    return f'process {s.process}{local} (id {s.device})'


def shards_html(report: NonfiniteReport, max_rows: int = MAX_ROWS) -> str:
    """The offending shards: leaf, block, host, device, replica, NaN, Inf, first non-finite."""
    if report.ok:
        return ''
    rows = []
    for s in report.shards[:max_rows]:
        path = esc(s.path or '<value>') + (' <small>(host-local)</small>' if s.host_local else '')
        rows.append(
            f'<tr class="mh-nonfinite-shard mh-host-{s.process}"><td><code>{path}</code></td>'
            f'<td>{esc(format_index(s.index))}</td>'
            f'<td>{swatch(s.process)} {s.process}</td><td>{esc(_device(s))}</td>'
            f'<td>{s.replica}</td><td class="mh-odd-host">{s.nan:,}</td>'
            f'<td class="mh-odd-host">{s.inf:,}</td>'
            f'<td>{esc("" if s.first is None else s.first)}</td></tr>'
        )
    more = []
    if len(report.shards) > max_rows:
        more.append(f'… {len(report.shards) - max_rows} more shard(s) in the report')
    more += [
        f'… process {p} found {n} more offending shard(s), not listed'
        for p, n in report.truncated.items()
    ]
    foot = ''.join(f'<tr><td colspan="8">{esc(m)}</td></tr>' for m in more)
    return (
        '<table class="mh-table mh-nonfinite-shards"><tr><th>leaf</th><th>block</th>'
        '<th>process</th><th>device</th><th>replica</th><th>NaN</th><th>Inf</th>'
        f'<th>first at</th></tr>{"".join(rows)}{foot}</table>'
    )


def leaves_html(report: NonfiniteReport, max_leaves: int = MAX_LEAVES) -> str:
    """The offending leaves (only worth a table when there are several)."""
    if len(report.leaves) < 2:
        return ''
    rows = []
    for leaf in report.leaves[:max_leaves]:
        hosts = ', '.join(str(p) for p in leaf.processes)
        shape = ', '.join(map(str, leaf.shape))
        local = ' <small>(host-local)</small>' if leaf.host_local else ''
        rows.append(
            f'<tr class="mh-nonfinite-leaf-row"><td><code>{esc(leaf.path or "<value>")}</code>'
            f'{local}</td><td>{esc(leaf.dtype)}[{shape}]</td><td>{esc(hosts)}</td>'
            f'<td>{leaf.shards}</td><td>{leaf.nan:,}</td><td>{leaf.inf:,}</td>'
            f'<td>{esc("" if leaf.first is None else leaf.first)}</td></tr>'
        )
    if len(report.leaves) > max_leaves:
        rows.append(f'<tr><td colspan="7">… {len(report.leaves) - max_leaves} more</td></tr>')
    return (
        '<table class="mh-table mh-nonfinite-leaves"><tr><th>leaf</th><th>array</th>'
        '<th>processes</th><th>shards</th><th>NaN</th><th>Inf</th><th>first at</th></tr>'
        + ''.join(rows)
        + '</table>'
    )


def _leaf_label(leaf: NonfiniteLeaf) -> str:
    local = f' (host-local, process {leaf.processes[0]})' if leaf.host_local else ''
    return f'{leaf.path or "<value>"}{local}: {leaf.nan:,} NaN, {leaf.inf:,} Inf'


class NonfiniteView(View):
    """A `multihost.NonfiniteReport`: offending shards, and the layout picture with them marked.

    Args:
        report: the report (``multihost.nonfinite(tree)``, or
            ``session.nonfinite(name)``).
        name: what was checked, for the verdict line (e.g. the engine name).

    Stable CSS classes: ``mh-nonfinite`` (the view), ``mh-nonfinite-summary``
    (the verdict, ``mh-ok`` or ``mh-flagged``), ``mh-nonfinite-shards`` (rows
    ``mh-nonfinite-shard``, ``mh-host-<p>``), ``mh-nonfinite-leaves`` (rows
    ``mh-nonfinite-leaf-row``), ``mh-nonfinite-leaf`` (the choice of leaf),
    ``mh-nonfinite-layout`` (the picture: a `LayoutView` whose offending
    blocks are ``mh-marked`` and hatched).
    """

    def __init__(self, report: NonfiniteReport, *, name: str = ''):
        expect_model(
            'NonfiniteView', report, NonfiniteReport, 'multihost.nonfinite(tree) on every process'
        )
        self.report = report
        self.name = name
        what = f'<code>{esc(name)}</code>: ' if name else ''
        head = banner(what + esc(report.headline()), 'mh-ok' if report.ok else 'mh-flagged')
        pictured = [leaf for leaf in report.leaves[:MAX_LEAVES] if leaf.layout is not None]
        self._leaves = pictured
        self._choice = add_classes(
            widgets.Dropdown(
                description='leaf',
                options=[(_leaf_label(leaf), i) for i, leaf in enumerate(pictured)],
            ),
            'mh-nonfinite-leaf',
        )
        self._choice.layout.width = '40em'
        self._choice.layout.display = 'flex' if len(pictured) > 1 else 'none'
        self.layout_view: LayoutView | None = None
        picture: list[widgets.Widget] = []
        if pictured:
            first = pictured[0]
            assert first.layout is not None
            self.layout_view = LayoutView(first.layout, marked=first.marked(report))
            picture = [self.layout_view.widget]
            self._choice.observe(self._on_choice, 'value')
        self.widget = add_classes(
            widgets.VBox(
                [
                    add_classes(widgets.HTML(CSS + head), 'mh-nonfinite-summary'),
                    widgets.HTML(shards_html(report)),
                    widgets.HTML(leaves_html(report)),
                    self._choice,
                    add_classes(widgets.VBox(picture), 'mh-nonfinite-layout'),
                ]
            ),
            'mh-nonfinite',
        )

    @property
    def leaf(self) -> NonfiniteLeaf | None:
        """The leaf whose picture is shown, if any."""
        if not self._leaves:
            return None
        return self._leaves[self._choice.value or 0]

    def show(self, path: str) -> None:
        """Shows the picture of the offending leaf with this path.

        Raises:
            KeyError: no pictured offending leaf has this path.
        """
        for i, leaf in enumerate(self._leaves):
            if leaf.path == path:
                self._choice.value = i
                return
        raise KeyError(f'no offending leaf {path!r} with a layout in this report')

    def _on_choice(self, change: dict[str, object]) -> None:
        leaf = self.leaf
        if leaf is None or leaf.layout is None or self.layout_view is None:
            return
        self.layout_view.update(leaf.layout, marked=leaf.marked(self.report))

    def static_html(self) -> str:
        """The view's picture, the layout's as `LayoutView.static_html` gives it."""
        if self.layout_view is None:
            return widget_html(self.widget)
        return widget_html(
            self.widget, {id(self.layout_view.widget): self.layout_view.static_html()}
        )

    def text(self) -> str:
        return self.report.format()
