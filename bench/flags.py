"""The NaN/Inf and constant flags of host memory: `numpy_flags` (raw bits in cache-sized
steps, the largest and smallest raw value) against the formula it replaced (``np.isfinite``
of the values, equality with the first element), side by side in one run, medians.

Rows: 64 MiB of float32, bfloat16 (ml_dtypes' ``isfinite``) and float16, random normal values,
finite (every element read); 300 small leaves (512 and 2,048 elements, float32, bfloat16,
one int32), per leaf.

Run: ``python bench/flags.py [--reps N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import ml_dtypes
import numpy as np

from multihost._checks.fingerprint.definition import inexact, numpy_flags


def replaced(a: np.ndarray) -> tuple[bool, bool]:
    """The formula `numpy_flags` replaced: ``isfinite`` of the values, equality of raw words."""
    flat = a.reshape(-1)
    with np.errstate(invalid='ignore'):
        bad = bool(inexact(flat.dtype) and not np.isfinite(flat).all())
    raw = flat.view(f'u{flat.dtype.itemsize}')
    return bad, bool((raw == raw[0]).all())


def _median_s(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reps', type=int, default=15)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    big = {
        'float32': rng.standard_normal(1 << 24).astype(np.float32),
        'bfloat16': rng.standard_normal(1 << 25).astype(ml_dtypes.bfloat16),
        'float16': rng.standard_normal(1 << 25).astype(np.float16),
    }
    kinds = [(512, np.float32), (512, ml_dtypes.bfloat16), (2048, np.float32),
             (2048, ml_dtypes.bfloat16), (1, np.int32)]  # fmt: skip
    small = [rng.standard_normal(n).astype(dt) for i in range(60) for n, dt in kinds]
    rows = [(f'64 MiB {k}', [a], 'ms') for k, a in big.items()]
    rows.append((f'{len(small)} small leaves', small, 'us per leaf'))
    for name, arrays, unit in rows:
        assert [numpy_flags(a) for a in arrays] == [replaced(a) for a in arrays]
        ours = theirs = 0.0
        for _ in range(2):  # interleaved: the two formulas see the same machine
            ours += _median_s(lambda xs=arrays: [numpy_flags(a) for a in xs], args.reps) / 2
            theirs += _median_s(lambda xs=arrays: [replaced(a) for a in xs], args.reps) / 2
        scale = 1e3 if unit == 'ms' else 1e6 / len(arrays)
        print(f'{name:22s} numpy_flags {ours * scale:8.2f} {unit}, '
              f'the replaced formula {theirs * scale:8.2f} {unit}: '
              f'{theirs / ours:5.2f}x')  # fmt: skip
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
