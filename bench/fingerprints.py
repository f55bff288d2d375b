"""Fingerprints on the device: assert_equal of 256 MiB per host vs one on-device read of it.

4 processes, 1 CPU device each, side by side in one run (interleaved, per rep
the slowest process, then the median over reps):

* ``assert_equal`` of equal trees of device arrays (64 leaves x 4 MiB float32
  per host) against a jitted sum over every leaf (one read of the tree where it
  lives); MB/s per host;
* the kernel alone (`multihost._checks._fingerprint.fingerprints`) against the
  sum, and the byte hash of before (``np.asarray`` + CRC-32 + Adler-32);
* ``tree_diff`` with one odd element in a 64 MiB leaf: bytes each host moved
  (reference broadcast + coordination-service values), counted by wrapping the
  two calls that move them.

Run: ``python bench/fingerprints.py [--reps N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from typing import Any

import _common
import numpy as np

LEAVES, LEAF_MIB = 64, 4


def _run(reps: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import multihost
    from multihost._checks import _fingerprint, _treediff
    from multihost._exchange import _kv

    rng = np.random.default_rng(0)
    words = LEAF_MIB * _common.MIB // 4
    tree = {
        f'p{i:02d}': jax.device_put(rng.standard_normal(words, np.float32)) for i in range(LEAVES)
    }
    leaves = list(tree.values())
    nbytes = LEAVES * LEAF_MIB * _common.MIB
    total = jax.jit(lambda t: sum(jnp.sum(x) for x in jax.tree.leaves(t)))

    def read() -> None:
        jax.block_until_ready(total(tree))

    def before() -> None:  # the byte hash of before: copy to the host, CRC-32 + Adler-32
        for x in leaves:
            b = np.asarray(x).reshape(-1).view(np.uint8).data
            zlib.crc32(b), zlib.adler32(b)

    cases = {
        'assert_equal': lambda: multihost.assert_equal(tree, 'bench'),
        'kernel': lambda: _fingerprint.fingerprints(leaves),
        'sum': read,
        'before (host hash)': before,
    }
    t0 = time.perf_counter()
    _fingerprint.fingerprints(leaves)
    first = time.perf_counter() - t0
    for fn in cases.values():
        fn()  # warm-up
    times = _common.interleaved(cases, reps)

    # tree_diff with one odd element in a 64 MiB leaf: count what moves.
    big = rng.standard_normal(64 * _common.MIB // 4, np.float32)
    if jax.process_index() == _common.NUM_PROCESSES - 1:
        big[12345] += 1.0
    odd = {'big': jax.device_put(big)}
    moved = {'broadcast': 0, 'kv': 0}
    broadcast, put = _treediff._broadcast_bytes, _kv.put

    def counted_broadcast(buf: Any, n: int, source: bool) -> np.ndarray:
        moved['broadcast'] += n
        return broadcast(buf, n, source)

    def counted_put(c: Any, k: str, value: str, **kw: Any) -> bool:
        moved['kv'] += len(value)
        return put(c, k, value, **kw)

    _treediff._broadcast_bytes, _kv.put = counted_broadcast, counted_put  # type: ignore[assignment]
    try:
        diff = multihost.tree_diff(odd)
    finally:
        _treediff._broadcast_bytes, _kv.put = broadcast, put  # type: ignore[assignment]
    (leaf,) = diff.leaves
    return {'times': times, 'nbytes': nbytes, 'first_kernel_s': first, 'moved': moved,
            'first_index': leaf.first_index}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reps', type=int, default=5, help='timed repetitions (default 5)')
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error('--reps must be >= 1')
    env = _common.environment(devices_per_process=1)
    print('environment: ' + ', '.join(f'{k}={v}' for k, v in env.items()), flush=True)
    with _common.local_cluster(devices_per_process=1) as cluster:
        per = cluster.run(_run, args.reps, timeout=1800)
    names = list(per[0]['times'])
    ms = {k: _common.slowest_median_ms([p['times'][k] for p in per]) for k in names}
    mb = per[0]['nbytes'] / 1e6
    print(
        f'\n256 MiB of device arrays per host ({LEAVES} x {LEAF_MIB} MiB float32), {len(per)} hosts'
    )
    for k in names:
        print(f'  {k:20s} {ms[k]:9.1f} ms  {mb / (ms[k] / 1e3):8.0f} MB/s per host  '
              f'{ms[k] / ms["sum"]:6.1f} x the sum')  # fmt: skip
    first = statistics.median(p['first_kernel_s'] for p in per)
    print(f'  kernel, first call (compiles): {first:.2f} s')
    for h, p in enumerate(per):
        m = p['moved']
        print(f'tree_diff, one odd element in 64 MiB: host {h} moved {m["broadcast"]:,} B '
              f'broadcast + {m["kv"]:,} B of KV values; first index '
              f'{p["first_index"]}')  # fmt: skip
    return 0


if __name__ == '__main__':
    sys.exit(main())
