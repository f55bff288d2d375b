"""A gathered pytree whose classes were defined in an engine cell reaches the notebook.

An engine's cell runs in its ``__main__``; the notebook's ``__main__`` is
another one, so it cannot unpickle such a class (ipyparallel then drops the
reply: the gather waited its whole timeout). The skeleton the hosts ship
holds a `multihost.engine.CellObject` instead. Here two real interpreters:
one plays the engine (the classes in its ``__main__``), the other the
notebook, which unpickles and fills the skeleton as `mhnotebook` does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

ENGINE = textwrap.dedent(
    """
    import pickle, sys
    import flax.struct, jax, jax.numpy as jnp, optax
    from flax.training import train_state
    from multihost.engine import gather

    class TrainState(train_state.TrainState):
        dropout_key: jax.Array

    @flax.struct.dataclass
    class Stats:
        count: int = flax.struct.field(pytree_node=False)   # static, an int
        mean: jax.Array = None

    def apply_fn(*a):
        return a

    state = TrainState.create(apply_fn=apply_fn, params={'w': jnp.ones(3)},
                              tx=optax.adamw(1e-3), dropout_key=jax.random.key(0))
    value = {'state': state, 'stats': Stats(count=7, mean=jnp.zeros(2))}
    leaves, skeleton, paths = gather._flatten(value)
    sys.stdout.buffer.write(pickle.dumps((skeleton, paths)))
    """
)

NOTEBOOK = textwrap.dedent(
    """
    import pickle, sys
    import jax
    skeleton, paths = pickle.loads(sys.stdin.buffer.read())
    filled = jax.tree.map(lambda i: f'leaf{i}', skeleton)
    state, stats = filled['state'], filled['stats']
    print(type(state).__name__, state._mh_type, state.params, state.dropout_key, sep='|')
    print(repr(state.apply_fn)[:60], repr(state.tx)[:30], sep='|')
    n = len(jax.tree.leaves(filled))
    print(stats._mh_type, stats.count, stats.mean, n, len(paths), sep='|')
    """
)


def test_a_pytree_of_cell_classes_reaches_the_notebook_as_cell_objects():
    engine = subprocess.run(
        [sys.executable, '-c', ENGINE], capture_output=True, timeout=120, check=True
    )
    notebook = subprocess.run(
        [sys.executable, '-c', NOTEBOOK],
        input=engine.stdout,
        capture_output=True,
        timeout=120,
    )
    assert notebook.returncode == 0, notebook.stderr.decode()
    lines = notebook.stdout.decode().splitlines()
    # The TrainState's fields as attributes, its leaves filled in, the key among them.
    kind, name, params, key = lines[0].split('|')
    assert (kind, name) == ('CellObject', 'TrainState'), lines
    assert params.startswith("{'w': 'leaf") and key.startswith('leaf'), lines
    # Static fields: a cell function is not shipped (named by its repr), optax's tx neither.
    fn, tx = lines[1].split('|')
    assert fn.startswith('<not shipped from the hosts: <function apply_fn'), lines
    assert tx.startswith('<not shipped from the hosts: '), lines
    # A static int field stays static (not mistaken for a leaf placeholder).
    stats, count, mean, n_leaves, n_paths = lines[2].split('|')
    assert (stats, count) == ('Stats', '7') and mean.startswith('leaf'), lines
    assert n_leaves == n_paths, lines
