"""The layout view's geometry from synthetic models (no cluster, no browser): a replicated
block drawn once with its replica matrix, device names, facets over the leading dimensions
(capped), the mesh view and which axes cross hosts."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from _layout_cases import (
    BAD,
    GOOD,
    IDS,
    batch_3d,
    did,
    host_by_dev,
    many_facets,
    replicated,
    report,
    rows_by_dev,
    rows_by_host,
    rows_over_x,
)

from mhnotebook import widgets as mw
from mhnotebook.widgets.layout.facets import MAX_FACETS, layout_facets
from mhnotebook.widgets.layout.grid import SHARED_COLOR, block_label
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


class _Tags(HTMLParser):
    """Start tags with their classes and the text inside them."""

    VOID = {'br', 'img', 'hr', 'meta', 'input', 'col'}

    def __init__(self):
        super().__init__()
        self.found, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        el = {'tag': tag, 'attrs': a, 'classes': set((a.get('class') or '').split()), 'text': ''}
        self.found.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()['tag'] == tag:
                break

    def handle_data(self, data):
        for el in self.stack:
            if el['tag'] != 'style':
                el['text'] += data


def tags(html, cls=None, tag=None):
    p = _Tags()
    p.feed(html)
    return [
        e
        for e in p.found
        if (cls is None or cls in e['classes']) and (tag is None or e['tag'] == tag)
    ]


def find(widget, cls):
    out = [widget] if cls in getattr(widget, '_dom_classes', ()) else []
    for child in getattr(widget, 'children', ()):
        out += find(child, cls)
    return out


# -- a replicated block is one block ------------------------------------------------------


def test_replicated_block_is_drawn_once_in_the_shared_colour():
    """P() over 4 hosts x 2 devices: one block (not a strip per host), grey, named by its
    replica count and hosts; one button; one block in the static picture."""
    layout = replicated()
    (b,) = mw.layout_grid(layout).blocks
    assert b.fill == SHARED_COLOR and b.replica_count == 8
    assert b.labels == ('8 replicas: dev 0,1 of hosts 0-3', 'x8 dev 0,1 of hosts 0-3', 'x8')
    v = mw.LayoutView(report(layout))
    assert len(find(v.widget, 'mh-layout-block')) == 1
    static = v.static_html()
    assert len(tags(static, 'mh-layout-block')) == 1
    assert len(tags(static, 'mh-layout-facet')) == 1


def test_flagged_block_says_how_many_replicas_differ_and_where():
    """The flagged block's label says which hosts hold odd replicas, not the whole bar."""
    (b,) = mw.layout_grid(report(replicated())).blocks
    assert b.flagged and b.odd_devices == (did(2, 0), did(2, 1)) and b.odd_processes == (2,)
    assert b.odd_text == '2 of 8 replicas differ (host 2)'
    assert _label_lines(b, 600, 60) == ['8 replicas: dev 0,1 of hosts 0-3', '! ' + b.odd_text]
    assert _label_lines(b, 40, 14) == ['! x8']


def test_block_on_one_host_keeps_the_host_colour_and_names_its_devices():
    """A block replicated on two devices of one host is that host's colour."""
    g = mw.layout_grid(rows_by_host())
    assert [b.fill for b in g.blocks] == [mw.host_color(h) for h in range(4)]
    assert g.blocks[1].labels == (
        'host 1 · dev 0,1 (ids 2048,2049)',
        'host 1 · dev 0,1',
        'h1·d0,1',
    )


def test_blocks_across_hosts_say_which_devices_when_alike():
    """P('dev'): block 0 is dev 0 of every host, block 1 dev 1; different devices per host:
    only the hosts."""
    g = mw.layout_grid(rows_by_dev())
    assert [b.label for b in g.blocks] == [
        '4 replicas: dev 0 of hosts 0-3',
        '4 replicas: dev 1 of hosts 0-3',
    ]
    mixed = Layout.from_placements(
        (2,), 'float32', [([(0, 2)], 0, 0), ([(0, 2)], 2049, 1)], local_indices=((0, 0), (2049, 1))
    )
    assert mw.layout_grid(mixed).blocks[0].labels == (
        '2 replicas on hosts 0,1',
        'x2 hosts 0,1',
        'x2',
    )


def test_device_labels_read_host_dev_id():
    """Every single-device block reads 'host p · dev i (id n)'; no bare id lists."""
    g = mw.layout_grid(host_by_dev())
    assert [b.label for b in g.blocks] == [
        f'host {h} · dev {d} (id {did(h, d)})' for h in range(4) for d in range(2)
    ]
    numpy_value = Layout.from_placements((3,), 'int8', [([(0, 3)], None, 0)], sharding='numpy')
    assert mw.layout_grid(numpy_value).blocks[0].label == 'host 0 · host memory'
    with pytest.raises(ValueError, match='form'):
        block_label(numpy_value, numpy_value.blocks()[0], 'huge')


def test_labels_take_one_form_per_grid():
    """Where one block's long name does not fit, every block of the grid takes the shorter
    form (not one block named with its id and its neighbour without)."""
    grid = mw.layout_grid(host_by_dev())  # blocks 6 elements wide
    first, third = grid.blocks[0], grid.blocks[2]  # ids 0 and 2048
    w = 23 * 6  # px: 'host 0 · dev 0 (id 0)' fits, 'host 1 · dev 0 (id 2048)' does not
    assert _label_lines(first, w, 40) == ['host 0 · dev 0 (id 0)']
    assert _label_lines(third, w, 40) == ['host 1 · dev 0']
    assert _label_level(grid, 23, 10) == 1
    assert _label_lines(first, w, 40, 1) == ['host 0 · dev 0']
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
    cells = tags(html, 'mh-replica-cell', 'td')
    assert len(cells) == 8 and len(tags(html, 'mh-replica-matrix', 'table')) == 1
    odd = tags(html, 'mh-replica-odd', 'td')
    assert [c['attrs']['title'].split(':')[0] for c in odd] == [
        'host 2 · dev 0 (id 4096)',
        'host 2 · dev 1 (id 4097)',
    ]
    assert all('mh-host-2' in c['classes'] for c in odd)
    heads = [h['text'].strip() for h in tags(html, tag='th')]
    assert heads[:5] == ['host', 'host 0', 'host 1', 'host 2', 'host 3']
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
    assert len(tags(html, 'mh-replica-empty', 'td')) == 24
    assert len(tags(html, 'mh-flagged', 'tr')) == 1 and 'a tie' in html
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
    assert len(tags(html, 'mh-replica-cell', 'td')) == 17
    assert len(tags(html, 'mh-replica-gap', 'th')) == 2
    assert '83 more hosts in the … columns, none holding an odd replica' in m.caption()


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
    assert len(tags(static, 'mh-layout-facet')) == 16
    assert '+24 more facets' in tags(static, 'mh-layout-facets-more')[0]['text']
    # the sliders page through the facets
    controls = find(v.widget, 'mh-layout-controls')[0]
    assert controls.children[2].layout.display == 'flex'
    find(v.widget, 'mh-layout-slider-0')[0].value = 33
    assert v.facets.facets[0].number == 32 and len(find(v.widget, 'mh-layout-facet')) == 8


def test_facet_picture_renders():
    """Facets render as one PNG of the requested width; more facets, a taller picture."""
    four = mw.render_layout_png(layout_facets(batch_3d()), width=640)
    many = mw.render_layout_png(layout_facets(many_facets()), width=640)
    size = lambda png: (int.from_bytes(png[16:20], 'big'), int.from_bytes(png[20:24], 'big'))  # noqa: E731
    assert size(four)[0] == size(many)[0] == 640 and size(many)[1] > size(four)[1]


# -- the mesh -----------------------------------------------------------------------------


def test_mesh_view_says_which_axes_cross_hosts():
    """host x dev: 'host' crosses hosts, 'dev' stays within one; devices by mesh position."""
    axes = mesh_axes_info(host_by_dev())
    assert [(a.name, a.size, a.hosts, a.crosses_hosts, a.sharded_dims) for a in axes] == [
        ('host', 4, 4, True, (0,)),
        ('dev', 2, 1, False, (1,)),
    ]
    html = mesh_html(host_by_dev())
    assert len(tags(html, 'mh-mesh-view')) == 1
    crossing = tags(html, 'mh-crosses-hosts', 'tr')
    within = tags(html, 'mh-within-host', 'tr')
    assert [r['text'][:4] for r in crossing] == ['host'] and 'crosses hosts' in crossing[0]['text']
    assert [r['text'][:3] for r in within] == ['dev'] and 'within a host' in within[0]['text']
    cells = tags(html, 'mh-mesh-device', 'td')
    assert [c['text'] for c in cells] == [
        f'host {h} · dev {d} (id {did(h, d)})' for h in range(4) for d in range(2)
    ]
    assert 'mh-host-3' in cells[-1]['classes']


def test_mesh_view_of_a_flat_mesh_and_without_a_mesh():
    """A 1-d mesh over every device crosses hosts; a layout without a mesh has no mesh view."""
    (x,) = mesh_axes_info(rows_over_x())
    assert x.crosses_hosts and x.hosts == 4 and x.verdict == 'crosses hosts (4 along it)'
    html = mesh_html(rows_over_x())
    assert len(tags(html, 'mh-mesh-device', 'td')) == 8
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
    assert len(tags(html, 'mh-mesh-device', 'td')) == MAX_MESH_CELLS
    assert '+768 more rows' in html


def test_layout_view_shows_mesh_and_replicas_in_widget_static_and_text():
    """The view holds the replica matrix and the mesh view, in its widget, its static picture
    and its text."""
    v = mw.LayoutView(report(replicated()))
    (replicas,) = find(v.widget, 'mh-layout-replicas')
    (mesh,) = find(v.widget, 'mh-layout-mesh')
    assert len(tags(replicas.value, 'mh-replica-cell', 'td')) == 8
    assert len(tags(mesh.value, 'mh-crosses-hosts', 'tr')) == 1
    static = v.static_html()
    assert len(tags(static, 'mh-layout-static')) == 1
    assert len(tags(static, 'mh-replica-cell', 'td')) == 8
    assert len(tags(static, 'mh-replica-odd', 'td')) == 2
    assert len(tags(static, 'mh-mesh-view')) == 1
    text = v.text()
    assert 'mesh host=4 crosses hosts (4 along it), dev=2 within a host' in text
    assert 'b: host 2 · dev 0 (id 4096) (odd), host 2 · dev 1 (id 4097) (odd)' in text
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
    """One row per leaf; bytes per host from the layout; replicas agree, differ (which host),
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
        'host',
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
    rows = tags(html, 'mh-tree-row', 'tr')
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
    the view builds in well under a few seconds."""
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
    assert len(tags(view.static_html(), 'mh-tree-row', 'tr')) == MAX_TREE_ROWS
    assert built < 5.0, built
