"""The pending launch's collective table, as a dump makes it (`_launchtable`), in this
process's 4 CPU devices: from the signature kept when the function compiled, and a note
with a note when the function holds several programs and the call had returned."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import source_line
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from multihost import _recorder
from multihost._job import _jit, _launchtable
from multihost._job._options import InstallOptions


def _norm(x: jax.Array) -> jax.Array:
    return x / jnp.sum(x)  # launchtable: the sum over the devices


@pytest.fixture
def installed() -> Iterator[None]:
    _jit.patch(InstallOptions())
    try:
        yield
    finally:
        _jit.unpatch()


def _sharded(n: int) -> jax.Array:
    mesh = Mesh(np.array(jax.devices()), ('d',))
    return jax.device_put(jnp.arange(n, dtype=jnp.float32), NamedSharding(mesh, P('d')))


def test_a_returned_launch_s_table_comes_from_its_compiled_signature(installed: None) -> None:
    step = jax.jit(_norm)
    assert isinstance(step, _jit.Jitted)
    step(_sharded(16)).block_until_ready()
    step(_sharded(16)).block_until_ready()  # no compile: the signature kept is the first's
    entry = _recorder.snapshot(0)[-1]  # the record a dump's front shows pending
    assert entry.label == '_norm call #1' and not _launchtable.IN_FLIGHT
    table = _launchtable.table_of(entry)
    assert table is not None and table.num_devices == len(jax.devices())
    assert [(op.kind, op.axes, op.shape) for op in table.ops] == [('all-reduce', ('d',), 'f32[]')]
    line = source_line(_norm, 'return x / jnp.sum(x)')
    assert table.ops[0].site == f'{__file__}:{line} in _norm'
    assert _launchtable.table_of(entry) is table  # made once per executable
    dumped = _launchtable.for_dump(entry)
    assert list(dumped) == ['_norm call #1'] and dumped['_norm call #1']['ops'][0]['axes'] == ['d']
    # another shape compiles a second program with the same collectives: which one a
    # returned call ran is not known, and does not matter
    step(_sharded(32)).block_until_ready()
    same = _launchtable.table_of(_recorder.snapshot(0)[-1])
    assert same is not None and [op.kind for op in same.ops] == ['all-reduce'], same
    assert same.notes[-1] == (
        '2 programs compiled for _norm, with the same cross-host collectives: which one this '
        'call ran does not change them'
    )


def test_uncommitted_arguments_follow_the_sharded_ones(installed: None) -> None:
    """``jnp.ones`` is not committed to its device: lowered again next to an array over every
    device it must not be pinned to device 0 (JAX would refuse the devices)."""

    def scale(w: jax.Array, x: jax.Array) -> jax.Array:
        return w * jnp.sum(x)

    step = jax.jit(scale)
    step(jnp.ones(4), _sharded(16)).block_until_ready()
    table = _launchtable.table_of(_recorder.snapshot(0)[-1])
    assert table is not None and [op.kind for op in table.ops] == ['all-reduce'], table
