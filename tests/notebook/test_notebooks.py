"""Every tutorial notebook runs top to bottom in a real kernel (nbclient), as on Binder.

A notebook whose checks pass is saved, executed, to ``build/executed/<name>``:
the documentation site (``docs/conf.py``) renders those copies.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re

import pytest
from _helpers import notebook_text

pytestmark = pytest.mark.cluster

ROOT = pathlib.Path(__file__).parent.parent.parent
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))
EXECUTED = ROOT / 'build' / 'executed'  # read by docs/_ext/mhdocs.py


def test_there_are_tutorials():
    """The tutorials folder is not empty (a glob that finds nothing would test nothing)."""
    assert NOTEBOOKS


# Release rotation, each tutorial dealt on its own (its kernel and cluster are its own): CI
# executes a share of them on each landing in this suite and another share on Binder
# (.ci/run), and renders the rest of the docs site's tutorials from their sources.
@pytest.mark.release(dealt='test')
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path):
    """No cell raises; committed without outputs; key outputs are there; saved for the docs."""
    import nbformat  # here, not at the top: collecting the suite does not pay its import
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    assert all(not c.get('outputs') for c in nb.cells if c.cell_type == 'code'), (
        f'{path.name} is committed with outputs; clear them'
    )
    # The tutorials' outputs are the docs': XLA as a user has it, not the tests' `XLA_O0`.
    flags = os.environ.get('XLA_FLAGS')
    if flags is not None:
        theirs = flags.replace('--xla_backend_optimization_level=0', '').strip()
        if theirs:
            os.environ['XLA_FLAGS'] = theirs
        else:  # unset, as it was (tutorial 04 shows an XLA flag set on one host only)
            del os.environ['XLA_FLAGS']
    try:
        NotebookClient(nb, timeout=300, kernel_name='python3').execute()
    finally:
        if flags is not None:
            os.environ['XLA_FLAGS'] = flags
    text = notebook_text(nb)
    # Every widget leaves a static picture right after it (what a saved notebook shows).
    for c in nb.cells:
        outs = c.get('outputs', [])
        for i, o in enumerate(outs):
            if 'application/vnd.jupyter.widget-view+json' in o.get('data', {}):
                after = outs[i + 1].get('data', {}) if i + 1 < len(outs) else {}
                assert 'class="mh-static ' in after.get('text/html', ''), (
                    f'{path.name}: a widget without its static picture in cell {c.source!r}'
                )
    if path.name == '01_quickstart.ipynb':
        n_static = sum(
            'class="mh-static ' in str(o.get('data', {}))
            for c in nb.cells
            if c.cell_type == 'code'
            for o in c.outputs
        )
        assert n_static >= 5  # layout x, layout bias, diff, where, stepper
        assert 'full = x gathered from 4 processes: float32[16, 12]' in text
        assert 'replicas DIFFER' in text and 'odd process(es) [2]' in text
        assert "['kernel'] [value] on process 3" in text
        assert "process 3: passed 'ckpt'" in text
        assert 'still running after 3 s' in text and "barrier('after-eval')" in text
    if path.name == '03_jitted_hang.ipynb':
        # The other batch shape is caught before launch, on every host, naming host 2 ...
        assert text.count("first difference: argument 'batch'") == 4, text
        assert 'f32[12,4]' in text and 'on process 2' in text
        assert all(f'host {p} is in step' in text for p in range(4)), text
        # ... the timeline names the slow host, and the wavefront the one that never launched.
        assert 'process 3 arrived last in' in text, text
        assert 'processes 0-1, 3 are inside fast_step call #3' in text, text
        assert 'process 2 never launched call #3' in text and 'in load_shard' in text, text
        assert all(f'host {p} is back' in text for p in range(4)), text
    if path.name == '02_divergence.ipynb':
        assert "2: 'process_allgather'" in text and "0: 'barrier'" in text
        assert 'different structure, shapes or dtypes' in text
        assert 'params diverged. 1 of 2 leaves differ' in text and "['b'] (1,)" in text
        # Every host, the late host 1 included, reports the same verdict ...
        assert text.count('missing [1]') == 4, text
        # ... and the next collective lines up without a restart.
        assert all(f'host {p} is in step' in text for p in range(4)), text
    if path.name == '04_census.ipynb':
        assert "env.XLA_FLAGS: (unset) on most; process 1: '--xla_cpu_enable_fast" in text
        assert 'process 3: 2 arrays, 65.0 MiB <-- stands out' in text and 'cache[0]' in text
        assert 'on process 2, device 4096 (dev 0): 1 NaN' in text, text
        assert 'odd process(es) [2]' in text and '1 distinct block(s), 8 replica(s)' in text
    if path.name == '06_flax_training.ipynb':
        # A healthy flax TrainState watched (typed key, functions in static fields): no false alarm.
        assert 'step 3: loss' in text, text
        # The parameter tree in one table; one leaf by its attribute path.
        assert 'state.params: 19 leaves' in text and "['embed']['embedding']" in text, text
        assert "NamedSharding P('model') on mesh (data=2, model=2)" in text, text
        # Healthy sharded leaves are compared over their replicas: nothing differs ...
        assert 'All 2 processes hold the same tree (19 leaves).' in text, text
        # ... then the drifted bias is named once, its two blocks listed (issue 32 item 7);
        # two hosts: no majority, no blame (item 3).
        assert (
            "['block_0']['Dense_0']['bias'] blocks [0:32], [32:64] (2 of its blocks differ; "
            'the first:) [value]: processes 0 and 1 differ; no majority' in text
        ), text
        assert text.count("['Dense_0']['bias'] block") == 1, text
        assert 'no majority, so no process is odd' in text, text
        # The other batch shape: caught before launch, first difference first.
        assert 'first difference: argument "batch[' in text and 'on process 1' in text, text
        assert 'other arguments are the same on every host' in text, text
        # The whole state in the notebook, its dropout key a key array.
        assert 'gathered = state gathered from 2 processes' in text and 'key<fry>' in text, text
    if path.name == '07_batch_job.ipynb':
        # Attached while it hangs: the wavefront names the late host and its own frame.
        assert "processes 0-1, 3 are waiting at barrier('checkpoint 5')" in text, text
        assert 'process 2 is not there' in text and 'in save_checkpoint, in time.sleep' in text
        # After it died: four dumps (the watchdog's, and process 2's on request), one verdict.
        assert '4 of 4 processes dumped in' in text and 'process 2 (' in text, text
        assert text.count('culprit: process 2') >= 2, text  # postmortem and analyze
        assert 'still running: none' in text, text
        # Audited: process 2 feeding process 1's data, named the step it began, job not stopped.
        assert 'duplicate data at train_step call #3 (audit_job.py:' in text, text
        assert '(processes 1-2 feed identical data)' in text, text
        assert 'exit codes: [0, 0, 0, 0]' in text, text
        # ... and nothing left behind: its folder (control file, logs, dumps) is removed.
        folder = re.search(r"removed the job's folder (\S+): True", text)
        assert folder and not os.path.exists(folder.group(1)), text
    if path.name == '08_hold_and_inspect.ipynb':
        # Held on its error; the data tools read the stopped frames; released, it ends as usual.
        assert "process 2: held on its error: raised FloatingPointError('loss is nan" in (text), (
            text
        )
        assert 'NaN/Inf in 1 shard of 1 leaf on process 2: 1 NaN' in text, text
        assert 'first at (7,)' in text and 'NaN at [(2, 7)]' in text, text
        assert 'All 4 processes hold the same tree (2 leaves).' in text, text
        assert 'exit codes: [75, 75, 1, 75]' in text and 'still running: none' in text, text
        assert "multihost: process 2 failed: FloatingPointError('loss is nan at step 3')" in text
        folder = re.search(r"removed the job's folder (\S+): True", text)
        assert folder and not os.path.exists(folder.group(1)), text
    CHECKS.get(path.name, lambda text: None)(text)  # tutorials checked in a function of their own
    if path.name == '05_real_cluster.ipynb':
        # Without MH_CLUSTER_URL_FILE: its stand-in cluster on this machine.
        # tests/notebook/test_netns_cluster.py runs it against hosts with their own addresses.
        assert 'a stand-in on this machine' in text, text
        assert 'mhnotebook: connected to 4 processes' in text, text
        assert 'JAX coordinator: 127.0.0.1:' in text and 'process 3: engine' in text, text
        assert 'full = x gathered from 4 processes: float32[4, 4]' in text, text
    _save_executed(nb, path.name)


def _check_pod_layout(text):
    """Tutorial 09's key outputs: with libtpu the v5e-16's verdicts, chip grid and the
    replicated embedding's cost; without (Python 3.12 / jax 0.12, Binder) what it says."""
    if importlib.util.find_spec('libtpu') is None:
        assert 'libtpu is not installed here' in text, text
        return
    assert 'mesh data=4 ICI line of 4 along y, not a ring, 2 hosts' in text, text
    assert '  y=3 p2 3,0 p2 3,1 p3 3,2 p3 3,3' in text, text
    assert 'embed: 1.95 GiB each (16 chips)' in text and 'embed: 500 MiB each' in text
    assert 'mesh dcn=2 DCN across 2 slices' in text and '  slice 1:' in text, text
    assert 'libtpu is not installed' not in text


def _check_why_replicas_part(text):
    """Tutorial 10's key outputs: the drift, the inputs that differ, then the operation."""
    assert 'processes 0 and 1 differ' in text, text
    assert 'inputs differ between hosts' in text, text
    assert 'first operation whose outputs differ between hosts:' in text, text
    assert 'in faulty_chip' in text and "inputs differ between hosts: ['w']" in text, text
    assert re.search(r'max abs diff 0\.00(0999|1)', text), text  # the chip's 1e-3, in float32


#: Tutorial -> the check of its key outputs, for those checked in a function of their own.
CHECKS = {
    '09_pod_layout.ipynb': _check_pod_layout,
    '10_why_replicas_part.ipynb': _check_why_replicas_part,
}


def _save_executed(nb, name):
    """Writes the executed notebook for the docs build (atomically: parallel runs share it)."""
    import nbformat

    EXECUTED.mkdir(parents=True, exist_ok=True)
    tmp = EXECUTED / f'.{name}.{os.getpid()}.tmp'
    nbformat.write(nb, tmp)
    os.replace(tmp, EXECUTED / name)
