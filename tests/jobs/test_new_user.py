"""The job a new user already has, tried as they would (issue 44).

`_flax_job.py` (flax + optax + orbax, a jitted ``train_step`` with donated state, nothing
of `multihost` imported) in plain processes, each launched as a scheduler launches it:
``python -m multihost run [flags] _flax_job.py``. Each test is one thing the user met:
a flag written as ``--help`` prints it, ``--hold-on-error`` without a way to attach, a
held job whose hosts stopped at different points, the audit's finding held where it was
found. Every wait is bounded; every process is killed if anything fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import _jobs
import numpy as np
import pytest
from test_real_program_run import JOB, launch

from multihost._job import _cli, _run

pytestmark = [pytest.mark.slow, pytest.mark.release]  # plain processes of their own

#: A value of each metavar ``run --help`` prints, and what the parse makes of it.
_SAMPLES = {
    'S': ('5', 5.0),
    'PATH': ('/tmp/control.json', '/tmp/control.json'),
    'HOST': ('127.0.0.1', '127.0.0.1'),
    'DIR': ('/tmp/dumps', '/tmp/dumps'),
    'N': ('7', 7),
}


def _valued_options() -> list[tuple[str, str]]:
    """``(option, metavar)`` of every option of ``run`` whose help shows a value."""
    text = _cli.run_parser('multihost run').format_help()
    found = re.findall(r'^  (--[\w-]+) \[?([A-Z]+)\]?', text, re.M)
    assert len(found) >= 7, text  # --timeout ... --audit-log: the help still shows them
    return found


def test_every_valued_option_parses_as_help_prints_it_with_a_space_or_an_equals_sign():
    for option, metavar in _valued_options():
        value, parsed = _SAMPLES[metavar]
        name = option[2:].replace('-', '_')
        for argv in ([option, value, 'train.py', 'x'], [f'{option}={value}', 'train.py', 'x']):
            options, target, is_module, args = _run.parse(argv, 'multihost run')
            assert (options[name], target, is_module, args) == (parsed, 'train.py', False, ['x'])
    # The optional N of --audit: alone, the next word is the program (a number is N).
    assert _run.parse(['--audit', 'train.py', '7'])[:2] == ({'audit': 50}, 'train.py')
    assert _run.parse(['--audit', '--timeout', '5', 'train.py'])[0] == {'audit': 50, 'timeout': 5.0}


def test_audit_n_as_help_prints_it_audits_the_flax_job(tmp_path: Any):
    """``multihost run --audit 1 train.py`` (the help's ``--audit [N]``) ran nothing before:
    every host said ``can't open file '1'``."""
    outs = launch(str(tmp_path), '-m', 'multihost', 'run', '--audit', '1', LEAVE='return')
    for p, out in enumerate(outs):
        assert out['rc'] == 0 and 'DONE' in out['out'], (p, out['err'][-3000:])
        with open(os.path.join(str(tmp_path), 'records', f'audit-{p}.json')) as f:
            report = json.load(f)
        assert report['every'] == 1 and report['audited'] >= 6, report
        # A clean audited run says so, in one line at its end (before: nothing at all).
        lines = [ln for ln in out['err'].splitlines() if ln.startswith('multihost audit: ')]
        assert len(lines) == 1 and re.fullmatch(
            rf'multihost audit: \d+ launches audited on process {p} \(\d+ array leaves '
            r'compared across hosts\): no findings',
            lines[0],
        ), out['err'][-3000:]


def test_hold_on_error_without_a_control_file_is_refused_at_start_in_one_line(tmp_path: Any):
    """Before: the job ran, and on an error held every host for 1,800 s saying that nobody
    could attach."""
    env = _jobs.scheduler_env(2, CKPT_DIR=str(tmp_path / 'ckpt'), LOCAL_DEVICES='1',
                              RAISE_HOST='1', RAISE_STEP='1')  # fmt: skip
    t0 = time.monotonic()
    with _jobs.start(2, ['-m', 'multihost', 'run', '--hold-on-error', JOB], env,
                     cwd=str(tmp_path)) as job:  # fmt: skip
        results = job.finish(120.0)
    for rc, out, err in results:
        assert rc == 2 and 'LOSS' not in out, (rc, err[-2000:])
        (line,) = err.strip().splitlines()
        assert line == (
            'python -m multihost run: error: --hold-on-error needs --control-file PATH '
            '(MULTIHOST_CONTROL_FILE): without it no notebook can attach to the held job; '
            'add it, or drop --hold-on-error'
        ), line
    assert time.monotonic() - t0 < 60.0
    out = subprocess.run(
        [sys.executable, '-m', 'multihost', 'run', '--hold-on-error', '--control-file',
         str(tmp_path / 'c.json'), '--help'], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and '--control-file' in out.stdout


def _step_line() -> int:
    from test_real_program_run import _step_line as line

    return line()


def _held_on_errors(j: Any, n: int) -> Any:
    """``job.frames()`` once every host is held and ``n`` of them on their own error."""
    frames = j.frames()
    errors = sum('held on its error' in f['in'] for f in frames.values())
    return all(f['stopped'] for f in frames.values()) and errors == n and frames


def _held_job(tmp: str, flags: list[str], n: int, **extra: str) -> tuple[Any, Any, str]:
    """``(job, env, control file)``: the flax job under ``--hold-on-error`` and ``flags``."""
    control = os.path.join(tmp, 'control.json')
    env = _jobs.scheduler_env(n, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS='6',
                              LOCAL_DEVICES='1', **extra)  # fmt: skip
    command = ['-m', 'multihost', 'run', '--hold-on-error', '--control-file', control,
               '--hold-for', '150', *flags, JOB]  # fmt: skip
    return _jobs.start(n, command, env, cwd=tmp), env, control


def test_audit_raise_holds_at_the_launch_of_the_finding_its_batch_in_the_frame(tmp_path: Any):
    """Before: the NaN of call #2 was raised (and held) two launches later, where the frame's
    batch held no NaN, and each host printed the long finding four times."""
    import mhnotebook

    starting, _, control = _held_job(str(tmp_path), ['--audit', '1', '--audit-raise'], 2,
                                     NAN_HOST='1', NAN_STEP='2')  # fmt: skip
    with starting as job:
        _jobs.until('the control file', lambda: os.path.exists(control))
        j = mhnotebook.attach(control)
        try:
            frames = _jobs.until('every host held on its error', lambda: _held_on_errors(j, 2))
            # Held at the audited launch itself: the frame holds that step's batch.
            for p, f in frames.items():
                assert f['at'] == f'_flax_job.py:{_step_line()} in train', (p, f)
            assert j.allgather('step', frame='train').tolist() == [2, 2]
            found = j.nonfinite('batch', frame='train')
            assert not found.ok and found.processes == (1,) and 'weights' in str(found), found

            # The verdict names the error once for the hosts held on it; %mh_where's rows too
            # (once the job's orbax save thread has left its commit barrier: seen under load,
            # a host's row added that thread's barrier for a few ms).
            def one_line() -> set[str] | None:
                doings = {h.doing for h in j.where().values()}
                return doings if len(doings) == 1 else None

            doings = _jobs.until('one line for both held hosts', one_line, 60.0)
            assert 'raised AuditError(' in doings.pop(), j.where()

            def once() -> str | None:
                verdict = j.wavefront().verdict or ''
                return verdict if verdict.count('AuditError') == 1 else None

            verdict = _jobs.until('a verdict naming the error once', once, 60.0)
            assert verdict.count('AuditError') == 1, verdict
            assert verdict.startswith('processes 0-1 are held on its error: raised AuditError('), (
                verdict
            )
            j.release_all()
        finally:
            j.detach()
        results = job.finish(120.0)
    for p, (rc, _out, err) in enumerate(results):
        assert rc != 0, (p, err[-2000:])
        # The finding in full once; its headline in the error, said in full once more.
        assert err.count('fresh inputs holding NaN or Inf') == 1, (p, err[-4000:])
        assert 'AuditError: multihost audit: first non-finite at train_step call #2' in err, err
        assert err.count('raised AuditError(') == 1 and 'raised it too' in err, err[-4000:]
        # The traceback is the program's: no frame of multihost run, runpy or the installed
        # jit; the tool's lines read alike (never WARNING:multihost:multihost: ...).
        trace = err[err.index('Traceback (most recent call last):') :]
        trace = trace[: trace.index('AuditError: ')]
        assert 'runpy' not in trace and '/multihost/' not in trace, trace
        assert f'_flax_job.py", line {_step_line()}, in train' in trace, trace
        assert 'WARNING:multihost:' not in err, err[-4000:]


def test_a_gather_across_hosts_held_at_different_points_says_so(tmp_path: Any):
    """Process 1 raises before building step 2's batch (its ``batch`` is step 1's); process 0
    built step 2's and launched it. Before: ``%mh_allgather batch`` joined the two without a
    word."""
    from _helpers import magic_shell
    from IPython.utils.capture import capture_output

    import mhnotebook

    starting, _, control = _held_job(str(tmp_path), [], 2, RAISE_HOST='1', RAISE_STEP='2',
                                     RAISE_BEFORE_BATCH='1')  # fmt: skip
    with starting as job:
        _jobs.until('the control file', lambda: os.path.exists(control))
        j = mhnotebook.attach(control)
        try:
            frames = _jobs.until('every host held', lambda: _held_on_errors(j, 1))
            assert 'in check_batch' in frames[1]['frames'][0]['site'], frames[1]
            with capture_output() as cap:
                j.allgather("batch['tokens']", frame='train')
            (line,) = [ln for ln in cap.stdout.splitlines() if ln.startswith('note: ')]
            assert line.startswith('note: the processes were read at different points: '), line
            assert 'process 0 at _flax_job.py:' in line and 'process 1 at _flax_job.py:' in line
            assert 'an earlier step' in line, line
            # the launch counts are said when they differ: process 0 may be held before or
            # after it launched step 2 (a race of the hold with its own launch)
            if 'called 3x' in line:
                assert '(train_step called 2x)' in line, line
            assert j.apart == line[len('note: ') :]
            ip, _ = magic_shell(None)
            ip.run_line_magic('mh_attach', control)
            try:
                for magic in ('mh_allgather', 'mh_nonfinite', 'mh_diff'):
                    with capture_output() as cap:
                        ip.run_line_magic(magic, "batch['tokens'] --frame train")
                    assert 'note: the processes were read at different points' in cap.stdout, (
                        magic,
                        cap.stdout,
                    )
            finally:
                ip.run_line_magic('mh_detach', '')
            if '(train_step called 3x)' in j.apart:  # process 0 dispatched step 2's launch
                # Its state is that launch's unfinished output, its inputs donated: the error
                # names the host and the launch, and what to read instead.
                with pytest.raises(mhnotebook.HostsError) as e:
                    j.diff('state.params', frame='train')
                said = str(e.value)
                assert 'on process 0, the output of train_step call #2' in said, said
                assert '--check-jit' in said, said
            j.release_all()
        finally:
            j.detach()
        results = job.finish(120.0)
    # The failing host's line says how to attach, from the start of a notebook.
    assert (
        f'To inspect it: %load_ext mhnotebook, then %mh_attach {control} (or '
        f"mhnotebook.attach('{control}'))"
    ) in results[1][2], results[1][2][-2000:]
    # The job is gone: attaching fails, and the next magic says that, not how to start a
    # cluster (before: "no cluster yet: start one with %mh_cluster start").
    from IPython.core.error import UsageError

    ip, _ = magic_shell(None)
    with pytest.raises(UsageError):
        ip.run_line_magic('mh_attach', control)
    with pytest.raises(UsageError, match=f'not attached to a job: %mh_attach {control} failed'):
        ip.run_line_magic('mh_where', '')


def test_with_check_jit_a_held_job_s_donated_state_is_read_before_the_launch(tmp_path: Any):
    """--hold-on-error --check-jit: every launch meets the hosts before it is dispatched, so
    the hosts the failing one never met are held before the launch: ``state`` (donated to
    the launch they did not make) reads on every host."""
    import mhnotebook

    starting, _, control = _held_job(str(tmp_path), ['--check-jit'], 2, RAISE_HOST='1',
                                     RAISE_STEP='2', RAISE_BEFORE_BATCH='1')  # fmt: skip
    with starting as job:
        _jobs.until('the control file', lambda: os.path.exists(control))
        j = mhnotebook.attach(control)
        try:
            _jobs.until('every host held', lambda: _held_on_errors(j, 1))
            diff = j.diff('state.params', frame='train')
            assert diff.ok, diff
            bias = j.allgather("state.params['LayerNorm_0']['bias']", frame='train')
            assert bias.shape == (32,) and np.isfinite(bias).all(), bias
            j.release_all()
        finally:
            j.detach()
        job.finish(120.0)


def test_the_points_words():
    from multihost._models._points import ReadPoint, apart

    same = [ReadPoint(p, 't.py:9 in train', (('train_step', 3),)) for p in range(4)]
    assert apart(same) == ''
    behind = [*same[:2], ReadPoint(2, 't.py:5 in train', (('train_step', 2),)), same[3]]
    assert apart(behind).startswith(
        'the processes were read at different points: processes 0-1, 3 at t.py:9 in train '
        '(train_step called 3x); process 2 at t.py:5 in train (train_step called 2x). '
    ), apart(behind)


def test_ctrl_c_says_the_program_s_line_not_jax_s(tmp_path: Any):
    """Ctrl-C while process 1 stalls before step 2 and process 0 waits for step 2's loss in
    ``float(loss)``: process 0's KeyboardInterrupt comes inside JAX (``array.py in
    _value``). Before: its dump was read as interrupted there; now at the program's line."""
    import signal

    from multihost._models import _analyze, _dumpfile

    tmp = str(tmp_path)
    go, dumps = os.path.join(tmp, 'go'), os.path.join(tmp, 'dumps')
    env = _jobs.scheduler_env(2, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS='6',
                              LOCAL_DEVICES='1', STALL_HOST='1', STALL_BEFORE_STEP='2',
                              STALL_UNTIL=go)  # fmt: skip
    command = ['-m', 'multihost', 'run', '--dump-dir', dumps, JOB]
    with _jobs.start(2, command, env, cwd=tmp) as job:
        try:
            _jobs.until('process 1 stalled', lambda: os.path.exists(f'{go}.stalled-1'))
            time.sleep(3.0)  # process 0 is inside step 2's launch, reading its loss
            for p in job.procs:
                p.send_signal(signal.SIGINT)
            results = job.finish(120.0)
        finally:
            open(go, 'w').close()  # noqa: SIM115  (never left stalled)
    assert [rc for rc, _, _ in results] == [130, 130], [e[-2000:] for *_, e in results]
    found = {d.process: _analyze._interrupted(d) for d in _dumpfile.read_dirs([dumps])}
    loss = next(i + 1 for i, ln in enumerate(open(JOB)) if 'loss = float(loss)' in ln)
    assert found == {
        0: f'interrupted at _flax_job.py:{loss} in train: loss = float(loss)',
        1: found[1],
    }, found
    assert found[1].startswith('interrupted at _flax_job.py:') and 'in stall' in found[1]
