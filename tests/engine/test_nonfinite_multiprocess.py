"""nonfinite on 4 real processes x 2 devices: NaN and Inf named by host, device, index."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import flat_mesh, host_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


def _global(shape, spec, mesh, poison=None):
    """A global array of ``arange`` values; ``poison(index, block)`` may write into a block."""
    full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)

    def block(index):
        out = full[index].copy()
        if poison is not None:
            poison(index, out)
        return out

    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), block)


@multiprocess
def test_a_nan_in_one_shard_on_host_2_is_named_with_its_host_device_and_index():
    mesh = host_mesh()
    pid = jax.process_index()
    # (16, 8) over ('host', 'dev'): host p holds rows 4p:4p+4, device j columns 4j:4j+4.
    target = ((8, 12), (4, 8))  # host 2's second device

    def poison(index, out):
        if pid == 2 and tuple((s.start, s.stop) for s in index) == target:
            out[1, 2] = np.nan  # global (9, 6)
            out[3, 3] = np.nan

    x = _global((16, 8), P('host', 'dev'), mesh, poison)
    tree = {'params': {'w': x, 'b': jnp.zeros(3)}, 'step': np.int32(7)}
    report = multihost.nonfinite(tree, timeout=60)

    assert not report.ok
    assert len(report.shards) == 1, report.format()
    s = report.shards[0]
    device = mesh.devices[2, 1]
    assert s.path == "['params']['w']"
    assert (s.process, s.device, s.local_device) == (2, device.id, 1)
    assert s.index == target
    assert (s.nan, s.inf, s.first) == (2, 0, (9, 6))
    assert not s.host_local
    text = str(report)
    assert (
        f"['params']['w'] block [8:12, 4:8] on process 2, device {device.id} (dev 1): "
        '2 NaN, 0 Inf, first at (9, 6)'
    ) in text
    leaf = report["['params']['w']"]
    assert leaf.processes == (2,) and leaf.nan == 2 and leaf.shards == 1
    assert leaf.layout is not None and leaf.layout.shape == (16, 8)
    assert len(leaf.layout.shards) == 8
    assert leaf.marked(report) == {target: f'2 NaN, 0 Inf on process 2, device {device.id}'}
    # What was checked: every device's shard once, the host-local zeros on every host.
    assert report.checked == {'leaves': 2, 'shards': 8 + 4, 'elements': 128 + 12, 'skipped': 1}
    # Every host holds the same report.
    got = multihost.process_allgather(np.frombuffer(repr(report.shards).encode(), np.uint8))
    assert all((row == got[0]).all() for row in got)


@multiprocess
def test_an_inf_in_a_host_local_array_on_host_1_is_marked_host_local():
    pid = jax.process_index()
    local = np.zeros((3, 5), np.float32)
    if pid == 1:
        local[2, 4] = -np.inf
    on_device = jax.device_put(jnp.ones(6), jax.local_devices()[1])
    if pid == 3:
        on_device = on_device.at[4].set(jnp.inf)
    report = multihost.nonfinite({'batch': local, 'dev': on_device}, timeout=60)
    assert [(s.path, s.process) for s in report.shards] == [("['batch']", 1), ("['dev']", 3)]
    batch, dev = report.shards
    assert batch.host_local and batch.device is None and batch.local_device is None
    assert (batch.index, batch.inf, batch.nan, batch.first) == (((0, 3), (0, 5)), 1, 0, (2, 4))
    assert "['batch'] (host-local) block [0:3, 0:5] on process 1, host memory: 0 NaN, 1 Inf" in str(
        report
    )
    assert dev.host_local and dev.local_device == 1 and dev.device == jax.devices()[3 * 2 + 1].id
    assert (dev.index, dev.first, dev.inf) == (((0, 6),), (4,), 1)
    # Host-local leaves: one per offending host, with that host's own layout.
    assert [(leaf.path, leaf.processes) for leaf in report.leaves] == [
        ("['batch']", (1,)),
        ("['dev']", (3,)),
    ]
    assert report.leaves[0].layout.sharding == 'numpy'
    assert report.leaves[1].layout.shards[0].process_index == 3


@multiprocess
def test_a_clean_tree_is_ok_on_every_host():
    x = _global((8, 6), P('host'), host_mesh())
    y = _global((32,), P('x'), flat_mesh())
    report = multihost.nonfinite(
        {'x': x, 'y': y, 'h': np.ones(4), 'k': jax.random.key(0)}, timeout=60
    )
    assert report.ok, report.format()
    assert report.shards == () and report.leaves == () and report.truncated == {}
    assert report.checked['shards'] == 8 + 8 + 4 and report.checked['skipped'] == 1
    assert str(report).startswith('no NaN or Inf: 3 leaves, 20 shards, 144 elements checked'), str(
        report
    )


@multiprocess
def test_a_nan_in_host_3s_replica_of_a_replicated_array_is_found():
    pid = jax.process_index()

    def poison(index, out):
        if pid == 3:
            out[5] = np.nan

    rep = _global((8, 4), P(), host_mesh(), poison)  # every device holds the whole array
    report = multihost.nonfinite(rep, timeout=60)
    assert {(s.process, s.local_device) for s in report.shards} == {(3, 0), (3, 1)}
    for s in report.shards:
        assert s.index == ((0, 8), (0, 4)) and s.nan == 4 and s.first == (5, 0)
        assert s.path == '' and not s.host_local
    assert {s.replica for s in report.shards} == {6, 7}
    assert report.processes == (3,)


@multiprocess
def test_many_offending_shards_are_bounded_per_host():
    from multihost._checks import _nonfinite

    x = _global((8, 4), P('host', 'dev'), host_mesh(), lambda index, out: out.fill(np.inf))
    saved, _nonfinite.MAX_RECORDS = _nonfinite.MAX_RECORDS, 1
    try:
        report = multihost.nonfinite(x, timeout=60)
    finally:
        _nonfinite.MAX_RECORDS = saved
    assert len(report.shards) == 4  # one per host
    assert report.truncated == {0: 1, 1: 1, 2: 1, 3: 1}
    assert not report.ok
    assert 'process 2 found 1 more offending shard(s), not listed' in report.format()


@multiprocess
def test_hosts_passing_different_global_arrays_raise_on_every_host():
    mesh = host_mesh()
    shape = (8, 4) if jax.process_index() != 2 else (16, 4)
    x = _global(shape, P('host'), mesh)
    with pytest.raises(multihost.CollectiveMismatchError, match=r'\bnonfinite\b'):
        multihost.nonfinite({'x': x}, timeout=60)
    # The sequence is still aligned.
    assert multihost.nonfinite({'x': _global((8, 4), P('host'), mesh)}, timeout=60).ok
