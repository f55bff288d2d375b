"""A training program written the way flax, optax and orbax document one (test dependency only).

A small linen transformer whose kernels carry `nn.with_partitioning` names, on a
('data', 'model') mesh over every device; a `TrainState` holding a typed
dropout key; `optax.adamw`; a jitted step with `donate_argnums`; batches built
with `jax.make_array_from_process_local_data`; an orbax `CheckpointManager`.

Importable in the workers of the multi-process harness (``from _flax_program
import ...``) and in ipyparallel engines (the notebook tests put this folder
on their path). Nothing here knows about `multihost`: it is the user's code.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

VOCAB, SEQ, WIDTH, HEADS = 64, 8, 32, 4
LOCAL_BATCH = 4  # examples per host


class Block(nn.Module):
    width: int = WIDTH
    heads: int = HEADS

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))
        y = nn.LayerNorm()(x)
        y = nn.MultiHeadDotProductAttention(
            num_heads=self.heads, kernel_init=kernel, deterministic=not train
        )(y)
        x = x + nn.Dropout(0.1, deterministic=not train)(y)
        y = nn.LayerNorm()(x)
        y = nn.Dense(2 * self.width, kernel_init=kernel)(y)
        y = nn.gelu(y)
        out_kernel = nn.with_partitioning(nn.initializers.lecun_normal(), ('model', None))
        y = nn.Dense(self.width, kernel_init=out_kernel)(y)
        return x + nn.Dropout(0.1, deterministic=not train)(y)


class Transformer(nn.Module):
    layers: int = 1

    @nn.compact
    def __call__(self, tokens: jax.Array, *, train: bool = False) -> jax.Array:
        embed = nn.Embed(
            VOCAB,
            WIDTH,
            embedding_init=nn.with_partitioning(nn.initializers.normal(0.02), ('model', None)),
            name='embed',
        )
        x = embed(tokens)
        for i in range(self.layers):
            x = Block(name=f'block_{i}')(x, train=train)
        return embed.attend(nn.LayerNorm()(x))


class TrainState(train_state.TrainState):
    dropout_key: jax.Array


def make_mesh() -> Mesh:
    """('data', 'model'): one row per host, its local devices along 'model'."""
    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    return Mesh(devices, ('data', 'model'))


def create_state(mesh: Mesh, seed: int = 0, learning_rate: float = 1e-3) -> TrainState:
    """The sharded train state, initialized under jit with the partitioning the model names."""
    model = Transformer()
    tx = optax.adamw(learning_rate)
    tokens = jnp.zeros((LOCAL_BATCH, SEQ), jnp.int32)

    def init(rng: jax.Array) -> TrainState:
        params_key, dropout_key = jax.random.split(rng)
        variables = model.init(params_key, tokens)
        return TrainState.create(
            apply_fn=model.apply, params=variables['params'], tx=tx, dropout_key=dropout_key
        )

    abstract = jax.eval_shape(init, jax.random.key(seed))
    specs = nn.get_partition_spec(abstract)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    state = jax.jit(init, out_shardings=shardings)(jax.random.key(seed))
    return nn.unbox(state)


def local_batch(step: int, source: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """This host's slice of the global batch: tokens and next-token targets (``source``: the
    host whose data stream it draws; default its own)."""
    source = jax.process_index() if source is None else source
    rng = np.random.default_rng(1000 * step + source)
    seq = rng.integers(0, VOCAB, size=(LOCAL_BATCH, SEQ + 1), dtype=np.int32)
    return seq[:, :-1], seq[:, 1:]


def eval_batch() -> np.ndarray:
    """A small eval batch, the same on every host (`_flax_job`'s ``EVAL_X``): one NaN at
    [1, 2], for the data tools to find."""
    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 8
    x[1, 2] = np.nan
    return x


def global_batch(mesh: Mesh, step: int) -> dict[str, jax.Array]:
    """The global batch, sharded over 'data', from each host's local slice."""
    sharding = NamedSharding(mesh, P('data'))
    tokens, targets = local_batch(step)
    return {
        'tokens': jax.make_array_from_process_local_data(sharding, tokens),
        'targets': jax.make_array_from_process_local_data(sharding, targets),
    }


#: A faulty chip, simulated (``FAULTY_HOST=p`` in the environment; the tests' input): the
#: devices of process p add 1e-3 to one replicated bias's gradient after it was summed over
#: the hosts, in a host callback run on each device, so p's replicas of that bias drift from
#: the others' at every step (as a chip that computes wrong does). -1: every chip is sound.
FAULTY_HOST = int(os.environ.get('FAULTY_HOST', '-1'))


def faulty_chip(grads: Any) -> Any:
    """``grads`` as the chips of `FAULTY_HOST` compute them (unchanged when it is -1)."""
    if FAULTY_HOST < 0:
        return grads
    wrong = np.float32(1e-3 if jax.process_index() == FAULTY_HOST else 0.0)

    def on_device(x: jax.Array) -> jax.Array:
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(lambda v: v + wrong, shape, x)  # the chip's wrong sum

    mesh = make_mesh()
    per_device = jax.shard_map(on_device, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    return jax.tree_util.tree_map_with_path(
        lambda path, g: (
            per_device(g) if jax.tree_util.keystr(path) == "['block_0']['Dense_0']['bias']" else g
        ),
        grads,
    )


@functools.partial(jax.jit, donate_argnums=0)
def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
    """One adamw step on the cross-entropy; the dropout key is folded with the step."""
    dropout_key = jax.random.fold_in(state.dropout_key, state.step)

    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn(
            {'params': params}, batch['tokens'], train=True, rngs={'dropout': dropout_key}
        )
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
        if 'weights' in batch:  # per-example weights, when the batch carries them
            losses = losses * batch['weights'][:, None]
        return losses.mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=faulty_chip(grads)), loss


def checkpoint_manager(directory: str, save_every: int = 3) -> Any:
    """An orbax `CheckpointManager` as its docs build one (every process calls it)."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, max_to_keep=2)
    return ocp.CheckpointManager(directory, options=options)


def save(manager: Any, step: int, state: TrainState) -> bool:
    import orbax.checkpoint as ocp

    return bool(manager.save(step, args=ocp.args.StandardSave(state)))
