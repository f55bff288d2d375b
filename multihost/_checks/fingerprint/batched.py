"""The definition computed by numpy for many small leaves at once (`numpy_many`): per dtype,
their raw values concatenated, the lane terms of every word in one pass, summed per leaf.
Equal to `definition.numpy_lanes` and `definition.numpy_flags` leaf by leaf (the tests check
it on raw bits); faster for many leaves (one pass, not one per leaf).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from multihost._checks.fingerprint.definition import (
    CHUNK,
    G8_TABLE,
    G16_TABLE,
    K1,
    K2,
    NONFINITE_BITS,
    inexact,
    numpy_flags,
    numpy_lanes,
)
from multihost._checks.fingerprint.settings import CACHE


def every(out: Sequence[Any], what: str = 'leaves') -> list[Any]:
    """``out`` once every item has its result; an item without one is a bug in the plan,
    never an all-zero leaf's lanes (which would call unequal leaves equal)."""
    missing = [i for i, o in enumerate(out) if o is None]
    if missing:
        raise RuntimeError(
            f'multihost fingerprint: no result for {what} {missing[:8]} of {len(out)} '
            "(an internal routing error; please report it with the leaves' shapes and "
            'dtypes, and set MULTIHOST_FINGERPRINT=host to go on meanwhile)'
        )
    return list(out)


def numpy_many(arrays: Sequence[np.ndarray], flags: bool) -> list[np.ndarray]:
    """Results of whole numpy leaves (`execute.device_results`'s rows: lanes, then with
    ``flags`` holds-NaN/Inf and is-constant): per dtype, their raw values concatenated (in
    runs of about `CHUNK` elements), the lane terms in one pass, summed per leaf."""
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
            if n >= CHUNK or j == len(idx) - 1:
                for i2, res in zip(run, _numpy_run([arrays[k] for k in run], dt, flags)):
                    out[i2] = res
                run, n = [], 0
    return every(out)


with np.errstate(over='ignore'):
    #: ``g8`` of both bytes of every 16-bit half: ``g8(h >> 8) << 8 | g8(h & 0xFF)``.
    G8_PAIR_TABLE = (G8_TABLE[np.arange(1 << 16) >> 8] << np.uint32(8)) | G8_TABLE[
        np.arange(1 << 16) & 0xFF
    ]


def _compute_word_terms(words: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """For leaves of ``words`` 32-bit words each, concatenated: each leaf's first word, each
    word's ``c(k)`` and ``c'(k >> 16)`` (None where every ``k < 2^16``: all 1)."""
    counts = np.array(words, np.int64)
    starts = np.zeros(len(words), np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    k = (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)).astype(np.uint32)
    c = k * np.uint32(2) + np.uint32(1)
    far = None
    if (int(counts.max()) - 1) >> 16:
        far = (k >> np.uint32(16)) * np.uint32(2) + np.uint32(1)
    return starts, c, far


def word_terms(words: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`_compute_word_terms`, kept in `CACHE` for up to 2^20 words (the same tree's leaves
    come again)."""
    if sum(words) > 1 << 20:
        return _compute_word_terms(words)
    return CACHE.get('word_terms', words, _compute_word_terms, words)


_ZEROS = np.zeros(4, np.uint8)


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
    """`numpy_many` of non-empty leaves of one dtype, concatenated.

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
    starts, c, far = word_terms(words)
    g = _gathered(G8_PAIR_TABLE if size == 1 else G16_TABLE, w32)
    lo, hi = g[0::2], g[1::2]
    terms = [(hi * c, K1), (lo * c, K1)]
    terms += [(hi * far, K2), (lo * far, K2)] if far is not None else [(hi, K2), (lo, K2)]
    cols = [np.add.reduceat(t, starts, dtype=np.uint32) * np.uint32(m) for t, m in terms]
    if flags:
        if size == 4:
            first, flat = starts, raw.view(dt)
        else:
            flat = np.concatenate([a.reshape(-1) for a in arrays])
            first = np.zeros(len(arrays), np.int64)
            np.cumsum([a.size for a in arrays][:-1], out=first[1:])
            raw = flat.view(f'u{size}')
        cols += _flag_cols(flat, [raw], first, dt)
    return list(np.stack(cols, axis=1))


def _flag_cols(
    flat: np.ndarray, raws: list[np.ndarray], first: np.ndarray, dt: np.dtype
) -> list[Any]:
    """Per leaf of ``flat`` (leaves concatenated, leaf ``i`` from ``first[i]``): holds NaN/Inf,
    and constant (each of its raw words ``raws`` the same throughout), as uint32 columns."""
    same = np.ones(len(first), bool)
    for raw in raws:
        same &= np.maximum.reduceat(raw, first) == np.minimum.reduceat(raw, first)
    test = NONFINITE_BITS.get(dt.name)
    if test is not None:  # the exponent field all ones, from the raw bits (fast for all)
        raw = raws[0]
        bad = np.maximum.reduceat(raw & raw.dtype.type(test[0]), first) >= test[1]
    elif inexact(dt):
        with np.errstate(invalid='ignore'):  # ml_dtypes before 0.7 warns on a NaN's payload
            bad = np.logical_or.reduceat(~np.isfinite(flat), first)
    else:
        bad = np.zeros(len(first), bool)
    return [bad.astype(np.uint32), same.astype(np.uint32)]


def _numpy_run_wide(arrays: list[np.ndarray], dt: np.dtype, flags: bool) -> list[np.ndarray]:
    """`_numpy_run` of 8- and 16-byte elements: a lane set per 32-bit word of the element,
    word ``k`` of a set the element's index."""
    words = tuple(a.size for a in arrays)
    starts, c, far = word_terms(words)
    flat = np.concatenate([a.reshape(-1) for a in arrays])  # one copy, then a view per word
    raws = _words_of(flat)
    cols = []
    for r in raws:
        g = _gathered(G16_TABLE, r)
        lo, hi = g[0::2], g[1::2]
        terms = [(hi * c, K1), (lo * c, K1)]
        terms += [(hi * far, K2), (lo * far, K2)] if far is not None else [(hi, K2), (lo, K2)]
        cols += [np.add.reduceat(t, starts, dtype=np.uint32) * np.uint32(m) for t, m in terms]
    if flags:
        cols += _flag_cols(flat, raws, starts, dt)
    return list(np.stack(cols, axis=1))


def _words_of(flat: np.ndarray) -> list[np.ndarray]:
    """Each 32-bit word of 8- and 16-byte elements, one array per word of the element."""
    w = flat.view(np.uint32).reshape(flat.size, flat.dtype.itemsize // 4)
    return [np.ascontiguousarray(w[:, p]) for p in range(w.shape[1])]
