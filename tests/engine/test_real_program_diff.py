"""`tree_diff` / `assert_equal` / `%mh_diff` on what a flax + optax training job holds.

4 real JAX processes x 2 CPU devices (``multiprocess`` bodies run in every
process), the `_flax_program` train state, global arrays sharded the ways
such a job shards them, and string leaves; then ``%mh_diff`` in a real
ipyparallel session. A global array is compared block by block, only where
two or more hosts hold the same block (its replicas); a leaf no block of
which is held by two hosts has nothing to compare across processes and says so.
"""

from __future__ import annotations

import json
import pickle
import re

import jax
import numpy as np
import pytest
from _flax_program import create_state, make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost import GlobalLeaf, LeafDiff, TreeDiff

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


def _global(spec: P, shape=(8, 16), bump: dict | None = None) -> jax.Array:
    """A global array on the ('data', 'model') mesh; ``bump``: block index -> added here."""
    mesh = make_mesh()
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def block(index):
        out = value[index].copy()
        for idx, add in (bump or {}).items():
            if tuple(s.indices(n)[:2] for s, n in zip(index, shape)) == idx:
                out += add
        return out

    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), block)


# -- a healthy train state -----------------------------------------------------------


@multiprocess
def test_healthy_train_state_reports_nothing():
    """The flax TrainState (static fields, typed dropout key, adamw state) is equal everywhere."""
    state = create_state(make_mesh())
    diff = multihost.tree_diff(state)
    assert isinstance(diff, TreeDiff)
    assert diff.ok, diff.summary()
    assert diff.leaves == () and diff.not_compared == ()
    assert diff.num_leaves == len(jax.tree.leaves(state))
    multihost.assert_equal(state.params, 'params must agree')
    multihost.assert_equal(state, 'the whole state must agree')
    # Kernels sharded over 'model' (within a process) are replicated across hosts: compared.
    kernels = [g for g in diff.global_leaves if 'kernel' in g.path]
    assert kernels and all(g.min_hosts == g.max_hosts == 4 for g in kernels)
    assert all(g.num_compared == g.num_blocks for g in diff.global_leaves)


# -- fully sharded: nothing to compare -------------------------------------------------


@multiprocess
def test_fully_sharded_array_has_nothing_to_compare():
    """P(('data', 'model')): every block on one device of one host; not a difference."""
    x = _global(P(('data', 'model')))
    diff = multihost.tree_diff({'x': x, 'w': np.ones(3)})
    assert diff.ok, diff.summary()
    assert diff.not_compared == ("['x']",)
    (g,) = diff.global_leaves
    assert (g.path, g.num_blocks, g.num_compared, g.max_hosts) == ("['x']", 8, 0, 1)
    text = diff.summary()
    assert 'nothing to compare across processes' in text and "['x']" in text, text
    assert 'differ' not in text, text
    multihost.assert_equal({'x': x}, 'a sharded array is healthy')


@multiprocess
def test_sharded_over_hosts_within_host_replicas_only():
    """P('data'): each block on the 2 devices of one host: nothing across hosts either."""
    x = _global(P('data'))
    diff = multihost.tree_diff({'x': x})
    assert diff.ok and diff.not_compared == ("['x']",)


# -- replicated across hosts: blocks compared ------------------------------------------


@multiprocess
def test_block_replicated_across_hosts_differs_on_one_host():
    """P(None, 'model'): both blocks on every host; host 3's block [0:8, 8:16] differs."""
    pid = jax.process_index()
    x = _global(P(None, 'model'), bump={((0, 8), (8, 16)): 2.5} if pid == 3 else None)
    diff = multihost.tree_diff({'x': x, 'ok': np.zeros(2)})
    assert not diff.ok
    (leaf,) = diff.leaves
    assert leaf.path == "['x']" and leaf.kind == 'value'
    assert leaf.block == ((0, 8), (8, 16))
    assert leaf.odd_processes == (3,) and leaf.majority_processes == (0, 1, 2)
    assert leaf.shapes == dict.fromkeys(range(4), (8, 8))
    assert leaf.num_different == {3: 64} and leaf.max_abs_diff == {3: 2.5}
    assert leaf.first_index == {3: (0, 0)}
    text = diff.summary()
    assert "['x'] block [0:8, 8:16]" in text and 'process 3' in text, text
    assert '1 of 2 leaves differ' in text, text
    with pytest.raises(multihost.HostMismatchError, match=r'block \[0:8, 8:16\]'):
        multihost.assert_equal({'x': x}, 'replicas')


@multiprocess
def test_partially_replicated_blocks_are_compared_over_their_replicas():
    """A (2, 4) mesh: each block on 2 processes; host 1 differs from host 0 on their block only."""
    pid = jax.process_index()
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ('a', 'b'))
    value = np.arange(16, dtype=np.float32).reshape(4, 4)

    def block(index):
        return value[index] + (1.0 if pid == 1 and (index[0].start or 0) == 0 else 0.0)

    x = jax.make_array_from_callback((4, 4), NamedSharding(mesh, P('a')), block)
    diff = multihost.tree_diff({'x': x})
    (g,) = diff.global_leaves
    assert (g.num_blocks, g.num_compared, g.min_hosts, g.max_hosts) == (2, 2, 2, 2)
    (leaf,) = diff.leaves
    assert leaf.block == ((0, 2), (0, 4))
    assert sorted(leaf.shapes) == [0, 1]  # only the hosts holding that block
    # one host against one: no majority, so nobody is blamed; host 1 compared with host 0
    assert leaf.tie and leaf.odd_processes == () and leaf.compared_processes == (1,)
    assert leaf.majority_processes == (0,) and leaf.num_different == {1: 8}
    healthy = jax.make_array_from_callback((4, 4), NamedSharding(mesh, P('a')), lambda i: value[i])
    ok = multihost.tree_diff({'x': healthy})
    assert ok.ok and ok.not_compared == ()
    assert 'compared over their replicas' in ok.summary(), ok.summary()


@multiprocess
def test_hosts_placing_the_blocks_differently_is_a_sharding_difference():
    """Host 3 shards the same array over 'model' along the other dimension: 'sharding'."""
    pid = jax.process_index()
    x = _global(P('model', None) if pid == 3 else P(None, 'model'))
    (leaf,) = multihost.tree_diff({'x': x}).leaves
    assert leaf.kind == 'sharding' and leaf.block is None
    assert leaf.odd_processes == (3,) and leaf.shapes == dict.fromkeys(range(4), (8, 16))
    assert 'the processes place its blocks differently: placement' in leaf.describe()
    assert leaf.describe().endswith('on process 3'), leaf.describe()


# -- strings and other non-array leaves ------------------------------------------------------


@multiprocess
def test_string_leaf_names_both_values():
    """A run name that differs on host 2 names the values, not their dtypes."""
    pid = jax.process_index()
    tree = {'run': 'exp-7b' if pid == 2 else 'exp-7', 'lr': 1e-3}
    diff = multihost.tree_diff(tree)
    (leaf,) = diff.leaves
    assert leaf.kind == 'value' and leaf.odd_processes == (2,)
    assert leaf.dtypes == dict.fromkeys(range(4), 'str')
    text = leaf.describe()
    assert "'exp-7' on processes 0-1, 3" in text and "'exp-7b' on process 2" in text, text
    assert '<U' not in text
    assert str(leaf.values[2]) == 'exp-7b'
    equal = multihost.tree_diff({'run': 'exp-7', 'blob': b'\x00\x01'})
    assert equal.ok


@multiprocess
def test_long_string_values_are_bounded():
    """A 100 kB string that differs: the values kept and the text stay short."""
    pid = jax.process_index()
    diff = multihost.tree_diff({'s': 'x' * 100_000 + str(pid == 1)})
    (leaf,) = diff.leaves
    assert leaf.odd_processes == (1,)
    assert len(leaf.describe()) < 1000
    assert all(len(str(v)) <= 200 for v in leaf.values.values())


# -- a whole train state with one diverged host ------------------------------------------


@multiprocess
def test_train_state_with_a_diverged_host_names_its_blocks():
    """Host 1's state built from another seed: its replicated kernels' blocks are reported."""
    pid = jax.process_index()
    state = create_state(make_mesh(), seed=1 if pid == 1 else 0)
    diff = multihost.tree_diff(state)
    assert not diff.ok and diff.odd_processes == (1,)
    kernel = [leaf for leaf in diff.leaves if 'kernel' in leaf.path]
    assert kernel and all(leaf.block is not None for leaf in kernel)
    assert all(leaf.majority_processes == (0, 2, 3) for leaf in diff.leaves)
    with pytest.raises(multihost.HostMismatchError, match='process 1'):
        multihost.assert_equal(state.params, 'diverged')


def _mixed_diff() -> TreeDiff:
    pid = jax.process_index()
    tree = {
        'rep': _global(P(None, 'model'), bump={((0, 8), (0, 8)): 1.0} if pid == 3 else None),
        'sharded': _global(P(('data', 'model'))),
        'run': 'exp-7b' if pid == 2 else 'exp-7',
        'key': jax.random.key(0),
    }
    return multihost.tree_diff(tree)


def test_every_host_gets_the_same_diff_of_global_and_string_leaves(mp_cluster):
    """Block, string and not-compared verdicts are identical on the four hosts (and JSON-able)."""
    diffs = mp_cluster.run(_mixed_diff)
    assert all(d == diffs[0] for d in diffs[1:])
    d = diffs[0]
    assert [(leaf.path, leaf.block) for leaf in d.leaves] == [
        ("['rep']", ((0, 8), (0, 8))),
        ("['run']", None),
    ]
    assert d.not_compared == ("['sharded']",) and d.odd_processes == (2, 3)
    assert json.loads(json.dumps(d.to_dict()))['global_leaves'][1]['num_compared'] == 0


# -- the model and the widget on these states ------------------------------------------------


def _block_leaf() -> LeafDiff:
    """Host 3's replica of block [0:8, 8:16] differs; hosts 0-3 hold it."""
    return LeafDiff(
        path="['x']",
        kind='value',
        odd_processes=(3,),
        majority_processes=(0, 1, 2),
        shapes=dict.fromkeys(range(4), (8, 8)),
        dtypes=dict.fromkeys(range(4), 'float32'),
        digests={h: 'b' * 16 if h == 3 else 'a' * 16 for h in range(4)},
        num_different={3: 64},
        max_abs_diff={3: 2.5},
        first_index={3: (0, 0)},
        block=((0, 8), (8, 16)),
    )


def _text_leaf() -> LeafDiff:
    values = {h: np.array('exp-7b' if h == 2 else 'exp-7') for h in range(4)}
    return LeafDiff(
        path="['run']",
        kind='value',
        odd_processes=(2,),
        majority_processes=(0, 1, 3),
        shapes=dict.fromkeys(range(4), ()),
        dtypes=dict.fromkeys(range(4), 'str'),
        digests={h: 'c' * 16 if h == 2 else 'd' * 16 for h in range(4)},
        values=values,
    )


GLOBALS = (
    GlobalLeaf("['sharded']", num_blocks=8, num_compared=0, min_hosts=1, max_hosts=1),
    GlobalLeaf("['pairs']", num_blocks=2, num_compared=2, min_hosts=2, max_hosts=2),
    GlobalLeaf("['x']", num_blocks=2, num_compared=2, min_hosts=4, max_hosts=4),
)


def test_model_text_names_the_third_state():
    """Nothing to compare is neither equal nor different; replicas-only is said as such."""
    ok = TreeDiff((), num_processes=4, num_leaves=5, global_leaves=GLOBALS)
    assert ok.ok and ok.not_compared == ("['sharded']",) and ok.by_replicas == ("['pairs']",)
    text = ok.summary()
    assert text.startswith('All 4 processes agree on every leaf they can compare (5 leaves).')
    assert (
        "nothing to compare across processes (no block is held by 2+ processes): ['sharded']"
        in text
    )
    assert 'compared over their replicas only' in text and "['pairs']" in text
    assert "['x']" not in text  # every host holds every block: compared as any leaf
    assert (
        GLOBALS[0]
        .describe(4)
        .endswith(
            'nothing to compare across processes (each of its 8 block(s) is held by one process)'
        )
    )
    assert 'each among the 2 processes holding it' in GLOBALS[1].describe(4)
    bad = TreeDiff((_block_leaf(), _text_leaf()), 4, 5, GLOBALS)
    assert bad.differing_paths == ("['x']", "['run']")
    assert "['x'] block [0:8, 8:16] [value] on process 3" in bad.summary()
    assert ok != TreeDiff((), 4, 5) and ok == pickle.loads(pickle.dumps(ok))
    assert json.loads(json.dumps(bad.to_dict()))['leaves'][0]['block'] == [[0, 8], [8, 16]]


def test_widget_shows_blocks_values_and_leaves_with_nothing_to_compare():
    """The view: block in the row, holders only; string values; the global leaves' verdicts."""
    import mhnotebook.widgets as mw

    ok = mw.TreeDiffView(TreeDiff((), num_processes=4, num_leaves=5, global_leaves=GLOBALS))
    html = ok.static_html()
    assert 'all 4 processes agree on every leaf they can compare (5 leaves)' in html
    assert re.search(
        r'<tr class="mh-global-leaf mh-not-compared" data-path="\[&#x27;sharded&#x27;\]">'
        r'.*?nothing to compare across processes</td>'
        r'<td>each of its 8 block\(s\) is held by one process',
        html,
    ), html
    assert re.search(
        r'mh-by-replicas" data-path="\[&#x27;pairs&#x27;\]">.*?compared over its replicas', html
    )
    assert 'data-path="[&#x27;x&#x27;]"' not in html
    leaf = _block_leaf()
    partial = LeafDiff(
        **{**leaf.__dict__, 'shapes': {0: (8, 8), 3: (8, 8)}, 'majority_processes': (0,)}
    )
    view = mw.TreeDiffView(TreeDiff((partial, _text_leaf()), 4, 5, GLOBALS))
    table = view.static_html()
    assert 'data-block="[0:8, 8:16]"' in table and 'block [0:8, 8:16]</span>' in table
    assert 'title="does not hold this block"' in table
    assert '2 of 5 leaves differ' in table
    assert '&#x27;exp-7&#x27; on processes 0-1, 3; &#x27;exp-7b&#x27; on process 2' in table
    assert '&lt;U' not in table
    titles = view.widget.children[2].titles
    assert titles[0].startswith("['x'] block [0:8, 8:16]  [value]  odd: process 3")


# -- the notebook: %mh_diff in a real session ------------------------------------------------

SETUP = """
import jax, numpy as np, multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model'))
v = np.arange(64, dtype=np.float32).reshape(8, 8)
sharded = jax.make_array_from_callback((8, 8), NamedSharding(mesh, P(('data', 'model'))),
                                       lambda i: v[i])
rep = jax.make_array_from_callback((8, 8), NamedSharding(mesh, P(None, 'model')),
                                   lambda i: v[i] + (jax.process_index() == 2))
"""


# Release rotation; covered on every landing by a healthy state reports nothing: the test above;
# sharded leaves: test_fingerprint
@pytest.mark.release
@pytest.mark.cluster
def test_mh_diff_of_a_sharded_leaf_says_nothing_differs():
    """%mh_diff sharded: nothing differs, nothing to compare across processes; the widget
    says so."""
    from _helpers import local_session, magic_shell

    from mhnotebook.widgets import TreeDiffView

    with local_session(SETUP) as session:
        ip, magics = magic_shell(session)
        try:
            view = ip.run_line_magic('mh_diff', 'sharded')
            assert isinstance(view, TreeDiffView)
            assert view.diff.ok and view.diff.not_compared == ('',)
            assert 'nothing to compare across processes' in view.text()
            assert 'differ' not in view.text()
            bad = ip.run_line_magic('mh_diff', 'rep')
            assert [leaf.odd_processes for leaf in bad.diff.leaves] == [(2,), (2,)]
            assert [leaf.block for leaf in bad.diff.leaves] == [((0, 8), (0, 4)), ((0, 8), (4, 8))]
            pages = (view.static_html(), bad.static_html())
        finally:
            magics.session = None
    from _browser import chromium

    with chromium() as browser:  # what a reader of the notebook sees
        page = browser.new_page()
        page.set_content(pages[0])
        assert page.locator('.mh-ok').inner_text() == (
            'all 4 processes agree on every leaf they can compare (1 leaves)'
        )
        row = page.locator('tr.mh-global-leaf.mh-not-compared')
        assert row.count() == 1 and row.is_visible()
        assert 'nothing to compare across processes' in row.inner_text()
        assert page.locator('.mh-flagged').count() == 0
        page.set_content(pages[1])
        rows = page.locator('tr.mh-leaf')  # one row for the leaf, its two blocks listed
        assert rows.count() == 1
        text = rows.nth(0).inner_text()
        assert 'blocks [0:8, 0:4], [0:8, 4:8] (2 of its blocks differ)' in text, text
        assert page.locator('tr.mh-leaf td.mh-odd-host').count() == 1  # process 2
