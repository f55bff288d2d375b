"""Fingerprints at memory speed: assert_equal of 256 MiB per host vs one read of it.

4 processes, 1 CPU device each, side by side in one run (interleaved, per rep
the slowest process, then the median over reps):

* ``assert_equal`` of equal trees of CPU-device arrays (16 leaves x 16 MiB
  float32 per host: XXH3-128 over zero-copy views) against a jitted sum over
  every leaf (one read of the tree where it lives); MB/s per host; the same
  forced onto the on-device kernel (``MULTIHOST_FINGERPRINT=device``, what an
  accelerator runs), the kernel alone and XXH3 alone;
* the same 256 MiB as numpy leaves: ``assert_equal`` against one numpy read
  (``np.sum`` of every leaf);
* ``assert_equal`` of 1,000 numpy leaves (31.25 MiB, bench/diagnostics.py's
  tree) against ``jax.experimental.multihost_utils.assert_equal`` (``--jax-reps``
  repetitions of it, ~20 s each here; ours ``--reps``), interleaved;
* the first fingerprints of two 1,000-leaf device trees (bench/diagnostics.py's
  tree, the one issue 22's 2.8 s compile was measured on; then one of 350 shapes
  never seen before): under ``auto`` (CPU: no compile) and ``device`` (the
  kernel compiles, as on an accelerator), then the second call;
* ``tree_diff`` with one odd element in a 64 MiB leaf: bytes each host moved
  (reference broadcast + coordination-service values), counted by wrapping the
  two calls that move them.

Run: ``python bench/fingerprints.py [--reps N] [--jax-reps M]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import _common
import numpy as np

LEAVES, LEAF_MIB = 16, 16
ENV = 'MULTIHOST_FINGERPRINT'


def _forced(how: str, fn: Any) -> Any:
    def run() -> Any:
        old = os.environ.get(ENV)
        os.environ[ENV] = how
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old

    return run


def _run(reps: int, jax_reps: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from diagnostics import _big_tree
    from jax.experimental import multihost_utils as jax_mhu

    import multihost
    from multihost._checks import _treediff
    from multihost._checks import fingerprint as _fingerprint
    from multihost._exchange import _kv

    rng = np.random.default_rng(0)
    words = LEAF_MIB * _common.MIB // 4
    host = {f'p{i:02d}': rng.standard_normal(words, np.float32) for i in range(LEAVES)}
    tree = {k: jax.device_put(v) for k, v in host.items()}
    leaves = list(tree.values())
    nbytes = LEAVES * LEAF_MIB * _common.MIB
    total = jax.jit(lambda t: sum(jnp.sum(x) for x in jax.tree.leaves(t)))

    def read() -> None:
        jax.block_until_ready(total(tree))

    def np_read() -> None:
        for a in host.values():
            np.sum(a)

    cases = {
        'assert_equal': lambda: multihost.assert_equal(tree, 'bench'),
        'sum': read,
        'assert_equal, kernel': _forced('device', lambda: multihost.assert_equal(tree, 'bench')),
        'kernel alone': lambda: _fingerprint.digests(leaves, 'device'),
        'XXH3 alone': lambda: _fingerprint.digests(leaves, 'host'),
        'numpy assert_equal': lambda: multihost.assert_equal(host, 'bench'),
        'numpy read': np_read,
    }
    for fn in cases.values():
        fn()  # warm-up (compiles the sum and the kernel)
    times = _common.interleaved(cases, reps)

    # 1,000 numpy leaves, ours vs JAX's, interleaved (JAX's is slow: fewer reps).
    small = _big_tree()
    ours_small = lambda: multihost.assert_equal(small, 'bench')  # noqa: E731
    theirs_small = lambda: jax_mhu.assert_equal(small, 'bench')  # noqa: E731
    ours_small(), theirs_small()
    vs_jax: dict[str, list[float]] = {'ours': [], 'jax': []}
    for r in range(max(reps, jax_reps)):
        vs_jax['ours'] += _common.per_call(ours_small, 1, 1)
        if r < jax_reps:
            vs_jax['jax'] += _common.per_call(theirs_small, 1, 1)

    # First call over a 1,000-leaf device tree of shapes never fingerprinted here (350 shapes).
    shapes = [(i % 50 + 3, i % 7 + 2) for i in range(1000)]
    many = [jax.device_put(np.full(s, i, np.float32)) for i, s in enumerate(shapes)]
    jax.block_until_ready(many)
    # And bench/diagnostics.py's 1,000-leaf tree (few shapes) on the device: the tree whose
    # first call issue 22 measured (2.8 s to compile the kernel).
    alike = [jax.device_put(x) for x in jax.tree.leaves(small)]
    jax.block_until_ready(alike)
    first: dict[str, float] = {}
    for label, leaves_ in (('diagnostics tree', alike), ('350 shapes', many)):
        for how in ('auto', 'device'):
            for call in ('first', 'second'):
                t0 = time.perf_counter()
                _fingerprint.digests(leaves_, how)
                first[f'{label}, {how}, {call}'] = time.perf_counter() - t0

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
    return {'times': times, 'nbytes': nbytes, 'first_s': first, 'moved': moved,
            'first_index': leaf.first_index, 'vs_jax': vs_jax,
            'small_bytes': sum(x.nbytes for x in jax.tree.leaves(small))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reps', type=int, default=7, help='timed repetitions (default 7)')
    parser.add_argument(
        '--jax-reps', type=int, default=3, help="repetitions of JAX's assert_equal (default 3)"
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.jax_reps < 1:
        parser.error('--reps and --jax-reps must be >= 1')
    env = _common.environment(devices_per_process=1)
    print('environment: ' + ', '.join(f'{k}={v}' for k, v in env.items()), flush=True)
    with _common.local_cluster(devices_per_process=1) as cluster:
        per = cluster.run(_run, args.reps, args.jax_reps, timeout=3600)
    names = list(per[0]['times'])
    ms = {k: _common.slowest_median_ms([p['times'][k] for p in per]) for k in names}
    mb = per[0]['nbytes'] / 1e6
    print(f'\n256 MiB per host ({LEAVES} x {LEAF_MIB} MiB float32), {len(per)} hosts')
    for k in names:
        ref = 'numpy read' if k.startswith('numpy') else 'sum'
        print(f'  {k:22s} {ms[k]:9.1f} ms  {mb / (ms[k] / 1e3):8.0f} MB/s per host  '
              f'{ms[k] / ms[ref]:6.2f} x the {ref}')  # fmt: skip
    ours = _common.slowest_median_ms([p['vs_jax']['ours'] for p in per])
    theirs = _common.slowest_median_ms([p['vs_jax']['jax'] for p in per])
    mib = per[0]['small_bytes'] / _common.MIB
    print(f'\nassert_equal of 1,000 numpy leaves ({mib:.2f} MiB per host): ours {ours:.1f} ms, '
          f'jax {theirs:.0f} ms: {theirs / ours:.0f}x faster')  # fmt: skip
    for k in per[0]['first_s']:
        got = statistics.median(p['first_s'][k] for p in per)
        print(f'fingerprints of a 1,000-leaf device tree ({k} call): {got:.3f} s')
    for h, p in enumerate(per):
        m = p['moved']
        print(f'tree_diff, one odd element in 64 MiB: process {h} moved {m["broadcast"]:,} B '
              f'broadcast + {m["kv"]:,} B of KV values; first index '
              f'{p["first_index"]}')  # fmt: skip
    return 0


if __name__ == '__main__':
    sys.exit(main())
