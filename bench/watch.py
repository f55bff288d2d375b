"""What `multihost.watch` costs per call, side by side in one run (4 processes x 2 devices).

Usage::

    python bench/watch.py [--reps N] [--calls C] [--leaves L]

Method
------
One `LocalCluster` of 4 real JAX processes x 2 CPU devices. In every process
the same jitted step (elementwise, no device collective) runs in these
ways, interleaved per repetition (machine noise hits all alike):

* ``local unwatched`` / ``local recorded``: on a pytree of ``--leaves``
  (default 32) arrays on the process's own device, the jitted function vs
  ``watch(check=False)`` (flight recorder only): the recorder's host-side
  cost, with no cross-process device work competing for the 2 cores;
* ``unwatched`` / ``checked``: on one array sharded over all 8 devices, the
  jitted function vs ``watch(check=True)`` (recorded and checked across
  hosts before launch: one coordination round);
* ``barrier + unwatched``: a `multihost.barrier` by hand before each call;
* ``barrier``: `multihost.barrier` alone, the reference for one round trip.

A repetition is ``--calls`` back-to-back calls (dispatch) and one
``block_until_ready`` at the end, started together on every process; per
repetition the slowest process counts, then the median over repetitions.
Overheads are differences of those medians, per call. Compilations are
counted with `jax.monitoring` (backend compiles) over every timed call.

Goals (issue 9): checked overhead <= 1.2x the barrier latency; check=False
<= 50 us per call over unwatched with 32 input leaves; 0 compilations per
call after the first call of a signature.

The machine is small and shared (4 processes on 2 cores here): absolute
times are noisy; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import _common
import jax
import jax.numpy as jnp
import numpy as np
from _common import interleaved, slowest_median_ms
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost

_COMPILES = [0]


def _count(event: str, duration: float, **kwargs: Any) -> None:
    if event == '/jax/core/compile/backend_compile_duration':
        _COMPILES[0] += 1


def _run(reps: int, calls: int, leaves: int) -> dict[str, Any]:
    jax.monitoring.register_event_duration_secs_listener(_count)

    @jax.jit
    def step(t: Any, lr: float) -> Any:
        return jax.tree.map(lambda x: x * lr, t)

    # Part A, host-side cost of recording: this process's own device, so no
    # cross-process device work competes with the host for the 2 cores.
    local = {f'p{i:02d}': jnp.ones(64, jnp.float32) for i in range(leaves)}
    # Part B, the cross-host check: one array sharded over all 8 devices.
    sharding = NamedSharding(_common.flat_mesh(), P('x'))
    shared = jax.make_array_from_callback((64,), sharding, lambda idx: np.ones(64, np.float32)[idx])

    recorded = multihost.watch(step, name='recorded', check=False)
    checked = multihost.watch(step, name='checked', check=True)

    def loop(fn: Any, tree: Any, barrier: bool = False) -> Any:
        def run() -> None:
            out = None
            for k in range(calls):
                if barrier:
                    multihost.barrier('by hand')
                out = fn(tree, 1.0 + k * 1e-3)  # a changing Python scalar: same signature
            jax.block_until_ready(out)

        return run

    def barriers() -> None:
        for _ in range(calls):
            multihost.barrier('bench')

    cases = {
        'local unwatched': loop(step, local),
        'local recorded': loop(recorded, local),
        'unwatched': loop(step, shared),
        'checked': loop(checked, shared),
        'barrier + unwatched': loop(step, shared, barrier=True),
        'barrier': barriers,
    }
    for run in cases.values():  # warm-up: compiles, first checks
        run()
    before = _COMPILES[0]
    times = interleaved(cases, reps)
    # The main thread's CPU time per call (device work runs on other threads):
    # the recorder's host-side cost, unaffected by 4 processes sharing 2 cores.
    cpu: dict[str, list[float]] = {'local unwatched': [], 'local recorded': []}
    for _ in range(reps):
        for case in cpu:
            t0 = time.thread_time()
            cases[case]()
            cpu[case].append((time.thread_time() - t0) / calls)
    return {
        'times': {k: [t / calls for t in v] for k, v in times.items()},
        'cpu': cpu,
        'compiles': _COMPILES[0] - before,
        'timed_calls': reps * calls * 5,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reps', type=int, default=15)
    parser.add_argument('--calls', type=int, default=50)
    parser.add_argument('--leaves', type=int, default=32)
    parser.add_argument('--json', help='also write the results here')
    args = parser.parse_args(argv)
    env = _common.environment()
    print(json.dumps(env))
    with _common.local_cluster() as cluster:
        per = cluster.run(_run, args.reps, args.calls, args.leaves, timeout=1800)
    med = {
        case: slowest_median_ms([p['times'][case] for p in per]) * 1e3  # us per call
        for case in per[0]['times']
    }
    recorder_us = med['local recorded'] - med['local unwatched']
    cpu = {
        case: statistics.median(x for p in per for x in p['cpu'][case]) * 1e6
        for case in per[0]['cpu']
    }
    recorder_cpu_us = cpu['local recorded'] - cpu['local unwatched']
    checked_us = med['checked'] - med['unwatched']
    ratio = checked_us / med['barrier']
    by_hand = med['barrier + unwatched'] - med['unwatched']
    compiles = max(p['compiles'] for p in per)
    calls = per[0]['timed_calls']
    rows = [(f'{case} call', f'{us:.1f} us', '') for case, us in med.items()]
    rows += [
        ('barrier + call, overhead', f'{by_hand:.1f} us', 'a barrier by hand before each call'),
        ('checked overhead', f'{checked_us:.1f} us', f'{checked_us / by_hand:.2f}x by hand'),
        (
            f'recorder overhead ({args.leaves} leaves), wall',
            f'{recorder_us:.1f} us',
            f'goal <= 50 us: {"met" if recorder_us <= 50 else "NOT met"} (4 processes, 2 cores)',
        ),
        (
            f'recorder overhead ({args.leaves} leaves), CPU',
            f'{recorder_cpu_us:.1f} us',
            f'goal <= 50 us: {"met" if recorder_cpu_us <= 50 else "NOT met"} (main thread)',
        ),
        (
            'checked overhead / barrier',
            f'{ratio:.2f}x',
            f'goal <= 1.2x: {"met" if ratio <= 1.2 else "NOT met"}',
        ),
        (
            'compilations after warm-up',
            f'{compiles} in {calls} calls',
            f'goal 0: {"met" if compiles == 0 else "NOT met"}',
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f'bench/watch.py: {args.reps} reps x {args.calls} calls, slowest process, median')
    for name, value, goal in rows:
        print(f'  {name:<{width}}  {value:>16}  {goal}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(
                {'env': env, 'median_us': med, 'cpu_us': cpu, 'compiles': compiles, 'ratio': ratio},
                f,
            )
    return 0


if __name__ == '__main__':
    sys.exit(main())
