"""What ``multihost run --hold-on-error`` costs a job where nothing goes wrong, side by side.

Usage::

    python bench/hold.py [--hosts 2] [--steps 120] [--blocks 2] [--modes M,...] [--json PATH]

`tests/_flax_job.py` (flax linen transformer, optax adamw, orbax async checkpoints every
2 steps; it imports nothing of `multihost`) in ``--hosts`` plain processes x 2 CPU devices,
launched like a scheduler, three ways:

* ``plain``: ``python _flax_job.py`` (no toolkit at all);
* ``installed``: ``python -m multihost run _flax_job.py``;
* ``hold``: ``python -m multihost run --hold-on-error --dump-dir D --control-file F
  _flax_job.py`` (everything a user turns on to hold a failing job and inspect it: the
  hold armed, the dump triggers, the control endpoint);
* ``hold-before-launch``: ``hold`` with ``--check-jit``: every launch that spans processes
  meets the other hosts before it is dispatched, so a hold finds the others before the
  launch, their donated state still readable (issue 44: what would it cost as the default
  of ``--hold-on-error``?).

``--blocks`` process groups per mode, the order reversed every block. Each run's first two
steps compile and are dropped; a step's figure is the slowest process's wall time of
``train_step`` plus reading its loss. Reported per mode: median and mean step (pooled over
blocks), their ratios to ``installed`` and to ``plain``, the spread between blocks of one
mode (the noise the ratios sit in), and whether the losses are bitwise equal.

Goal (issue 29): ``hold`` within the noise of ``installed`` (nothing runs until an error).
Issue 44 measures ``hold-before-launch`` against ``hold``: the price of a meeting per launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import _common

MODES = ('plain', 'installed', 'hold', 'hold-before-launch')


def _launch(mode: str, tmp: str) -> list[str]:
    if mode == 'plain':
        return [_common.FLAX_JOB]
    flags = []
    if mode.startswith('hold'):
        flags = ['--hold-on-error', '--dump-dir', f'{tmp}/dumps', '--control-file', f'{tmp}/c']
    if mode == 'hold-before-launch':
        flags.append('--check-jit')
    return ['-m', 'multihost', 'run', *flags, _common.FLAX_JOB]


def measure(hosts: int, steps: int, blocks: int, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    runs = _common.alternating_blocks(
        modes, blocks, lambda m: _common.run_flax_job(lambda tmp: _launch(m, tmp), hosts, steps)
    )
    pooled = {m: [t for r in runs[m] for t in r['times']] for m in modes}
    block_medians = {m: [statistics.median(r['times']) * 1e3 for r in runs[m]] for m in modes}
    losses = {r['losses'] for m in modes for r in runs[m]}
    out: dict[str, Any] = {'hosts': hosts, 'steps_per_run': steps - 2, 'blocks': blocks}
    for mode in modes:
        ms = [t * 1e3 for t in pooled[mode]]
        meds = block_medians[mode]
        out[mode] = {
            'n': len(ms),
            'median_ms': statistics.median(ms),
            'mean_ms': statistics.mean(ms),
            'block_spread': (max(meds) - min(meds)) / statistics.median(meds) if meds else 0.0,
        }
    for mode in modes:
        for base in ('plain', 'installed', 'hold'):
            if base in out:
                out[mode][f'median_vs_{base}'] = out[mode]['median_ms'] / out[base]['median_ms']
                out[mode][f'mean_vs_{base}'] = out[mode]['mean_ms'] / out[base]['mean_ms']
    out['losses_bitwise_equal'] = len(losses) == 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hosts', type=int, default=2)
    parser.add_argument('--steps', type=int, default=120, help='steps per run (2 compile)')
    parser.add_argument('--blocks', type=int, default=2)
    parser.add_argument('--json', help='also write the results here')
    parser.add_argument(
        '--modes',
        default=','.join(MODES),
        help=f'the modes to compare, comma-separated (default: {",".join(MODES)})',
    )
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(',') if m)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f'--modes: unknown {unknown}; choose from {", ".join(MODES)}')
    env = _common.environment()
    print(json.dumps(env))
    res = measure(args.hosts, args.steps, args.blocks, modes)
    print(
        f'bench/hold.py: tests/_flax_job.py, {args.hosts} processes x 2 CPU devices, '
        f'{res["steps_per_run"]} timed steps per run, {args.blocks} block(s) per mode'
    )
    for mode in modes:
        m = res[mode]
        ratios = ', '.join(
            f'x{m[f"median_vs_{b}"]:.3f} of {b}' for b in ('installed', 'plain', 'hold') if b in res
        )
        means = ', '.join(
            f'x{m[f"mean_vs_{b}"]:.3f} of {b}' for b in ('installed', 'hold') if b in res
        )
        print(
            f'  {mode:18s}: median {m["median_ms"]:.1f} ms ({ratios}), mean {m["mean_ms"]:.1f} '
            f'ms ({means}); blocks differ by {100 * m["block_spread"]:.1f}%'
        )
    print(f'  losses bitwise equal in every mode: {res["losses_bitwise_equal"]}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'env': env, **res}, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
