"""The tree-diff view (`mhnotebook.widgets.TreeDiffView`) on hand-built `TreeDiff` models:
the odd hosts' cells marked, per-host values on demand, bounded columns (no cluster)."""

from __future__ import annotations

import numpy as np
import pytest
from _html import elements, inside, one
from _view_models import shape_leaf, tree_diff, value_leaf

from mhnotebook import widgets as mw
from multihost import LeafDiff, TreeDiff

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
    assert ok['text'] == 'all 4 processes agree on 12 leaves'
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
    assert '95 more majority process(es)' in detail


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


def test_a_leaf_differing_in_several_blocks_is_one_row_and_one_section():
    """Issue 32 item 7: a sharded leaf whose blocks [0:2] and [2:4] both differ (the model
    keeps one `LeafDiff` per block) is one table row listing its blocks, and one section
    whose details show each block."""
    import dataclasses

    a = dataclasses.replace(value_leaf(odd=2), block=((0, 2), (0, 2)))
    b = dataclasses.replace(value_leaf(odd=2), block=((2, 4), (0, 2)))
    diff = TreeDiff(leaves=(a, b, shape_leaf()), num_processes=4, num_leaves=7)
    v = mw.TreeDiffView(diff)
    rows = elements(one(v.widget, 'mh-treediff-table').value, 'mh-leaf', 'tr')
    assert [r['attrs']['data-path'] for r in rows] == ["['params']['w']", "['b']"]
    assert 'blocks [0:2, 0:2], [2:4, 0:2] (2 of its blocks differ)' in rows[0]['text']
    assert 'the first, block [0:2, 0:2]' in rows[0]['text']
    assert len(v._details.children) == 2, v._details.titles
    assert v._details.titles[0].startswith(
        "['params']['w']  blocks [0:2, 0:2], [2:4, 0:2] (2 of its blocks differ)  [value]"
    ), v._details.titles
    v.expand("['params']['w']")
    detail = v._details.children[0].value
    assert detail.count('mh-block-detail') == 2 and 'block [2:4, 0:2]' in detail
