"""The kernel's lanes of blocks on a TPU, from their raw bits: a Pallas kernel.

On a TPU, XLA does not keep a narrow float's bits (`bench/tpu_bits.py` shows it on the
chip at hand): a bitcast of bfloat16 to uint16 flushes subnormals and rewrites NaN
payloads, and even an identity program rewrites float8_e4m3fn's negative NaN and every
float16 NaN. A Pallas (Mosaic) kernel that reinterprets the block in VMEM keeps every bit
of bfloat16, float8_e4m3fn and float8_e5m2. This module reads such a block once, tile by
tile in its own shape (the last two axes tiled, the leading ones walked by the grid),
and yields per tile the four lane sums of docs/API.md §4.2 (`definition`:
``g16``/``g8`` of the raw halves times ``c(k)``, ``c'(k >> 16)``), whether it holds
NaN/Inf (from the exponent bits) and the largest and smallest raw value (constant
blocks). Arithmetic is int32 (wrapping: the definition's uint32 sums mod 2^32, logical
shifts). float16 is not here: Mosaic takes no float16 argument, and XLA rewrites its NaNs,
so it is read from host copies (`planning.bits_lost_on_chip`).

The same kernel reads 32-bit words (float32, int32, uint32) in the shapes it reads at memory
speed: XLA keeps their bits, and the kernel's programs compile faster there than XLA's fused
reductions (`bench/tpu_fingerprints.py` counts and times the first call's compiles). The sums come
from row and column sums of ``g16`` of the halves (no product per element): the element
index is ``first-of-row + column``, so ``sum g * c(e)`` splits into row sums times the
rows' first indices and column sums times the column numbers.

Off a TPU the kernel runs in Pallas' interpret mode (the tests check it against numpy).
Which blocks it reads, and in which layout, the plan decides (`planning`, `layout`).

Also here: small 1-D bfloat16 leaves packed by DMA into one buffer (`dma_pack`), so a call
copies one buffer to the host, not one per leaf, and no XLA operation touches their bits.
Small leaves of two axes or more stored in C order, several of one shape: read whole into
VMEM by one kernel, their bits widened to int32 there (`vmem_bits`), one buffer copied to the
host. Others are copied to the host one by one: a DMA between their tiled layouts does not
keep their bits on a TPU (`bench/tpu_fingerprints.py`'s exactness section checks the routes
taken).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from multihost._checks.fingerprint.definition import G8_MULTIPLIERS, G16_MULTIPLIERS, NONFINITE_BITS
from multihost._checks.fingerprint.layout import PACKED_ROWS

#: Elements of one tile, at most (int32 temporaries of a tile stay well inside VMEM).
TILE = 1 << 17
#: Result words per tile: four lanes, non-finite, largest raw value, smallest raw value.
WORDS = 7
#: The kernel's arithmetic type (wrapping: the definition's uint32 sums mod 2^32).
I32 = jnp.int32


def _tiles(shape: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """Tile (rows, cols) of the last two axes: whole where they fit, else rows in
    multiples of the dtype's packing (8 rows of 4 bytes, 16 of 2, 32 of 1), cols of 128. Sizes
    count as VMEM holds them: cols padded to 128 lanes, rows to the packing."""
    a, b = shape[-2], shape[-1]
    pack = PACKED_ROWS[itemsize]
    wide = -(-b // 128) * 128
    if -(-a // pack) * pack * wide <= TILE:
        return a, b
    if wide * pack <= TILE:
        return (TILE // wide) // pack * pack, b
    return min(a, pack), max(128, (TILE // pack) // 128 * 128)


def _srl(x: Any, n: int) -> Any:
    return jax.lax.shift_right_logical(x, I32(n))


def _g16(x: Any) -> Any:
    x = (x * I32(G16_MULTIPLIERS[0])) & I32(0xFFFF)
    x = x ^ _srl(x, 7)
    x = (x * I32(G16_MULTIPLIERS[1])) & I32(0xFFFF)
    return x ^ _srl(x, 8)


def _g8(x: Any) -> Any:
    x = (x * I32(G8_MULTIPLIERS[0])) & I32(0xFF)
    x = x ^ _srl(x, 4)
    x = (x * I32(G8_MULTIPLIERS[1])) & I32(0xFF)
    return x ^ _srl(x, 3)


def _total(x: Any) -> Any:
    return jnp.sum(jnp.sum(x, axis=0, keepdims=True), axis=1, keepdims=True)


def _lanes16(v: Any, first: Any, cols: Any, stride: int) -> list[Any]:
    """The four lanes of a tile of 2-byte elements from row and column sums.

    ``v``: ``g16`` of each raw value (0 past the block); ``first``: (rows, 1) each tile
    row's first element's index in the leaf; ``cols``: (1, cols) local column numbers;
    ``stride``: the leaf's row stride. Element ``e = first + col`` is word ``e >> 1``, its
    high half when ``e`` is odd, so ``c(k) = e | 1`` (``e`` for a high half, ``e + 1`` for
    a low one) and ``c'(k >> 16) = (e >> 16) | 1``: sums of ``v * e`` split into row sums
    times ``first`` and column sums times ``col``. ``c'`` changes where ``e`` passes a
    multiple of 2^17; inside a row only when 2^17 is not a multiple of the stride: those
    rows add the change times what lies past it."""
    if stride % 2 == 0:  # every row's first element has the same parity: a column mask
        hi = ((cols ^ first[0:1, :]) & I32(1)) == I32(1)
    else:
        hi = ((cols ^ first) & I32(1)) == I32(1)
    hv = jnp.where(hi, v, I32(0))
    a, a_hi = jnp.sum(v, axis=1, keepdims=True), jnp.sum(hv, axis=1, keepdims=True)
    c = jnp.sum(v, axis=0, keepdims=True)
    c_hi = jnp.where(hi, c, I32(0)) if stride % 2 == 0 else jnp.sum(hv, axis=0, keepdims=True)
    a_lo, c_lo = a - a_hi, c - c_hi
    near = _srl(first, 16) | I32(1)
    words = [
        _total(first * a_hi) + _total(cols * c_hi),
        _total((first + I32(1)) * a_lo) + _total(cols * c_lo),
        _total(near * a_hi),
        _total(near * a_lo),
    ]
    if (1 << 17) % stride:  # a row may pass a multiple of 2^17 (at most once: cols <= 2^17)
        nxt = (first | I32(0x1FFFF)) + I32(1)
        past = cols >= nxt - first
        x = jnp.sum(jnp.where(past, v, I32(0)), axis=1, keepdims=True)
        x_hi = jnp.sum(jnp.where(past, hv, I32(0)), axis=1, keepdims=True)
        step = (_srl(nxt, 16) | I32(1)) - near
        words[2] = words[2] + _total(step * x_hi)
        words[3] = words[3] + _total(step * (x - x_hi))
    return words


def _lanes32(hi: Any, lo: Any, first: Any, cols: Any, stride: int) -> list[Any]:
    """The four lanes of a tile of 32-bit words (`_lanes16`'s sums): ``hi``, ``lo`` the
    ``g16`` of each word's halves, word ``e = first + col``, ``c(e) = 2e + 1`` and
    ``c'(e >> 16) = (e >> 15) | 1``, which changes where ``e`` passes a multiple of 2^16."""
    odd = cols * I32(2) + I32(1)
    near = _srl(first, 15) | I32(1)
    words = []
    for h in (hi, lo):
        a, c = jnp.sum(h, axis=1, keepdims=True), jnp.sum(h, axis=0, keepdims=True)
        words.append(_total((first * I32(2)) * a) + _total(odd * c))
    for h in (hi, lo):
        words.append(_total(near * jnp.sum(h, axis=1, keepdims=True)))
    if (1 << 16) % stride:  # a row may pass a multiple of 2^16 (at most once: cols <= 2^16)
        nxt = (first | I32(0xFFFF)) + I32(1)
        past = cols >= nxt - first
        step = (_srl(nxt, 15) | I32(1)) - near
        for i, h in ((2, hi), (3, lo)):
            x = jnp.sum(jnp.where(past, h, I32(0)), axis=1, keepdims=True)
            words[i] = words[i] + _total(step * x)
    return words


def _lanes8(v: Any, e: Any) -> list[Any]:
    """The four lanes of a tile of 1-byte elements at leaf indices ``e``: word ``e >> 2``,
    its high half when bit 1 of ``e`` is set, the byte's place in the half bit 0; so
    ``c(k) = (e >> 1) | 1`` and ``c'(k >> 16) = (e >> 17) | 1``."""
    v = jnp.where((e & I32(1)) == I32(1), v << I32(8), v)
    is_hi = (e & I32(2)) == I32(2)
    t1 = v * (_srl(e, 1) | I32(1))
    t2 = v * (_srl(e, 17) | I32(1))
    s1, s2 = _total(t1), _total(t2)
    h1, h2 = _total(jnp.where(is_hi, t1, I32(0))), _total(jnp.where(is_hi, t2, I32(0)))
    return [h1, s1 - h1, h2, s2 - h2]


def _lanes_at(size: int, e: Any, v: Any, lo: Any = None) -> list[Any]:
    """The four lanes of a tile whose elements' leaf indices ``e`` are given one by one (a
    block read in its stored order: along its last axis the index steps by that axis's C
    stride, not 1). ``v``: ``g16``/``g8`` of each raw value, for 32-bit words the high
    halves' and ``lo`` the low ones'. The definitions of `_lanes16` and `_lanes32`, a
    product per element."""
    if size == 1:
        return _lanes8(v, e)
    if size == 4:
        c, c2 = e * I32(2) + I32(1), _srl(e, 15) | I32(1)
        return [_total(v * c), _total(lo * c), _total(v * c2), _total(lo * c2)]
    is_hi = (e & I32(1)) == I32(1)
    t1, t2 = v * (e | I32(1)), v * (_srl(e, 16) | I32(1))
    s1, s2 = _total(t1), _total(t2)
    h1, h2 = _total(jnp.where(is_hi, t1, I32(0))), _total(jnp.where(is_hi, t2, I32(0)))
    return [h1, s1 - h1, h2, s2 - h2]


def _max(x: Any) -> Any:
    return jnp.max(jnp.max(x, axis=0, keepdims=True), axis=1, keepdims=True)


def _min(x: Any) -> Any:
    return jnp.min(jnp.min(x, axis=0, keepdims=True), axis=1, keepdims=True)


def _kernel(
    off_ref: Any, x_ref: Any, o_ref: Any, *, shape: tuple[int, ...], strides: tuple[int, ...],
    tile: tuple[int, int], name: str, flags: bool,
) -> None:  # fmt: skip
    """One tile: raw bits (reinterpreted in VMEM) and their leaf indices give the four
    lanes; with ``flags`` also the largest exponent field, largest and smallest raw value."""
    nd = len(shape)
    ta, tb = tile
    size = np.dtype(name).itemsize
    if size == 4:
        r = jax.lax.bitcast_convert_type(x_ref[...], I32)
    else:
        raw = jax.lax.bitcast_convert_type(x_ref[...], jnp.int8 if size == 1 else jnp.int16)
        r = raw.astype(I32) & I32((1 << (8 * size)) - 1)
    g = [pl_program_id(d) for d in range(nd)]
    base = off_ref[0]
    for d in range(nd - 2):
        base = base + g[d] * I32(strides[d] & 0xFFFFFFFF)
    rows = jax.lax.broadcasted_iota(I32, (ta, 1), 0) + g[nd - 2] * I32(ta)
    cols = jax.lax.broadcasted_iota(I32, (1, tb), 1)
    col0 = g[nd - 1] * I32(tb)
    step = strides[-1] & 0xFFFFFFFF  # the last axis's stride: 1 in C order
    # each tile row's first element's index in the leaf
    first = base + rows * I32(strides[-2] & 0xFFFFFFFF) + col0 * I32(step)
    ragged = bool(shape[-2] % ta or shape[-1] % tb)
    valid: Any = (rows < I32(shape[-2])) & (cols + col0 < I32(shape[-1])) if ragged else None
    if size == 4:
        hi, lo = _g16(_srl(r, 16)), _g16(r & I32(0xFFFF))
        if ragged:
            hi, lo = jnp.where(valid, hi, I32(0)), jnp.where(valid, lo, I32(0))
        if step == 1:
            words = _lanes32(hi, lo, first, cols, strides[-2])
        else:
            words = _lanes_at(4, first + cols * I32(step), hi, lo)
    else:
        v = _g16(r) if size == 2 else _g8(r)
        v = jnp.where(valid, v, I32(0)) if ragged else v
        if size == 2 and step == 1:
            words = _lanes16(v, first, cols, strides[-2])
        else:
            words = _lanes_at(size, first + cols * I32(step), v)
    if flags:  # past the block: the tile's first value again (neutral for all three)
        rr = jnp.where(valid, r, r[0:1, 0:1]) if ragged else r
        mask = NONFINITE_BITS.get(name, (0, 1))[0]  # integers: never non-finite
        words += [_max(rr & I32(mask)), _max(rr), _min(rr)]
    lane = jax.lax.broadcasted_iota(I32, (8, 128), 1)
    out = jnp.zeros((8, 128), I32)
    for j, w in enumerate(words):
        out = jnp.where(lane == j, jnp.broadcast_to(w, (8, 128)), out)
    o_ref[...] = out.reshape(o_ref.shape)


def pl_program_id(d: int) -> Any:
    from jax.experimental import pallas as pl

    return pl.program_id(d)


def block_words(
    x: jax.Array, offset: Any, strides: tuple[int, ...], flags: bool = True,
    interpret: bool = False,
) -> jax.Array:  # fmt: skip
    """The block's words, uint32 (inside a jitted program): lanes 1-4 (before K1/K2) and,
    with ``flags``, whether it holds NaN/Inf, its largest and smallest raw value.
    ``offset``: int32 (1,), the block's first element's index in its leaf (mod 2^32);
    ``strides``: each axis of ``x``'s stride in the leaf's C order (static: the leaf's C
    strides, or in its stored order those strides permuted); ``interpret``: Pallas'
    interpret mode (off a TPU)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    shape = tuple(int(d) for d in x.shape)
    nd = len(shape)
    dt = np.dtype(x.dtype)
    ta, tb = _tiles(shape, dt.itemsize)
    grid = (*shape[:-2], pl.cdiv(shape[-2], ta), pl.cdiv(shape[-1], tb))
    in_block: tuple[Any, ...] = (*(pl.squeezed,) * (nd - 2), ta, tb)
    kernel = functools.partial(
        _kernel, shape=shape, strides=tuple(strides), tile=(ta, tb), name=dt.name, flags=flags
    )
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=grid,
        in_specs=[pl.BlockSpec(in_block, lambda *g: g[:nd])],
        out_specs=pl.BlockSpec((*(pl.squeezed,) * nd, 8, 128), lambda *g: (*g[:nd], 0, 0)),
    )
    out = pl.pallas_call(
        kernel,
        grid_spec=spec,
        out_shape=jax.ShapeDtypeStruct((*grid, 8, 128), I32),
        interpret=interpret,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=64 << 20),
    )(offset, x)
    per = out[..., 0, :WORDS].reshape(-1, WORDS)
    sums = jnp.sum(per[:, :4].astype(jnp.uint32), axis=0, dtype=jnp.uint32)
    if not flags:
        return sums
    bad = jnp.max(per[:, 4]) >= I32(NONFINITE_BITS.get(dt.name, (0, 1))[1])
    more = jnp.stack([bad.astype(I32), jnp.max(per[:, 5]), jnp.min(per[:, 6])])
    return jnp.concatenate([sums, more.astype(jnp.uint32)])


#: 1-D tile of a TPU's HBM layout by element size: a DMA into a packed 1-D buffer moves
#: whole tiles (Mosaic refuses other slice sizes on a TPU v5e: 256 for 2-byte and 512 for
#: 1-byte elements).
DMA_TILE = {2: 256, 1: 512}
#: Dtypes whose small 1-D leaves are packed by DMA on a TPU. XLA's concatenation (or
#: relayout) of bfloat16 does not keep its bits there; a DMA of a 1-D leaf into a 1-D buffer
#: moves its bytes unchanged (`bench/tpu_fingerprints.py`'s exactness section checks). Not
#: leaves of two or more axes: a DMA between their tiled layouts does not keep bits there.
DMA_DTYPES = frozenset({'bfloat16'})


def dma_packable(dtype: Any, shape: tuple[int, ...]) -> bool:
    """Whether a 1-D leaf of ``dtype`` and ``shape`` is packed by `dma_pack`."""
    dt = np.dtype(dtype)
    tile = DMA_TILE.get(dt.itemsize)
    return dt.name in DMA_DTYPES and len(shape) == 1 and tile is not None and shape[0] % tile == 0


def _dma_copies(
    xs: tuple[jax.Array, ...], out_shape: tuple[int, ...], place: Any, interpret: bool
) -> jax.Array:
    """A Pallas kernel that copies each of ``xs`` by DMA into ``place(out, j)`` of one
    buffer of ``out_shape`` (all copies started, then all waited for): no XLA operation
    touches their bits."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    anywhere = pltpu.MemorySpace.ANY if hasattr(pltpu.MemorySpace, 'ANY') else pl.ANY

    def kernel(*refs: Any) -> None:
        ins, out, sem = refs[: len(xs)], refs[len(xs)], refs[len(xs) + 1]
        copies = [pltpu.make_async_copy(ref, place(out, j), sem.at[j]) for j, ref in enumerate(ins)]
        for c in copies:
            c.start()
        for c in copies:
            c.wait()

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape, xs[0].dtype),
        in_specs=[pl.BlockSpec(memory_space=anywhere)] * len(xs),
        out_specs=pl.BlockSpec(memory_space=anywhere),
        scratch_shapes=[pltpu.SemaphoreType.DMA((len(xs),))],
        interpret=pltpu.InterpretParams() if interpret else False,
    )(*xs)


def _dma_pack(xs: tuple[jax.Array, ...], interpret: bool) -> jax.Array:
    """1-D leaves of one dtype, their sizes whole tiles, copied by DMA one after another
    into one buffer."""
    from jax.experimental import pallas as pl

    sizes = [int(x.shape[0]) for x in xs]
    starts = [sum(sizes[:j]) for j in range(len(sizes))]
    return _dma_copies(
        xs, (sum(sizes),), lambda out, j: out.at[pl.ds(starts[j], sizes[j])], interpret
    )


#: `_dma_pack` on a TPU, and in Pallas' interpret mode (off a TPU: the tests).
dma_pack = jax.jit(functools.partial(_dma_pack, interpret=False))
dma_pack_interpret = jax.jit(functools.partial(_dma_pack, interpret=True))


#: VMEM bytes of one `vmem_bits` program's leaves and output, at most (their tiles padded).
VMEM_BITS_BYTES = 8 << 20


def vmem_bytes(dtype: Any, shape: tuple[int, ...]) -> int:
    """VMEM bytes of one leaf of ``dtype`` and ``shape`` in `vmem_bits`, with its int32 output
    (the last axis padded to 128 lanes, the one before to the tile's packed rows)."""
    size = np.dtype(dtype).itemsize
    lead = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    rows = shape[-2] if len(shape) >= 2 else 1
    wide = -(-shape[-1] // 128) * 128
    return (
        lead
        * wide
        * (-(-rows // PACKED_ROWS[size]) * PACKED_ROWS[size] * size + -(-rows // 8) * 8 * 4)
    )


def _vmem_bits(xs: tuple[jax.Array, ...], interpret: bool) -> jax.Array:
    """Small whole leaves of one narrow float dtype and one shape, each read whole into VMEM,
    its raw bits reinterpreted there and widened to int32 (unsigned values): one int32
    buffer of shape (K, *shape), whose bits no XLA operation rewrites (XLA keeps integers'
    bits; only narrow floats' are at risk on a TPU). The host takes each leaf's bits from it."""
    from jax.experimental import pallas as pl

    size = np.dtype(xs[0].dtype).itemsize
    raw_type = jnp.int8 if size == 1 else jnp.int16
    mask = (1 << (8 * size)) - 1

    def kernel(*refs: Any) -> None:  # (a Mosaic kernel captures no array: the mask made here)
        out = refs[-1]
        for j, ref in enumerate(refs[:-1]):
            out[j] = jax.lax.bitcast_convert_type(ref[...], raw_type).astype(I32) & I32(mask)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((len(xs), *xs[0].shape), I32),
        interpret=interpret,
    )(*xs)


#: `_vmem_bits` on a TPU, and in Pallas' interpret mode (off a TPU: the tests).
vmem_bits = jax.jit(functools.partial(_vmem_bits, interpret=False))
vmem_bits_interpret = jax.jit(functools.partial(_vmem_bits, interpret=True))
