"""nonfinite in one process (4 CPU devices): counts, first positions, dtypes, chunks, text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost._checks import _nonfinite


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ('a', 'b'))


def _put(v: np.ndarray, spec: P) -> jax.Array:
    return jax.device_put(v, NamedSharding(_mesh(), spec))


def test_counts_first_positions_and_devices_per_shard():
    v = np.arange(64, dtype=np.float32).reshape(8, 8)
    v[5, 6], v[5, 7], v[1, 1], v[7, 7] = np.nan, np.inf, -np.inf, np.nan
    report = multihost.nonfinite({'x': _put(v, P('a', 'b'))})
    got = [(s.device, s.index, s.nan, s.inf, s.first) for s in report.shards]
    assert got == [
        (0, ((0, 4), (0, 4)), 0, 1, (1, 1)),
        (3, ((4, 8), (4, 8)), 2, 1, (5, 6)),
    ]
    assert report.shards[1].local_device == 3 and not report.shards[1].host_local
    leaf = report["['x']"]
    assert (leaf.nan, leaf.inf, leaf.shards, leaf.first) == (2, 2, 2, (1, 1))
    assert leaf.layout == multihost.describe_layout(_put(v, P('a', 'b')))
    assert report.nan == 2 and report.inf == 2 and report.processes == (0,)


def test_a_clean_tree_is_ok_and_says_what_was_checked():
    tree = {'w': jnp.ones((4, 4)), 'n': np.zeros(3), 'i': jnp.arange(3), 'k': jax.random.key(1)}
    report = multihost.nonfinite(tree)
    assert report.ok and report.shards == () and report.leaves == ()
    assert report.checked == {'leaves': 2, 'shards': 2, 'elements': 19, 'skipped': 2}
    assert str(report) == (
        'no NaN or Inf: 2 leaves, 2 shards, 19 elements checked on 1 process '
        '(2 non-float leaves skipped)'
    )
    assert repr(report).startswith('NonfiniteReport(ok=True, shards=0')


@pytest.mark.parametrize(
    'dtype', [jnp.float16, jnp.bfloat16, jnp.float32, ml_dtypes.float8_e4m3fn, jnp.complex64]
)
def test_every_floating_dtype(dtype):
    v = np.ones(10, np.float32).astype(dtype)
    v[3] = np.nan
    if np.isinf(np.asarray(np.inf, np.float32).astype(dtype)):
        v[7] = np.inf
    for value in (jnp.asarray(v), v):  # on device, and a numpy value in host memory
        report = multihost.nonfinite(value)
        (s,) = report.shards
        assert s.nan == 1 and s.first == (3,)
        assert s.inf == (0 if dtype == ml_dtypes.float8_e4m3fn else 1)


def test_complex_counts_as_numpy_does():
    v = np.array([1, complex(np.inf, 0), complex(0, np.nan), complex(np.inf, np.nan)], np.complex64)
    (s,) = multihost.nonfinite(jnp.asarray(v)).shards
    assert (s.nan, s.inf) == (int(np.isnan(v).sum()), int(np.isinf(v).sum()))
    assert s.first == (1,)


def test_shards_are_checked_in_chunks(monkeypatch):
    """Counts and positions of shards longer than a chunk are combined exactly."""
    monkeypatch.setattr(_nonfinite, '_CHUNK', 7)
    monkeypatch.setattr(_nonfinite, '_NUMPY_CHUNK', 5)
    v = np.zeros((6, 5), np.float32)
    v[2, 3] = v[4, 0] = np.nan
    v[5, 4] = np.inf
    for value in (jnp.asarray(v), v):
        (s,) = multihost.nonfinite(value).shards
        assert (s.nan, s.inf, s.first) == (2, 1, (2, 3))


def test_scalars_empty_arrays_and_strings():
    report = multihost.nonfinite([float('nan'), 2, np.zeros((0, 3)), jnp.zeros(0), 'text'])
    (s,) = report.shards
    assert s.path == '[0]' and s.index == () and s.first == () and s.device is None
    assert report.checked['skipped'] == 2  # the int and the string
    assert multihost.nonfinite(jnp.float32(np.inf)).shards[0].first == ()


def test_tracers_are_refused():
    with pytest.raises(TypeError, match='tracer'):
        jax.jit(lambda x: multihost.nonfinite(x).ok)(jnp.ones(3))


def test_text_names_block_process_device_and_first():
    s = multihost.NonfiniteShard(
        path="['params']['w']",
        process=2,
        device=5,
        local_device=1,
        index=((0, 4), (8, 16)),
        nan=3,
        inf=0,
        first=(1, 9),
    )
    assert s.describe() == (
        "['params']['w'] block [0:4, 8:16] on process 2, device 5 (dev 1): "
        '3 NaN, 0 Inf, first at (1, 9)'
    )
    local = multihost.NonfiniteShard(
        path='[0]',
        process=1,
        device=None,
        local_device=None,
        index=((0, 3),),
        nan=0,
        inf=1,
        first=(2,),
        host_local=True,
    )
    assert (
        local.describe()
        == '[0] (host-local) block [0:3] on process 1, host memory: 0 NaN, 1 Inf, first at (2,)'
    )
    report = multihost.NonfiniteReport(
        shards=(s, local),
        leaves=(),
        checked={'leaves': 2, 'shards': 16, 'elements': 1000, 'skipped': 0},
        num_processes=4,
        truncated={2: 10},
    )
    text = report.format(max_shards=1)
    assert text.splitlines()[0].startswith('NaN/Inf in 12 shards (10 not listed)')
    assert 'on processes 1-2: 3 NaN, 1 Inf' in text
    assert '... 1 more shard(s) in .shards' in text
    assert 'process 2 found 10 more offending shard(s), not listed' in text
    assert not report.ok


def test_the_screen_is_one_pass_without_compares():
    """The fast screen is a plain sum of x * 0 (NaN exactly when some element is not finite)."""
    for v in ([1.0, 2.0], [1.0, np.inf], [-np.inf], [np.nan, 0.0], [3e38, 3e38]):
        x = jnp.asarray(v, jnp.float32)
        assert bool(jnp.isnan(_nonfinite._screen(x))) == (not np.isfinite(v).all())
    hlo = _nonfinite._screen.lower(jnp.ones(8)).as_text()
    assert 'compare' not in hlo


@pytest.mark.parametrize('bad_rows', [1, 3, 40, 256])
def test_large_shards_count_only_their_non_finite_rows(monkeypatch, bad_rows):
    """A large offending shard is screened per row; few bad rows: only those are counted."""
    monkeypatch.setattr(_nonfinite, '_SMALL_SHARD', 16)
    monkeypatch.setattr(_nonfinite, '_ROW_WIDTHS', (8,))
    calls = []
    row_details = _nonfinite._row_details
    monkeypatch.setattr(
        _nonfinite, '_row_details', lambda *a: calls.append(a[2].shape) or row_details(*a)
    )
    rng = np.random.default_rng(bad_rows)
    v = rng.standard_normal((64, 32)).astype(np.float32)  # 256 rows of 8 elements
    flat = v.reshape(-1)
    rows = np.sort(rng.choice(256, bad_rows, replace=False))
    flat[rows * 8 + 5] = np.nan
    flat[rows[-1] * 8 + 2] = np.inf
    flat[rows[0] * 8 + 7] = -np.inf
    (s,) = multihost.nonfinite(jnp.asarray(v)).shards
    want_first = np.unravel_index(np.flatnonzero(~np.isfinite(v))[0], v.shape)
    assert (s.nan, s.inf) == (int(np.isnan(v).sum()), int(np.isinf(v).sum()))
    assert s.first == tuple(int(i) for i in want_first)
    assert bool(calls) == (bad_rows <= 32)  # more than 1/8 of the rows: the whole shard
    if calls:
        assert calls[0] == (max(8, 1 << (bad_rows - 1).bit_length()),)


def test_what_a_host_sends_stays_bounded_at_any_host_count():
    """A clean host sends its counts only; offending records shrink per host beyond 64 hosts."""
    import json

    per = _nonfinite.records_per_host
    assert [per(n) for n in (1, 4, 64, 65, 1000, 100_000)] == [64, 64, 64, 63, 4, 1]
    clean = np.ones((4, 4), np.float32)
    leaves, pieces, _, skipped = _nonfinite._classify({'w': clean}, True)
    payload = _nonfinite._payload(leaves, pieces, _nonfinite._check(pieces), skipped, 1000)
    assert payload == {'c': [1, 1, 16, 0]}
    assert len(json.dumps(payload, separators=(',', ':'))) < 40
    bad = np.full((100, 3), np.nan, np.float32)
    leaves, pieces, _, skipped = _nonfinite._classify([bad[i] for i in range(100)], True)
    found = _nonfinite._check(pieces)
    payload = _nonfinite._payload(leaves, pieces, found, skipped, 1000)
    assert len(payload['records']) == 4 and payload['more'] == 96
    assert len(payload['layouts']) == 1  # host-local layouts: 64 over all hosts
    report = _nonfinite._assemble({7: payload}, leaves, 1000, per(1000))
    assert report.truncated == {7: 96} and len(report.shards) == 4
    assert 'process 7 found 96 more offending shard(s), not listed (at most 4 per process' in str(
        report
    )


def test_a_64_mib_device_leaf_is_not_copied_to_the_host(monkeypatch):
    # One NaN in a 64 MiB leaf on one device: the exact first index, and what is
    # read back to the host (every jax.Array the module converts, spied) stays
    # a small fraction of the leaf (the screen, the row flags, three counts).
    n = 1 << 24  # float32: 64 MiB
    x = jax.device_put(jnp.zeros((n // 4096, 4096), jnp.float32), jax.devices()[0])
    x = x.at[2345, 678].set(jnp.nan)
    moved = []
    real = np.asarray

    def spy(a, *args, **kwargs):
        if isinstance(a, jax.Array):
            moved.append(int(a.nbytes))
        return real(a, *args, **kwargs)

    monkeypatch.setattr(_nonfinite.np, 'asarray', spy)
    report = multihost.nonfinite({'w': x})
    monkeypatch.undo()
    (s,) = report.shards
    assert (s.nan, s.inf, s.first, s.device) == (1, 0, (2345, 678), 0)
    assert moved and sum(moved) <= (64 << 20) // 512, moved


@pytest.mark.parametrize('kind', ['pinned_host', 'unpinned_host'])
def test_offloaded_leaves_are_read_in_host_memory(kind):
    """A leaf offloaded to host memory (``memory_kind`` pinned_host / unpinned_host, as host
    offloading of optimizer state makes) beside device leaves: no device program mixes
    the two memory spaces; counted like the device copy of the same values."""
    x = jnp.arange(100000, dtype=jnp.float32).at[5].set(jnp.nan).at[70].set(jnp.inf)
    device = jax.devices()[0]
    y = jax.device_put(x, jax.sharding.make_single_device_sharding(device, memory_kind=kind))
    assert y.sharding.memory_kind == kind
    report = multihost.nonfinite({'dev': x, 'off': y})
    for path in ("['dev']", "['off']"):
        leaf = report[path]
        assert (leaf.nan, leaf.inf, leaf.first) == (1, 1, (5,)), path
