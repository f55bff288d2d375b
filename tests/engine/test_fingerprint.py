"""Exactness of the leaf fingerprints (multihost/_checks/fingerprint/), single process.

Both definitions are per host: every host fingerprints what it holds, so one
process tests them. The kernel (forced with ``MULTIHOST_FINGERPRINT=device``
where it goes through the callers): every single flipped bit and every swap
of unequal elements must change the fingerprint (by construction, see the
module's docstring), and the numpy and XLA implementations must give the same
bytes. The host definition (XXH3-128 of the bytes, read in place): the same
cases, checked on whole leaves, numpy equal to CPU-device arrays, and no copy.
"""

from __future__ import annotations

import contextlib
import tracemalloc

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _helpers import env_var, rotating

import multihost
from multihost._checks import _treediff
from multihost._checks import fingerprint as F
from multihost._checks.fingerprint import batched, layout, pallas, planning, xla
from multihost._checks.fingerprint import host as fp_host

DTYPES = [
    np.float32, np.int32, np.uint32, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8,
    np.bool_, np.complex64, ml_dtypes.float8_e4m3fn,
]  # fmt: skip
# Sizes around the kernel's rows of 2^16 words (fast path + tail), and tiny ones.
SIZES = [1, 2, 3, 5, 7, 64, 1000, (1 << 16) + 3, (1 << 17) + 5, 3 * (1 << 18) + 1]


@pytest.fixture
def tpu():
    """The plan a TPU gets, on this machine's CPU devices (Pallas kernels in interpret mode)."""
    with F.configured(platform='tpu') as config:
        yield config


@pytest.fixture
def gpu():
    """The plan a GPU gets (small leaves packed on the device), on CPU devices."""
    with F.configured(platform='gpu') as config:
        yield config


def _fingerprint_mode(how: str | None) -> contextlib.AbstractContextManager[None]:
    return env_var(F.ENV, how)


def _random(rng: np.random.Generator, n: int, dt: type) -> np.ndarray:
    if np.dtype(dt) == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    raw = rng.integers(0, 256, n * np.dtype(dt).itemsize, dtype=np.uint8)
    return raw.view(dt)


@pytest.mark.parametrize('dt', DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_and_device_give_the_same_bytes(dt):
    """Every dtype, sizes across the 2^16-word rows, several shapes: the same 16 bytes."""
    rng = np.random.default_rng(1)
    arrays = [_random(rng, n, dt) for n in SIZES]
    arrays += [_random(rng, 60, dt).reshape(3, 4, 5), _random(rng, 1, dt).reshape(())]
    on_host = F.fingerprints(arrays)
    on_device = F.fingerprints([jnp.asarray(a) for a in arrays])
    assert on_host == on_device
    assert all(len(b) == 16 * F.lane_sets(dt) for b in on_host)
    # Different data of one size, different fingerprints (the size itself is in the row).
    distinct = {(a.size, a.tobytes()) for a in arrays}
    assert len({(a.size, b) for a, b in zip(arrays, on_host)}) == len(distinct)


@pytest.mark.parametrize('dt', DTYPES + [np.float64, np.int64], ids=lambda d: np.dtype(d).name)
def test_small_leaves_batched_equal_each_leaf_alone(dt):
    """Small leaves are fingerprinted together (`batched.numpy_many`: concatenated, zero-padded to
    whole words, halves by table): each equals its own `numpy_lanes` and `numpy_flags`,
    sizes that leave 1-3 bytes of a word over, constant leaves and NaNs among them."""
    rng = np.random.default_rng(7)
    arrays = [_random(rng, n, dt) for n in (1, 2, 3, 5, 7, 64, 1000, (1 << 16) + 3)]
    arrays += [np.zeros(9, dt), np.full(6, 1, dt), _random(rng, 60, dt).reshape(3, 4, 5)]
    if jnp.issubdtype(dt, jnp.inexact):
        arrays.append(np.array([0, np.nan, 1], np.float32).astype(dt))
    arrays += [_random(rng, 1 << 16, dt) for _ in range(40)]  # a run gathered in slices
    got = batched.numpy_many(arrays, True)
    for a, res in zip(arrays, got):
        n = F.lane_sets(a.dtype) * F.LANES
        with np.errstate(over='ignore'):
            assert (res[:n] == F.numpy_lanes(a).reshape(-1)).all(), (a.dtype, a.shape)
        assert tuple(bool(b) for b in res[n:]) == F.numpy_flags(a), (a.dtype, a.shape)


def test_blocks_add_up_to_the_leaf_on_host_and_device():
    """A leaf's blocks (rows, columns, with their offsets) sum to the leaf's lanes."""
    a = np.random.default_rng(2).standard_normal((300, 1000)).astype(np.float32)
    whole = F.numpy_lanes(a)
    rows = F.numpy_lanes(a[:100], (0, 0), a.shape) + F.numpy_lanes(a[100:], (100, 0), a.shape)
    cols = [(a[:, :400], (0, 0), a.shape), (a[:, 400:], (0, 400), a.shape)]
    assert (rows == whole).all()
    assert (F.numpy_lanes(*cols[0]) + F.numpy_lanes(*cols[1]) == whole).all()
    dev = F.device_lanes([(jnp.asarray(x), o, s) for x, o, s in cols])
    assert (dev[0] + dev[1] == whole).all()


def _element_lanes(x: np.ndarray, e: int, n: int) -> np.ndarray:
    """The lanes one element adds at element index ``e`` of a flat leaf of ``n`` elements."""
    return F.numpy_lanes(x.reshape(1), (e,), (n,))


@pytest.mark.parametrize('dt', DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_single_bit_flip_changes_the_fingerprint(dt):
    """1,000+ random flips per dtype (>= 10,000 in all) in leaves of 1 element to 64 MiB.

    A flip changes one element; the fingerprint changes iff that element's
    lanes at its index change (the lanes are sums), checked at random
    indices over leaves up to 64 MiB, and, for a few flips, on whole leaves.
    """
    rng = np.random.default_rng(3)
    size = np.dtype(dt).itemsize
    checked = 0
    for n_bytes in (size, 4, 1 << 10, 1 << 20, 64 << 20):
        n = max(1, n_bytes // size)
        for _ in range(220):
            e = int(rng.integers(0, n))
            old = _random(rng, 1, dt)
            new = old.copy()
            if np.dtype(dt) == np.bool_:
                new[0] = not old[0]
            else:
                new.view(np.uint8)[int(rng.integers(0, size))] ^= np.uint8(
                    1 << int(rng.integers(0, 8))
                )
            assert (_element_lanes(old, e, n) != _element_lanes(new, e, n)).any(), (n, e)
            checked += 1
    assert checked >= 1000
    # Whole leaves, on host and device: 1 element, and a few flips in 64 KiB.
    a = _random(rng, max(1, (64 << 10) // size), dt)
    base = F.fingerprints([a])[0]
    for _ in range(5):
        b = a.copy()
        if np.dtype(dt) == np.bool_:
            i = int(rng.integers(0, b.size))
            b[i] = not b[i]
        else:
            b.view(np.uint8)[int(rng.integers(0, b.nbytes))] ^= np.uint8(
                1 << int(rng.integers(0, 8))
            )
        assert F.fingerprints([b])[0] != base
        assert F.fingerprints([jnp.asarray(b)])[0] != base


def test_flips_in_a_64_mib_device_leaf():
    """A 64 MiB device leaf: a flip anywhere (first, last, random words) is seen on device."""
    n = (64 << 20) // 4
    a = jnp.zeros((n,), jnp.uint32)
    base = F.fingerprints([a])[0]
    assert base == F.fingerprints([np.zeros(n, np.uint32)])[0]
    rng = np.random.default_rng(4)
    for i in [0, n - 1, 1 << 16, *rng.integers(0, n, 3)]:
        bit = jnp.uint32(1 << int(rng.integers(0, 32)))
        assert F.fingerprints([a.at[int(i)].set(bit)])[0] != base, i


@pytest.mark.parametrize('dt', DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_swap_of_unequal_elements_changes_the_fingerprint(dt):
    """Swaps at random distances, neighbours, the same word, and distances of m * 2^16 words."""
    rng = np.random.default_rng(5)
    size = np.dtype(dt).itemsize
    per_word = {1: 4, 2: 2}.get(size, 1)
    n = (64 << 20) // size
    pairs = [(0, 1), (1, 2), (0, 2), (0, 3), (2, 3), (0, per_word), (0, per_word * (1 << 16))]
    pairs += [(0, per_word * (1 << 16) * 255), (5, 5 + per_word * (3 << 16))]
    pairs += [tuple(sorted(rng.choice(n, 2, replace=False))) for _ in range(300)]
    for e, f in [(e, f) for e, f in pairs if f < n]:
        x, y = _random(rng, 1, dt), _random(rng, 1, dt)
        while x.view(np.uint8).tobytes() == y.view(np.uint8).tobytes():
            y = _random(rng, 1, dt)
        before = _element_lanes(x, e, n) + _element_lanes(y, f, n)
        after = _element_lanes(y, e, n) + _element_lanes(x, f, n)
        assert (before != after).any(), (e, f)
    a = _random(rng, 4096, dt)
    for e, f in [(0, 1), (1, 2), (0, 4095), (17, 1000)]:
        b = a.copy()
        b[[e, f]] = b[[f, e]]
        if b.view(np.uint8).tobytes() != a.view(np.uint8).tobytes():
            assert F.fingerprints([jnp.asarray(b)])[0] != F.fingerprints([a])[0]


def test_signed_zeros_nan_payloads_dtype_and_shape():
    """-0.0 vs 0.0 and NaN payloads differ; another dtype or shape of the same bytes: the row."""
    zeros = np.array([0.0, 1.0], np.float32)
    neg = np.array([-0.0, 1.0], np.float32)
    nan1 = np.array([np.nan], np.float32)
    nan2 = nan1.copy()
    nan2.view(np.uint32)[0] |= 1
    for a, b in [(zeros, neg), (nan1, nan2)]:
        assert F.fingerprints([a])[0] != F.fingerprints([b])[0]
        assert F.fingerprints([jnp.asarray(a)])[0] != F.fingerprints([jnp.asarray(b)])[0]
    assert F.fingerprints([jnp.asarray(nan2)]) == F.fingerprints([nan2])  # payload kept on device
    x = np.arange(12, dtype=np.float32)
    variants = [
        x,
        x.reshape(3, 4),
        x.view(np.int32),
        x.view(np.uint8),
        jnp.asarray(x.reshape(4, 3)),
    ]
    for how, same in [('device', True), ('host', False)]:
        with _fingerprint_mode(how):
            _, rows = _treediff._fingerprint([((), v) for v in variants])
        values = [v for _, v in rows]
        assert len(set(values)) == len(values)  # shape and dtype are in the row, beside the bytes
        # The kernel: the same bytes, the same digest; XXH3 hashes shape and dtype too.
        assert len({v.split('|')[2] for v in values[:3]}) == (1 if same else 3)


def test_a_1000_leaf_tree_gives_numpy_digests_every_call():
    """1,000 device leaves of many shapes: the same fingerprints on every call, numpy's.
    (What they compile is counted in `test_first_fingerprints_compile_a_few_programs`; a
    timing here raced on a busy machine once the first call stopped compiling.)"""
    shapes = [(i % 50 + 1, i % 7 + 1) for i in range(1000)]
    leaves = [jax.device_put(np.full(s, i, np.float32)) for i, s in enumerate(shapes)]
    first = F.fingerprints(leaves)
    assert first == F.fingerprints(leaves) == F.fingerprints([np.asarray(x) for x in leaves])


@pytest.mark.parametrize('platform', ['', 'tpu'])
def test_a_tree_planned_again_is_bound_to_its_new_arrays(platform):
    """A tree of the same dtypes, shapes and shardings as one planned before gets that plan
    again (`planning._Template`), bound to its own arrays (the shards of a sharded leaf
    included): new values give new fingerprints, numpy's; the kept plan holds no array."""
    import gc
    import weakref

    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ('d',))

    def tree(seed):
        rng = np.random.default_rng(seed)
        narrow = _random(rng, 8 * 16384, ml_dtypes.bfloat16).reshape(8, 16384)
        narrow[np.isnan(narrow)] = 0.5  # interpret mode past a tile: the test above says why
        return [
            jax.device_put(
                _random(rng, 4 * 70000, np.float32).reshape(4, 70000),
                NamedSharding(mesh, PartitionSpec('d')),
            ),
            jax.device_put(narrow),
            jax.device_put(_random(rng, 300, np.int32)),
            7,
        ]

    with F.configured(platform=platform):
        a, b = tree(1), tree(2)
        first = F.fingerprints(a)
        pa, pb = planning.plan(a), planning.plan(b)
        assert pa.programs is pb.programs and pa.routes is pb.routes  # one plan, kept
        held = {id(s.data) for x in b[:3] for s in x.addressable_shards} | {id(x) for x in b}
        assert all(id(blk.array) in held for blk in pb.blocks if isinstance(blk.array, jax.Array))
        again = F.fingerprints(b)
        assert again == F.fingerprints([np.asarray(x) for x in b])
        assert first == F.fingerprints([np.asarray(x) for x in a])
        assert all(x != y for x, y in zip(first[:3], again[:3]))
        gone = weakref.ref(a[1])
        del a, pa
        gc.collect()
        assert gone() is None


def test_sub_byte_dtypes_are_fingerprinted_on_the_host_alike():
    """int4 / uint4 / float4 device leaves: the numpy definition, the same bytes."""
    for dt in (jnp.int4, jnp.uint4, ml_dtypes.float4_e2m1fn):
        a = np.arange(-3, 5).astype(dt)
        assert not F.on_device(dt)
        assert F.fingerprints([jnp.asarray(a)]) == F.fingerprints([a])


def test_unsupported_dtypes_raise_one_line():
    with pytest.raises(TypeError, match='no fingerprint defined for dtype'):
        F.numpy_lanes(np.array(['a']))
    assert not F.supported(np.dtype(object)) and F.supported(jax.numpy.bfloat16)


# -- the host definition (XXH3-128) and the choice of definition -----------------


def _flip(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    b = a.copy()
    if a.dtype == np.bool_:
        i = int(rng.integers(0, b.size))
        b.reshape(-1)[i] = not b.reshape(-1)[i]
    else:
        b.reshape(-1).view(np.uint8)[int(rng.integers(0, b.nbytes))] ^= np.uint8(
            1 << int(rng.integers(0, 8))
        )
    return b


HOST_DTYPES = [*DTYPES, np.complex128, np.float64, np.int64]


@pytest.mark.parametrize('dt', HOST_DTYPES, ids=lambda d: np.dtype(d).name)
def test_host_definition_sees_flips_and_swaps_and_equals_on_cpu_devices(dt):
    """XXH3: 200 single-bit flips per dtype in leaves of 1 element to 64 MiB, swaps; numpy = CPU.

    No construction proof here (a random collision is ~2^-128): the flips and
    swaps are tried on whole leaves, on numpy and on the same values on a CPU
    device (read in place), which must give the same digest.
    """
    rng = np.random.default_rng(7)
    size = np.dtype(dt).itemsize
    for n_bytes in (size, 1 << 10, 1 << 20, 64 << 20):
        a = _random(rng, max(1, n_bytes // size), dt)
        base = F.host_digest(a)
        if jax.dtypes.canonicalize_dtype(dt) == np.dtype(dt):  # x64 dtypes: numpy only
            x = jax.device_put(a)
            assert F.host_digest(x) == base
            assert F.digests([a, x]) == ['x' + base.hex()] * 2  # auto: both in host memory
        flips = 20 if n_bytes >= (64 << 20) else 60
        seen = {base}
        for _ in range(flips):
            b = _flip(rng, a)
            d = F.host_digest(b)
            assert d != base
            seen.add(d)
        assert len(seen) > 1
    a = _random(rng, 4096, dt)
    for e, f in [(0, 1), (1, 2), (0, 4095), (17, 1000)]:
        b = a.copy()
        b[[e, f]] = b[[f, e]]
        if b.tobytes() != a.tobytes():
            assert F.host_digest(b) != F.host_digest(a)
            if jax.dtypes.canonicalize_dtype(dt) == np.dtype(dt):
                assert F.host_digest(jax.device_put(b)) != F.host_digest(a)


def test_host_definition_zeros_nans_shape_dtype_and_byte_order():
    """-0.0 vs 0.0 and NaN payloads differ; shape and dtype are hashed; big-endian = its values."""
    zeros, neg = np.array([0.0, 1.0], np.float32), np.array([-0.0, 1.0], np.float32)
    nan1 = np.array([np.nan], np.float32)
    nan2 = nan1.copy()
    nan2.view(np.uint32)[0] |= 1
    for a, b in [(zeros, neg), (nan1, nan2)]:
        assert F.host_digest(a) != F.host_digest(b)
        assert F.host_digest(jax.device_put(a)) != F.host_digest(jax.device_put(b))
    x = np.arange(12, dtype=np.float32)
    assert len({F.host_digest(v) for v in (x, x.reshape(3, 4), x.view(np.int32))}) == 3
    assert F.host_digest(x.astype('>f4')) == F.host_digest(x)
    assert F.host_digest(x.reshape(3, 4).T) == F.host_digest(
        np.ascontiguousarray(x.reshape(3, 4).T)
    )
    bf = np.arange(8).astype(ml_dtypes.bfloat16)
    assert F.host_digest(bf) != F.host_digest(bf.view(np.float16))  # same bytes, other dtype


def test_sharded_cpu_arrays_hash_their_c_order_bytes():
    """Sharded, column-sharded and replicated arrays on local CPU devices: the numpy digest."""
    a = np.random.default_rng(8).standard_normal((64, 48)).astype(np.float32)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ('d',))
    P = jax.sharding.PartitionSpec
    for spec in (P('d'), P(None, 'd'), P()):
        y = jax.device_put(a, jax.sharding.NamedSharding(mesh, spec))
        assert F.host_digest(y) == F.host_digest(a), spec
    rows = jax.device_put(a, jax.sharding.NamedSharding(mesh, P('d')))
    parts = fp_host._host_parts(rows)  # read in place: one view per device
    pointers = sorted(s.data.unsafe_buffer_pointer() for s in rows.addressable_shards)
    assert sorted(p.ctypes.data for p in parts) == pointers


def test_zero_copy_views_do_not_copy():
    """A 256 MiB tree of CPU-device arrays: the view shares the buffer; the peak stays tiny."""
    tree = [jnp.full((4 << 20,), float(i), jnp.float32) for i in range(16)]
    jax.block_until_ready(tree)
    for x in tree[:2]:
        assert F.host_view(x).ctypes.data == x.unsafe_buffer_pointer()
    tracemalloc.start()
    try:
        prints = F.digests(tree)
        _treediff._fingerprint([((), x) for x in tree])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert all(F.is_host_digest(d) for d in prints)
    assert peak < (1 << 20), f'{peak:,} B traced while hashing 256 MiB in place'


def test_the_switch_forces_a_definition_and_rejects_others(monkeypatch):
    """MULTIHOST_FINGERPRINT: device = the kernel for numpy and device leaves, host = XXH3."""
    a = np.arange(1000, dtype=np.float32)
    x = jnp.asarray(a)
    kernel = F.fingerprints([a])[0].hex()
    for how, want in [('device', kernel), ('host', 'x' + F.host_digest(a).hex())]:
        monkeypatch.setenv(F.ENV, f' {how.upper()} ')
        assert F.mode() == how
        assert F.digests([a, x]) == [want, want]
        _, rows = _treediff._fingerprint([((), a), ((), x)])
        assert rows[0][1] == rows[1][1] and want in rows[0][1]
    monkeypatch.setenv(F.ENV, '')
    assert F.mode() == 'auto'
    monkeypatch.setenv(F.ENV, 'gpu')
    for call in (F.mode, lambda: multihost.assert_equal({'a': a}), lambda: F.digests([a])):
        with pytest.raises(ValueError, match=r"MULTIHOST_FINGERPRINT='gpu' is not one of") as e:
            call()
        assert '\n' not in str(e.value)
    with pytest.raises(ValueError, match='MULTIHOST_FINGERPRINT'):
        multihost.tree_diff({'a': a})


def test_watched_static_arrays_are_digested_by_value_in_place():
    """A static numpy argument of a watched launch: digest of its values, like-for-like."""
    from multihost import _structure

    a = np.arange(12, dtype=np.float32)
    assert _structure.static(a) == _structure.static(a.copy())
    assert _structure.static(a) != _structure.static(_flip(np.random.default_rng(9), a))
    assert _structure.static(a.reshape(3, 4).T) == _structure.static(
        np.ascontiguousarray(a.reshape(3, 4).T)
    )


ISSUE_47_DTYPES = [
    np.float32, ml_dtypes.bfloat16, np.float16, np.int8, np.uint8, np.bool_, np.int32,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.complex64,
]  # fmt: skip


# float32, bfloat16 and int8 on every landing (a 4-, a 2- and a 1-byte lane); the rest on
# the release rotation (tests/_helpers.py `rotating`).
@pytest.mark.parametrize(
    'dt',
    rotating(ISSUE_47_DTYPES, [np.float32, ml_dtypes.bfloat16, np.int8]),
    ids=lambda d: np.dtype(d).name,
)
def test_every_path_of_the_device_kernel_equals_numpy_with_its_flags(dt):
    """Small leaves (host copy), large ones (one program), several of one shape (one
    program, padded to a power of two), blocks at offsets: numpy's bytes; the NaN/Inf and
    constant flags of the same pass equal numpy's (random bytes: NaN payloads, subnormals)."""
    rng = np.random.default_rng(47)
    shapes = [(3,), (37, 1001), (3, 5, 70001), (3, 5, 70001), (3, 5, 70001), ((1 << 18) + 7,)]
    arrays = [_random(rng, int(np.prod(s)), dt).reshape(s) for s in shapes]
    arrays.append(np.zeros((300, 700), dt))  # constant
    if jnp.issubdtype(dt, jnp.inexact):
        nan = np.zeros((300, 700), np.float32)
        nan[7, 9] = np.nan
        arrays.append(nan.astype(dt))
    dev = [jax.device_put(a) for a in arrays]
    assert F.fingerprints(dev) == F.fingerprints(arrays)
    got = F.digests_with_flags(dev, 'device')
    assert [g[1:] for g in got] == [F.numpy_flags(a) for a in arrays]
    assert [g[0] for g in got] == F.kernel_digests(arrays)
    leaf = np.concatenate([np.concatenate([arrays[-1], arrays[-1][::-1]], 1)] * 2, 0)
    quarters = [(jnp.asarray(leaf[r : r + 300, c : c + 700]), (r, c), leaf.shape)
                for r in (0, 300) for c in (0, 700)]  # fmt: skip
    lanes = F.device_lanes(quarters)
    with np.errstate(over='ignore'):
        assert (sum(lanes[1:], lanes[0]) == F.numpy_lanes(leaf)).all()


def test_flags_say_nan_inf_and_constant_per_leaf():
    """The flags: NaN or Inf anywhere (floats only), constant = every element's bytes alike."""
    leaves = [np.ones((400, 300), np.float32), np.arange(120000, dtype=np.float32),
              np.full((5,), np.inf, np.float16), np.full((200, 500), 7, np.int32),
              np.array([0.0, -0.0], np.float32)]  # fmt: skip
    leaves[1][99999] = np.nan
    want = [(False, True), (True, False), (True, True), (False, True), (False, False)]
    for how in ('device', 'host'):
        got = F.digests_with_flags([jnp.asarray(a) for a in leaves], how)
        assert [g[1:] for g in got] == want, how


def test_first_fingerprints_compile_a_few_programs():
    """A 1,000-shape tree of small leaves compiles nothing; 40 large leaves of 3 shapes and 2
    dtypes compile one program per shape, dtype and power-of-two count (here <= 8); the
    second call compiles nothing."""
    counted = []

    def seen(event: str, *_: object, **__: object) -> None:
        if event == '/jax/core/compile/backend_compile_duration':
            counted.append(event)

    jax.monitoring.register_event_duration_secs_listener(seen)
    small = [jax.device_put(np.full((i % 100 + 3, i // 100 + 2), i, np.float32))
             for i in range(1000)]  # fmt: skip
    shapes = [(300, 257), (70001,), (3, 40000)]
    big = [jax.device_put(np.full(shapes[i % 3], i, np.float32 if i % 2 else np.int8))
           for i in range(40)]  # fmt: skip
    jax.block_until_ready((small, big))
    with _fingerprint_mode('device'):
        n0 = len(counted)
        F.digests(small)
        assert len(counted) == n0
        F.digests(big)
        first = len(counted) - n0
        F.digests(big)
        assert len(counted) - n0 == first
    assert 1 <= first <= 8


class _Chip:
    """A device as `bits_lost_on_chip` reads one: its platform only (no TPU runs here)."""

    def __init__(self, platform: str) -> None:
        self.platform = platform


class _OnChip:
    """An array's dtype, shape and the devices its sharding names, as on a TPU."""

    def __init__(self, dtype: object, platform: str, shape=(512, 256), block=None) -> None:
        self.dtype = np.dtype(dtype)
        self.shape, self.size = shape, int(np.prod(shape))
        sharding = {
            'device_set': {_Chip(platform)},
            'shard_shape': staticmethod(lambda _s: block or shape),
        }
        self.sharding = type('S', (), sharding)()


@pytest.mark.parametrize('dt', [ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn,
                                ml_dtypes.float8_e5m2])  # fmt: skip
def test_narrow_floats_on_a_tpu_take_the_pallas_kernel_or_host_copies(dt):
    """A TPU v5e changed the bits of random bfloat16, float16 and float8 values in XLA
    programs, and a Pallas kernel kept those of bfloat16 and float8 (measured,
    `bench/tpu_bits.py`, docs/API.md §4.2): on a TPU, float16 leaves and 1-D blocks take host
    copies, 2-D blocks of the others the kernel, small whole leaves one host copy; wider
    floats, integers, and every CPU leaf stay with the XLA program."""
    pallas = np.dtype(dt) != np.float16
    reshaped = np.dtype(dt).name in layout.ROWS_DTYPES  # a whole vector, read as rows
    assert F.bits_lost_on_chip(_OnChip(dt, 'tpu')) is not pallas  # type: ignore[arg-type]
    one_d = _OnChip(dt, 'tpu', (1 << 20,))
    assert F.bits_lost_on_chip(one_d) is not reshaped  # type: ignore[arg-type]
    sharded = _OnChip(dt, 'tpu', (512, 256), (512, 1))  # blocks of one column: no kernel
    assert F.bits_lost_on_chip(sharded)  # type: ignore[arg-type]
    assert F.bits_lost_on_chip(_OnChip(dt, 'tpu', (20000, 5)))  # type: ignore[arg-type]
    assert not F.bits_lost_on_chip(_OnChip(dt, 'tpu', (7,)))  # type: ignore[arg-type]
    assert not F.bits_lost_on_chip(_OnChip(dt, 'cpu'))  # type: ignore[arg-type]
    for wide in (np.float32, np.complex64, np.int8, np.uint16, np.int32, np.bool_):
        assert not F.bits_lost_on_chip(_OnChip(wide, 'tpu')), wide  # type: ignore[arg-type]
    x = jnp.asarray(np.arange(12, dtype=np.float32).astype(dt))
    assert not F.bits_lost_on_chip(x)  # this machine's CPU device reads every bit
    assert F.fingerprints([x]) == F.fingerprints([np.asarray(x)])


def _random_bits(dt: object, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random raw bits of a narrow float: NaN payloads, negative NaN, subnormals."""
    u = np.dtype(f'u{np.dtype(dt).itemsize}')
    raw = np.random.default_rng(seed).integers(0, np.iinfo(u).max + 1, shape, dtype=u)
    return raw.view(dt)


# bfloat16 on every landing (the narrow float a chip's kernel reads most); the others on the
# release rotation.
@pytest.mark.parametrize('dt', rotating([ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                ml_dtypes.float8_e5m2, np.float32, np.int32],
                               [ml_dtypes.bfloat16]))  # fmt: skip
@pytest.mark.parametrize(
    'shape', [(3, 5), (100, 3000), (20, 20000), (40, 1001), (3, 32, 300), (512, 8, 64)]
)
def test_the_pallas_kernel_gives_the_numpy_definition_on_raw_bits(dt, shape, tpu):
    """The kernel that reads narrow floats on a TPU (`pallas`, here in Pallas' interpret
    mode): the same lanes and flags as numpy's definition (and the lanes alone, without the
    flags), for whole leaves in one tile and in tiles with ragged edges, rows of an odd
    length, rows passing a multiple of 2^17 elements, and blocks at odd offsets of a leaf
    (3-D: the grid walks the leading axis, or whole leaves read with it merged; (512, 8,
    64) in C order is not the kernel's: stored transposed on a TPU, the next test), on
    random raw bits with NaN payloads and
    subnormals, and constant blocks; 32-bit words (float32, int32) alike."""
    a = _random_bits(dt, shape)
    if len(shape) > 2 or pallas._tiles(shape, a.dtype.itemsize) != shape[-2:]:
        # Interpret mode's own slicing of a tile past the first rewrites NaN payloads on
        # XLA:CPU (seen here): their bits are checked on one tile, and on the TPU itself
        # (bench/tpu_fingerprints.py's exactness section, every tile).
        a[np.isnan(a)] = 0.5
    half = shape[-1] // 2 | 1  # an odd offset: the first element is a word's high half
    blocks = [(jnp.asarray(a), (0,) * len(shape), shape)]
    blocks.append((jnp.asarray(a[..., half:]), (0,) * (len(shape) - 1) + (half,), shape))
    const = np.full(shape, a.reshape(-1)[5], dtype=dt)
    blocks.append((jnp.asarray(const), (0,) * len(shape), shape))
    got = F.device_results(blocks, flags=True)
    for (x, offs, full), res in zip(blocks, got):
        host = np.asarray(x)
        want = F.numpy_lanes(host, offs, full).reshape(-1)
        assert res[:4].tolist() == want.tolist()
        assert (bool(res[4]), bool(res[5])) == F.numpy_flags(host)
    for (x, offs, full), res in zip(blocks, F.device_results(blocks)):  # lanes alone
        assert res.tolist() == F.numpy_lanes(np.asarray(x), offs, full).reshape(-1).tolist()


#: (dtype, leaf shape, its stored order on a TPU v5e (XLA's default layout there, asked of
#: libtpu: `tests/engine/test_tpu_reshapes.py`), block (start, stop) per axis or None for
#: the whole leaf, what the kernel then reads).
STORED = [
    (ml_dtypes.bfloat16, (200, 16, 96), (1, 2, 0), None, (1536, 200)),  # (768, 8, 96)'s kind
    (ml_dtypes.bfloat16, (1000, 5), (1, 0), None, (5, 1000)),
    (ml_dtypes.bfloat16, (100, 200), (1, 0), None, None),  # stored (200, 100): host copies
    (ml_dtypes.float8_e5m2, (300, 7), (1, 0), None, (7, 300)),
    (ml_dtypes.float8_e4m3fn, (1000, 7), (1, 0), ((300, 1000), (0, 7)), (7, 700)),
    (np.float32, (260, 16, 96), (1, 2, 0), None, (1536, 260)),
    (np.int32, (2000, 3), (1, 0), ((1, 2000), (0, 3)), (3, 1999)),
    (ml_dtypes.bfloat16, (300, 16, 8), (1, 0, 2), ((0, 200), (0, 16), (0, 8)), None),
    (ml_dtypes.bfloat16, (16, 300, 160), (0, 2, 1), ((2, 6), (0, 300), (0, 160)), (4, 160, 300)),
    (ml_dtypes.bfloat16, (2176,), (0,), None, (17, 128)),  # a vector as rows of 128
    (ml_dtypes.bfloat16, (4352,), (0,), ((0, 2176),), None),  # a vector's block: host copies
]


@pytest.mark.parametrize(
    'dt,shape,order,block,read', STORED, ids=lambda v: getattr(v, '__name__', None)
)
def test_the_pallas_kernel_reads_blocks_in_their_stored_order(
    dt, shape, order, block, read
):  # fmt: skip
    """A TPU stores an array whose last axis is small with another axis minor; read in its
    logical shape, XLA relays it out for the kernel (which rewrote bfloat16 NaN payloads on
    the chip), so the kernel reads it in its stored order (`layout.stored_order`: a
    bitcast there; here a CPU array in C order, given that order, is transposed): each
    element at its index in the leaf's C order, so numpy's lanes and flags; whole leaves
    (leading axes merged where that keeps the index linear) and blocks at an offset."""
    a = _random_bits(dt, shape)
    if np.dtype(dt).itemsize < 4:
        a[np.isnan(a)] = 0.5  # interpret mode's slicing of tiles on XLA:CPU (see above)
    cut = tuple(slice(*b) for b in block) if block else ()
    host = a[cut] if block else a
    start = tuple(b[0] for b in block) if block else (0,) * len(shape)
    got = layout.read_layout(dt, host.shape, block is None, order)
    assert (got and got.shape) == read, got
    blocks = [(jnp.asarray(host), start, shape)]
    const = np.full(host.shape, host.reshape(-1)[3], dtype=dt)
    blocks.append((jnp.asarray(const), start, shape))
    with F.configured(platform='tpu', stored_order=lambda x: order):
        results = F.device_results(blocks, flags=True)
    for (x, offs, full), res in zip(blocks, results):
        want = F.numpy_lanes(np.asarray(x), offs, full).reshape(-1)
        assert res[:4].tolist() == want.tolist()
        assert (bool(res[4]), bool(res[5])) == F.numpy_flags(np.asarray(x))


@pytest.mark.parametrize('kind', ['pinned_host', 'unpinned_host'])
def test_offloaded_leaves_are_read_in_host_memory(kind):
    """A leaf offloaded to host memory beside its device (``memory_kind`` pinned_host /
    unpinned_host): no device program takes it with device leaves; read as host memory,
    the same digests and flags as the device copy and numpy, under every definition."""
    x = jnp.arange(100000, dtype=jnp.float32).at[7].set(jnp.nan)
    y = jax.device_put(
        x, jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind=kind)
    )
    want = F.fingerprints([np.asarray(x)])
    assert F.fingerprints([x]) == F.fingerprints([y]) == F.fingerprints([x]) == want
    assert F.fingerprints([x, y]) == want * 2
    assert F.digests_with_flags([y], 'device') == F.digests_with_flags([x], 'device')
    assert F.digests_with_flags([y], 'device')[0][1:] == (True, False)
    for how in ('auto', 'host'):
        assert F.digests([y], how) == F.digests([x], how)


@pytest.mark.parametrize('dt', DTYPES, ids=lambda d: np.dtype(d).name)
def test_small_device_leaves_packed_into_one_buffer_give_numpy_bytes(dt):
    """Off a CPU, small leaves of one dtype are packed into one buffer on their device, one
    copy to the host (`xla.pack_concat`; a GPU's plan forced here): numpy's bytes and flags,
    leaves of many shapes (and a 0-d one, a constant one, NaNs), more of them than one
    program packs."""
    rng = np.random.default_rng(11)
    arrays = [_random(rng, n, dt).reshape(s) for n, s in
              [(1, ()), (3, (3,)), (5, (5,)), (60, (3, 4, 5)), (1000, (10, 100)),
               (7, (7,)), (2, (2, 1)), (64, (8, 8)), (9, (9,)), (33, (33,))]]  # fmt: skip
    arrays.append(np.zeros((4, 6), dt))
    if jnp.issubdtype(dt, jnp.inexact):
        arrays.append(np.array([1, np.nan, np.inf], np.float32).astype(dt))
    dev = [jax.device_put(a) for a in arrays]
    with F.configured(platform='gpu', max_pack=8):
        packed = F.plan(dev).packs
        if np.dtype(dt).name in F.CONFIG.pack_dtypes:
            assert sum(len(c.blocks) for c in packed) == len(dev)  # every leaf packed
        assert F.fingerprints(dev) == [F.to_bytes(F.numpy_lanes(a).reshape(-1)) for a in arrays]
        got = F.digests_with_flags(dev, 'device')
    assert [g[1:] for g in got] == [F.numpy_flags(a) for a in arrays]


@pytest.mark.parametrize('dt', [np.float32, np.int32, np.uint32], ids=lambda d: np.dtype(d).name)
def test_small_32_bit_leaves_are_summed_in_rows_on_the_device(dt, gpu):
    """Small 32-bit leaves are packed in rows of `ROW` words and summed on their device
    (`xla.pack_rows`): only the rows' sums come to the host. Leaves of one row, one word past
    it, the largest small leaf (``k`` up to 2^16 - 1), one element, constant, with NaN and
    Inf: numpy's bytes and flags."""
    rng = np.random.default_rng(5)
    sizes = [xla.ROW, xla.ROW + 1, F.SMALL, 1, 3 * xla.ROW - 1, 77]
    arrays = [_random(rng, n, dt) for n in sizes]
    arrays[3] = arrays[3].reshape(())
    arrays[4][:] = arrays[4][0]
    if dt == np.float32:
        arrays[5][[3, 70]] = [np.nan, -np.inf]
    dev = [jax.device_put(a) for a in arrays]
    assert [c.kind for c in F.plan(dev).packs] == ['rows']
    assert F.fingerprints(dev) == [F.to_bytes(F.numpy_lanes(a).reshape(-1)) for a in arrays]
    got = F.digests_with_flags([jax.device_put(a) for a in arrays], 'device')
    assert [g[1:] for g in got] == [F.numpy_flags(a) for a in arrays]
    if dt == np.float32:
        assert got[5][1:] == (True, False) and got[4][1:] == (False, True)


def test_small_bfloat16_vectors_are_packed_by_dma_keeping_every_bit(tpu):
    """bfloat16's small 1-D leaves whose sizes are whole tiles are packed by a DMA kernel
    (`pallas.dma_pack`, here in Pallas' interpret mode) into one buffer, one copy to the
    host: numpy's bytes and flags on raw bits (NaN payloads, subnormals); leaves of other
    sizes or of two axes, and a lone one, are copied one by one."""
    tile = pallas.DMA_TILE[2]
    shapes = [(tile,), (3 * tile,), (tile + 5,), (8, 2 * tile), (2 * tile,), (tile,)]
    arrays = [_random_bits(ml_dtypes.bfloat16, s, seed=i) for i, s in enumerate(shapes)]
    arrays[-1][:] = arrays[-1][0]  # constant
    assert np.isnan(arrays[0].astype(np.float32)).any()
    dev = [jax.device_put(a) for a in arrays]
    planned = F.plan(dev)
    assert [c.blocks for c in planned.packs] == [[0, 1, 4, 5]] and planned.copies == [2, 3]
    assert planned.packs[0].kind == 'dma' and planned.packs[0].interpret
    assert F.plan(dev[:1]).copies == [0]  # alone: nothing to pack it with
    assert F.fingerprints(dev) == [F.to_bytes(F.numpy_lanes(a).reshape(-1)) for a in arrays]
    got = F.digests_with_flags([jax.device_put(a) for a in arrays], 'device')
    assert [g[1:] for g in got] == [F.numpy_flags(a) for a in arrays]


def _one_subnormal_and_one_nan_payload_apart(a: np.ndarray, b: np.ndarray) -> None:
    """``b`` (bfloat16, two axes or more) made ``a`` again, then the two one subnormal and one
    NaN payload apart."""
    raw = b.view(np.uint16)
    raw[:] = a.view(np.uint16)
    raw[0, 0], a.view(np.uint16)[0, 0] = 0x0002, 0x0001  # subnormals
    raw[1, 1], a.view(np.uint16)[1, 1] = 0x7FC3, 0x7FC1  # NaN payloads


def _the_device_gives_numpys_bytes_and_flags(
    arrays: list[np.ndarray], dev: list
) -> tuple[list[bytes], list]:
    """Inside a planned platform: the device's fingerprints of ``dev`` (``arrays`` on the
    device) and its digests with flags of fresh copies equal numpy's definitions; returns the
    wanted fingerprints and the digests with flags."""
    want = [F.to_bytes(F.numpy_lanes(a).reshape(-1)) for a in arrays]
    assert F.fingerprints(dev) == want
    got = F.digests_with_flags([jax.device_put(a) for a in arrays], 'device')
    assert [g[1:] for g in got] == [F.numpy_flags(a) for a in arrays]
    return want, got


def test_small_bfloat16_leaves_of_two_axes_or_more_are_copied_one_by_one_exactly():
    """bfloat16's small leaves of two axes or more stored transposed, or alone of their shape,
    are not packed (a DMA stack of them in their stored order rewrote subnormals and NaN
    payloads on a v5e and on XLA:CPU at -O0; XLA relays them out before a kernel): each is
    copied to the host alone, with numpy's bytes and flags on raw bits (NaN payloads,
    subnormals, a constant leaf), also beside 1-D leaves that are packed; two leaves that
    differ in one subnormal or one NaN payload get different digests."""
    v5e = {(96, 8): (1, 0), (3, 5, 7): (1, 0, 2), (8, 96): (0, 1), (768, 3): (1, 0), (512,): (0,)}
    shapes = [(96, 8), (8, 96), (96, 8), (3, 5, 7), (768, 3), (768, 3), (512,), (512,)]
    arrays = [_random_bits(ml_dtypes.bfloat16, s, seed=i) for i, s in enumerate(shapes)]
    arrays[2][:] = arrays[2][0, 0]  # constant
    _one_subnormal_and_one_nan_payload_apart(arrays[4], arrays[5])
    assert np.isnan(arrays[0].astype(np.float32)).any()
    dev = [jax.device_put(a) for a in arrays]
    with F.configured(platform='tpu', stored_order=lambda x: v5e[tuple(x.shape)]):
        planned = F.plan(dev)
        assert [c.blocks for c in planned.packs] == [[6, 7]]
        assert sorted(planned.copies) == list(range(6))
        want, got = _the_device_gives_numpys_bytes_and_flags(arrays, dev)
    assert want[4] != want[5]
    assert got[2][1:] == (False, True) and got[4][0] != got[5][0]


def test_small_narrow_floats_of_one_shape_in_c_order_are_read_whole_in_vmem_exactly():
    """On a TPU, small leaves of bfloat16 and float8 of two axes or more stored in C order,
    two or more of one shape: one Pallas program per shape and dtype reads them into VMEM and
    widens their raw bits to int32 (`pallas.vmem_bits`); numpy's bytes and flags on raw bits
    (NaN payloads, subnormals, a constant leaf); two leaves one subnormal or one NaN payload
    apart get different digests. A leaf alone of its shape, or stored transposed, is copied."""
    v5e = {(8, 64): (0, 1), (2, 16, 64): (0, 1, 2), (96, 8): (1, 0), (8, 96): (0, 1)}
    dts = [ml_dtypes.bfloat16] * 4 + [ml_dtypes.float8_e4m3fn] * 2 + [ml_dtypes.bfloat16] * 4
    shapes = [(8, 64)] * 4 + [(8, 64)] * 2 + [(2, 16, 64)] * 2 + [(96, 8)] * 1 + [(8, 96)]
    arrays = [_random_bits(dt, s, seed=i) for i, (dt, s) in enumerate(zip(dts, shapes))]
    arrays[1][:] = arrays[1][0, 0]  # constant
    _one_subnormal_and_one_nan_payload_apart(arrays[2], arrays[3])
    dev = [jax.device_put(a) for a in arrays]
    with F.configured(platform='tpu', stored_order=lambda x: v5e[tuple(x.shape)]):
        planned = F.plan(dev)
        assert sorted((c.kind, c.blocks) for c in planned.packs) == [
            ('vmem', [0, 1, 2, 3]),
            ('vmem', [4, 5]),
            ('vmem', [6, 7]),
        ]
        assert sorted(planned.copies) == [8, 9]
        want, got = _the_device_gives_numpys_bytes_and_flags(arrays, dev)
    assert want[2] != want[3]
    assert got[1][1:] == (False, True) and got[2][0] != got[3][0]


def test_a_packing_program_that_does_not_compile_leaves_its_leaves_to_copies(monkeypatch, tpu):
    """A DMA packing program that fails to compile (a TPU whose Mosaic tiles 1-D buffers
    otherwise): its leaves are copied one by one, the same bytes; nothing raises."""

    @jax.jit
    def broken(xs: tuple[jax.Array, ...]) -> jax.Array:
        raise RuntimeError('Mosaic failed to compile TPU kernel (on purpose)')

    monkeypatch.setattr(pallas, 'dma_pack_interpret', broken)
    arrays = [_random_bits(ml_dtypes.bfloat16, (512,), seed=i) for i in range(3)]
    dev = [jax.device_put(a) for a in arrays]
    assert [c.blocks for c in F.plan(dev).packs] == [[0, 1, 2]]
    want = [F.to_bytes(F.numpy_lanes(a).reshape(-1)) for a in arrays]
    assert F.fingerprints(dev) == want
    assert F.fingerprints(dev) == want  # again: the failure is remembered, not retried


def test_a_host_copy_jax_keeps_is_seen_and_such_leaves_are_not_packed():
    """`has_host_copy` and `host_copy` (the adapter) see the host copy jax keeps on an array
    after a real copy (int4 on a CPU device is copied; float32 is a view), not a deleted
    array's; a packable leaf with such a copy is read from it, not packed again."""
    from multihost._jax_adapter import has_host_copy, host_copy

    x = jnp.ones((3, 5), jnp.int4)
    assert not has_host_copy(x) and host_copy(x) is None
    np.asarray(x)
    assert has_host_copy(x)
    assert host_copy(x) is np.asarray(x)  # the kept copy itself, read without a copy
    y = jnp.ones((3, 5), jnp.float32)
    np.asarray(y)
    assert not has_host_copy(y) and host_copy(y) is None  # a view of CPU memory: nothing kept
    gone = jnp.zeros((2,), jnp.int4)
    np.asarray(gone)
    gone.delete()
    assert host_copy(gone) is None  # a deleted array's copy is not read
    leaves = [jnp.ones((4,), jnp.int4), jnp.zeros((6,), jnp.int4), x]
    blocks = [planning.Block(v, (0,) * v.ndim, tuple(v.shape), i) for i, v in enumerate(leaves)]
    with F.configured(platform='gpu', pack_dtypes=F.CONFIG.pack_dtypes | {'int4'}):
        planned = planning.plan_blocks(blocks, False)
    assert [c.blocks for c in planned.packs] == [[0, 1]] and planned.copies == [2]


@pytest.mark.parametrize(
    'dt',
    [np.float32, ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
     np.float64, np.int16, np.complex64, np.dtype('>f4'), np.dtype('>f2')],
    ids=str,
)  # fmt: skip
def test_the_flags_read_from_raw_bits_equal_isfinite_and_byte_equality(dt):
    """`numpy_flags` reads NaN/Inf from raw bits in steps (`definition.nonfinite_bits`) and
    constancy from the largest and smallest raw value: on random bits, a finite copy, one
    non-finite element at the last place of a step, a constant leaf and one constant but for its
    last element (a NaN of another payload), both byte orders, it says what ``np.isfinite``
    of the values and equality of the elements' bytes say."""
    from multihost._checks.fingerprint.definition import FLAG_CHUNK

    n = 2 * FLAG_CHUNK + 3
    raw = _random_bits(np.dtype(dt).newbyteorder('='), (n,), 7).view(dt)
    narrow = (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
    floating = np.dtype(dt).kind in 'fc' or np.dtype(dt) in [np.dtype(d) for d in narrow]
    finite = raw.copy()
    with np.errstate(invalid='ignore'):
        if floating:
            finite[~np.isfinite(finite)] = 0
    late = finite.copy()
    if floating:
        late[FLAG_CHUNK - 1] = np.inf if np.dtype(dt).name != 'float8_e4m3fn' else np.nan
    constant = np.repeat(raw[:1], n)
    last = constant.copy()
    last.view(np.uint8)[-1] ^= 1  # its last element's bytes differ
    for a in (raw, finite, late, constant, last):
        with np.errstate(invalid='ignore'):
            bad = floating and not bool(np.isfinite(a.astype(np.complex128 if a.dtype.kind == 'c'
                                                              else np.float64)).all())  # fmt: skip
        rows = a.view(np.uint8).reshape(n, -1)
        assert F.numpy_flags(a) == (bad, bool((rows == rows[0]).all())), a[:4]
