"""Side-by-side benchmark: `multihost` vs `jax.experimental.multihost_utils`.

Usage::

    python bench/core.py [--reps N] [--json PATH]

Method
------
One `LocalCluster` of 4 real JAX processes x 2 CPU devices (jax.distributed on
loopback) runs every case. A case is one API on one input; for each case a
single ``cluster.run`` call executes `run_case` in every process, which:

1. builds the input (deterministic, and different per process where the API
   gathers or broadcasts, so the data actually moves);
2. calls ours and JAX's once each and checks with `np.testing` that they give
   the same result, so the two sides can't be doing different work (a
   mismatch is reported in the table and makes the script exit 1);
3. warms both up (compilation and caches are excluded from the timings);
4. times ``reps`` repetitions, interleaved ours, jax, ours, jax, ... so slow
   drift in machine load hits both sides alike. Before every repetition all
   processes meet at a coordination-service barrier (not timed), so every
   process starts the repetition together. A repetition runs the call
   ``inner`` times back to back and records the mean per call (``inner`` > 1
   only for calls that take microseconds, where one call is below the noise).

Each process returns its per-repetition times. The parent takes, per
repetition, the max over processes (the slowest host is what a multi-host
program waits for), then the median over repetitions, and prints ours, JAX's
and the ratio ours/JAX (< 1: ours is faster).

The machine is small and shared (4 processes on 2 cores here), so absolute
numbers are noisy; only the side-by-side ratio is meant to be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _common
import jax
import numpy as np
from _common import MIB, flat_mesh, host_mesh
from jax.experimental import multihost_utils as jax_mhu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost as ours_mhu

WARMUP = 2  # untimed calls of each side before timing (compiles, fills caches)
CASE_TIMEOUT_S = 150.0


# -- inputs ----------------------------------------------------------------------


def _tree_of_leaves(n_leaves: int, total_bytes: int, seed: int) -> dict[str, np.ndarray]:
    """``n_leaves`` arrays of mixed dtypes and shapes, ``total_bytes`` in all (about)."""
    rng = np.random.default_rng(seed)
    per_leaf = max(4, total_bytes // n_leaves) // 4  # elements of 4 bytes
    tree: dict[str, np.ndarray] = {}
    for i in range(n_leaves):
        rows = 1 + i % 4  # vary the shapes a little: 1..4 rows
        cols = max(1, per_leaf // rows)
        if i % 3 == 2:
            leaf = rng.integers(-1000, 1000, size=(rows, cols), dtype=np.int32)
        else:
            leaf = rng.standard_normal((rows, cols), dtype=np.float32)
        tree[f'leaf{i:02d}'] = leaf
    return tree


# -- result comparison -----------------------------------------------------------


def _assert_same(ours: Any, theirs: Any) -> None:
    """Ours and JAX's results are the same pytree, leaf values, dtypes and layouts."""
    ours_leaves, ours_def = jax.tree.flatten(ours)
    jax_leaves, jax_def = jax.tree.flatten(theirs)
    assert ours_def == jax_def, f'tree structure differs: {ours_def} vs {jax_def}'
    for a, b in zip(ours_leaves, jax_leaves):
        assert type(a) is type(b) or (isinstance(a, jax.Array) and isinstance(b, jax.Array)), (
            f'leaf types differ: {type(a).__name__} vs {type(b).__name__}'
        )
        if not isinstance(a, jax.Array | np.ndarray):  # Python scalars, bools
            a, b = np.asarray(a), np.asarray(b)
        assert np.shape(a) == np.shape(b), f'shapes differ: {np.shape(a)} vs {np.shape(b)}'
        assert a.dtype == b.dtype, f'dtypes differ: {a.dtype} vs {b.dtype}'
        if isinstance(a, jax.Array):
            assert a.is_fully_addressable == b.is_fully_addressable
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (
                f'shardings differ: {a.sharding} vs {b.sharding}'
            )
            by_device = {s.device: s for s in b.addressable_shards}
            for s in a.addressable_shards:
                assert s.index == by_device[s.device].index
                np.testing.assert_array_equal(
                    np.asarray(s.data), np.asarray(by_device[s.device].data)
                )
        else:
            np.testing.assert_array_equal(a, b)


# -- cases -----------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """One benchmark case, built inside each worker process.

    Attributes:
        ours: calls our API once on the case's input.
        theirs: calls JAX's API once on the same input.
        compare: calls both once and checks they agree (raises AssertionError).
        inner: calls per timed repetition.
    """

    ours: Callable[[], Any]
    theirs: Callable[[], Any]
    compare: Callable[[], None]
    inner: int = 1


def _pair_case(
    ours: Callable[[], Any], theirs: Callable[[], Any], *, inner: int = 1, block: bool = False
) -> Case:
    """A case whose two sides return comparable pytrees.

    ``block``: the results are `jax.Array`s that may still be computing or
    transferring; time until they are ready. Left off for APIs returning numpy
    or Python values (already complete), to keep the timed call bare.
    """
    if block:
        ours_fn: Callable[[], Any] = lambda: jax.block_until_ready(ours())  # noqa: E731
        theirs_fn: Callable[[], Any] = lambda: jax.block_until_ready(theirs())  # noqa: E731
    else:
        ours_fn, theirs_fn = ours, theirs

    def compare() -> None:
        _assert_same(jax.block_until_ready(ours()), jax.block_until_ready(theirs()))

    return Case(ours_fn, theirs_fn, compare, inner)


def _case_broadcast_small() -> Case:
    x = np.arange(256, dtype=np.float32) + 1000 * jax.process_index()  # 1 KiB
    return _pair_case(
        lambda: ours_mhu.broadcast_one_to_all(x), lambda: jax_mhu.broadcast_one_to_all(x), inner=10
    )


def _case_broadcast_tree() -> Case:
    tree = _tree_of_leaves(20, 1 * MIB, seed=jax.process_index())
    return _pair_case(
        lambda: ours_mhu.broadcast_one_to_all(tree), lambda: jax_mhu.broadcast_one_to_all(tree)
    )


def _case_sync() -> Case:
    return _pair_case(
        lambda: ours_mhu.sync_global_devices('bench'),
        lambda: jax_mhu.sync_global_devices('bench'),
        inner=10,
    )


def _case_allgather_small() -> Case:
    x = np.arange(256, dtype=np.float32) + 1000 * jax.process_index()  # 1 KiB
    return _pair_case(
        lambda: ours_mhu.process_allgather(x), lambda: jax_mhu.process_allgather(x), inner=10
    )


def _case_allgather_8mib_stacked() -> Case:
    rng = np.random.default_rng(jax.process_index())
    x = rng.standard_normal((2048, 1024), dtype=np.float32)  # 8 MiB per host
    return _pair_case(lambda: ours_mhu.process_allgather(x), lambda: jax_mhu.process_allgather(x))


def _case_allgather_global_tiled() -> Case:
    mesh = flat_mesh()
    sharding = NamedSharding(mesh, P('x'))
    full = np.arange(2048 * 1024, dtype=np.float32).reshape(2048, 1024)  # 8 MiB global
    x = jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])
    assert not x.is_fully_addressable
    return _pair_case(
        lambda: ours_mhu.process_allgather(x, tiled=True),
        lambda: jax_mhu.process_allgather(x, tiled=True),
    )


def _case_allgather_tree() -> Case:
    tree = _tree_of_leaves(20, 20 * 64, seed=jax.process_index())  # 20 leaves of 64 B
    return _pair_case(
        lambda: ours_mhu.process_allgather(tree), lambda: jax_mhu.process_allgather(tree)
    )


def _case_assert_equal() -> Case:
    tree = _tree_of_leaves(20, 1 * MIB, seed=1234)  # the same on every host
    return _pair_case(
        lambda: ours_mhu.assert_equal(tree, 'bench'), lambda: jax_mhu.assert_equal(tree, 'bench')
    )


def _case_host_local_to_global() -> Case:
    mesh, spec = host_mesh(), P('host', 'dev')
    rng = np.random.default_rng(jax.process_index())
    local = rng.standard_normal((1024, 1024), dtype=np.float32)  # 4 MiB per host
    return _pair_case(
        lambda: ours_mhu.host_local_array_to_global_array(local, mesh, spec),
        lambda: jax_mhu.host_local_array_to_global_array(local, mesh, spec),
        inner=20,
        block=True,
    )


def _case_host_local_to_global_tree() -> Case:
    # Not in the required list: 20 tiny leaves expose the fixed per-leaf cost
    # that the 4 MiB copy above hides in noise.
    mesh, spec = host_mesh(), P('host', 'dev')
    tree = [np.full((2, 8), i + 100 * jax.process_index(), np.float32) for i in range(20)]
    return _pair_case(
        lambda: ours_mhu.host_local_array_to_global_array(tree, mesh, spec),
        lambda: jax_mhu.host_local_array_to_global_array(tree, mesh, spec),
        inner=10,
        block=True,
    )


def _case_global_to_host_local() -> Case:
    mesh, spec = host_mesh(), P('host', 'dev')
    rng = np.random.default_rng(jax.process_index())
    local = rng.standard_normal((1024, 1024), dtype=np.float32)  # 4 MiB per host
    glob = jax.block_until_ready(jax_mhu.host_local_array_to_global_array(local, mesh, spec))
    return _pair_case(
        lambda: ours_mhu.global_array_to_host_local_array(glob, mesh, spec),
        lambda: jax_mhu.global_array_to_host_local_array(glob, mesh, spec),
        inner=500,
        block=True,
    )


def _case_preemption() -> Case:
    # Every process calls with the same, increasing step ids (both sides share
    # the one preemption sync manager, so they share the counter too).
    steps = itertools.count()
    return _pair_case(
        lambda: ours_mhu.reached_preemption_sync_point(next(steps)),
        lambda: jax_mhu.reached_preemption_sync_point(next(steps)),
        inner=2000,
    )


def _case_live_devices() -> Case:
    devices = jax.devices()

    def ours() -> list[Any]:
        with ours_mhu.live_devices(devices) as live:
            return [d.id for d in live]

    def theirs() -> list[Any]:
        with jax_mhu.live_devices(devices) as live:
            return [d.id for d in live]

    return _pair_case(ours, theirs, inner=20)


# id -> (API, description of the input, case builder). Runs in table order.
CASES: dict[str, tuple[str, str, Callable[[], Case]]] = {
    'broadcast_small': ('broadcast_one_to_all', '1 KiB f32', _case_broadcast_small),
    'broadcast_tree': ('broadcast_one_to_all', 'tree 20 leaves, 1 MiB', _case_broadcast_tree),
    'sync': ('sync_global_devices', 'name="bench"', _case_sync),
    'allgather_small': ('process_allgather', '1 KiB f32, stacked', _case_allgather_small),
    'allgather_8mib': (
        'process_allgather',
        '8 MiB/host f32, stacked',
        _case_allgather_8mib_stacked,
    ),
    'allgather_global': (
        'process_allgather',
        "global 8 MiB P('x'), tiled",
        _case_allgather_global_tiled,
    ),
    'allgather_tree': ('process_allgather', 'tree 20 leaves x 64 B', _case_allgather_tree),
    'assert_equal': ('assert_equal', 'tree 20 leaves, 1 MiB, equal', _case_assert_equal),
    'local_to_global': (
        'host_local_array_to_global_array',
        "4 MiB/host, P('host','dev')",
        _case_host_local_to_global,
    ),
    'local_to_global_tree': (
        'host_local_array_to_global_array',
        "tree 20 leaves x 64 B, P('host','dev')",
        _case_host_local_to_global_tree,
    ),
    'global_to_local': (
        'global_array_to_host_local_array',
        "16 MiB global, P('host','dev')",
        _case_global_to_host_local,
    ),
    'preemption': ('reached_preemption_sync_point', 'no preemption', _case_preemption),
    'live_devices': ('live_devices', 'enter+exit, jax.devices()', _case_live_devices),
}


# -- worker side -----------------------------------------------------------------


def run_case(case_id: str, reps: int) -> dict[str, Any]:
    """Runs in every process: check, warm up, then time ours and JAX's interleaved.

    Returns this process's per-repetition seconds for both sides, the number of
    calls per repetition, and the comparison error (None when they agree).
    """
    case = CASES[case_id][2]()
    mismatch: str | None = None
    try:
        case.compare()
    except AssertionError as exc:
        # Keep going (every process must make the same collective calls); the
        # parent reports the mismatch.
        mismatch = f'process {jax.process_index()}: {exc}'
    for _ in range(WARMUP):
        case.ours()
        case.theirs()
    ours_s: list[float] = []
    jax_s: list[float] = []
    for _ in range(reps):
        ours_s += _common.per_call(case.ours, 1, case.inner)
        jax_s += _common.per_call(case.theirs, 1, case.inner)
    return {'ours': ours_s, 'jax': jax_s, 'inner': case.inner, 'mismatch': mismatch}


# -- parent side -----------------------------------------------------------------


def _summarize(case_id: str, per_process: list[dict[str, Any]]) -> dict[str, Any]:
    """Per repetition: max over processes; then the median over repetitions (ms)."""
    api, desc, _ = CASES[case_id]
    ours_ms = _common.slowest_ms([p['ours'] for p in per_process])
    jax_ms = _common.slowest_ms([p['jax'] for p in per_process])
    ours_med, jax_med = statistics.median(ours_ms), statistics.median(jax_ms)
    mismatches = [p['mismatch'] for p in per_process if p['mismatch']]
    return {
        'case_id': case_id,
        'api': api,
        'case': desc,
        'inner': per_process[0]['inner'],
        'ours_ms': ours_med,
        'jax_ms': jax_med,
        'ratio': ours_med / jax_med,
        'ours_rep_ms': ours_ms,
        'jax_rep_ms': jax_ms,
        'per_process_s': {
            'ours': [p['ours'] for p in per_process],
            'jax': [p['jax'] for p in per_process],
        },
        'mismatch': mismatches or None,
    }


def _fmt_ms(ms: float) -> str:
    """Milliseconds with about 4 significant digits (sub-microsecond calls stay readable)."""
    return f'{ms:.1f}' if ms >= 100 else f'{ms:.3f}' if ms >= 1 else f'{ms:.4g}'


def _print_table(rows: list[dict[str, Any]]) -> None:
    head = ('API', 'case', 'ours ms', 'jax ms', 'ours/jax')
    cells = [
        (
            r['api'],
            r['case'] + (f' (x{r["inner"]})' if r['inner'] > 1 else ''),
            _fmt_ms(r['ours_ms']),
            _fmt_ms(r['jax_ms']),
            f'{r["ratio"]:.2f}' + ('  MISMATCH' if r['mismatch'] else ''),
        )
        for r in rows
    ]
    widths = [max(len(str(c[i])) for c in [head, *cells]) for i in range(len(head))]

    def line(c: tuple[str, ...]) -> str:
        return '  '.join(
            str(v).ljust(w) if i < 2 else str(v).rjust(w) for i, (v, w) in enumerate(zip(c, widths))
        )

    print(line(head))
    print('  '.join('-' * w for w in widths))
    for c in cells:
        print(line(c))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--reps', type=int, default=7, help='timed repetitions per side and case (default 7; >= 5)'
    )
    parser.add_argument('--json', metavar='PATH', help='also write all timings as JSON')
    parser.add_argument(
        '--cases',
        metavar='ID,...',
        help=f'run only these cases (default: all of {", ".join(CASES)})',
    )
    args = parser.parse_args(argv)
    if args.reps < 5:
        parser.error('--reps must be >= 5')
    case_ids = args.cases.split(',') if args.cases else list(CASES)
    unknown = [c for c in case_ids if c not in CASES]
    if unknown:
        parser.error(f'unknown case(s) {unknown}; choose from {list(CASES)}')

    env = _common.environment()
    print('environment: ' + ', '.join(f'{k}={v}' for k, v in env.items()))
    print(
        f'method: median over {args.reps} interleaved reps (after {WARMUP} warm-up calls) '
        'of the slowest process per rep; "(xN)": N calls per rep, time per call'
    )
    t_start = time.perf_counter()
    rows = []
    with _common.local_cluster() as cluster:
        print(f'cluster up in {time.perf_counter() - t_start:.1f} s', flush=True)
        for case_id in case_ids:
            per_process = cluster.run(run_case, case_id, args.reps, timeout=CASE_TIMEOUT_S)
            rows.append(_summarize(case_id, per_process))
    print()
    _print_table(rows)
    total = time.perf_counter() - t_start
    print(f'\ntotal {total:.1f} s; ratio < 1: ours faster')

    bad = [r for r in rows if r['mismatch']]
    for r in bad:
        print(f'MISMATCH in {r["api"]} ({r["case"]}):\n  ' + '\n  '.join(r['mismatch']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(
                {
                    'environment': env,
                    'reps': args.reps,
                    'warmup': WARMUP,
                    'total_s': total,
                    'results': rows,
                },
                f,
                indent=1,
            )
        print(f'wrote {args.json}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
