"""`multihost.tree_diff` and `assert_equal` on 4 real JAX processes x 2 CPU devices.

Each ``multiprocess`` test body runs in every process; a body passes only if
it passes in all four. Unmarked tests run in the pytest process: the
single-process fast path and the model (`TreeDiff`, `LeafDiff`) on synthetic
data.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import env_var, host_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost import _jax_adapter
from multihost._checks import _treediff
from multihost._models._treediff import LeafDiff, TreeDiff
from multihost._text import fmt_hosts

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


@contextlib.contextmanager
def _patched(name: str, value):
    """Sets ``_treediff.<name>`` for the block (multiprocess bodies get no fixtures)."""
    old = getattr(_treediff, name)
    setattr(_treediff, name, value)
    try:
        yield
    finally:
        setattr(_treediff, name, old)


def _recording_broadcasts(sizes: list[int]):
    real = _treediff._broadcast_bytes
    return _patched('_broadcast_bytes', lambda buf, n, src: sizes.append(n) or real(buf, n, src))


def _base_tree() -> dict:
    return {
        'w': np.arange(20, dtype=np.float32).reshape(4, 5),
        'b': np.zeros(3, np.int32),
        'nested': {'j': jnp.ones((2, 2)), 'bf': jnp.arange(4, dtype=jnp.bfloat16)},
        'scalar': 7,
        'big': np.arange(1000, dtype=np.float64),
    }


# -- equal trees -------------------------------------------------------------------


@multiprocess
def test_equal_trees_are_ok_on_every_host():
    """Equal trees (numpy, jax, bf16, scalars, PRNG keys, global arrays) give ok on every host."""
    glob = jax.make_array_from_callback(
        (4, 2), NamedSharding(host_mesh(), P()), lambda i: np.ones((4, 2))[i]
    )
    tree = {**_base_tree(), 'key': jax.random.key(3), 'g': glob, 'nan': np.array([np.nan, 1.0])}
    diff = multihost.tree_diff(tree)
    assert isinstance(diff, TreeDiff)
    assert diff.ok and diff.leaves == () and diff.odd_processes == ()
    assert diff.num_processes == 4 and diff.num_leaves == len(jax.tree.leaves(tree))
    multihost.assert_equal(tree, 'must pass')


@multiprocess
def test_equal_trees_move_no_leaf_data():
    """Equal trees: only fingerprints travel; no leaf bytes are broadcast."""
    calls: list[int] = []
    with _recording_broadcasts(calls):
        assert multihost.tree_diff(_base_tree()).ok
    assert calls == []


@multiprocess
def test_equal_trees_exchange_only_a_digest_per_host():
    """Equal trees: each host publishes one short digest, never its per-leaf list."""
    assert multihost.tree_diff(_base_tree()).ok
    seq = multihost._exchange._sequence.history()[-1].seq
    client = _jax_adapter.client()
    base = f'{multihost._exchange._kv.epoch_dir(seq)}/{seq}'
    heads = client.key_value_dir_get(f'{base}/head/d/')
    assert len(heads) == 4 and all(len(value) == 32 for _, value in heads)
    assert client.key_value_dir_get(f'{base}/fp/') == []


# -- value differences ---------------------------------------------------------------


@multiprocess
def test_one_leaf_differs_on_one_host():
    """Host 2 changes two elements of 'w': exactly that leaf, odd host 2, exact numbers."""
    pid = jax.process_index()
    tree = _base_tree()
    if pid == 2:
        tree['w'][1, 3] += 2.5
        tree['w'][3, 0] -= 1.0
    diff = multihost.tree_diff(tree)
    assert not diff.ok
    assert [leaf.path for leaf in diff.leaves] == ["['w']"]
    leaf = diff["['w']"]
    assert leaf.kind == 'value'
    assert leaf.odd_processes == (2,) and leaf.majority_processes == (0, 1, 3)
    assert leaf.reference_process == 0
    assert leaf.num_different == {2: 2}
    assert leaf.max_abs_diff == {2: 2.5}
    assert leaf.first_index == {2: (1, 3)}
    assert leaf.shapes == {h: (4, 5) for h in range(4)}
    assert leaf.dtypes == {h: 'float32' for h in range(4)}
    assert len({leaf.digests[h] for h in (0, 1, 3)}) == 1 and leaf.digests[2] != leaf.digests[0]
    # Small leaf: every host's value is kept, read-only.
    assert sorted(leaf.values) == [0, 1, 2, 3]
    np.testing.assert_array_equal(leaf.values[pid], tree['w'])
    np.testing.assert_array_equal(leaf.values[0], _base_tree()['w'])
    assert not leaf.values[2].flags.writeable


@multiprocess
def test_two_hosts_differ_from_majority():
    """Hosts 1 and 3 differ (each its own way): both are odd, each with its own summary."""
    pid = jax.process_index()
    tree = _base_tree()
    if pid == 1:
        tree['big'][10] = -5.0  # was 10: diff 15
    if pid == 3:
        tree['big'][500:510] += 0.25  # 10 elements
        tree['big'][999] = 1e6  # diff 1e6 - 999
    diff = multihost.tree_diff(tree)
    assert [leaf.path for leaf in diff.leaves] == ["['big']"]
    leaf = diff.leaves[0]
    assert leaf.odd_processes == (1, 3) and leaf.majority_processes == (0, 2)
    assert leaf.num_different == {1: 1, 3: 11}
    assert leaf.first_index == {1: (10,), 3: (500,)}
    assert leaf.max_abs_diff == {1: 15.0, 3: 1e6 - 999}
    assert leaf.values == {}  # 1000 elements: summary only
    assert diff.odd_processes == (1, 3)


@multiprocess
def test_a_tie_blames_no_host():
    """Two against two (issue 32 item 3): no majority, so no process is odd; the group holding
    process 0 is only the reference the others are compared with, and the text says so."""
    pid = jax.process_index()
    tree = {'x': np.full(3, 1 if pid in (2, 3) else 0, np.int8)}
    diff = multihost.tree_diff(tree)
    leaf = diff.leaves[0]
    assert leaf.tie and leaf.odd_processes == () and diff.odd_processes == ()
    assert leaf.majority_processes == (0, 1) and leaf.compared_processes == (2, 3)
    assert leaf.num_different == {2: 3, 3: 3} and leaf.max_abs_diff == {2: 1.0, 3: 1.0}
    assert leaf.describe().startswith("['x'] [value]: processes 0-1 and 2-3 differ; no majority")
    assert 'no majority, so no process is odd' in diff.summary(), diff.summary()
    # three against one is a majority: process 3 is odd, no tie
    odd = multihost.tree_diff({'x': np.int8(pid == 3)}).leaves[0]
    assert not odd.tie and odd.odd_processes == (3,)


@multiprocess
def test_odd_host_can_be_process_0():
    """Process 0 is the odd one out when the other three agree."""
    pid = jax.process_index()
    leaf = multihost.tree_diff({'x': np.float32(pid == 0)}).leaves[0]
    assert leaf.odd_processes == (0,) and leaf.majority_processes == (1, 2, 3)
    assert leaf.reference_process == 1
    assert leaf.first_index == {0: ()} and leaf.num_different == {0: 1}


@multiprocess
def test_bitwise_float_semantics():
    """Same NaN everywhere is equal; -0.0 vs 0.0 differs (max abs diff 0); NaN vs 1 gives NaN."""
    pid = jax.process_index()
    tree = {
        'same_nan': np.array([np.nan, 2.0]),
        'zero': np.array([0.0, -0.0 if pid == 1 else 0.0]),
        'nan_vs_1': np.array([np.nan if pid == 2 else 1.0, 3.0]),
    }
    diff = multihost.tree_diff(tree)
    assert [leaf.path for leaf in diff.leaves] == ["['nan_vs_1']", "['zero']"]
    zero = diff["['zero']"]
    assert zero.odd_processes == (1,) and zero.num_different == {1: 1}
    assert zero.max_abs_diff == {1: 0.0} and zero.first_index == {1: (1,)}
    nan = diff["['nan_vs_1']"]
    assert nan.odd_processes == (2,) and math.isnan(nan.max_abs_diff[2])


@multiprocess
def test_large_leaves_compare_in_chunks():
    """Comparison and broadcast chunking give the same counts as one piece."""
    pid = jax.process_index()
    x = np.arange(3000, dtype=np.int32)
    if pid == 3:
        x[[5, 6, 1500, 2999]] += np.array([1, -2, 3, -40], np.int32)
    sizes: list[int] = []
    with (
        _patched('_COMPARE_CHUNK', 7),
        _patched('_BROADCAST_CHUNK', 1000),
        _recording_broadcasts(sizes),
    ):
        leaf = multihost.tree_diff({'x': x, 'y': np.ones(10)}).leaves[0]
    assert sizes == [12000]
    assert leaf.odd_processes == (3,)
    assert leaf.num_different == {3: 4}
    assert leaf.first_index == {3: (5,)}
    assert leaf.max_abs_diff == {3: 40.0}


@multiprocess
def test_only_differing_leaves_are_broadcast():
    """Of a 1 MB tree, only the one differing 4 KB leaf's bytes travel."""
    pid = jax.process_index()
    tree = {f'l{i:03d}': np.full(1024, i, np.float32) for i in range(256)}
    if pid == 1:
        tree['l100'] = tree['l100'] + 1
    sizes: list[int] = []
    with _recording_broadcasts(sizes):
        diff = multihost.tree_diff(tree)
    assert [leaf.path for leaf in diff.leaves] == ["['l100']"]
    assert sizes == [4096]


# -- structure, shape and dtype differences ----------------------------------------


@multiprocess
def test_extra_and_missing_leaves_are_reported():
    """An extra key on host 1 and a leaf missing on host 3 are reported, not raised."""
    pid = jax.process_index()
    tree = _base_tree()
    if pid == 1:
        tree['extra'] = np.arange(3)
    if pid == 3:
        del tree['b']
    diff = multihost.tree_diff(tree)
    assert [leaf.path for leaf in diff.leaves] == ["['b']", "['extra']"]  # tree order
    b, extra = diff.leaves
    assert b.kind == 'structure' and b.odd_processes == (3,) and b.majority_processes == (0, 1, 2)
    assert b.shapes == {0: (3,), 1: (3,), 2: (3,), 3: None} and b.dtypes[3] is None
    assert extra.kind == 'structure' and extra.odd_processes == (1,)
    assert extra.majority_processes == (0, 2, 3)  # "missing" is the majority here
    assert extra.shapes == {0: None, 1: (3,), 2: None, 3: None}
    np.testing.assert_array_equal(extra.values[1], np.arange(3))
    assert diff.num_leaves == len(jax.tree.leaves(_base_tree())) + 1
    # The collective sequence stays aligned afterwards.
    multihost.sync_global_devices('after structure diff')


@multiprocess
def test_shape_and_dtype_differences_are_reported():
    """A leaf with another shape on host 0 and one with another dtype on host 3."""
    pid = jax.process_index()
    tree = _base_tree()
    if pid == 0:
        tree['b'] = np.zeros(4, np.int32)
    if pid == 3:
        tree['w'] = tree['w'].astype(np.float64)
    diff = multihost.tree_diff(tree)
    assert [leaf.path for leaf in diff.leaves] == ["['b']", "['w']"]
    b, w = diff.leaves
    assert b.kind == 'shape' and b.odd_processes == (0,) and b.shapes[0] == (4,)
    assert b.shapes[1] == (3,) and b.num_different == {}
    assert w.kind == 'dtype' and w.odd_processes == (3,)
    assert w.dtypes == {0: 'float32', 1: 'float32', 2: 'float32', 3: 'float64'}
    assert w.max_abs_diff == {}
    assert 'int32[4] on process 0' in b.describe()


# -- global arrays ---------------------------------------------------------------------


@multiprocess
def test_global_array_compares_addressable_data():
    """A replicated global array holding other data on host 1 (undefined behaviour) is found."""
    pid = jax.process_index()
    value = np.arange(8.0).reshape(4, 2) + (100 if pid == 1 else 0)
    glob = jax.make_array_from_callback((4, 2), NamedSharding(host_mesh(), P()), lambda i: value[i])
    assert not glob.is_fully_addressable
    diff = multihost.tree_diff({'g': glob})
    leaf = diff.leaves[0]
    assert leaf.path == "['g']" and leaf.odd_processes == (1,)
    assert leaf.num_different == {1: 8} and leaf.max_abs_diff == {1: 100.0}
    assert leaf.shapes[1] == (4, 2)


@multiprocess
def test_prng_keys_compare_by_key_data():
    """A PRNG key that differs on one host is reported with its key dtype."""
    pid = jax.process_index()
    diff = multihost.tree_diff({'k': jax.random.key(9 if pid == 2 else 0)})
    leaf = diff.leaves[0]
    assert leaf.odd_processes == (2,) and leaf.dtypes[2].startswith('key<')


# -- assert_equal ------------------------------------------------------------------------


@multiprocess
def test_assert_equal_raises_host_mismatch_on_every_host():
    """One host differs: every host raises HostMismatchError naming leaf path and odd host."""
    pid = jax.process_index()
    tree = {'w': np.arange(5) + (pid == 3), 'b': np.zeros(2)}
    with pytest.raises(multihost.HostMismatchError) as info:
        multihost.assert_equal(tree, fail_message='weights diverged')
    err = info.value
    assert isinstance(err, AssertionError)
    text = str(err)
    assert text.startswith('weights diverged')
    assert "['w']" in text and 'process 3' in text and "['b']" not in text
    assert isinstance(err.diff, TreeDiff) and err.diff.odd_processes == (3,)
    assert [leaf.path for leaf in err.diff.leaves] == ["['w']"]


@multiprocess
def test_assert_equal_message_is_bounded_for_huge_diffs():
    """1000 leaves differ on every host: the message stays short, .diff has them all."""
    pid = jax.process_index()
    tree = {f'layer_{i:04d}': np.full(8, pid, np.float32) for i in range(1000)}
    with pytest.raises(multihost.HostMismatchError) as info:
        multihost.assert_equal(tree, 'everything diverged')
    text = str(info.value)
    assert text.startswith('everything diverged')
    assert len(text) < 3000, len(text)
    assert '... and 990 more' in text and text.count('\n') <= 12
    assert len(info.value.diff.leaves) == 1000
    # four values, four groups of one: no majority, nobody odd; all compared with process 0
    first = info.value.diff.leaves[0]
    assert first.tie and first.odd_processes == () and first.compared_processes == (1, 2, 3)


@multiprocess
def test_assert_equal_structure_difference_raises_not_crashes():
    """A structure difference makes assert_equal raise HostMismatchError on every host."""
    tree = {'a': np.ones(2)}
    if jax.process_index() == 0:
        tree['only_on_0'] = np.ones(1)
    with pytest.raises(multihost.HostMismatchError, match=r"\['only_on_0'\]"):
        multihost.assert_equal(tree, 'structure')


# -- agreement across hosts and key-value hygiene -----------------------------------------


def _diff_with_differences():
    pid = jax.process_index()
    tree = _base_tree()
    tree['w'][0, pid] = 50.0 * pid
    if pid == 2:
        tree['extra'] = np.ones(2, np.uint8)
    tree['big'][pid * 7] = np.nan
    return multihost.tree_diff(tree)


def test_every_host_gets_an_identical_tree_diff(mp_cluster):
    """Each process returns its TreeDiff; all four are equal (and picklable, JSON-able)."""
    diffs = mp_cluster.run(_diff_with_differences)
    assert len(diffs) == 4 and all(isinstance(d, TreeDiff) for d in diffs)
    assert all(d == diffs[0] for d in diffs[1:])
    assert [pickle.dumps(d.to_dict()) for d in diffs[1:]] == [pickle.dumps(diffs[0].to_dict())] * 3
    d = diffs[0]
    assert [leaf.path for leaf in d.leaves] == ["['big']", "['w']", "['extra']"]
    w = d["['w']"]  # every host differs from process 0's value: no majority, nobody odd
    assert w.tie and w.odd_processes == () and w.compared_processes == (1, 2, 3)
    json.dumps(d.to_dict())


# -- single process ------------------------------------------------------------------------


def test_single_process_tree_diff_is_ok_without_communication(monkeypatch):
    """One process: tree_diff returns ok at once (no sequence entry, no key-value store)."""
    monkeypatch.setattr(_treediff._sequence, 'enter', lambda *a, **k: pytest.fail('entered'))
    diff = multihost.tree_diff({'a': np.ones(3), 'b': [1, 2.0]})
    assert diff.ok and diff.num_processes == 1 and diff.num_leaves == 3
    assert multihost.assert_equal({'a': np.array([np.nan])}, 'x') is None


def _leaf(path: str, odd=(3,), **kw) -> LeafDiff:
    hosts = range(4)
    base = dict(
        path=path,
        kind='value',
        odd_processes=tuple(odd),
        majority_processes=tuple(h for h in hosts if h not in odd),
        shapes={h: (2,) for h in hosts},
        dtypes={h: 'float32' for h in hosts},
        digests={h: 'ab' * 8 for h in hosts},
        num_different={h: 1 for h in odd},
        max_abs_diff={h: 0.5 for h in odd},
        first_index={h: (1,) for h in odd},
        values={h: np.array([1.0, float(h)], np.float32) for h in hosts},
    )
    base.update(kw)
    return LeafDiff(**base)


def test_summary_is_bounded_and_names_paths_and_hosts():
    """The report lists at most max_leaves leaves with their odd hosts, the rest as a count."""
    diff = TreeDiff(
        leaves=tuple(_leaf(f"['p{i}']" + 'x' * 500) for i in range(1000)),
        num_processes=4,
        num_leaves=2000,
    )
    text = diff.summary(max_leaves=10)
    assert text.count('\n') == 11 and len(text) < 3000
    assert "['p0']" in text and "['p9']" in text and "['p10']" not in text
    assert 'process 3' in text and '... and 990 more' in text
    assert str(diff) == diff.summary()
    assert not diff.ok and 'ok=False' in repr(diff)
    assert TreeDiff((), 4, 5).summary() == 'All 4 processes hold the same tree (5 leaves).'


def test_host_lists_are_compressed_and_bounded():
    """Host lists print as ranges and are cut after a few ranges."""
    assert fmt_hosts([3]) == 'process 3'
    assert fmt_hosts([0, 1, 2, 5]) == 'processes 0-2, 5'
    text = fmt_hosts(list(range(0, 400, 2)))
    assert text.endswith('(200 in all)') and len(text) < 80


def test_leaf_diff_equality_is_exact_and_survives_pickle():
    """LeafDiffs compare by value (arrays by bytes, NaN == NaN) and round-trip through pickle."""
    a = _leaf("['w']", max_abs_diff={3: math.nan})
    b = pickle.loads(pickle.dumps(a))
    assert a == b
    assert a != _leaf("['w']", max_abs_diff={3: 1.0})
    assert a != _leaf("['w']", values={})
    assert json.loads(json.dumps(a.to_dict()))['max_abs_diff'] == {'3': 'nan'}


def test_compare_is_bitwise_with_first_index_and_max():
    """_compare counts bitwise-different elements, the first index and the max abs diff."""
    own = np.array([[0.0, -0.0], [np.nan, 4.0]], np.float32)
    ref = np.array([[0.0, 0.0], [np.nan, 1.0]], np.float32)
    # +0 and -0 are 1 ulp apart; 1 and 4 are 2^23 * 2 ulps apart in float32
    assert _treediff._compare(own, ref) == (2, (0, 1), 3.0, 2 * 2**23)
    bf16 = jnp.bfloat16
    got = _treediff._compare(np.array([1, 2], bf16), np.array([1, 3], bf16))
    assert got == (1, (1,), 1.0, 64)  # 0x4000 against 0x4040
    assert _treediff._compare(np.array(['a', 'b']), np.array(['a', 'c']))[:2] == (1, (1,))
    assert math.isnan(_treediff._compare(np.array(['a', 'b']), np.array(['a', 'c']))[2])
    # ulps: floats only, none through a NaN
    assert _treediff._compare(np.array([1, 2], np.int32), np.array([1, 3], np.int32))[3] is None
    nan = _treediff._compare(np.array([np.nan], np.float32), np.array([1.0], np.float32))
    assert nan[3] is None
    one = np.float32(1.0)
    assert _treediff._compare(np.array([np.nextafter(one, 2 * one)]), np.array([one]))[3] == 1
    assert _treediff._compare(np.array([-1.0]), np.array([1.0]))[3] == 2 * 0x3FF0000000000000 + 1


def test_digest_changes_with_any_bit():
    """Equal bytes give equal digests; one flipped bit changes the digest."""
    a = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    b = a.copy()
    assert _treediff._digest(a) == _treediff._digest(b)
    b.view(np.uint8)[12345] ^= 1
    assert _treediff._digest(a) != _treediff._digest(b)
    assert len(_treediff._digest(a)) == 33  # 'x' + 16 bytes of XXH3-128 (see fingerprint.host)
    assert len(_treediff._digest(a, 'device')) == 32  # the kernel: one lane set


@multiprocess
def test_numpy_on_one_host_equals_device_leaves_on_the_others():
    """The fingerprint has one definition: numpy on host 0, device arrays elsewhere, alike.

    A large device leaf that differs on one host is moved and compared exactly;
    a sharded leaf (two local devices) is fingerprinted over its blocks.
    """
    pid = jax.process_index()
    rng = np.random.default_rng(7)
    values = {
        'f32': rng.standard_normal((300, 301)).astype(np.float32),
        'bf16': rng.standard_normal(1001).astype(jnp.bfloat16),
        'i8': rng.integers(-100, 100, 77).astype(np.int8),
        'c64': (rng.standard_normal(9) + 1j).astype(np.complex64),
        'b': rng.integers(0, 2, 13).astype(bool),
    }
    local = jax.sharding.Mesh(np.array(jax.local_devices()), ('d',))
    split = jax.device_put(values['f32'], NamedSharding(local, P('d')))
    tree = values if pid == 0 else {k: jnp.asarray(v) for k, v in values.items()}
    multihost.assert_equal(
        {**tree, 'split': values['f32'] if pid == 0 else split}, 'one definition'
    )
    big = rng.standard_normal(1 << 20).astype(np.float32)
    if pid == 3:
        big[123_456] = -big[123_456]
    diff = multihost.tree_diff({'big': jnp.asarray(big)})
    (leaf,) = diff.leaves
    assert leaf.kind == 'value' and leaf.odd_processes == (3,)
    assert leaf.first_index == {3: (123_456,)} and leaf.num_different == {3: 1}
    # Two odd hosts, each narrowed to its own block (hosts 0, 1 the majority).
    grid = np.zeros((1024, 1024), np.float32)
    if pid == 2:
        grid[1000, 3] = 1.0
    if pid == 3:
        grid[7, 9] = grid[7, 10] = -2.0
    (leaf,) = multihost.tree_diff({'grid': jnp.asarray(grid)}).leaves
    assert leaf.odd_processes == (2, 3) and leaf.first_index == {2: (1000, 3), 3: (7, 9)}
    assert leaf.num_different == {2: 1, 3: 2} and leaf.max_abs_diff == {2: 1.0, 3: 2.0}


@multiprocess
def test_a_leaf_offloaded_to_host_memory_that_differs_on_one_host():
    """Optimizer state offloaded to host memory (``memory_kind='pinned_host'``) beside device
    leaves, one element of it changed on host 1: found and counted like a device leaf, under
    the kernel's definition too (what an accelerator uses)."""
    pid = jax.process_index()
    device = jax.local_devices()[0]
    a = np.arange(300_000, dtype=np.float32)
    if pid == 1:
        a[123_456] += 1.0
    off = jax.device_put(
        a, jax.sharding.make_single_device_sharding(device, memory_kind='pinned_host')
    )
    tree = {'params': jnp.ones((64, 64)), 'mu': off}
    for how in ('auto', 'device'):
        with env_var('MULTIHOST_FINGERPRINT', how):
            diff = multihost.tree_diff(tree)
        assert [leaf.path for leaf in diff.leaves] == ["['mu']"], how
        leaf = diff["['mu']"]
        assert leaf.odd_processes == (1,) and leaf.num_different == {1: 1}, how
        assert leaf.first_index == {1: (123_456,)}, how


def test_describe_says_ulps_for_near_values_only():
    """A leaf whose values are a few ulps apart says so; far apart, the abs diff alone."""
    from multihost._models._treediff import ULPS_SAID, LeafDiff

    def leaf(ulps: int) -> LeafDiff:
        return LeafDiff(
            path="['w']", kind='value', odd_processes=(1,), majority_processes=(0, 2),
            shapes={0: (4,), 1: (4,), 2: (4,)}, dtypes=dict.fromkeys(range(3), 'float32'),
            digests={0: 'a', 1: 'b', 2: 'a'}, num_different={1: 1}, max_abs_diff={1: 1e-3},
            first_index={1: (2,)}, max_ulps={1: ulps},
        )  # fmt: skip

    assert 'max abs diff 0.001 (8389 ulps), first at index (2,)' in leaf(8389).describe()
    assert 'max abs diff 0.001, first at index (2,)' in leaf(ULPS_SAID).describe()
