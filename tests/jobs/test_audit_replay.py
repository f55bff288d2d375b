"""``multihost run --audit --audit-replay``: at a drift, the next launch is replayed on every
host before it runs, and the first operation where the hosts part is named.

The real program: `_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) in 2
plain processes, as a scheduler launches it, with ``FAULTY_HOST=1``: process 1's devices
add 1e-3 to one replicated bias's summed gradient in a host callback (`_flax_program.
faulty_chip`, a chip that computes wrong), every step. The audit finds the drift at
``train_step`` call #0; call #1 is replayed with every replica given the first's values;
every host names the callback's line in the program and process 1, writes it to the dump
directory, and `multihost analyze` reads it. The replayed job's losses are those of the
same job audited without the replay, bit for bit.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Any

import pytest
from test_real_program_run import _losses, launch

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers


def _faulty_chip_lines() -> range:
    """The lines of `_flax_program.faulty_chip` (the equation's line must be one of them)."""
    with open(os.path.join(HERE, '_flax_program.py')) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == 'faulty_chip')
    return range(fn.lineno, (fn.end_lineno or fn.lineno) + 1)


@pytest.fixture(scope='module')
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The faulty job audited, with and without the replay (each ~30 s)."""
    out: dict[str, Any] = {}
    for name, flags in (('audited', []), ('replayed', ['--audit-replay'])):
        tmp = str(tmp_path_factory.mktemp(name))
        dumps = os.path.join(tmp, 'dumps')
        command = ['-m', 'multihost', 'run', '--audit=1', '--dump-dir', dumps, *flags]
        outs = launch(tmp, *command, FAULTY_HOST='1', SAVE='0')
        for o in outs:
            assert o['rc'] == 0 and 'DONE' in o['out'], o['err'][-3000:]  # the job went on
        out[name] = {'outs': outs, 'dumps': dumps}
    return out


@pytest.mark.release
def test_the_replay_names_the_callback_line_and_the_process_on_every_host(runs):
    lines = _faulty_chip_lines()
    for p, o in enumerate(runs['replayed']['outs']):
        err = o['err']
        assert 'multihost audit: replica drift at train_step call #0' in err, err[-3000:]
        head = 'replay of train_step call #1, the launch after replica drift at train_step call #0'
        said = [ln for ln in err.split('multihost audit: ') if ln.startswith(head + ' (')]
        assert len(said) == 1, (p, err[-4000:])  # once per host
        text = said[0]
        assert "host-local arguments set to process 0's, replicas to the first's" in text, text
        assert 'first operation whose outputs differ between hosts:' in text, text
        named = [int(n) for n in _line_numbers(text)]
        assert named and named[0] in lines, (named, lines, text)
        assert 'process 1' in text, text
        assert 'its inputs agreed' in text, text
    # Without the replay, the same drift and no replay line.
    for o in runs['audited']['outs']:
        assert 'replica drift at train_step call #0' in o['err']
        assert 'replay of train_step' not in o['err'], o['err'][-3000:]


@pytest.mark.release
def test_the_replay_leaves_the_losses_bitwise_unchanged(runs):
    audited = [_losses(o['out']) for o in runs['audited']['outs']]
    replayed = [_losses(o['out']) for o in runs['replayed']['outs']]
    assert all(len(lo) == 6 for lo in audited), audited
    assert replayed == audited  # float.hex: every bit of every step's loss, on every host


@pytest.mark.release
def test_analyze_reads_the_replay_from_the_dump_directory(runs):
    dumps = runs['replayed']['dumps']
    files = sorted(os.listdir(dumps))  # the replays, and no dump: the job never hung
    assert [f for f in files if f.endswith('.json')] == ['replay-0.json', 'replay-1.json'], files
    done = subprocess.run(
        [sys.executable, '-m', 'multihost', 'analyze', dumps],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = done.stdout
    head = "replay of train_step call #1 (after the audit's drift at call #0), said by processes"
    assert text.startswith(head), text  # both hosts, one verdict
    assert 'output 0 block [0:64] [value]: processes 0 and 1 differ' in text, text
    assert 'first operation whose outputs differ between hosts' in text, text
    assert text.count('replay of train_step call #1') == 1, text  # the hosts' same verdict, once


def _line_numbers(text: str) -> list[str]:
    import re

    return re.findall(r'_flax_program\.py:(\d+)', text)
