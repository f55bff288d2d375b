"""Does the audit finish before a job that ends with ``jax.distributed.shutdown()`` does?

Usage::

    python bench/audit_shutdown.py [--runs 20] [--hosts 4] [--steps 6] [--drift-last]
                                   [--no-save] [--log-every K]

`tests/_flax_job.py` (flax linen transformer, optax adamw, orbax async checkpoints; it
imports nothing of `multihost`) with ``LEAVE=shutdown``: right after its last step it calls
``jax.distributed.shutdown()``, as JAX's docs show, and returns. Each run is ``--hosts``
plain processes x 2 CPU devices under ``python -m multihost run --audit 1``, launched like
a scheduler. A run counts as good when every process exits 0 and prints ``DONE``, its
stderr holds the audit's summary line (``multihost audit: N launches audited on process
p ...: no findings``) and no other ``multihost audit:`` line (a stop, a launch left
unaudited, a false finding).

``--no-save``: no orbax checkpoints (``SAVE=0``: nothing between the last step and the
shutdown; before the audit finished first, 1 of 2 runs of 4 hosts x 4 steps ended with a
false ``stopped ... CoordinatorUnreachableError`` and no summary). ``--log-every K``: the job
reads its loss every K-th step only (``LOG_EVERY``), so its last launch may still run when
it shuts down.

``--drift-last``: process 1's copy of one replicated parameter moves after the
second-to-last step, so only the last step's launch shows the drift; a run counts as good
when every host names it (``replica drift at train_step call #<last>``) and its summary
says one finding.

Prints one line per run and the count of good runs; exits 1 if any run was not good.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

import _common

from multihost.testing import scheduler_env, start_job

SUMMARY = re.compile(
    r'multihost audit: (\d+) launches audited on process (\d+) \(\d+ array leaves compared '
    r'across hosts\): (no findings|1 finding \(said above\))$'
)


def one_run(
    hosts: int, steps: int, drift_last: bool, save: bool = True, log_every: int = 1
) -> tuple[bool, str, float]:
    """One run: (good, why not / what it said, seconds)."""
    extra = {'DRIFT_HOST': '1', 'DRIFT_STEP': str(steps - 2)} if drift_last else {}
    if not save:
        extra['SAVE'] = '0'
    extra['LOG_EVERY'] = str(log_every)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix='mh-bench-shutdown-') as tmp:
        env = scheduler_env(
            hosts, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS=str(steps), LEAVE='shutdown',
            **extra,
        )  # fmt: skip
        env['PYTHONPATH'] = os.path.dirname(_common.FLAX_JOB) + os.pathsep + env['PYTHONPATH']
        command = ['-m', 'multihost', 'run', '--audit', '1', _common.FLAX_JOB]
        with start_job(hosts, command, env, cwd=tmp) as job:
            results = job.finish(600)
    seconds = time.monotonic() - t0
    for p, (rc, out, err) in enumerate(results):
        lines = [ln for ln in err.splitlines() if ln.startswith('multihost audit: ')]
        summary = [ln for ln in lines if SUMMARY.match(ln)]
        others = [ln for ln in lines if not SUMMARY.match(ln)]
        if rc != 0 or 'DONE' not in out:
            return False, f'process {p} exited {rc}: {err.strip()[-600:]}', seconds
        if len(summary) != 1:
            return False, f'process {p}: no summary line; its audit said {lines}', seconds
        m = SUMMARY.match(summary[0])
        assert m is not None
        if int(m.group(2)) != p:
            return False, f'process {p} printed {summary[0]!r}', seconds
        if drift_last:
            drift = f'replica drift at train_step call #{steps - 1} '
            if len(others) != 1 or drift not in others[0] or 'finding' not in m.group(3):
                return False, f"process {p}: the last step's drift not said: {lines}", seconds
        elif others or m.group(3) != 'no findings':
            return False, f'process {p}: {lines}', seconds
    return True, summary[0], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=20)
    parser.add_argument('--hosts', type=int, default=_common.NUM_PROCESSES)
    parser.add_argument('--steps', type=int, default=6)
    parser.add_argument('--drift-last', action='store_true')
    parser.add_argument('--no-save', action='store_true', help='no orbax checkpoints (SAVE=0)')
    parser.add_argument(
        '--log-every', type=int, default=1, help='read the loss every k-th step (LOG_EVERY=k)'
    )
    args = parser.parse_args(argv)
    good = 0
    times: list[float] = []
    for i in range(args.runs):
        ok, said, seconds = one_run(
            args.hosts, args.steps, args.drift_last, not args.no_save, args.log_every
        )
        good += ok
        times.append(seconds)
        print(f'run {i + 1}/{args.runs}: {"good" if ok else "BAD"} ({seconds:.0f} s): {said}',
              flush=True)  # fmt: skip
    what = "named the last step's drift" if args.drift_last else 'ended clean'
    print(
        f'{good}/{args.runs} runs {what} with the summary line on all {args.hosts} hosts and no '
        f'error ({args.steps} steps, --audit 1; median run {sorted(times)[len(times) // 2]:.0f} s)'
    )
    return 0 if good == args.runs else 1


if __name__ == '__main__':
    sys.exit(main())
