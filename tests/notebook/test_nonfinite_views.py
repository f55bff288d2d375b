"""The non-finite view from synthetic reports, and marked blocks in the layout picture."""

from __future__ import annotations

import base64
import os
import re

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


def _report():
    """A real report from this process's 4 CPU devices: NaN in one block of 'w', Inf in 'b'."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import multihost

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ('host', 'dev'))
    w = np.zeros((8, 4), np.float32)
    w[5, 3] = w[6, 2] = np.nan
    b = np.ones(3)
    b[1] = np.inf
    tree = {'w': jax.device_put(w, NamedSharding(mesh, P('host', 'dev'))), 'b': b, 'n': 7}
    return multihost.nonfinite(tree)


def test_nonfinite_view_lists_shards_and_marks_the_offending_block():
    report = _report()
    view = mw.NonfiniteView(report, name='params')
    assert view.text() == report.format()
    html = view.static_html()
    assert 'mh-nonfinite-shards' in html and html.count('mh-nonfinite-shard ') == 2
    assert 'mh-flagged' in html and 'params' in html
    assert '[4:8, 2:4]' in html and 'process 0 · dev 3 (id 3)' in html and '(5, 3)' in html
    assert 'Select a block' not in html  # no hint about buttons a static page lacks
    assert 'mh-nonfinite-leaves' in html  # two offending leaves
    assert 'data:image/png' in html  # the layout picture
    # The first offending leaf ('b', in tree order) is pictured; 'w' on demand, block marked.
    assert view.leaf.path == "['b']"
    view.show("['w']")
    assert view.leaf.path == "['w']"
    (marked,) = view.layout_view.grid.marked
    assert marked.index == ((4, 8), (2, 4)) and marked.mark == '2 NaN, 0 Inf on process 0, device 3'
    png_w = view.layout_view._image.value
    plain = mw.render_layout_png(mw.layout_grid(report["['w']"].layout))
    assert png_w != plain  # the offending block is hatched
    assert 'mh-marked' in view.layout_view._buttons[((4, 8), (2, 4))]._dom_classes
    # The static picture (a saved notebook) is the marked one.
    (png,) = re.findall(r'data:image/png;base64,([A-Za-z0-9+/=]+)', view.static_html())
    assert base64.b64decode(png) == png_w


def test_a_clean_report_is_one_green_line():
    import numpy as np

    import multihost

    report = multihost.nonfinite({'w': np.ones(3)})
    view = mw.NonfiniteView(report, name='w')
    html = view.static_html()
    assert 'mh-ok' in html and 'no NaN or Inf' in html
    assert 'mh-nonfinite-shards' not in html and view.layout_view is None
    assert view.leaf is None
    assert str(view) == 'no NaN or Inf: 1 leaf, 1 shard, 3 elements checked on 1 process'


def _replicated_nan_report():
    """(4, 4) rows split over 2 blocks, each held by all 4 processes (replicated over hosts, one
    device each); NaN only in host 2's replica of the second block."""
    from multihost import NonfiniteLeaf, NonfiniteReport, NonfiniteShard

    blocks = [((0, 2), (0, 4)), ((2, 4), (0, 4))]
    layout = Layout.from_placements(
        (4, 4), 'float32', [(list(b), 2 * p + i, p) for p in range(4) for i, b in enumerate(blocks)]
    )
    shard = NonfiniteShard(
        path="['w']", process=2, device=5, local_device=1, index=blocks[1], nan=3, inf=0,
        first=(2, 1), replica=2,
    )  # fmt: skip
    leaf = NonfiniteLeaf(
        path="['w']", host_local=False, processes=(2,), shape=(4, 4), dtype='float32', nan=3,
        inf=0, shards=1, first=(2, 1), layout=layout,
    )  # fmt: skip
    report = NonfiniteReport(
        shards=(shard,), leaves=(leaf,), checked={'leaves': 1}, num_processes=4
    )
    return report, leaf, blocks[1]


def test_a_replicated_block_names_the_host_whose_replica_holds_the_nan(tmp_path):
    report, leaf, block = _replicated_nan_report()
    note = "3 NaN, 0 Inf in process 2's replica (device 5, replica 3 of 4)"
    assert leaf.marked(report) == {block: note}
    view = mw.NonfiniteView(report, name='w')
    (marked,) = view.layout_view.grid.marked
    assert marked.mark == note
    # The picture's label of the hatched block says it (the mark is a line of the label).
    from mhnotebook.widgets.layout.png import _label_candidates

    assert _label_candidates(marked)[0][-1] == note
    png = view.layout_view._image.value
    assert png[:4] == b'\x89PNG'
    path = os.environ.get('MH_SAVE_NAN_PNG') or str(tmp_path / 'nan.png')
    with open(path, 'wb') as f:
        f.write(png)
    assert note in view.layout_view._buttons[block].tooltip
