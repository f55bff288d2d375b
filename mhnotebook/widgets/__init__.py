"""Notebook views of the debugging model: layouts, tree diffs, the stepper, stacks.

Each view is a pure function of a `multihost` model (frozen dataclasses the
engines send), rendered with ipywidgets (and matplotlib for the layout
picture). Views never talk to the cluster: actions are callables the caller
injects, and ``update(model)`` shows a new model. Each shows its model's own
text where widgets cannot render (a terminal, a log)::

    from mhnotebook.widgets import (
        LayoutView, StepperView, TimelineView, TreeDiffView, WhereView
    )

    LayoutView(multihost.describe_layout(x), values=gathered)
    TreeLayoutView(session.layout('state.params')[0])
    TreeDiffView(multihost.tree_diff(params))
    StepperView(table, on_step=session.release, on_refresh=session.step_table)
    WhereView(stacks, on_refresh=session.where)
    TimelineView(multihost.timeline(), on_refresh=session.timeline)

`layout_grid` and `render_layout_png` are the layout view's pure parts, and
`render_timeline_png` the timeline's, for pictures outside a widget. Every
widget part carries a stable CSS class (``mh-layout``, ``mh-layout-block``,
``mh-host-<p>``, ``mh-treediff``, ``mh-odd-host``, ``mh-stepper``,
``mh-step-button``, ``mh-where``, ``mh-timeline``, ``mh-timeline-summary``,
``mh-timeline-chart``...; each view's docstring lists them).
"""

from mhnotebook.widgets._audit import AuditView
from mhnotebook.widgets._census import EnvView, MemoryView, render_memory_png
from mhnotebook.widgets._common import host_color
from mhnotebook.widgets._nonfinite import NonfiniteView
from mhnotebook.widgets._replay import ReplayView
from mhnotebook.widgets._stepper import StepperView
from mhnotebook.widgets._timeline import TimelineView, render_timeline_png
from mhnotebook.widgets._treediff import TreeDiffView
from mhnotebook.widgets._where import WhereView
from mhnotebook.widgets.layout.grid import GridBlock, LayoutGrid, layout_grid
from mhnotebook.widgets.layout.png import render_layout_png
from mhnotebook.widgets.layout.tree import TreeLayoutView
from mhnotebook.widgets.layout.view import LayoutView

__all__ = [
    'AuditView',
    'EnvView',
    'GridBlock',
    'LayoutGrid',
    'LayoutView',
    'MemoryView',
    'NonfiniteView',
    'ReplayView',
    'StepperView',
    'TimelineView',
    'TreeDiffView',
    'TreeLayoutView',
    'WhereView',
    'host_color',
    'layout_grid',
    'render_layout_png',
    'render_memory_png',
    'render_timeline_png',
]
