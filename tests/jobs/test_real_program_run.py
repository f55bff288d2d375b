"""An unmodified flax + optax + orbax job under ``python -m multihost run`` (issue 19, item 6).

`_flax_job.py` imports nothing of `multihost`. It is launched here the way a
scheduler launches a job: plain processes (`subprocess.Popen`), the
coordinator address, process count and index in environment variables,
`jax.distributed.initialize` in the script. Once as ``python _flax_job.py``,
once as ``python -m multihost run _flax_job.py``, and once with ``--check-jit``
and one host feeding a batch of another shape.

Two processes x 1 CPU device, not four: one run of four takes ~50 s on this
2-core machine (each process compiles the step and writes checkpoints), so
three runs would not fit the ~120 s budget; two take ~22 s each. Every wait
is bounded; every process is killed if anything fails.
"""

from __future__ import annotations

import json
import os
from typing import Any

import _jobs
import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, '_flax_job.py')
N = 2
TIMEOUT = 150.0

pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)

# Fields of a FlightRecord as `to_json` writes them (dataclasses.astuple order).
KIND, NAME, CALL, SITE, STATE, THREAD, SPANS = 1, 2, 3, 7, 10, 13, 15


def _step_line() -> int:
    """The line of `_flax_job.py` that calls the jitted step (the launch's site)."""
    with open(JOB) as f:
        hits = [i + 1 for i, line in enumerate(f) if 'train_step(state, batch)' in line]
    assert len(hits) == 1, hits
    return hits[0]


def launch(tmp: str, *command: str, **extra: str) -> list[dict[str, Any]]:
    """The job in `N` plain processes: per process its return code, stdout, stderr, records."""
    ckpt, records = os.path.join(tmp, 'ckpt'), os.path.join(tmp, 'records')
    os.makedirs(records)
    env = _jobs.scheduler_env(
        N, CKPT_DIR=ckpt, JOB_RECORDS=records, STEPS='6', LOCAL_DEVICES='1', **extra
    )
    with _jobs.start(N, [*command, JOB], env, cwd=tmp) as job:
        outs = []
        for pid, (rc, stdout, stderr) in enumerate(job.finish(TIMEOUT)):
            path = os.path.join(records, f'records-{pid}.json')
            recs = None
            if os.path.exists(path):
                with open(path) as f:
                    recs = json.load(f)
            outs.append({'rc': rc, 'out': stdout, 'err': stderr, 'records': recs})
        return outs


def _losses(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith('LOSS ')]


@pytest.fixture(scope='module')
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The job uninstalled and under ``python -m multihost run`` (each ~22 s)."""
    plain = launch(str(tmp_path_factory.mktemp('plain')))
    installed = launch(str(tmp_path_factory.mktemp('run')), '-m', 'multihost', 'run')
    for out in plain + installed:
        assert out['rc'] == 0 and 'DONE' in out['out'], out['err'][-3000:]
    return {'plain': plain, 'installed': installed}


@pytest.mark.release
def test_the_losses_are_bitwise_those_of_the_uninstalled_run(runs):
    plain = [_losses(o['out']) for o in runs['plain']]
    installed = [_losses(o['out']) for o in runs['installed']]
    assert all(len(lo) == 6 for lo in plain), plain
    assert installed == plain  # float.hex: every bit of every step's loss, on every host
    assert len({tuple(lo) for lo in plain}) == 1  # the replicated loss is the same everywhere
    # Uninstalled, multihost was never in the process: nothing was recorded.
    assert all(o['records'] is None for o in runs['plain'])


@pytest.mark.release
def test_every_host_records_its_train_steps_and_orbaxs_barriers_by_name_and_site(runs):
    line = _step_line()
    main_barriers = []
    for out in runs['installed']:
        recs = out['records']
        assert recs, out['err'][-3000:]
        steps = [r for r in recs if r[KIND] == 'launch' and r[NAME] == 'train_step']
        assert [r[CALL] for r in steps] == list(range(6)), steps
        for r in steps:
            assert r[SITE] == f'_flax_job.py:{line}' or r[SITE].endswith(
                f'{os.sep}_flax_job.py:{line}'
            ), r[SITE]
            assert r[THREAD] == ''  # the main thread
            assert r[SPANS] is True  # the ('data', 'model') mesh spans both processes
        # orbax's main-thread barriers: `sync_global_devices` through orbax's own helper.
        barriers = [r for r in recs if r[KIND] == 'barrier']
        names = [r[NAME] for r in barriers]
        for expected in (
            'CheckpointManager:create_directory',
            'CheckpointManager:save_start',
            '_Checkpointer:save_start',
        ):
            assert expected in names, names
        assert names.count('CheckpointManager:save_start') == 3  # steps 0, 2, 4
        for r in barriers:
            assert 'orbax' in r[SITE] and r[STATE] == 'passed', r
            assert r[THREAD] == ''
        main_barriers.append(names)
        # orbax's background threads: service barriers on its own client, by id and site.
        service = [r for r in recs if r[KIND] == 'service_barrier']
        async_done = [r for r in service if r[NAME].startswith('_async_write_complete.')]
        assert sorted(r[NAME] for r in async_done) == [
            f'_async_write_complete.{s}' for s in (0, 2, 4)
        ], service
        for r in async_done:
            assert 'orbax' in r[SITE] and r[THREAD] != '' and r[STATE] == 'passed', r
        waits = [r for r in recs if r[KIND] == 'service_wait']
        assert waits and all('orbax' in r[SITE] for r in waits), waits
    assert all(names == main_barriers[0] for names in main_barriers)  # same order on every host


# Release rotation; covered on every landing by another batch shape caught before launch:
# test_install_jit
@pytest.mark.release
def test_check_jit_a_host_with_another_batch_shape_fails_every_host_before_launch(tmp_path):
    outs = launch(str(tmp_path), '-m', 'multihost', 'run', '--check-jit', BAD_BATCH_HOST=str(N - 1))
    for pid, out in enumerate(outs):
        failed = [line for line in out['out'].splitlines() if line.startswith('FAILED ')]
        assert failed, (pid, out['out'], out['err'][-3000:])
        assert failed[0].startswith('FAILED CollectiveMismatchError: '), failed
        assert 'train_step' in failed[0] and 'before launch' in failed[0], failed
        assert f'process {N - 1}' in failed[0], failed
        assert out['rc'] != 0
        assert _losses(out['out']) == []  # no step ran anywhere
