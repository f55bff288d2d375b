"""`describe_layout` and `check_replicas` on 4 real JAX processes x 2 CPU devices.

Functions passed to ``mp_cluster.run`` run in every process; their results
(Layouts and ReplicaReports, pickled back) are compared here across hosts.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest
from _helpers import flat_mesh, host_mesh
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess

N_HOSTS = 4
MATRIX = np.arange(48, dtype=np.float32).reshape(8, 6)  # 192 B
CUBE = np.arange(64, dtype=np.int16).reshape(2, 4, 8)  # 128 B
VECTOR = np.arange(16, dtype=np.float32)  # 64 B


def _global(value: np.ndarray, mesh: Mesh, spec: P) -> jax.Array:
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda i: value[i])


def _arrays() -> dict[str, jax.Array]:
    """The same global arrays, built on every host."""
    mesh, flat = host_mesh(), flat_mesh()
    return {
        'host_dev': _global(MATRIX, mesh, P('host', 'dev')),
        'host': _global(MATRIX, mesh, P('host')),
        'none_dev': _global(MATRIX, mesh, P(None, 'dev')),
        'replicated': _global(MATRIX, mesh, P()),
        'cube': _global(CUBE, mesh, P(None, 'dev', 'host')),
        'scalar': _global(np.array(2.5, np.float32), mesh, P()),
        'flat_x': _global(VECTOR, flat, P('x')),
        'flat_replicated': _global(VECTOR, flat, P()),
    }


def describe_all() -> dict[str, multihost.Layout]:
    """Every host's Layouts, after checking them against its addressable shards."""
    out = {}
    for name, arr in _arrays().items():
        layout = multihost.describe_layout(arr)
        by_device = {s.device_id: s for s in layout.shards}
        assert len(by_device) == len(layout.shards) == 8, name
        for shard in arr.addressable_shards:
            info = by_device[shard.device.id]
            index = tuple(sl.indices(n)[:2] for sl, n in zip(shard.index, arr.shape))
            assert info.index == index, (name, info, shard.index)
            assert info.replica_id == shard.replica_id, (name, info)
            assert info.nbytes == shard.data.nbytes, (name, info)
            assert info.process_index == jax.process_index(), (name, info)
            # 'dev' in a device's name is its index in this host's jax.local_devices()
            local = jax.local_devices().index(shard.device)
            assert layout.local_index(shard.device.id) == local, (name, info)
            assert layout.device_name(shard.device.id) == (
                f'process {jax.process_index()} · dev {local} (id {shard.device.id})'
            )
        out[name] = layout
    return out


def test_every_host_gets_the_same_layout(mp_cluster):
    """All four hosts describe each global array identically, and list all 8 shards."""
    results = mp_cluster.run(describe_all)
    assert len(results) == N_HOSTS
    for name, layout in results[0].items():
        for p, other in enumerate(results[1:], 1):
            assert other[name] == layout, f'{name}: process {p} differs'
        assert layout.num_processes == N_HOSTS and layout.processes == (0, 1, 2, 3)
        assert sorted(layout.device_ids) == sorted(layout.mesh_device_ids), name


# Per array: (spec text, number of distinct blocks, replicas per block, bytes per process).
EXPECTED = {
    'host_dev': ("P('host', 'dev')", 8, 1, 48),
    'host': ("P('host')", 4, 2, 96),
    'none_dev': ("P(None, 'dev')", 2, 4, 192),
    'replicated': ('P()', 1, 8, 384),
    'cube': ("P(None, 'dev', 'host')", 8, 1, 32),
    'scalar': ('P()', 1, 8, 8),
    'flat_x': ("P('x')", 8, 1, 16),
    'flat_replicated': ('P()', 1, 8, 128),
}


def test_layouts_cover_the_array_and_count_bytes_per_host(mp_cluster):
    """Blocks tile each array exactly; block counts, replicas and bytes per process are right."""
    layouts = mp_cluster.run(describe_all)[0]
    for name, (spec, n_blocks, replicas, per_host) in EXPECTED.items():
        layout = layouts[name]
        assert layout.spec == spec, name
        assert layout.covers_exactly(), name
        assert len(layout.blocks()) == n_blocks, name
        assert set(layout.replica_counts().values()) == {replicas}, name
        assert layout.bytes_per_process() == dict.fromkeys(range(N_HOSTS), per_host), name
    assert layouts['host'].mesh_axes == (('host', 4), ('dev', 2))
    assert layouts['flat_x'].mesh_axes == (('x', 8),)
    assert layouts['scalar'].shape == () and layouts['scalar'].blocks()[0].index == ()


def test_layout_places_blocks_on_the_right_hosts(mp_cluster):
    """Which block lives where follows the mesh: rows by host, columns by device."""
    layouts = mp_cluster.run(describe_all)[0]
    hd = layouts['host_dev']
    grid = np.array(hd.mesh_device_ids).reshape(4, 2)
    process_of = {s.device_id: s.process_index for s in hd.shards}
    for s in hd.shards:
        (r0, r1), (c0, c1) = s.index
        assert (r1 - r0, c1 - c0) == (2, 3)
        assert s.device_id == grid[r0 // 2, c0 // 3]
        assert s.process_index == r0 // 2 == process_of[grid[r0 // 2, 0]]
    for s in layouts['cube'].shards:  # last dimension split over hosts
        assert s.index[2] == (2 * s.process_index, 2 * s.process_index + 2)
    for s in layouts['flat_x'].shards:
        assert 4 * s.process_index <= s.index[0][0] < s.index[0][1] <= 4 * s.process_index + 4
    for block in layouts['host'].blocks():  # replicated within one host only
        assert len(block.process_indices) == 1 and block.replica_count == 2
    for block in layouts['none_dev'].blocks():  # replicated across every host
        assert block.process_indices == (0, 1, 2, 3)
    # moving along 'host' (or the flat 'x') changes the process; along 'dev' it does not
    assert hd.mesh_axis_hosts() == (('host', 4), ('dev', 1)) and hd.crossing_axes == ('host',)
    assert layouts['flat_x'].crossing_axes == ('x',)


@multiprocess
def test_describe_layout_of_host_local_array_names_this_host():
    """A fully addressable array on a multi-process job: shards on this host only."""
    local = jax.device_put(
        np.zeros((4, 2), np.float32), NamedSharding(host_mesh().local_mesh, P('dev'))
    )
    layout = multihost.describe_layout(local)
    assert layout.num_processes == N_HOSTS
    assert layout.processes == (jax.process_index(),)
    assert layout.bytes_per_process()[jax.process_index()] == 32
    assert sum(layout.bytes_per_process().values()) == 32


# -- check_replicas ------------------------------------------------------------------------


def check_consistent() -> dict[str, multihost.ReplicaReport]:
    """Replicas that agree: a replicated input, a per-host one, and a fully sharded one."""
    mesh, pid = host_mesh(), jax.process_index()
    to_global = multihost.host_local_array_to_global_array
    arrays = {
        'replicated': to_global(np.arange(6, dtype=np.float32), mesh, P()),
        'per_host': to_global(np.full((2, 3), pid, np.float32), mesh, P('host', None)),
        'sharded': to_global(np.zeros((2, 2), np.int32), mesh, P('host', 'dev')),
        'none_dev': _arrays()['none_dev'],
    }
    return {name: multihost.check_replicas(arr) for name, arr in arrays.items()}


def test_check_replicas_ok_for_consistent_data(mp_cluster):
    """Consistent replicas: every host's report is ok and identical."""
    results = mp_cluster.run(check_consistent)
    for name, report in results[0].items():
        assert report.ok, f'{name}:\n{report}'
        assert all(r[name] == report for r in results[1:]), name
    groups = {name: len(r.groups) for name, r in results[0].items()}
    assert groups == {'replicated': 1, 'per_host': 4, 'sharded': 0, 'none_dev': 2}
    assert len(results[0]['replicated'].groups[0].replicas) == 8


ODD_HOST = 2


def check_odd_host_replicated() -> multihost.ReplicaReport:
    """host_local_array_to_global_array(x, mesh, P()) with a different x on ODD_HOST."""
    x = np.arange(6, dtype=np.float32) + (1 if jax.process_index() == ODD_HOST else 0)
    arr = multihost.host_local_array_to_global_array(x, host_mesh(), P())
    return multihost.check_replicas(arr)


def test_check_replicas_names_the_odd_host(mp_cluster):
    """A replicated input that differs on one host: not ok on every host, that host named."""
    reports = mp_cluster.run(check_odd_host_replicated)
    report = reports[0]
    assert all(r == report for r in reports[1:])
    assert not report.ok
    assert report.odd_processes == (ODD_HOST,)
    odd_devices = tuple(sorted(s.device_id for s in report.layout.shards_on(ODD_HOST)))
    assert report.odd_devices == odd_devices
    (group,) = report.mismatches
    assert not group.tied and len(group.digests[group.majority]) == 6
    assert 'DIFFER' in str(report) and f'odd process(es) [{ODD_HOST}]' in str(report)


def _from_device_data(
    shape: tuple[int, ...], mesh: Mesh, spec: P, value: np.ndarray, odd_device: int | None
) -> jax.Array:
    """A global array whose device ``odd_device`` holds value + 1 instead of its slice."""
    sharding = NamedSharding(mesh, spec)
    index = sharding.addressable_devices_indices_map(shape)
    bufs = [
        jax.device_put(value[i] + (1 if d.id == odd_device else 0), d) for d, i in index.items()
    ]
    return jax.make_array_from_single_device_arrays(shape, sharding, bufs)


def check_device_level_disagreement() -> dict:
    """Disagreeing replicas built from per-device buffers, within a process and across hosts."""
    mesh = host_mesh()
    devices = mesh.devices
    value = np.arange(24, dtype=np.float32).reshape(8, 3)
    within = devices[1, 1].id  # process 1's second device; its twin is devices[1, 0]
    across = devices[3, 0].id  # one of the eight replicas of a P() array
    return {
        'per_host_ok': multihost.check_replicas(
            _from_device_data((8, 3), mesh, P('host', None), value, None)
        ),
        'within': multihost.check_replicas(
            _from_device_data((8, 3), mesh, P('host', None), value, within)
        ),
        'across': multihost.check_replicas(
            _from_device_data((3,), flat_mesh(), P(), value[0], across)
        ),
        'within_id': within,
        'across_id': across,
    }


def test_check_replicas_finds_disagreement_within_and_across_hosts(mp_cluster):
    """A device whose copy differs is found, inside P('host', None) and inside P()."""
    results = mp_cluster.run(check_device_level_disagreement)
    r = results[0]
    for name in ('per_host_ok', 'within', 'across'):
        assert all(other[name] == r[name] for other in results[1:]), name
    assert r['per_host_ok'].ok and len(r['per_host_ok'].groups) == 4
    within = r['within']
    assert not within.ok and within.odd_processes == (1,)
    (group,) = within.mismatches
    assert group.index == ((2, 4), (0, 3))  # process 1's rows
    assert group.tied and group.odd_devices == (r['within_id'],)  # 1 vs 1: replica 0 wins
    across = r['across']
    assert not across.ok and across.odd_devices == (r['across_id'],)
    assert across.odd_processes == (3,)
    assert len(across.mismatches[0].digests[across.mismatches[0].majority]) == 7


@multiprocess
def test_check_replicas_on_different_arrays_is_a_collective_mismatch():
    """Hosts passing differently shaped arrays: CollectiveMismatchError on every host."""
    n = 4 if jax.process_index() == 0 else 3
    arr = multihost.host_local_array_to_global_array(np.zeros(n, np.float32), host_mesh(), P())
    with pytest.raises(multihost.CollectiveMismatchError, match='check_replicas'):
        multihost.check_replicas(arr, timeout=30)
    multihost.barrier('after check_replicas mismatch', timeout=30)  # still in step


@multiprocess
def test_check_replicas_of_host_local_array_needs_no_other_host():
    """A fully addressable array is checked locally: one host alone can call it."""
    if jax.process_index() == 0:
        sharding = NamedSharding(host_mesh().local_mesh, P())
        bufs = [
            jax.device_put(np.full(2, float(k)), d)
            for k, d in enumerate(sharding.addressable_devices)
        ]
        arr = jax.make_array_from_single_device_arrays((2,), sharding, bufs)
        report = multihost.check_replicas(arr, timeout=5)
        assert not report.ok and report.odd_processes == (0,)
        assert report.layout.processes == (0,)


SLOW_HOST = 3


def check_with_a_slow_host() -> tuple[list[int], str]:
    """SLOW_HOST takes longer to digest its replicas than the timeout allows."""
    from multihost._checks import _replicas

    arr = multihost.host_local_array_to_global_array(np.zeros(3, np.float32), host_mesh(), P())
    original = _replicas._local_digests
    if jax.process_index() == SLOW_HOST:

        def slow(*args):
            time.sleep(3.5)
            return original(*args)

        _replicas._local_digests = slow
    try:
        with pytest.raises(multihost.BarrierTimeoutError) as info:
            multihost.check_replicas(arr, timeout=2)
    finally:
        _replicas._local_digests = original
    multihost.barrier('after check_replicas timeout', timeout=30)  # still in step
    return info.value.missing, str(info.value)


def test_check_replicas_timeout_names_the_missing_host(mp_cluster):
    """A host that does not publish in time: every host, the late one too, names it."""
    results = mp_cluster.run(check_with_a_slow_host)
    for missing, text in results:
        assert 'check_replicas' in text
        assert missing == [SLOW_HOST] and f'process {SLOW_HOST} did not arrive' in text
    assert len({text.splitlines()[0] for _, text in results}) == 1
