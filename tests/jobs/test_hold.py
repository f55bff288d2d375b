"""Hold it where it went wrong, and use the data tools on it (issue 29).

`_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) in 3 plain
processes under ``python -m multihost run --hold-on-error --control-file F``, launched
the way a scheduler does. Process 2 raises ``BadBatch('bad batch')`` (uncaught) in
user code just before its step-1 ``train_step``; the others are already inside that
launch or held before it. The job is held, not ended: a notebook (this test process)
attaches, sees process 2 held on its error with its traceback's frames, gathers the
step's global batch from the frames of ``train`` on every host, is told in one line
that the others' ``state`` is the output of a launch that has not finished (never a
hang), and ``release_all`` lets the error go on: exit codes as without the flag.

~40 s here. Every wait is bounded; every process is killed if anything fails.
"""

from __future__ import annotations

import os
import time
from typing import Any

import _jobs
import numpy as np
import pytest
from IPython.utils.capture import capture_output

import mhnotebook
from multihost._job._fate import EXIT_PEER_FAILED

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
JOB = os.path.join(HERE, '_flax_job.py')
N = 3
FAILING = 2
STEP = 1

pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)


def _global_tokens(step: int) -> np.ndarray:
    from _flax_program import LOCAL_BATCH, SEQ, VOCAB

    rows = [
        np.random.default_rng(1000 * step + p).integers(
            0, VOCAB, size=(LOCAL_BATCH, SEQ + 1), dtype=np.int32
        )[:, :-1]
        for p in range(N)
    ]
    return np.concatenate(rows)


@pytest.mark.release
def test_a_failing_host_holds_the_job_for_the_data_tools_and_release_ends_it(tmp_path):
    tmp = str(tmp_path)
    control = os.path.join(tmp, 'control.json')
    env = _jobs.scheduler_env(
        N,
        CKPT_DIR=os.path.join(tmp, 'ckpt'),
        STEPS='3',
        LOCAL_DEVICES='1',
        RAISE_HOST=str(FAILING),
        RAISE_STEP=str(STEP),
    )
    command = ['-m', 'multihost', 'run', '--control-file', control, '--hold-on-error']
    command += ['--hold-for', '120', '--allow-exec', JOB]
    with _jobs.start(N, command, env, cwd=tmp) as job:
        _jobs.until('the control file', lambda: os.path.exists(control), 90.0)
        j = mhnotebook.attach(control)
        try:

            def held() -> Any:
                frames = j.frames()
                failing = frames[FAILING]
                ok = all(f['stopped'] for f in frames.values())
                return ok and 'held on its error' in failing['in'] and frames

            frames = _jobs.until('the job held on the error', held, 90.0)
            failing = frames[FAILING]
            assert failing['in'].startswith(
                f"held on its error: process {FAILING} raised BadBatch('bad batch') at "
                '_flax_job.py:'
            ), failing
            # The traceback's frames, innermost first: where it raised, then the loop.
            sites = [f['site'] for f in failing['frames']]
            assert sites[0].startswith('_flax_job.py:') and sites[0].endswith('in check_batch')
            assert sites[1].endswith('in train'), sites
            assert 'batch' in failing['frames'][1]['names']
            where = j.where()
            assert where[FAILING].doing.startswith('held on its error: raised BadBatch(')
            assert where[FAILING].where.startswith('_flax_job.py:') or '_flax_job.py:' in (
                where[FAILING].where
            ), where[FAILING].where
            verdict = j.wavefront().verdict or ''
            # Process 2 is named apart, held: the others inside the launch it never made, or
            # not there yet (still in the last step's checkpoint save, on a fast machine).
            inside = 'process 2 never launched' in verdict or 'process 2 is not there' in verdict
            assert (inside and 'now held on its error: raised BadBatch' in verdict) or (
                'process 2 is held on its error: raised BadBatch' in verdict
            ), verdict
            # Every host's loop frame, by the function's name (hosts' frame numbers differ).
            tokens = j.allgather("batch['tokens']", frame='train')
            np.testing.assert_array_equal(tokens, _global_tokens(STEP))
            assert j.allgather('step', frame='train').tolist() == [STEP] * N
            assert j.nonfinite('batch', frame='train').ok  # int batch: nothing to find
            with pytest.raises(mhnotebook.SessionError, match="no frame of function 'trian'"):
                j.allgather('batch', frame='trian')
            # Hosts whose train_step was dispatched hold its unfinished outputs as `state`:
            # named in one line, in well under the tools' timeout (never a wait on the launch).
            inside = [p for p, f in frames.items() if f['at'].endswith('in train') and p != 2]
            t0 = time.monotonic()
            try:
                j.diff('state.params', frame='train')
            except mhnotebook.HostsError as exc:
                assert (
                    'the output of train_step call #1, dispatched before the hosts stopped'
                    in str(exc)
                ), exc
                assert '--check-jit' in str(exc), exc
            assert time.monotonic() - t0 < 20.0, inside
            # --allow-exec: a %%mh cell runs in each host's stopped frame (a copy of its names).
            from _helpers import magic_shell

            outs = j.execute(
                "print(step, batch['tokens'].shape[0], len(dir()) > 3)", frame='train', echo=False
            )
            assert sorted(outs) == list(range(N)), outs
            assert {o.split()[0] for o in outs.values()} == {str(STEP)}, outs
            with pytest.raises(mhnotebook.HostsError, match='ZeroDivisionError') as e:
                j.execute('step = 0\nprint(1 / step)', frame='train', echo=False)
            assert sorted(e.value.failures) == list(range(N))
            assert j.allgather('step', frame='train').tolist() == [STEP] * N  # untouched
            # A cell that never ends is stopped at its timeout, on every host: then no other
            # tool thread runs there (the one counting is the only one).
            t0 = time.monotonic()
            with pytest.raises(mhnotebook.HostsError, match='did not finish within 11 s'):
                j.execute('while True:\n    pass', timeout=1.0, echo=False)
            assert time.monotonic() - t0 < 60.0
            count = (
                'import threading\nprint(sum(t.name.startswith("multihost-inspect") '
                'for t in threading.enumerate()))'
            )
            _jobs.until(
                'the endless cells stopped',
                lambda: set(j.execute(count, echo=False).values()) == {'1\n'},
                30.0,
            )
            assert j.execute('print(step)', frame='train', echo=False)[0].strip() == str(STEP)
            ip, magics = magic_shell(None)
            ip.run_line_magic('mh_attach', control)
            try:
                with capture_output() as cap:
                    ip.run_cell_magic('mh', '', "print('in', step)")
                assert f'[process 0] in {STEP}' in cap.stdout, cap.stdout
            finally:
                ip.run_line_magic('mh_detach', '')
            released_at = time.monotonic()
            j.release_all()
        finally:
            j.detach()
        results = job.finish(120.0)
    ended = time.monotonic() - released_at
    codes = [code for code, _, _ in results]
    assert codes == [EXIT_PEER_FAILED] * FAILING + [1], (codes, [e[-2000:] for *_, e in results])
    assert ended < 30.0, ended
    _, _, err = results[FAILING]
    assert 'holding every host for at most 120 s' in err and 'mhnotebook.attach(' in err, err
    assert "BadBatch('bad batch')" in err and 'released; the error of process 2 goes on' in err
    for p in range(FAILING):
        assert f'this host (process {p}) holds at its next collective' in results[p][2]
