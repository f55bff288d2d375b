"""Audit while it runs (issue 31): the silent divergences of a job found the launch they happen.

The real program: `_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) in
2 plain processes under ``python -m multihost run --audit=1``, as a scheduler launches it.
Healthy, it finds nothing and computes the losses of the uninstalled run bit for bit; with
two hosts drawing the same data and one host's replica of a parameter moved after step 1,
both are named on every host, the argument path as a user writes it; with a NaN in one
host's batch, the first non-finite launch and that host's fresh input are named. The job
is never stopped. `compare` (the part every host runs on the shared tables) is also checked
alone, on tables written by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from test_real_program_run import N, _losses, launch

from multihost import AuditReport, FlightRecord, Timeline
from multihost._job import _audit, _cli, _run
from multihost._job._fate import EXIT_PEER_FAILED

pytestmark = pytest.mark.slow


def _reports(tmp: str) -> list[AuditReport]:
    out = []
    for p in range(N):
        with open(os.path.join(tmp, 'records', f'audit-{p}.json')) as f:
            out.append(AuditReport.from_json(json.load(f)))
    return out


def _audit_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith('multihost audit: ')]


def _attached_while_it_runs(tmp: str, log: str, **env: str) -> tuple[list[dict], Any, str]:
    """The buggy run, attached from a notebook while process 0 stalls before step 5: the
    outputs, `AttachedJob.audit()` then, and ``%mh_audit``'s text then."""
    import time

    import _jobs
    from _helpers import magic_shell
    from test_real_program_run import JOB, TIMEOUT

    import mhnotebook

    ckpt, records = os.path.join(tmp, 'ckpt'), os.path.join(tmp, 'records')
    ctl, go = os.path.join(tmp, 'control.json'), os.path.join(tmp, 'go')
    os.makedirs(records)
    env = _jobs.scheduler_env(N, CKPT_DIR=ckpt, JOB_RECORDS=records, STEPS='6', STALL_HOST='0',
                              STALL_BEFORE_STEP='5', STALL_UNTIL=go, **env)  # fmt: skip
    command = ['-m', 'multihost', 'run', '--audit', '--audit-log', log, '--control-file', ctl]
    with _jobs.start(N, [*command, JOB], env, cwd=tmp) as job:
        try:
            deadline = time.monotonic() + 120
            while not os.path.exists(ctl) and time.monotonic() < deadline:
                time.sleep(0.2)
            attached = mhnotebook.attach(ctl)
            try:
                report = attached.audit()
                while len(report.findings) < 3 and time.monotonic() < deadline:
                    time.sleep(0.5)  # step 2's findings: shared off the main thread
                    report = attached.audit()
            finally:
                attached.detach()
            ip, _ = magic_shell(None)
            ip.run_line_magic('mh_attach', ctl)
            try:
                text = ip.run_line_magic('mh_audit', '').text()
            finally:
                ip.run_line_magic('mh_detach', '')
        finally:
            open(go, 'w').close()  # noqa: SIM115  (process 0 goes on)
        results = job.finish(TIMEOUT)
    outs = []
    for pid, (rc, stdout, stderr) in enumerate(results):
        with open(os.path.join(records, f'records-{pid}.json')) as f:
            outs.append({'rc': rc, 'out': stdout, 'err': stderr, 'records': json.load(f)})
    return outs, report, text


@pytest.fixture(scope='module')
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job uninstalled, audited healthy and audited with two data bugs (each ~25 s).

    ``buggy``: from step 2 on process 1 draws process 0's batch, and after step 1 process
    1's copy of one replicated bias is moved; a notebook attaches while it runs."""
    out: dict[str, Any] = {}
    for name, flags in (('plain', []), ('healthy', ['--audit=1']), ('buggy', ['--audit'])):
        tmp = str(tmp_path_factory.mktemp(name))
        log = os.path.join(tmp, 'audit-log')
        os.makedirs(log)
        if name == 'buggy':
            outs, report, text = _attached_while_it_runs(
                tmp, log, DUP_HOSTS='0,1', DUP_FROM_STEP='2', DRIFT_HOST='1', DRIFT_STEP='1'
            )
            out['attached'] = {'report': report, 'text': text}
        else:
            command = ['-m', 'multihost', 'run', *flags, '--audit-log', log] if flags else []
            outs = launch(tmp, *command)
        for o in outs:
            assert o['rc'] == 0 and 'DONE' in o['out'], o['err'][-3000:]  # never stopped
        out[name] = {'outs': outs, 'tmp': tmp, 'log': log}
    return out


@pytest.mark.release
def test_an_attached_notebook_sees_the_findings_while_the_job_runs(runs):
    report, text = runs['attached']['report'], runs['attached']['text']
    assert report.enabled and report.process == 0, report
    assert sorted(f.check for f in report.findings) == ['drift', 'duplicate', 'duplicate']
    assert 'replica drift at train_step call #2' in text and 'duplicate data' in text, text


@pytest.mark.release
def test_a_healthy_job_is_audited_finds_nothing_and_computes_the_same_losses(runs):
    plain, audited = runs['plain']['outs'], runs['healthy']['outs']
    assert [_losses(o['out']) for o in audited] == [_losses(o['out']) for o in plain]
    for p, (out, report) in enumerate(zip(audited, _reports(runs['healthy']['tmp']))):
        assert _audit_lines(out['err']) == [], out['err'][-3000:]
        assert report.enabled and report.ok and not report.stopped, report
        assert report.process == p and report.every == 1
        # the state's init and the six steps, every one (N = 1), with all their leaves
        assert report.audited >= 7 and report.leaves > 100, report
    # the audit's exchanges are in the flight records, off the main thread; the timeline
    # shows them as steps of their own and does not count them when naming a straggler
    recs = audited[0]['records']
    assert any(r[2] == 'audit train_step' and r[13] == _audit.THREAD for r in recs), recs[-5:]
    timeline = Timeline.build({p: [FlightRecord(*r) for r in o['records']]
                               for p, o in enumerate(audited)})  # fmt: skip
    audits = [s for s in timeline.steps if s.audit]
    assert audits and all(s.name == 'audit train_step' or s.name == 'audit init' for s in audits)
    complete = [s for s in timeline.steps if s.complete and s.kind != 'service_wait']
    assert timeline.stragglers().steps == len([s for s in complete if not s.audit])


@pytest.mark.release
def test_duplicate_data_and_a_drifted_replica_are_named_on_every_host(runs):
    lines = [_audit_lines(out['err']) for out in runs['buggy']['outs']]
    assert all(got == lines[0] for got in lines), lines  # the same on every host
    dup = [ln for ln in lines[0] if 'duplicate data' in ln]
    assert len(dup) == 2, lines[0]  # tokens and targets, once each (not once per step)
    assert 'train_step call #2 (_flax_job.py:' in dup[0]  # the step it began
    assert "batch['targets'] is the same data in blocks [0:4, 0:8] of process 0 and " in dup[0]
    assert '[4:8, 0:8] of process 1' in dup[0] and '(processes 0-1 feed identical data)' in dup[0]
    assert any("batch['tokens']" in ln for ln in dup)
    (drift,) = [ln for ln in lines[0] if 'replica drift' in ln]
    # moved after step 1: the step-2 launch computes from it, its result differs on process 1
    assert 'train_step call #2' in drift, drift
    assert "result[0].params['block_0']['Dense_0']['bias'] block [" in drift, drift
    assert 'differs on process 1 from process 0' in drift, drift
    for report in _reports(runs['buggy']['tmp']):
        assert sorted(f.check for f in report.findings) == ['drift', 'duplicate', 'duplicate']
        assert report.of('drift')[0].processes == (1,)
        assert report.of('duplicate')[0].processes == (0, 1)


def _audit_diff(a: str, b: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, '-m', 'multihost', 'audit-diff', a, b],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.release
def test_audit_diff_names_the_first_launch_and_host_where_two_runs_data_differ(runs):
    healthy, buggy = runs['healthy']['log'], runs['buggy']['log']
    assert sorted(os.listdir(buggy)) == ['audit-0.jsonl', 'audit-1.jsonl']
    out = _audit_diff(healthy, buggy)
    assert out.returncode == 1, out.stderr
    first = out.stdout.splitlines()[0]
    assert first == (
        "the runs' data differ first at train_step call #2: process 1, batch['targets'], "
        "batch['tokens'] (block [4:8, 0:8])"
    ), out.stdout
    assert '  process 0: the same in both runs' in out.stdout
    same = _audit_diff(healthy, healthy)
    assert same.returncode == 0 and same.stdout.startswith(
        'the data of processes 0-1 are the same in both runs ('
    ), same.stdout
    missing = _audit_diff(healthy, runs['plain']['tmp'])
    assert missing.returncode == 2 and 'no audit log' in missing.stderr, missing.stderr


# Release rotation; covered on every landing by the NaN check:
# tests/engine/test_nonfinite_multiprocess.py; the audit: the raise test below
@pytest.mark.release
def test_the_first_nan_names_its_launch_and_the_host_whose_batch_held_it(tmp_path: Any):
    """... and when the job later fails (process 0 raises before step 4), every host's dump
    carries the audit and ``multihost analyze`` says the finding after the cause."""
    dumps = str(tmp_path / 'dumps')
    outs = launch(
        str(tmp_path), '-m', 'multihost', 'run', '--audit=1', '--dump-dir', dumps,
        NAN_HOST='1', NAN_STEP='2', RAISE_HOST='0', RAISE_STEP='4',
    )  # fmt: skip
    assert [o['rc'] for o in outs] == [1, EXIT_PEER_FAILED], [o['err'][-2000:] for o in outs]
    for out in outs:
        (line,) = _audit_lines(out['err'])  # once, not at every later step
        assert 'first non-finite at train_step call #2 (_flax_job.py:' in line, line
        assert 'holds NaN or Inf on processes 0-1' in line, line
        assert "fresh inputs holding NaN or Inf: batch['weights'] on process 1" in line, line
    text = subprocess.run([sys.executable, '-m', 'multihost', 'analyze', dumps],
                          capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    lines = text.splitlines()
    assert lines[0].startswith("process 0 raised BadBatch('bad batch')"), text
    (audit,) = [ln for ln in lines if ln.startswith('audit: ')]
    assert audit.startswith('audit: first non-finite at train_step call #2 '), text
    assert "batch['weights'] on process 1" in audit, text
    # the post-mortem of those files: the same finding, as a model
    import mhnotebook

    report = mhnotebook.postmortem(dumps).audit()
    assert report.enabled and [f.check for f in report.findings] == ['nonfinite'], report
    assert report.findings[0].processes == (0, 1) and report.findings[0].call == 2
    # and %mh_audit in a real IPython shell, on those dumps
    from _helpers import magic_shell

    ip, _ = magic_shell(None)
    view = ip.run_line_magic('mh_postmortem', f'{dumps} --view audit')
    assert type(view).__name__ == 'AuditView'
    assert 'first non-finite at train_step call #2' in view.text(), view.text()
    html = view.static_html()
    assert html.count('mh-audit-row') == 1 and 'mh-audit-nonfinite' in html, html
    assert 'train_step</code> #2' in html and 'audit: 1 finding(s)' in html, html


# -- the comparison alone, on tables written by hand ------------------------------------------

A, B, C = 'x' + 'a' * 16, 'x' + 'b' * 16, 'x' + 'c' * 16


def _table(fresh: bool, *blocks: tuple[str, list[str], bool, bool]) -> list[Any]:
    return [fresh, [list(b) for b in blocks]]


def test_compare_finds_drift_against_the_majority_and_never_across_digest_kinds():
    paths = ['state.w']
    tables = {p: [_table(False, ('[0:4]', [A], False, True))] for p in range(4)}
    assert _audit.compare('step', 3, 'train.py:9', paths, tables) == []
    tables[2] = [_table(False, ('[0:4]', [B], False, True))]
    (f,) = _audit.compare('step', 3, 'train.py:9', paths, tables)
    assert (f.check, f.processes, f.path) == ('drift', (2,), 'state.w')
    assert f.format() == (
        'replica drift at step call #3 (train.py:9): state.w block [0:4] differs on '
        'process 2 from processes 0-1, 3'
    )
    tables[2] = [_table(False, ('[0:4]', ['0123456789abcdef0'], False, True))]  # a kernel's
    assert _audit.compare('step', 3, '', paths, tables) == []


def test_compare_duplicates_only_fresh_distinct_unskipped_blocks_of_different_hosts():
    paths = ["batch['x']"]
    same = {0: [_table(True, ('[0:4]', [A], False, False))],
            1: [_table(True, ('[4:8]', [A], False, False))]}  # fmt: skip
    (f,) = _audit.compare('step', 0, '', paths, same)
    assert f.check == 'duplicate' and f.processes == (0, 1)
    assert 'blocks [0:4] of process 0 and [4:8] of process 1' in f.detail
    constant = {p: [_table(True, (k, [A], False, True))] for p, k in ((0, '[0:4]'), (1, '[4:8]'))}
    assert _audit.compare('step', 0, '', paths, constant) == []  # zeros, padding: skipped
    state = {p: [_table(False, (k, [A], False, False))] for p, k in ((0, '[0:4]'), (1, '[4:8]'))}
    assert _audit.compare('step', 0, '', paths, state) == []  # produced by a launch
    one_host = {0: [_table(True, ('[0:4]', [A], False, False), ('[4:8]', [A], False, False))]}
    assert _audit.compare('step', 0, '', paths, one_host) == []  # within one process


def test_compare_names_the_first_non_finite_result_and_the_inputs_that_held_some():
    paths = ["batch['w']", 'state.p', 'result[0].p', 'result[1]']
    tables = {
        0: [_table(True, ('[0:2]', [A], False, False)), _table(False, ('[]', [B], False, True)),
            _table(False, ('[]', [C], True, True)), _table(False, ('[]', [C], True, True))],
        1: [_table(True, ('[2:4]', [B], True, False)), _table(False, ('[]', [B], False, True)),
            _table(False, ('[]', [C], True, True)), _table(False, ('[]', [C], True, True))],
    }  # fmt: skip
    (f,) = _audit.compare('step', 5, '', paths, tables)
    assert (f.check, f.path, f.processes) == ('nonfinite', 'result[0].p', (0, 1))
    assert f.detail.endswith("fresh inputs holding NaN or Inf: batch['w'] on process 1")


def test_audit_option_words():
    assert _audit.every_from(True) == _audit.DEFAULT_EVERY == _audit.every_from('on')
    assert _audit.every_from('7') == 7 and _audit.every_from(None) == 0
    assert _audit.every_from('off') == 0 and _audit.every_from(1) == 1
    with pytest.raises(ValueError, match=r"audit='often': give N, a whole number"):
        _audit.every_from('often')
    assert _run.parse(['--audit', 'train.py', '--audit'], 'multihost run') == (
        {'audit': _audit.DEFAULT_EVERY}, 'train.py', False, ['--audit'])  # fmt: skip
    assert _run.parse(['--timeout', '3', '--audit=5', '-m', 'pkg.train'], 'm')[0] == {
        'timeout': 3.0, 'audit': 5}  # fmt: skip
    with pytest.raises(_cli.UsageError, match='argument --audit: '):
        _run.parse(['--audit=-2', 'train.py'], 'multihost run')


def test_audit_raise_ends_the_job_at_the_next_launch_every_host_saying_why(tmp_path: Any):
    outs = launch(
        str(tmp_path), '-m', 'multihost', 'run', '--audit-raise',
        DUP_HOSTS='0,1', DUP_FROM_STEP='2',
    )  # fmt: skip
    for p, out in enumerate(outs):
        assert 'DONE' not in out['out'] and out['rc'] in (1, EXIT_PEER_FAILED), (p, out['err'])
        says = 'AuditError: multihost audit: duplicate data at train_step call #2'
        # its own error (the job prints it) or the other host's, ending this one (fate)
        assert says in out['out'] + out['err'] or (
            out['rc'] == EXIT_PEER_FAILED and 'AuditError' in out['err']
        ), (p, out['out'][-1500:], out['err'][-1500:])
        steps = [ln for ln in out['out'].splitlines() if ln.startswith('LOSS ')]
        assert len(steps) < 6, steps  # it did not run to its end


def test_a_wrong_audit_value_is_one_line_and_exit_2(tmp_path: Any):
    script = tmp_path / 'hi.py'
    script.write_text("print('ran')\n")
    for args, env, says in (
        (['--audit-log', str(tmp_path / 'nowhere')], {}, 'is not a directory: create it first'),
        ([], {'MULTIHOST_AUDIT': 'often'}, "MULTIHOST_AUDIT='often': "),
    ):
        out = subprocess.run(
            [sys.executable, '-m', 'multihost', 'run', *args, str(script)],
            capture_output=True, text=True, timeout=120, env={**os.environ, **env},
        )  # fmt: skip
        assert out.returncode == 2 and 'ran' not in out.stdout, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith('python -m multihost run: error: ') and says in line, line


def _log(directory: Any, process: int, entries: list[tuple[str, int, dict[str, Any]]]) -> None:
    directory.mkdir(exist_ok=True)
    head = {'format': 'multihost-audit-log', 'version': 1, 'process': process,
            'num_processes': 2, 'started': 0.0}  # fmt: skip
    rows = [json.dumps({'f': f, 'c': c, 'l': leaves}) for f, c, leaves in entries]
    lines = [json.dumps(head), *rows]
    (directory / f'audit-{process}.jsonl').write_text('\n'.join(lines) + '\n')


def test_audit_diff_aligns_a_resumed_run_by_shift(tmp_path: Any):
    """Run B resumed at run A's step 3 (its call 0 is A's call 3); from A's step 5 on,
    process 1's data differ (the iterator was not restored right)."""
    from multihost._job import _auditlog

    def batch(step: int, p: int) -> dict[str, Any]:
        return {"batch['x']": [[f'[{4 * p}:{4 * p + 4}]', f'x{step:016x}{p}']]}

    a, b = tmp_path / 'a', tmp_path / 'b'
    for p in (0, 1):
        _log(a, p, [('step', s, batch(s, p)) for s in range(8)])
        _log(b, p, [('step', c, batch(c + 3 if (p, c + 3) < (1, 5) else 99, p))
                    for c in range(5)])  # fmt: skip
    differ, lines = _auditlog.diff(str(a), str(b), shift=3)
    assert differ and lines[0] == (
        "the runs' data differ first at step call #5: process 1, batch['x'] (block [4:8])"
    ), lines
    assert lines[1] == '  process 0: the same in both runs', lines
    differ, lines = _auditlog.diff(str(a), str(b))  # unshifted: everything differs at once
    assert differ and 'step call #0' in lines[0], lines
    with pytest.raises(_auditlog.AuditLogError, match='--shift must be 0 or more'):
        _auditlog.diff(str(a), str(b), shift=-1)


@pytest.mark.parametrize('how', ['auto', 'device'])
def test_the_read_flags_nan_in_bfloat16_and_skips_constant_fresh_blocks(how, monkeypatch):
    """One launch's table, read on this process (XXH3 on a CPU device under auto, the
    kernel's one pass under device): a bfloat16 result holding NaN is flagged (numpy alone
    does not call bfloat16 inexact: it was missed on CPU), a fresh all-zeros input is never
    duplicate data, a fresh random one may be."""
    import jax.numpy as jnp
    import numpy as np

    monkeypatch.setenv('MULTIHOST_FINGERPRINT', how)
    zeros = jnp.zeros((64, 64), jnp.float32)
    data = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32)
    out = jnp.ones((8, 8), jnp.bfloat16).at[3, 3].set(jnp.nan)
    big = jnp.zeros((300, 300), jnp.bfloat16).at[5, 5].set(jnp.inf)  # the device program

    def step(zeros: Any, data: Any) -> Any:
        return out, big

    item = _audit._Item('step', 0, 'here', step, (zeros, data), {}, (out, big))
    paths, table, _ = _audit._read(item)
    assert paths == ['zeros', 'data', 'result[0]', 'result[1]']
    (z,), (d,), (o,), (b,) = (blocks for _, blocks in table)
    assert z[2:] == [False, True] and d[2:] == [False, False]
    assert o[2] is True and b[2] is True
    assert (d[1][0].startswith('x')) == (how == 'auto')
