"""What the audit (``multihost run --audit``) costs a real training step, side by side in one run.

Usage::

    python bench/audit.py [--hosts 2] [--steps 60] [--blocks 2] [--json PATH]

`tests/_flax_job.py` (flax linen transformer, optax adamw, orbax async checkpoints every
2 steps; it imports nothing of `multihost`) in ``--hosts`` plain processes x 2 CPU devices,
launched like a scheduler, three ways:

* ``installed``: ``python -m multihost run _flax_job.py`` (the baseline: what the audit
  adds to);
* ``audit``: ``... run --audit`` (the default N: the first 10 launches of each function,
  then every N-th);
* ``audit=1``: ``... run --audit=1`` (every launch audited).

``--blocks`` process groups per mode, the order reversed every block. Each run's first
two steps compile and are dropped; a step's figure is the slowest process's wall time of
``train_step`` plus reading its loss (the script's ``STEP`` line). Reported per mode:
median and mean step (pooled over blocks), their ratios to ``installed``; for ``audit=1``
the cost of one audited step (mean difference); from it the steady-state cost at the
default N (one audited step in N); the audit's own seconds on the hosts (reading,
hashing, comparing: `AuditReport.seconds`) and the main thread's wait (`waited`); and
whether the losses are bitwise equal across modes.

Goal (issue 31): the step with ``--audit`` at the default N within 2% of without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import _common

MODES = ('installed', 'audit', 'audit=1')
_FLAGS = {'installed': [], 'audit': ['--audit'], 'audit=1': ['--audit=1']}


def _run(mode: str, hosts: int, steps: int) -> dict[str, Any]:
    """One run: per step the slowest process's seconds, process 0's losses, every host's
    audit report."""
    got = _common.run_flax_job(
        lambda tmp: ['-m', 'multihost', 'run', *_FLAGS[mode], _common.FLAX_JOB],
        hosts,
        steps,
        expect='multihost audit: ',
    )
    reports = [got['records'][f'audit-{p}.json'] for p in range(hosts)
               if f'audit-{p}.json' in got['records']]  # fmt: skip
    return {'times': got['times'], 'losses': got['losses'], 'reports': reports}


def measure(hosts: int, steps: int, blocks: int) -> dict[str, Any]:
    runs = _common.alternating_blocks(MODES, blocks, lambda m: _run(m, hosts, steps))
    pooled = {m: [t for r in runs[m] for t in r['times']] for m in MODES}
    losses = {r['losses'] for m in MODES for r in runs[m]}
    reports = {m: [x for r in runs[m] for x in r['reports']] for m in MODES}
    out: dict[str, Any] = {'hosts': hosts, 'steps_per_run': steps - 2, 'blocks': blocks}
    for mode in MODES:
        ms = [t * 1e3 for t in pooled[mode]]
        rep = reports[mode]
        out[mode] = {
            'n': len(ms),
            'median_ms': statistics.median(ms),
            'mean_ms': statistics.mean(ms),
            'audited_per_run': statistics.mean(r['audited'] for r in rep) if rep else 0,
            'audit_seconds_per_run': statistics.mean(r['seconds'] for r in rep) if rep else 0.0,
            'waited_seconds_per_run': statistics.mean(r['waited'] for r in rep) if rep else 0.0,
        }
    base = out['installed']
    for mode in MODES[1:]:
        out[mode]['median_ratio'] = out[mode]['median_ms'] / base['median_ms']
        out[mode]['mean_ratio'] = out[mode]['mean_ms'] / base['mean_ms']
    per_audit_ms = out['audit=1']['mean_ms'] - base['mean_ms']
    from multihost._job import _audit

    out['default_every'] = _audit.DEFAULT_EVERY
    out['audited_step_ms'] = per_audit_ms
    out['steady_state_pct'] = 100 * per_audit_ms / _audit.DEFAULT_EVERY / base['mean_ms']
    out['losses_bitwise_equal'] = len(losses) == 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hosts', type=int, default=2)
    parser.add_argument('--steps', type=int, default=60, help='steps per run (2 compile)')
    parser.add_argument('--blocks', type=int, default=2)
    parser.add_argument('--json', help='also write the results here')
    args = parser.parse_args(argv)
    env = _common.environment()
    print(json.dumps(env))
    res = measure(args.hosts, args.steps, args.blocks)
    base = res['installed']
    print(
        f'bench/audit.py: tests/_flax_job.py, {args.hosts} processes x 2 CPU devices, '
        f'{res["steps_per_run"]} timed steps per run, {args.blocks} block(s) per mode'
    )
    print(f'  installed: median step {base["median_ms"]:.1f} ms, mean {base["mean_ms"]:.1f} ms')
    for mode in MODES[1:]:
        m = res[mode]
        print(
            f'  {mode:8s}: median {m["median_ms"]:.1f} ms (x{m["median_ratio"]:.3f}), mean '
            f'{m["mean_ms"]:.1f} ms (x{m["mean_ratio"]:.3f}); {m["audited_per_run"]:.0f} '
            f'launches audited per run, {m["audit_seconds_per_run"]:.2f} s of audit work per '
            f'host, the main thread waited {m["waited_seconds_per_run"]:.3f} s'
        )
    print(
        f'  one audited step costs {res["audited_step_ms"]:.1f} ms more (audit=1); at the '
        f'default N={res["default_every"]}, past the first 10 launches: '
        f'{res["steady_state_pct"]:.2f}% of the step'
    )
    print(f'  losses bitwise equal in every mode: {res["losses_bitwise_equal"]}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'env': env, **res}, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
