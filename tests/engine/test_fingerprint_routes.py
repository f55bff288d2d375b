"""Every route the fingerprint plan can choose (`fingerprint.plan`), against the definition
(`fingerprint.definition`, numpy) on random raw bits: NaN payloads, subnormals, every byte
value, for every dtype a device reads, ragged and stored-transposed shapes, blocks at
offsets, small leaves alone and together. The platform is forced through the configuration
(`fingerprint.configured`): a CPU's routes, a GPU's (small leaves packed on the device) and
a TPU's (the Pallas kernels, here in Pallas' interpret mode; the DMA packing)."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from _helpers import rotating

from multihost._checks import fingerprint as F
from multihost._checks.fingerprint import layout, planning

DTYPES = [
    np.float32, ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
    np.int8, np.uint8, np.int32, np.bool_, np.complex64,
]  # fmt: skip
#: Stored orders a TPU gives these shapes (XLA's default layouts there:
#: tests/engine/test_tpu_reshapes.py).
TPU_ORDERS = {(1024, 96): (1, 0), (96, 8): (1, 0), (768, 3): (1, 0), (3, 5, 7): (1, 0, 2)}


def _raw(dt: object, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random raw bytes viewed as ``dt`` (bool: 0 or 1)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if np.dtype(dt) == np.bool_:
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    raw = rng.integers(0, 256, n * np.dtype(dt).itemsize, dtype=np.uint8)
    if np.dtype(dt).itemsize == 2:  # a subnormal and NaN payloads among them, for certain
        special = [0x01, 0x00, 0xC1, 0x7F, 0xC3, 0xFF][: raw.size]
        raw[: len(special)] = special
    return raw.view(dt).reshape(shape)


def _order(x: object) -> tuple[int, ...]:
    shape = tuple(x.shape)  # type: ignore[attr-defined]
    return TPU_ORDERS.get(shape, tuple(range(len(shape))))


def _want(arrays: list[np.ndarray]) -> list[tuple[str, bool, bool]]:
    return [(F.to_bytes(F.numpy_lanes(a).reshape(-1)).hex(), *F.numpy_flags(a)) for a in arrays]


# A CPU's and a TPU's plans on every landing (the machines the toolkit is measured on), a
# GPU's on the release rotation; float32, bfloat16 and bool on every landing (a word, a narrow
# float, a bit per byte), the others on the release rotation (tests/_helpers.py `rotating`).
@pytest.mark.parametrize('platform', rotating(['cpu', 'gpu', 'tpu'], ['cpu', 'tpu']))
@pytest.mark.parametrize(
    'dt',
    rotating(DTYPES, [np.float32, ml_dtypes.bfloat16, np.bool_]),
    ids=lambda d: np.dtype(d).name,
)
def test_every_route_gives_the_definition_on_raw_bits(dt, platform):
    """Small leaves alone and together (0-d, ragged, 1-D of whole DMA tiles, stored
    transposed, a constant one), large whole leaves (1-D, ragged 2-D, 3-D, stored transposed)
    within one kernel tile (interpret mode's own tiling rewrites NaN payloads past the first
    tile on XLA:CPU: tests/engine/test_fingerprint.py), a leaf sharded over 4 devices (blocks at
    offsets): digests and flags equal the definition's, and each leaf's route is one the
    plan names."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ('d',))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('d'))
    small = [(), (5,), (7, 3), (512,), (512,), (96, 8), (96, 8), (768, 3), (3, 5, 7), (1,)]
    large = [(70144,), (600, 128), (3, 32, 1024), (1024, 96)]
    arrays = [_raw(dt, s, i) for i, s in enumerate(small + large)]
    arrays[4][...] = arrays[4].reshape(-1)[0]  # constant
    if platform == 'tpu' and np.dtype(dt) == np.dtype(ml_dtypes.float8_e4m3fn):
        # read by the kernel in 3 tiles (not merged: not in RESHAPE_KEEPS_BITS): interpret
        # mode's slicing past the first tile rewrites NaN payloads on XLA:CPU
        arrays[-2][np.isnan(arrays[-2])] = 0.5
    sharded = _raw(dt, (512, 160), 99)
    dev = [jax.device_put(a) for a in arrays] + [jax.device_put(sharded, rows)]
    lone = [jax.device_put(arrays[1])]
    with F.configured(platform=platform, stored_order=_order):
        planned = F.plan(dev, flags=True)
        got = F.digests_with_flags(dev, 'device')
        alone = F.digests_with_flags(lone, 'device')
    assert set(planned.routes) <= {planning.SMALL_LEAF, planning.DEVICE, planning.HOST_COPY}
    assert got == _want(arrays + [sharded])
    assert alone == _want(arrays[1:2])


def test_the_plan_for_a_tpu_chooses_each_route_without_running_anything():
    """`plan` is pure: it compiles and runs nothing. For a TPU (forced, on CPU devices): a
    narrow float the kernel reads goes to the Pallas kernel in its stored order, float16 and
    a transposed vector block to host copies, float32 words to the kernel where it reads them
    and XLA elsewhere, integers to XLA; small leaves are packed by dtype (32-bit ones summed
    in rows, bfloat16 vectors by DMA) or copied one by one (bfloat16 of two axes, a lone
    leaf), numpy leaves stay numpy."""
    compiles = []

    def seen(event: str, *_: object, **__: object) -> None:
        if event == '/jax/core/compile/backend_compile_duration':
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(seen)
    bf16, f16, f8 = ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn
    leaves = [
        jax.device_put(np.zeros((1024, 96), bf16)),  # 0: stored (96, 1024): the kernel
        jax.device_put(np.zeros((300, 300), f16)),  # 1: host copies
        jax.device_put(np.zeros((400, 256), np.float32)),  # 2: the kernel
        jax.device_put(np.zeros((70001,), np.float32)),  # 3: XLA
        jax.device_put(np.zeros((300, 300), np.int8)),  # 4: XLA
        jax.device_put(np.zeros((70144,), f8)),  # 5: a vector of fp8: host copies
        jax.device_put(np.zeros((5,), np.float32)),  # 6, 7: packed, summed in rows
        jax.device_put(np.zeros((7, 3), np.float32)),
        jax.device_put(np.zeros((512,), bf16)),  # 8, 9: packed by DMA
        jax.device_put(np.zeros((1024,), bf16)),
        jax.device_put(np.zeros((96, 8), bf16)),  # 10: copied alone
        np.zeros((3, 3), np.float32),  # 11: numpy, small: with the host's
        np.zeros((300, 300), np.float32),  # 12: numpy, large
    ]
    jax.block_until_ready(leaves[:-2])
    n0 = len(compiles)
    with F.configured(platform='tpu', stored_order=_order):
        p = F.plan(leaves, flags=True)
    assert len(compiles) == n0
    D, H, S, N = planning.DEVICE, planning.HOST_COPY, planning.SMALL_LEAF, planning.NUMPY
    assert p.routes == [D, H, D, D, D, H, S, S, S, S, S, S, N]
    kinds = {p.blocks[c.blocks[0]].leaf: (c.kind, c.read) for c in p.programs}
    assert kinds[0] == ('pallas', layout.Read((1, 0), (96, 1024)))
    assert kinds[2][0] == 'pallas' and kinds[3] == ('xla', None) and kinds[4] == ('xla', None)
    assert all(c.interpret for c in p.programs)  # CPU devices: interpret mode
    packs = {c.kind: [p.blocks[i].leaf for i in c.blocks] for c in p.packs}
    assert packs == {'rows': [6, 7], 'dma': [8, 9]}
    assert sorted(p.blocks[i].leaf for i in p.copies) == [10, 11]
    with F.configured(platform='cpu'):  # a CPU: nothing packed, whole leaves read flat
        p = F.plan(leaves)
    assert not p.packs
    chunked = [sorted(p.blocks[i].leaf for i in c.blocks) for c in p.programs if c.kind == 'words']
    assert chunked == [[0, 1, 2, 3]]  # 2- and 4-byte dtypes: one program for every size
    rest = [c for c in p.programs if c.kind != 'words']
    assert all(c.kind == 'xla' and c.rows for c in rest)  # 1-byte ones: a program per size
    assert {c.key[2] for c in rest} == {(90000,), (70144,)}


@pytest.mark.parametrize(
    'dt', [np.float32, ml_dtypes.bfloat16, np.float16, np.int32, np.uint16],
    ids=lambda d: np.dtype(d).name,
)  # fmt: skip
def test_whole_leaves_on_a_cpu_are_read_in_chunks_of_words_exactly(dt):
    """Whole leaves of a 2- or 4-byte dtype on a CPU device go through one program for every
    size (`fingerprint.words`: chunks of 32-bit words, the words after the last whole chunk by
    numpy): raw bits of leaves of two chunks and a tail (an odd count of 2-byte elements),
    one chunk exactly, less than one; a NaN only in the tail, none at all; a constant leaf, one
    constant but for its last element, one but for an element of its second chunk; a 2-byte
    leaf whose words are all alike but not its elements: digests and flags equal the
    definition's, and one program is compiled for them all."""
    n = 2 * 65536  # words per chunk: two rows
    per = 4 // np.dtype(dt).itemsize  # elements per word
    two = 2 * n * per + 1001 * per + (per - 1)
    arrays = [_raw(dt, (two,), 1), _raw(dt, (n * per // 256, 256), 2), _raw(dt, (70001,), 3)]
    finite = _raw(dt, (two,), 4)
    floating = np.dtype(dt).kind == 'f' or np.dtype(dt) == ml_dtypes.bfloat16
    if floating:
        with np.errstate(invalid='ignore'):  # ml_dtypes' isfinite of a NaN's payload
            finite[~np.isfinite(finite)] = 0.5
        finite[-1] = np.nan
    constant = np.full((two,), 3, dt)
    last, second = constant.copy(), constant.copy()
    last[-1], second[n * per + 5] = 2, 2
    clean = finite.copy()
    clean[-1] = 1  # finite throughout (its words' low halves still hold every bit pattern)
    arrays += [finite, clean, constant, last, second]
    if per == 2:  # every word 0x00020003: the elements differ
        arrays.append(np.tile(np.array([3, 2], dt), two // 2))
    dev = [jax.device_put(a) for a in arrays]
    compiles = []

    def seen(event: str, *_: object, **__: object) -> None:
        if event == '/jax/core/compile/backend_compile_duration':
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(seen)
    with F.configured(platform='cpu', cpu_chunk_words=n):
        planned = F.plan(dev, flags=True)
        jax.clear_caches()  # jax keeps executables by program: another test's would serve
        n0 = len(compiles)
        got = F.digests_with_flags(dev, 'device')
        assert len(compiles) - n0 == 1  # the chunk program, for every size
        plain = F.digests(dev, 'device')
    assert [c.kind for c in planned.programs] == ['words']
    want = _want(arrays)
    assert got == want
    assert plain == [d for d, _, _ in want]
    assert [bad for _, bad, _ in got][3:5] == [floating, False]  # the tail's NaN alone
    assert [same for _, _, same in got][5:] == [True, False, False] + [False] * (per == 2)
