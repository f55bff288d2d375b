"""`check_replicas` among many hosts: per-host reads with the reference path and without it.

Usage::

    python bench/replicas.py [--hosts 4,8,16] [--reps 15]

For each N, one `LocalCluster` of N real JAX processes x 1 CPU device runs
two arrays: ``replicated`` (float32[4096], ``P()``: one block on every host)
and ``pairs`` (float32[N/2, 1024], each row block on 2 processes). Each host
counts what it asks of the coordination service (`_kv.COUNTERS`) per
`check_replicas` and times it (every repetition started together; the
slowest host per repetition, then the median). Side by side in the same
cluster: the reference path (above `_kv.DIGEST_ABOVE` hosts: one reference
per block, the round agrees on the outcome) and the read-all path (every host
reads every host's digests, as before: `_replicas._agree_by_reference`
replaced by one that agrees on nothing, in every process), interleaved per
repetition. The sequence check before each is the same on both sides.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import _common

#: Arrays checked, in table order.
ARRAYS = ('replicated', 'pairs')


def _arrays() -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = jax.process_count()
    devices = np.array(jax.devices())
    made = {}
    for name, value, mesh, spec in (
        ('replicated', np.arange(4096, dtype=np.float32), Mesh(devices, ('x',)), P()),
        (
            'pairs',
            np.arange(n // 2 * 1024, dtype=np.float32).reshape(n // 2, 1024),
            Mesh(devices.reshape(n // 2, 2), ('a', 'b')),
            P('a'),
        ),
    ):
        sharding = NamedSharding(mesh, spec)
        made[name] = jax.make_array_from_callback(value.shape, sharding, lambda i, v=value: v[i])
    return made


def _worker(reps: int) -> dict[str, dict[str, Any]]:
    import time

    import multihost
    from multihost._checks import _replicas
    from multihost._exchange import _kv

    arrays = _arrays()
    by_reference = _replicas._agree_by_reference
    sides = {'reference': by_reference, 'read all': lambda *_: None}  # None: no agreement
    out: dict[str, dict[str, Any]] = {}
    for name, arr in arrays.items():
        for side in sides:
            out[f'{name}/{side}'] = {'seconds': [], 'bytes': [], 'rpcs': []}
        for _ in range(reps):
            for side, agree in sides.items():
                _replicas._agree_by_reference = agree  # type: ignore[assignment]
                try:
                    multihost.check_replicas(arr)  # this side's warm-up
                    _common.start_together()
                    before = _kv.COUNTERS.snapshot()
                    t0 = time.perf_counter()
                    report = multihost.check_replicas(arr)
                    seconds = time.perf_counter() - t0
                    used = _kv.COUNTERS.since(before)
                finally:
                    _replicas._agree_by_reference = by_reference
                assert report.ok, str(report)
                row = out[f'{name}/{side}']
                row['seconds'].append(seconds)
                row['bytes'].append(used.bytes_read)
                row['rpcs'].append(used.rpcs)
    return out


def measure(n: int, reps: int) -> dict[str, dict[str, float]]:
    """Per case: median bytes read / RPCs per host (max over hosts) and the slowest host's ms."""
    import statistics

    with _common.local_cluster(n, 1) as cluster:
        per_host = cluster.run(_worker, reps, timeout=1800)
    table = {}
    for case in per_host[0]:
        rows = [h[case] for h in per_host]
        table[case] = {
            'bytes': max(statistics.median(r['bytes']) for r in rows),
            'rpcs': max(statistics.median(r['rpcs']) for r in rows),
            'ms': _common.slowest_median_ms([r['seconds'] for r in rows]),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--hosts', default='4,8,16', help='comma-separated N (even, >= 4)')
    parser.add_argument('--reps', type=int, default=15)
    args = parser.parse_args(argv)
    ns = [int(x) for x in args.hosts.split(',')]
    if any(n < 4 or n % 2 for n in ns):
        parser.error(f'--hosts {args.hosts}: every N must be even and >= 4 (pairs of hosts)')
    print(_common.environment(max(ns), 1))
    results = {n: measure(n, args.reps) for n in ns}
    head = ' | '.join(f'N = {n}' for n in ns)
    print('\nper check_replicas: bytes read per host / RPCs per host / slowest host ms (median)\n')
    print(f'| array, path | {head} |')
    print('|---|' + '---|' * len(ns))
    for name in ARRAYS:
        for side in ('reference', 'read all'):
            case = f'{name}/{side}'
            cells = ' | '.join(
                f'{r[case]["bytes"]:.0f} B / {r[case]["rpcs"]:.0f} / {r[case]["ms"]:.1f} ms'
                for r in results.values()
            )
            print(f'| {name}, {side} | {cells} |')
    print()
    for n, r in results.items():
        for name in ARRAYS:
            ratio = r[f'{name}/reference']['ms'] / r[f'{name}/read all']['ms']
            print(f'N = {n}, {name}: reference / read all latency = {ratio:.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
