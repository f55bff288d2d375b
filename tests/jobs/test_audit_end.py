"""The audit finishes before the job ends (issue 56, item 5).

The real program: `_flax_job.py` (flax + optax, nothing of `multihost` imported) with
``LEAVE=shutdown``: right after its last step it calls ``jax.distributed.shutdown()``, as
JAX's docs show, and returns; ``SAVE=0``: no orbax checkpoint between its last step and its
end; ``LOG_EVERY=4``: it reads the loss at steps 0 and 4 only, so its last step's launch
still runs when it calls the shutdown, and the audit of that launch (which waits for its
results, then shares them) is still under way when the job shuts the coordination service
down. Plain processes under ``python -m multihost run --audit 1``, as a
scheduler launches them. Before, a clean run often ended on every host with ``multihost
audit: stopped on process N: CoordinatorUnreachableError ... at allgather('audit
train_step')`` and no summary, and a finding at the last step was never said; now every
host compares every launch, the last one included, and prints its summary line.
"""

from __future__ import annotations

import os
import re
from typing import Any

import _jobs
import pytest
from test_real_program_run import JOB, N

pytestmark = [pytest.mark.slow, pytest.mark.release]

STEPS = 6
#: A bound for failures only: a run takes ~45 s here when the machine is idle, 3.5 min when
#: other jobs share its 2 cores.
TIMEOUT = 480.0
#: The state's init and every step, each audited (--audit 1).
LAUNCHES = STEPS + 1


def _audit_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith('multihost audit: ')]


def _summary(p: int, said: str) -> str:
    return (
        rf'multihost audit: {LAUNCHES} launches audited on process {p} \(\d+ array leaves '
        rf'compared across hosts\): {said}'
    )


def _run(tmp: str, **extra: str) -> list[dict[str, Any]]:
    """The job in `N` plain processes x 2 CPU devices (with one, XLA:CPU runs a launch
    that spans processes inside its call: the last step would be done when it returns)."""
    env = _jobs.scheduler_env(N, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS=str(STEPS),
                              LOCAL_DEVICES='2', LEAVE='shutdown', SAVE='0', LOG_EVERY='4',
                              **extra)  # fmt: skip
    command = ['-m', 'multihost', 'run', '--audit', '1', JOB]
    with _jobs.start(N, command, env, cwd=tmp) as job:
        outs = [{'rc': rc, 'out': out, 'err': err} for rc, out, err in job.finish(TIMEOUT)]
    for p, out in enumerate(outs):
        assert out['rc'] == 0 and 'DONE' in out['out'], (p, out['err'][-3000:])
    return outs


def test_a_job_ending_in_jax_distributed_shutdown_is_audited_to_its_last_launch(tmp_path: Any):
    for p, out in enumerate(_run(str(tmp_path))):
        lines = _audit_lines(out['err'])
        # one line, the summary: every launch compared (the last included), no false alarm
        assert len(lines) == 1, (p, out['err'][-3000:])
        assert re.fullmatch(_summary(p, 'no findings'), lines[0]), (p, lines)


def test_a_drift_at_the_last_step_is_said_on_every_host(tmp_path: Any):
    """Process 1's copy of one replicated bias moves after the second-to-last step: only
    the last step's launch computes from it."""
    last = STEPS - 1
    outs = _run(str(tmp_path), DRIFT_HOST='1', DRIFT_STEP=str(last - 1))
    for p, out in enumerate(outs):
        lines = _audit_lines(out['err'])
        assert len(lines) == 2, (p, out['err'][-3000:])
        drift, summary = lines
        assert drift.startswith(f'multihost audit: replica drift at train_step call #{last} ')
        assert "result[0].params['block_0']['Dense_0']['bias'] block [" in drift, drift
        assert 'differs on process 1 from process 0' in drift, drift
        assert re.fullmatch(_summary(p, r'1 finding \(said above\)'), summary), (p, summary)
