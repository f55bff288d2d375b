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

Part 2: a training step of a real program
-----------------------------------------
`tests/_flax_job.py` (flax linen transformer, optax adamw, orbax async
checkpoints every 2 steps; it imports nothing of `multihost`) in
``--job-hosts`` (default 2) plain processes x 2 CPU devices launched like a
scheduler, alternately as ``python _flax_job.py`` (uninstalled) and
``python -m multihost run _flax_job.py`` (installed), and with everything a
user may turn on (``--hold-on-error --dump-dir DIR --control-file F``: the
hold armed, the dump triggers, the faulthandler stacks file, the control
endpoint, the CPU sampler): ``--job-blocks`` process groups per mode
(default 3), the order reversed every block. The interleaving is
per process group, not per step: a process cannot switch between an
installed and an uninstalled step of an unmodified program. Each run's first
two steps compile and are dropped; a step's figure is the slowest process's
wall time of ``train_step`` plus reading its loss (the script's ``STEP`` line),
pooled over blocks: median and spread (10th-90th percentile), and the ratio
of the medians. The losses of the two modes are compared bit for bit.

Part 3: install itself and the start-up hook
--------------------------------------------
* ``install()`` in ``--fresh`` (default 7) fresh processes that imported
  flax, optax and orbax first (the first call: it imports the patchers);
  median and range. Goal <= 50 ms.
* the ``multihost-install.pth`` hook with ``MULTIHOST_INSTALL`` unset:
  ``python -c pass`` of a temporary venv, ``--starts`` (default 40) times
  each, alternating with the hook present and absent from its
  site-packages; and the hook's line alone, executed in-process.

The machine is small and shared (4 processes on 2 cores here): absolute
times are noisy; read the paired differences.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
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
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_JOB = os.path.join(_ROOT, 'tests', '_flax_job.py')
_PTH = os.path.join(_ROOT, 'multihost-install.pth')


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


# -- part 2: a training step of a real program ---------------------------------------------


def _job_run(mode: str, hosts: int, steps: int) -> tuple[list[list[float]], list[str]]:
    """One run of `_flax_job.py` in ``hosts`` plain processes: per process its step seconds,
    and process 0's losses (``float.hex``). ``mode``: ``'uninstalled'`` (plain python),
    ``'installed'`` (``multihost run``) or ``'everything'`` (``multihost run --hold-on-error
    --dump-dir DIR --control-file F``: hold on error armed, dumps with their triggers, the
    faulthandler stacks file, the control endpoint)."""
    from multihost.testing import scheduler_env, start_job

    with tempfile.TemporaryDirectory(prefix='mh-bench-job-') as tmp:
        command = {
            'uninstalled': [_JOB],
            'installed': ['-m', 'multihost', 'run', _JOB],
            'everything': ['-m', 'multihost', 'run', '--hold-on-error', '--dump-dir',
                           os.path.join(tmp, 'dumps'), '--control-file',
                           os.path.join(tmp, 'control.json'), _JOB],
        }[mode]  # fmt: skip
        env = scheduler_env(hosts, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS=str(steps))
        with start_job(hosts, command, env, cwd=tmp) as job:
            results = job.finish(900)
    per: list[list[float]] = []
    for rc, out, err in results:
        if rc != 0 or 'DONE' not in out:
            raise RuntimeError(f'the job failed (exit {rc}):\n{err[-3000:]}')
        per.append(
            [float(line.split()[2]) for line in out.splitlines() if line.startswith('STEP ')]
        )
    losses = [line.split()[2] for line in results[0][1].splitlines() if line.startswith('LOSS ')]
    return per, losses


#: Part 2's modes (`_job_run`), run in this order, then reversed, block after block.
MODES = ('uninstalled', 'installed', 'everything')


def _part2(hosts: int, steps: int, blocks: int) -> dict[str, Any]:
    """Both modes, ``blocks`` process groups each, the order flipped every block."""
    modes = MODES
    slowest: dict[str, list[float]] = {m: [] for m in modes}
    per_block: dict[str, list[float]] = {m: [] for m in modes}
    losses: dict[str, set[tuple[str, ...]]] = {m: set() for m in modes}
    for block in range(blocks):
        for mode in modes if block % 2 == 0 else modes[::-1]:
            per, lo = _job_run(mode, hosts, steps)
            times = [max(p[s] for p in per) for s in range(2, steps)]  # 0 and 1 compile
            slowest[mode] += times
            per_block[mode].append(statistics.median(times))
            losses[mode].add(tuple(lo))
            print(f'  part 2 block {block} {mode}: median step {per_block[mode][-1] * 1e3:.1f} ms')
    out: dict[str, Any] = {'hosts': hosts, 'steps_per_run': steps - 2, 'blocks': blocks}
    for mode in modes:
        ms = [t * 1e3 for t in slowest[mode]]
        out[mode] = {
            'n': len(ms),
            'median_ms': statistics.median(ms),
            'p10_ms': _percentile(ms, 10),
            'p90_ms': _percentile(ms, 90),
            'block_medians_ms': [t * 1e3 for t in per_block[mode]],
        }
    out['ratio'] = out['installed']['median_ms'] / out['uninstalled']['median_ms']
    out['ratio_everything'] = out['everything']['median_ms'] / out['uninstalled']['median_ms']
    out['losses_bitwise_equal'] = len(set.union(*losses.values())) == 1
    return out


# -- part 3: install itself and the start-up hook ------------------------------------------

_INSTALL_CODE = (
    'import time, flax.linen, flax.training.checkpoints, optax, orbax.checkpoint\n'
    'import multihost\n'
    't = time.perf_counter(); multihost.install(); t = time.perf_counter() - t\n'
    'from jax.experimental import multihost_utils as m\n'
    'assert flax.training.checkpoints.sync_global_devices is m.sync_global_devices\n'
    'print(t)\n'
)


def _install_fresh(n: int) -> list[float]:
    """Seconds of the first `install()` in each of ``n`` fresh processes (libraries imported)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('MULTIHOST_')}
    env.update(PYTHONPATH=_ROOT, JAX_PLATFORMS='cpu')
    out = []
    for _ in range(n):
        done = subprocess.run(
            [sys.executable, '-c', _INSTALL_CODE],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        out.append(float(done.stdout.split()[-1]))
    return out


def _hook_startup(n: int) -> dict[str, list[float]]:
    """``python -c pass`` of a temporary venv, alternating with the hook present and absent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('MULTIHOST_', 'PYTHON'))}
    out: dict[str, list[float]] = {'absent': [], 'present': []}
    with tempfile.TemporaryDirectory(prefix='mh-bench-venv-') as tmp:
        base = getattr(sys, '_base_executable', sys.executable)
        subprocess.run([base, '-m', 'venv', '--without-pip', tmp], check=True, timeout=300)
        python = os.path.join(tmp, 'bin', 'python')
        site = subprocess.run(
            [python, '-c', 'import site; print(site.getsitepackages()[0])'],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        hook = os.path.join(site, os.path.basename(_PTH))
        for _ in range(3):  # warm the file cache
            subprocess.run([python, '-c', 'pass'], env=env, check=True)
        for i in range(n):
            for mode in ('absent', 'present') if i % 2 == 0 else ('present', 'absent'):
                if mode == 'present':
                    shutil.copy(_PTH, hook)
                elif os.path.exists(hook):
                    os.remove(hook)
                t0 = time.perf_counter()
                subprocess.run([python, '-c', 'pass'], env=env, check=True)
                out[mode].append(time.perf_counter() - t0)
        # The hook is live in this venv: asked to install, it runs (and fails there: no jax).
        shutil.copy(_PTH, hook)
        asked = subprocess.run(
            [python, '-c', 'pass'],
            env={**env, 'MULTIHOST_INSTALL': '1'},
            capture_output=True,
            text=True,
        )
        assert os.path.basename(_PTH) in asked.stderr, asked.stderr
    return out


def _hook_in_process() -> tuple[float, float]:
    """With ``MULTIHOST_INSTALL`` unset, in us: the hook's line executed alone, and the whole
    file processed as ``site`` does at start (`site.addpackage`: open, read, execute)."""
    import site

    with open(_PTH) as f:
        code = compile(f.read().strip(), _PTH, 'exec')
    folder, name = os.path.split(_PTH)
    saved = os.environ.pop('MULTIHOST_INSTALL', None)
    try:
        n = 100_000
        line = min(timeit.repeat(lambda: exec(code, {}), number=n, repeat=5)) / n
        n = 5_000
        known: set[str] = set()
        whole = min(timeit.repeat(lambda: site.addpackage(folder, name, known), number=n, repeat=5))
        return line * 1e6, whole / n * 1e6
    finally:
        if saved is not None:
            os.environ['MULTIHOST_INSTALL'] = saved


def _part3(fresh: int, starts: int) -> dict[str, Any]:
    inst = [t * 1e3 for t in _install_fresh(fresh)]
    startup = _hook_startup(starts)
    absent = [t * 1e3 for t in startup['absent']]
    present = [t * 1e3 for t in startup['present']]
    diffs = [p - a for p, a in zip(present, absent, strict=True)]
    return {
        'install_ms': {
            'n': len(inst),
            'median': statistics.median(inst),
            'min': min(inst),
            'max': max(inst),
        },
        'startup_ms': {
            'n': len(absent),
            'absent_median': statistics.median(absent),
            'present_median': statistics.median(present),
            'paired_diff_median': statistics.median(diffs),
            'paired_diff_p10': _percentile(diffs, 10),
            'paired_diff_p90': _percentile(diffs, 90),
        },
        **dict(zip(('hook_line_us', 'hook_file_us'), _hook_in_process(), strict=True)),
    }


def _report23(part2: dict[str, Any] | None, part3: dict[str, Any] | None) -> None:
    rows: list[tuple[str, str, str]] = []
    if part2 is not None:
        for mode in MODES:
            r = part2[mode]
            blocks = ', '.join(f'{b:.1f}' for b in r['block_medians_ms'])
            rows.append(
                (
                    f'train step {mode}',
                    f'{r["median_ms"]:.1f} ms',
                    f'p10-p90 {r["p10_ms"]:.1f}-{r["p90_ms"]:.1f}, n={r["n"]}, '
                    f'block medians {blocks}',
                )
            )
        rows.append(
            (
                'train step ratio',
                f'{part2["ratio"]:.3f}',
                'installed / uninstalled medians; losses bitwise equal: '
                f'{"yes" if part2["losses_bitwise_equal"] else "NO"}',
            )
        )
        rows.append(
            (
                'train step ratio, everything on',
                f'{part2["ratio_everything"]:.3f}',
                '--hold-on-error --dump-dir --control-file / uninstalled medians',
            )
        )
    if part3 is not None:
        i = part3['install_ms']
        rows.append(
            (
                'install() flax/optax/orbax',
                f'{i["median"]:.1f} ms',
                f'min-max {i["min"]:.1f}-{i["max"]:.1f}, {i["n"]} fresh processes; goal <= 50 ms: '
                f'{"met" if i["median"] <= 50 else "NOT met"}',
            )
        )
        s = part3['startup_ms']
        rows.append(
            (
                'python -c pass, no hook',
                f'{s["absent_median"]:.2f} ms',
                f'temporary venv, n={s["n"]}',
            )
        )
        rows.append(
            ('python -c pass, hook', f'{s["present_median"]:.2f} ms', 'MULTIHOST_INSTALL unset')
        )
        rows.append(
            (
                'hook cost at start',
                f'{s["paired_diff_median"]:+.2f} ms',
                f'paired (present - absent), p10-p90 {s["paired_diff_p10"]:+.2f} to '
                f'{s["paired_diff_p90"]:+.2f}',
            )
        )
        rows.append(
            (
                'hook line alone',
                f'{part3["hook_line_us"]:.2f} us',
                'in-process, best of 5 x 100000',
            )
        )
        rows.append(
            (
                'hook file processed',
                f'{part3["hook_file_us"]:.1f} us',
                'in-process site.addpackage (open, read, execute), best of 5 x 5000',
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for r in rows:
        print(f'  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]}')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--parts', default='123', help='which parts to run (e.g. 23)')
    parser.add_argument('--reps', type=int, default=30)
    parser.add_argument('--calls', type=int, default=50)
    parser.add_argument('--leaves', type=int, default=32)
    parser.add_argument('--job-hosts', type=int, default=2)
    parser.add_argument('--job-steps', type=int, default=12, help='steps per run (2 compile)')
    parser.add_argument('--job-blocks', type=int, default=3)
    parser.add_argument('--fresh', type=int, default=7)
    parser.add_argument('--starts', type=int, default=40)
    parser.add_argument('--json', help='also write the results here')
    args = parser.parse_args(argv)
    env = _common.environment()
    print(json.dumps(env))
    results: dict[str, Any] = {}
    if '1' in args.parts:
        with _common.local_cluster() as cluster:
            per = cluster.run(_part1, args.reps, args.calls, args.leaves, timeout=1800)
        results['part1'] = _report(per, args)
    if '2' in args.parts:
        results['part2'] = _part2(args.job_hosts, args.job_steps, args.job_blocks)
    if '3' in args.parts:
        results['part3'] = _part3(args.fresh, args.starts)
    if '2' in args.parts or '3' in args.parts:
        print(
            f'bench/install.py parts 2-3: a real training step ({args.job_hosts} processes x 2 '
            'devices, tests/_flax_job.py), install() and the start-up hook'
        )
        _report23(results.get('part2'), results.get('part3'))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'env': env, **results}, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
