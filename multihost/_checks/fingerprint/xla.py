"""The definition computed by XLA programs on a device: one fused program per group of blocks
of one shape and dtype (`group`), each block read once where it lives and in its own shape
(no reshape, which a TPU relays out; no minor dimension of 2, which it pads to 128 lanes; no
scatter), its lanes and flags plain reductions XLA fuses into one pass (`block_out`); a
narrow float on a TPU by the Pallas kernel inside the same program (`pallas_out`); and the
programs that pack small leaves for one copy to the host (`pack_concat`, `pack_rows`).
`bench/tpu_fingerprints.py` measures each against one read of the same data.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from multihost._checks.fingerprint import pallas
from multihost._checks.fingerprint.definition import K1, K2, flat_lanes, g8, g16
from multihost._checks.fingerprint.layout import Read
from multihost._checks.fingerprint.settings import CACHE

U32 = jnp.uint32
#: Flag words after a block's lanes when flags are asked for: holds NaN/Inf, is constant.
FLAGS = 2


def raw_sets(x: jax.Array) -> list[jax.Array]:
    """The element's raw values (1-/2-byte dtypes) or each of its 32-bit words, as uint32,
    in ``x``'s own shape (no reshape, no minor dimension of 2)."""
    dt = np.dtype(x.dtype)
    if dt == np.bool_:
        return [x.astype(U32)]
    if dt.itemsize == 1:
        return [jax.lax.bitcast_convert_type(x, jnp.uint8).astype(U32)]
    if dt.itemsize == 2:
        return [jax.lax.bitcast_convert_type(x, jnp.uint16).astype(U32)]
    if jnp.issubdtype(dt, jnp.complexfloating):
        return [w for p in (jnp.real(x), jnp.imag(x)) for w in raw_sets(p)]
    if dt.itemsize == 4:
        return [jax.lax.bitcast_convert_type(x, U32)]
    w = jax.lax.bitcast_convert_type(x, jnp.uint64)  # x64: the low word first
    return [(w & jnp.uint64(0xFFFFFFFF)).astype(U32), (w >> jnp.uint64(32)).astype(U32)]


def element_index(shape: tuple[int, ...], offsets: Any, strides: tuple[int, ...]) -> Any:
    """Each element's index in its leaf's C order (mod 2^32), in ``shape`` = (K, *block).

    ``offsets``: the blocks' places in their leaf, (K, ndim) uint32, or None (whole
    leaves); ``strides``: the leaf's C strides (static).
    """
    e: Any = U32(0)
    for d in range(1, len(shape)):
        t = jax.lax.broadcasted_iota(U32, shape, d)
        if offsets is not None:
            t = t + offsets[:, d - 1].reshape((-1,) + (1,) * (len(shape) - 1))
        st = strides[d - 1] & 0xFFFFFFFF
        e = e + (t if st == 1 else t * U32(st))
    return e


def terms(r: Any, size: int, e: Any) -> list[Any]:
    """The four lane terms (before the sum and K1/K2) of raw values ``r`` at element ``e``."""
    if size == 4:
        hi, lo, k = g16(jnp, r >> U32(16)), g16(jnp, r & U32(0xFFFF)), e
    else:
        if size == 1:
            v = g8(jnp, r) << ((e & U32(1)) * U32(8))
            is_hi, k = (e >> U32(1)) & U32(1), e >> U32(2)
        else:
            v = g16(jnp, r)
            is_hi, k = e & U32(1), e >> U32(1)
        hi = v * is_hi
        lo = v - hi
    c = k * U32(2) + U32(1)
    c2 = (k >> U32(16)) * U32(2) + U32(1)
    return [hi * c, lo * c, hi * c2, lo * c2]


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def pallas_out(
    x: jax.Array, offsets: Any, strides: tuple[int, ...], flags: bool, interpret: bool,
    read: Read,
) -> Any:  # fmt: skip
    """`block_out` by the Pallas kernel (`pallas.block_words`: a narrow float's raw bits
    kept), the block read as the plan says (``read``: transposed to its stored order, then in
    that shape; both bitcasts on a TPU). Jitted inside `group`: its K blocks are traced and
    lowered once, not K times (a Pallas call takes tenths of a second to trace and lower,
    holding the GIL)."""
    off = U32(0)
    if offsets is not None:
        off = jnp.sum(offsets * jnp.asarray(strides, U32), dtype=U32)
    if read.order != tuple(range(x.ndim)):
        x, strides = jnp.transpose(x, read.order), tuple(strides[a] for a in read.order)
    if read.shape != tuple(x.shape):
        if x.ndim == 1:  # a vector as rows
            strides = (read.shape[1] * strides[0], strides[0])
        else:  # leading axes merged
            strides = tuple(strides[-2:])
        x = x.reshape(read.shape)
    off = jax.lax.bitcast_convert_type(off, jnp.int32).reshape(1)
    w = pallas.block_words(x, off, strides, flags, interpret=interpret)
    out = [w[0] * U32(K1), w[1] * U32(K1), w[2] * U32(K2), w[3] * U32(K2)]
    if flags:
        out += [w[4], (w[5] == w[6]).astype(U32)]
    return jnp.stack(out)


def block_out(
    x: jax.Array, offsets: Any, strides: tuple[int, ...], flags: bool, rows: bool,
    interpret: bool = False, read: Read | None = None,
) -> jax.Array:  # fmt: skip
    """One block's results, uint32: its lanes (sets x 4) then, with ``flags``, whether it
    holds NaN/Inf and whether every raw word of it is the same (constant). Reductions of
    one input over all its axes: XLA fuses them into one pass over the block. ``rows``
    (whole leaves on a CPU): the row formulation of `definition.flat_lanes`, faster there.
    ``read``: the block is read by the Pallas kernel instead, in that layout."""
    if read is not None:
        return pallas_out(x, offsets, strides, flags, interpret, read)
    dt = np.dtype(x.dtype)
    size = dt.itemsize if dt.itemsize <= 2 else 4
    shape = (1, *x.shape)
    axes = tuple(range(1, len(shape)))
    sets = [r.reshape(shape) for r in raw_sets(x)]
    out = []
    if rows and offsets is None:
        out += list(flat_lanes(jnp, [r.reshape(-1) for r in sets], dt.itemsize, 0).reshape(-1))
    else:
        e = element_index(shape, None if offsets is None else offsets.reshape(1, -1), strides)
        for r in sets:
            for term, k in zip(terms(r, size, e), (K1, K1, K2, K2)):
                out.append(jnp.sum(term, axis=axes, dtype=U32)[0] * U32(k))
    if flags:
        bad = jnp.any(~jnp.isfinite(x)) if jnp.issubdtype(dt, jnp.inexact) else False
        out.append(jnp.asarray(bad).astype(U32))
        same = [jnp.max(r) == jnp.min(r) for r in sets]
        out.append(functools.reduce(jnp.logical_and, same).astype(U32))
    return jnp.stack(out)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def group(
    xs: tuple[jax.Array, ...],
    offsets: Any,
    strides: tuple[int, ...],
    flags: bool,
    rows: bool,
    interpret: bool = False,
    read: Read | None = None,
) -> jax.Array:
    """Results (K, sets * 4 [+ FLAGS]) uint32 of K blocks of one shape and dtype in one
    program, each block read once in place (`block_out`; not stacked: a TPU would copy
    the stack, and a stack of bfloat16 may go through float32 there)."""
    return jnp.stack(
        [block_out(x, None if offsets is None else offsets[j], strides, flags, rows, interpret,
                   read)
         for j, x in enumerate(xs)]
    )  # fmt: skip


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Each axis's stride in C order (mod 2^32)."""
    return tuple(
        int(np.prod(shape[d + 1 :], dtype=np.uint64)) & 0xFFFFFFFF for d in range(len(shape))
    )


# -- small leaves packed on their device, one copy to the host -----------------------------


@jax.jit
def pack_concat(xs: tuple[jax.Array, ...]) -> jax.Array:
    """Small leaves of one dtype, flattened and concatenated (C order: no element moves
    within its leaf)."""
    return jnp.concatenate([x.reshape(-1) for x in xs])


#: 32-bit dtypes whose packed small leaves the device also sums (`pack_rows`): only the
#: rows' sums come to the host, not the leaves (XLA keeps 32-bit words' bits).
ROW_DTYPES = frozenset({'float32', 'int32', 'uint32'})
#: Words per row of `_pack_rows`.
ROW = 128


def _compute_row_layout(sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leaves of ``sizes`` words, each zero-padded to whole rows of `ROW`: each leaf's first
    row, each row's first word's index in its leaf, and the row's count of words."""
    rows = np.array([-(-n // ROW) for n in sizes], np.int64)
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(rows[:-1], out=starts[1:])
    local = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(starts, rows)
    first = (local * ROW).astype(np.uint32)
    valid = np.minimum(np.repeat(np.array(sizes, np.int64), rows) - local * ROW, ROW)
    return starts, first, valid.astype(np.uint32)


def row_layout(sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_compute_row_layout`, kept in `CACHE` (the same tree's leaves come again)."""
    return CACHE.get('row_layout', sizes, _compute_row_layout, sizes)


@jax.jit
def pack_rows(xs: tuple[jax.Array, ...]) -> jax.Array:
    """Small leaves of a 32-bit dtype (`ROW_DTYPES`), each zero-padded to whole rows of
    `ROW` words, concatenated, and summed per row: (rows, 7) uint32, the row's share of the
    four lanes (before K1/K2), whether it holds NaN/Inf, its largest and smallest word.

    The leaves are small (``k < 2^16``: ``c'(k >> 16) = 1``), so a row's share of
    ``sum hi_k * (2k + 1)`` is ``(2 k0 + 1) * sum hi + 2 * sum j * hi`` (``k0`` the row's
    first word's index in its leaf, ``j`` the column), and of ``sum hi_k * c'`` it is
    ``sum hi``; ``g(0) = 0``, so the padding adds nothing (`row_results` adds up a leaf's
    rows). One program per list of shapes, like `pack_concat`."""
    sizes = tuple(int(np.prod(x.shape)) for x in xs)
    _, first, valid = row_layout(sizes)
    parts = []
    for x, n in zip(xs, sizes):
        parts.append(jax.lax.bitcast_convert_type(x.reshape(-1), U32))
        if n % ROW:
            parts.append(jnp.zeros(ROW - n % ROW, U32))
    w = jnp.concatenate(parts).reshape(-1, ROW)
    j = jax.lax.broadcasted_iota(U32, w.shape, 1)
    k0 = jnp.asarray(first).reshape(-1, 1)
    out = []
    for half in (g16(jnp, w >> U32(16)), g16(jnp, w & U32(0xFFFF))):
        total = jnp.sum(half, axis=1, dtype=U32, keepdims=True)
        out.append(
            (k0 * U32(2) + U32(1)) * total
            + U32(2) * jnp.sum(half * j, axis=1, dtype=U32, keepdims=True)
        )
        out.append(total)
    out = [out[0], out[2], out[1], out[3]]  # L1 (hi), L2 (lo), L3 (hi), L4 (lo)
    if xs[0].dtype == jnp.float32:  # the exponent all ones (the padding is 0: finite)
        bad = jnp.any((w & U32(0x7FFFFFFF)) >= U32(0x7F800000), axis=1, keepdims=True)
    else:
        bad = jnp.zeros((w.shape[0], 1), bool)
    inside = j < jnp.asarray(valid).reshape(-1, 1)
    out += [bad.astype(U32), jnp.max(jnp.where(inside, w, U32(0)), axis=1, keepdims=True),
            jnp.min(jnp.where(inside, w, U32(0xFFFFFFFF)), axis=1, keepdims=True)]  # fmt: skip
    return jnp.concatenate(out, axis=1)


def row_results(rows: np.ndarray, sizes: tuple[int, ...], flags: bool) -> list[np.ndarray]:
    """Each leaf's results (lanes, then with ``flags`` holds-NaN/Inf and is-constant) from
    `pack_rows`' rows: its rows' shares added up (mod 2^32), any row bad, its largest word
    equal to its smallest."""
    starts = row_layout(sizes)[0]
    with np.errstate(over='ignore'):
        lanes = np.add.reduceat(rows[:, :4], starts, axis=0, dtype=np.uint32)
        lanes *= np.array([K1, K1, K2, K2], np.uint32)
    cols = [lanes]
    if flags:
        bad = np.maximum.reduceat(rows[:, 4], starts)
        same = np.maximum.reduceat(rows[:, 5], starts) == np.minimum.reduceat(rows[:, 6], starts)
        cols += [bad.reshape(-1, 1), same.astype(np.uint32).reshape(-1, 1)]
    return list(np.concatenate(cols, axis=1))
