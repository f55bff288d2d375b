"""The layout view from synthetic models (no cluster, no browser): a replicated block drawn
once with its replica matrix, device names, facets over the leading dimensions (capped), the
mesh view and which axes cross hosts, the pure grid and picture (`layout_grid`,
`render_layout_png`), and the widget driven as a user would (dropdowns, sliders, clicks)."""

from __future__ import annotations

import numpy as np
import pytest
from _html import elements, find, inside, is_png, one, png_size
from _layout_cases import (
    BAD,
    GOOD,
    IDS,
    batch_3d,
    did,
    host_by_dev,
    layout_2d,
    layout_3d,
    many_facets,
    on_devices,
    replicated,
    report,
    rows_by_dev,
    rows_by_host,
    rows_over_x,
)
from ipywidgets.widgets.widget import _instances

from mhnotebook import widgets as mw
from mhnotebook.widgets.layout.facets import MAX_FACETS, layout_facets
from mhnotebook.widgets.layout.grid import SHARED_COLOR, block_label
from mhnotebook.widgets.layout.html_parts import MAX_BUTTONS
from mhnotebook.widgets.layout.mesh import MAX_MESH_CELLS, mesh_axes_info, mesh_html
from mhnotebook.widgets.layout.png import _label_level, _label_lines
from mhnotebook.widgets.layout.replicas import (
    MAX_MATRIX_ROWS,
    UNCHECKED_COLOR,
    replica_matrix,
    replica_matrix_html,
    replica_matrix_text,
)
from mhnotebook.widgets.layout.tree import MAX_TREE_ROWS
from multihost import Layout
from multihost._checks._layout import format_bytes

# -- a replicated block is one block ------------------------------------------------------


def test_replicated_block_is_drawn_once_in_the_shared_colour():
    """P() over 4 hosts x 2 devices: one block (not a strip per host), grey, named by its
    replica count and hosts; one button; one block in the static picture."""
    layout = replicated()
    (b,) = mw.layout_grid(layout).blocks
    assert b.fill == SHARED_COLOR and b.replica_count == 8
    assert b.labels == ('8 replicas: dev 0,1 of processes 0-3', 'x8 dev 0,1 of processes 0-3', 'x8')
    v = mw.LayoutView(report(layout))
    assert len(find(v.widget, 'mh-layout-block')) == 1
    static = v.static_html()
    assert len(elements(static, 'mh-layout-block')) == 1
    assert len(elements(static, 'mh-layout-facet')) == 1


def test_flagged_block_says_how_many_replicas_differ_and_where():
    """The flagged block's label says which hosts hold odd replicas, not the whole bar."""
    (b,) = mw.layout_grid(report(replicated())).blocks
    assert b.flagged and b.odd_devices == (did(2, 0), did(2, 1)) and b.odd_processes == (2,)
    assert b.odd_text == '2 of 8 replicas differ (process 2)'
    assert _label_lines(b, 600, 60) == ['8 replicas: dev 0,1 of processes 0-3', '! ' + b.odd_text]
    assert _label_lines(b, 40, 14) == ['! x8']


def test_block_on_one_host_keeps_the_host_colour_and_names_its_devices():
    """A block replicated on two devices of one host is that host's colour."""
    g = mw.layout_grid(rows_by_host())
    assert [b.fill for b in g.blocks] == [mw.host_color(h) for h in range(4)]
    assert g.blocks[1].labels == (
        'process 1 · dev 0,1 (ids 2048,2049)',
        'process 1 · dev 0,1',
        'p1·d0,1',
    )


def test_blocks_across_hosts_say_which_devices_when_alike():
    """P('dev'): block 0 is dev 0 of every host, block 1 dev 1; different devices per host:
    only the hosts."""
    g = mw.layout_grid(rows_by_dev())
    assert [b.label for b in g.blocks] == [
        '4 replicas: dev 0 of processes 0-3',
        '4 replicas: dev 1 of processes 0-3',
    ]
    mixed = Layout.from_placements(
        (2,), 'float32', [([(0, 2)], 0, 0), ([(0, 2)], 2049, 1)], local_indices=((0, 0), (2049, 1))
    )
    assert mw.layout_grid(mixed).blocks[0].labels == (
        '2 replicas on processes 0,1',
        'x2 processes 0,1',
        'x2',
    )


def test_device_labels_read_host_dev_id():
    """Every single-device block reads 'host p · dev i (id n)'; no bare id lists."""
    g = mw.layout_grid(host_by_dev())
    assert [b.label for b in g.blocks] == [
        f'process {h} · dev {d} (id {did(h, d)})' for h in range(4) for d in range(2)
    ]
    numpy_value = Layout.from_placements((3,), 'int8', [([(0, 3)], None, 0)], sharding='numpy')
    assert mw.layout_grid(numpy_value).blocks[0].label == 'process 0 · host memory'
    with pytest.raises(ValueError, match='form'):
        block_label(numpy_value, numpy_value.blocks()[0], 'huge')


def test_labels_take_one_form_per_grid():
    """Where one block's long name does not fit, every block of the grid takes the shorter
    form (not one block named with its id and its neighbour without)."""
    grid = mw.layout_grid(host_by_dev())  # blocks 6 elements wide
    first, third = grid.blocks[0], grid.blocks[2]  # ids 0 and 2048
    w = 26 * 6  # px: 'process 0 · dev 0 (id 0)' fits, 'process 1 · dev 0 (id 2048)' does not
    assert _label_lines(first, w, 40) == ['process 0 · dev 0 (id 0)']
    assert _label_lines(third, w, 40) == ['process 1 · dev 0']
    assert _label_level(grid, 26, 10) == 1
    assert _label_lines(first, w, 40, 1) == ['process 0 · dev 0']
    assert _label_level(grid, 40, 10) == 0


# -- the replica matrix -------------------------------------------------------------------


def test_replica_matrix_of_p_unspecified_has_a_cell_per_device():
    """P() with host 2 odd: one row, 8 device columns grouped by host, host 2's 2 cells odd."""
    m = replica_matrix(report(replicated()))
    assert [(c.process, c.device_id, c.label) for c in m.columns] == [
        (h, did(h, d), f'{d}') for h in range(4) for d in range(2)
    ]
    (row,) = m.rows
    assert row.flagged and len(m.cells()) == 8
    assert [c.text for c in row.cells] == ['a', 'a', 'a', 'a', 'b', 'b', 'a', 'a']
    assert [c.odd for c in row.cells] == [False] * 4 + [True] * 2 + [False] * 2
    assert {c.digests for c in row.cells} == {(GOOD,), (BAD,)}
    html = replica_matrix_html(m)
    cells = elements(html, 'mh-replica-cell', 'td')
    assert len(cells) == 8 and len(elements(html, 'mh-replica-matrix', 'table')) == 1
    odd = elements(html, 'mh-replica-odd', 'td')
    assert [c['attrs']['title'].split(':')[0] for c in odd] == [
        'process 2 · dev 0 (id 4096)',
        'process 2 · dev 1 (id 4097)',
    ]
    assert all('mh-host-2' in c['classes'] for c in odd)
    heads = [h['text'].strip() for h in elements(html, tag='th')]
    assert heads[:5] == ['process', 'process 0', 'process 1', 'process 2', 'process 3']
    assert heads[5:14] == ['dev', '0', '1', '0', '1', '0', '1', '0', '1']


def test_replica_matrix_without_report_is_neutral():
    """No report: the cells say nothing was compared (one colour, no letters, none odd)."""
    m = replica_matrix(replicated())
    assert not m.checked and 'not compared' in m.caption()
    assert {(c.color, c.text, c.odd) for c in m.cells()} == {(UNCHECKED_COLOR, '', False)}
    assert replica_matrix_text(m) == ''


def test_replica_matrix_rows_are_blocks_and_empty_cells_where_a_device_lacks_it():
    """P('host', None): 4 blocks x 8 devices, 2 replicas each; only device 4097 odd (a tie)."""
    m = replica_matrix(report(rows_by_host(), lambda s: s.device_id == did(2, 1)))
    assert len(m.rows) == 4 and len(m.columns) == 8 and len(m.cells()) == 8
    assert [sum(c is not None for c in r.cells) for r in m.rows] == [2, 2, 2, 2]
    assert [c.device_ids for c in m.cells() if c.odd] == [(did(2, 1),)]
    html = replica_matrix_html(m)
    assert len(elements(html, 'mh-replica-empty', 'td')) == 24
    assert len(elements(html, 'mh-flagged', 'tr')) == 1 and 'a tie' in html
    # P('dev'): each block on one device of every host; host 3's copies odd in both rows
    m2 = replica_matrix(report(rows_by_dev(), lambda s: s.process_index == 3))
    assert [[c.process for c in r.cells if c is not None and c.odd] for r in m2.rows] == [[3], [3]]


def test_replica_matrix_caps_rows_with_the_flagged_ones_kept():
    """40 replicated blocks, 3 of them odd beyond the cap: 16 rows shown, the odd ones in."""
    placements = [
        ([(i, i + 1)], d, d // 2) for i in range(40) for d in (2 * (i % 4), 2 * (i % 4) + 1)
    ]
    layout = Layout.from_placements((40,), 'float32', placements)
    bad = {30, 35, 39}
    m = replica_matrix(report(layout, lambda s: s.index[0][0] in bad and s.replica_id == 1))
    assert len(m.rows) == MAX_MATRIX_ROWS and m.replicated == 40 and m.more == 24
    assert {r.block.index[0][0] for r in m.rows if r.flagged} == bad
    assert [r.block.index for r in m.rows] == sorted(r.block.index for r in m.rows)
    assert '24 more replicated blocks not shown (those that differ come first)' in m.caption()


def test_replica_matrix_of_many_hosts_has_host_columns_and_keeps_odd_hosts():
    """P() over 100 hosts x 2 devices: one column per host, the first 16 and the odd one."""
    placements = [([(0, 4)], 1000 * h + d, h) for h in range(100) for d in range(2)]
    layout = Layout.from_placements((4,), 'float32', placements)
    m = replica_matrix(report(layout, lambda s: s.process_index == 77))
    assert m.per_host
    real = [c for c in m.columns if not c.gap]
    assert [c.process for c in real] == [*range(16), 77]
    assert [c.gap for c in m.columns if c.gap] == [61, 22]  # hosts 16-76, 78-99
    (row,) = m.rows
    odd = [c for c in row.cells if c is not None and c.odd]
    assert [(c.process, c.device_ids) for c in odd] == [(77, (77000, 77001))]
    html = replica_matrix_html(m)
    assert len(elements(html, 'mh-replica-cell', 'td')) == 17
    assert len(elements(html, 'mh-replica-gap', 'th')) == 2
    assert '83 more processes in the … columns, none holding an odd replica' in m.caption()


# -- facets -------------------------------------------------------------------------------


def test_nd_arrays_facet_over_the_leading_dimensions():
    """A 3-D array shows its last two axes, one facet per block range of dim 0."""
    f = layout_facets(batch_3d())
    assert f.axes == (1, 2) and f.other_axes == (0,) and f.total == 4 and f.more == 0
    assert [x.title for x in f.facets] == [
        '[0:2, :, :]',
        '[2:4, :, :]',
        '[4:6, :, :]',
        '[6:8, :, :]',
    ]
    assert [len(x.grid.blocks) for x in f.facets] == [2, 2, 2, 2]
    assert [x.grid.blocks[0].processes for x in f.facets] == [(0,), (1,), (2,), (3,)]
    assert f.describe() == '4 facets over dim 0'
    # a 2-D array is one untitled facet
    (only,) = layout_facets(host_by_dev()).facets
    assert only.title == '' and len(only.grid.blocks) == 8


def test_facets_are_capped_and_the_rest_counted():
    """40 facets: 16 shown, '+24 more' said; a position further on shows its page."""
    f = layout_facets(many_facets())
    assert len(f.facets) == MAX_FACETS == 16 and f.total == 40 and f.more == 24
    assert f.facets[0].title == '[0, :, :]' and f.facets[-1].title == '[15, :, :]'
    assert f.more_text().startswith('+24 more facets')
    page = layout_facets(many_facets(), fixed={0: 20})
    assert [x.number for x in page.facets] == list(range(16, 32)) and page.current == 20
    assert page.describe() == 'facets 17-32 of 40 over dim 0'
    last = layout_facets(many_facets(), fixed={0: 39})
    assert len(last.facets) == 8
    v = mw.LayoutView(many_facets())
    assert len(find(v.widget, 'mh-layout-facet')) == 16
    assert len(find(v.widget, 'mh-layout-facets-more')) == 1
    static = v.static_html()
    assert len(elements(static, 'mh-layout-facet')) == 16
    assert '+24 more facets' in elements(static, 'mh-layout-facets-more')[0]['text']
    # the sliders page through the facets
    controls = find(v.widget, 'mh-layout-controls')[0]
    assert controls.children[2].layout.display == 'flex'
    find(v.widget, 'mh-layout-slider-0')[0].value = 33
    assert v.facets.facets[0].number == 32 and len(find(v.widget, 'mh-layout-facet')) == 8


def test_facet_picture_renders():
    """Facets render as one PNG of the requested width; more facets, a taller picture."""
    four = mw.render_layout_png(layout_facets(batch_3d()), width=640)
    many = mw.render_layout_png(layout_facets(many_facets()), width=640)
    assert png_size(four)[0] == png_size(many)[0] == 640 and png_size(many)[1] > png_size(four)[1]


# -- the mesh -----------------------------------------------------------------------------


def test_mesh_view_says_which_axes_cross_hosts():
    """host x dev: 'host' crosses hosts, 'dev' stays within one; devices by mesh position."""
    axes = mesh_axes_info(host_by_dev())
    assert [(a.name, a.size, a.hosts, a.crosses_hosts, a.sharded_dims) for a in axes] == [
        ('host', 4, 4, True, (0,)),
        ('dev', 2, 1, False, (1,)),
    ]
    html = mesh_html(host_by_dev())
    assert len(elements(html, 'mh-mesh-view')) == 1
    crossing = elements(html, 'mh-crosses-hosts', 'tr')
    within = elements(html, 'mh-within-host', 'tr')
    assert [r['text'][:4] for r in crossing] == ['host'] and 'crosses processes' in crossing[0][
        'text'
    ]
    assert [r['text'][:3] for r in within] == ['dev'] and 'within a process' in within[0]['text']
    cells = elements(html, 'mh-mesh-device', 'td')
    assert [c['text'] for c in cells] == [
        f'process {h} · dev {d} (id {did(h, d)})' for h in range(4) for d in range(2)
    ]
    assert 'mh-host-3' in cells[-1]['classes']


def test_mesh_view_of_a_flat_mesh_and_without_a_mesh():
    """A 1-d mesh over every device crosses hosts; a layout without a mesh has no mesh view."""
    (x,) = mesh_axes_info(rows_over_x())
    assert x.crosses_hosts and x.hosts == 4 and x.verdict == 'crosses processes (4 along it)'
    html = mesh_html(rows_over_x())
    assert len(elements(html, 'mh-mesh-device', 'td')) == 8
    plain = Layout.from_placements((4,), 'float32', [([(0, 4)], 0, 0)])
    assert mesh_axes_info(plain) == () and mesh_html(plain) == ''
    abstract = Layout.from_placements(
        (4,), 'float32', [([(0, 4)], 0, 0)], mesh_axes=(('x', 1),), spec="P('x')"
    )
    assert mesh_axes_info(abstract)[0].verdict.startswith('unknown')
    big = Layout.from_placements(
        (1024,),
        'float32',
        [([(i, i + 1)], i, i // 8) for i in range(1024)],
        mesh_axes=(('x', 1024),),
        mesh_device_ids=tuple(range(1024)),
    )
    html = mesh_html(big)
    assert len(elements(html, 'mh-mesh-device', 'td')) == MAX_MESH_CELLS
    assert '+768 more rows' in html


def test_layout_view_shows_mesh_and_replicas_in_widget_static_and_text():
    """The view holds the replica matrix and the mesh view, in its widget, its static picture
    and its text."""
    v = mw.LayoutView(report(replicated()))
    (replicas,) = find(v.widget, 'mh-layout-replicas')
    (mesh,) = find(v.widget, 'mh-layout-mesh')
    assert len(elements(replicas.value, 'mh-replica-cell', 'td')) == 8
    assert len(elements(mesh.value, 'mh-crosses-hosts', 'tr')) == 1
    static = v.static_html()
    assert len(elements(static, 'mh-layout-static')) == 1
    assert len(elements(static, 'mh-replica-cell', 'td')) == 8
    assert len(elements(static, 'mh-replica-odd', 'td')) == 2
    assert len(elements(static, 'mh-mesh-view')) == 1
    text = v.text()
    assert 'mesh host=4 crosses processes (4 along it), dev=2 within a process' in text
    assert 'b: process 2 · dev 0 (id 4096) (odd), process 2 · dev 1 (id 4097) (odd)' in text
    # no replicated block: no matrix; no mesh: no mesh view
    plain = mw.LayoutView(Layout.from_placements((4,), 'float32', [([(0, 4)], 0, 0)]))
    assert find(plain.widget, 'mh-layout-replicas')[0].layout.display == 'none'
    assert find(plain.widget, 'mh-layout-mesh')[0].layout.display == 'none'
    assert IDS[2] == 2048


# -- a whole pytree: TreeLayoutView --------------------------------------------------------


def _tree():
    from multihost import LeafLayout, TreeLayout

    return TreeLayout(
        'state',
        (
            LeafLayout("['w']", host_by_dev()),
            LeafLayout("['b']", replicated(), report(replicated(), lambda s: s.process_index == 2)),
            LeafLayout("['ok']", rows_by_dev(), report(rows_by_dev(), lambda s: False)),
            LeafLayout("['fn']", None, note='a function, not an array'),
        ),
        4,
    )


def test_tree_layout_rows_say_shape_dtype_spec_bytes_and_replicas():
    """One row per leaf; bytes per process from the layout; replicas agree, differ (which host),
    or are not replicated / not checked; a leaf that is not an array says what it is."""
    from multihost import LeafLayout

    tree = _tree()
    rows = tree.rows()
    assert rows[0] == (
        "['w']",
        '[16, 12]',
        'float32',
        "P('host', 'dev')",
        '192 B each',
        'not checked',
    )
    assert rows[1][1:] == ('[8]', 'float32', 'P()', '64 B each', 'DIFFER on process 2')
    assert rows[2][5] == 'agree'
    assert rows[3] == ("['fn']", '', 'a function, not an array', '', '', '')
    assert tree.leaf("['b']").bytes_per_host == {p: 64 for p in range(4)}
    assert not tree.ok and 'replicas DIFFER in 1 leaf' in tree.headline()
    # a host's own numpy value, and an array on two of the four hosts' devices
    local = Layout.from_placements(
        (3,), 'float32', [([(0, 3)], None, 0)], sharding='numpy', num_processes=4
    )
    half = Layout.from_placements(
        (4,), 'float32', [([(0, 2)], did(0, 0), 0), ([(2, 4)], did(1, 0), 1)], num_processes=4
    )
    assert LeafLayout('x', local).bytes_text() == "12 B (host-local: process 0's own)"
    assert LeafLayout('x', local).replicas_text() == 'host-local: compare with %mh_diff'
    assert LeafLayout('x', half).bytes_text() == '0 B to 8 B (held on processes 0-1)'
    with pytest.raises(KeyError, match='state has no leaf'):
        tree.leaf("['nope']")
    text = str(tree)
    assert text.splitlines()[1].split() == [
        'leaf',
        'shape',
        'dtype',
        'spec',
        'bytes',
        'per',
        'process',
        'replicas',
    ]


def test_tree_layout_view_click_shows_the_leaf_layout():
    """A click on a leaf's button shows its LayoutView (with its report) below the table; the
    static picture is the table plus that leaf's picture; values come from the callback."""
    asked = []

    def values(path):
        asked.append(path)
        return None

    view = mw.TreeLayoutView(_tree(), values=values)
    buttons = find(view.widget, 'mh-tree-leaf')
    assert [b.description for b in buttons] == ["['w']", "['b']", "['ok']", "['fn']"]
    assert buttons[3].disabled and 'mh-flagged' in buttons[1]._dom_classes
    assert view.leaf_view is None
    buttons[1].click()
    assert view.selected == "['b']" and asked == ["['b']"]
    assert view.leaf_view.layout == replicated() and not view.leaf_view.report.ok
    assert 'mh-selected' in buttons[1]._dom_classes
    html = view.static_html()
    rows = elements(html, 'mh-tree-row', 'tr')
    assert len(rows) == 4 and [('mh-selected' in r['classes']) for r in rows] == [0, 1, 0, 0]
    assert [r['attrs']['data-path'] for r in rows] == ["['w']", "['b']", "['ok']", "['fn']"]
    assert 'mh-layout-static' in html  # the chosen leaf's picture follows the table
    buttons[0].click()
    assert view.leaf_view.layout == host_by_dev() and 'mh-selected' not in buttons[1]._dom_classes
    with pytest.raises(ValueError, match='has no layout'):
        view.select("['fn']")
    assert "state['w']:" in view.text()


def test_tree_layout_view_of_many_leaves_is_capped():
    """A tree of 1,000 leaves: MAX_TREE_ROWS rows, the rest counted with a subtree to name;
    the view is built without a row per leaf (bounded, not timed: a benchmark's job)."""
    import html
    import time

    from multihost import LeafLayout, TreeLayout

    leaf = rows_by_dev()
    tree = TreeLayout('big', tuple(LeafLayout(f"['l{i}']", leaf) for i in range(1000)), 4)
    t0 = time.perf_counter()
    view = mw.TreeLayoutView(tree)
    built = time.perf_counter() - t0
    assert len(find(view.widget, 'mh-tree-leaf')) == MAX_TREE_ROWS
    (more,) = find(view.widget, 'mh-tree-more')
    assert more.value.startswith(f'... {1000 - MAX_TREE_ROWS} more leaves (of 1000)')
    assert "%mh_layout big['l200']" in html.unescape(more.value)
    assert len(elements(view.static_html(), 'mh-tree-row', 'tr')) == MAX_TREE_ROWS
    # a bound against building every row (minutes), not a speed check: a loaded 2-core CI
    # machine took 7.1 s for what takes well under one alone
    assert built < 30.0, built


# -- layout grid (pure) -------------------------------------------------------------------


def test_grid_2d_rectangles_hosts_and_labels():
    """A 2-D grid has one rectangle per block, placed by its index, named by its device."""
    g = mw.layout_grid(layout_2d())
    assert g.axes == (0, 1) and g.fixed == () and g.extent == (4, 6)
    assert [(b.rows, b.cols, b.processes, b.label) for b in g.blocks] == [
        ((0, 2), (0, 3), (0,), 'process 0 · dev 0 (id 0)'),
        ((0, 2), (3, 6), (0,), 'process 0 · dev 1 (id 1)'),
        ((2, 4), (0, 3), (1,), 'process 1 · dev 0 (id 2)'),
        ((2, 4), (3, 6), (1,), 'process 1 · dev 1 (id 3)'),
    ]
    assert [b.labels[1:] for b in g.blocks][2] == ('process 1 · dev 0', 'p1·d0')
    assert g.row_cuts == (0, 2, 4) and g.col_cuts == (0, 3, 6)
    assert [b.colors for b in g.blocks] == [(mw.host_color(0),)] * 2 + [(mw.host_color(1),)] * 2
    assert mw.host_color(0) != mw.host_color(1)


def test_grid_transposed_axes():
    """Displaying axes (1, 0) puts dimension 1 on the rows."""
    g = mw.layout_grid(layout_2d(), axes=(1, 0))
    assert g.extent == (6, 4)
    assert {(b.rows, b.cols) for b in g.blocks} == {
        ((0, 3), (0, 2)),
        ((3, 6), (0, 2)),
        ((0, 3), (2, 4)),
        ((3, 6), (2, 4)),
    }


def test_grid_3d_position_selects_visible_blocks():
    """In 3-D, the position along the third axis decides which blocks are visible."""
    layout = layout_3d()
    at0 = mw.layout_grid(layout, (0, 1), {2: 0})
    at1 = mw.layout_grid(layout, (0, 1), {2: 1})
    assert [b.index[2] for b in at0.blocks] == [(0, 1), (0, 1)]
    assert [b.index[2] for b in at1.blocks] == [(1, 2), (1, 2)]
    assert at1.slice_text() == '[:, :, 1]' and at1.fixed == ((2, 1),)
    side = mw.layout_grid(layout, (0, 2), {1: 5})  # every block spans dim 1
    assert len(side.blocks) == 4 and side.extent == (4, 2)


def test_grid_1d_is_one_row_and_0d_one_block():
    """A 1-d array is one row of blocks; a 0-d array is a single block."""
    one_d = Layout.from_placements((16,), 'int8', [([(4 * i, 4 * i + 4)], i, i) for i in range(4)])
    g = mw.layout_grid(one_d)
    assert g.axes == (0,) and g.extent == (1, 16)
    assert [(b.rows, b.cols) for b in g.blocks] == [((0, 1), (4 * i, 4 * i + 4)) for i in range(4)]
    zero_d = Layout.from_placements((), 'float32', [((), 0, 0), ((), 1, 1)])
    g0 = mw.layout_grid(zero_d)
    assert g0.axes == () and g0.extent == (1, 1) and g0.slice_text() == '[]'
    (b,) = g0.blocks
    assert (b.rows, b.cols, b.processes, b.replica_count) == ((0, 1), (0, 1), (0, 1), 2)


def test_grid_replica_counts_and_hosts():
    """A block held by devices on two hosts counts both replicas and lists both hosts."""
    layout = Layout.from_placements(
        (4,), 'float32', [([(0, 2)], 0, 0), ([(0, 2)], 2, 1), ([(2, 4)], 1, 0), ([(2, 4)], 3, 1)]
    )
    g = mw.layout_grid(layout)
    assert [(b.replica_count, b.processes, b.label) for b in g.blocks] == [
        (2, (0, 1), '2 replicas: dev 0 of processes 0,1'),
        (2, (0, 1), '2 replicas: dev 1 of processes 0,1'),
    ]
    # drawn once, in the shared grey (no host's colour), whatever the number of hosts
    assert all(b.fill == SHARED_COLOR for b in g.blocks)


def test_grid_flags_exactly_the_disagreeing_blocks():
    """Blocks whose replicas differ in the report are flagged, with the odd devices."""
    layout = layout_3d()
    g = mw.layout_grid(report(layout, on_devices(7)), (0, 1), {2: 1})
    assert [(b.index, b.flagged, b.odd_devices) for b in g.blocks] == [
        (((0, 2), (0, 6), (1, 2)), False, ()),
        (((2, 4), (0, 6), (1, 2)), True, (7,)),
    ]
    assert mw.layout_grid(layout, (0, 1), {2: 0}, report(layout, on_devices(7))).flagged == ()


def test_grid_rejects_bad_axes_and_positions():
    """Invalid axes or positions raise ValueError naming the problem."""
    layout = layout_3d()
    with pytest.raises(ValueError, match='must differ'):
        mw.layout_grid(layout, (1, 1))
    with pytest.raises(ValueError, match='out of range'):
        mw.layout_grid(layout, (0, 3))
    with pytest.raises(ValueError, match='outside axis 2'):
        mw.layout_grid(layout, (0, 1), {2: 2})
    with pytest.raises(ValueError, match='is displayed'):
        mw.layout_grid(layout, (0, 1), {1: 0})
    with pytest.raises(TypeError, match='multihost.Layout'):
        mw.layout_grid([1, 2])


def test_png_renders_every_rank():
    """The picture is a non-empty PNG of the requested width for 0-d to 3-d and empty arrays."""
    layouts = [
        Layout.from_placements((), 'float32', [((), 0, 0)]),
        Layout.from_placements((8,), 'int8', [([(0, 4)], 0, 0), ([(4, 8)], 1, 1)]),
        layout_2d(),
        layout_3d(),
        Layout.from_placements((0, 3), 'float32', [([(0, 0), (0, 3)], 0, 0)]),
    ]
    for layout in layouts:
        png = mw.render_layout_png(mw.layout_grid(layout), width=500)
        assert is_png(png), layout.shape
        assert png_size(png)[0] == 500


def test_png_shows_selection_and_flags():
    """Selecting or flagging a block changes the picture."""
    layout = layout_3d()
    plain = mw.render_layout_png(mw.layout_grid(layout, (0, 1), {2: 1}))
    flagged = mw.render_layout_png(mw.layout_grid(report(layout, on_devices(7)), (0, 1), {2: 1}))
    grid = mw.layout_grid(layout, (0, 1), {2: 1})
    selected = mw.render_layout_png(grid, selected=grid.blocks[0].index)
    assert len({plain, flagged, selected}) == 3


# -- layout view ------------------------------------------------------------------------


def test_layout_view_controls_follow_rank():
    """Rank >= 2 gets two axis dropdowns (default: the last two axes) and sliders for the
    others; 1-d and 0-d none."""
    v3 = mw.LayoutView(layout_3d())
    axes = find(v3.widget, 'mh-layout-axis')
    assert [a.value for a in axes] == [1, 2]
    assert all(a.layout.display != 'none' for a in axes)
    sliders = [s for s in find(v3.widget, 'mh-layout-controls')[0].children[2].children]
    assert [s.description for s in sliders] == ['dim 0'] and sliders[0].max == 3
    v1 = mw.LayoutView(Layout.from_placements((8,), 'int8', [([(0, 8)], 0, 0)]))
    assert all(a.layout.display == 'none' for a in find(v1.widget, 'mh-layout-axis'))
    assert find(v1.widget, 'mh-layout-slider') == []
    v0 = mw.LayoutView(Layout.from_placements((), 'float32', [((), 0, 0)]))
    assert len(find(v0.widget, 'mh-layout-block')) == 1
    assert is_png(one(v0.widget, 'mh-layout-image').value)


def test_layout_view_facets_show_every_slice():
    """A 3-D array shows one facet per range of the other axis, each with its blocks; the
    slider (hidden: every facet fits) only moves `grid`, the plane at its position."""
    v = mw.LayoutView(layout_3d(), axes=(0, 1))
    facets = find(v.widget, 'mh-layout-facet')
    assert len(facets) == 2 == v.facets.total and v.facets.more == 0
    titles = [one(f, 'mh-layout-facet-title').value for f in facets]
    assert ['[:, :, 0]' in t for t in titles] == [True, False] and '[:, :, 1]' in titles[1]
    per_facet = [[b.tooltip.split(': ')[0] for b in find(f, 'mh-layout-block')] for f in facets]
    assert per_facet == [
        ['[0:2, 0:6, 0:1]', '[2:4, 0:6, 0:1]'],
        ['[0:2, 0:6, 1:2]', '[2:4, 0:6, 1:2]'],
    ]
    controls = one(v.widget, 'mh-layout-controls')
    assert controls.children[2].layout.display == 'none'  # nothing to page through
    before = one(v.widget, 'mh-layout-image').value
    one(v.widget, 'mh-layout-slider-2').value = 1
    assert v.grid.fixed == ((2, 1),) and len(find(v.widget, 'mh-layout-facet')) == 2
    assert one(v.widget, 'mh-layout-image').value == before  # the same facets drawn


def test_layout_view_axis_dropdowns_swap():
    """Choosing the other dropdown's axis swaps the two; the slider follows the hidden axis."""
    v = mw.LayoutView(layout_3d(), axes=(0, 1))
    rows, cols = find(v.widget, 'mh-layout-axis')
    rows.value = 1
    assert (rows.value, cols.value) == (1, 0) and v.grid.axes == (1, 0)
    cols.value = 2
    assert v.grid.axes == (1, 2)
    shown = [s for s in find(v.widget, 'mh-layout-controls')[0].children[2].children]
    assert [s.description for s in shown] == ['dim 0']


def test_layout_view_buttons_coloured_by_host():
    """Every visible block has a button with its host's class and colour and its device ids."""
    v = mw.LayoutView(layout_2d())
    buttons = find(v.widget, 'mh-layout-block')
    assert [b.description for b in buttons] == [
        'process 0 · dev 0 (id 0)',
        'process 0 · dev 1 (id 1)',
        'process 1 · dev 0 (id 2)',
        'process 1 · dev 1 (id 3)',
    ]
    for b, host in zip(buttons, [0, 0, 1, 1]):
        assert f'mh-host-{host}' in b._dom_classes
        assert b.style.button_color == mw.host_color(host)
    assert [b.layout.grid_row for b in buttons] == ['1 / 2', '1 / 2', '2 / 3', '2 / 3']
    assert [b.layout.grid_column for b in buttons] == ['1 / 2', '2 / 3', '1 / 2', '2 / 3']


def test_layout_view_click_shows_shard_info_and_values():
    """Clicking a block shows its index, devices, processes, replica ids, bytes and values."""
    values = np.arange(48, dtype=np.float32).reshape(4, 6, 2)
    v = mw.LayoutView(layout_3d(), values=values, axes=(0, 1))
    info = one(v.widget, 'mh-layout-info')
    assert 'Select a block' in info.value
    button = find(v.widget, 'mh-layout-block')[1]  # [2:4, 0:6, 0:1] on devices 4, 5 of host 1
    button.click()
    assert v.selected == ((2, 4), (0, 6), (0, 1))
    assert 'mh-selected' in button._dom_classes
    assert one(v.widget, 'mh-layout-select').value == v.selected
    (shards,) = elements(info.value, 'mh-shards', 'table')
    rows = [
        [td['text'].strip() for td in elements(info.value, tag='td') if inside(td, tr)]
        for tr in elements(info.value, tag='tr')
        if inside(tr, shards)
    ][1:]
    # replica, device, bytes
    assert rows == [
        ['0', 'process 1 · dev 0 (id 4)', '48 B'],
        ['1', 'process 1 · dev 1 (id 5)', '48 B'],
    ]
    assert '[2:4, 0:6, 0:1]' in info.value and '2 replica(s)' in info.value
    (pre,) = elements(info.value, 'mh-values')
    expected = np.array2string(values[2:4, :, 0:1])
    assert pre['text'] == expected
    find(v.widget, 'mh-layout-block')[0].click()
    assert 'mh-selected' not in button._dom_classes


def test_layout_view_select_moves_slider_to_the_block():
    """Selecting a block that is not at the sliders' position moves them so it is."""
    v = mw.LayoutView(layout_3d(), axes=(0, 1))
    v.select(((0, 2), (0, 6), (1, 2)))
    assert one(v.widget, 'mh-layout-slider-2').value == 1
    assert v.grid.find(v.selected) is not None
    assert '[0:2, 0:6, 1:2]' in one(v.widget, 'mh-layout-info').value
    with pytest.raises(ValueError, match='no block'):
        v.select(((0, 1), (0, 6), (1, 2)))
    v.select(None)
    assert v.selected is None and one(v.widget, 'mh-layout-select').value is None


def test_layout_view_select_dropdown_selects():
    """Picking a block in the list selects it like a click."""
    v = mw.LayoutView(layout_2d())
    dd = one(v.widget, 'mh-layout-select')
    dd.value = ((2, 4), (3, 6))
    assert v.selected == ((2, 4), (3, 6))
    assert 'mh-selected' in find(v.widget, 'mh-layout-block')[3]._dom_classes


def test_layout_view_legend_bytes_per_host():
    """The legend lists every host with its colour and the bytes its devices hold."""
    layout = layout_3d()
    v = mw.LayoutView(layout)
    html = one(v.widget, 'mh-layout-legend').value
    for p, n in layout.bytes_per_process().items():
        (row,) = elements(html, f'mh-host-{p}', 'tr')
        assert format_bytes(n) in row['text'] and f'process {p}' in row['text']
        assert mw.host_color(p) in html
    assert 'x2' in html  # every block is stored twice


def test_layout_view_legend_bounded_for_many_hosts():
    """With hundreds of hosts the legend stays short and says how processes past the palette are
    coloured; colours do not wrap around (host 20 is not host 0's colour)."""
    layout = Layout.from_placements((300,), 'float32', [([(i, i + 1)], i, i) for i in range(300)])
    v = mw.LayoutView(layout)
    html = one(v.widget, 'mh-layout-legend').value
    assert len(elements(html, 'mh-legend-host', 'tr')) == 32
    assert '268 more processes' in html and 'processes past 20 get hues of their own' in html
    assert mw.host_color(20) != mw.host_color(0) and mw.host_color(40) != mw.host_color(20)
    assert find(v.widget, 'mh-layout-block') == []  # 300 > MAX_BUTTONS: the list only
    assert len(one(v.widget, 'mh-layout-select').options) == 300 > MAX_BUTTONS


def test_layout_view_flags_disagreeing_replicas():
    """With a report, the header says replicas differ and the odd block's button is flagged."""
    layout = layout_3d()
    v = mw.LayoutView(layout, report(layout, on_devices(7)), axes=(0, 1))
    header = one(v.widget, 'mh-layout-header').value
    (verdict,) = elements(header, 'mh-flagged')
    assert 'DIFFER' in verdict['text'] and 'process 1' in verdict['text']
    assert 'process 1 · dev 3 (id 7)' in verdict['text']
    flagged = find(v.widget, 'mh-flagged')  # both facets shown: one flagged block in all
    assert [b.tooltip.split(': ')[0] for b in flagged] == ['[2:4, 0:6, 1:2]']
    flagged[0].click()
    info = one(v.widget, 'mh-layout-info').value
    odd_rows = elements(info, 'mh-odd-host', 'tr')
    assert len(odd_rows) == 1 and 'differs' in odd_rows[0]['text']
    ok = mw.LayoutView(report(layout, on_devices()))
    assert elements(one(ok.widget, 'mh-layout-header').value, 'mh-ok')


def test_layout_view_update_keeps_axes_and_position():
    """Updating with a layout of the same shape keeps the axes, slice and selection."""
    layout = layout_3d()
    v = mw.LayoutView(layout, axes=(0, 2))
    one(v.widget, 'mh-layout-slider-1').value = 4
    v.select(((2, 4), (0, 6), (1, 2)))
    v.update(layout, report(layout, on_devices(7)))
    assert v.grid.axes == (0, 2) and v.grid.fixed == ((1, 4),)
    assert v.selected == ((2, 4), (0, 6), (1, 2))
    assert v.grid.find(v.selected).flagged
    v.update(layout_2d())
    assert v.grid.axes == (0, 1) and v.selected is None


def test_layout_view_rejects_values_of_another_shape():
    """Values whose shape is not the layout's raise ValueError with both shapes."""
    with pytest.raises(ValueError, match=r'\(4, 6\).*\(4, 6, 2\)'):
        mw.LayoutView(layout_3d(), values=np.zeros((4, 6)))


def test_layout_view_rerender_does_not_leak_widgets():
    """Moving sliders many times closes the replaced buttons (no growing comm count)."""
    v = mw.LayoutView(layout_3d(), axes=(0, 1))
    slider = one(v.widget, 'mh-layout-slider-2')
    slider.value = 1
    slider.value = 0
    count = len(_instances)
    for i in range(10):
        slider.value = i % 2
    assert len(_instances) == count


def test_layout_view_text_fallback():
    """The text/plain form is the layout's (and report's) own text."""
    layout = layout_3d()
    odd = report(layout, on_devices(7))
    v = mw.LayoutView(layout, odd)
    bundle = v._repr_mimebundle_()
    matrix = replica_matrix_text(v.matrix)
    assert bundle['text/plain'] == f'{layout}\n{matrix}\n{odd}' == str(v)
    assert 'b: process 1 · dev 3 (id 7) (odd)' in matrix
    assert str(mw.LayoutView(layout)) == str(layout)  # nothing compared: the layout alone
    assert bundle['application/vnd.jupyter.widget-view+json']['model_id'] == v.widget.model_id
    assert repr(v).startswith('<LayoutView: float32[4, 6, 2]')
