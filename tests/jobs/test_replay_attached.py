"""`replay` on a job started outside the notebook, held before its launch.

The real program: `_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) in 2
plain processes under ``multihost run --check-jit --hold-on-error``, as a scheduler launches
it, with a faulty chip on process 1 (``FAULTY_HOST=1``: a host callback moves one replicated
bias's gradient on its devices, `_flax_program.faulty_chip`) and process 1 raising before
step 2's batch: under ``--check-jit`` every launch meets the hosts before it is dispatched,
so process 0 is held before step 2's launch and process 1 on its error, the arguments (the
donated state included) still in their frames. A notebook attaches and replays the launch
from those frames: in Python (`AttachedJob.replay`) the inputs already differ (the drifted
bias is named); with ``%mh_replay ... --canonical --frame train`` in a real IPython shell
every replica is given the first's values and the callback's line and process 1 are named.
"""

from __future__ import annotations

import os
import re
from typing import Any

import _jobs
import pytest
from test_audit_replay import _faulty_chip_lines
from test_new_user import _held_job, _held_on_errors

pytestmark = [pytest.mark.slow, pytest.mark.release]

BIAS = "['block_0']['Dense_0']['bias']"


def test_an_attached_notebook_replays_the_held_launch_to_the_faulty_operation(tmp_path: Any):
    from _helpers import magic_shell

    import mhnotebook

    starting, _, control = _held_job(
        str(tmp_path), ['--check-jit'], 2,
        FAULTY_HOST='1', RAISE_HOST='1', RAISE_STEP='2', RAISE_BEFORE_BATCH='1',
    )  # fmt: skip
    with starting as job:
        _jobs.until('the control file', lambda: os.path.exists(control))
        j = mhnotebook.attach(control)
        try:
            _jobs.until('every host held', lambda: _held_on_errors(j, 1))
            report = j.replay('train_step', 'state', 'batch', frame='train', timeout=300)
            assert report.verdict == 'inputs' and report.num_processes == 2, report
            paths = report.inputs.differing_paths
            assert any(BIAS in p for p in paths), paths
            assert 'inputs differ between hosts' in str(report), report
        finally:
            j.detach()
        ip, _ = magic_shell(None)
        ip.run_line_magic('mh_attach', control)
        try:
            view = ip.run_line_magic(
                'mh_replay', 'train_step(state, batch) --canonical --frame train'
            )
            said = view.text()
        finally:
            ip.run_line_magic('mh_detach', '')
        assert "replicas to the first's" in said, said
        assert 'first operation whose outputs differ between hosts:' in said, said
        lines = [int(n) for n in re.findall(r'_flax_program\.py:(\d+)', said)]
        assert lines and lines[0] in _faulty_chip_lines(), (lines, said)
        assert 'process 1' in said, said
        j = mhnotebook.attach(control)
        try:
            j.release_all()
        finally:
            j.detach()
        job.finish(120.0)
