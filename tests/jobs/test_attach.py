"""Attach to a batch job the notebook did not start (issue 20, item 1).

`_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) runs
as three plain processes under ``python -m multihost run --control-file``,
launched as a scheduler launches them. Process 2 stalls in ``time.sleep``
before its first orbax save, so processes 0 and 1 wait in orbax's barrier.
From this test process (not a JAX process): `mhnotebook.attach` names
process 2 and the barrier, with process 2's user frame; a wrong key is
refused; the magics act on the job and refuse to run code on it; stepping
holds the next recorded launch and releases it; detaching leaves the job
running to its end; then attaching says the job is gone. One small job,
exiting normally, shows that a clean run removes its file and writes
nothing else.

Three processes x 1 CPU device, two steps: ~30 s here. Every wait is
bounded; every process is killed if anything fails.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import _jobs
import pytest

import mhnotebook
from multihost.testing import free_port

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, '_flax_job.py')
N = 3
STALLED = 2
TIMEOUT = 150.0

pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)


@pytest.fixture(scope='module')
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The stalled job: its processes, control file and the file that ends the stall."""
    tmp = str(tmp_path_factory.mktemp('attach'))
    control = os.path.join(tmp, 'ctl', 'control.json')
    os.makedirs(os.path.dirname(control))
    go = os.path.join(tmp, 'go')
    env = _jobs.scheduler_env(
        N,
        CKPT_DIR=os.path.join(tmp, 'ckpt'),
        STEPS='2',
        LOCAL_DEVICES='1',
        STALL_HOST=str(STALLED),
        STALL_UNTIL=go,
    )
    command = ['-m', 'multihost', 'run', '--control-file', control, JOB]
    with _jobs.start(N, command, env, cwd=tmp) as started:
        try:
            _jobs.until('the control file', lambda: os.path.exists(control), 90.0)
            yield {'procs': started.procs, 'control': control, 'go': go}
        finally:
            open(go, 'w').close()
            try:  # a failed test may have left stepping on
                with mhnotebook.attach(control, timeout=5.0) as j:
                    j.release_all()
            except Exception:
                pass
            started.finish(60.0)


def _stalled_wavefront(path: str) -> Any:
    with mhnotebook.attach(path) as j:
        front = j.wavefront(timeout=15.0)
        where = j.where(timeout=15.0)
    verdict = front.verdict or ''
    # Not before the stall itself: early on, process 2 may still be "not there"
    # because it is slower through create_state, with the others in another barrier.
    if 'process 2 is not there' not in verdict or 'in stall' not in verdict:
        return None
    if any('save_start' not in str(where[p].waiting) for p in range(N) if p != STALLED):
        return None
    return front, where


def _wait_for_the_stall(job: dict[str, Any]) -> tuple[Any, Any]:
    """The wavefront and where of the stall, once every other process waits for process 2."""
    return _jobs.until('the stall', lambda: _stalled_wavefront(job['control']), 90.0)


def test_the_connection_file_is_private_and_says_how_to_connect(job):
    path = job['control']
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        info = json.load(f)
    assert info['address'] == '127.0.0.1' and info['num_processes'] == N
    assert len(bytes.fromhex(info['key'])) == 32
    assert info['pid'] == job['procs'][0].pid
    assert os.listdir(os.path.dirname(path)) == ['control.json']  # no temporary left


# Release rotation; covered on every landing by the stalled host named: test_dumps; orbax
# barriers: test_real_program_where
@pytest.mark.release
def test_attach_names_the_stalled_host_and_the_orbax_barrier_the_others_wait_in(job):
    front, where = _wait_for_the_stall(job)
    verdict = front.verdict
    # processes 0-1 are waiting at barrier('CheckpointManager:save_start') #2 for 1 s;
    # process 2 is not there: last at train_step call #0, now in user code at
    # _flax_job.py:65 in stall, in time.sleep
    assert "processes 0-1 are waiting at barrier('CheckpointManager:save_start')" in verdict
    assert 'process 2 is not there' in verdict and '_flax_job.py' in verdict, verdict
    assert 'in stall, in time.sleep' in verdict, verdict
    assert front.silent == ()
    for p in (0, 1):
        assert 'CheckpointManager:save_start' in str(where[p].waiting), where[p].waiting
    stalled = where[STALLED]
    assert '_flax_job.py' in stalled.where and 'in stall' in stalled.where, stalled.where
    assert stalled.waiting is None  # it is in time.sleep, not in a collective
    # Busy or wedged (issue 30, 2): the sleeping host uses no CPU and its stack stays
    # (once its last step's work on the CPU device is done: asked again until then).
    with mhnotebook.attach(job['control']) as j:
        front = _jobs.until(
            'process 2 wedged',
            lambda: (f := j.wavefront()).hosts[STALLED].pulse.state == 'wedged' and f,
            30.0,
        )
    pulse = front.hosts[STALLED].pulse
    assert pulse.cpu < 5 and pulse.moved is False, pulse
    line = next(ln for ln in front.format().splitlines() if ln.startswith('  process 2:'))
    assert '% CPU over the last' in line and line.endswith('stack unchanged: wedged'), line
    assert where[STALLED].pulse is not None and '% CPU' in where[STALLED].format()
    # The waiting ones carry it too, not in words (they wait for the others, busy or not).
    assert front.hosts[0].pulse is not None
    assert '% CPU' not in next(ln for ln in front.format().splitlines() if 'process 0:' in ln)


def test_a_wrong_key_is_refused_in_one_line(job, tmp_path):
    with open(job['control']) as f:
        info = json.load(f)
    info['key'] = '00' * 32
    forged = tmp_path / 'forged.json'
    forged.write_text(json.dumps(info))
    with pytest.raises(mhnotebook.AttachError) as err:
        mhnotebook.attach(forged)
    assert 'refused the key' in str(err.value) and '\n' not in str(err.value)
    with pytest.raises(mhnotebook.AttachError, match='no connection file'):
        mhnotebook.attach(tmp_path / 'missing.json')


def test_the_magics_act_on_the_attached_job_and_refuse_to_run_code(job):
    from _helpers import magic_shell
    from IPython.core.error import UsageError

    _wait_for_the_stall(job)  # a test run on its own must not look before the stall either
    ip, magics = magic_shell(None)
    attached = ip.run_line_magic('mh_attach', job['control'])
    try:
        assert isinstance(attached, mhnotebook.AttachedJob)
        view = ip.run_line_magic('mh_where', '')
        assert type(view).__name__ == 'WhereView'
        assert 'process 2 is not there' in str(view.verdict), view.verdict
        assert type(ip.run_line_magic('mh_step', '')).__name__ == 'StepperView'
        # The data magics read the stopped hosts' frames; process 2 is in its own code (a
        # sleep), so they say so, naming it, and how to stop it.
        for line in ('mh_diff', 'mh_allgather', 'mh_layout', 'mh_nonfinite'):
            with pytest.raises(
                UsageError, match='process 2 running its own code, not stopped'
            ) as e:
                ip.run_line_magic(line, 'state')
            assert 'set_stepping(True)' in str(e.value) and '\n' not in str(e.value)
        with pytest.raises(UsageError, match='--frame is for an attached job|N >= 0'):
            ip.run_line_magic('mh_diff', 'state --frame -1')
        # Code runs on an attached job only when it was started with --allow-exec.
        with pytest.raises(UsageError, match='started without --allow-exec') as e:
            ip.run_cell_magic('mh', '', 'print(1)')
        assert '\n' not in str(e.value)
        with pytest.raises(UsageError, match='%mh_detach'):
            ip.run_line_magic('mh_barrier', 'x')
    finally:
        ip.run_line_magic('mh_detach', '')
    assert magics.attached is None
    with pytest.raises(UsageError, match='not attached'):
        ip.run_line_magic('mh_detach', '')


def test_stepping_holds_a_launch_and_releases_it_and_detach_leaves_the_job_running(job):
    j = mhnotebook.attach(job['control'])
    try:
        j.set_stepping(True)
        assert j.stepping
        open(job['go'], 'w').close()  # the stall ends: the next train_step is held

        def held_launch() -> Any:
            table = j.step_table()
            if table.pending is not None and table.pending.complete:
                j.release()  # orbax's checked barriers are steps of their own
            return len(table.launches) == N and table

        table = _jobs.until('a held launch', held_launch, 60.0)
        held = table.launches
        assert {h.name for h in held} == {'train_step'}, held
        assert all(h.site.endswith(f'_flax_job.py:{_step_line()}') for h in held), held
        assert 'paused before a launch' in table.format()
        from mhnotebook.widgets._stepper import status_html

        assert 'paused before a launch' in status_html(table) and 'train_step' in status_html(table)
        time.sleep(1.0)
        still = j.step_table().launches
        assert [(h.process, h.n) for h in still] == [(h.process, h.n) for h in held]  # held
        _the_data_tools_read_the_held_frames(j)
        assert j.release() == ()
        before = {(h.process, h.n) for h in held}
        _jobs.until(
            'the launch released',
            lambda: before.isdisjoint((h.process, h.n) for h in j.step_table().launches),
            60.0,
        )

        def launched() -> Any:  # each host went on into the launch it was held before (its
            # record comes as its call is made, a moment after the gate let it go; the data
            # tools above wrote 19 records of their own)
            records = j.flight_records(last=50)
            calls = {p: [r.call for r in records[p] if r.name == 'train_step'] for p in range(N)}
            return all(1 in calls[p] for p in range(N)) and calls

        calls = _jobs.until('train_step call #1 on every process', launched, 30.0)
        assert all(calls[p][-1] == 1 for p in range(N)), calls
        j.release_all()
        assert not j.step_table().stepping
    finally:
        j.detach()
    # Detaching ended nobody: each process runs on, or has already run to its end (the
    # released step was the last: a fast machine finishes it before detach returns).
    assert all(p.poll() in (None, 0) for p in job['procs']), [p.poll() for p in job['procs']]
    outs = [p.communicate(timeout=TIMEOUT) for p in job['procs']]
    for p, (out, err) in zip(job['procs'], outs):
        assert p.returncode == 0 and 'DONE' in out, err[-3000:]
    # The job left with os._exit (no atexit): its file names a job that is gone.
    with pytest.raises(mhnotebook.AttachError, match='is gone') as gone:
        mhnotebook.attach(job['control'], timeout=5.0)
    assert job['control'] in str(gone.value) and '\n' not in str(gone.value)


def _the_data_tools_read_the_held_frames(j: mhnotebook.AttachedJob) -> None:
    """Held before train_step: every data tool answers from the loop's frame (issue 29)."""
    import numpy as np
    from _flax_program import LOCAL_BATCH, SEQ, VOCAB
    from _helpers import magic_shell

    import multihost

    frames = j.frames()
    for p in range(N):
        assert frames[p]['stopped'] and frames[p]['at'] == f'_flax_job.py:{_step_line()} in train'
        assert frames[p]['frames'][0]['site'] == frames[p]['at']
        assert {'state', 'batch', 'step'} <= set(frames[p]['frames'][0]['names'])
    steps = j.allgather('step')  # a host-local int: one row per process
    assert steps.tolist() == [steps[0]] * N
    tokens = j.allgather("batch['tokens']")  # the global batch, each host's block streamed
    want = np.concatenate(
        [
            np.random.default_rng(1000 * int(steps[0]) + p).integers(
                0, VOCAB, size=(LOCAL_BATCH, SEQ + 1), dtype=np.int32
            )[:, :-1]
            for p in range(N)
        ]
    )
    np.testing.assert_array_equal(tokens, want)
    assert np.asarray(j.allgather("batch['tokens'][::2, :3]")).shape == (want.shape[0] // 2, 3)
    layout, report = j.layout('state.params')
    assert isinstance(layout, multihost.TreeLayout) and report is None and layout.leaves
    one, replicas = j.layout("batch['tokens']")
    assert isinstance(one, multihost.Layout) and one.shape == want.shape
    assert sorted(one.processes) == list(range(N))
    diff = j.diff('state.params')
    assert diff.ok and not diff.odd_processes, diff
    assert j.nonfinite('state.params').ok
    assert j.env_diff().ok
    assert 'memory of 3 processes' in str(j.memory_census())
    with pytest.raises(mhnotebook.SessionError, match=r"'stat' is not defined in frame 0") as e:
        j.allgather('stat.params')
    assert "did you mean 'state'?" in str(e.value) and 'job.frames()' in str(e.value)
    with pytest.raises(mhnotebook.SessionError, match='not defined in frame 1'):
        j.allgather('batch', frame=1)  # main(): the loop's locals are not there
    # The magics, in a real IPython shell, act on the attached job.
    ip, _ = magic_shell(None)
    ip.run_line_magic('mh_attach', j.path)
    try:
        ip.run_line_magic('mh_allgather', "batch['tokens'] -o toks")
        np.testing.assert_array_equal(ip.user_ns['toks'], want)
        assert type(ip.run_line_magic('mh_layout', 'state.params')).__name__ == 'TreeLayoutView'
        assert type(ip.run_line_magic('mh_diff', 'state.params --frame 0')).__name__ == (
            'TreeDiffView'
        )
        assert type(ip.run_line_magic('mh_nonfinite', 'state.params')).__name__ == 'NonfiniteView'
    finally:
        ip.run_line_magic('mh_detach', '')


def _step_line() -> int:
    with open(JOB) as f:
        hits = [i + 1 for i, line in enumerate(f) if 'train_step(state, batch)' in line]
    assert len(hits) == 1, hits
    return hits[0]


CLEAN = textwrap.dedent(
    """
    import os, sys, time
    import jax
    pid, port, control = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(f'127.0.0.1:{port}', 2, pid)
    if pid == 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(control) and time.monotonic() < deadline:
            time.sleep(0.05)
        print('SERVED', os.path.exists(control), flush=True)
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices('end')
    """
)


def test_a_clean_run_removes_its_control_file_and_writes_nothing_else(tmp_path):
    script = tmp_path / 'job.py'
    script.write_text(CLEAN)
    folder = tmp_path / 'ctl'
    folder.mkdir()
    control = str(folder / 'control.json')
    port = str(free_port())
    command = ['-m', 'multihost', 'run', '--control-file', control, str(script)]
    with _jobs.start(
        2,
        command,
        _jobs.job_env(),
        args=lambda p: [str(p), port, control],
        process_id=False,
        stderr=subprocess.STDOUT,
    ) as started:
        procs = started.procs
        outs = [out for _, out, _ in started.finish(90.0)]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert 'SERVED True' in outs[0], outs[0]
    assert os.listdir(folder) == []
    assert sorted(os.listdir(tmp_path)) == ['ctl', 'job.py']
    shutil.rmtree(folder)


WAITING = textwrap.dedent(
    """
    import sys, time
    import jax
    pid, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(f'127.0.0.1:{port}', 2, pid)
    from jax.experimental import multihost_utils
    if pid == 1:
        time.sleep(120)
    multihost_utils.sync_global_devices('end')
    """
)


def test_kill_9_of_process_0_while_attached_is_one_line_that_the_job_is_gone(tmp_path):
    """The endpoint's process dies under an attached notebook: every call says so, at once."""
    script = tmp_path / 'job.py'
    script.write_text(WAITING)
    control = str(tmp_path / 'control.json')
    port = str(free_port())
    command = ['-m', 'multihost', 'run', '--control-file', control, str(script)]
    with _jobs.start(
        2,
        command,
        _jobs.job_env(),
        args=lambda p: [str(p), port],
        process_id=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as started:
        procs = started.procs
        _jobs.until('the control file', lambda: os.path.exists(control), 60.0)
        attached = _jobs.until('attach', lambda: mhnotebook.attach(control), 60.0)
        # Process 0 reaches the barrier when its JAX has started (seconds on a loaded machine).
        _jobs.until('process 0 waiting', lambda: 'waiting at' in str(attached.wavefront()), 60.0)
        procs[0].kill()
        procs[0].wait(10)
        start = time.monotonic()
        with pytest.raises(mhnotebook.AttachError) as info:
            attached.wavefront()
        message = str(info.value)
        assert 'is gone' in message and 'postmortem' in message, message
        assert '\n' not in message and time.monotonic() - start < 10
        with pytest.raises(mhnotebook.AttachError, match='detached from'):
            attached.where()
        with pytest.raises(mhnotebook.AttachError, match='is gone: nothing listens'):
            mhnotebook.attach(control)  # the file outlived its job (kill -9 removes nothing)
