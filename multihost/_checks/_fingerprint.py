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
from multihost._checks import _hostreads

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
    x = (x * xp.uint32(_M16[0])) & xp.uint32(0xFFFF)
    x = x ^ (x >> xp.uint32(7))
    x = (x * xp.uint32(_M16[1])) & xp.uint32(0xFFFF)
    return x ^ (x >> xp.uint32(8))


def _g8(xp: Any, x: Any) -> Any:
    x = (x * xp.uint32(_M8[0])) & xp.uint32(0xFF)
    x = x ^ (x >> xp.uint32(4))
    x = (x * xp.uint32(_M8[1])) & xp.uint32(0xFF)
    return x ^ (x >> xp.uint32(3))


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
            if xp is jnp:  # materialise the halves once: XLA's plain reductions are fast
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


# -- XLA -------------------------------------------------------------------------


def _jnp_words(x: jax.Array) -> list[jax.Array]:
    """The element's raw values (1-/2-byte dtypes) or 32-bit words, flat, as uint32."""
    dt = np.dtype(x.dtype)
    flat = x.reshape(-1)
    if dt.itemsize in (1, 2):
        if dt == np.bool_:
            return [flat.astype(jnp.uint32)]
        return [
            jax.lax.bitcast_convert_type(
                flat, jnp.uint8 if dt.itemsize == 1 else jnp.uint16
            ).astype(jnp.uint32)
        ]
    if jnp.issubdtype(dt, jnp.complexfloating):
        return [w for p in (jnp.real(flat), jnp.imag(flat)) for w in _jnp_words(p)]
    if dt.itemsize == 4:
        return [jax.lax.bitcast_convert_type(flat, jnp.uint32)]
    w = jax.lax.bitcast_convert_type(flat, jnp.uint32)  # x64: (n, 2), the low word first
    return [w[:, 0], w[:, 1]]


def _block_lanes(x: jax.Array, offsets: jax.Array, strides: jax.Array) -> jax.Array:
    """One block's lanes (sets x 4), element indices global through offsets and strides."""
    size = np.dtype(x.dtype).itemsize
    e = jnp.zeros(x.shape, jnp.uint32)
    for d in range(x.ndim):
        e = e + (jax.lax.broadcasted_iota(jnp.uint32, x.shape, d) + offsets[d]) * strides[d]
    e = e.reshape(-1)
    words = _jnp_words(x)
    sets = []
    for w in words:
        if size in (1, 2):
            hi, lo, k = _halves_of_elements(jnp, w, size, e)
        else:
            hi, lo, k = _g16(jnp, w >> 16), _g16(jnp, w & 0xFFFF), e
        got = _direct(jnp, hi, lo, k)
        sets.append(
            jnp.stack(
                [
                    got[0] * jnp.uint32(K1),
                    got[1] * jnp.uint32(K1),
                    got[2] * jnp.uint32(K2),
                    got[3] * jnp.uint32(K2),
                ]
            )
        )
    return jnp.stack(sets)


@functools.partial(jax.jit, static_argnums=(3,))
def _many(
    blocks: tuple[jax.Array, ...],
    offsets: tuple[jax.Array, ...],
    strides: tuple[jax.Array, ...],
    whole: tuple[bool, ...],
) -> jax.Array:
    """Every block's lanes, concatenated (one program per tree of shapes and dtypes)."""
    out = []
    for x, o, s, w in zip(blocks, offsets, strides, whole):
        if w:
            lanes = _flat_lanes(jnp, _jnp_words(x), np.dtype(x.dtype).itemsize, 0)
        else:
            lanes = _block_lanes(x, o, s)
        out.append(lanes.reshape(-1))
    return jnp.concatenate(out)


# Sub-byte dtypes: numpy keeps a byte per element, a device fewer bits; their
# (small) data is fingerprinted on the host, by the numpy definition.
_SUB_BYTE = frozenset({'int2', 'uint2', 'int4', 'uint4', 'float4_e2m1fn'})


def on_device(dtype: Any) -> bool:
    """Whether leaves of ``dtype`` are fingerprinted on their device (else copied to the host)."""
    dt = np.dtype(dtype)
    return supported(dt) and dt.name not in _SUB_BYTE


def _device_ok(x: jax.Array) -> bool:
    return on_device(x.dtype)


_SMALL = 1 << 16  # elements: whole leaves up to this size are packed together, per dtype class


def _bucket(n: int, least: int) -> int:
    return max(least, 1 << (max(1, n) - 1).bit_length())


@functools.partial(jax.jit, static_argnums=(1,))
def _pack(xs: tuple[jax.Array, ...], total: int) -> tuple[jax.Array, ...]:
    """Small leaves of one dtype class, flat, word by word, concatenated and zero-padded."""
    per_leaf = [_jnp_words(x) for x in xs]
    out = []
    for p in range(len(per_leaf[0])):
        flat = jnp.concatenate([w[p] for w in per_leaf])
        out.append(jnp.pad(flat, (0, total - flat.shape[0])))
    return tuple(out)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _segments(
    words: tuple[jax.Array, ...], seg: jax.Array, e: jax.Array, nseg: int, size: int
) -> jax.Array:
    """Lanes (nseg, sets, 4) of packed leaves: element e of leaf seg (padding: seg = nseg)."""
    sets = []
    for w in words:
        if size in (1, 2):
            hi, lo, k = _halves_of_elements(jnp, w, size, e)
        else:
            hi, lo, k = _g16(jnp, w >> 16), _g16(jnp, w & 0xFFFF), e
        c = k * jnp.uint32(2) + jnp.uint32(1)
        c2 = (k >> 16) * jnp.uint32(2) + jnp.uint32(1)
        terms = jnp.stack([hi * c, lo * c, hi * c2, lo * c2], axis=1)
        sums = jax.ops.segment_sum(terms, seg, num_segments=nseg)
        sets.append(sums * jnp.array([K1, K1, K2, K2], jnp.uint32))
    return jnp.stack(sets, axis=1)


_INDEX_CACHE: dict[Any, tuple[jax.Array, jax.Array]] = {}


def _indices(
    sizes: tuple[int, ...], total: int, nseg: int, device: Any
) -> tuple[jax.Array, jax.Array]:
    """Segment ids and element indices of packed leaves (host-made once per tree of sizes)."""
    key = (sizes, total, nseg, device)
    if key not in _INDEX_CACHE:
        seg = np.full(total, nseg, np.int32)
        e = np.zeros(total, np.uint32)
        pos = 0
        for i, n in enumerate(sizes):
            seg[pos : pos + n] = i
            e[pos : pos + n] = np.arange(n, dtype=np.uint32)
            pos += n
        if len(_INDEX_CACHE) > 32:
            _INDEX_CACHE.clear()
        _INDEX_CACHE[key] = (jax.device_put(seg, device), jax.device_put(e, device))
    return _INDEX_CACHE[key]


def _whole(block: tuple[jax.Array, Sequence[int], Sequence[int]]) -> bool:
    x, o, shape = block
    return not any(o) and (not shape or tuple(shape) == tuple(x.shape))


def device_lanes(
    blocks: Sequence[tuple[jax.Array, Sequence[int], Sequence[int]]],
) -> list[np.ndarray]:
    """Lanes (sets x 4, uint32) of single-device arrays, each a block at offsets of a shape.

    Computed by XLA on each block's device; only the lanes are copied to the
    host. Compiles stay bounded: small whole leaves are packed per device and
    dtype class into buckets of power-of-two lengths (one kernel per bucket);
    larger ones get one program per shape and dtype, reused.
    """
    out: list[np.ndarray | None] = [None] * len(blocks)
    small: dict[Any, list[int]] = {}
    pending: list[tuple[list[int], Any]] = []
    for i, (x, o, shape) in enumerate(blocks):
        if _whole(blocks[i]) and x.size <= _SMALL:
            dt = np.dtype(x.dtype)
            cls = (next(iter(x.devices())), dt.itemsize, lane_sets(dt), dt == np.bool_)
            small.setdefault(cls, []).append(i)
            continue
        device = next(iter(x.devices()))
        full = tuple(shape) if shape else tuple(x.shape)
        st = [int(np.prod(full[d + 1 :], dtype=np.uint64)) & 0xFFFFFFFF for d in range(len(full))]
        oo = list(o) if o else [0] * x.ndim
        offs = jax.device_put(np.array(oo, np.uint32).reshape(x.ndim), device)
        strs = jax.device_put(np.array(st, np.uint32).reshape(x.ndim), device)
        pending.append(([i], _many((x,), (offs,), (strs,), (_whole(blocks[i]),))))
    for (device, size, _, _), idx in small.items():
        sizes = tuple(int(blocks[i][0].size) for i in idx)
        total, nseg = _bucket(sum(sizes), 1024), _bucket(len(idx), 8)
        words = _pack(tuple(blocks[i][0] for i in idx), total)
        seg, e = _indices(sizes, total, nseg, device)
        pending.append((idx, _segments(words, seg, e, nseg, size)))
    for part, lanes in pending:
        flat = np.asarray(jax.device_get(lanes)).reshape(-1)
        pos = 0
        for i in part:
            n = lane_sets(blocks[i][0].dtype) * LANES
            out[i] = flat[pos : pos + n].reshape(-1, LANES)
            pos += n
    return [o if o is not None else np.zeros((1, LANES), np.uint32) for o in out]


def _parts(x: jax.Array) -> list[tuple[jax.Array, tuple[int, ...], tuple[int, ...]]]:
    """A fully addressable array's distinct blocks (one replica each) with their offsets."""
    shape = tuple(int(d) for d in x.shape)
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
    return lanes.astype('<u4').tobytes()


def fingerprints(leaves: Sequence[Any]) -> list[bytes]:
    """Each leaf's fingerprint: 16 bytes per lane set (see the module docstring).

    ``jax.Array`` leaves (fully addressable) are fingerprinted on their devices,
    numpy arrays in numpy, with the same definition. A leaf of an unsupported
    dtype raises TypeError (callers keep a byte hash for those).
    """
    out: list[bytes | None] = [None] * len(leaves)
    blocks: list[tuple[jax.Array, Sequence[int], Sequence[int]]] = []
    owner: list[int] = []
    copies = _recorder.host_copies_only()  # no device program: host copies (`_hostreads`)
    for i, leaf in enumerate(leaves):
        if copies and isinstance(leaf, jax.Array):
            out[i] = _to_bytes(_copied_lanes(leaf))
        elif isinstance(leaf, jax.Array) and _device_ok(leaf):
            if leaf.size == 0:
                out[i] = _to_bytes(np.zeros((lane_sets(leaf.dtype), LANES), np.uint32))
                continue
            for part in _parts(leaf):
                blocks.append(part)
                owner.append(i)
        else:
            out[i] = _to_bytes(numpy_lanes(np.asarray(leaf)))
    sums: dict[int, np.ndarray] = {}
    with np.errstate(over='ignore'):
        for i, lanes in zip(owner, device_lanes(blocks)):
            sums[i] = lanes if i not in sums else sums[i] + lanes
    for i, lanes in sums.items():
        out[i] = _to_bytes(lanes)
    return [b if b is not None else b'' for b in out]


def _copied_lanes(x: jax.Array) -> np.ndarray:
    """`device_lanes`' bytes without a device program: the numpy definition over host copies
    of the blocks, one at a time (`_hostreads.blocks`; a block not ready raises there)."""
    total = np.zeros((lane_sets(x.dtype), LANES), np.uint32)
    with np.errstate(over='ignore'):
        for block, offsets, shape in _hostreads.blocks(x):
            if block.size:
                total += numpy_lanes(block, offsets, shape)
    return total


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


def in_host_memory(x: jax.Array) -> bool:
    """Whether every device of ``x`` is a CPU (its shards are read in place)."""
    return all(d.platform == 'cpu' for d in x.devices())


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
