"""`TreeLayoutView`: the layout of a whole pytree, one row per leaf.

A click on a leaf shows its `LayoutView` below the table; `tree_layout_html`
is the table as static HTML.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from mhnotebook.widgets._common import CSS, View, add_classes, close_widgets, esc, run_action
from mhnotebook.widgets.layout.view import LayoutView, show_selected
from multihost._models import LeafLayout, TreeLayout

_TREE_HEAD = ('leaf', 'shape', 'dtype', 'spec', 'bytes per process', 'replicas')
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
        show_selected(self._buttons.items(), path)
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
