"""What `multihost.install` costs, side by side in one run (4 processes x 2 devices).

Usage::

    python bench/install.py [--reps N] [--calls C] [--leaves L] [--json PATH]

Part 1: per jitted launch
-------------------------
One `LocalCluster` of 4 real JAX processes x 2 CPU devices. In every process
the same step (elementwise, no device collective) on a pytree of ``--leaves``
(default 32) arrays is jitted three ways, and the calls interleaved per
repetition (machine noise hits all alike):

* ``uninstalled``: JAX's own jitted function (``jax.jit`` before install);
* ``installed``: jitted while the jit patcher is installed (record-only:
  ``check_jit`` off), the way every step of an unmodified script is;
* ``watch(check=False)``: `multihost.watch` on the uninstalled function, the
  recorder of issue 9, for comparison.

Each on two inputs: ``local`` (every leaf on the process's own first device:
no cross-process device work competes for the 2 cores) and ``global`` (every
leaf sharded over all 8 devices: the launch spans processes).

A repetition is ``--calls`` back-to-back calls and one ``block_until_ready``
at the end, started together on every process. Two figures per call:

* main-thread CPU (``time.thread_time``; device work runs on other threads):
  what the host pays. The uninstalled call's figure is JAX's own dispatch
  time (the call returns before the computation is done); the overheads are
  per repetition the installed (or watched) minus the uninstalled figure of
  the same process and repetition, then median and spread (10th-90th
  percentile) over processes and repetitions;
* wall time, per repetition the slowest process, then the median.

Goal (issue 19): record-only cost <= 20 us of main-thread CPU per launch over
the uninstalled call, 32 input leaves (``watch(check=False)`` added ~75 us).

The machine is small and shared (4 processes on 2 cores here): absolute
times are noisy; read the paired differences.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from typing import Any

import _common
import jax
import jax.numpy as jnp
import numpy as np
from _common import slowest_median_ms
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost

_CASES = ('uninstalled', 'installed', 'watch(check=False)')


@dataclasses.dataclass(frozen=True)
class _Options:
    """The install options the jit patcher reads (record-only)."""

    check_jit: bool = False
    timeout: float | None = None


def _step(t: Any, lr: Any) -> Any:
    return jax.tree.map(lambda x: x * lr, t)


def _part1(reps: int, calls: int, leaves: int) -> dict[str, Any]:
    from multihost._job import _jit

    uninstalled = jax.jit(_step)
    watched = multihost.watch(uninstalled, name='watched', check=False)
    _jit.patch(_Options())
    try:
        installed = jax.jit(_step)
        assert isinstance(installed, _jit.Jitted)
        result = _measure(
            {'uninstalled': uninstalled, 'installed': installed, 'watch(check=False)': watched},
            reps,
            calls,
            leaves,
        )
        result['alone_us'] = _record_path_alone(_jit, leaves)
        return result
    finally:
        _jit.unpatch()


class _Done:
    """Stands for JAX's jitted function: returns a finished output at once (no dispatch)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.lower = self.trace = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.out


def _record_path_alone(_jit: Any, leaves: int) -> float:
    """The record path's own CPU per call (us): a `Jitted` around `_Done`, minus `_Done`."""
    tree = {f'p{i:02d}': jnp.ones(64, jnp.float32) for i in range(leaves)}
    inner = _Done(jax.block_until_ready(_step(tree, 1.0)))
    outer = _jit.Jitted(inner)
    n, best = 2000, {'inner': float('inf'), 'outer': float('inf')}
    for _ in range(15):
        for name, fn in (('inner', inner), ('outer', outer)):
            t0 = time.thread_time()
            for _ in range(n):
                fn(tree, 1.0)
            best[name] = min(best[name], (time.thread_time() - t0) / n)
    return (best['outer'] - best['inner']) * 1e6


def _measure(fns: dict[str, Any], reps: int, calls: int, leaves: int) -> dict[str, Any]:
    local = {f'p{i:02d}': jnp.ones(64, jnp.float32) for i in range(leaves)}
    sharding = NamedSharding(_common.flat_mesh(), P('x'))
    ones = np.ones(64, np.float32)
    shared = {
        f'p{i:02d}': jax.make_array_from_callback((64,), sharding, lambda idx: ones[idx])
        for i in range(leaves)
    }
    lr = jnp.float32(1.0)

    def loop(fn: Any, tree: Any) -> Any:
        def run() -> None:
            out = None
            for _ in range(calls):
                out = fn(tree, lr)
            jax.block_until_ready(out)

        return run

    cases = {
        (inp, name): loop(fn, tree)
        for inp, tree in (('local', local), ('global', shared))
        for name, fn in fns.items()
    }
    for run in cases.values():  # warm-up: compiles
        run()
        run()
    cpu: dict[str, list[float]] = {f'{i} {n}': [] for i, n in cases}
    wall: dict[str, list[float]] = {f'{i} {n}': [] for i, n in cases}
    for _ in range(reps):
        for (inp, name), run in cases.items():
            _common.start_together()
            t0, c0 = time.perf_counter(), time.thread_time()
            run()
            c1, t1 = time.thread_time(), time.perf_counter()
            cpu[f'{inp} {name}'].append((c1 - c0) / calls)
            wall[f'{inp} {name}'].append((t1 - t0) / calls)
    return {'cpu': cpu, 'wall': wall}


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def _paired_us(per: list[dict[str, Any]], case: str, base: str) -> list[float]:
    """Per process and repetition, ``case`` minus ``base`` CPU per call (us)."""
    return [(a - b) * 1e6 for p in per for a, b in zip(p['cpu'][case], p['cpu'][base], strict=True)]


def _report(per: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    print(
        f'bench/install.py part 1: per jitted launch, {args.leaves} input leaves, '
        f'{args.reps} reps x {args.calls} calls, interleaved'
    )
    rows = []
    results: dict[str, Any] = {}
    for inp in ('local', 'global'):
        for name in _CASES:
            key = f'{inp} {name}'
            cpu = [x * 1e6 for p in per for x in p['cpu'][key]]
            wall_us = slowest_median_ms([p['wall'][key] for p in per]) * 1e3
            results[key] = {'cpu_us': statistics.median(cpu), 'wall_us': wall_us}
            what = "JAX's own dispatch" if name == 'uninstalled' else ''
            rows.append(
                (
                    f'{key} call',
                    f'{statistics.median(cpu):.1f} us CPU',
                    f'{wall_us:.1f} us wall',
                    f'CPU p10-p90 {_percentile(cpu, 10):.1f}-{_percentile(cpu, 90):.1f} {what}',
                )
            )
        for name in _CASES[1:]:
            diff = _paired_us(per, f'{inp} {name}', f'{inp} uninstalled')
            med = statistics.median(diff)
            results[f'{inp} {name} overhead'] = {
                'median_us': med,
                'p10_us': _percentile(diff, 10),
                'p90_us': _percentile(diff, 90),
            }
            goal = ''
            if name == 'installed':
                goal = f'goal <= 20 us: {"met" if med <= 20 else "NOT met"}'
            rows.append(
                (
                    f'{inp} {name} overhead',
                    f'{med:.1f} us CPU',
                    '',
                    f'p10-p90 {_percentile(diff, 10):.1f} to {_percentile(diff, 90):.1f}  {goal}',
                )
            )
    alone = statistics.median(p['alone_us'] for p in per)
    results['record path alone us'] = alone
    rows.append(
        (
            'record path alone',
            f'{alone:.1f} us CPU',
            '',
            'best of 15 x 2000 calls around a stand-in returning at once: no dispatch',
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f'  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}')
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reps', type=int, default=30)
    parser.add_argument('--calls', type=int, default=50)
    parser.add_argument('--leaves', type=int, default=32)
    parser.add_argument('--json', help='also write the results here')
    args = parser.parse_args(argv)
    env = _common.environment()
    print(json.dumps(env))
    with _common.local_cluster() as cluster:
        per = cluster.run(_part1, args.reps, args.calls, args.leaves, timeout=1800)
    results = {'part1': _report(per, args)}
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'env': env, **results}, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
