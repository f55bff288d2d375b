"""How long `mhnotebook.start_local` takes to start simulated hosts, side by side: the
controller's ping period as the toolkit sets it (1 s, 30 misses) against ipyparallel's own
(3 s, 10 misses), the starts alternating in one run.

An engine counts as registered at the first ping after it connects, so the period bounds how
long a start waits for the last engine. Each start is timed until the session is ready (the
engines up and JAX initialized on every one), then stopped.

Usage: ``python bench/cluster_start.py [--n 4] [--reps 3] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

IPYPARALLEL_DEFAULT = ['--HeartMonitor.period=3000', '--HeartMonitor.max_heartmonitor_misses=10']


def _start(n: int, controller_args: list[str] | None) -> float:
    from mhnotebook._cluster.local import start_local

    extra = {} if controller_args is None else {'controller_args': controller_args}
    t0 = time.perf_counter()
    session = start_local(n, 2, progress=False, **extra)
    took = time.perf_counter() - t0
    session.stop()
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--n', type=int, default=4, help='simulated hosts')
    parser.add_argument('--reps', type=int, default=3)
    parser.add_argument('--json', default='')
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {'toolkit (1 s pings)': [], 'ipyparallel (3 s pings)': []}
    for _ in range(args.reps):
        times['toolkit (1 s pings)'].append(_start(args.n, None))
        times['ipyparallel (3 s pings)'].append(_start(args.n, IPYPARALLEL_DEFAULT))
    medians = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f'{k}: median {medians[k]:.1f} s ({", ".join(f"{t:.1f}" for t in v)})')
    ratio = medians['ipyparallel (3 s pings)'] / medians['toolkit (1 s pings)']
    print(f'{args.n} hosts ready {ratio:.2f}x sooner with 1 s pings')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'n': args.n, 'seconds': times, 'medians': medians, 'ratio': ratio}, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
