"""The kernel's lanes of narrow floats on a TPU, from their raw bits: a Pallas kernel.

On a TPU, XLA does not keep a narrow float's bits: measured on a TPU v5e (jax 0.10.2,
`bench/tpu_bits.py`), a bitcast of bfloat16 to uint16 flushes subnormals and rewrites NaN
payloads, and even an identity program rewrites float8_e4m3fn's negative NaN and every
float16 NaN. A Pallas (Mosaic) kernel that reinterprets the block in VMEM keeps every bit
of bfloat16, float8_e4m3fn and float8_e5m2. This module reads such a block once, tile by
tile in its own shape (the last two axes tiled, the leading ones walked by the grid),
and yields per tile the four lane sums of docs/API.md 4.2 (`_fingerprint`'s definition:
``g16``/``g8`` of the raw halves times ``c(k)``, ``c'(k >> 16)``), whether it holds
NaN/Inf (from the exponent bits) and the largest and smallest raw value (constant
blocks). Arithmetic is int32 (wrapping: the definition's uint32 sums mod 2^32, logical
shifts). float16 is not here: Mosaic takes no float16 argument, and XLA rewrites its NaNs,
so it is read from host copies (`_fingerprint.bits_lost_on_chip`).

Off a TPU the kernel runs in Pallas' interpret mode (the tests check it against numpy).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: Raw-bit NaN/Inf test per dtype: (mask, value): non-finite iff ``bits & mask == value``.
NONFINITE = {
    'bfloat16': (0x7F80, 0x7F80),
    'float8_e4m3fn': (0x7F, 0x7F),
    'float8_e5m2': (0x7C, 0x7C),
}
#: Elements of one tile, at most (int32 temporaries of a tile stay well inside VMEM).
TILE = 1 << 17
#: Result words per tile: four lanes, non-finite, largest raw value, smallest raw value.
WORDS = 7

_I = jnp.int32


#: Dtypes whose bits an XLA reshape keeps on a TPU (measured): read whole in a 2-D shape.
RESHAPE_KEEPS_BITS = frozenset({'bfloat16', 'float8_e5m2'})


def _direct(shape: tuple[int, ...], itemsize: int) -> bool:
    """Block shapes whose bits the kernel read exactly on a TPU v5e (`bench/tpu_bits.py
    --kernel`): a last axis of 128 or more, and for 3-D and up a second-to-last axis in
    whole packed rows (16 of 2 bytes, 32 of 1). Others (a last axis under 128, like
    (1000, 5) or (512, 8, 64); (3, 5, 70001)) came back with canonicalized NaNs there."""
    pack = 32 if itemsize == 1 else 16
    return shape[-1] >= 128 and (len(shape) == 2 or shape[-2] % pack == 0)


def plan(dtype: Any, shape: tuple[int, ...], whole: bool) -> tuple[int, ...] | None:
    """The shape the kernel reads a block of ``dtype`` and ``shape`` in, or None (host
    copies): the block's own shape where that reads exactly (`_direct`); for a whole leaf
    of a dtype XLA reshapes exactly, 2-D rows of 1,024 down to 128 elements (C order, so
    every element keeps its index)."""
    dt = np.dtype(dtype)
    if dt.name not in NONFINITE or len(shape) < 1 or not all(shape):
        return None
    if len(shape) >= 2 and _direct(shape, dt.itemsize):
        return shape
    if whole and dt.name in RESHAPE_KEEPS_BITS:
        n = int(np.prod(shape))
        for width in (1024, 512, 256, 128):
            if n % width == 0 and n // width >= 16:
                return (n // width, width)
    return None


def handles(dtype: Any, shape: tuple[int, ...], whole: bool = False) -> bool:
    """Whether this kernel reads a block of ``dtype`` and ``shape`` (`plan`)."""
    return plan(dtype, shape, whole) is not None


#: Run the kernel in Pallas' interpret mode off a TPU (the tests: CPU has no Mosaic).
INTERPRET = False


def wanted(platform: str, dtype: Any, shape: tuple[int, ...], whole: bool = False) -> bool:
    """Whether a block of ``dtype`` and ``shape`` on a ``platform`` device is read here: on
    a TPU (or anywhere with `INTERPRET`), a narrow float this kernel handles."""
    return (platform == 'tpu' or INTERPRET) and handles(dtype, shape, whole)


def _tiles(shape: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """Tile (rows, cols) of the last two axes: whole where they fit, else rows in
    multiples of the dtype's packing (16 rows of 2 bytes, 32 of 1) and cols of 128. Sizes
    count as VMEM holds them: cols padded to 128 lanes, rows to the packing."""
    a, b = shape[-2], shape[-1]
    pack = 32 if itemsize == 1 else 16
    wide = -(-b // 128) * 128
    if -(-a // pack) * pack * wide <= TILE:
        return a, b
    if wide * pack <= TILE:
        return (TILE // wide) // pack * pack, b
    return min(a, pack), max(128, (TILE // pack) // 128 * 128)


def _srl(x: Any, n: int) -> Any:
    return jax.lax.shift_right_logical(x, _I(n))


def _g16(x: Any) -> Any:
    x = (x * _I(0x9E37)) & _I(0xFFFF)
    x = x ^ _srl(x, 7)
    x = (x * _I(0x5BD1)) & _I(0xFFFF)
    return x ^ _srl(x, 8)


def _g8(x: Any) -> Any:
    x = (x * _I(0x9D)) & _I(0xFF)
    x = x ^ _srl(x, 4)
    x = (x * _I(0x6B)) & _I(0xFF)
    return x ^ _srl(x, 3)


def _total(x: Any) -> Any:
    return jnp.sum(jnp.sum(x, axis=0, keepdims=True), axis=1, keepdims=True)


def _kernel(
    off_ref: Any, x_ref: Any, o_ref: Any, *, shape: tuple[int, ...], strides: tuple[int, ...],
    tile: tuple[int, int], name: str,
) -> None:  # fmt: skip
    """One tile: raw bits (reinterpreted in VMEM), their leaf indices, the seven words."""
    nd = len(shape)
    ta, tb = tile
    size = np.dtype(name).itemsize
    raw = jax.lax.bitcast_convert_type(x_ref[...], jnp.int8 if size == 1 else jnp.int16)
    r = raw.astype(_I) & _I((1 << (8 * size)) - 1)
    g = [pl_program_id(d) for d in range(nd)]
    base = off_ref[0]
    for d in range(nd - 2):
        base = base + g[d] * _I(strides[d] & 0xFFFFFFFF)
    rows = jax.lax.broadcasted_iota(_I, (ta, 1), 0) + g[nd - 2] * _I(ta)
    cols = jax.lax.broadcasted_iota(_I, (1, tb), 1) + g[nd - 1] * _I(tb)
    # e = base + row * stride + col * stride', the row part on a column, the col part on a row
    e = (base + rows * _I(strides[-2] & 0xFFFFFFFF)) + cols * _I(strides[-1] & 0xFFFFFFFF)
    if size == 1:
        v = _g8(r)
        v = jnp.where((e & _I(1)) == _I(1), v << _I(8), v)
        is_hi, k = (_srl(e, 1) & _I(1)) == _I(1), _srl(e, 2)
    else:
        v = _g16(r)
        is_hi, k = (e & _I(1)) == _I(1), _srl(e, 1)
    mask, val = NONFINITE[name]
    bad = (r & _I(mask)) == _I(val)
    hi_r, lo_r = r, r
    if shape[-2] % ta or shape[-1] % tb:  # ragged edge tiles: what lies past the block adds 0
        valid = (rows < _I(shape[-2])) & (cols < _I(shape[-1]))
        v = jnp.where(valid, v, _I(0))
        bad = bad & valid
        hi_r, lo_r = jnp.where(valid, r, _I(-1)), jnp.where(valid, r, _I(1 << 30))
    # L1 = sum hi * c, L2 = sum lo * c = sum v * c - L1 (likewise with c'): two products
    t1 = v * ((k << _I(1)) | _I(1))
    t2 = v * ((_srl(k, 16) << _I(1)) | _I(1))
    s1, s2 = _total(t1), _total(t2)
    h1, h2 = _total(jnp.where(is_hi, t1, _I(0))), _total(jnp.where(is_hi, t2, _I(0)))
    words = [h1, s1 - h1, h2, s2 - h2]
    words.append(jnp.max(jnp.max(bad.astype(_I), axis=0, keepdims=True), axis=1, keepdims=True))
    words.append(jnp.max(jnp.max(hi_r, axis=0, keepdims=True), axis=1, keepdims=True))
    words.append(jnp.min(jnp.min(lo_r, axis=0, keepdims=True), axis=1, keepdims=True))
    lane = jax.lax.broadcasted_iota(_I, (8, 128), 1)
    out = jnp.zeros((8, 128), _I)
    for j, w in enumerate(words):
        out = jnp.where(lane == j, jnp.broadcast_to(w, (8, 128)), out)
    o_ref[...] = out.reshape(o_ref.shape)


def pl_program_id(d: int) -> Any:
    from jax.experimental import pallas as pl

    return pl.program_id(d)


def block_words(
    x: jax.Array, offset: Any, strides: tuple[int, ...], interpret: bool = False
) -> jax.Array:
    """Seven int32 words of block ``x`` (inside a jitted program): lanes 1-4 (before K1/K2),
    non-finite, largest and smallest raw value. ``offset``: int32 (1,), the block's first
    element's index in its leaf (mod 2^32); ``strides``: the leaf's C strides (static);
    ``interpret``: Pallas' interpret mode (off a TPU)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    shape = tuple(int(d) for d in x.shape)
    nd = len(shape)
    dt = np.dtype(x.dtype)
    ta, tb = _tiles(shape, dt.itemsize)
    grid = (*shape[:-2], pl.cdiv(shape[-2], ta), pl.cdiv(shape[-1], tb))
    in_block: tuple[Any, ...] = (*(pl.squeezed,) * (nd - 2), ta, tb)
    kernel = functools.partial(
        _kernel, shape=shape, strides=tuple(strides), tile=(ta, tb), name=dt.name
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
        out_shape=jax.ShapeDtypeStruct((*grid, 8, 128), _I),
        interpret=interpret,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=64 << 20),
    )(offset, x)
    per = out[..., 0, :WORDS].reshape(-1, WORDS)
    sums = jnp.sum(per[:, :4].astype(jnp.uint32), axis=0, dtype=jnp.uint32)
    flags = jnp.stack([jnp.max(per[:, 4]), jnp.max(per[:, 5]), jnp.min(per[:, 6])])
    return jnp.concatenate([sums, flags.astype(jnp.uint32)])
