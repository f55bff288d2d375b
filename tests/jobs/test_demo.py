"""The README's main job, as a user runs it: ``mhnotebook demo`` on 4 simulated hosts.

Runs the console entry point in a subprocess (a real local ipyparallel cluster),
checks its exit code, the files it promises and what its report says about
each step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster


def test_demo_writes_its_files_and_says_what_it_found(tmp_path):
    out = tmp_path / 'demo'
    run = subprocess.run(
        [sys.executable, '-m', 'mhnotebook', 'demo', '--out', str(out)],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(os.listdir(out)) == [
        'diff_params.html',
        'layout_bias.png',
        'layout_w.png',
        'layouts.html',
        'report.txt',
        'where.html',
    ]
    report = (out / 'report.txt').read_text()
    said = run.stdout + run.stderr
    ready = re.findall(r'.*(?:ready|devices up) in [\d.]+ s.*', said)
    assert len(ready) == 1 and 'ready' in ready[0], said  # the cluster's start, said once
    assert report.startswith('4 processes x 2 CPU devices up in '), report
    assert report.count('caught BarrierMismatchError') == 4, report
    # While process 2 is busy elsewhere, the others wait in the next barrier; process 2 is
    # not said to be "in" the barrier it already left.
    step6 = report.split('where is everyone')[1]
    for p in (0, 1, 3):
        assert re.search(rf"process {p}: waiting [\d.]+ s in barrier\('after-eval'\)", step6), step6
    assert re.search(r'process 2: not in a collective \(last: ', step6), step6
    assert (out / 'layout_bias.png').stat().st_size > 10_000
