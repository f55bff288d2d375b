"""Diagnostics benchmark: what `multihost`'s debugging features cost, side by side.

Usage::

    python bench/diagnostics.py [--reps N] [--jax-reps M] [--only SECTION ...]

Method
------
One `LocalCluster` of 4 real JAX processes x 2 CPU devices runs every section.
A section is a function ``section_<name>(cluster, args) -> list[Row]`` listed
in `SECTIONS`; it runs one worker function in every process (``cluster.run``)
and turns the per-process timings into rows. To add a section (barrier
latency, sequence-check overhead, ...), write such a function and add it to
`SECTIONS`; `main` prints every row in one table.

Inside a worker, each repetition starts at a coordination-service barrier
(not timed), so every process starts together; the worker records its own
seconds per repetition. Per repetition the parent takes the max over
processes (a multi-host program waits for its slowest host), then the median
over repetitions. Each side is warmed up once first (compilation excluded).

The machine is small and shared (4 processes on 2 cores here): absolute times
are noisy; read the ratios of sides measured in the same run.

Sections
--------
``assert_equal``: a 1,000-leaf, 31.25 MiB float32 tree, equal on every host:
``multihost.assert_equal`` (fingerprints through the coordination service)
vs ``jax.experimental.multihost_utils.assert_equal`` (gathers every host's
whole tree to every host). JAX's takes ~20 s per call here, so it runs
``--jax-reps`` repetitions (default 3) and ours ``--reps`` (default 7). An
extra row times ours when one 32 KiB leaf differs on one host (it then also
moves that leaf and raises `HostMismatchError`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import _common
import jax
import numpy as np
from _common import MIB, NUM_PROCESSES, per_call, slowest_median_ms
from jax.experimental import multihost_utils as jax_mhu

import multihost
from multihost.testing import LocalCluster

SECTION_TIMEOUT_S = 1800.0


@dataclasses.dataclass
class Row:
    """One line of the report: a case timed on our side and, optionally, a reference side.

    ``ours_ms`` / ``ref_ms`` are medians over repetitions of the slowest
    process; ``ref_ms`` is None for cases without a reference.
    """

    section: str
    case: str
    ours_ms: float
    ref_ms: float | None = None
    ours_reps: int = 0
    ref_reps: int = 0
    note: str = ''

    @property
    def speedup(self) -> float | None:
        """Reference time / ours (> 1: ours is faster)."""
        return None if self.ref_ms is None else self.ref_ms / self.ours_ms


# -- section: assert_equal -------------------------------------------------------------

ASSERT_EQUAL_LEAVES = 1000
ASSERT_EQUAL_LEAF_ELEMENTS = 8192  # float32: 32 KiB per leaf, 31.25 MiB in all
_LEAF_SHAPES = [(8192,), (8, 1024), (16, 512), (4, 2048)]


def _big_tree() -> dict[str, Any]:
    """1,000 float32 leaves of 32 KiB (shapes vary), nested two levels; same on every host."""
    rng = np.random.default_rng(1234)
    tree: dict[str, Any] = {}
    for i in range(ASSERT_EQUAL_LEAVES):
        shape = _LEAF_SHAPES[i % len(_LEAF_SHAPES)]
        block = tree.setdefault(f'block_{i // 50:02d}', {})
        block[f'param_{i % 50:02d}'] = rng.standard_normal(shape, dtype=np.float32)
    return tree


def _run_assert_equal(reps: int, jax_reps: int) -> dict[str, Any]:
    """In every process: time ours (equal, then one leaf differing) and JAX's (equal)."""
    tree = _big_tree()
    nbytes = sum(x.nbytes for x in jax.tree.leaves(tree))

    def ours() -> None:
        multihost.assert_equal(tree, 'bench')

    def theirs() -> None:
        jax_mhu.assert_equal(tree, 'bench')

    odd_tree = jax.tree.map(lambda x: x, tree)  # new containers, same leaves
    if jax.process_index() == NUM_PROCESSES - 1:
        leaf = odd_tree['block_07']['param_13'].copy()
        leaf.reshape(-1)[100] += 1.0
        odd_tree['block_07']['param_13'] = leaf

    def ours_differing() -> None:
        try:
            multihost.assert_equal(odd_tree, 'bench')
        except multihost.HostMismatchError as exc:
            assert [leaf.path for leaf in exc.diff.leaves] == ["['block_07']['param_13']"]
        else:
            raise AssertionError('assert_equal passed on differing trees')

    ours()  # warm-up (and a check that equal trees pass)
    ours_differing()  # warm-up (compiles the broadcast of the differing leaf)
    theirs()  # warm-up (JAX compiles its gathers)
    ours_s, diff_s = [], []
    for _ in range(reps):  # interleaved, so drift in machine load hits both alike
        ours_s += per_call(ours, 1)
        diff_s += per_call(ours_differing, 1)
    jax_s = per_call(theirs, jax_reps)
    return {'ours': ours_s, 'ours_differing': diff_s, 'jax': jax_s, 'nbytes': nbytes}


def section_assert_equal(cluster: LocalCluster, args: argparse.Namespace) -> list[Row]:
    """assert_equal on a 1,000-leaf ~32 MiB tree: ours vs JAX's."""
    jax_reps = min(args.jax_reps, args.reps)
    per = cluster.run(_run_assert_equal, args.reps, jax_reps, timeout=SECTION_TIMEOUT_S)
    mib = per[0]['nbytes'] / MIB
    case = f'{ASSERT_EQUAL_LEAVES} leaves, {mib:.2f} MiB f32'
    return [
        Row(
            'assert_equal',
            f'{case}, equal',
            slowest_median_ms([p['ours'] for p in per]),
            slowest_median_ms([p['jax'] for p in per]),
            args.reps,
            jax_reps,
            note=f'JAX: {jax_reps} reps (slow: one call takes seconds)',
        ),
        Row(
            'assert_equal',
            f'{case}, 1 leaf differs on 1 process (ours raises)',
            slowest_median_ms([p['ours_differing'] for p in per]),
            None,
            args.reps,
        ),
    ]


# -- section: barriers --------------------------------------------------------------------

BARRIER_CALLS = 20  # calls per repetition (a single call is close to the timer's noise)


def _run_barriers(reps: int) -> dict[str, list[float]]:
    from jax.experimental import multihost_utils as jmu

    import multihost

    cases = {
        'ours barrier': lambda: multihost.barrier('bench'),
        'ours sync_global_devices': lambda: multihost.sync_global_devices('bench'),
        'jax sync_global_devices': lambda: jmu.sync_global_devices('bench'),
    }
    for fn in cases.values():  # warm up (JAX compiles its allgather)
        fn()
        fn()
    return _common.interleaved(cases, reps, BARRIER_CALLS)


def section_barriers(cluster: LocalCluster, args: argparse.Namespace) -> list[Row]:
    """Barrier latency: our coordination-service barrier vs JAX's sync_global_devices."""
    per = cluster.run(_run_barriers, args.reps, timeout=SECTION_TIMEOUT_S)
    jax_ms = slowest_median_ms([p['jax sync_global_devices'] for p in per])
    rows = []
    for key in ('ours barrier', 'ours sync_global_devices'):
        rows.append(
            Row(
                'barrier',
                f'{key} (x{BARRIER_CALLS})',
                slowest_median_ms([p[key] for p in per]),
                jax_ms,
                args.reps,
                args.reps,
                note='ref: jax sync_global_devices; goal: not slower, <= 2 ms',
            )
        )
    return rows


# -- section: sequence-check overhead --------------------------------------------------------


def _run_check_overhead(reps: int) -> dict[str, list[float]]:
    import os

    import multihost
    from multihost._core import _collectives
    from multihost._exchange import _sequence

    # Just above the small-exchange limit, so both runs take the device path
    # and differ only by the check.
    x = np.arange(_collectives.SMALL_EXCHANGE_BYTES // 4 // 4 + 1024, dtype=np.float32)

    def gather() -> None:
        multihost.process_allgather(x)

    def enter() -> None:
        _sequence.enter('bench', 'overhead')

    gather()
    out: dict[str, list[float]] = {'checked': [], 'unchecked': [], 'enter': []}
    for _ in range(reps):
        os.environ['MULTIHOST_CHECK'] = '1'
        out['checked'].extend(per_call(gather, 1, BARRIER_CALLS))
        os.environ['MULTIHOST_CHECK'] = '0'
        out['unchecked'].extend(per_call(gather, 1, BARRIER_CALLS))
        out['enter'].extend(per_call(enter, 1, BARRIER_CALLS))
    os.environ.pop('MULTIHOST_CHECK', None)
    return out


def section_check_overhead(cluster: LocalCluster, args: argparse.Namespace) -> list[Row]:
    """What the collective-sequence check adds to each collective."""
    per = cluster.run(_run_check_overhead, args.reps, timeout=SECTION_TIMEOUT_S)
    checked = slowest_median_ms([p['checked'] for p in per])
    unchecked = slowest_median_ms([p['unchecked'] for p in per])
    enter = slowest_median_ms([p['enter'] for p in per])
    return [
        Row(
            'sequence check',
            '260 KiB/host process_allgather (device path), checked vs MULTIHOST_CHECK=0',
            checked,
            unchecked,
            args.reps,
            args.reps,
            note=f'overhead {checked - unchecked:.2f} ms per collective (goal <= 2 ms)',
        ),
        Row(
            'sequence check',
            'the check alone (_sequence.enter)',
            enter,
            None,
            args.reps,
            note='record + publish + barrier + compare',
        ),
    ]


# id -> section. Runs in this order; add new sections here.
SECTIONS: dict[str, Callable[[LocalCluster, argparse.Namespace], list[Row]]] = {
    'assert_equal': section_assert_equal,
    'barriers': section_barriers,
    'check_overhead': section_check_overhead,
}


# -- parent side -----------------------------------------------------------------------


def _print_table(rows: list[Row]) -> None:
    head = ('section', 'case', 'ours ms', 'ref ms', 'speedup', 'note')
    cells = [
        (
            r.section,
            r.case,
            f'{r.ours_ms:.1f}',
            '-' if r.ref_ms is None else f'{r.ref_ms:.1f}',
            '-' if r.speedup is None else f'{r.speedup:.0f}x',
            r.note,
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    for c in [head, tuple('-' * w for w in widths), *cells]:
        print(
            '  '.join(
                v.rjust(w) if 2 <= i <= 4 else v.ljust(w) for i, (v, w) in enumerate(zip(c, widths))
            ).rstrip()
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--reps', type=int, default=7, help='timed repetitions of our side (default 7)'
    )
    parser.add_argument(
        '--jax-reps',
        type=int,
        default=3,
        help="timed repetitions of JAX's slow side (default 3, at most --reps)",
    )
    parser.add_argument(
        '--only',
        nargs='+',
        choices=sorted(SECTIONS),
        metavar='SECTION',
        help=f'run only these sections (of: {", ".join(SECTIONS)})',
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.jax_reps < 1:
        parser.error('--reps and --jax-reps must be >= 1')

    env = _common.environment()
    print('environment: ' + ', '.join(f'{k}={v}' for k, v in env.items()))
    print(
        'method: per rep the slowest process, then the median over reps; each side '
        'warmed up once; speedup = ref / ours',
        flush=True,
    )
    t_start = time.perf_counter()
    rows: list[Row] = []
    with _common.local_cluster() as cluster:
        print(f'cluster up in {time.perf_counter() - t_start:.1f} s', flush=True)
        for name in args.only or SECTIONS:
            t0 = time.perf_counter()
            rows += SECTIONS[name](cluster, args)
            print(f'section {name}: {time.perf_counter() - t0:.1f} s', flush=True)
    print()
    _print_table(rows)
    print(f'\ntotal {time.perf_counter() - t_start:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
