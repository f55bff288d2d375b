"""Names into a real program's pytrees, through the magics: a flax + optax train state.

A real ipyparallel session (4 hosts x 2 CPU devices) whose engines run
``_flax_program`` (this folder on their ``sys.path``) and build
``state = create_state(make_mesh())``: a flax ``TrainState`` (a dataclass with
a dict of params, an optax state of named tuples, a typed PRNG key, and a
``tx`` of optax closures that pickle refuses). Every magic that takes a name
gets attribute and subscript names of its leaves; a whole tree is one table
(``%mh_layout state.params``); the key leaf gathers as a key array. The
expectations are computed on the engines with jax itself, not with our code.
Last, the table's click in a real browser: Voila renders a notebook that
builds the same state (2 processes) and Chromium clicks a leaf.
"""

from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np
import pytest
from _helpers import local_session, magic_shell
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from mhnotebook.widgets import LayoutView, NonfiniteView, TreeDiffView, TreeLayoutView

# Release rotation; covered on every landing by names of real flax, optax and nnx values:
# tests/engine/test_names.py; the magics on a real cluster: tests/notebook/test_notebook_session.py
pytestmark = [pytest.mark.cluster, pytest.mark.release]

TESTS_DIR = str(pathlib.Path(__file__).parent.parent)
SHOTS = pathlib.Path(os.environ.get('MH_SHOTS', '/tmp'))
ATTN_KERNEL = "state.params['block_0']['MultiHeadDotProductAttention_0']['key']['kernel']"

SETUP = f"""
import sys
sys.path.insert(0, {TESTS_DIR!r})
import json
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from _flax_program import create_state, make_mesh
mesh = make_mesh()
state = create_state(mesh)
key_data = np.asarray(jax.random.key_data(state.dropout_key.addressable_shards[0].data))
def _truth(tree):
    # per leaf, with jax alone: shape, dtype, spec, bytes this host holds
    out = {{}}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        spec = x.sharding.spec if isinstance(x.sharding, NamedSharding) else None
        out[jax.tree_util.keystr(path)] = [
            list(x.shape), str(x.dtype), None if spec is None else str(spec),
            sum(s.data.nbytes for s in x.addressable_shards),
        ]
    return json.dumps(out)
truth_params = _truth(state.params)
odd = jax.make_array_from_callback(
    (4,), NamedSharding(mesh, P()), lambda i: np.full(4, float(jax.process_index() == 2))[i]
)
n_state_leaves = len(jax.tree.leaves(state))
n_opt_state = len(state.opt_state)
mixed = {{'embedding': state.params['embed']['embedding'], 'odd': odd}}
"""


@pytest.fixture(scope='module')
def shell():
    with local_session('pass') as s:
        # jit-compiling the init on 4 engines takes ~10 s here, minutes on a loaded machine
        s.execute(SETUP, timeout=600, echo=False)
        ip, _ = magic_shell(s)
        yield ip, s


def _pull(session, name, process=0):
    return session.client[session.engine_ids[process]].pull(name, block=True)


def _spec(jax_spec: str | None) -> str:
    """jax's text of a spec (``"PartitionSpec(None, 'model')"`` in older jax) as ``"P(...)"``."""
    if jax_spec is None:
        return ''
    return 'P' + jax_spec.removeprefix('PartitionSpec').removeprefix('P')


def test_layout_of_a_leaf_named_by_key_subscripts(shell):
    """The name %mh_layout used to suggest and then refuse: shape and spec as jax says."""
    ip, session = shell
    truth = json.loads(_pull(session, 'truth_params'))
    shape, dtype, spec, _ = truth["['block_0']['MultiHeadDotProductAttention_0']['key']['kernel']"]
    view = ip.run_line_magic('mh_layout', ATTN_KERNEL)
    assert isinstance(view, LayoutView)
    assert list(view.layout.shape) == shape and view.layout.dtype == dtype
    assert view.layout.spec == _spec(spec)
    assert view.report is not None and view.report.ok


def test_layout_of_a_leaf_named_by_attributes_on_dicts(shell):
    """state.params.embed.embedding: a dataclass field, then dict keys written as attributes."""
    ip, session = shell
    shape, dtype, spec, _ = json.loads(_pull(session, 'truth_params'))["['embed']['embedding']"]
    by_attr = ip.run_line_magic('mh_layout', 'state.params.embed.embedding --no-values')
    by_key = ip.run_line_magic('mh_layout', "state.params['embed']['embedding'] --no-values")
    assert list(by_attr.layout.shape) == shape and by_attr.layout.spec == _spec(spec)
    assert by_attr.layout == by_key.layout


def test_allgather_a_whole_train_state_with_its_key(shell):
    """%mh_allgather state: a TrainState back, every array exact, the dropout key a key array
    of the hosts' implementation with their key data; tx (optax closures) stays on the hosts."""
    ip, session = shell
    with capture_output() as cap:
        ip.run_line_magic('mh_allgather', 'state -o out')
    assert 'out = state gathered from 4 processes' in cap.stdout
    out = ip.user_ns['out']
    assert type(out).__name__ == 'TrainState'
    key = out.dropout_key
    assert isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    assert str(jax.random.key_impl(key)) == 'threefry2x32'
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(key)), _pull(session, 'key_data'))
    embedding = session.allgather("state.params['embed']['embedding']")
    np.testing.assert_array_equal(out.params['embed']['embedding'], embedding)
    assert out.opt_state[0].mu['embed']['embedding'].shape == embedding.shape
    assert int(out.step) == 0
    assert 'not shipped from the hosts' in repr(out.tx)
    # the key alone, and again (the repeated gather's cached plan)
    for _ in range(2):
        alone = session.allgather('state.dropout_key')
        np.testing.assert_array_equal(
            np.asarray(jax.random.key_data(alone)), _pull(session, 'key_data')
        )


def test_allgather_a_cut_of_a_leaf_named_by_attributes(shell):
    """state.params.embed.embedding[::2]: the trailing cut is cut on the hosts; the default
    notebook name is the last attribute."""
    ip, session = shell
    whole = session.allgather('state.params.embed.embedding')
    with capture_output():
        ip.run_line_magic('mh_allgather', 'state.params.embed.embedding[::2]')
    np.testing.assert_array_equal(ip.user_ns['embedding'], whole[::2])
    # an integer after a sequence is an item, after an array a cut
    count = session.allgather('state.opt_state[0].count')
    assert count.shape == () and int(count) == 0
    np.testing.assert_array_equal(session.allgather('state.params.embed.embedding[3]'), whole[3])


def test_diff_and_nan_of_named_subtrees(shell):
    """%mh_diff and %mh_nonfinite take the same names; the real params agree and are finite."""
    ip, _ = shell
    diff = ip.run_line_magic('mh_diff', 'state.params')
    assert isinstance(diff, TreeDiffView) and diff.diff.ok
    assert diff.diff.num_leaves == 19
    nan = ip.run_line_magic('mh_nonfinite', "state.opt_state[0].mu['block_0']")
    assert isinstance(nan, NonfiniteView) and nan.report.ok
    assert nan.report.checked['leaves'] == 16


@pytest.mark.parametrize(
    'magic, name, words',
    [
        (
            'mh_layout',
            'state.params.embedd',
            [
                "state.params.embedd: state.params has no key or attribute 'embedd'",
                'keys: LayerNorm_0, block_0, embed',
                "did you mean 'embed'?",
            ],
        ),
        (
            'mh_allgather',
            "state.params['block_0']['Dense_9']",
            ["state.params['block_0'] has no key 'Dense_9'", 'Dense_0, Dense_1'],
        ),
        ('mh_diff', 'state.opt_state[7]', ['state.opt_state[7]: state.opt_state (a tuple of']),
        (
            'mh_nonfinite',
            'state.params.items',
            [
                'state.params.items is a function or method',
                "a key 'items' would be state.params['items']",
            ],
        ),
        ('mh_layout', 'state.params.embed.embedding[::2]', ['only %mh_allgather']),
        ('mh_layout', 'state.params[f()]', ['is not a name of an engine value']),
    ],
)
def test_a_wrong_name_says_which_step_failed(shell, magic, name, words):
    """One line naming the step, what was there, and the way out; nothing is evaluated."""
    ip, _ = shell
    with pytest.raises(UsageError) as err:
        ip.run_line_magic(magic, name)
    text = str(err.value)
    assert '\n' not in text
    for word in words:
        assert word in text, text


def test_layout_of_a_pytree_is_one_table(shell):
    """%mh_layout state.params: one row per leaf with jax's shape, dtype and spec, the bytes each
    host holds, and replicas agreeing; a leaf whose replicas differ says on which host."""
    ip, session = shell
    view = ip.run_line_magic('mh_layout', 'state.params')
    assert isinstance(view, TreeLayoutView)
    truths = [json.loads(_pull(session, 'truth_params', p)) for p in range(4)]
    assert [leaf.path for leaf in view.tree.leaves] == list(truths[0])
    for leaf, row in zip(view.tree.leaves, view.tree.rows()):
        shape, dtype, spec, _ = truths[0][leaf.path]
        assert row[0] == leaf.path
        assert row[1] == str(shape) and row[2] == dtype and row[3] == _spec(spec)
        assert leaf.bytes_per_host == {p: truths[p][leaf.path][3] for p in range(4)}
        assert row[5] == 'agree'
    text = view.text()
    assert all(leaf.path in text for leaf in view.tree.leaves)
    assert 'bytes per process' in text and 'replicas' in text
    # a click (here: select) shows the leaf's layout
    view.select("['embed']['embedding']")
    assert view.leaf_view is not None and view.leaf_view.layout.shape == (64, 32)

    mixed = ip.run_line_magic('mh_layout', 'mixed')
    rows = dict((r[0], r) for r in mixed.tree.rows())
    assert rows["['odd']"][5] == 'DIFFER on process 2' and rows["['embedding']"][5] == 'agree'
    assert not mixed.tree.ok

    # the whole state: its key leaf and step are rows too
    whole = ip.run_line_magic('mh_layout', 'state --no-values')
    key = whole.tree.leaf('.dropout_key')
    assert key.dtype == 'key<fry>' and key.shape == ()
    assert len(whole.tree.leaves) == _pull(session, 'n_state_leaves')


def test_a_tree_that_differs_between_hosts_fails_at_once(shell):
    """One host holds a leaf as numpy where the others hold a global array: every host fails
    the table's first check at once (not the others waiting in that leaf's replica check)."""
    import time

    ip, session = shell
    session.execute(
        "uneven = {'a': state.params['embed']['embedding'], 'b': state.params['embed']"
        "['embedding'] if jax.process_index() != 1 else np.zeros((64, 32), np.float32)}",
        echo=False,
    )
    t0 = time.monotonic()
    with pytest.raises(UsageError, match='CollectiveMismatchError'):
        ip.run_line_magic('mh_layout', 'uneven')
    assert time.monotonic() - t0 < 10
    assert ip.run_line_magic('mh_layout', 'state.params').tree.ok  # still in step


NOTEBOOK_CELLS = [
    '%load_ext mhnotebook\n%mh_cluster start -n 2 -d 2',
    '%%mh\nimport sys\nsys.path.insert(0, {tests!r})\n'
    'from _flax_program import create_state, make_mesh\nstate = create_state(make_mesh())',
    '%mh_layout state.params',
]


def _notebook(path: pathlib.Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(tests=TESTS_DIR)) for c in NOTEBOOK_CELLS]
    nb.metadata['kernelspec'] = {
        'name': 'python3',
        'display_name': 'Python 3',
        'language': 'python',
    }
    nbformat.write(nb, str(path))


@pytest.mark.release
@pytest.mark.browser
def test_a_click_on_a_leaf_shows_its_picture_in_chromium(tmp_path):
    """Voila renders %mh_layout state.params (a real kernel, 2 hosts); in Chromium, one row per
    leaf; a click on a leaf shows its layout picture (a PNG) and its blocks; a click on a block
    shows its values, gathered then."""
    from _browser import chromium, need_chromium, voila, voila_page, wait_for

    need_chromium()
    _notebook(tmp_path / 'tree.ipynb')
    with voila(tmp_path / 'tree.ipynb', tmp_path) as (url, log), chromium() as browser:
        page = voila_page(
            browser,
            url,
            log,
            '.mh-tree-layout .mh-tree-leaf',
            'tree table',
            viewport={'width': 1400, 'height': 900},
        )
        view = page.locator('.mh-tree-layout').first
        leaves = view.locator('.mh-tree-leaf')
        assert leaves.count() == 19
        assert view.locator('.mh-replicas-agree').count() == 19
        assert view.locator('.mh-tree-leaf-view .mh-layout').count() == 0
        view.locator('.mh-tree-leaf', has_text="['embed']['embedding']").click()
        box = view.locator('.mh-tree-leaf-view')
        wait_for(
            lambda: (
                box.locator('img.mh-layout-image').count() == 1
                and box.locator('img.mh-layout-image').evaluate('i => i.naturalWidth') > 0
            ),
            60,
            'the leaf picture',
            page,
        )
        assert 'float32[64, 32]' in box.locator('.mh-layout-header').inner_text()
        assert "P('model', None)" in box.locator('.mh-layout-header').inner_text()
        assert box.locator('.mh-layout-block').count() == 2
        box.locator('.mh-layout-block').first.click()
        wait_for(
            lambda: 'values (of the gathered array' in box.locator('.mh-layout-info').inner_text(),
            60,
            'the block values',
            page,
        )
        assert '[0:32, 0:32]' in box.locator('.mh-layout-info').inner_text()
        view.locator('.mh-tree-layout-table').screenshot(path=str(SHOTS / 'tree_table.png'))
        # the static picture (for saved notebooks) is the same table, hidden while live
        statics = page.locator('.mh-static .mh-tree-row')
        assert statics.count() == 19 and not statics.first.is_visible()
