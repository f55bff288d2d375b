"""How a block is read on a TPU: its stored order of axes (`stored_order`) and the layout the
Pallas kernel reads it in (`read_layout`), decided by the plan once per block.

A TPU stores an array whose last axis is small with another axis minor; a program that reads
it in its logical shape gets a relayout first (a copy through the vector units, which
rewrites bfloat16 NaN payloads and subnormals: `bench/tpu_bits.py` re-checks it). The kernel
reads a block in its stored order and in shapes that are `bitcast`s of it (no data moves:
`tests/engine/test_tpu_reshapes.py` compiles them for a v5e).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from multihost._checks.fingerprint.definition import NONFINITE_BITS

#: Narrow floats the kernel reads (their bits kept); float16 is not among them (Mosaic takes
#: no float16 argument: read from host copies on a TPU).
KERNEL_FLOATS = frozenset(n for n in NONFINITE_BITS if n not in ('float16', 'float32'))
#: 32-bit dtypes the kernel reads (in `_direct` shapes only: others stay with XLA, which
#: keeps their bits).
WORD_DTYPES = frozenset({'float32', 'int32', 'uint32'})

#: Dtypes whose whole leaves are read with their leading axes merged (a `bitcast` in XLA:
#: the same tiles in memory, nothing moved; `tests/engine/test_tpu_reshapes.py`). Not
#: float8_e4m3fn, whose negative NaN even an identity program rewrote on the chip: not tried
#: there.
RESHAPE_KEEPS_BITS = frozenset({'bfloat16', 'float8_e5m2'})

#: Dtypes whose whole 1-D leaves of whole rows are read as rows of 128: the same tiles in
#: memory (a `bitcast`: a TPU stores a 1-D bfloat16 leaf in tiles of 1,024, as 8 rows of
#: 128 words of two elements). Not float8: its 1-D tiles are not the 2-D kernel's.
ROWS_DTYPES = frozenset({'bfloat16'})

#: Rows of a (rows, 128) VMEM tile per element size: 32-bit words hold 4, 2 or 1 elements.
PACKED_ROWS = {1: 32, 2: 16, 4: 8}


def _direct(shape: tuple[int, ...], itemsize: int) -> bool:
    """Stored shapes whose bits the kernel reads in place: a last axis of 128 or more, and
    for 3-D and up a second-to-last axis in whole packed rows (16 of 2 bytes, 32 of 1).
    ``shape`` is the stored order's (`stored_order`): a block read in its logical shape
    where XLA stores it transposed is relaid out for the kernel first, NaNs canonicalized."""
    return shape[-1] >= 128 and (len(shape) == 2 or shape[-2] % PACKED_ROWS[itemsize] == 0)


def stored_order(x: Any) -> tuple[int, ...]:
    """``x``'s axes in the order its device stores them, major to minor (``x.format``'s
    layout; the C order where it has none). A TPU stores an array whose last axis is
    small with another axis minor: XLA's default layout for (768, 8, 96) there is
    (1, 2, 0), (1000, 5)'s (1, 0). A program that reads such an array in its logical shape
    gets a relayout first (a copy through the vector units, which rewrites bfloat16 NaN
    payloads and subnormals: `bench/tpu_bits.py`); read in the stored order, a `bitcast`."""
    try:
        got = tuple(int(a) for a in x.format.layout.major_to_minor)
    except Exception:  # no layout to ask (a numpy array, an older jax): C order
        return tuple(range(len(x.shape)))
    return got if sorted(got) == list(range(len(x.shape))) else tuple(range(len(x.shape)))


class Read(NamedTuple):
    """How the kernel reads a block: transposed to ``order`` (its stored order: no data
    moves), then in ``shape`` (that order's shape, its leading axes merged for some
    whole leaves)."""

    order: tuple[int, ...]
    shape: tuple[int, ...]


def _mergeable(shape: tuple[int, ...], order: tuple[int, ...]) -> bool:
    """Whether the leading axes of ``shape`` in ``order`` merge into one axis whose element
    index is linear (each one's C stride is the next one's times its length)."""
    stride = [int(np.prod(shape[a + 1 :])) for a in range(len(shape))]
    lead = order[:-1]
    return all(stride[a] == shape[b] * stride[b] for a, b in zip(lead, lead[1:]))


def read_layout(
    dtype: Any, shape: tuple[int, ...], whole: bool, order: tuple[int, ...] | None = None
) -> Read | None:
    """How the kernel reads a block of ``dtype`` and ``shape`` stored in ``order``
    (`stored_order`; C order if None), or None (host copies for narrow floats, XLA's program
    for 32-bit words). In the stored order (a transpose there is a `bitcast`):

    * a whole leaf of 3-D and up whose second-to-last axis is in whole packed rows, and
      whose dtype is in `RESHAPE_KEEPS_BITS` or 32-bit: 2-D, its leading axes merged (the
      same tiles in memory: no copy, and a few large tiles instead of many small ones);
    * its own shape where that reads exactly (`_direct`); 32-bit words also with a last
      axis under 128 whose lanes are at least half used;
    * a whole 1-D leaf of `ROWS_DTYPES` whose size is whole rows of 128: as those rows.

    Every element keeps its index in the leaf's C order: the kernel is given each read
    axis's C stride (`pallas.block_words`)."""
    dt = np.dtype(dtype)
    if (
        dt.name not in KERNEL_FLOATS
        and dt.name not in WORD_DTYPES
        or len(shape) < 1
        or not all(shape)
    ):
        return None
    order = tuple(range(len(shape))) if order is None else tuple(order)
    t = tuple(int(shape[a]) for a in order)
    merge = dt.name in RESHAPE_KEEPS_BITS or dt.itemsize == 4
    lanes = t[-1] >= 128 or (dt.itemsize == 4 and -(-t[-1] // 128) * 128 <= 2 * t[-1])
    if (whole and merge and len(t) >= 3 and t[-2] % PACKED_ROWS[dt.itemsize] == 0 and lanes
            and _mergeable(shape, order)):  # fmt: skip
        return Read(order, (int(np.prod(t[:-1])), t[-1]))
    if len(t) >= 2 and _direct(t, dt.itemsize):
        return Read(order, t)
    if len(t) == 2 and dt.itemsize == 4 and lanes:
        return Read(order, t)
    if whole and len(t) == 1 and dt.name in ROWS_DTYPES and t[0] % 128 == 0:
        return Read(order, (t[0] // 128, 128))
    return None
