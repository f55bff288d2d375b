"""The layout model, single-process: synthetic Layouts built by hand, and
`describe_layout` / `check_replicas` on this process's 4 CPU devices."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost import Layout, LayoutBlock, ReplicaDigest, ReplicaGroup, ReplicaReport, ShardInfo


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ('a', 'b'))


def _rows_layout() -> Layout:
    """(4, 2) float32 over 2 hosts x 2 devices: rows split by host, replicated within."""
    return Layout.from_placements(
        (4, 2),
        'float32',
        [
            ([(0, 2), (0, 2)], 0, 0),
            ([(0, 2), (0, 2)], 1, 0),
            ([(2, 4), (0, 2)], 2, 1),
            ([(2, 4), (0, 2)], 3, 1),
        ],
        mesh_axes=(('host', 2), ('dev', 2)),
        spec="P('host', None)",
    )


# -- synthetic layouts ------------------------------------------------------------------


def test_from_placements_numbers_replicas_and_sizes():
    """Replica ids count up per distinct index in placement order; sizes follow index x itemsize."""
    layout = _rows_layout()
    assert [s.replica_id for s in layout.shards] == [0, 1, 0, 1]
    assert [s.nbytes for s in layout.shards] == [16] * 4
    assert layout.shards[2].index == ((2, 4), (0, 2)) and layout.shards[2].shape == (2, 2)
    assert layout.itemsize == 4 and layout.nbytes == 32 and layout.stored_nbytes == 64
    assert layout.num_processes == 2 and layout.processes == (0, 1)
    assert layout.mesh_shape == {'host': 2, 'dev': 2}


def test_from_placements_accepts_slices():
    """Slices (as devices_indices_map returns them) normalize to (start, stop) pairs."""
    layout = Layout.from_placements(
        (6, 3), 'int8', [((slice(None), slice(0, 2)), 5, 0), ((slice(0, 6), slice(2, None)), 6, 0)]
    )
    assert [s.index for s in layout.shards] == [((0, 6), (0, 2)), ((0, 6), (2, 3))]
    assert [s.nbytes for s in layout.shards] == [12, 6]
    assert layout.covers_exactly()


def test_bytes_per_host_counts_replicas_and_idle_hosts():
    """Every process appears in bytes_per_process, replicas counted, idle hosts with 0."""
    layout = Layout.from_placements(
        (8,), 'float64', [([(0, 8)], 0, 0), ([(0, 8)], 1, 0), ([(0, 8)], 4, 2)], num_processes=4
    )
    assert layout.bytes_per_process() == {0: 128, 1: 0, 2: 64, 3: 0}
    assert layout.bytes_per_device() == {0: 64, 1: 64, 4: 64}
    assert layout.shards_on(0) == layout.shards[:2] and layout.shards_on(1) == ()
    assert layout.is_fully_replicated


def test_blocks_and_replica_counts():
    """blocks() lists each distinct index once, in row-major order, with its replicas."""
    layout = Layout.from_placements(
        (4, 4),
        'float32',
        [
            ([(2, 4), (0, 4)], 7, 3),
            ([(0, 2), (0, 4)], 1, 0),
            ([(2, 4), (0, 4)], 6, 3),
            ([(2, 4), (0, 4)], 2, 1),
        ],
    )
    blocks = layout.blocks()
    assert all(isinstance(b, LayoutBlock) for b in blocks)
    assert [b.index for b in blocks] == [((0, 2), (0, 4)), ((2, 4), (0, 4))]
    assert [b.replica_count for b in blocks] == [1, 3]
    assert blocks[1].device_ids == (7, 6, 2) and blocks[1].process_indices == (1, 3)
    assert blocks[1].nbytes == 32 and blocks[1].shape == (2, 4)
    assert layout.replica_counts() == {((2, 4), (0, 4)): 3, ((0, 2), (0, 4)): 1}
    assert not layout.is_fully_replicated


def test_zero_d_layout():
    """A 0-d array has one block with the empty index; sizes are one item."""
    layout = Layout.from_placements((), 'int32', [((), 0, 0), ((), 1, 1)])
    assert layout.ndim == 0 and layout.size == 1 and layout.nbytes == 4
    assert [s.index for s in layout.shards] == [(), ()]
    assert [s.replica_id for s in layout.shards] == [0, 1]
    assert layout.bytes_per_process() == {0: 4, 1: 4}
    assert layout.covers_exactly() and layout.is_fully_replicated
    assert '[]' in str(layout)


def test_covers_exactly_detects_gaps_and_overlaps_1d_and_3d():
    """covers_exactly is True for a tiling, False with a gap or an overlap (1-d and 3-d)."""
    ok1 = Layout.from_placements((10,), 'uint8', [([(0, 4)], 0, 0), ([(4, 10)], 1, 0)])
    gap1 = Layout.from_placements((10,), 'uint8', [([(0, 4)], 0, 0), ([(5, 10)], 1, 0)])
    over1 = Layout.from_placements((10,), 'uint8', [([(0, 5)], 0, 0), ([(4, 10)], 1, 0)])
    assert ok1.covers_exactly() and not gap1.covers_exactly() and not over1.covers_exactly()

    def cube(blocks):
        return Layout.from_placements(
            (2, 4, 6), 'float32', [(idx, d, d // 2) for d, idx in enumerate(blocks)]
        )

    tiles = [[(0, 2), (a, a + 2), (b, b + 3)] for a in (0, 2) for b in (0, 3)]
    assert cube(tiles).covers_exactly()
    assert not cube(tiles[:-1]).covers_exactly()  # a missing corner
    assert not cube(tiles + [[(0, 2), (1, 3), (0, 3)]]).covers_exactly()  # an overlap
    assert cube(tiles).shards[3].nbytes == 2 * 2 * 3 * 4


def test_constructor_normalizes_and_validates():
    """The constructor turns lists into tuples and rejects shards that do not fit the shape."""
    shard = ShardInfo(
        index=[[0, 2], [1, 3]], device_id=np.int64(3), process_index=1, replica_id=0, nbytes=8
    )
    assert shard.index == ((0, 2), (1, 3)) and type(shard.device_id) is int
    layout = Layout(shape=[2, 3], dtype=np.dtype('int16'), shards=[shard])
    assert layout.shape == (2, 3) and layout.dtype == 'int16' and layout.itemsize == 2
    assert layout.num_processes == 2 and isinstance(layout.shards, tuple)
    with pytest.raises(ValueError, match='dimension'):
        Layout(shape=(2,), dtype='int16', shards=[shard])
    with pytest.raises(ValueError, match='out of bounds'):
        Layout(shape=(2, 2), dtype='int16', shards=[shard])
    with pytest.raises(ValueError, match='invalid range'):
        ShardInfo(index=[(3, 1)], device_id=0, process_index=0, replica_id=0, nbytes=0)
    with pytest.raises(TypeError, match='itemsize'):
        Layout(shape=(2, 3), dtype='key<fry>', shards=[shard])
    assert Layout(shape=(2, 3), dtype='key<fry>', shards=[shard], itemsize=8).nbytes == 48


def test_layout_pickles_and_compares_equal():
    """A Layout survives pickling (it travels over ipyparallel) and compares by value."""
    layout = _rows_layout()
    again = pickle.loads(pickle.dumps(layout))
    assert again == layout and hash(again) == hash(layout)
    assert again != Layout.from_placements((4, 2), 'float32', [([(0, 4), (0, 2)], 0, 0)])


def test_text_summary_names_blocks_devices_and_bytes():
    """str(layout) gives the headline, each block with its devices, and bytes per process."""
    text = str(_rows_layout())
    assert text.splitlines()[0] == "float32[4, 2] (32 B) P('host', None) on mesh (host=2, dev=2)"
    assert '[2:4, 0:2] 16 B x2: process 1 · dev 0 (id 2), process 1 · dev 1 (id 3)' in text
    assert 'bytes per process: 0: 32 B, 1: 32 B' in text
    many = Layout.from_placements((100,), 'float32', [([(i, i + 1)], i, 0) for i in range(100)])
    assert '... 84 more block(s)' in str(many)


def test_device_name_forms():
    """Every view names a device as host (process) · dev (index on the host) (id)."""
    from multihost._checks._layout import device_name, format_ranges

    assert device_name(1, 0, 2048) == 'process 1 · dev 0 (id 2048)'
    assert device_name(1, 0, 2048, 'short') == 'process 1 · dev 0'
    assert device_name(1, 0, 2048, 'tiny') == 'p1·d0'
    assert device_name(0, None, None) == 'process 0 · host memory'
    assert device_name(2, None, 7) == 'process 2 · id 7'
    with pytest.raises(ValueError, match='form'):
        device_name(0, 0, 0, 'medium')
    assert format_ranges([5, 0, 1, 2, 6]) == '0-2,5,6' and format_ranges([]) == ''


def test_local_indices_default_and_given():
    """Without local indices, each host's devices are numbered in id order; given ones win."""
    ids = [0, 1, 2048, 2049]
    layout = Layout.from_placements(
        (4,), 'float32', [([(i, i + 1)], d, i // 2) for i, d in enumerate(ids)]
    )
    assert layout.local_indices == ((0, 0), (1, 1), (2048, 0), (2049, 1))
    assert layout.device_name(2049) == 'process 1 · dev 1 (id 2049)'
    assert layout.devices_by_process() == {0: (0, 1), 1: (2048, 2049)}
    # a sharding over devices 1 and 3 of one host: their own indices, not 0 and 1
    sub = Layout.from_placements(
        (2,), 'float32', [([(0, 1)], 1, 0), ([(1, 2)], 3, 0)], local_indices=((1, 1), (3, 3))
    )
    assert [sub.device_name(d, 'short') for d in (1, 3)] == [
        'process 0 · dev 1',
        'process 0 · dev 3',
    ]
    assert pickle.loads(pickle.dumps(sub)) == sub


def test_mesh_axes_crossing_hosts():
    """A mesh axis crosses hosts when moving along it changes the process."""
    ids = (0, 1, 2048, 2049, 4096, 4097, 6144, 6145)
    placements = [([(0, 8)], d, i // 2) for i, d in enumerate(ids)]
    layout = Layout.from_placements(
        (8,), 'float32', placements, mesh_axes=(('host', 4), ('dev', 2)), mesh_device_ids=ids
    )
    assert layout.mesh_processes() == (0, 0, 1, 1, 2, 2, 3, 3)
    assert layout.mesh_axis_hosts() == (('host', 4), ('dev', 1))
    assert layout.crossing_axes == ('host',)
    assert 'mesh host=4 crosses processes (4 along it), dev=2 within a process' in str(layout)
    # transposed: devices of one host along 'a' -> 'b' crosses hosts, 'a' does not
    swapped = Layout.from_placements(
        (8,),
        'float32',
        placements,
        mesh_axes=(('b', 2), ('a', 4)),
        mesh_device_ids=(0, 2048, 4096, 6144, 1, 2049, 4097, 6145),
    )
    assert swapped.mesh_axis_hosts() == (('b', 1), ('a', 4))
    # a 1-d mesh over 8 devices of 4 hosts crosses hosts; without device ids: unknown
    flat = Layout.from_placements(
        (8,), 'float32', placements, mesh_axes=(('x', 8),), mesh_device_ids=ids
    )
    assert flat.crossing_axes == ('x',)
    assert _rows_layout().mesh_axis_hosts() == () and _rows_layout().crossing_axes == ()


# -- describe_layout on this process's devices ------------------------------------------------


def test_describe_layout_matches_jax_shards():
    """Indices, devices and replica ids agree with jax.Array.addressable_shards."""
    mesh = _mesh()
    arr = jax.device_put(
        np.arange(24.0, dtype=np.float32).reshape(4, 6), NamedSharding(mesh, P(None, 'b'))
    )
    layout = multihost.describe_layout(arr)
    by_device = {s.device_id: s for s in layout.shards}
    assert len(layout.shards) == 4
    for shard in arr.addressable_shards:
        info = by_device[shard.device.id]
        assert info.index == tuple(sl.indices(n)[:2] for sl, n in zip(shard.index, arr.shape))
        assert info.replica_id == shard.replica_id
        assert info.nbytes == shard.data.nbytes
        assert info.process_index == 0
    assert layout.mesh_axes == (('a', 2), ('b', 2))
    assert layout.mesh_device_ids == tuple(d.id for d in mesh.devices.flat)
    assert layout.spec == "P(None, 'b')" and layout.sharding == 'NamedSharding'
    assert layout.platform == 'cpu' and layout.dtype == 'float32'
    assert layout.bytes_per_process() == {0: 192} and layout.covers_exactly()
    # dev is the index in jax.local_devices(); one process: every mesh axis stays on it
    local = {d.id: i for i, d in enumerate(jax.local_devices())}
    assert all(layout.local_index(s.device_id) == local[s.device_id] for s in layout.shards)
    assert layout.mesh_axis_hosts() == (('a', 1), ('b', 1)) and layout.crossing_axes == ()


def test_describe_layout_0d_and_3d_and_single_device():
    """A 0-d jax scalar (SingleDeviceSharding) and a 3-d array over two mesh axes."""
    scalar = multihost.describe_layout(jnp.float32(2.5))
    assert scalar.shape == () and scalar.sharding == 'SingleDeviceSharding'
    assert [(s.index, s.nbytes) for s in scalar.shards] == [((), 4)]
    assert scalar.mesh_axes == () and scalar.spec == ''
    cube = jax.device_put(np.zeros((2, 4, 6), np.int16), NamedSharding(_mesh(), P('b', None, 'a')))
    layout = multihost.describe_layout(cube)
    assert sorted(s.index for s in layout.shards) == [
        ((0, 1), (0, 4), (0, 3)),
        ((0, 1), (0, 4), (3, 6)),
        ((1, 2), (0, 4), (0, 3)),
        ((1, 2), (0, 4), (3, 6)),
    ]
    assert all(s.nbytes == 1 * 4 * 3 * 2 for s in layout.shards)
    assert layout.covers_exactly() and layout.spec == "P('b', None, 'a')"


def test_describe_layout_prng_keys_and_bfloat16():
    """Dtypes numpy does not know keep their jax name and item size."""
    keys = jax.random.split(jax.random.key(0), 4)
    layout = multihost.describe_layout(keys)
    assert layout.dtype == str(keys.dtype) and layout.nbytes == keys.nbytes
    half = multihost.describe_layout(jnp.ones((3,), jnp.bfloat16))
    assert half.dtype == 'bfloat16' and half.nbytes == 6


def test_describe_layout_numpy_and_bad_types():
    """A numpy value is one host-memory shard; anything else is a TypeError naming its type."""
    layout = multihost.describe_layout(np.zeros((3, 2), np.float64))
    assert layout.sharding == 'numpy' and layout.platform == 'host'
    (shard,) = layout.shards
    assert (shard.index, shard.device_id, shard.nbytes) == (((0, 3), (0, 2)), None, 48)
    assert multihost.describe_layout(np.float32(1)).shape == ()
    with pytest.raises(TypeError, match=r'builtins\.list.*jax\.tree\.map'):
        multihost.describe_layout([np.zeros(2)])
    with pytest.raises(TypeError, match='builtins.str'):
        multihost.describe_layout('x')


# -- check_replicas in one process ------------------------------------------------------------


def _replicated_with(values: list[float]) -> jax.Array:
    """A P() array over the 2x2 mesh whose device k holds values[k] (replicas may differ)."""
    sharding = NamedSharding(_mesh(), P())
    bufs = [
        jax.device_put(np.full((3,), v, np.float32), d)
        for d, v in zip(_mesh().devices.flat, values)
    ]
    return jax.make_array_from_single_device_arrays((3,), sharding, bufs)


def test_check_replicas_ok_when_replicas_agree():
    """Equal replicas: ok, one group per replicated block, no odd devices."""
    report = multihost.check_replicas(_replicated_with([1.0] * 4))
    assert report.ok and report.mismatches == () and report.odd_devices == ()
    assert len(report.groups) == 1 and len(report.groups[0].replicas) == 4
    assert 'replicas agree' in str(report)


def test_check_replicas_names_the_odd_device():
    """One device's copy differs: not ok, that device (and its process) is named."""
    bad = _replicated_with([1.0, 1.0, 7.0, 1.0])
    odd_device = _mesh().devices.flat[2].id
    report = multihost.check_replicas(bad)
    assert not report.ok
    assert report.odd_devices == (odd_device,) and report.odd_processes == (0,)
    (group,) = report.mismatches
    assert not group.tied and len(group.digests) == 2
    assert list(group.digests.values())[1] == (odd_device,)
    assert 'DIFFER' in str(report) and f'device(s) {odd_device} (process 0)' in str(report)


def test_check_replicas_tie_goes_to_replica_0():
    """Two replicas that differ: a tie; replica 1 is reported as the odd one."""
    sharding = NamedSharding(_mesh(), P('a'))
    index = sharding.addressable_devices_indices_map((4,))
    value = np.arange(4, dtype=np.int32)
    devices = list(index)
    odd = [d for d in devices if index[d] == (slice(2, 4, None),)][1]
    bufs = [jax.device_put(value[index[d]] + (1 if d == odd else 0), d) for d in devices]
    arr = jax.make_array_from_single_device_arrays((4,), sharding, bufs)
    report = multihost.check_replicas(arr)
    (group,) = report.mismatches
    assert group.index == ((2, 4),) and group.tied and group.odd_devices == (odd.id,)
    assert len(report.groups) == 2 and report.groups[0].ok


def test_check_replicas_compares_bits():
    """NaN replicas with the same bits agree; 0.0 and -0.0 do not."""
    assert multihost.check_replicas(_replicated_with([np.nan] * 4)).ok
    assert not multihost.check_replicas(_replicated_with([0.0, -0.0, 0.0, 0.0])).ok


def test_check_replicas_without_replicas_and_bad_type():
    """A fully sharded array has nothing to compare; numpy input is a TypeError."""
    arr = jax.device_put(np.zeros((4, 4)), NamedSharding(_mesh(), P('a', 'b')))
    report = multihost.check_replicas(arr)
    assert report.ok and report.groups == () and 'nothing to compare' in str(report)
    with pytest.raises(TypeError, match='numpy.ndarray.*assert_equal'):
        multihost.check_replicas(np.zeros(3))


def test_synthetic_replica_report():
    """A ReplicaReport built by hand (as view tests do) computes majority and odd hosts."""
    layout = Layout.from_placements((2,), 'float32', [([(0, 2)], d, d // 2) for d in range(6)])
    digests = ['aa', 'aa', 'aa', 'aa', 'bb', 'bb']
    group = ReplicaGroup(
        index=((0, 2),),
        replicas=tuple(
            ReplicaDigest(device_id=d, process_index=d // 2, replica_id=d, digest=h)
            for d, h in enumerate(digests)
        ),
    )
    report = ReplicaReport(layout=layout, groups=(group,))
    assert not report.ok and group.majority == 'aa' and not group.tied
    assert report.odd_processes == (2,) and report.odd_devices == (4, 5)
    assert group.digests == {'aa': (0, 1, 2, 3), 'bb': (4, 5)}
    assert pickle.loads(pickle.dumps(report)) == report


def _report_1000(digest_of) -> ReplicaReport:
    """float32[8, 6], P('dev', None) over 1,000 hosts x 8 devices: 8 blocks, each on one
    device of every host; ``digest_of(process, dev)`` is that replica's digest."""
    hosts, devs = 1000, 8
    placements = [
        ([(d, d + 1), (0, 6)], h * devs + d, h) for h in range(hosts) for d in range(devs)
    ]
    layout = Layout.from_placements((8, 6), 'float32', placements)
    groups = tuple(
        ReplicaGroup(
            index=b.index,
            replicas=tuple(
                ReplicaDigest(
                    s.device_id, s.process_index, s.replica_id, digest_of(s.process_index, d)
                )
                for s in b.shards
            ),
        )
        for d, b in enumerate(layout.blocks())
    )
    return ReplicaReport(layout=layout, groups=groups)


def test_replica_report_text_is_bounded_at_1000_hosts():
    """1,000 hosts x 8 devices, every block odd on hosts 17 and 503 (and host 999 on its own):
    a few lines of bounded length that still name the odd hosts; every host odd too."""
    odd = {17: 'bb', 503: 'bb', 999: 'cc'}
    text = str(_report_1000(lambda p, d: odd.get(p, 'aa')))
    lines = text.splitlines()
    assert len(lines) <= 12 and len(text) < 6000, (len(lines), len(text))
    assert 'odd process(es) [17, 503, 999]' in lines[0]
    assert 'odd device(s) [136-143, 4024-4031, 7992-7999] (24 in all)' in lines[0]
    assert 'aa (majority) on device(s) 0 (process 0), 8 (process 1)' in lines[1]
    assert '(997 devices on processes 0-16, 18-502, 504-998)' in lines[1]
    assert 'bb on device(s) 136 (process 17), 4024 (process 503);' in lines[1]
    assert 'cc on device(s) 7992 (process 999)' in lines[1]

    # Every host its own digest: 4 digests named per block, the other 996 counted.
    text = str(_report_1000(lambda p, d: f'{p:04x}'))
    lines = text.splitlines()
    assert len(lines) <= 12 and len(text) < 6000, (len(lines), len(text))
    assert 'odd process(es) [1-999] (999 in all)' in lines[0]  # a tie: process 0's digest leads
    assert '... 996 more digest(s) on 996 device(s) of processes 4-999' in lines[1]


def test_public_surface_exports_the_layout_model():
    """The layout API is exported from multihost and listed in __all__."""
    names = [
        'describe_layout',
        'check_replicas',
        'Layout',
        'LayoutBlock',
        'ShardInfo',
        'ReplicaReport',
        'ReplicaGroup',
        'ReplicaDigest',
    ]
    for name in names:
        assert name in multihost.__all__ and hasattr(multihost, name), name


# -- the hardware model, by hand (no libtpu needed) -----------------------------------


def _pod(kind, shape, hosts_of, slices=1):
    """DeviceInfo of a pod of ``shape`` chips (x fastest), host by ``hosts_of(x, y, z)``."""
    from multihost import DeviceInfo

    out = []
    for s in range(slices):
        for z in range(shape[2]):
            for y in range(shape[1]):
                for x in range(shape[0]):
                    out.append(
                        DeviceInfo(
                            id=len(out),
                            process_index=hosts_of(x, y, z) + s * 100,
                            kind=kind,
                            coords=(x, y, z),
                            slice_index=s if slices > 1 else None,
                        )
                    )
    return out


def test_axis_verdicts_from_chip_coordinates():
    from multihost._models._hardware import axis_links

    v5e = _pod('TPU v5 lite', (4, 4, 1), lambda x, y, z: (y // 2) * 2 + x // 2)
    rows = [v5e[y * 4 + x] for y in range(4) for x in range(4)]  # mesh (y, x)
    links = axis_links((('y', 4), ('x', 4)), rows)
    assert [a.verdict for a in links] == [
        'ICI line of 4 along y, not a ring, 2 hosts',
        'ICI line of 4 along x, not a ring, 2 hosts',
    ]
    # a snake through a 2x2 square closes into a ring without wraparound links
    square = [v5e[0], v5e[1], v5e[5], v5e[4]]
    assert axis_links((('a', 4),), square)[0].verdict == 'ICI ring of 4 along x,y, within one host'
    # every other chip: no neighbours; a diagonal within a process: the host is what matters
    assert axis_links((('a', 2),), [v5e[0], v5e[2]])[0].verdict == 'ICI, not a ring, 2 hosts'
    assert axis_links((('a', 2),), [v5e[0], v5e[5]])[0].verdict == 'within one host'
    # a full 16-chip v5e dimension wraps around; a 4-chip one does not
    pod = _pod('TPU v5 lite', (16, 1, 1), lambda x, y, z: x // 4)
    assert axis_links((('x', 16),), pod)[0].verdict == 'ICI ring of 16 along x, 4 hosts'
    v5p = _pod('TPU v5', (4, 4, 4), lambda x, y, z: z)
    line = [v5p[x] for x in range(4)]
    assert axis_links((('x', 4),), line, v5p)[0].ring  # a 4x4x4 cube is a torus
    assert not axis_links((('x', 4),), line)[0].ring  # a line alone: no cube seen, no ring
    small = _pod('TPU v5', (2, 2, 4), lambda x, y, z: z)
    assert not axis_links((('z', 4),), small[0::4], small)[0].ring  # 2x2x4: no wraparound


def test_dcn_and_core_verdicts_and_cpu_devices():
    from multihost import DeviceInfo
    from multihost._models._hardware import axis_links

    two = _pod('TPU v5 lite', (2, 1, 1), lambda x, y, z: 0, slices=2)
    assert axis_links((('dcn', 2),), [two[0], two[2]])[0].verdict == 'DCN across 2 slices'
    assert axis_links((('d', 4),), two)[0].verdict == 'DCN across 2 slices, ICI within each'
    cores = [DeviceInfo(id=i, process_index=0, kind='TPU v4', coords=(0, 0, 0), core_on_chip=i)
             for i in range(2)]  # fmt: skip
    assert axis_links((('core', 2),), cores)[0].verdict == 'within one chip'
    cpu = [DeviceInfo(id=i, process_index=i // 2) for i in range(4)]
    assert [a.verdict for a in axis_links((('host', 2), ('dev', 2)), cpu)] == [
        'crosses processes (2 along it)',
        'within one host',
    ]


def test_a_layout_with_devices_draws_its_chip_grid_and_names_chips():
    devices = _pod('TPU v5 lite', (2, 2, 1), lambda x, y, z: x)
    layout = Layout.from_placements(
        (4, 4),
        'float32',
        [
            ([(2 * (d.id // 2), 2 * (d.id // 2) + 2), (0, 4)], d.id, d.process_index)
            for d in devices
        ],
        devices=devices,
        mesh_axes=(('data', 2), ('rep', 2)),
        mesh_device_ids=(0, 1, 2, 3),
        spec="P('data', None)",
    )
    assert layout.has_chips and layout.device_kind == 'TPU v5 lite'
    text = str(layout)
    assert '  TPU v5 lite: 4 chips (2x2) on 2 processes' in text
    assert 'process 1 · dev 0 (id 1), TPU v5 lite chip (1,0,0)' in text
    assert 'bytes per chip: 32 B each (4 chips)' in text
    grid = layout.chip_grid()
    assert [[grid.planes[0].at(x, y).label for x in range(2)] for y in range(2)] == [
        ['0', '0'],
        ['1', '1'],
    ]
    assert grid.planes[0].at(1, 0).process == 1
    cpu = Layout.from_placements((2,), 'float32', [([(0, 2)], 0, 0)])
    assert cpu.chip_grid() is None and not cpu.has_chips and cpu.hardware_text() == ''
