"""A small data-parallel training job with a data bug, as a scheduler starts it (tutorial 07).

Nothing of `multihost` is imported. Each process reads ``COORDINATOR_ADDRESS``,
``NUM_PROCESSES`` and ``PROCESS_ID``, builds a mesh over every process's devices, keeps the
parameters replicated on it and shards each step's batch over the processes (built with
`jax.make_array_from_process_local_data`, each host from its own data stream). The jitted
step spans processes: its gradient is averaged by XLA across hosts.

The knob: ``DUP_HOST=p`` makes process p read process p-1's data stream from step
``DUP_STEP`` on (a sharding bug in a data loader: two hosts feed the same examples). The loss
still goes down; under ``multihost run --audit`` every host says so the step it begins.
"""

import os

import jax

jax.config.update('jax_platforms', 'cpu')
jax.distributed.initialize(
    coordinator_address=os.environ['COORDINATOR_ADDRESS'],
    num_processes=int(os.environ['NUM_PROCESSES']),
    process_id=int(os.environ['PROCESS_ID']),
)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

STEPS = int(os.environ.get('STEPS', '8'))
DUP_HOST = int(os.environ.get('DUP_HOST', '-1'))
DUP_STEP = int(os.environ.get('DUP_STEP', '3'))
LOCAL_BATCH = 64


def local_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """This host's examples of the step: y = 3 x + 1, plus noise."""
    me = jax.process_index()
    stream = me - 1 if me == DUP_HOST and step >= DUP_STEP else me  # the bug
    rng = np.random.default_rng(1000 * step + stream)
    x = rng.normal(size=(LOCAL_BATCH, 4)).astype(np.float32)
    y = x @ np.array([3.0, -1.0, 0.5, 2.0], np.float32) + 1.0
    return x, y


@jax.jit
def train_step(params, batch):
    def loss(p):
        return jnp.mean((batch['x'] @ p['w'] + p['b'] - batch['y']) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, value


def main() -> None:
    mesh = Mesh(np.array(jax.devices()), ('data',))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
    params = jax.device_put({'w': jnp.zeros(4), 'b': jnp.zeros(())}, replicated)
    for step in range(STEPS):
        x, y = local_batch(step)
        batch = {
            'x': jax.make_array_from_process_local_data(sharded, x),
            'y': jax.make_array_from_process_local_data(sharded, y),
        }
        params, value = train_step(params, batch)
        if jax.process_index() == 0:
            print(f'step {step}: loss {float(value):.4f}', flush=True)


if __name__ == '__main__':
    main()
