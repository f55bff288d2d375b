"""Whole leaves of 2- and 4-byte dtypes on a CPU device: their 32-bit words read in chunks
of `CONFIG.cpu_chunk_words` by one program (`chunk_out`), the words after the last whole
chunk by numpy.

Why one program. XLA:CPU takes 0.2-0.5 s to compile one of `xla.group`'s programs, and a
program per leaf size made the first fingerprints of a flax state (586 leaves, 6 sizes of 2
dtypes) compile 6-7 of them: 2.4-5.9 s on a 2-core machine. Here the program depends on
nothing but whether flags are asked for: the first call compiles one.

Why it is the definition. For a 2- or 4-byte dtype the lanes are a function of the leaf's
32-bit little-endian words alone: word ``k`` holds elements ``2k`` (the low half) and
``2k + 1`` (the high half) of a 2-byte dtype, one element of a 4-byte one, and the lanes are
``sum g16(hi_k) * c(k)`` and so on (`definition`). So a chunk's lanes are
`definition.flat_lanes`' row formulation of its words, its rows shifted by the chunk's first
row (given at run time, `where[0]`), and a leaf's lanes are its chunks' plus its tail's
(`definition.numpy_lanes` at the tail's offset). The flags depend on the dtype: the program
reads both 16-bit halves of every word, the dtype's NaN/Inf exponent mask for each half given
at run time (`_masks`), and returns whether every word is the first, and the first word;
the host combines them with the tail's (`combine`).

A CPU device's memory is the host's: a chunk is a numpy view of the leaf put back on its
device (aligned: no copy).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from multihost._checks.fingerprint.definition import (
    K1,
    K2,
    ROW_WORDS,
    g16,
    nonfinite_bits_of,
    numpy_flags,
    numpy_lanes,
    rows_lanes,
    supported,
)
from multihost._checks.fingerprint.settings import CONFIG

U32 = jnp.uint32
#: Results of a chunk without flags (its lanes, K1/K2 applied), and with them (then: holds
#: NaN/Inf, every word the same, its first word).
LANES_ONLY, WITH_FLAGS = 4, 7


def takes(dtype: Any) -> bool:
    """Whether whole leaves of ``dtype`` on a CPU device are read here (2- and 4-byte numeric
    dtypes: float32, bfloat16, float16, int32, uint32, int16, uint16)."""
    dt = np.dtype(dtype)
    return supported(dt) and dt.itemsize in (2, 4) and dt.kind != 'c'


@functools.partial(jax.jit, static_argnums=(2,))
def chunk_out(w: jax.Array, where: jax.Array, flags: bool) -> jax.Array:
    """The results of one chunk of words ``w`` (uint32, a whole number of `ROW_WORDS` rows),
    ``where`` = (its first row in the leaf, the high half's NaN mask, the low half's)."""
    m = w.reshape(-1, ROW_WORDS)
    hi, lo = m >> U32(16), m & U32(0xFFFF)
    lanes = rows_lanes(jnp, g16(jnp, hi), g16(jnp, lo), where[0])
    out = [lanes[0] * U32(K1), lanes[1] * U32(K1), lanes[2] * U32(K2), lanes[3] * U32(K2)]
    if flags:  # two reductions: any half non-finite; every word the first
        mh, ml = where[1], where[2]
        odd = (((hi & mh) == mh) & (mh != U32(0))) | (((lo & ml) == ml) & (ml != U32(0)))
        out += [jnp.any(odd).astype(U32), jnp.all(w == w[0]).astype(U32), w[0]]
    return jnp.stack(out)


#: A sharding of one device: jax 0.12 makes it by a function and deprecates naming the class;
#: jax 0.10 has only the class (named only where the function is missing).
one_device_sharding = (
    getattr(jax.sharding, 'make_single_device_sharding', None) or jax.sharding.SingleDeviceSharding
)


def shapes(device: Any, flags: bool) -> tuple[Any, ...]:
    """What `chunk_out` is compiled for on ``device`` (`execute._compile`)."""
    sharding = one_device_sharding(device)
    n = CONFIG.cpu_chunk_words
    return (
        jax.ShapeDtypeStruct((n,), U32, sharding=sharding),
        jax.ShapeDtypeStruct((3,), U32, sharding=sharding),
        flags,
    )


@dataclasses.dataclass
class Pending:
    """The chunks of some leaves dispatched: each leaf's chunk results (device arrays) and
    its flat view (for the tail, computed when the results are collected)."""

    leaves: list[np.ndarray]
    results: list[list[Any]]
    flags: bool


def dispatch(program: Any, arrays: list[Any], flags: bool) -> Pending:
    """Every whole chunk of ``arrays`` (whole single-device CPU arrays of a `takes` dtype)
    given to ``program`` (compiled `chunk_out`), nothing waited for."""
    n = CONFIG.cpu_chunk_words
    flats: list[np.ndarray] = []
    results: list[list[Any]] = []
    for x in arrays:
        a = np.asarray(x).reshape(-1)
        flats.append(a)
        whole = (a.nbytes // 4) // n
        if not whole:
            results.append([])
            continue
        w = a[: whole * n * 4 // a.itemsize].view(np.uint32)
        device = next(iter(x.devices()))
        views = jax.device_put([w[j * n : (j + 1) * n] for j in range(whole)], device)
        hi, lo = _masks(x.dtype)
        rows = n // ROW_WORDS
        results.append(
            [program(v, np.array([j * rows, hi, lo], np.uint32)) for j, v in enumerate(views)]
        )
    return Pending(flats, results, flags)


def _masks(dtype: Any) -> tuple[int, int]:
    """Each half's NaN/Inf exponent mask (high half, low half) for ``dtype``: a half ``h`` is
    non-finite where ``h & mask == mask`` (0: never), from `definition.NONFINITE_BITS`
    (``bits & 0x7F..F >= least`` is the exponent field all ones: ``least``'s bits); float32's
    exponent lies in its high half."""
    bits = nonfinite_bits_of(dtype)
    if bits is None:
        return 0, 0
    least = bits[1]
    return (least >> 16, 0) if np.dtype(dtype).itemsize == 4 else (least, least)


def collect(pending: Pending) -> list[np.ndarray]:
    """Each leaf's results (lanes, then with flags holds-NaN/Inf and is-constant): its chunks'
    copied back and added to its tail's, computed here meanwhile."""
    n = CONFIG.cpu_chunk_words
    tails = []
    for a, got in zip(pending.leaves, pending.results):
        start = len(got) * n * 4 // a.itemsize  # the first element after the whole chunks
        tails.append(_tail(a, start, pending.flags) if start < a.size else None)
    fetched = jax.device_get(pending.results)
    return [
        combine(a, [np.asarray(r) for r in got], tail, pending.flags)
        for a, got, tail in zip(pending.leaves, fetched, tails)
    ]


def _tail(a: np.ndarray, start: int, flags: bool) -> np.ndarray:
    """The results of ``a[start:]`` in chunk form (lanes; with flags holds-NaN/Inf, every
    element the same, its first element's raw value)."""
    t = a[start:]
    lanes = numpy_lanes(t, (start,), a.shape).reshape(-1)
    if not flags:
        return lanes
    bad, same = numpy_flags(t)
    first = int(t[:1].view(f'u{t.itemsize}')[0])
    return np.concatenate([lanes, np.array([bad, same, first], np.uint32)])


def combine(
    a: np.ndarray, chunks: list[np.ndarray], tail: np.ndarray | None, flags: bool
) -> np.ndarray:
    """A leaf's results from its chunks' and its tail's: lanes added (mod 2^32); any part
    non-finite; constant where every part is and their first elements agree (a chunk's
    first word holds a 2-byte dtype's first two elements: both alike, else not constant)."""
    parts = chunks + ([tail] if tail is not None else [])
    with np.errstate(over='ignore'):
        lanes = np.asarray(np.sum([p[:LANES_ONLY] for p in parts], axis=0, dtype=np.uint32))
    if not flags:
        return lanes
    bad = any(bool(p[4]) for p in parts)
    firsts = {int(tail[6])} if tail is not None else set()
    for c in chunks:
        w = int(c[6])
        firsts |= {w & 0xFFFF, w >> 16} if a.itemsize == 2 else {w}
    same = all(bool(p[5]) for p in parts) and len(firsts) == 1
    return np.concatenate([lanes, np.array([bad, same], np.uint32)])
