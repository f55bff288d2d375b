"""A host that vanishes: every survivor ends within the heartbeat timeout, naming it (issue 35).

`_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) in 4 plain processes
under ``python -m multihost run --dump-dir``, with ``heartbeat_timeout_seconds=20``
(``HEARTBEAT_S``). Process 2 is killed with SIGKILL (as the out-of-memory killer or a lost
machine would): it tells nobody. Without the toolkit JAX aborts every survivor at the
heartbeat timeout (SIGABRT, before it says why); here each survivor logs one line naming
process 2, dumps, and ends with 75 within the heartbeat timeout + 10 s, and ``multihost
analyze`` leads with the lost host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import _jobs
import pytest

from multihost._job._fate import EXIT_PEER_FAILED

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
JOB = os.path.join(HERE, '_flax_job.py')
N = 4
HEARTBEAT_S = 20

pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)


def _run_and_kill(tmp: str, ready: str, waiters: tuple[int, ...], **env: str) -> dict[str, Any]:
    """Starts the job, SIGKILLs process 2 once every one of ``waiters`` printed ``ready``
    (then 3 s more: they wait), and collects every process's end (all bounded; whatever
    still runs at the end is killed with its process group)."""
    ckpt, dumps = os.path.join(tmp, 'ckpt'), os.path.join(tmp, 'dumps')
    command = [sys.executable, '-m', 'multihost', 'run', '--dump-dir', dumps, JOB]
    environ = _jobs.scheduler_env(N, CKPT_DIR=ckpt, STEPS='4', LOCAL_DEVICES='1',
                                  HEARTBEAT_S=str(HEARTBEAT_S),
                                  STALL_UNTIL=os.path.join(tmp, 'never'), **env)  # fmt: skip
    out = [os.path.join(tmp, f'out-{p}.txt') for p in range(N)]
    err = [os.path.join(tmp, f'err-{p}.txt') for p in range(N)]
    procs: list[subprocess.Popen[Any]] = []
    ends: dict[int, float] = {}
    try:
        for p in range(N):
            with open(out[p], 'w') as o, open(err[p], 'w') as e:
                procs.append(subprocess.Popen(command, env={**environ, 'PROCESS_ID': str(p)},
                                              cwd=tmp, stdout=o, stderr=e,
                                              start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not all(
            ready in open(out[p]).read() for p in waiters
        ):
            assert all(pr.poll() is None for pr in procs), [open(e).read()[-1500:] for e in err]
            time.sleep(0.2)
        assert time.monotonic() < deadline, 'the job never got there'
        time.sleep(3.0)
        procs[2].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        deadline = killed + HEARTBEAT_S + 30
        while time.monotonic() < deadline and len(ends) < N:
            for p, pr in enumerate(procs):
                if p not in ends and pr.poll() is not None:
                    ends[p] = time.monotonic() - killed
            time.sleep(0.1)
    finally:
        for pr in procs:
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
            pr.wait(timeout=10)
    return {
        'codes': [pr.returncode for pr in procs],
        'ends': ends,
        'err': [open(e).read() for e in err],
        'dumps': dumps,
    }


def _check(run: dict[str, Any], own_exit: tuple[int, ...] = ()) -> list[str]:
    """Every survivor ended within the heartbeat timeout + 10 s: with 75, logging the line
    naming process 2, or (those in ``own_exit``) by the program's own handler of its failed
    collective, which may say so first; ``analyze`` leads with the lost host."""
    codes, ends, errs = run['codes'], run['ends'], run['err']
    assert codes[2] == -signal.SIGKILL
    assert all(p in ends for p in range(N)), (ends, [e[-2000:] for e in errs])
    assert max(ends[p] for p in (0, 1, 3)) < HEARTBEAT_S + 10, ends
    lines = []
    for p in (0, 1, 3):
        if p in own_exit and codes[p] == 1:
            continue
        assert codes[p] == EXIT_PEER_FAILED, (codes, [e[-2000:] for e in errs])
        (line,) = [x for x in errs[p].splitlines() if x.startswith('multihost: process 2 lost ')]
        assert f'this host (process {p}) was ' in line and line.endswith('(exit code 75)'), line
        assert ' (its last heartbeat; none for ' in line, line  # what the time is
        lines.append(line)
    print('\n'.join(lines), '\ncodes:', codes, '\nends after the kill (s):', ends)
    out = subprocess.run([sys.executable, '-m', 'multihost', 'analyze', run['dumps']],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    print(out.stdout)
    first = out.stdout.splitlines()[0]
    assert first.startswith('process 2 was lost at '), out.stdout
    assert '(its last heartbeat; no dump: killed or its machine gone)' in first, first
    assert 'in user code at ?' not in out.stdout, out.stdout
    return lines


@pytest.mark.release
def test_a_host_killed_while_the_others_wait_in_a_checkpoint_barrier(tmp_path: Any) -> None:
    """Process 1 stalls before its first save (user code); 0 and 3 wait for it in orbax's
    checkpoint barrier; process 2 is killed."""
    run = _run_and_kill(str(tmp_path), 'LOSS 0', (0, 1, 2, 3), STALL_HOST='1')
    lines = _check(run)
    assert 'it was last at ' in lines[0], lines


@pytest.mark.release
def test_a_host_killed_inside_a_launch(tmp_path: Any) -> None:
    """Process 2 stalls just before step 2's ``train_step`` and is killed there; the others
    are inside that launch, waiting in its device collective. On CPU, gloo sees the closed
    connection at once: the collective fails and the job's own handler (``FAILED ...``,
    ``os._exit(1)``; process 0 after 5 s) ends the hosts it reaches first; whoever is still
    there when process 0 finds a host lost ends with 75 (on GPUs, NCCL waits: all do).
    ``MULTIHOST_LOST_S=3``: process 0's verdict comes before its own handler's 5 s. The
    hosts that left through os._exit went silent within one stamp of process 2: the verdict
    may name one of them (the first one silent for 3 s)."""
    run = _run_and_kill(str(tmp_path), 'LOSS 1', (0, 1, 3), STALL_HOST='2',
                        STALL_BEFORE_STEP='2', MULTIHOST_LOST_S='3')  # fmt: skip
    codes, ends, errs = run['codes'], run['ends'], run['err']
    assert codes[2] == -signal.SIGKILL and all(p in ends for p in range(N)), (codes, ends)
    assert max(ends.values()) < HEARTBEAT_S + 10, ends
    out = [open(os.path.join(str(tmp_path), f'out-{p}.txt')).read() for p in range(N)]
    for p in (1, 3):  # the job's own handler of the failed collective
        assert codes[p] == 1 and 'FAILED JaxRuntimeError: ' in out[p], (codes, out[p][-500:])
    # process 0 (its handler sleeps 5 s before leaving) hears the verdict first and says so;
    # it then waits for the others to count themselves out (they left already, through the
    # job's own os._exit), and the job's handler may end it first, with its own code
    assert codes[0] in (EXIT_PEER_FAILED, 1), (codes, errs[0][-2000:])
    (line,) = [x for x in errs[0].splitlines() if x.startswith('multihost: process ')]
    assert ' lost at ' in line and line.endswith('(exit code 75)'), line
    assert 'it was last at train_step call #2' in line or 'it was last at ' in line, line
    analyzed = subprocess.run([sys.executable, '-m', 'multihost', 'analyze', run['dumps']],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    print(line, '\ncodes:', codes, '\nends after the kill (s):', ends, '\n' + analyzed.stdout)
    assert ' was lost at ' in analyzed.stdout.splitlines()[0], analyzed.stdout
