"""Names of engine values (`multihost._names`) on real flax, optax and nnx objects, in this
process: attributes on dataclasses and dicts, keys and items, the trailing cut, the errors, and
that nothing typed runs. Also PRNG key leaves through the gather's export and rebuild.
"""

from __future__ import annotations

import collections.abc
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.core import FrozenDict

from mhnotebook._transfer._gather import KeyData, _assemble, _plan, key_leaf, parse_target
from multihost import _names, engine


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])


class Shadowing(collections.abc.Mapping):
    """A mapping with a data attribute named like one of its keys."""

    scale = 'the attribute'

    def __getitem__(self, k):
        return {'scale': 'the key', 'w': 1}[k]

    def __iter__(self):
        return iter(['scale', 'w'])

    def __len__(self):
        return 2


@pytest.fixture(scope='module')
def ns():
    params = {'embed': {'embedding': jnp.ones((4, 2))}, 'block_0': {'kernel': jnp.zeros(3)}}
    model = Model(nnx.Rngs(0))
    return dict(
        params=params,
        frozen=FrozenDict({'a': {'b': jnp.arange(2.0)}, 'items': 1}),
        opt=optax.adamw(1e-3).init(params),
        model=model,
        st=nnx.state(model),
        x=np.arange(12.0).reshape(3, 4),
        shadow=Shadowing(),
    )


def _value(ns, text):
    return _names.resolve(ns, text)[0]


def test_attributes_and_keys_reach_the_same_leaves(ns):
    """dict keys as attributes or subscripts; optax named tuples; nnx modules and states."""
    emb = ns['params']['embed']['embedding']
    assert _value(ns, 'params.embed.embedding') is emb
    assert _value(ns, "params['embed']['embedding']") is emb
    assert _value(ns, "params.embed['embedding']") is emb
    assert _value(ns, 'frozen.a.b') is ns['frozen']['a']['b']
    assert _value(ns, "opt[0].mu['embed'].embedding").shape == (4, 2)
    assert _value(ns, 'opt[0].count').shape == ()
    assert _value(ns, 'model.lin.kernel') is ns['model'].lin.kernel
    assert _value(ns, 'model.layers[1].bias') is ns['model'].layers[1].bias
    assert _value(ns, 'st.lin.kernel') is _value(ns, "st['lin']['kernel']")
    assert _value(ns, 'st.layers[0].kernel').shape == (4, 4)
    # a real attribute wins over a key of the same name
    assert _value(ns, 'shadow.scale') == 'the attribute'
    assert _value(ns, "shadow['scale']") == 'the key'
    assert _value(ns, 'shadow.w') == 1


def test_every_leaf_path_jax_writes_is_a_name(ns):
    """name + jax.tree_util.keystr(path) names that leaf, for each tree here (what the tree
    table's values and the magics rely on)."""
    for name in ('params', 'frozen', 'opt', 'st'):
        for path, leaf in jax.tree_util.tree_flatten_with_path(ns[name])[0]:
            with warnings.catch_warnings():
                # an nnx state's paths end in .value, which flax 0.12 deprecates (still works)
                warnings.simplefilter('ignore', DeprecationWarning)
                assert _value(ns, name + jax.tree_util.keystr(path)) is leaf


def test_the_trailing_cut_is_told_from_a_key(ns):
    """An integer after an array is a cut, after a sequence an item; slices only at the end."""
    assert _names.resolve(ns, 'x[1]', cuts=True)[1] == (1,)
    assert _names.resolve(ns, 'x[::2, 1:]', cuts=True)[1] == (slice(None, None, 2), slice(1, None))
    assert _names.resolve(ns, 'opt[0]', cuts=True)[1] is None
    assert parse_target('x[::2, 1:]') == ('x', (slice(None, None, 2), slice(1, None)))
    assert parse_target("params['embed'].embedding[-1]") == ("params['embed'].embedding[-1]", None)
    assert parse_target("params[ 'embed' ]") == ("params['embed']", None)
    assert _names.short_name("params['embed']['embedding'][::2]") == 'embedding'
    assert _names.short_name('opt[0]') == 'opt'


@pytest.mark.parametrize(
    'text, cuts, words',
    [
        (
            'params.embedd',
            False,
            ["params.embedd: params has no key or attribute 'embedd'", "did you mean 'embed'?"],
        ),
        ("params['block_0']['kernal']", False, ["params['block_0'] has no key 'kernal'"]),
        ('opt[5]', False, ['opt[5]: opt (a tuple of 3) has no item 5']),
        ("opt['mu']", False, ['opt is a tuple of 3: index it with an integer']),
        ('model.lin.kernal', False, ['(a Linear) has no attribute', "did you mean 'kernel'?"]),
        ('frozen.items', False, ['a real attribute wins', "write frozen['items']"]),
        ('x[1]', False, ['only %mh_allgather cuts arrays: pass x']),
        ('x[::2]', False, ['only %mh_allgather does']),
        ('x[::2].T', True, ['an array cut can only be the last step']),
        ('params[::2]', True, ['cuts an array, but params is a dict']),
        ('nope.a', False, ["name 'nope' is not defined on this engine"]),
        ("__import__('os').getpid()", False, ['is not a name of an engine value']),
        ('x[len(x)]', True, ['len(x) is not an integer literal']),
        ('x + 1', False, ['is not a name of an engine value']),
        ('', False, ['is not a name of an engine value']),
    ],
)
def test_a_failing_step_names_itself(ns, text, cuts, words):
    with pytest.raises(_names.BadName) as err:
        _names.resolve(ns, text, cuts=cuts)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_nothing_typed_runs(ns, tmp_path):
    """A name that would run code is refused before anything runs."""
    marker = tmp_path / 'ran'
    for text in (
        f"x[__import__('pathlib').Path({str(marker)!r}).touch()]",
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
        f"(lambda: open({str(marker)!r}, 'w'))()",
    ):
        with pytest.raises(_names.BadName):
            _names.resolve(ns, text, cuts=True)
    assert not marker.exists()


def _gather_here(ns, name, index=None):
    part = engine.gather_local(ns, name, index=index)
    return _assemble(_plan([part]), [part])


@pytest.mark.parametrize('impl, width', [('threefry2x32', 2), ('rbg', 4)])
def test_key_leaves_gather_as_keys_of_their_impl(impl, width):
    """A key leaf travels as its key data and comes back as a key array of the same impl."""
    keys = jax.random.split(jax.random.key(7, impl=impl), 6)
    ns = {'tree': {'k': keys, 'w': np.ones(2)}, 'k': keys}
    meta = engine.gather_local(ns, 'tree')
    leaf = meta['leaves'][meta['paths'].index("['k']")]
    assert leaf['key_impl'] == impl and leaf['dtype'] == 'uint32'
    assert leaf['shape'] == (6, width)
    out = _gather_here(ns, 'tree')['k'][0]  # one process: stacked along a new axis 0
    assert str(jax.random.key_impl(out)) == impl and out.shape == (6,)
    np.testing.assert_array_equal(jax.random.key_data(out), jax.random.key_data(keys))
    cut = _gather_here(ns, 'k', index=(slice(1, 4),))
    np.testing.assert_array_equal(jax.random.key_data(cut[0]), jax.random.key_data(keys[1:4]))


def test_key_data_without_jax_names_the_impl():
    """Where the kernel cannot import jax, a key leaf is KeyData(data, impl)."""
    code = (
        'import sys; sys.modules["jax"] = None\n'
        'import numpy as np\n'
        'from mhnotebook._transfer._gather import key_leaf\n'
        'k = key_leaf(np.arange(4, dtype=np.uint32).reshape(2, 2), "threefry2x32")\n'
        'print(type(k).__name__, k.impl, k.data.tolist())\n'
    )
    out = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        check=True,
    ).stdout
    assert out.split(maxsplit=2) == ['KeyData', 'threefry2x32', '[[0, 1], [2, 3]]\n']
    # an implementation jax does not know: the data too, named
    got = key_leaf(np.zeros((2,), np.uint32), 'no-such-impl')
    assert isinstance(got, KeyData) and got.impl == 'no-such-impl'


def test_a_function_is_not_a_value(ns):
    """A method or function reached by a name is refused, and a dict's key suggested only on
    a mapping."""
    with pytest.raises(_names.BadName, match=r"a key 'keys' would be params\['keys'\]"):
        _names.resolve(ns, 'params.keys')
    with pytest.raises(_names.BadName, match='is a function or method') as err:
        _names.resolve(ns, 'model.lin.__call__')
    assert 'would be' not in str(err.value)
