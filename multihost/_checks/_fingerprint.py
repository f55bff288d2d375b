"""Leaf fingerprints: XXH3-128 of the bytes in host memory, an exact kernel on the device.

Two definitions; each leaf uses one, and its digest says which (`digests`):

* **host** (``'x'`` + 32 hex digits): XXH3-128 (the ``xxhash`` package) of a
  header (dtype name, shape) and the leaf's bytes in C order, little-endian.
  For data in host memory: numpy leaves, and `jax.Array` shards on CPU
  devices, read through zero-copy views (``np.asarray(shard.data)``), at
  memory speed. No construction proof: a collision of unrelated data is about
  2^-128; not for adversarial input.
* **kernel** (32 hex digits per lane set): the exact construction below,
  computed by XLA on the device for data on an accelerator (only the lanes
  leave it) and by numpy on the host, the two giving the same bytes.

``MULTIHOST_FINGERPRINT=auto|device|host`` (`mode`) picks: ``auto`` (the
default) as above; ``device`` the kernel everywhere (numpy leaves by its
numpy implementation: the kernel's tests run on CPU); ``host`` XXH3
everywhere (accelerator data copied to the host). Hosts exchange digests,
so a leaf held in different kinds on two hosts (numpy here, a GPU array
there) would differ for where it lives: the callers (`_treediff`,
`_replicas`) then recompute the host-kind side with the kernel, the
definition every host can compute (`kernel_digests`).

The kernel's definition. The leaf's elements in C order, element ``e`` (0-based). Each
element is cut into 32-bit words (little-endian); a 1-, 2- or 4-byte element
is part of word ``k`` of the packed, zero-padded byte string (``k = e >> 2``,
``e >> 1``, ``e``), an 8- or 16-byte element has ``W = itemsize / 4`` words,
each with its own set of lanes (``k = e`` for every lane set ``p < W``). A
word is two 16-bit halves ``hi``/``lo``; each half is put through a fixed
bijection (``g16`` on a 16-bit half; for 1-byte dtypes ``g8`` on each byte
before packing, so a half is ``g8(b1) << 8 | g8(b0)``; ``g(0) = 0``, so the
zero padding adds nothing). Four uint32 lanes per lane set, all sums mod 2^32:

    L1 = sum hi_k * c(k)          L2 = sum lo_k * c(k)
    L3 = sum hi_k * c'(k >> 16)   L4 = sum lo_k * c'(k >> 16)
    c(k) = K1 * (2k + 1),  c'(m) = K2 * (2m + 1)   (K1, K2 odd)

Sums are order-independent, so XLA's reduction order does not matter, and
they split over blocks: a block's lanes with global indices add up (mod
2^32) to the leaf's.

What is caught by construction (leaves < 2^32 words; v2 = 2-adic valuation):

* One changed word (any flipped bits in one element of <= 4 bytes, or in
  one word of a wider element): some half changes, so ``g(half)`` changes by
  ``0 < |d| < 2^16`` (v2(d) <= 15); times the odd ``c(k)`` the lane changes:
  ``v2(d * c(k)) <= 15 < 32``.
* A swap of two unequal elements ``e != f`` in words ``k != j`` at the same
  position within their words: the half at that position changes by ``+d``
  in one word and ``-d`` in the other (for 1-byte dtypes the other byte of the
  half is untouched, so the difference is exactly ``d << s``, v2 <= 15), and
  L1/L2 change by ``d * (c(k) - c(j)) = d * 2 K1 (k - j)``: v2 <= 15 + 1 +
  v2(k - j) < 32 when v2(k - j) <= 15. Otherwise ``k = j mod 2^16`` and L3/L4
  change by ``d * 2 K2 (m_k - m_j)`` with ``0 < |m_k - m_j| < 2^16``: v2 <= 31.
* A swap at different positions within their words (``e``, ``f`` at different
  halves, or in one word): the half of ``e`` changes in one lane (L1 or L2)
  alone or with a change in the other half's lane; some lane gets ``d * c(k)``
  with nothing to cancel it, nonzero. Two bytes swapped within one half:
  ``(g8(a) - g8(b)) * (2^8 - 1)``, v2 <= 7, nonzero.
* 8- and 16-byte elements (complex64, x64 dtypes): one lane set per word of
  the element, each over the sequence of that word, so a swap of elements is a
  swap of single words in each lane set (above). One set for all the words
  would not do: the words of a swapped element move together and can cancel.

What is not caught by construction: differences in three or more words can
cancel. The lanes are linear in the bijected halves, two independent 32-bit
sums per half position; for differences of random data a collision is
heuristically ~2^-128 (at most 2^-64 for the sums we could not separate).
It is not a cryptographic hash: differences chosen to cancel can be built.
Shape and dtype are not part of the bytes: callers compare them separately.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xxhash

from multihost import _recorder
from multihost._checks import _hostreads, _raw_lanes
from multihost._jax_adapter import has_host_copy

K1 = 0x9E3779B1
K2 = 0x85EBCA77
_M16 = (0x9E37, 0x5BD1)  # odd multipliers of g16 (bijective mod 2^16)
_M8 = (0x9D, 0x6B)  # odd multipliers of g8 (bijective mod 2^8)
_CHUNK = 1 << 22  # numpy: elements per step (bounds temporaries)
LANES = 4
FINGERPRINT_BYTES = 16  # per lane set


def lane_sets(dtype: Any) -> int:
    """Lane sets (16 bytes each) of a dtype: 1 up to 4 bytes, ``itemsize / 4`` above."""
    size = np.dtype(dtype).itemsize
    return 1 if size <= 4 else size // 4


def supported(dtype: Any) -> bool:
    """Whether the kernel defines a fingerprint for ``dtype`` (numeric, bool, ml_dtypes)."""
    dt = np.dtype(dtype)
    numeric = dt.kind in 'biufc' or (dt.kind == 'V' and dt.fields is None)
    return numeric and dt.itemsize in (1, 2, 4, 8, 16)


# -- the arithmetic, for numpy and jax.numpy alike (``xp``) ------------------------

_C = 1 << 16  # words per row of the fast path: row r holds words k with k >> 16 == r


def _g16(xp: Any, x: Any) -> Any:
    if xp is np:  # numpy: a table of all 2^16 values (one gather instead of eight passes)
        return _table(16)[x]
    return _g16_ops(xp, x)


def _g16_ops(xp: Any, x: Any) -> Any:
    x = (x * xp.uint32(_M16[0])) & xp.uint32(0xFFFF)
    x = x ^ (x >> xp.uint32(7))
    x = (x * xp.uint32(_M16[1])) & xp.uint32(0xFFFF)
    return x ^ (x >> xp.uint32(8))


def _g8(xp: Any, x: Any) -> Any:
    if xp is np:
        return _table(8)[x]
    return _g8_ops(xp, x)


def _g8_ops(xp: Any, x: Any) -> Any:
    x = (x * xp.uint32(_M8[0])) & xp.uint32(0xFF)
    x = x ^ (x >> xp.uint32(4))
    x = (x * xp.uint32(_M8[1])) & xp.uint32(0xFF)
    return x ^ (x >> xp.uint32(3))


@functools.cache
def _table(bits: int) -> np.ndarray:
    """``g16`` (``bits`` 16) or ``g8`` (8) of every value, computed once by its arithmetic
    (in numpy: never a device program, which could wait behind a stuck launch)."""
    x = np.arange(1 << bits, dtype=np.uint32)
    with np.errstate(over='ignore'):
        return (_g16_ops(np, x) if bits == 16 else _g8_ops(np, x)).astype(np.uint32)


def _sum(xp: Any, x: Any, axis: Any = None) -> Any:
    return xp.sum(x, axis=axis, dtype=xp.uint32)


def _direct(xp: Any, hi: Any, lo: Any, k: Any) -> list[Any]:
    """The four lanes (without K1, K2) of halves ``hi``, ``lo`` of words at indices ``k``."""
    c = k * xp.uint32(2) + xp.uint32(1)
    c2 = (k >> xp.uint32(16)) * xp.uint32(2) + xp.uint32(1)
    return [_sum(xp, hi * c), _sum(xp, lo * c), _sum(xp, hi * c2), _sum(xp, lo * c2)]


def _rows(xp: Any, hi: Any, lo: Any) -> list[Any]:
    """`_direct` of halves laid out (R, 2^16) by word index: from row and column sums only.

    sum h (2k+1) = sum_r rows_r * 2^17 r + sum_c cols_c (2c+1), and k >> 16 = r.
    """
    r2 = xp.arange(hi.shape[0], dtype=xp.uint32) * xp.uint32(2)
    c2 = xp.arange(hi.shape[1], dtype=xp.uint32) * xp.uint32(2) + xp.uint32(1)
    out = []
    for h in (hi, lo):
        rows, cols = _sum(xp, h, 1), _sum(xp, h, 0)
        out.append(_sum(xp, rows * (r2 * xp.uint32(_C))) + _sum(xp, cols * c2))
    for h in (hi, lo):
        out.append(_sum(xp, _sum(xp, h, 1) * (r2 + xp.uint32(1))))
    return out


def _halves_of_elements(xp: Any, raw: Any, size: int, e: Any) -> tuple[Any, Any, Any]:
    """1- or 2-byte elements (raw values as uint32) at element indices e: hi, lo, word index."""
    zero = xp.uint32(0)
    if size == 1:
        v = _g8(xp, raw) << ((e & xp.uint32(1)) * xp.uint32(8))
        is_hi, k = ((e >> xp.uint32(1)) & xp.uint32(1)) == 1, e >> xp.uint32(2)
    else:
        v = _g16(xp, raw)
        is_hi, k = (e & xp.uint32(1)) == 1, e >> xp.uint32(1)
    return xp.where(is_hi, v, zero), xp.where(is_hi, zero, v), k


def _flat_lanes(xp: Any, words: list[Any], size: int, start: int) -> Any:
    """Lanes (sets x 4) of a contiguous run of elements starting at element ``start``.

    ``words``: for 1-/2-byte dtypes one flat array of raw element values (uint32),
    else one flat uint32 array per word of the element. The part from the first
    whole row on (``start`` a multiple of the row) goes through `_rows`.
    """
    per_word = {1: 4, 2: 2}.get(size, 1)
    n = words[0].shape[0]
    row = _C * per_word
    fast = (n // row) * row if start % row == 0 else 0
    sets = []
    for w in words:
        lanes = [xp.uint32(0)] * LANES
        if fast:
            base = xp.uint32(start // row)
            m = w[:fast].reshape(fast // row, _C, per_word)
            if size == 1:
                hi = _g8(xp, m[..., 2]) + (_g8(xp, m[..., 3]) << xp.uint32(8))
                lo = _g8(xp, m[..., 0]) + (_g8(xp, m[..., 1]) << xp.uint32(8))
            elif size == 2:
                hi, lo = _g16(xp, m[..., 1]), _g16(xp, m[..., 0])
            else:
                hi, lo = (
                    _g16(xp, m[..., 0] >> xp.uint32(16)),
                    _g16(xp, m[..., 0] & xp.uint32(0xFFFF)),
                )
            if xp is jnp:  # XLA:CPU: materialise the halves once, its plain reductions are fast
                hi, lo = jax.lax.optimization_barrier((hi, lo))
            got = _rows(xp, hi, lo)
            if start:  # rows shifted by base: k = (r + base) * 2^16 + c
                shift = [
                    _sum(xp, hi) * (base * xp.uint32(2 * _C)),
                    _sum(xp, lo) * (base * xp.uint32(2 * _C)),
                    _sum(xp, hi) * (base * xp.uint32(2)),
                    _sum(xp, lo) * (base * xp.uint32(2)),
                ]
                got = [g + s for g, s in zip(got, shift)]
            lanes = got
        if n > fast:
            t = w[fast:]
            e = xp.arange(t.shape[0], dtype=xp.uint32) + xp.uint32((start + fast) & 0xFFFFFFFF)
            if size in (1, 2):
                hi, lo, k = _halves_of_elements(xp, t, size, e)
            else:
                hi, lo, k = _g16(xp, t >> xp.uint32(16)), _g16(xp, t & xp.uint32(0xFFFF)), e
            lanes = [a + b for a, b in zip(lanes, _direct(xp, hi, lo, k))]
        sets.append(
            xp.stack(
                [
                    lanes[0] * xp.uint32(K1),
                    lanes[1] * xp.uint32(K1),
                    lanes[2] * xp.uint32(K2),
                    lanes[3] * xp.uint32(K2),
                ]
            )
        )
    return xp.stack(sets)


# -- numpy ---------------------------------------------------------------------


def _np_words(a: np.ndarray) -> list[np.ndarray]:
    flat = a.reshape(-1)
    size = a.dtype.itemsize
    if size == 1:
        return [flat.view(np.uint8).astype(np.uint32)]
    if size == 2:
        return [flat.view(np.uint16).astype(np.uint32)]
    w = flat.view(np.uint32).reshape(flat.size, size // 4)
    return [np.ascontiguousarray(w[:, p]) for p in range(size // 4)]


def numpy_lanes(
    a: np.ndarray, offsets: Sequence[int] = (), shape: Sequence[int] = ()
) -> np.ndarray:
    """The lanes (sets x 4, uint32) of numpy array ``a``, a block at ``offsets`` of ``shape``.

    With no offsets, ``a`` is the whole leaf. The lanes of a leaf's blocks add
    up (mod 2^32) to the leaf's.
    """
    if not supported(a.dtype):
        raise TypeError(f'no fingerprint defined for dtype {a.dtype}')
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == '>':
        a = a.astype(a.dtype.newbyteorder('<'))
    size = a.dtype.itemsize
    total = np.zeros((lane_sets(a.dtype), LANES), np.uint32)
    if a.size == 0:
        return total
    full = tuple(shape) if shape else a.shape
    offs = tuple(offsets) if offsets else (0,) * a.ndim
    with np.errstate(over='ignore'):
        if a.ndim == 0 or a.shape[1:] == full[1:]:  # contiguous in the leaf: one run
            start = int(np.ravel_multi_index(offs, full)) if a.ndim else 0
            words = _np_words(a)
            for s in range(0, words[0].size, _CHUNK):
                total += _flat_lanes(np, [w[s : s + _CHUNK] for w in words], size, start + s)
            return total
        rows = a.reshape(-1, a.shape[-1])
        lead = np.ndindex(*a.shape[:-1])
        strides = [int(np.prod(full[d + 1 :])) for d in range(len(full))]
        for row, ix in zip(rows, lead):
            base = sum((i + o) * st for i, o, st in zip(ix, offs, strides)) + offs[-1]
            total += _flat_lanes(np, _np_words(row), size, base)
    return total


# -- XLA: one fused program per group of blocks ----------------------------------------
#
# Measured on a TPU v5e chip (docs/SCALE.md): each block is read where it lives, in its own
# shape (no reshape: a TPU relayouts one; no minor dimension of 2: padded to 128 lanes; no
# scatter), its lanes and flags are plain reductions XLA fuses into one pass (f32 at one
# read's speed, bf16 1.2x, int8/fp8 1.7-2.2x). Compiling is what costs there (~0.1 s per
# block in a program, whatever the grouping): blocks of one shape and dtype share a program
# of up to `MAX_GROUP` (their count rounded up to a power of two: few dispatches, programs
# cached for the process across calls and trees), and small whole leaves skip the device:
# one batched copy to the host, then the numpy definition, vectorised (`_numpy_many`).
# Whole leaves on a CPU device keep the row formulation of `_flat_lanes` (faster there).

_U = jnp.uint32
#: Whole leaves up to this many elements are fingerprinted on the host (one batched copy).
SMALL = 1 << 16
#: Flag words after a block's lanes when flags are asked for: holds NaN/Inf, is constant.
FLAGS = 2


def _raw_sets(x: jax.Array) -> list[jax.Array]:
    """The element's raw values (1-/2-byte dtypes) or each of its 32-bit words, as uint32,
    in ``x``'s own shape (no reshape, no minor dimension of 2)."""
    dt = np.dtype(x.dtype)
    if dt == np.bool_:
        return [x.astype(_U)]
    if dt.itemsize == 1:
        return [jax.lax.bitcast_convert_type(x, jnp.uint8).astype(_U)]
    if dt.itemsize == 2:
        return [jax.lax.bitcast_convert_type(x, jnp.uint16).astype(_U)]
    if jnp.issubdtype(dt, jnp.complexfloating):
        return [w for p in (jnp.real(x), jnp.imag(x)) for w in _raw_sets(p)]
    if dt.itemsize == 4:
        return [jax.lax.bitcast_convert_type(x, _U)]
    w = jax.lax.bitcast_convert_type(x, jnp.uint64)  # x64: the low word first
    return [(w & jnp.uint64(0xFFFFFFFF)).astype(_U), (w >> jnp.uint64(32)).astype(_U)]


def _index(shape: tuple[int, ...], offsets: Any, strides: tuple[int, ...]) -> Any:
    """Each element's index in its leaf's C order (mod 2^32), in ``shape`` = (K, *block).

    ``offsets``: the blocks' places in their leaf, (K, ndim) uint32, or None (whole
    leaves); ``strides``: the leaf's C strides (static).
    """
    e: Any = _U(0)
    for d in range(1, len(shape)):
        t = jax.lax.broadcasted_iota(_U, shape, d)
        if offsets is not None:
            t = t + offsets[:, d - 1].reshape((-1,) + (1,) * (len(shape) - 1))
        st = strides[d - 1] & 0xFFFFFFFF
        e = e + (t if st == 1 else t * _U(st))
    return e


def _terms(r: Any, size: int, e: Any) -> list[Any]:
    """The four lane terms (before the sum and K1/K2) of raw values ``r`` at element ``e``."""
    if size == 4:
        hi, lo, k = _g16(jnp, r >> _U(16)), _g16(jnp, r & _U(0xFFFF)), e
    else:
        if size == 1:
            v = _g8(jnp, r) << ((e & _U(1)) * _U(8))
            is_hi, k = (e >> _U(1)) & _U(1), e >> _U(2)
        else:
            v = _g16(jnp, r)
            is_hi, k = e & _U(1), e >> _U(1)
        hi = v * is_hi
        lo = v - hi
    c = k * _U(2) + _U(1)
    c2 = (k >> _U(16)) * _U(2) + _U(1)
    return [hi * c, lo * c, hi * c2, lo * c2]


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _raw_out(
    x: jax.Array, offsets: Any, strides: tuple[int, ...], flags: bool, how: str,
    order: tuple[int, ...] | None = None,
) -> Any:  # fmt: skip
    """`_block_out` by `_raw_lanes`' Pallas kernel (a narrow float's raw bits kept), the
    block read in its stored ``order`` (`_raw_lanes.stored_order`). Jitted inside `_group`:
    its K blocks are traced and lowered once, not K times (a Pallas call takes tenths of a
    second to trace and lower, holding the GIL)."""
    off = _U(0)
    if offsets is not None:
        off = jnp.sum(offsets * jnp.asarray(strides, _U), dtype=_U)
    read = _raw_lanes.plan(x.dtype, tuple(x.shape), offsets is None, order)
    if read is not None and read.order != tuple(range(x.ndim)):  # a bitcast on the device
        x, strides = jnp.transpose(x, read.order), tuple(strides[a] for a in read.order)
    if read is not None and read.shape != tuple(x.shape):  # a bitcast on the device:
        if x.ndim == 1:  # a vector as rows
            strides = (read.shape[1] * strides[0], strides[0])
        else:  # leading axes merged
            strides = tuple(strides[-2:])
        x = x.reshape(read.shape)
    off = jax.lax.bitcast_convert_type(off, jnp.int32).reshape(1)
    w = _raw_lanes.block_words(x, off, strides, flags, interpret=how == 'interpret')
    out = [w[0] * _U(K1), w[1] * _U(K1), w[2] * _U(K2), w[3] * _U(K2)]
    if flags:
        out += [w[4], (w[5] == w[6]).astype(_U)]
    return jnp.stack(out)


def _block_out(
    x: jax.Array, offsets: Any, strides: tuple[int, ...], flags: bool, rows: bool, raw: str = '',
    order: tuple[int, ...] | None = None,
) -> jax.Array:  # fmt: skip
    """One block's results, uint32: its lanes (sets x 4) then, with ``flags``, whether it
    holds NaN/Inf and whether every raw word of it is the same (constant). Reductions of
    one input over all its axes: XLA fuses them into one pass over the block. ``raw``
    (``'tpu'`` or ``'interpret'``): a narrow float read by the Pallas kernel instead, in
    its stored ``order``."""
    if raw:
        return _raw_out(x, offsets, strides, flags, raw, order)
    dt = np.dtype(x.dtype)
    size = dt.itemsize if dt.itemsize <= 2 else 4
    shape = (1, *x.shape)
    axes = tuple(range(1, len(shape)))
    sets = [r.reshape(shape) for r in _raw_sets(x)]
    out = []
    if rows and offsets is None:  # a CPU: the row formulation (`_flat_lanes`), faster there
        out += list(_flat_lanes(jnp, [r.reshape(-1) for r in sets], dt.itemsize, 0).reshape(-1))
    else:
        e = _index(shape, None if offsets is None else offsets.reshape(1, -1), strides)
        for r in sets:
            for term, k in zip(_terms(r, size, e), (K1, K1, K2, K2)):
                out.append(jnp.sum(term, axis=axes, dtype=_U)[0] * _U(k))
    if flags:
        bad = jnp.any(~jnp.isfinite(x)) if jnp.issubdtype(dt, jnp.inexact) else False
        out.append(jnp.asarray(bad).astype(_U))
        same = [jnp.max(r) == jnp.min(r) for r in sets]
        out.append(functools.reduce(jnp.logical_and, same).astype(_U))
    return jnp.stack(out)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _group(
    xs: tuple[jax.Array, ...],
    offsets: Any,
    strides: tuple[int, ...],
    flags: bool,
    rows: bool,
    raw: str = '',
    order: tuple[int, ...] | None = None,
) -> jax.Array:
    """Results (K, sets * 4 [+ FLAGS]) uint32 of K blocks of one shape and dtype in one
    program, each block read once in place (`_block_out`; not stacked: a TPU would copy
    the stack, and a stack of bfloat16 may go through float32 there)."""
    return jnp.stack(
        [_block_out(x, None if offsets is None else offsets[j], strides, flags, rows, raw,
                    order)
         for j, x in enumerate(xs)]
    )  # fmt: skip


# Sub-byte dtypes: numpy keeps a byte per element, a device fewer bits; their
# (small) data is fingerprinted on the host, by the numpy definition.
_SUB_BYTE = frozenset({'int2', 'uint2', 'int4', 'uint4', 'float4_e2m1fn'})


_ON_DEVICE: dict[Any, bool] = {}


def on_device(dtype: Any) -> bool:
    """Whether leaves of ``dtype`` are fingerprinted on their device (else copied to the host)."""
    got = _ON_DEVICE.get(dtype)  # remembered: numpy builds a dtype's name anew each time
    if got is None:
        dt = np.dtype(dtype)
        got = _ON_DEVICE[dtype] = supported(dt) and dt.name not in _SUB_BYTE
    return got


def _device_ok(x: jax.Array) -> bool:
    return on_device(x.dtype)


def bits_lost_on_chip(x: jax.Array) -> bool:
    """Whether ``x``'s devices cannot read its raw bits in a program and the Pallas kernel
    (`_raw_lanes`) does not read its blocks either: a float narrower than 32 bits on a TPU
    that is float16 (or another narrow float than bfloat16 and float8 e4m3fn / e5m2), or
    whose blocks the kernel does not read in their stored order (`_raw_lanes.plan`: a small
    last axis there, or a block of a vector). Measured on a TPU v5e (jax 0.10.2,
    `bench/tpu_bits.py`): XLA's bitcast of bfloat16 to uint16 flushes subnormals and
    rewrites NaN payloads, an identity program rewrites float16 NaNs and float8_e4m3fn's
    negative NaN; a Pallas kernel keeps every bit of bfloat16 and float8; ``np.asarray``
    keeps every byte. Such leaves are read from host copies there (exact, slower:
    docs/API.md 4.2)."""
    dt = np.dtype(x.dtype)
    if dt.itemsize >= 4 or dt.kind not in 'fV' or not jnp.issubdtype(dt, jnp.floating):
        return False
    try:
        key = (dt, tuple(x.shape), x.sharding)
        got = _LOST.get(key)
    except Exception:  # no sharding to ask: not on a chip we know of
        return False
    if got is None:
        got = _LOST.keep(key, _bits_lost(dt, x))
    return got


class _Memo(dict[Any, Any]):
    """Answers that are the same at every call, by (dtype, shape, sharding) or sharding:
    emptied once it holds `LIMIT` (a process that keeps making new shardings)."""

    LIMIT = 4096

    def keep(self, key: Any, value: Any) -> Any:
        if len(self) >= self.LIMIT:
            self.clear()
        self[key] = value
        return value

    def answer(self, key: Any, compute: Any, x: Any) -> Any:
        """The answer kept for ``key``, else ``compute(x)`` kept; not kept where ``key``
        cannot be one (a sharding that is not hashable)."""
        try:
            got = self.get(key)
        except TypeError:
            return compute(x)
        return self.keep(key, compute(x)) if got is None else got


#: `bits_lost_on_chip` by (dtype, shape, sharding).
_LOST = _Memo()


def _bits_lost(dt: np.dtype, x: jax.Array) -> bool:
    try:
        on_tpu = any(getattr(d, 'platform', '') == 'tpu' for d in x.sharding.device_set)
        block = tuple(int(d) for d in x.sharding.shard_shape(x.shape))
    except Exception:  # no sharding to ask: not on a chip we know of
        return False
    small = x.size <= SMALL and block == tuple(x.shape)  # a whole leaf: one host copy
    whole = block == tuple(x.shape)
    if not on_tpu or small:
        return False
    return not _raw_lanes.handles(dt, block, whole, _raw_lanes.stored_order(x))


#: Blocks of one shape and dtype in one program, at most (their count rounded up to a power
#: of two: few programs; `_group` reads them in place).
MAX_GROUP = 16
#: Bytes of one program's blocks, at most.
MAX_GROUP_BYTES = 1 << 30


def _pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(
        int(np.prod(shape[d + 1 :], dtype=np.uint64)) & 0xFFFFFFFF for d in range(len(shape))
    )


def _width(dtype: Any, flags: bool) -> int:
    return lane_sets(dtype) * LANES + (FLAGS if flags else 0)


#: Compiled `_group` programs of this process, by what they were compiled for (device,
#: blocks' shape and dtype, count, static arguments): across calls and trees.
_PROGRAMS: dict[tuple[Any, ...], Any] = {}
#: Programs kept, at most (the oldest are dropped past it).
MAX_PROGRAMS = 512


def _compile(calls: list[tuple[Any, ...]]) -> None:
    """Compiles the programs ``calls`` (key, jitted function, arguments) need that this
    process has not compiled yet, several at once (XLA compiles outside the GIL: on a TPU
    host a program of a group took 0.2-2 s; the first fingerprints of a model's state need
    about ten)."""
    missing: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for key, fn, args in calls:
        if key not in _PROGRAMS and key not in missing:
            missing[key] = (fn, args)

    def build(job: tuple[Any, ...]) -> Any:
        fn, args = job
        try:
            return fn.lower(*args).compile()
        except Exception:
            if fn in _MAY_FAIL:  # its leaves are copied alone
                return None
            raise

    if len(missing) == 1:
        ((key, job),) = missing.items()
        _PROGRAMS[key] = build(job)
    elif missing:
        from concurrent.futures import ThreadPoolExecutor

        workers = max(1, min(len(missing), os.cpu_count() or 1, 16))
        with ThreadPoolExecutor(workers, thread_name_prefix='multihost-compile') as pool:
            for key, program in zip(missing, pool.map(build, missing.values())):
                _PROGRAMS[key] = program
    while len(_PROGRAMS) > MAX_PROGRAMS:
        del _PROGRAMS[next(iter(_PROGRAMS))]


def _group_calls(
    blocks: Sequence[tuple[jax.Array, Sequence[int], Sequence[int]]],
    groups: dict[Any, list[int]],
    flags: bool,
) -> list[tuple[list[int], tuple[Any, ...], tuple[Any, ...]]]:
    """Every group's programs to run, (blocks, program key, arguments): K blocks of one
    shape, dtype and device each."""
    calls = []
    for (device, shape, dtype, full, kind), idx in groups.items():
        nbytes = max(1, int(blocks[idx[0]][0].nbytes))
        most = max(1, min(MAX_GROUP, MAX_GROUP_BYTES // nbytes))
        strides = _c_strides(full if full is not None else shape)
        rows = device.platform == 'cpu'  # XLA:CPU: the row formulation is faster there
        raw, order = '', None
        if device.platform == 'tpu' or _raw_lanes.INTERPRET:  # one layout per group's shape
            order = _raw_lanes.stored_order(blocks[idx[0]][0])
        if _raw_lanes.wanted(device.platform, dtype, shape, full is None, order):
            raw = 'tpu' if device.platform == 'tpu' else 'interpret'
        for lo in range(0, len(idx), most):
            part = idx[lo : lo + most]
            k = _pow2(len(part)) if _pow2(len(part)) <= most else len(part)
            xs = tuple(blocks[i][0] for i in part)
            xs += (xs[0],) * (k - len(part))  # the padding reads the first again: no copy
            offs = None
            if full is not None:
                arr = np.zeros((k, len(shape)), np.uint32)
                for j, i in enumerate(part):
                    arr[j] = np.asarray(blocks[i][1], np.uint64) & 0xFFFFFFFF
                offs = jax.device_put(arr, device)
            key = (device, kind, shape, dtype, k, full is None, strides, flags, rows, raw, order)
            calls.append((part, key, (xs, offs, strides, flags, rows, raw, order)))
    return calls


#: Dtypes whose small leaves a device (not a CPU) packs into one buffer per call, copied to
#: the host at once: a TPU copies each buffer to the host apart (~0.1 ms each, measured on
#: a v5e), and a concatenation keeps these dtypes' bits. Not bfloat16: its concatenation
#: rewrote bits on the v5e (`bench/tpu_fingerprints.py`, exactness) and on XLA:CPU; its 1-D
#: leaves are packed by DMA on a TPU instead (`_raw_lanes.dma_pack`). Others are copied one
#: by one.
PACK_DTYPES = frozenset({'float32', 'int32', 'uint32', 'int8', 'uint8', 'bool'})
#: Pack on a CPU device too (the tests: there a view of each leaf costs nothing).
PACK_ON_CPU = False
#: Small leaves per packing program, at most (a program per list of their shapes: the
#: same tree's come again, cached with the others). A program's compile grows faster than
#: its leaves: on a TPU v5e the first fingerprints of 1,000 small leaves of 1,000 shapes
#: took 4.6 s with 64 (16 programs, compiled at once), 7.1 s with 128, 8.9 s with 256,
#: then 14.3, 11.6 and 11.9 ms (bench/results_tpu_v5e_rows.json).
MAX_PACK = 64


@jax.jit
def _pack(xs: tuple[jax.Array, ...]) -> jax.Array:
    """Small leaves of one dtype, flattened and concatenated (C order: no element moves
    within its leaf)."""
    return jnp.concatenate([x.reshape(-1) for x in xs])


#: 32-bit dtypes whose packed small leaves the device also sums (`_pack_rows`): only the
#: rows' sums come to the host, not the leaves (XLA keeps 32-bit words' bits).
ROW_DTYPES = frozenset({'float32', 'int32', 'uint32'})
#: Words per row of `_pack_rows`.
ROW = 128


@functools.lru_cache(maxsize=64)
def _row_layout(sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leaves of ``sizes`` words, each zero-padded to whole rows of `ROW`: each leaf's first
    row, each row's first word's index in its leaf, and the row's count of words."""
    rows = np.array([-(-n // ROW) for n in sizes], np.int64)
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(rows[:-1], out=starts[1:])
    local = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(starts, rows)
    first = (local * ROW).astype(np.uint32)
    valid = np.minimum(np.repeat(np.array(sizes, np.int64), rows) - local * ROW, ROW)
    return starts, first, valid.astype(np.uint32)


@jax.jit
def _pack_rows(xs: tuple[jax.Array, ...]) -> jax.Array:
    """Small leaves of a 32-bit dtype (`ROW_DTYPES`), each zero-padded to whole rows of
    `ROW` words, concatenated, and summed per row: (rows, 7) uint32, the row's share of the
    four lanes (before K1/K2), whether it holds NaN/Inf, its largest and smallest word.

    The leaves are small (``k < 2^16``: ``c'(k >> 16) = 1``), so a row's share of
    ``sum hi_k * (2k + 1)`` is ``(2 k0 + 1) * sum hi + 2 * sum j * hi`` (``k0`` the row's
    first word's index in its leaf, ``j`` the column), and of ``sum hi_k * c'`` it is
    ``sum hi``; ``g(0) = 0``, so the padding adds nothing (`_row_results` adds up a leaf's
    rows). One program per list of shapes, like `_pack`."""
    sizes = tuple(int(np.prod(x.shape)) for x in xs)
    _, first, valid = _row_layout(sizes)
    parts = []
    for x, n in zip(xs, sizes):
        parts.append(jax.lax.bitcast_convert_type(x.reshape(-1), _U))
        if n % ROW:
            parts.append(jnp.zeros(ROW - n % ROW, _U))
    w = jnp.concatenate(parts).reshape(-1, ROW)
    j = jax.lax.broadcasted_iota(_U, w.shape, 1)
    k0 = jnp.asarray(first).reshape(-1, 1)
    out = []
    for half in (_g16(jnp, w >> _U(16)), _g16(jnp, w & _U(0xFFFF))):
        total = jnp.sum(half, axis=1, dtype=_U, keepdims=True)
        out.append(
            (k0 * _U(2) + _U(1)) * total
            + _U(2) * jnp.sum(half * j, axis=1, dtype=_U, keepdims=True)
        )
        out.append(total)
    out = [out[0], out[2], out[1], out[3]]  # L1 (hi), L2 (lo), L3 (hi), L4 (lo)
    if xs[0].dtype == jnp.float32:  # the exponent all ones (the padding is 0: finite)
        bad = jnp.any((w & _U(0x7FFFFFFF)) >= _U(0x7F800000), axis=1, keepdims=True)
    else:
        bad = jnp.zeros((w.shape[0], 1), bool)
    inside = j < jnp.asarray(valid).reshape(-1, 1)
    out += [bad.astype(_U), jnp.max(jnp.where(inside, w, _U(0)), axis=1, keepdims=True),
            jnp.min(jnp.where(inside, w, _U(0xFFFFFFFF)), axis=1, keepdims=True)]  # fmt: skip
    return jnp.concatenate(out, axis=1)


def _row_results(rows: np.ndarray, sizes: tuple[int, ...], flags: bool) -> list[np.ndarray]:
    """Each leaf's results (lanes, then with ``flags`` holds-NaN/Inf and is-constant) from
    `_pack_rows`' rows: its rows' shares added up (mod 2^32), any row bad, its largest word
    equal to its smallest."""
    starts = _row_layout(sizes)[0]
    with np.errstate(over='ignore'):
        lanes = np.add.reduceat(rows[:, :4], starts, axis=0, dtype=np.uint32)
        lanes *= np.array([K1, K1, K2, K2], np.uint32)
    cols = [lanes]
    if flags:
        bad = np.maximum.reduceat(rows[:, 4], starts)
        same = np.maximum.reduceat(rows[:, 5], starts) == np.minimum.reduceat(rows[:, 6], starts)
        cols += [bad.reshape(-1, 1), same.astype(np.uint32).reshape(-1, 1)]
    return list(np.concatenate(cols, axis=1))


#: Packing programs whose compile may fail (a TPU whose Mosaic lays 1-D buffers out in
#: other tiles): their leaves are then copied one by one.
_MAY_FAIL = (_raw_lanes.dma_pack, _raw_lanes.dma_pack_interpret)


#: `_packer` by (dtype, shape, sharding) and the switches it read; False for none.
_PACKERS = _Memo()


def _packer(x: jax.Array) -> Any:
    """The program that packs small leaf ``x`` with others of its dtype and device:
    `_pack_rows` or `_pack` (`PACK_DTYPES`), `_raw_lanes.dma_pack` (bfloat16's 1-D leaves
    on a TPU), or None (copied to the host alone); remembered per dtype, shape and sharding
    (the same tree's leaves come again)."""
    key = (x.dtype, x.shape, x.sharding, PACK_ON_CPU, _raw_lanes.INTERPRET, PACK_DTYPES)
    return _PACKERS.answer(key, _choose_packer, x) or None


def _choose_packer(x: jax.Array) -> Any:
    if getattr(x.sharding, 'memory_kind', None) not in (None, 'device'):
        return False  # offloaded: no device program takes it with device arrays
    platform = _platform(x)
    if platform == 'cpu' and not PACK_ON_CPU:
        return False
    name = dtype_names(np.dtype(x.dtype))[0]
    if name in PACK_DTYPES:
        return _pack_rows if name in ROW_DTYPES else _pack
    if platform != 'tpu' and not _raw_lanes.INTERPRET:
        return False
    interpret = platform != 'tpu'
    if _raw_lanes.dma_packable(x.dtype, tuple(x.shape)):
        return _raw_lanes.dma_pack_interpret if interpret else _raw_lanes.dma_pack
    return False


def _pack_calls(
    arrays: Sequence[Any],
) -> tuple[list[tuple[list[int], tuple[Any, ...], tuple[Any, ...]]], list[int]]:
    """The packing programs for small leaves ``arrays`` (jax arrays on a device that is not
    a CPU, that `_packer` packs, two or more alike): (their indices, key, arguments), the
    key's first item the program; and the indices of the others (copied one by one)."""
    packs: dict[tuple[Any, ...], list[int]] = {}
    loose: list[int] = []
    for j, x in enumerate(arrays):
        # a leaf whose host copy jax already holds (read before) is read from it
        if isinstance(x, jax.Array) and not has_host_copy(x):
            fn = _packer(x)
            if fn is not None:
                packs.setdefault((fn, x.sharding, x.dtype), []).append(j)
                continue
        loose.append(j)
    calls = []
    for (fn, sharding, dtype), idx in packs.items():
        for lo in range(0, len(idx), MAX_PACK):
            part = idx[lo : lo + MAX_PACK]
            if len(part) < 2:
                loose += part
                continue
            xs = tuple(arrays[j] for j in part)
            key = (fn, sharding, dtype, tuple(x.shape for x in xs))
            calls.append((part, key, (xs,)))
    return calls, loose


def device_results(
    blocks: Sequence[tuple[jax.Array, Sequence[int], Sequence[int]]],
    flags: bool = False,
    ready: Sequence[Any] = (),
) -> list[np.ndarray]:
    """Per block (single-device array, offsets in its leaf, the leaf's shape): uint32
    results, its lanes (sets * 4) then, with ``flags``, holds-NaN/Inf and is-constant.

    Blocks of one shape, dtype and device share one program (`_group`), compiled once per
    process for that shape and a power-of-two count; whole leaves up to `SMALL` elements
    are copied to the host and computed by numpy (`_numpy_many`), on a device other than a
    CPU those of a dtype and device packed into one buffer first (`_pack`: one copy).
    Everything is dispatched before anything is read; the small leaves are copied and
    computed while the programs run, then one batched copy of the programs' results.
    ``ready``: more small whole leaves, on one device each (`_route`) or numpy arrays, their
    results after the blocks'.
    """
    out: list[np.ndarray | None] = [None] * (len(blocks) + len(ready))
    small: list[int] = []
    groups: dict[Any, list[int]] = {}
    blocks = list(blocks)
    for i, (x, o, shape) in enumerate(blocks):
        full = tuple(int(d) for d in shape) if shape else tuple(x.shape)
        whole = not any(o) and full == tuple(x.shape)
        if whole and x.ndim != 1 and x.size > SMALL and _flat_on_cpu(x):
            x = _flat_view(x)  # one program per size and dtype, not per shape
            blocks[i] = (x, (0,), tuple(x.shape))
        if x.size == 0:
            empty = np.zeros(_width(x.dtype, flags), np.uint32)
            empty[-1] = 1 if flags else 0  # constant: nothing differs
            out[i] = empty
        elif whole and x.size <= SMALL:
            small.append(i)
        else:
            key = (next(iter(x.devices())), tuple(x.shape), np.dtype(x.dtype))
            kind = getattr(x.sharding, 'memory_kind', None)  # a program is compiled for it
            groups.setdefault(key + (None if whole else full, kind), []).append(i)

    arrays = [blocks[i][0] for i in small] + list(ready)
    at = small + list(range(len(blocks), len(out)))
    packing, loose = _pack_calls(arrays)
    calls = _group_calls(blocks, groups, flags) if groups else []
    _compile([(key, key[0], args) for _, key, args in packing]
             + [(key, _group, args) for _, key, args in calls])  # fmt: skip
    # The packs first (small, on a device ahead of the groups), each result copied to the
    # host as soon as its program ends (a packing program that did not compile: copies).
    packed = []
    for part, key, args in packing:
        program = _PROGRAMS[key]
        if program is None:
            loose += part
        else:
            packed.append((part, key[0], program(*args)))
    pending = [(part, _PROGRAMS[key](*args[:2])) for part, key, args in calls]
    for result in [r for *_, r in packed] + [r for _, r in pending]:
        result.copy_to_host_async()
    # The loose small leaves are ready (their launches ran): copied while the programs
    # run (a copy of a ready buffer does not queue behind compute).
    host: list[Any] = [None] * len(arrays)
    for j, a in zip(loose, _host_copies([arrays[j] for j in loose])):
        host[j] = a
    summed = _unpack(packed, arrays, host, flags)
    rest = [j for j in range(len(arrays)) if j not in summed]
    for j, res in zip(rest, _numpy_many([host[j] for j in rest], flags)):  # while the groups run
        out[at[j]] = res
    for j, res in summed.items():
        out[at[j]] = res
    got = jax.device_get([lanes for _, lanes in pending]) if pending else []
    for (part, _), res in zip(pending, got):
        for j, i in enumerate(part):
            out[i] = np.asarray(res[j])
    return _every(out)


def _flat_on_cpu(x: jax.Array) -> bool:
    """Whether ``x`` (one device) is in a CPU device's memory, where a 1-D view of it is free."""
    kind = getattr(x.sharding, 'memory_kind', None)
    return _platform(x) == 'cpu' and kind in (None, 'device') and not _raw_lanes.INTERPRET


def _flat_view(x: jax.Array) -> jax.Array:
    """A whole leaf on a CPU device as a 1-D array of the same buffer (numpy's view, put back
    on the device without a copy: jax reads aligned host memory in place). Whole leaves on a
    CPU take the row formulation, which reads them flat anyway: a program per size and dtype
    serves every shape of that size (fewer compiles)."""
    return jax.device_put(np.asarray(x).reshape(-1), next(iter(x.devices())))


def _unpack(
    packed: list[tuple[list[int], Any, jax.Array]], arrays: Sequence[Any], host: list[Any],
    flags: bool,
) -> dict[int, np.ndarray]:  # fmt: skip
    """The packing programs' results on the host: each packed leaf's host copy put in
    ``host`` (from a concatenation or a DMA pack); `_pack_rows`' leaves' results returned
    (their rows' sums, no copy)."""
    summed: dict[int, np.ndarray] = {}
    for part, fn, result in packed:
        flat, pos = np.asarray(result), 0
        if fn is _pack_rows:  # the rows' sums
            sizes = tuple(int(arrays[j].size) for j in part)
            summed.update(zip(part, _row_results(flat, sizes, flags)))
        else:  # one buffer, the leaves one after another
            for j in part:
                n = arrays[j].size
                host[j] = flat[pos : pos + n].reshape(arrays[j].shape)
                pos += n
    return summed


def _every(out: list[np.ndarray | None]) -> list[np.ndarray]:
    """``out`` once every leaf has its result; a leaf without one is a bug in the routing
    above, never an all-zero leaf's lanes (which would call unequal leaves equal)."""
    missing = [i for i, o in enumerate(out) if o is None]
    if missing:
        raise RuntimeError(
            f'multihost fingerprint: no result for leaves {missing[:8]} of {len(out)} '
            "(an internal routing error; please report it with the leaves' shapes and "
            'dtypes, and set MULTIHOST_FINGERPRINT=host to go on meanwhile)'
        )
    return out  # type: ignore[return-value]


def _host_copies(arrays: Sequence[Any]) -> list[np.ndarray]:
    """numpy copies of ready single-device arrays: every copy started, then each taken (jax
    keeps a copy on its array: the next call reads it again); on a CPU device, views; numpy
    arrays as they are."""
    for x in arrays:
        if isinstance(x, jax.Array) and _platform(x) != 'cpu':
            x.copy_to_host_async()
    return [np.asarray(x) for x in arrays]


#: `_platform` by sharding.
_PLATFORMS = _Memo()


def _platform(x: jax.Array) -> str:
    """The platform of a single-device array's device."""
    return str(_PLATFORMS.answer(x.sharding, _first_platform, x.sharding))


def _first_platform(sharding: Any) -> str:
    device: Any = next(iter(sharding.device_set))
    return str(device.platform)


def device_lanes(
    blocks: Sequence[tuple[jax.Array, Sequence[int], Sequence[int]]],
) -> list[np.ndarray]:
    """Lanes (sets x 4, uint32) of single-device arrays, each a block at offsets of a shape
    (`device_results` without flags)."""
    return [r.reshape(-1, LANES) for r in device_results(blocks)]


# -- numpy, many small leaves at once (the same definition, vectorised) -------------------


def _inexact(dt: np.dtype) -> bool:
    """Floating or complex, ml_dtypes' (bfloat16, fp8) included (numpy alone says no)."""
    return bool(jnp.issubdtype(dt, jnp.inexact))


def numpy_flags(a: np.ndarray, constant: bool = True) -> tuple[bool, bool]:
    """(holds NaN/Inf, every element's bytes the same) of a numpy array, as the kernel
    computes them, read in place (``constant=False``: not looked at, False)."""
    flat = a.reshape(-1)
    if not flat.size:
        return False, constant
    bad = bool(_inexact(flat.dtype) and not np.isfinite(flat).all())
    if not constant:
        return bad, False
    size = flat.dtype.itemsize
    raw: np.ndarray = flat.view(f'u{size}') if size in (1, 2, 4, 8) else flat
    if size == 16:  # as rows of bytes
        raw = np.ascontiguousarray(flat).view(np.uint8).reshape(flat.size, size)
    return bad, bool((raw == raw[0]).all())


def _numpy_many(arrays: Sequence[np.ndarray], flags: bool) -> list[np.ndarray]:
    """`device_results` of whole numpy leaves: per dtype, their raw values concatenated (in
    runs of about `_CHUNK` elements), the lane terms in one pass, summed per leaf."""
    out: list[np.ndarray | None] = [None] * len(arrays)
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        if a.dtype.byteorder == '>' or a.size == 0:
            lanes = numpy_lanes(a).reshape(-1)
            tail = np.array(numpy_flags(a), np.uint32) if flags else lanes[:0]
            out[i] = np.concatenate([lanes, tail])
        else:
            by_dtype.setdefault(a.dtype, []).append(i)
    for dt, idx in by_dtype.items():
        run: list[int] = []
        n = 0
        for j, i in enumerate(idx):
            run.append(i)
            n += arrays[i].size
            if n >= _CHUNK or j == len(idx) - 1:
                for i2, res in zip(run, _numpy_run([arrays[k] for k in run], dt, flags)):
                    out[i2] = res
                run, n = [], 0
    return _every(out)


@functools.cache
def _pair_table() -> np.ndarray:
    """``g8`` of both bytes of every 16-bit half: ``g8(h >> 8) << 8 | g8(h & 0xFF)``."""
    h = np.arange(1 << 16, dtype=np.uint32)
    g8 = _table(8)
    return (g8[h >> np.uint32(8)] << np.uint32(8)) | g8[h & np.uint32(0xFF)]


@functools.lru_cache(maxsize=8)
def _word_terms(words: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """For leaves of ``words`` 32-bit words each, concatenated: each leaf's first word, each
    word's ``c(k)`` and ``c'(k >> 16)`` (None where every ``k < 2^16``: all 1). Remembered:
    the same tree's leaves come again."""
    counts = np.array(words, np.int64)
    starts = np.zeros(len(words), np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    k = (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)).astype(np.uint32)
    c = k * np.uint32(2) + np.uint32(1)
    far = None
    if (int(counts.max()) - 1) >> 16:
        far = (k >> np.uint32(16)) * np.uint32(2) + np.uint32(1)
    return starts, c, far


_ZEROS = np.zeros(4, np.uint8)
#: NaN/Inf from raw bits, (mask, least): non-finite iff ``bits & mask >= least``.
_NONFINITE_BITS = {**_raw_lanes.NONFINITE, 'float16': (0x7FFF, 0x7C00)}


def _gathered(table: np.ndarray, w32: np.ndarray) -> np.ndarray:
    """``table`` of both 16-bit halves of every word of ``w32``, interleaved (low half
    first): one `take` of the 16-bit view, in slices of 64 Ki halves past 512 Ki (numpy
    turns the indices into a temporary of 8 bytes each: in slices it stays in cache)."""
    halves = w32.view('<u2')
    if halves.size <= 1 << 19:
        return table.take(halves)
    out = np.empty(halves.size, table.dtype)
    step = 1 << 16
    for i in range(0, halves.size, step):
        np.take(table, halves[i : i + step], out=out[i : i + step])
    return out


def _numpy_run(arrays: list[np.ndarray], dt: np.dtype, flags: bool) -> list[np.ndarray]:
    """`_numpy_many` of non-empty leaves of one dtype, concatenated.

    Elements of up to 4 bytes: each leaf's bytes, zero-padded to whole 32-bit words (the
    definition's packing; ``g(0) = 0``, the padding adds nothing), are read as words; a
    word's halves go through ``g16`` (or ``g8`` per byte) by table, four products and
    sums per word."""
    size = dt.itemsize
    if size > 4:
        return _numpy_run_wide(arrays, dt, flags)
    if size == 4:  # whole words already: one concatenation
        raw = np.concatenate([np.ascontiguousarray(a).reshape(-1).view('<u4') for a in arrays])
        w32, words = raw, tuple(a.size for a in arrays)
    else:
        pieces, counts = [], []
        for a in arrays:
            b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            pieces.append(b)
            if b.size % 4:
                pieces.append(_ZEROS[: 4 - b.size % 4])
            counts.append((b.size + 3) >> 2)
        w32, words = np.concatenate(pieces).view('<u4'), tuple(counts)
    starts, c, far = _word_terms(words) if len(w32) <= 1 << 20 else _word_terms.__wrapped__(words)
    g = _gathered(_pair_table() if size == 1 else _table(16), w32)
    lo, hi = g[0::2], g[1::2]
    terms = [(hi * c, K1), (lo * c, K1)]
    terms += [(hi * far, K2), (lo * far, K2)] if far is not None else [(hi, K2), (lo, K2)]
    cols = [np.add.reduceat(t, starts, dtype=np.uint32) * np.uint32(m) for t, m in terms]
    if flags:
        if size == 4:
            at, flat = starts, raw.view(dt)
        else:
            flat = np.concatenate([a.reshape(-1) for a in arrays])
            at = np.zeros(len(arrays), np.int64)
            np.cumsum([a.size for a in arrays][:-1], out=at[1:])
            raw = flat.view(f'u{size}')
        cols += _flag_cols(flat, [raw], at, dt)
    return list(np.stack(cols, axis=1))


def _flag_cols(flat: np.ndarray, raws: list[np.ndarray], at: np.ndarray, dt: np.dtype) -> list[Any]:
    """Per leaf of ``flat`` (leaves concatenated, leaf ``i`` from ``at[i]``): holds NaN/Inf,
    and constant (each of its raw words ``raws`` the same throughout), as uint32 columns."""
    same = np.ones(len(at), bool)
    for raw in raws:
        same &= np.maximum.reduceat(raw, at) == np.minimum.reduceat(raw, at)
    test = _NONFINITE_BITS.get(dt.name)
    if test is not None:  # the exponent field all ones, from the raw bits (fast for all)
        raw = raws[0]
        bad = np.maximum.reduceat(raw & raw.dtype.type(test[0]), at) >= test[1]
    elif _inexact(dt):
        bad = np.logical_or.reduceat(~np.isfinite(flat), at)
    else:
        bad = np.zeros(len(at), bool)
    return [bad.astype(np.uint32), same.astype(np.uint32)]


def _numpy_run_wide(arrays: list[np.ndarray], dt: np.dtype, flags: bool) -> list[np.ndarray]:
    """`_numpy_run` of 8- and 16-byte elements: a lane set per 32-bit word of the element,
    word ``k`` of a set the element's index."""
    words = tuple(a.size for a in arrays)
    starts, c, far = _word_terms(words) if sum(words) <= 1 << 20 else _word_terms.__wrapped__(words)
    flat = np.concatenate([a.reshape(-1) for a in arrays])  # one copy, then a view per word
    raws = _np_words(flat)
    cols = []
    for r in raws:
        g = _gathered(_table(16), r)
        lo, hi = g[0::2], g[1::2]
        terms = [(hi * c, K1), (lo * c, K1)]
        terms += [(hi * far, K2), (lo * far, K2)] if far is not None else [(hi, K2), (lo, K2)]
        cols += [np.add.reduceat(t, starts, dtype=np.uint32) * np.uint32(m) for t, m in terms]
    if flags:
        cols += _flag_cols(flat, raws, starts, dt)
    return list(np.stack(cols, axis=1))


def _one_device_class(sharding: Any) -> bool:
    return isinstance(sharding, jax.sharding.SingleDeviceSharding)


#: Whether a sharding is a `SingleDeviceSharding`: jax 0.12 says it by a function and
#: deprecates naming the class (named only where that function is missing); jax 0.10 has
#: only the class.
one_device = getattr(jax.sharding, 'is_single_device_sharding', None) or _one_device_class


def _parts(x: jax.Array) -> list[tuple[jax.Array, tuple[int, ...], tuple[int, ...]]]:
    """A fully addressable array's distinct blocks (one replica each) with their offsets."""
    shape = tuple(int(d) for d in x.shape)
    if one_device(x.sharding):  # no Shard objects built
        return [(x, (0,) * x.ndim, shape)]
    shards = x.addressable_shards
    if len(shards) == 1:
        return [(shards[0].data, (0,) * x.ndim, shape)]
    seen: dict[tuple[int, ...], Any] = {}
    for shard in shards:
        start = tuple(int(sl.start or 0) for sl in shard.index) if shard.index else ()
        if start not in seen:
            seen[start] = shard.data
    return [(data, start, shape) for start, data in sorted(seen.items())]


def _to_bytes(lanes: np.ndarray) -> bytes:
    return lanes.astype('<u4', copy=False).tobytes()


def fingerprints(leaves: Sequence[Any]) -> list[bytes]:
    """Each leaf's fingerprint: 16 bytes per lane set (see the module docstring).

    ``jax.Array`` leaves (fully addressable) are fingerprinted on their devices,
    numpy arrays in numpy, with the same definition. A leaf of an unsupported
    dtype raises TypeError (callers keep a byte hash for those).
    """
    return [d for d, _, _ in _kernel_with_flags(leaves, False)]


#: How `_kernel_with_flags` reads a `jax.Array`: a small whole leaf on one device (one host
#: copy among many), its blocks (device programs), host copies one at a time, numpy.
_SMALL_LEAF, _BLOCKS, _COPIED, _NUMPY = range(4)
#: `_route` by (dtype, shape, sharding).
_ROUTES = _Memo()


def _route(x: jax.Array) -> int:
    return int(_ROUTES.answer((x.dtype, x.shape, x.sharding), _choose_route, x))


def _choose_route(x: jax.Array) -> int:
    if not on_device(x.dtype):
        return _NUMPY
    if bits_lost_on_chip(x) or _hostreads.offloaded(x):
        return _COPIED  # host memory, or a narrow float a device program would rewrite
    if one_device(x.sharding) and 0 < x.size <= SMALL:
        return _SMALL_LEAF
    return _BLOCKS


def _kernel_with_flags(leaves: Sequence[Any], flags: bool) -> list[tuple[bytes, bool, bool]]:
    """(fingerprint, holds NaN/Inf, constant) of each leaf (flags False unless asked for)."""
    out: list[tuple[bytes, bool, bool] | None] = [None] * len(leaves)
    blocks: list[tuple[jax.Array, Sequence[int], Sequence[int]]] = []
    owner: list[int] = []
    ready: list[Any] = []  # small whole leaves, one device each, and small numpy ones
    ready_at: list[int] = []
    few: list[tuple[int, np.ndarray]] = []  # small numpy leaves
    copies = _recorder.host_copies_only()  # no device program: host copies (`_hostreads`)
    for i, leaf in enumerate(leaves):
        route = _route(leaf) if isinstance(leaf, jax.Array) else _NUMPY
        if copies and isinstance(leaf, jax.Array):
            out[i] = _copied_with_flags(leaf, flags)
        elif route == _SMALL_LEAF:
            ready.append(leaf)
            ready_at.append(i)
        elif route == _BLOCKS:
            for part in _parts(leaf):
                blocks.append(part)
                owner.append(i)
        elif route == _COPIED:
            jax.block_until_ready(leaf)  # as a device program would wait (not on a stuck job)
            out[i] = _copied_with_flags(leaf, flags)
        else:
            a = np.asarray(leaf)
            if a.size <= SMALL and on_device(a.dtype):  # together, below (`_numpy_many`)
                few.append((i, a))
                continue
            out[i] = (_to_bytes(numpy_lanes(a)), *(numpy_flags(a) if flags else (False, False)))
    ready += [a for _, a in few]  # computed together, while the device programs run
    ready_at += [i for i, _ in few]
    got = device_results(blocks, flags, ready) if blocks or ready else []
    for i, res in zip(ready_at, got[len(blocks) :]):
        out[i] = _answer(res, lane_sets(leaves[i].dtype) * LANES, flags)
    sums: dict[int, list[Any]] = {}
    with np.errstate(over='ignore'):
        for i, res in zip(owner, got):
            n = lane_sets(leaves[i].dtype) * LANES
            prev = sums.get(i)
            if prev is None:
                sums[i] = [res[:n], bool(flags and res[n]), bool(flags and res[n + 1])]
            else:  # a leaf's blocks: lanes add up; any block bad; all constant
                prev[0] = prev[0] + res[:n]
                prev[1] = prev[1] or bool(flags and res[n])
                prev[2] = prev[2] and bool(flags and res[n + 1])
    for i, (lanes, bad, same) in sums.items():
        out[i] = (_to_bytes(lanes), bad, same)
    return [o if o is not None else (b'', False, False) for o in out]


def _answer(res: np.ndarray, n: int, flags: bool) -> tuple[bytes, bool, bool]:
    """A whole leaf's (fingerprint, holds NaN/Inf, constant) from its results row."""
    if flags:
        return _to_bytes(res[:n]), bool(res[n]), bool(res[n + 1])
    return _to_bytes(res[:n]), False, False


def _copied_with_flags(x: jax.Array, flags: bool) -> tuple[bytes, bool, bool]:
    """`device_results`' answer without a device program: the numpy definition over host
    copies of the blocks, one at a time (`_hostreads.blocks`; a block not ready raises
    there); with ``flags``, any block holding NaN/Inf and every block constant."""
    total = np.zeros((lane_sets(x.dtype), LANES), np.uint32)
    bad, same = False, True
    with np.errstate(over='ignore'):
        for block, offsets, shape in _hostreads.blocks(x):
            if block.size:
                total += numpy_lanes(block, offsets, shape)
            if flags:
                b, c = numpy_flags(block)
                bad, same = bad or b, same and c
    return _to_bytes(total), bool(flags and bad), bool(flags and same)


def block_fingerprints(blocks: Sequence[Any]) -> list[bytes]:
    """Fingerprints of blocks as arrays of their own (block-local indices): = `fingerprints`."""
    return fingerprints(blocks)


# -- the host definition (XXH3-128) and the choice per leaf ----------------------

ENV = 'MULTIHOST_FINGERPRINT'
MODES = ('auto', 'device', 'host')
HOST_PREFIX = 'x'  # a host-definition digest: 'x' + 32 hex digits (a kernel one: hex only)


def mode(value: str | None = None) -> str:
    """``auto``, ``device`` or ``host``: ``value``, else ``MULTIHOST_FINGERPRINT`` (default auto).

    Raises:
        ValueError: another value (one line, naming it and the choices).
    """
    raw = os.environ.get(ENV, '') if value is None else value
    got = raw.strip().lower() or 'auto'
    if got not in MODES:
        raise ValueError(
            f'{ENV}={raw!r} is not one of auto, device, host: '
            'unset it (auto: XXH3 for host memory, the kernel on accelerators) or set one of them'
        )
    return got


def is_host_digest(digest: str) -> bool:
    """Whether a hex digest is of the host definition (XXH3), not the kernel's."""
    return digest.startswith(HOST_PREFIX)


def is_kernel_digest(digest: str) -> bool:
    """Whether a hex digest is of the kernel's definition (16 bytes per lane set)."""
    return bool(digest) and len(digest) % 32 == 0 and not is_host_digest(digest)


#: `in_host_memory` by sharding.
_HOST_MEMORY = _Memo()


def _all_cpu(x: jax.Array) -> bool:
    return all(d.platform == 'cpu' for d in x.devices())


def in_host_memory(x: jax.Array) -> bool:
    """Whether every device of ``x`` is a CPU (its shards are read in place)."""
    return bool(_HOST_MEMORY.answer(x.sharding, _all_cpu, x))


def host_kind(leaf: Any, how: str) -> bool:
    """Whether ``leaf`` (numpy or a fully addressable `jax.Array`) takes the host definition."""
    if how == 'host' or (how == 'auto' and type(leaf) is np.ndarray):
        return True
    if how == 'device':
        return False
    return not isinstance(leaf, jax.Array) or in_host_memory(leaf)


def host_view(x: jax.Array) -> np.ndarray | None:
    """A zero-copy numpy view of a single-device array in host memory; else None.

    On a CPU device ``np.asarray`` shares the device buffer (no copy; checked
    in tests/test_fingerprint.py by the buffer address).
    """
    if len(x.addressable_shards) != 1 or not in_host_memory(x):
        return None
    a = np.asarray(x)
    return a if a.flags.c_contiguous else None


_NAMES: dict[tuple[int, str, int], tuple[str, str]] = {}


def dtype_names(dt: np.dtype) -> tuple[str, str]:
    """``(dt.name, str(dt))``, remembered: numpy builds both anew at each use (slow, ~40 us).

    Remembered for numeric and ml_dtypes dtypes only (their type number, byte
    order and size say which dtype it is); others are built each time.
    """
    key = (dt.num, dt.byteorder, dt.itemsize)
    got = _NAMES.get(key)
    if got is None:
        got = (dt.name, str(dt))
        simple = dt.fields is None and dt.subdtype is None
        if simple and (dt.kind in 'biufc' or (dt.kind == 'V' and dt.num >= 256)):
            _NAMES[key] = got
    return got


def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    return (dtype_names(dtype)[0] + repr(tuple(int(d) for d in shape))).encode()


def _update(h: Any, a: np.ndarray) -> None:
    """Hashes ``a``'s bytes in C order, little-endian: in place when they are already so."""
    if a.dtype.byteorder == '>':
        a = a.astype(a.dtype.newbyteorder('<'))
    try:
        h.update(a)  # the array's own buffer (any dtype; C-contiguous only): no copy
    except (BufferError, ValueError):  # not C-contiguous: one copy, in C order
        h.update(np.ascontiguousarray(a))


def _host_parts(x: jax.Array) -> list[np.ndarray]:
    """A host-memory array's bytes in C order as zero-copy pieces (a copy if it must).

    One device, or blocks cut along the first axis only (each a run of the
    leaf's C order), are read in place; other layouts are assembled by
    ``np.asarray`` (one copy). Accelerator data is copied to the host.
    """
    view = host_view(x)
    if view is not None:
        return [view]
    if in_host_memory(x) and x.ndim:
        blocks = _parts(x)
        rest = tuple(int(d) for d in x.shape[1:])
        if all(not any(o[1:]) and tuple(b.shape[1:]) == rest for b, o, _ in blocks):
            views = [np.asarray(b) for b, _, _ in blocks]
            if all(v.flags.c_contiguous for v in views):
                return views
    return [np.asarray(x)]


def host_digest(leaf: Any) -> bytes:
    """The host definition of a leaf (numpy, or a fully addressable `jax.Array`): 16 bytes.

    XXH3-128 of the header (dtype name, shape) and the bytes in C order,
    little-endian: the same for a numpy leaf and a jax.Array of the same values.
    """
    parts = [leaf] if type(leaf) is np.ndarray else None
    if parts is None:
        parts = _host_parts(leaf) if isinstance(leaf, jax.Array) else [np.asarray(leaf)]
    h = xxhash.xxh3_128(_header(parts[0].dtype, getattr(leaf, 'shape', None) or np.shape(leaf)))
    for p in parts:
        _update(h, p)
    return h.digest()


def kernel_digests(leaves: Sequence[Any]) -> list[str]:
    """Hex digests of the kernel definition (`fingerprints`), whatever the mode."""
    return [b.hex() for b in fingerprints(leaves)]


def digests(leaves: Sequence[Any], how: str | None = None) -> list[str]:
    """Each leaf's hex digest by the definition its kind takes (see the module docstring).

    Args:
        leaves: numpy arrays or fully addressable `jax.Array` s of `supported`
            dtypes (PRNG keys as their key data).
        how: ``auto``, ``device`` or ``host``; default `mode` (the environment).

    Returns:
        ``'x' + hex`` (XXH3-128) for a leaf in host memory under ``auto``
        (every leaf under ``host``), else the kernel's hex (every leaf under
        ``device``).
    """
    how = mode(how)
    out: list[str | None] = [None] * len(leaves)
    kernel: list[int] = []
    copies = _recorder.host_copies_only()
    for i, leaf in enumerate(leaves):
        if copies and isinstance(leaf, jax.Array):
            _hostreads.check_ready(leaf)  # named, never waited for
        if host_kind(leaf, how):
            out[i] = HOST_PREFIX + host_digest(leaf).hex()
        else:
            kernel.append(i)
    for i, d in zip(kernel, kernel_digests([leaves[i] for i in kernel])):
        out[i] = d
    return [d or '' for d in out]


def digests_with_flags(
    leaves: Sequence[Any], how: str | None = None, constant: Sequence[bool] | None = None
) -> list[tuple[str, bool, bool]]:
    """`digests` with, per leaf, whether it holds NaN or Inf and whether it is constant.

    Read in the same pass: for kernel-kind leaves on a device the one program per group
    that computes the lanes (`device_results`); for host-kind leaves (XXH3) and numpy
    leaves numpy (`numpy_flags`). Constant: every raw word of the leaf the same (a
    leaf in several blocks: every block constant). ``constant``: per leaf, whether that
    flag is wanted (numpy skips the pass where not; on a device it is fused anyway).
    """
    how = mode(how)
    out: list[tuple[str, bool, bool] | None] = [None] * len(leaves)
    kernel: list[int] = []
    for i, leaf in enumerate(leaves):
        if host_kind(leaf, how):
            a = leaf if isinstance(leaf, np.ndarray) else None
            if a is None and isinstance(leaf, jax.Array):
                parts = _host_parts(leaf)
                a = parts[0] if len(parts) == 1 else np.asarray(leaf)
            a = np.asarray(leaf) if a is None else a
            flags = numpy_flags(a, constant is None or constant[i])
            out[i] = (HOST_PREFIX + host_digest(leaf).hex(), *flags)
        else:
            kernel.append(i)
    got = _kernel_with_flags([leaves[i] for i in kernel], True) if kernel else []
    for i, (d, bad, same) in zip(kernel, got):
        out[i] = (d.hex(), bad, same)
    return [o or ('', False, False) for o in out]
