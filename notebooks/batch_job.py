"""A small multi-host training job, as a scheduler starts it (tutorial 07_batch_job).

Nothing of `multihost` is imported: the job is run under ``python -m
multihost run`` like any other script. Each process reads, as on a real
cluster, ``COORDINATOR_ADDRESS``, ``NUM_PROCESSES`` and ``PROCESS_ID`` from
its environment. It fits a line to its own shard of the data with
`jax.grad`, averages the gradients over the processes
(`multihost_utils.process_allgather`) and, every ``CKPT_EVERY`` steps, lines
all hosts up before "saving" (`multihost_utils.sync_global_devices`).

The knobs: ``STALL_HOST=2`` makes process 2 stall before its first
checkpoint (a slow file system, a stuck data loader...) for ``STALL_S``
seconds, so the other hosts wait for it in the checkpoint barrier
(tutorial 07). ``NAN_HOST=2`` puts a NaN into process 2's data at step
``NAN_STEP`` (a corrupt record); the job's own NaN guard then raises on
that host (tutorial 08).
"""

import os
import time

import jax

jax.config.update('jax_platforms', 'cpu')
jax.distributed.initialize(
    coordinator_address=os.environ['COORDINATOR_ADDRESS'],
    num_processes=int(os.environ['NUM_PROCESSES']),
    process_id=int(os.environ['PROCESS_ID']),
)

import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

STEPS = int(os.environ.get('STEPS', '20'))
CKPT_EVERY = int(os.environ.get('CKPT_EVERY', '5'))
STALL_HOST = int(os.environ.get('STALL_HOST', '-1'))
STALL_S = float(os.environ.get('STALL_S', '600'))
NAN_HOST = int(os.environ.get('NAN_HOST', '-1'))
NAN_STEP = int(os.environ.get('NAN_STEP', '3'))


def load_shard(process: int) -> tuple[jax.Array, jax.Array]:
    """This host's slice of the data: y = 3 x + 1, plus noise."""
    key = jax.random.key(process)
    x = jax.random.normal(key, (256,))
    y = 3.0 * x + 1.0 + 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (256,))
    return x, y


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((params['w'] * x + params['b'] - y) ** 2)


grad_fn = jax.jit(jax.value_and_grad(loss))


def save_checkpoint(step: int, params: dict[str, jax.Array]) -> None:
    if step == CKPT_EVERY and jax.process_index() == STALL_HOST:
        time.sleep(STALL_S)  # the stall: this host is late to the checkpoint
    multihost_utils.sync_global_devices(f'checkpoint {step}')
    if jax.process_index() == 0:
        print(f'step {step}: checkpoint, w={float(params["w"]):.3f}', flush=True)


def main() -> None:
    x, y = load_shard(jax.process_index())
    params = {'w': jnp.zeros(()), 'b': jnp.zeros(())}
    for step in range(1, STEPS + 1):
        if step == NAN_STEP and jax.process_index() == NAN_HOST:
            x = x.at[7].set(jnp.nan)  # a corrupt record in this host's data
        value, grads = grad_fn(params, x, y)
        if not jnp.isfinite(value):  # the job's NaN guard
            raise FloatingPointError(f'loss is {float(value)} at step {step}')
        grads = jax.tree.map(lambda g: multihost_utils.process_allgather(g).mean(), grads)
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        if step % CKPT_EVERY == 0:
            save_checkpoint(step, params)
    if jax.process_index() == 0:
        print(f'done: loss {float(value):.4f}', flush=True)


if __name__ == '__main__':
    main()
