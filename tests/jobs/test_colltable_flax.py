"""Issue 57's acceptance on the real flax job: the collective each host waits in.

`_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) runs as 4 plain
processes (one CPU device each) under ``multihost run --dump-dir --control-file``, launched
as a scheduler launches them. One job serves every test here (a full run compiles the step
twice): process 2 stalls in ``time.sleep`` just before step 1's ``train_step``, so processes
0, 1 and 3 are inside that launch, in its device collectives, and dump for the hang; process
3's batch has one example more (a data pipeline bug), so its program is another one (on jax
0.10.2 with CPU devices step 0 still completes: gloo reduces what it is given).

Every wait is bounded; every process is killed at the end whatever happened.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import _jobs
import pytest

import mhnotebook
from multihost._models import _dumpfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, '_flax_job.py')
N = 4
STALLED, BAD = 2, 3

pytestmark = [pytest.mark.slow, pytest.mark.release]  # plain processes of its own


@pytest.fixture(scope='module')
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The job once processes 0, 1 and 3 have dumped for the hang and process 2 on request:
    its dumps, what an attached notebook's wavefront said meanwhile, the dump directory."""
    tmp = str(tmp_path_factory.mktemp('colltable'))
    dumps, go = os.path.join(tmp, 'dumps'), os.path.join(tmp, 'go')
    control = os.path.join(tmp, 'control.json')
    env = _jobs.scheduler_env(N, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS='2',
                              LOCAL_DEVICES='2', STALL_HOST=str(STALLED), STALL_UNTIL=go,
                              STALL_BEFORE_STEP='1', BAD_BATCH_HOST=str(BAD),
                              MULTIHOST_HANG_DUMP_S='3')  # fmt: skip
    command = ['-m', 'multihost', 'run', '--dump-dir', dumps, '--control-file', control, JOB]
    with _jobs.start(N, command, env, cwd=tmp) as job:
        try:

            def written() -> list[_dumpfile.Dump]:
                found = _dumpfile.read_dirs([dumps]) if os.path.isdir(dumps) else []
                hangs = sorted(d.process for d in found if d.trigger == 'hang')
                return found if len(found) == N and hangs == [0, 1, 3] else []

            try:
                _jobs.until('the hang dumps', written, 300.0)
            except AssertionError as exc:
                found = _dumpfile.read_dirs([dumps]) if os.path.isdir(dumps) else []
                raise AssertionError([(d.process, d.trigger, d.details) for d in found]) from exc
            time.sleep(1.0)  # a rewrite (a late request's answer) may follow the first write
            with mhnotebook.attach(control, timeout=20.0) as attached:
                verdict = attached.wavefront(timeout=20.0).verdict
            yield {'dumps': _dumpfile.read_dirs([dumps]), 'dir': dumps, 'verdict': verdict}
        finally:
            job.kill()
            job.finish(30.0)


def _analyzed(directory: str) -> list[str]:
    """``multihost analyze DIR``'s lines, as a user runs it (bounded)."""
    done = subprocess.run(
        [sys.executable, '-m', 'multihost', 'analyze', directory],
        env={**os.environ, 'PYTHONPATH': ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def _program_lines() -> list[str]:
    with open(os.path.join(HERE, '_flax_program.py')) as f:
        return f.read().splitlines()


#: Where hosts 0, 1 and 3 wait: the step's first collective that needs process 2, the
#: gradients' all-reduce over 'data' (XLA combined them into one, of many arrays), from a
#: line of the job's own files (the model's, the one XLA kept for the combined op).
WAIT = (
    r'in its first cross-host collective that needs process 2 \(#\d+ of \d+\): all-reduce of '
    r"\d+ arrays \([^)]*\) over mesh axis 'data' \(processes 0-3\), "
    r'from _flax_program\.py:(\d+) in \S+ <- \S+ in \S+'
)


def test_analyze_and_an_attached_where_name_the_collective_the_hosts_wait_in(hung):
    """Done when (issue 57), a process stalled before a step's launch: the first cross-host
    collective's kind, its mesh axis, the processes it waits for and a line in the job's own
    file, in ``multihost analyze`` of the dumps, in the attached job's wavefront (the verdict
    line of ``%mh_where``) and in a post-mortem's."""
    lines = _analyzed(hung['dir'])
    said = [m for ln in lines if (m := re.fullmatch(
        r"processes 0-1, 3 wait in train_step call #1's first cross-host collective that needs "
        r'process 2 \(#\d+ of \d+\): all-reduce of \d+ arrays \([^)]*\) over mesh axis '
        r"'data' \(processes 0-3\), from _flax_program\.py:(\d+) in \S+ <- \S+ in \S+; "
        r'process 2 never launched call #1', ln))]  # fmt: skip
    assert len(said) == 1, lines
    assert 0 < int(said[0].group(1)) <= len(_program_lines())
    assert 'culprit: process 2' in lines, lines
    attached = hung['verdict']
    assert re.match(
        r'processes 0-1, 3 are inside train_step call #1 \(launched \d+ s ago, not done\), '
        f'waiting {WAIT}; process 2 never launched call #1: ',
        attached,
    ), attached
    front = mhnotebook.postmortem(hung['dir']).wavefront().verdict
    assert re.search(WAIT, front) and 'process 2 never launched call #1' in front, front
    # each host made its table when it dumped: the same cross-host collectives on all three
    tables = {
        d.process: d.collectives['train_step call #1'] for d in hung['dumps'] if d.collectives
    }
    assert sorted(tables) == [0, 1, 3], tables
    assert all(t.first_difference(tables[0]) is None for t in tables.values())
    assert tables[0].mesh_axes == (('data', 4), ('model', 2)), tables[0].mesh_axes


def test_a_host_with_a_batch_of_another_shape_the_first_differing_collective(hung):
    """Done when (issue 57): process 3's batch has one example more, so its program is another
    one. Their cross-host collectives agree (the gradients' shapes do not depend on the
    batch), so analyze names the first collective inside each process that differs, each
    side with its line in the job's own file."""
    lines = _analyzed(hung['dir'])
    (i,) = [i for i, ln in enumerate(lines) if ln.startswith('train_step call #1 is not one')]
    assert lines[i] == (
        'train_step call #1 is not one program on every host: the collectives (the '
        'cross-host ones agree; these are inside each process) of processes 0-1 and '
        'process 3 part at #0:'
    ), lines
    side = (
        r'  {who}: #0 (all-reduce|all-gather|all-to-all) of f32\[{n},\S*\] over mesh axis '
        r"'model' \(inside each process\), from _flax_program\.py:(\d+) in \S+ <- \S+ in \S+"
    )
    ours = re.fullmatch(side.format(who='processes 0-1', n=4), lines[i + 1])
    theirs = re.fullmatch(side.format(who='process 3', n=5), lines[i + 2])
    assert ours and theirs, lines[i : i + 3]
    assert ours.groups() == theirs.groups(), lines[i : i + 3]  # one op, one line, two shapes
    assert 0 < int(ours.group(2)) <= len(_program_lines())
