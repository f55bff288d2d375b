"""An unmodified flax + optax + orbax training job, launched like a scheduler launches one.

Nothing here imports `multihost`. Every process reads what a scheduler sets:
``COORDINATOR_ADDRESS``, ``NUM_PROCESSES``, ``PROCESS_ID`` (for
`jax.distributed.initialize`), ``CKPT_DIR`` (one directory for every process),
``STEPS`` (default 6). The program is `_flax_program`'s (a linen transformer
with `nn.with_partitioning`, a ('data', 'model') mesh over every process, a
`TrainState`, `optax.adamw`, a jitted `train_step` with ``donate_argnums``,
batches from `jax.make_array_from_process_local_data`) with an orbax
`CheckpointManager` saving every 2 steps, async checkpointing on (orbax's
default). Each step prints ``LOSS <step> <float.hex>`` and ``STEP <step>
<seconds>`` (wall time of the step, blocked until the loss is ready).

Two inputs a real job also reads from its environment:

* ``BAD_BATCH_HOST=p``: process p's local batch has one example more (a data
  pipeline bug: that host's global batch, and so its program, differ).
* ``STALL_HOST=p`` with ``STALL_UNTIL=PATH``: process p stalls before its first
  orbax save (a slow disk, a stuck data loader) in ``time.sleep`` until PATH
  exists (at most 300 s); the others wait for it in orbax's barrier. With
  ``STALL_BEFORE_STEP=s`` it stalls so just before step s's ``train_step`` instead: the
  others wait inside that launch, in its device collective.
  ``SPIN_HOST=q`` stalls process q at the same place, busy: it computes in Python (half
  of each 0.1 s: a slow preprocessing step, a checkpoint read) until STALL_UNTIL exists.
* ``GIL_HOST=p`` with ``GIL_S=s``: process p, before its first orbax save, sleeps s
  seconds in a C call that keeps the GIL (libc's ``sleep`` through ``ctypes.PyDLL``, as a
  C extension stuck in a long call does): no Python thread of it runs meanwhile.
  A host that stalls so first creates ``STALL_UNTIL.stalled-<p>`` (tests wait for it).
* ``RAISE_HOST=p`` with ``RAISE_STEP=s``: process p raises ``ValueError('bad batch')`` in
  user code just before step s's ``train_step`` (uncaught: the job's own handler below
  reports only the errors of its collectives, an ``AuditError`` of ``--audit-raise`` is
  uncaught too; ``RAISE_BEFORE_BATCH=1``: before building step s's batch, its ``batch``
  still step s-1's); ``EXIT_HOST=p``: process p calls
  ``sys.exit(3)`` there instead (``EXIT_CODE=c``: ``sys.exit(c)``).
* ``DISK_FAIL_HOST=p``: process p's disk fails at its first checkpoint write: orbax's
  save raises ``OSError(28, 'No space left on device')`` inside ``manager.save``
  (uncaught, as a real job's disk error is), after the others passed the save's first
  barrier with it.
* Data bugs the audit finds (``multihost run --audit``): ``DUP_HOSTS=p,q``: process q
  draws process p's batch (two hosts feeding the same data; from step ``DUP_FROM_STEP``,
  default 0, on: a data stream that went wrong mid-run); ``DRIFT_HOST=p`` with
  ``DRIFT_STEP=s``: after step s, process p's copy of one replicated parameter
  (``params['block_0']['Dense_0']['bias']``) is moved by 1e-3 (a host-dependent code
  path); ``NAN_HOST=p`` with ``NAN_STEP=s``: process p's per-example loss weights hold a
  NaN at step s (the batch then carries ``weights``, all ones otherwise).
* ``EVAL_X=1``: ``train`` also holds ``eval_x``, a replicated float32 eval batch (8, 4)
  made before the loop (ready on every device; one NaN at [1, 2], for the data tools).
* ``LEAVE=return``: a job that succeeds ends as most do, returning from its main (its
  ``atexit`` handlers run), not with ``os._exit``. ``LEAVE=shutdown``: as JAX's docs show,
  right after its last step (no report, no final barrier): ``jax.distributed.shutdown()``,
  then it returns. ``SAVE=0``: no orbax checkpoints (a flax + optax job alone: nothing
  between its last step and its end). ``LOG_EVERY=k``: the loss is read (and ``STEP`` /
  ``LOSS`` printed) at every k-th step only, as a job that logs now and then: its last
  step may still be running on the devices when the program goes on.
* ``HEARTBEAT_S=s``: ``heartbeat_timeout_seconds`` of `jax.distributed.initialize`
  (default 100, JAX's): how long the coordination service waits for a silent host.
* ``JOB_RECORDS=DIR``: the report the tests read. When set, and only if
  `multihost` was loaded into this process by someone else (``python -m
  multihost run``: the script never imports it), each process writes its own
  flight records to ``DIR/records-<p>.json`` before the final barrier. It is
  written by the program's last lines, not at exit: the job leaves with
  ``os._exit`` (below), which runs no ``atexit`` hook.

A failing step prints ``FAILED <exception type>: <its first line>``. Every
process ends with a barrier and ``os._exit``: process 0 hosts the coordination
service, and when it exits JAX kills the others within milliseconds, before
they print; so process 0 leaves last and nobody runs JAX's exit-time shutdown.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax

jax.config.update('jax_num_cpu_devices', int(os.environ.get('LOCAL_DEVICES', '2')))

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from _flax_program import (  # noqa: E402
    create_state,
    eval_batch,
    local_batch,
    make_mesh,
    train_step,
)
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

PROCESS_ID = int(os.environ['PROCESS_ID'])
NUM_PROCESSES = int(os.environ['NUM_PROCESSES'])
STEPS = int(os.environ.get('STEPS', '6'))
BAD_BATCH_HOST = int(os.environ.get('BAD_BATCH_HOST', '-1'))
STALL_HOST = int(os.environ.get('STALL_HOST', '-1'))
RAISE_HOST = int(os.environ.get('RAISE_HOST', '-1'))
EXIT_HOST = int(os.environ.get('EXIT_HOST', '-1'))
EXIT_CODE = int(os.environ.get('EXIT_CODE', '3'))
RAISE_STEP = int(os.environ.get('RAISE_STEP', '2'))
RAISE_BEFORE_BATCH = bool(os.environ.get('RAISE_BEFORE_BATCH'))
DUP_HOSTS = [int(p) for p in os.environ.get('DUP_HOSTS', '').split(',') if p]
DUP_FROM_STEP = int(os.environ.get('DUP_FROM_STEP', '0'))
DRIFT_HOST = int(os.environ.get('DRIFT_HOST', '-1'))
DRIFT_STEP = int(os.environ.get('DRIFT_STEP', '-1'))
NAN_HOST = int(os.environ.get('NAN_HOST', '-1'))
NAN_STEP = int(os.environ.get('NAN_STEP', '-1'))
LOG_EVERY = int(os.environ.get('LOG_EVERY', '1'))


class BadBatch(ValueError):
    """What a data pipeline raises on a broken batch (``RAISE_HOST``)."""


def check_batch(step):
    if step == RAISE_STEP and jax.process_index() == RAISE_HOST:
        raise BadBatch('bad batch')
    if step == RAISE_STEP and jax.process_index() == EXIT_HOST:
        sys.exit(EXIT_CODE)


STALL_BEFORE_STEP = int(os.environ.get('STALL_BEFORE_STEP', '-1'))
SPIN_HOST = int(os.environ.get('SPIN_HOST', '-1'))
GIL_HOST = int(os.environ.get('GIL_HOST', '-1'))
DISK_FAIL_HOST = int(os.environ.get('DISK_FAIL_HOST', '-1'))


def break_the_disk():
    """Process DISK_FAIL_HOST's checkpoint writes fail as on a full disk (fault injection:
    orbax's own save raises where its write would)."""
    if jax.process_index() != DISK_FAIL_HOST:
        return

    async def async_save(self, *args, **kwargs):
        raise OSError(28, 'No space left on device')

    ocp.StandardCheckpointHandler.async_save = async_save


def stall(step, before_step=False):
    """Process STALL_HOST sleeps (SPIN_HOST computes) before its first save (or before step
    STALL_BEFORE_STEP's launch) until STALL_UNTIL exists (bounded); GIL_HOST holds the GIL."""
    if (before_step and step != STALL_BEFORE_STEP) or (
        not before_step and (step != 0 or STALL_BEFORE_STEP >= 0)
    ):
        return
    me = jax.process_index()
    if me in (STALL_HOST, SPIN_HOST, GIL_HOST) and os.environ.get('STALL_UNTIL'):
        open(f'{os.environ["STALL_UNTIL"]}.stalled-{me}', 'w').close()  # for the tests
    if me == GIL_HOST and not before_step:
        import ctypes

        print('holding the GIL', flush=True)
        ctypes.PyDLL(None).sleep(int(os.environ['GIL_S']))  # the GIL stays held
        return
    if me not in (STALL_HOST, SPIN_HOST):
        return
    deadline = time.monotonic() + 300.0
    while not os.path.exists(os.environ['STALL_UNTIL']) and time.monotonic() < deadline:
        if me == SPIN_HOST:
            busy_until = time.perf_counter() + 0.05
            while time.perf_counter() < busy_until:
                sum(i * i for i in range(1000))
            time.sleep(0.05)
        else:
            time.sleep(0.1)


def batch_for(mesh, step):
    """The global batch, sharded over 'data', from this host's slice."""
    sharding = NamedSharding(mesh, P('data'))
    me = jax.process_index()
    dup = me in DUP_HOSTS[1:] and step >= DUP_FROM_STEP
    tokens, targets = local_batch(step, DUP_HOSTS[0] if dup else me)
    if me == BAD_BATCH_HOST:
        tokens, targets = (
            np.concatenate([tokens, tokens[:1]]),
            np.concatenate([targets, targets[:1]]),
        )
    batch = {
        'tokens': jax.make_array_from_process_local_data(sharding, tokens),
        'targets': jax.make_array_from_process_local_data(sharding, targets),
    }
    if NAN_HOST >= 0:
        weights = np.ones(len(tokens), np.float32)
        if me == NAN_HOST and step == NAN_STEP:
            weights[1] = np.nan
        batch['weights'] = jax.make_array_from_process_local_data(sharding, weights)
    return batch


def drift(state, step):
    """Process DRIFT_HOST moves its own copy of one replicated parameter after DRIFT_STEP."""
    if step != DRIFT_STEP:
        return state
    bias = state.params['block_0']['Dense_0']['bias']
    delta = np.float32(1e-3 if jax.process_index() == DRIFT_HOST else 0.0)

    def key(index):
        return tuple((s.start, s.stop) for s in index)

    local = {key(s.index): np.asarray(s.data) + delta for s in bias.addressable_shards}
    moved = jax.make_array_from_callback(bias.shape, bias.sharding, lambda index: local[key(index)])
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            moved if jax.tree_util.keystr(path) == "['block_0']['Dense_0']['bias']" else x
        ),
        state.params,
    )
    return state.replace(params=params)


def train():
    break_the_disk()
    mesh = make_mesh()
    state = create_state(mesh)
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=2, max_to_keep=2, enable_async_checkpointing=True
    )
    save = os.environ.get('SAVE', '1') != '0'
    manager = ocp.CheckpointManager(os.environ['CKPT_DIR'], options=options) if save else None
    if os.environ.get('EVAL_X'):
        eval_x = jax.device_put(eval_batch(), NamedSharding(mesh, P()))  # noqa: F841 (for tools)
    for step in range(STEPS):
        if RAISE_BEFORE_BATCH:
            check_batch(step)
        batch = batch_for(mesh, step)
        if not RAISE_BEFORE_BATCH:
            check_batch(step)
        stall(step, before_step=True)
        t0 = time.perf_counter()
        state, loss = train_step(state, batch)
        if step % LOG_EVERY == 0:
            loss = float(loss)
            print(f'STEP {step} {time.perf_counter() - t0!r}', flush=True)
            print(f'LOSS {step} {loss.hex()}', flush=True)
        state = drift(state, step)
        stall(step)
        if manager is not None:
            manager.save(step, args=ocp.args.StandardSave(state))
    if manager is not None:
        manager.wait_until_finished()
        manager.close()


def report():
    """This process's flight records, when asked for and `multihost` is in the process."""
    directory = os.environ.get('JOB_RECORDS')
    recorder = sys.modules.get('multihost._recorder')
    if not directory or recorder is None:
        return
    records = [json.loads(r.to_json()) for r in recorder.snapshot(jax.process_index())]
    with open(os.path.join(directory, f'records-{jax.process_index()}.json'), 'w') as f:
        json.dump(records, f)
    audit = sys.modules.get('multihost._job._audit')
    if audit is not None and audit.enabled():
        with open(os.path.join(directory, f'audit-{jax.process_index()}.json'), 'w') as f:
            json.dump(audit.report(wait=30.0).to_json(), f)  # its last launches shared


def leave(status):
    sys.stdout.flush()
    sys.stderr.flush()
    if jax.process_index() == 0:
        time.sleep(1.0 if status == 0 else 5.0)
    if os.environ.get('LEAVE') == 'return' and status == 0:
        return  # as most jobs end: the interpreter's exit (its atexit handlers run)
    os._exit(status)


def main():
    jax.distributed.initialize(
        coordinator_address=os.environ['COORDINATOR_ADDRESS'],
        num_processes=NUM_PROCESSES,
        process_id=PROCESS_ID,
        initialization_timeout=120,
        heartbeat_timeout_seconds=int(os.environ.get('HEARTBEAT_S', '100')),
    )
    try:
        train()
    except (BadBatch, OSError):
        raise  # uncaught, as a real job's data or disk error is
    except RuntimeError as exc:
        if type(exc).__name__ == 'AuditError':  # --audit-raise's: uncaught, as a user's job
            raise
        print(f'FAILED {type(exc).__name__}: {str(exc).splitlines()[0]}', flush=True)
        leave(1)
    except Exception as exc:
        print(f'FAILED {type(exc).__name__}: {str(exc).splitlines()[0]}', flush=True)
        leave(1)
    if os.environ.get('LEAVE') == 'shutdown':
        print('DONE', flush=True)
        jax.distributed.shutdown()
        return
    report()
    multihost_utils.sync_global_devices('flax_job_end')
    print('DONE', flush=True)
    leave(0)


if __name__ == '__main__':
    main()
