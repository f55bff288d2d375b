"""A healthy flax + optax + orbax training job under the toolkit raises nothing, and is seen.

The program (`_flax_program`) is written the way those libraries document one,
run on 4 real `jax.distributed` processes x 2 CPU devices. Every check the
toolkit offers is applied to it as a user would: the jitted step watched, its
state broadcast and compared, its parameters diffed and laid out, a barrier
around an orbax checkpoint save. A healthy job must raise nothing and report
nothing different; the per-item failures live in ``test_real_program_*.py``.
"""

from __future__ import annotations

import shutil
import tempfile

import jax
import numpy as np
import pytest

import multihost

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


@pytest.mark.release
@pytest.mark.multiprocess(timeout=180.0)  # a whole flax job: minutes on a loaded 2-core machine
def test_a_healthy_training_job_raises_nothing_and_reports_nothing_different():
    import _flax_program as fp

    mesh = fp.make_mesh()
    state = fp.create_state(mesh)
    step = multihost.watch(fp.train_step, name='train_step')
    # One checkpoint directory for all (process 0's), as a job gets from its config.
    mine = tempfile.mkdtemp(prefix='mh-ckpt-') if jax.process_index() == 0 else ''
    directory = multihost.broadcast_one_to_all(np.frombuffer(mine.ljust(200).encode(), np.uint8))
    directory = bytes(directory).decode().strip()
    manager = fp.checkpoint_manager(directory, save_every=2)
    losses = []
    for i in range(4):
        state, loss = step(state, fp.global_batch(mesh, i))
        losses.append(float(loss))
        fp.save(manager, i, state)
        multihost.sync_global_devices(f'after-step-{i}', timeout=120)
    manager.wait_until_finished()
    manager.close()
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] + 0.5

    # The same state on every host: nothing differs, nothing is raised.
    multihost.assert_equal(state.params, 'params')
    diff = multihost.tree_diff(state)
    assert diff.ok, str(diff)
    same = multihost.broadcast_one_to_all({'step': state.step, 'params': state.params})
    assert int(same['step']) == 4
    gathered = multihost.process_allgather(state.params, tiled=True)
    embed = gathered['embed']['embedding']
    assert embed.shape == state.params['embed']['embedding'].shape

    # The checked step was recorded on every host, and the wavefront sees no one stuck
    # (asked from one host: its debug bus reaches every other host's).
    if jax.process_index() == 0:
        records = multihost.flight_records()
        assert sorted(records) == [0, 1, 2, 3]
        for pid, recs in records.items():
            assert sum(r.name == 'train_step' for r in recs) == 4, (pid, recs)
        front = multihost.wavefront()
        assert 'never launched' not in str(front), str(front)
        assert multihost.timeline().steps
    multihost.sync_global_devices('looked', timeout=120)
    if jax.process_index() == 0:
        shutil.rmtree(directory, ignore_errors=True)

    # The key survived: the typed dropout key is still a key array of the same impl.
    assert jax.dtypes.issubdtype(state.dropout_key.dtype, jax.dtypes.prng_key)
