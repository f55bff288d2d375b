"""The collective table of a program compiled on 4 real JAX processes x 2 CPU devices.

Each process compiles the same jitted step over a ('host', 'dev') mesh and reads its table:
the groups map to the processes that hold their devices, the axes are named, and the line is
this file's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _helpers import host_mesh, source_line
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from multihost._debug._colltable import table_for
from multihost._models._colltable import CollectiveTable

MP_CLUSTER = dict(n=4, devices_per_process=2)


def _step(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    over_hosts = jnp.sum(x, axis=0)  # table: the host-axis sum
    over_devs = jnp.sum(x, axis=1)  # table: the dev-axis sum
    return over_hosts, over_devs


def tables() -> tuple[str, str, bool, list[list[int]]]:
    """This process's table of `_step` (as JSON), its words, whether a second ask is the
    same object (made once per executable), and the device ids of each mesh column."""
    mesh = host_mesh()
    s = NamedSharding(mesh, P('host', 'dev'))
    x = jax.make_array_from_callback((8, 64), s, lambda i: np.ones((8, 64), np.float32)[i])
    compiled = jax.jit(_step).lower(x).compile()
    table = table_for(compiled)
    jax.block_until_ready(compiled(x))
    columns = [[d.id for d in col] for col in mesh.devices.T]
    return table.to_json(), str(table), table_for(compiled) is table, columns


def test_groups_map_to_processes_axes_and_this_files_line(mp_cluster):
    results = mp_cluster.run(tables)
    assert len(results) == 4
    first = CollectiveTable.from_json(results[0][0])
    assert all(r[0] == results[0][0] for r in results), 'the hosts read different tables'
    assert all(r[2] for r in results), 'the table was made twice for one executable'
    assert first.processes == (0, 1, 2, 3) and first.num_devices == 8
    assert first.mesh_axes == (('host', 4), ('dev', 2))
    by_axis = {op.axes: op for op in first.ops}
    hosts, devs = by_axis[('host',)], by_axis[('dev',)]
    # the host axis: one device of every process per group; the dev axis: inside each process
    assert hosts.process_groups == ((0, 1, 2, 3),) and hosts.cross_process
    assert devs.process_groups == ((0,), (1,), (2,), (3,)) and not devs.cross_process
    assert first.cross_process() == (hosts,)
    assert first.first_holding([3]) is hosts
    assert sorted(map(list, hosts.groups)) == sorted(results[0][3])  # the mesh's columns
    line = source_line(_step, 'over_hosts =')
    assert hosts.site == f'{__file__}:{line} in _step', hosts.frames
    assert hosts.kind == 'all-reduce' and hosts.shape == 'f32[32]', hosts  # per device
    assert hosts.library_site == ''  # the harness that called _step is outside it
    assert (
        f"all-reduce of {hosts.shape} over mesh axis 'host' (processes 0-3), "
        f'from test_colltable_multiprocess.py:{line} in _step'
    ) in results[0][1]
