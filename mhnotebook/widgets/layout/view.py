"""`LayoutView`: the layout picture wired to ipywidgets.

Axis dropdowns, sliders to page through facets when there are more than fit,
the replica matrix and the mesh beside the picture, a legend with bytes per
host, and one button per visible block that shows its shards and values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import ipywidgets as widgets
import numpy as np

from mhnotebook.widgets._common import (
    View,
    add_classes,
    close_widgets,
    esc,
    text_color,
    widget_html,
)
from mhnotebook.widgets.layout.chips import chip_grid_html, render_chip_grid_png
from mhnotebook.widgets.layout.facets import MAX_FACET_COLUMNS, LayoutFacets, layout_facets
from mhnotebook.widgets.layout.grid import (
    FLAGGED_EDGE,
    GridBlock,
    LayoutGrid,
    layout_and_report,
    layout_grid,
    normalize_axes,
)
from mhnotebook.widgets.layout.html_parts import (
    MAX_BUTTONS,
    block_classes,
    block_info_html,
    block_text,
    block_tooltip,
    blocks_html,
    grid_columns,
    grid_place,
    header_html,
    label_form,
    legend_html,
)
from mhnotebook.widgets.layout.mesh import mesh_html
from mhnotebook.widgets.layout.png import render_layout_png
from mhnotebook.widgets.layout.replicas import (
    ReplicaMatrix,
    replica_matrix,
    replica_matrix_html,
    replica_matrix_text,
)
from multihost._models import Layout, LayoutBlock, ReplicaReport
from multihost._models._layout import Index, format_index

K = TypeVar('K')


def show_selected(buttons: Iterable[tuple[K, widgets.Button]], selected: K | None) -> None:
    """Bold and ``mh-selected`` on the buttons of ``selected`` (a block, a leaf), off the rest."""
    for key, button in buttons:
        if key == selected:
            button.add_class('mh-selected')
            button.style.font_weight = 'bold'
        else:
            button.remove_class('mh-selected')
            button.style.font_weight = ''


_HINT = 'Select a block (a button or the list) to see its shards and values.'


class LayoutView(View):
    """Interactive layout picture: pick two axes, see the others as facets, select a block.

    Every block is drawn once: in its host's colour and named by its device
    (``'process 1 · dev 0 (id 2048)'``) when one host holds it, in grey when
    several hosts hold copies (``'8 replicas on processes 0-3'``). Beside the
    picture, the replica matrix shows every replicated block against the
    devices holding it (with a `ReplicaReport`, cells coloured by digest and
    odd replicas marked), the mesh view shows the mesh's axes, devices and
    processes and which axes cross hosts (on TPU: ICI ring or not, DCN
    across slices), and the legend gives bytes per host. On TPU the chip
    grid below draws the pod's chips at their coordinates, coloured by host,
    labelled with the blocks they hold. An array of rank 3 or more is shown as facets over the
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
    ``mh-layout-chips`` (on TPU: the chip grid, ``mh-chip-grid``, the pod's chips
    at their coordinates coloured by host; see `chip_grid_html`),
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
        self._chips = add_classes(widgets.HTML(), 'mh-layout-chips')
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
            widgets.VBox(
                [
                    self._header,
                    controls,
                    picture,
                    self._chips,
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

    def chip_png(self, width: int = 720) -> bytes | None:
        """The chip grid as a PNG (`render_chip_grid_png`: chips at their coordinates, one
        panel per slice and z layer, by host, with their blocks); None without chip
        coordinates (CPU devices)."""
        grid = self.layout.chip_grid()
        if grid is None:
            return None
        return render_chip_grid_png(grid, self.layout.headline(), width=width)

    def text(self) -> str:
        """The layout's text (with the mesh), the replica matrix's and the replica report's."""
        parts = [str(self._layout)]
        chips = self.layout.chip_grid()
        if chips is not None:
            parts.append(chips.text())
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
        layout, report = layout_and_report(layout, report)
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
        axes = normalize_axes(axes, layout.ndim)
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
        self._chips.value = chip_grid_html(layout.chip_grid())
        self._chips.layout.display = '' if self._chips.value else 'none'
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
            buttons = [self._button(b, f.grid, label_form(f.grid, n)) for b in f.grid.blocks]
            if single:
                self._facet_boxes = buttons
                self._blocks.layout.grid_template_columns = grid_columns(f.grid)
                self._blocks.layout.grid_gap = '2px'
                break
            box = add_classes(widgets.GridBox(buttons), 'mh-layout-facet-grid')
            box.layout.grid_template_columns = grid_columns(f.grid)
            box.layout.grid_gap = '2px'
            title = add_classes(widgets.HTML(f'<b>{esc(f.title)}</b>'), 'mh-layout-facet-title')
            self._facet_boxes.append(add_classes(widgets.VBox([title, box]), 'mh-layout-facet'))
        if not single:
            self._blocks.layout.grid_template_columns = (
                f'repeat({min(n, MAX_FACET_COLUMNS)}, max-content)'
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
        row, column = grid_place(b, grid)
        button = widgets.Button(
            description=block_text(b, form),
            tooltip=block_tooltip(b),
            layout=widgets.Layout(
                width='auto', height='auto', min_height='28px', grid_row=row, grid_column=column
            ),
        )
        button.style.button_color = b.fill
        button.style.text_color = text_color(b.fill)
        add_classes(button, *block_classes(b))
        if b.flagged:
            button.layout.border = f'3px solid {FLAGGED_EDGE}'
        if b.mark:
            button.layout.border = '3px dashed #000000'
        button.on_click(lambda _b, index=b.index: self.select(index))
        self._buttons.setdefault(b.index, button)
        self._all_buttons.append((b.index, button))
        return button

    def _render_selection(self) -> None:
        """What depends on the selection: the outline, the buttons, the list, the info."""
        self._image.value = render_layout_png(self._facets, selected=self._selected)
        show_selected(self._all_buttons, self._selected)
        with self._hold():
            self._select.value = self._selected
        if self._selected is None:
            self._info.value = _HINT
        else:
            self._info.value = block_info_html(
                self.layout, self._selected, self._report, self._values
            )
