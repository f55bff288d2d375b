"""How the diagnostics scale with the number of hosts (simulated: N processes x 1 CPU device).

For N in --hosts (default 4 8 16), in one run: barrier latency, a small
process_allgather (the key-value path), assert_equal of a 100-leaf tree,
dump_stacks from process 0, step_table, and check_replicas of a replicated
array. Medians of --reps repetitions of the slowest process.

This machine has 2 cores, so 16 processes are heavily oversubscribed: read
the growth from 4 to 16, not the absolute numbers, as an upper bound.

    python bench/scale.py [--hosts 4 8 16] [--reps 5]
"""

from __future__ import annotations

import argparse
import time

import _common
import numpy as np


def _body(reps: int) -> dict[str, list[float]]:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import multihost

    tree = {f'w{i}': np.full(256, i, np.float32) for i in range(100)}
    mesh = _common.flat_mesh()
    rep = jax.make_array_from_callback(
        (1024,), NamedSharding(mesh, P()), lambda i: np.arange(1024.0)[i]
    )
    cases = {
        'barrier': lambda: multihost.barrier('scale'),
        'allgather 64 B/host': lambda: multihost.process_allgather(np.arange(16, dtype=np.float32)),
        'assert_equal 100 leaves': lambda: multihost.assert_equal(tree),
        'check_replicas 4 KiB': lambda: multihost.check_replicas(rep),
        'dump_stacks (from p0)': lambda: (
            multihost.dump_stacks(timeout=30) if jax.process_index() == 0 else None
        ),
        'step_table (p0)': lambda: multihost.step_table() if jax.process_index() == 0 else None,
    }
    for fn in cases.values():
        fn()
    return _common.interleaved(cases, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', type=int, nargs='+', default=[4, 8, 16])
    parser.add_argument('--reps', type=int, default=5)
    args = parser.parse_args()
    table: dict[str, dict[int, float]] = {}
    for n in args.hosts:
        t0 = time.perf_counter()
        with _common.local_cluster(n, 1, start_timeout=300) as cluster:
            up = time.perf_counter() - t0
            per = cluster.run(_body, args.reps, timeout=1200)
        for key in per[0]:
            table.setdefault(key, {})[n] = _common.slowest_median_ms([p[key] for p in per])
        table.setdefault('cluster start (s)', {})[n] = up * 1e3
        print(f'{n} hosts done', flush=True)
    head = f'{"case":<26}' + ''.join(f'{f"{n} hosts":>12}' for n in args.hosts)
    print('\n' + head + '\n' + '-' * len(head))
    for key, row in table.items():
        scale = 1e-3 if key.endswith('(s)') else 1
        unit = 's' if key.endswith('(s)') else 'ms'
        print(f'{key:<26}' + ''.join(f'{row[n] * scale:>9.1f} {unit:<2}' for n in args.hosts))


if __name__ == '__main__':
    main()
