"""The notebook views (`mhnotebook.widgets`) on synthetic models: no cluster, no browser.

Every model is built by hand with the model constructors (`Layout.from_placements`,
`ReplicaReport`, `TreeDiff`/`LeafDiff`, `StepTable.build`, `HostStacks`). Widgets
are driven as a user would (button clicks, dropdown and slider values) and
found by their stable CSS classes, as a browser test selects them; the HTML
they show is parsed, not grepped. A recording comm checks that the synced
widget state is JSON and small.
"""

from __future__ import annotations

import functools
import json
from html import unescape
from html.parser import HTMLParser

import comm
import numpy as np
import pytest
from ipywidgets.widgets.widget import _instances, _remove_buffers

from mhnotebook import widgets as mw
from mhnotebook.widgets.layout.grid import SHARED_COLOR
from mhnotebook.widgets.layout.html_parts import MAX_BUTTONS
from mhnotebook.widgets.layout.replicas import replica_matrix_text
from multihost import (
    CollectiveRecord,
    HostStacks,
    Layout,
    LeafDiff,
    ReplicaDigest,
    ReplicaGroup,
    ReplicaReport,
    StepTable,
    ThreadStack,
    TreeDiff,
)
from multihost._checks._layout import format_bytes

# -- helpers ---------------------------------------------------------------------------


def find(widget, cls):
    """Every widget in the tree below ``widget`` (itself included) with CSS class ``cls``."""
    out = [widget] if cls in getattr(widget, '_dom_classes', ()) else []
    for child in getattr(widget, 'children', ()):
        out += find(child, cls)
    return out


def one(widget, cls):
    found = find(widget, cls)
    assert len(found) == 1, f'{len(found)} widgets with class {cls!r}'
    return found[0]


class _Elements(HTMLParser):
    VOID = {'br', 'img', 'hr', 'meta', 'input', 'col'}

    def __init__(self):
        super().__init__()
        self.found, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        el = {
            'tag': tag,
            'attrs': a,
            'classes': set((a.get('class') or '').split()),
            'text': '',
            'parent': self.stack[-1] if self.stack else None,
        }
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


@functools.lru_cache(maxsize=32)
def _parse(html):
    p = _Elements()
    p.feed(html)
    return tuple(p.found)


def elements(html, cls=None, tag=None):
    """Parsed elements of an HTML string (the same objects on every call), by class and tag."""
    return [
        e
        for e in _parse(html)
        if (cls is None or cls in e['classes']) and (tag is None or e['tag'] == tag)
    ]


def inside(el, ancestor):
    """Whether parsed element ``el`` is ``ancestor`` or nested in it."""
    while el is not None:
        if el is ancestor:
            return True
        el = el['parent']
    return False


def is_png(data):
    return data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 1000


def png_size(data):
    return int.from_bytes(data[16:20], 'big'), int.from_bytes(data[20:24], 'big')


# -- synthetic models --------------------------------------------------------------------


def layout_2d():
    """float32[4, 6]: 2x2 blocks, devices 0-1 on process 0, 2-3 on process 1."""
    return Layout.from_placements(
        (4, 6),
        'float32',
        [
            ([(0, 2), (0, 3)], 0, 0),
            ([(0, 2), (3, 6)], 1, 0),
            ([(2, 4), (0, 3)], 2, 1),
            ([(2, 4), (3, 6)], 3, 1),
        ],
    )


def layout_3d():
    """float32[4, 6, 2]: dim 0 over 2 hosts, dim 2 in 2 blocks, each block on 2 devices."""
    placements = []
    for h in range(2):
        for k in range(2):
            for r in range(2):
                placements.append(([(2 * h, 2 * h + 2), (0, 6), (k, k + 1)], h * 4 + k * 2 + r, h))
    return Layout.from_placements((4, 6, 2), 'float32', placements)


def report_for(layout, bad_devices=()):
    """A ReplicaReport where the replicas on ``bad_devices`` differ from the others."""
    groups = []
    for b in layout.blocks():
        if b.replica_count < 2:
            continue
        groups.append(
            ReplicaGroup(
                b.index,
                tuple(
                    ReplicaDigest(
                        s.device_id,
                        s.process_index,
                        s.replica_id,
                        'bad0' if s.device_id in bad_devices else 'good',
                    )
                    for s in b.shards
                ),
            )
        )
    return ReplicaReport(layout, tuple(groups))


def value_leaf(odd=2, hosts=4):
    ref = np.array([[1, 2], [3, 4]], np.float32)
    values = {h: ref.copy() for h in range(hosts)}
    values[odd] = np.array([[1, 2], [3, 4.5]], np.float32)
    return LeafDiff(
        path="['params']['w']",
        kind='value',
        odd_processes=(odd,),
        majority_processes=tuple(h for h in range(hosts) if h != odd),
        shapes=dict.fromkeys(range(hosts), (2, 2)),
        dtypes=dict.fromkeys(range(hosts), 'float32'),
        digests={h: 'bbbb' if h == odd else 'aaaa' for h in range(hosts)},
        num_different={odd: 1},
        max_abs_diff={odd: 0.5},
        first_index={odd: (1, 1)},
        values=values,
    )


def shape_leaf():
    return LeafDiff(
        path="['b']",
        kind='shape',
        odd_processes=(1,),
        majority_processes=(0, 2, 3),
        shapes={0: (3,), 1: (4,), 2: (3,), 3: (3,)},
        dtypes=dict.fromkeys(range(4), 'float32'),
        digests={0: 'x', 1: 'y', 2: 'x', 3: 'x'},
    )


def tree_diff():
    return TreeDiff(leaves=(value_leaf(), shape_leaf()), num_processes=4, num_leaves=7)


def rec(seq, p, name='a', site='/src/train.py:10', kind='barrier'):
    return CollectiveRecord(
        seq=seq, kind=kind, name=name, digest='', site=site, time=0.0, process=p
    )


def step_table(divergent=True):
    """Step 3 passed; step 4: hosts 0, 1 wait at the gate, 2 odd (if divergent), 3 missing."""
    records = [rec(3, p) for p in range(4)] + [rec(4, 0, 'b'), rec(4, 1, 'b')]
    records.append(rec(4, 2, 'c', '/src/train.py:20') if divergent else rec(4, 2, 'b'))
    return StepTable.build(
        records, released=[3], num_processes=4, stepping=True, waiting=[(4, 0), (4, 1)], time=1.7e9
    )


def host_stacks():
    """Hosts 0-2 in barrier #4 at the gate (host 2 elsewhere in the code), host 3 no answer."""
    main = ThreadStack(
        'MainThread',
        1,
        True,
        False,
        (
            ('/src/train.py', 30, 'main', 'train()'),
            ('/src/train.py', 10, 'train', "sync_global_devices('b')"),
        ),
    )
    odd_main = ThreadStack(
        'MainThread',
        1,
        True,
        False,
        (
            ('/src/train.py', 30, 'main', 'train()'),
            ('/src/train.py', 20, 'train', "sync_global_devices('c')"),
        ),
    )
    helper = ThreadStack('loader', 2, False, True, (('/src/data.py', 5, 'load', 'q.get()'),))
    out = {}
    for p in range(3):
        out[p] = HostStacks(
            process=p,
            answered=True,
            hostname=f'node{p}',
            os_pid=100 + p,
            current=rec(
                4, p, 'c' if p == 2 else 'b', '/src/train.py:20' if p == 2 else '/src/train.py:10'
            ),
            gate=4,
            stepping=True,
            where='train.py:10 in train',
            threads=(odd_main if p == 2 else main, helper),
            time=1.7e9,
        )
    out[3] = HostStacks(process=3, answered=False, current=rec(3, 3), error='no answer in 5 s')
    return out


# -- layout grid (pure) -------------------------------------------------------------------


def test_grid_2d_rectangles_hosts_and_labels():
    """A 2-D grid has one rectangle per block, placed by its index, named by its device."""
    g = mw.layout_grid(layout_2d())
    assert g.axes == (0, 1) and g.fixed == () and g.extent == (4, 6)
    assert [(b.rows, b.cols, b.processes, b.label) for b in g.blocks] == [
        ((0, 2), (0, 3), (0,), 'host 0 · dev 0 (id 0)'),
        ((0, 2), (3, 6), (0,), 'host 0 · dev 1 (id 1)'),
        ((2, 4), (0, 3), (1,), 'host 1 · dev 0 (id 2)'),
        ((2, 4), (3, 6), (1,), 'host 1 · dev 1 (id 3)'),
    ]
    assert [b.labels[1:] for b in g.blocks][2] == ('host 1 · dev 0', 'h1·d0')
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
        (2, (0, 1), '2 replicas: dev 0 of hosts 0,1'),
        (2, (0, 1), '2 replicas: dev 1 of hosts 0,1'),
    ]
    # drawn once, in the shared grey (no host's colour), whatever the number of hosts
    assert all(b.fill == SHARED_COLOR for b in g.blocks)


def test_grid_flags_exactly_the_disagreeing_blocks():
    """Blocks whose replicas differ in the report are flagged, with the odd devices."""
    layout = layout_3d()
    g = mw.layout_grid(report_for(layout, bad_devices={7}), (0, 1), {2: 1})
    assert [(b.index, b.flagged, b.odd_devices) for b in g.blocks] == [
        (((0, 2), (0, 6), (1, 2)), False, ()),
        (((2, 4), (0, 6), (1, 2)), True, (7,)),
    ]
    assert mw.layout_grid(layout, (0, 1), {2: 0}, report_for(layout, {7})).flagged == ()


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
    flagged = mw.render_layout_png(mw.layout_grid(report_for(layout, {7}), (0, 1), {2: 1}))
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
        'host 0 · dev 0 (id 0)',
        'host 0 · dev 1 (id 1)',
        'host 1 · dev 0 (id 2)',
        'host 1 · dev 1 (id 3)',
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
    assert rows == [['0', 'host 1 · dev 0 (id 4)', '48 B'], ['1', 'host 1 · dev 1 (id 5)', '48 B']]
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
        assert format_bytes(n) in row['text'] and f'host {p}' in row['text']
        assert mw.host_color(p) in html
    assert 'x2' in html  # every block is stored twice


def test_layout_view_legend_bounded_for_many_hosts():
    """With hundreds of hosts the legend stays short and says colours repeat."""
    layout = Layout.from_placements((300,), 'float32', [([(i, i + 1)], i, i) for i in range(300)])
    v = mw.LayoutView(layout)
    html = one(v.widget, 'mh-layout-legend').value
    assert len(elements(html, 'mh-legend-host', 'tr')) == 32
    assert '268 more hosts' in html and 'colours repeat' in html
    assert find(v.widget, 'mh-layout-block') == []  # 300 > MAX_BUTTONS: the list only
    assert len(one(v.widget, 'mh-layout-select').options) == 300 > MAX_BUTTONS


def test_layout_view_flags_disagreeing_replicas():
    """With a report, the header says replicas differ and the odd block's button is flagged."""
    layout = layout_3d()
    v = mw.LayoutView(layout, report_for(layout, {7}), axes=(0, 1))
    header = one(v.widget, 'mh-layout-header').value
    (verdict,) = elements(header, 'mh-flagged')
    assert 'DIFFER' in verdict['text'] and 'process 1' in verdict['text']
    assert 'host 1 · dev 3 (id 7)' in verdict['text']
    flagged = find(v.widget, 'mh-flagged')  # both facets shown: one flagged block in all
    assert [b.tooltip.split(': ')[0] for b in flagged] == ['[2:4, 0:6, 1:2]']
    flagged[0].click()
    info = one(v.widget, 'mh-layout-info').value
    odd_rows = elements(info, 'mh-odd-host', 'tr')
    assert len(odd_rows) == 1 and 'differs' in odd_rows[0]['text']
    ok = mw.LayoutView(report_for(layout))
    assert elements(one(ok.widget, 'mh-layout-header').value, 'mh-ok')


def test_layout_view_update_keeps_axes_and_position():
    """Updating with a layout of the same shape keeps the axes, slice and selection."""
    layout = layout_3d()
    v = mw.LayoutView(layout, axes=(0, 2))
    one(v.widget, 'mh-layout-slider-1').value = 4
    v.select(((2, 4), (0, 6), (1, 2)))
    v.update(layout, report_for(layout, {7}))
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
    report = report_for(layout, {7})
    v = mw.LayoutView(layout, report)
    bundle = v._repr_mimebundle_()
    matrix = replica_matrix_text(v.matrix)
    assert bundle['text/plain'] == f'{layout}\n{matrix}\n{report}' == str(v)
    assert 'b: host 1 · dev 3 (id 7) (odd)' in matrix
    assert str(mw.LayoutView(layout)) == str(layout)  # nothing compared: the layout alone
    assert bundle['application/vnd.jupyter.widget-view+json']['model_id'] == v.widget.model_id
    assert repr(v).startswith('<LayoutView: float32[4, 6, 2]')


# -- tree diff view ---------------------------------------------------------------------


def test_treediff_table_highlights_exactly_the_odd_hosts():
    """The table has a row per differing leaf, and exactly the odd (leaf, host) cells are marked."""
    diff = tree_diff()
    v = mw.TreeDiffView(diff)
    html = one(v.widget, 'mh-treediff-table').value
    rows = elements(html, 'mh-leaf', 'tr')
    assert [r['attrs']['data-path'] for r in rows] == [leaf.path for leaf in diff.leaves]
    marked = {
        (td['parent']['attrs']['data-path'], int(td['attrs']['data-host']))
        for td in elements(html, 'mh-odd-host', 'td')
    }
    assert marked == {(leaf.path, h) for leaf in diff.leaves for h in leaf.odd_processes}
    headers = {int(th['attrs']['data-host']) for th in elements(html, 'mh-odd-host', 'th')}
    assert headers == set(diff.odd_processes) == {1, 2}
    assert len(elements(html, tag='td')) == 2 * (3 + 4 + 1)  # #, leaf, kind, 4 hosts, summary


def test_treediff_numeric_summary():
    """Odd cells and the summary give the count, max abs diff and first index."""
    v = mw.TreeDiffView(tree_diff())
    html = one(v.widget, 'mh-treediff-table').value
    (odd,) = [td for td in elements(html, 'mh-host-2', 'td') if 'mh-odd-host' in td['classes']]
    assert odd['text'] == '1 differ, max |diff| 0.5'
    assert odd['attrs']['title'] == 'first difference at index (1, 1)'
    assert '1 element(s) differ (1 of 4 on process 2), max |diff| 0.5, first at (1, 1)' in html
    assert 'float32[4] on process 1' in html  # the shape leaf's variants
    summary = one(v.widget, 'mh-treediff-summary').value
    assert '2 of 7 leaves differ' in summary and 'processes 1-2' in summary


def test_treediff_expand_shows_per_host_values():
    """Expanding a leaf shows each host's shape, dtype, digest and values, odd host marked."""
    diff = tree_diff()
    v = mw.TreeDiffView(diff)
    details = one(v.widget, 'mh-treediff-details')
    assert details.titles[0].startswith("['params']['w']  [value]  odd: process 2")
    assert all(c.value == '' for c in details.children)  # filled lazily
    v.expand("['params']['w']")
    html = details.children[0].value
    rows = elements(html, tag='tr')[1:]
    assert [int(r['attrs']['data-host']) for r in rows] == [0, 1, 2, 3]
    leaf = diff.leaves[0]
    pres = elements(html, 'mh-values')
    for r in rows:
        h = int(r['attrs']['data-host'])
        (pre,) = [e for e in pres if inside(e, r)]
        assert pre['text'] == np.array2string(leaf.values[h])
        assert leaf.digests[h] in r['text']
    assert [int(r['attrs']['data-host']) for r in elements(html, 'mh-odd-host', 'tr')] == [2]
    details.selected_index = 1  # expanding by hand works the same way
    assert 'float32' in details.children[1].value and '(4,)' in details.children[1].value
    with pytest.raises(KeyError):
        v.expand("['nope']")


def test_treediff_ok_renders_agreement():
    """A diff without differences says all hosts agree, with no table or sections."""
    v = mw.TreeDiffView(TreeDiff(leaves=(), num_processes=4, num_leaves=12))
    (ok,) = elements(one(v.widget, 'mh-treediff-summary').value, 'mh-ok')
    assert ok['text'] == 'all 4 hosts agree on 12 leaves'
    assert one(v.widget, 'mh-treediff-table').value == ''
    assert one(v.widget, 'mh-treediff-details').children == ()


def test_treediff_many_hosts_bounded_columns():
    """With 100 hosts only odd and reference hosts get columns, plus an "other hosts" column."""
    leaf = value_leaf(odd=57, hosts=100)
    v = mw.TreeDiffView(TreeDiff(leaves=(leaf,), num_processes=100, num_leaves=3))
    html = one(v.widget, 'mh-treediff-table').value
    assert [
        int(th['attrs']['data-host'])
        for th in elements(html, tag='th')
        if 'data-host' in th['attrs']
    ] == [0, 57]
    assert elements(html, 'mh-other-hosts', 'th')
    v.expand(leaf.path)
    detail = one(v.widget, 'mh-treediff-details').children[0].value
    assert [int(r['attrs']['data-host']) for r in elements(detail, tag='tr')[1:]] == [
        0,
        1,
        2,
        3,
        57,
    ]
    assert '95 more majority host(s)' in detail


def test_treediff_escapes_markup_in_paths():
    """Leaf paths are escaped, never interpreted as HTML."""
    leaf = shape_leaf()
    leaf = LeafDiff(**{**leaf.__dict__, 'path': "['<b>x</b>']"})
    v = mw.TreeDiffView(TreeDiff(leaves=(leaf,), num_processes=4, num_leaves=1))
    html = one(v.widget, 'mh-treediff-table').value
    assert '<b>x</b>' not in html and '&lt;b&gt;x&lt;/b&gt;' in html


def test_treediff_text_fallback():
    """The text/plain form is the diff's own summary."""
    diff = tree_diff()
    v = mw.TreeDiffView(diff)
    assert v._repr_mimebundle_()['text/plain'] == diff.summary() == str(v)


# -- stepper view -----------------------------------------------------------------------


def _states(view):
    """(step, host) -> the state of the grid's cell, checked against its CSS class."""
    out = {}
    for td in elements(one(view.widget, 'mh-stepper-grid').value, 'mh-cell', 'td'):
        state = td['attrs']['data-state']
        assert f'mh-{state}' in td['classes']
        out[int(td['parent']['attrs']['data-seq']), int(td['attrs']['data-host'])] = state
    return out


def test_stepper_marks_cell_states():
    """Cells are passed, waiting (at the gate), mismatched (odd) or missing, per host and step."""
    v = mw.StepperView(step_table())
    assert _states(v) == {
        (3, 0): 'passed',
        (3, 1): 'passed',
        (3, 2): 'passed',
        (3, 3): 'passed',
        (4, 0): 'waiting',
        (4, 1): 'waiting',
        (4, 2): 'mismatched',
        (4, 3): 'missing',
    }
    released = StepTable.build(
        [rec(5, 0), rec(5, 1)], released=[5], num_processes=2, stepping=True, time=1.7e9
    )
    assert _states(mw.StepperView(released)) == {(5, 0): 'arrived', (5, 1): 'arrived'}
    grid = one(v.widget, 'mh-stepper-grid').value
    assert "barrier('c')" in unescape(grid) and 'train.py:20' in grid
    assert '/src/' not in grid.split('title=')[0]  # sites are shortened in cells


def test_stepper_banner_names_the_odd_host():
    """A divergent step puts a banner naming the odd host, its call and the majority's."""
    v = mw.StepperView(step_table())
    html = one(v.widget, 'mh-stepper-banner').value
    (b,) = elements(html, 'mh-divergent')
    assert 'Divergence at step #4' in b['text']
    assert [e['text'] for e in elements(html, 'mh-odd-host')] == ['process 2']
    assert "barrier('c')" in b['text'] and "barrier('b')" in b['text']
    assert 'processes 0-1' in b['text']
    status = one(v.widget, 'mh-stepper-status').value
    assert 'step #4' in status and 'processes 0-1 waiting' in status and 'process 3 not' in status


def test_stepper_no_banner_without_divergence():
    """Hosts that agree get no banner."""
    v = mw.StepperView(step_table(divergent=False))
    assert one(v.widget, 'mh-stepper-banner').value == ''
    assert 'mismatched' not in _states(v).values()


def test_stepper_buttons_call_callbacks_and_refresh():
    """Step, Continue and Stop call their callbacks, then the view refreshes from on_refresh."""
    calls = []
    fresh = step_table(divergent=False)
    v = mw.StepperView(
        step_table(),
        on_step=lambda: calls.append('step'),
        on_continue=lambda: calls.append('continue'),
        on_stop=lambda: calls.append('stop'),
        on_refresh=lambda: calls.append('refresh') or fresh,
    )
    one(v.widget, 'mh-step-button').click()
    assert calls == ['step', 'refresh'] and v.table is fresh
    assert one(v.widget, 'mh-stepper-banner').value == ''
    one(v.widget, 'mh-continue-button').click()
    one(v.widget, 'mh-stop-button').click()
    assert calls == ['step', 'refresh', 'continue', 'refresh', 'stop', 'refresh']


def test_stepper_refresh_rerenders():
    """Refresh calls on_refresh and shows the new table."""
    tables = [step_table(divergent=False)]
    v = mw.StepperView(step_table(), on_refresh=tables.pop)
    assert one(v.widget, 'mh-stepper-banner').value != ''
    one(v.widget, 'mh-refresh-button').click()
    assert tables == [] and one(v.widget, 'mh-stepper-banner').value == ''
    assert 'mismatched' not in _states(v).values()


def test_stepper_action_returning_a_table_is_shown():
    """A callback that returns a StepTable is shown without a separate refresh."""
    fresh = step_table(divergent=False)
    v = mw.StepperView(step_table(), on_step=lambda: fresh)
    one(v.widget, 'mh-step-button').click()
    assert v.table is fresh


def test_stepper_missing_callbacks_disable_buttons():
    """Buttons without a callback are disabled; the others are not."""
    v = mw.StepperView(step_table(), on_step=lambda: None)
    assert not one(v.widget, 'mh-step-button').disabled
    for cls in ('mh-continue-button', 'mh-stop-button', 'mh-refresh-button'):
        assert one(v.widget, cls).disabled
    assert one(v.widget, 'mh-step-button').tooltip == 'release step #4'


def test_stepper_callback_error_is_shown():
    """A callback that raises shows its error in the view instead of losing it."""

    def boom():
        raise RuntimeError('engine 3 is gone')

    v = mw.StepperView(step_table(), on_stop=boom, on_refresh=lambda: 'not a table')
    one(v.widget, 'mh-stop-button').click()
    msg = one(v.widget, 'mh-stepper-message').value
    assert 'Stop failed: RuntimeError: engine 3 is gone' in msg and elements(msg, 'mh-error')
    one(v.widget, 'mh-refresh-button').click()
    assert 'expected a multihost.StepTable' in one(v.widget, 'mh-stepper-message').value


def test_stepper_groups_identical_hosts_when_many():
    """With 40 hosts, hosts with identical columns share one; the odd host keeps its own."""
    records = [rec(7, p, 'c' if p == 13 else 'b') for p in range(40)]
    table = StepTable.build(records, [], 40, True, waiting=[(7, p) for p in range(40)], time=1.0)
    v = mw.StepperView(table)
    html = one(v.widget, 'mh-stepper-grid').value
    heads = [th['text'] for th in elements(html, tag='th')[1:]]
    assert heads == ['processes 0-12, 14-39 (39 hosts)', 'host 13']
    assert [th['text'] for th in elements(html, 'mh-odd-host', 'th')] == ['host 13']


def test_stepper_text_fallback():
    """The text/plain form is the table's own text grid."""
    table = step_table()
    v = mw.StepperView(table)
    assert v._repr_mimebundle_()['text/plain'] == table.format() == str(v)


# -- where view -------------------------------------------------------------------------


def test_where_shows_collective_and_stack():
    """Each host's row names its current collective and gate; its main stack is shown, open."""
    stacks = host_stacks()
    v = mw.WhereView(stacks)
    table = one(v.widget, 'mh-where-table').value
    for p, s in stacks.items():
        (row,) = elements(table, f'mh-host-{p}', 'tr')
        assert s.current.describe() in row['text']
        if s.gate is not None:
            assert f'waiting for release of #{s.gate}' in row['text']
    html = one(v.widget, 'mh-where-stacks').value
    mains = elements(html, 'mh-main-thread', 'details')
    assert mains and all('open' in d['attrs'] for d in mains)
    assert stacks[0].main_thread.stack in mains[-1]['text']
    assert "sync_global_devices('b')" in unescape(html)
    assert "sync_global_devices('c')" in unescape(html)
    threads = elements(html, 'mh-thread', 'details')
    assert threads and 'loader' in threads[0]['text'] and 'q.get()' in threads[0]['text']
    assert 'open' not in threads[0]['attrs']


def test_where_marks_unanswered_and_odd_hosts():
    """A host that did not answer and a host in another collective are marked."""
    v = mw.WhereView(host_stacks())
    table = one(v.widget, 'mh-where-table').value
    assert [int(r['attrs']['data-host']) for r in elements(table, 'mh-no-answer', 'tr')] == [3]
    assert [int(r['attrs']['data-host']) for r in elements(table, 'mh-odd-host', 'tr')] == [2, 3]
    assert 'no answer in 5 s' in table
    status = one(v.widget, 'mh-where-status').value
    assert '3/4 host(s) answered' in status and 'no answer from process 3' in status


def test_where_groups_identical_stacks():
    """Hosts with identical stacks share one section; the odd ones come first."""
    stacks = host_stacks()
    stacks[2] = HostStacks(**{**stacks[0].__dict__, 'process': 2, 'hostname': 'node2'})
    stacks[3] = HostStacks(**{**stacks[0].__dict__, 'process': 3, 'gate': None})
    html = mw.WhereView(stacks).widget.children[3].value
    groups = elements(html, 'mh-stack-group', 'details')
    assert [g['attrs']['data-hosts'] for g in groups] == ['3', '0,1,2']
    assert 'processes 0-2 (3 hosts)' in groups[1]['text']


def test_where_refresh_calls_and_rerenders():
    """Refresh calls on_refresh and shows the new stacks; errors are shown, not raised."""
    fresh = [HostStacks(process=0, answered=True, current=rec(9, 0, 'later'), time=1.0)]
    results = [fresh]
    v = mw.WhereView(host_stacks(), on_refresh=lambda: results.pop())
    one(v.widget, 'mh-refresh-button').click()
    assert list(v.stacks) == [0]
    assert "barrier('later')" in unescape(one(v.widget, 'mh-where-table').value)
    one(v.widget, 'mh-refresh-button').click()  # results is empty now: IndexError
    assert 'Refresh failed: IndexError' in one(v.widget, 'mh-where-message').value
    assert list(v.stacks) == [0]
    assert mw.WhereView(fresh).widget.children[0].children[0].disabled


def test_where_text_fallback():
    """The text/plain form is the table in words: one line per state group, then its frames."""
    stacks = host_stacks()
    v = mw.WhereView(stacks.values())
    text = v._repr_mimebundle_()['text/plain']
    assert text == str(v) == v.text()
    assert text.splitlines()[0].startswith('3/4 host(s) answered')
    heads = [line for line in text.splitlines() if line.startswith('process')]
    assert heads == [
        "process 2: waiting for release of #4 (barrier('c'))",
        "process 3: no answer in 5 s; last published barrier('a') #3",
        "processes 0-1 (2 hosts): waiting for release of #4 (barrier('b'))",
    ]


# -- all views --------------------------------------------------------------------------


def test_public_surface():
    """`mhnotebook.widgets` exports exactly its sorted `__all__`."""
    assert (
        mw.__all__
        == sorted(mw.__all__)
        == [
            'EnvView',
            'GridBlock',
            'LayoutGrid',
            'LayoutView',
            'MemoryView',
            'NonfiniteView',
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
    )
    assert all(hasattr(mw, name) for name in mw.__all__)


def test_views_reject_wrong_models():
    """Each view raises TypeError naming the model it expects and what arrived."""
    with pytest.raises(TypeError, match='multihost.Layout.*got builtins.dict'):
        mw.LayoutView({})
    with pytest.raises(TypeError, match='multihost.TreeDiff.*got builtins.str'):
        mw.TreeDiffView('x')
    with pytest.raises(TypeError, match='multihost.StepTable.*got builtins.list'):
        mw.StepperView([])
    with pytest.raises(TypeError, match='multihost.HostStacks.*got builtins.int'):
        mw.WhereView({0: 1})


class _RecordingComm(comm.DummyComm):
    log: list = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        self.log.append((msg_type, data, buffers or [], self.comm_id))


@pytest.fixture
def comm_log(monkeypatch):
    """Every comm message widgets send (open and state updates), recorded."""
    log = []
    monkeypatch.setattr(_RecordingComm, 'log', log)
    monkeypatch.setattr(comm, 'create_comm', lambda *a, **k: _RecordingComm(*a, **k))
    return log


def test_widget_state_serializes_and_stays_small(comm_log):
    """Every view's synced state is JSON (binary only in buffers), small, and updates go out."""
    values = np.arange(48, dtype=np.float32).reshape(4, 6, 2)
    layout = layout_3d()
    views = [
        mw.LayoutView(layout, report_for(layout, {7}), values),
        mw.TreeDiffView(tree_diff()),
        mw.StepperView(step_table(), on_step=lambda: None),
        mw.WhereView(host_stacks()),
    ]
    views[0].select(((2, 4), (0, 6), (1, 2)))
    views[1].expand("['params']['w']")
    assert {m[0] for m in comm_log} <= {'comm_open', 'comm_msg', 'comm_close'}
    opened = {m[3] for m in comm_log if m[0] == 'comm_open'}
    assert all(v.widget.model_id in opened for v in views)
    text_bytes = binary_bytes = 0
    for _, data, buffers, _ in comm_log:
        text_bytes += len(json.dumps(data))  # raises on anything that is not JSON
        binary_bytes += sum(len(memoryview(b).cast('B')) for b in buffers)
    assert text_bytes < 200_000, text_bytes
    assert 0 < binary_bytes < 500_000, binary_bytes  # the PNGs travel as binary buffers
    # The selection reached the frontend: the info widget's last update shows the block.
    info = one(views[0].widget, 'mh-layout-info')
    sent = [
        m[1]['state']['value']
        for m in comm_log
        if m[3] == info.model_id and m[0] == 'comm_msg' and 'value' in m[1].get('state', {})
    ]
    assert sent and '[2:4, 0:6, 1:2]' in sent[-1]
    for v in views:
        state, _, _ = _remove_buffers(v.widget.get_state())
        json.dumps(state)
