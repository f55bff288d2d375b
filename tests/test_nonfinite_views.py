"""The non-finite view from synthetic reports, and marked blocks in the layout picture."""

from __future__ import annotations

import mhnotebook.widgets as mw
from multihost import Layout


def layout_2d() -> Layout:
    """(8, 4) over 2 hosts x 2 devices: host p rows 4p:4p+4, device columns 2j:2j+2."""
    return Layout.from_placements(
        (8, 4),
        'float32',
        [
            ([(4 * p, 4 * p + 4), (2 * j, 2 * j + 2)], 2 * p + j, p)
            for p in range(2)
            for j in range(2)
        ],
        mesh_axes=(('host', 2), ('dev', 2)),
        spec="P('host', 'dev')",
        sharding='NamedSharding',
    )


def test_layout_grid_marks_the_given_blocks():
    marked = {((4, 8), (2, 4)): '3 NaN, 0 Inf on device 3'}
    grid = mw.layout_grid(layout_2d(), marked=marked)
    assert [b.index for b in grid.marked] == [((4, 8), (2, 4))]
    assert grid.marked[0].mark == '3 NaN, 0 Inf on device 3'
    assert not grid.flagged  # marks are not replica verdicts
    assert mw.layout_grid(layout_2d()).marked == ()
    # The picture changes (the block is hatched) and only where it is marked.
    plain = mw.render_layout_png(mw.layout_grid(layout_2d()))
    assert mw.render_layout_png(grid) != plain


def test_layout_view_marks_buttons_and_keeps_marks_across_renders():
    v = mw.LayoutView(layout_2d(), marked={((0, 4), (0, 2)): '1 NaN, 0 Inf on device 0'})
    marked = [b for b in v._blocks.children if 'mh-marked' in b._dom_classes]
    assert len(marked) == 1 and marked[0].description.startswith('⚠')
    assert '1 NaN, 0 Inf on device 0' in marked[0].tooltip
    assert any('1 NaN' in label for label, _ in v._select.options)
    v.select(((0, 4), (0, 2)))
    assert [b.index for b in v.grid.marked] == [((0, 4), (0, 2))]
    v.update(layout_2d())  # a new model without marks: none left
    assert v.grid.marked == ()
