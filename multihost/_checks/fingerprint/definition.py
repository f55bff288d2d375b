"""The kernel's definition of a leaf's fingerprint, and numpy's computation of it: the
reference every other way of computing it (`xla`, `pallas`, `batched`) is tested against.

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

Computed here by `numpy_lanes` (any block, with its offsets in its leaf) and `numpy_flags`
(the NaN/Inf and constant flags read beside the lanes); `flat_lanes` is the arithmetic of one
run of elements for numpy and jax.numpy alike (XLA:CPU runs it on whole leaves).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from multihost._checks.fingerprint.settings import CACHE

K1 = 0x9E3779B1
K2 = 0x85EBCA77
#: Odd multipliers of ``g16`` (bijective mod 2^16) and of ``g8`` (mod 2^8).
G16_MULTIPLIERS = (0x9E37, 0x5BD1)
G8_MULTIPLIERS = (0x9D, 0x6B)
#: numpy: elements per step (bounds temporaries).
CHUNK = 1 << 22
#: uint32 lanes per lane set.
LANES = 4
#: Words per row of `flat_lanes`' row formulation: row r holds words k with k >> 16 == r.
ROW_WORDS = 1 << 16
#: NaN/Inf from raw bits, (mask, least): non-finite iff ``bits & mask >= least`` (the sign
#: dropped, the exponent field all ones).
NONFINITE_BITS = {
    'bfloat16': (0x7FFF, 0x7F80),
    'float16': (0x7FFF, 0x7C00),
    'float8_e4m3fn': (0x7F, 0x7F),
    'float8_e5m2': (0x7F, 0x7C),
    'float32': (0x7FFFFFFF, 0x7F800000),
}


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


def g16_ops(xp: Any, x: Any) -> Any:
    """``g16``, the bijection of a 16-bit half, by its arithmetic."""
    x = (x * xp.uint32(G16_MULTIPLIERS[0])) & xp.uint32(0xFFFF)
    x = x ^ (x >> xp.uint32(7))
    x = (x * xp.uint32(G16_MULTIPLIERS[1])) & xp.uint32(0xFFFF)
    return x ^ (x >> xp.uint32(8))


def g8_ops(xp: Any, x: Any) -> Any:
    """``g8``, the bijection of a byte, by its arithmetic."""
    x = (x * xp.uint32(G8_MULTIPLIERS[0])) & xp.uint32(0xFF)
    x = x ^ (x >> xp.uint32(4))
    x = (x * xp.uint32(G8_MULTIPLIERS[1])) & xp.uint32(0xFF)
    return x ^ (x >> xp.uint32(3))


with np.errstate(over='ignore'):
    #: ``g16`` and ``g8`` of every value (numpy gathers from them: one pass, not eight).
    G16_TABLE = g16_ops(np, np.arange(1 << 16, dtype=np.uint32)).astype(np.uint32)
    G8_TABLE = g8_ops(np, np.arange(1 << 8, dtype=np.uint32)).astype(np.uint32)


def g16(xp: Any, x: Any) -> Any:
    return G16_TABLE[x] if xp is np else g16_ops(xp, x)


def g8(xp: Any, x: Any) -> Any:
    return G8_TABLE[x] if xp is np else g8_ops(xp, x)


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
        out.append(_sum(xp, rows * (r2 * xp.uint32(ROW_WORDS))) + _sum(xp, cols * c2))
    for h in (hi, lo):
        out.append(_sum(xp, _sum(xp, h, 1) * (r2 + xp.uint32(1))))
    return out


def rows_lanes(xp: Any, hi: Any, lo: Any, base: Any = None) -> list[Any]:
    """The four lanes (without K1, K2) of bijected halves laid out (R, 2^16) by word index,
    the first row being row ``base`` of the leaf (None: row 0; a traced value in a program
    that serves every row, `words`): `_rows`, then each row's index shifted by ``base``
    (``k = (r + base) * 2^16 + c``)."""
    if xp is jnp:  # XLA:CPU: materialise the halves once, its plain reductions are fast
        hi, lo = jax.lax.optimization_barrier((hi, lo))
    got = _rows(xp, hi, lo)
    if base is None:
        return got
    shift = [
        _sum(xp, hi) * (base * xp.uint32(2 * ROW_WORDS)),
        _sum(xp, lo) * (base * xp.uint32(2 * ROW_WORDS)),
        _sum(xp, hi) * (base * xp.uint32(2)),
        _sum(xp, lo) * (base * xp.uint32(2)),
    ]
    return [g + s for g, s in zip(got, shift)]


def _halves_of_elements(xp: Any, raw: Any, size: int, e: Any) -> tuple[Any, Any, Any]:
    """1- or 2-byte elements (raw values as uint32) at element indices e: hi, lo, word index."""
    zero = xp.uint32(0)
    if size == 1:
        v = g8(xp, raw) << ((e & xp.uint32(1)) * xp.uint32(8))
        is_hi, k = ((e >> xp.uint32(1)) & xp.uint32(1)) == 1, e >> xp.uint32(2)
    else:
        v = g16(xp, raw)
        is_hi, k = (e & xp.uint32(1)) == 1, e >> xp.uint32(1)
    return xp.where(is_hi, v, zero), xp.where(is_hi, zero, v), k


def flat_lanes(xp: Any, words: list[Any], size: int, start: int) -> Any:
    """Lanes (sets x 4) of a contiguous run of elements starting at element ``start``.

    ``words``: for 1-/2-byte dtypes one flat array of raw element values (uint32),
    else one flat uint32 array per word of the element. The part from the first
    whole row on (``start`` a multiple of the row) goes through `_rows`.
    """
    per_word = {1: 4, 2: 2}.get(size, 1)
    n = words[0].shape[0]
    row = ROW_WORDS * per_word
    fast = (n // row) * row if start % row == 0 else 0
    sets = []
    for w in words:
        lanes = [xp.uint32(0)] * LANES
        if fast:
            base = xp.uint32(start // row)
            m = w[:fast].reshape(fast // row, ROW_WORDS, per_word)
            if size == 1:
                hi = g8(xp, m[..., 2]) + (g8(xp, m[..., 3]) << xp.uint32(8))
                lo = g8(xp, m[..., 0]) + (g8(xp, m[..., 1]) << xp.uint32(8))
            elif size == 2:
                hi, lo = g16(xp, m[..., 1]), g16(xp, m[..., 0])
            else:
                hi, lo = (
                    g16(xp, m[..., 0] >> xp.uint32(16)),
                    g16(xp, m[..., 0] & xp.uint32(0xFFFF)),
                )
            lanes = rows_lanes(xp, hi, lo, base if start else None)
        if n > fast:
            t = w[fast:]
            e = xp.arange(t.shape[0], dtype=xp.uint32) + xp.uint32((start + fast) & 0xFFFFFFFF)
            if size in (1, 2):
                hi, lo, k = _halves_of_elements(xp, t, size, e)
            else:
                hi, lo, k = g16(xp, t >> xp.uint32(16)), g16(xp, t & xp.uint32(0xFFFF)), e
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
            for s in range(0, words[0].size, CHUNK):
                total += flat_lanes(np, [w[s : s + CHUNK] for w in words], size, start + s)
            return total
        rows = a.reshape(-1, a.shape[-1])
        lead = np.ndindex(*a.shape[:-1])
        strides = [int(np.prod(full[d + 1 :])) for d in range(len(full))]
        for row, ix in zip(rows, lead):
            base = sum((i + o) * st for i, o, st in zip(ix, offs, strides)) + offs[-1]
            total += flat_lanes(np, _np_words(row), size, base)
    return total


def inexact(dt: np.dtype) -> bool:
    """Floating or complex, ml_dtypes' (bfloat16, fp8) included (numpy alone says no)."""
    return bool(jnp.issubdtype(dt, jnp.inexact))


#: Elements per step of `nonfinite_bits` (its buffer stays in the CPU's cache).
FLAG_CHUNK = 1 << 18


def nonfinite_bits(raw: np.ndarray, mask: int, least: int) -> bool:
    """Whether any of ``raw`` (a float's bits as unsigned integers, native order) has
    ``bits & mask >= least`` (`NONFINITE_BITS`): in steps of `FLAG_CHUNK` into one buffer,
    no temporary of the array's size (ml_dtypes' ``isfinite`` of bfloat16 took 6x as long)."""
    m = raw.dtype.type(mask)
    if raw.size <= FLAG_CHUNK:  # one step: no buffer to keep
        return int(np.bitwise_and(raw, m).max()) >= least
    buf = np.empty(FLAG_CHUNK, raw.dtype)
    for s in range(0, raw.size, FLAG_CHUNK):
        part = raw[s : s + FLAG_CHUNK]
        got = np.bitwise_and(part, m, out=buf[: part.size])
        if int(got.max()) >= least:
            return True
    return False


#: The unsigned integer dtype of each width a raw view takes.
_UNSIGNED: dict[int, np.dtype[Any]] = {n: np.dtype(f'u{n}') for n in (1, 2, 4, 8)}


def nonfinite_bits_of(dt: Any) -> tuple[int, int] | None:
    """`NONFINITE_BITS` of ``dt`` (None: no such float), kept in `CACHE` by dtype (numpy
    builds ``dt.name`` anew at each use: slow for every small leaf)."""
    return CACHE.get('nonfinite_bits', dt, lambda: NONFINITE_BITS.get(np.dtype(dt).name))


def numpy_flags(a: np.ndarray, constant: bool = True) -> tuple[bool, bool]:
    """(holds NaN/Inf, every element's bytes the same) of a numpy array, as the kernel
    computes them, read in place (``constant=False``: not looked at, False).

    Floats narrower than 4 bytes are read as raw bits (`nonfinite_bits`; ``isfinite`` of
    bfloat16 and float16 took 6-8x as long), the others by ``isfinite``; constancy of
    1- and 2-byte elements from their largest and smallest raw value, of wider ones by
    equality with the first (`bench/flags.py` times each against the other)."""
    flat = a.reshape(-1)
    if not flat.size:
        return False, constant
    size = flat.dtype.itemsize
    raw = flat.view(_UNSIGNED[size]) if size in _UNSIGNED else None  # (either byte order)
    bits = nonfinite_bits_of(flat.dtype) if size <= 2 else None
    if bits is not None and raw is not None and flat.dtype.byteorder != '>':
        bad = nonfinite_bits(raw, *bits)
    else:
        with np.errstate(invalid='ignore'):  # ml_dtypes before 0.7 warns on a NaN's payload
            bad = bool(inexact(flat.dtype) and not np.isfinite(flat).all())
    if not constant:
        return bad, False
    if raw is not None and size <= 2:  # two passes, no temporary
        return bad, bool(raw.max() == raw.min())
    if raw is not None:
        return bad, bool((raw == raw[0]).all())
    rows = np.ascontiguousarray(flat).view(np.uint8).reshape(flat.size, size)  # 16 bytes
    return bad, bool((rows == rows[0]).all())


def to_bytes(lanes: np.ndarray) -> bytes:
    """A fingerprint's bytes: its lanes as little-endian uint32."""
    return lanes.astype('<u4', copy=False).tobytes()
