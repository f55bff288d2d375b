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
import pytest
from test_real_program_run import JOB, launch

from multihost._job import _cli, _run

pytestmark = pytest.mark.slow  # plain processes of their own

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
    assert _run.parse(['--audit', '--timeout', '5', 'train.py'])[0] == {'audit': 50,
                                                                        'timeout': 5.0}


def test_audit_n_as_help_prints_it_audits_the_flax_job(tmp_path: Any):
    """``multihost run --audit 1 train.py`` (the help's ``--audit [N]``) ran nothing before:
    every host said ``can't open file '1'``."""
    outs = launch(str(tmp_path), '-m', 'multihost', 'run', '--audit', '1')
    for p, out in enumerate(outs):
        assert out['rc'] == 0 and 'DONE' in out['out'], (p, out['err'][-3000:])
        with open(os.path.join(str(tmp_path), 'records', f'audit-{p}.json')) as f:
            report = json.load(f)
        assert report['every'] == 1 and report['audited'] >= 6, report


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
