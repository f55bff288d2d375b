"""docs/API.md §2 row by row, on 4 real JAX processes x 2 CPU devices; the conversions
under jit and vmap against JAX's own (§3, item 13).

Each ``multiprocess`` test body runs in every process; a body passes only if
it passes in all four.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import flat_mesh, host_mesh
from jax.experimental import multihost_utils as jax_multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
import multihost as multihost_utils

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


class _Compiles:
    """Counts XLA backend compilations (public jax.monitoring events)."""

    EVENT = '/jax/core/compile/backend_compile_duration'

    def __enter__(self):
        self.count = 0

        def listener(event, duration, **kwargs):
            if event == self.EVENT:
                self.count += 1

        self._listener = listener
        jax.monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


# -- broadcast_one_to_all ------------------------------------------------------


@multiprocess
def test_broadcast_takes_process_0_data():
    """Every host gets process 0's leaf back, as numpy."""
    out = multihost_utils.broadcast_one_to_all(np.arange(4) + jax.process_index() * 4)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.arange(4))


@multiprocess
def test_broadcast_pytree_uint8_and_scalar():
    """Pytrees broadcast leaf by leaf; uint8 stays uint8; scalars work."""
    pid = jax.process_index()
    x = np.arange(6, dtype=np.uint8).reshape(2, 3) + pid
    out = multihost_utils.broadcast_one_to_all({'a': (x, x), 's': np.float32(pid + 0.5)})
    assert out['a'][0].dtype == np.uint8
    np.testing.assert_array_equal(out['a'][0], np.arange(6, dtype=np.uint8).reshape(2, 3))
    np.testing.assert_array_equal(out['a'][1], out['a'][0])
    assert out['s'].shape == () and out['s'] == np.float32(0.5)


@multiprocess
def test_broadcast_from_chosen_source():
    """is_source picks the contributing host."""
    pid = jax.process_index()
    out = multihost_utils.broadcast_one_to_all(np.full(3, pid), is_source=pid == 2)
    np.testing.assert_array_equal(out, np.full(3, 2))


@multiprocess
def test_broadcast_ignores_user_mesh_context():
    """A user `jax.set_mesh` does not change the result."""
    with jax.set_mesh(flat_mesh()):
        out = multihost_utils.broadcast_one_to_all(np.arange(4) * (jax.process_index() + 1))
    np.testing.assert_array_equal(out, np.arange(4))


# -- sync_global_devices ---------------------------------------------------------


@multiprocess
def test_sync_global_devices_passes_with_same_name():
    """Same name on every host: the barrier passes, also inside a mesh context."""
    multihost_utils.sync_global_devices('same')
    with jax.set_mesh(host_mesh()):
        multihost_utils.sync_global_devices('same again')


@multiprocess
def test_sync_global_devices_name_mismatch_raises_on_every_host():
    """Host 0 passes a different name: every host raises AssertionError."""
    name = 'test message' if jax.process_index() == 0 else 'test message2'
    with pytest.raises(AssertionError, match='sync_global_devices name mismatch'):
        multihost_utils.sync_global_devices(name)
    # The sequence stays aligned: the next barrier works.
    multihost_utils.sync_global_devices('after mismatch')


# -- process_allgather -----------------------------------------------------------


@multiprocess
def test_allgather_stacked_shapes():
    """tiled=False stacks: (n, *shape) for numpy, jax arrays and scalars."""
    pid, n = jax.process_index(), jax.process_count()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + pid
    out = multihost_utils.process_allgather(x)
    assert isinstance(out, np.ndarray) and out.shape == (n, 2, 3)
    np.testing.assert_array_equal(out, np.stack([x - pid + i for i in range(n)]))
    out = multihost_utils.process_allgather(jnp.asarray(x))
    assert isinstance(out, np.ndarray) and out.shape == (n, 2, 3)
    out = multihost_utils.process_allgather(np.int32(pid))
    assert out.shape == (n,)
    np.testing.assert_array_equal(out, np.arange(n))
    out = multihost_utils.process_allgather(jnp.float32(pid))
    assert out.shape == (n,)


@multiprocess
def test_allgather_tiled_shapes():
    """tiled=True concatenates on axis 0; scalars are still stacked."""
    pid, n = jax.process_index(), jax.process_count()
    x = np.arange(6).reshape(2, 3) + 10 * pid
    out = multihost_utils.process_allgather(x, tiled=True)
    assert out.shape == (2 * n, 3)
    np.testing.assert_array_equal(out, np.concatenate([x - 10 * pid + 10 * i for i in range(n)]))
    out = multihost_utils.process_allgather(jnp.asarray(x), tiled=True)
    assert out.shape == (2 * n, 3)
    out = multihost_utils.process_allgather(np.float32(pid), tiled=True)
    assert out.shape == (n,)


@multiprocess
def test_allgather_pytree_and_uint8():
    """Pytrees gather leaf by leaf; dtypes are kept."""
    pid, n = jax.process_index(), jax.process_count()
    tree = {'u8': np.full((2,), pid, np.uint8), 'pair': (np.float32(pid), np.arange(3) + pid)}
    out = multihost_utils.process_allgather(tree)
    assert out['u8'].dtype == np.uint8 and out['u8'].shape == (n, 2)
    np.testing.assert_array_equal(out['u8'][:, 0], np.arange(n))
    assert out['pair'][0].shape == (n,)
    assert out['pair'][1].shape == (n, 3)


@multiprocess
def test_allgather_global_array_needs_tiled():
    """A non-fully-addressable array gathers to its global value with tiled=True only."""
    mesh = host_mesh()
    global_value = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    arr = jax.make_array_from_callback(
        global_value.shape, NamedSharding(mesh, P('host', 'dev')), lambda i: global_value[i]
    )
    assert not arr.is_fully_addressable
    np.testing.assert_array_equal(multihost_utils.process_allgather(arr, tiled=True), global_value)
    with pytest.raises(ValueError, match='only supports tiled=True'):
        multihost_utils.process_allgather(arr, tiled=False)


@multiprocess
def test_allgather_compiles_once_for_same_shape():
    """Large gathers compile once per shape/dtype; small ones never reach the compiler."""
    from multihost._core import _collectives

    pid = jax.process_index()
    big = _collectives.SMALL_EXCHANGE_BYTES // 4  # float32 elements per host: above the limit
    multihost_utils.process_allgather(np.zeros(big, np.float32) + pid)  # warm
    with _Compiles() as c:
        multihost_utils.process_allgather(np.ones(big, np.float32) + pid)
        multihost_utils.process_allgather(np.ones(big, np.float32) * pid)
    assert c.count == 0, f'{c.count} compilations for repeated same-shape gathers'
    with _Compiles() as c:
        out = multihost_utils.process_allgather(np.ones((big // 2, 8), np.int8))
        multihost_utils.process_allgather(np.zeros((big // 2, 8), np.int8))
    assert c.count == 1, f'{c.count} compilations for a new shape gathered twice'
    assert out.shape == (jax.process_count(), big // 2, 8) and out.dtype == np.int8
    with _Compiles() as c:
        small = multihost_utils.process_allgather(np.full((3, 2), pid, np.int64))
    assert c.count == 0
    assert small.dtype == np.int32  # as a device transfer would give (x64 off)
    np.testing.assert_array_equal(small[:, 0, 0], np.arange(jax.process_count()))


@multiprocess
def test_small_and_large_paths_agree():
    """The key-value path for small data and the device path give identical results."""
    from multihost._core import _collectives

    pid, n = jax.process_index(), jax.process_count()
    big = _collectives.SMALL_EXCHANGE_BYTES // 4
    for size in (6, big):
        x = (np.arange(size, dtype=np.float32) * (pid + 1)).reshape(-1, 2)
        stacked = multihost_utils.process_allgather({'x': x, 's': np.float32(pid)})
        np.testing.assert_array_equal(
            stacked['x'], np.stack([x / (pid + 1) * (i + 1) for i in range(n)])
        )
        np.testing.assert_array_equal(stacked['s'], np.arange(n, dtype=np.float32))
        tiled = multihost_utils.process_allgather(x, tiled=True)
        assert tiled.shape == (n * x.shape[0], 2)
        b = multihost_utils.broadcast_one_to_all((x, np.uint8(pid + 7)), is_source=pid == 1)
        np.testing.assert_array_equal(b[0], x / (pid + 1) * 2)
        assert b[1].dtype == np.uint8 and b[1] == 8


@multiprocess
def test_allgather_ignores_user_mesh_context():
    """A user `jax.set_mesh` does not change the result."""
    pid, n = jax.process_index(), jax.process_count()
    with jax.set_mesh(flat_mesh()):
        out = multihost_utils.process_allgather(np.arange(2) + pid, tiled=True)
    np.testing.assert_array_equal(out, np.concatenate([np.arange(2) + i for i in range(n)]))


# -- assert_equal ------------------------------------------------------------------


@multiprocess
def test_assert_equal_passes_on_equal_trees():
    """Equal trees (numpy, jax, scalars, global arrays) pass on every host."""
    mesh = host_mesh()
    glob = jax.make_array_from_callback(
        (4, 2), NamedSharding(mesh, P()), lambda i: np.ones((4, 2))[i]
    )
    multihost_utils.assert_equal({'a': np.arange(5), 'b': jnp.ones(3), 'c': 7, 'g': glob})


@multiprocess
def test_assert_equal_raises_on_every_host_with_fail_message():
    """One host differs: every host raises AssertionError starting with fail_message."""
    x = np.arange(5) + (1 if jax.process_index() == 3 else 0)
    with pytest.raises(AssertionError) as info:
        multihost_utils.assert_equal({'w': x, 'b': np.zeros(2)}, fail_message='weights diverged')
    assert str(info.value).startswith('weights diverged')


# -- host_local_array_to_global_array ------------------------------------------------


@multiprocess
def test_local_to_global_sharded_over_hosts():
    """P('x') over all 8 devices: global = host blocks concatenated in process order."""
    mesh, pid, n = flat_mesh(), jax.process_index(), jax.process_count()
    arr = multihost_utils.host_local_array_to_global_array(np.arange(4) * pid, mesh, P('x'))
    assert arr.shape == (4 * n,)
    assert arr.sharding == NamedSharding(mesh, P('x'))
    full = multihost_utils.process_allgather(arr, tiled=True)
    np.testing.assert_array_equal(full, np.concatenate([np.arange(4) * i for i in range(n)]))


@multiprocess
def test_local_to_global_locally_replicated_host_pattern():
    """P('host', None): each host's slice is replicated over that host's devices."""
    mesh, pid, n = host_mesh(), jax.process_index(), jax.process_count()
    local = np.arange(8).reshape(4, 2) * (pid + 1)
    arr = multihost_utils.host_local_array_to_global_array(local, mesh, P('host', None))
    assert arr.shape == (4 * n, 2)
    for shard in arr.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), local)
    full = multihost_utils.process_allgather(arr, tiled=True)
    np.testing.assert_array_equal(
        full, np.concatenate([np.arange(8).reshape(4, 2) * (i + 1) for i in range(n)])
    )


@multiprocess
def test_local_to_global_two_axes_and_replicated():
    """P('host', 'dev') splits within a process too; P() keeps the shape and replicates."""
    mesh, pid = host_mesh(), jax.process_index()
    local = np.arange(4 * 6).reshape(4, 6) + 100 * pid
    arr = multihost_utils.host_local_array_to_global_array(local, mesh, P('host', 'dev'))
    assert arr.shape == (4 * jax.process_count(), 6)
    assert {s.data.shape for s in arr.addressable_shards} == {(4, 3)}
    rep = multihost_utils.host_local_array_to_global_array(np.arange(3.0), mesh, P())
    assert rep.shape == (3,) and rep.sharding.is_fully_replicated
    np.testing.assert_array_equal(
        multihost_utils.process_allgather(rep, tiled=True), np.arange(3.0)
    )


@multiprocess
def test_local_to_global_none_pspec_errors_both_ways():
    """pspecs=None is rejected by both conversions with JAX's message."""
    mesh = host_mesh()
    with pytest.raises(ValueError, match='`None` is not a valid input to the pspecs argument'):
        multihost_utils.host_local_array_to_global_array(np.arange(4), mesh, None)
    arr = multihost_utils.host_local_array_to_global_array(np.arange(4), mesh, P('host'))
    with pytest.raises(ValueError, match='`None` is not a valid input to the pspecs argument'):
        multihost_utils.global_array_to_host_local_array(arr, mesh, None)
    with pytest.raises(ValueError, match='`None` is not a valid input to the pspecs argument'):
        multihost_utils.host_local_array_to_global_array([np.arange(4)], mesh, [None])


@multiprocess
def test_local_to_global_returns_global_input_as_is():
    """An already-global, non-fully-addressable input comes back as the same object."""
    mesh = host_mesh()
    arr = multihost_utils.host_local_array_to_global_array(np.arange(4), mesh, P('host'))
    again = multihost_utils.host_local_array_to_global_array(arr, mesh, P('host'))
    assert again is arr


@multiprocess
def test_local_to_global_zero_copy_when_already_sharded_like_target():
    """An input sharded like the local target keeps its device buffers (same pointers)."""
    mesh = host_mesh()
    local_sharding = NamedSharding(mesh.local_mesh, P('dev'))
    x = jax.device_put(np.arange(8.0) + jax.process_index(), local_sharding)
    before = {s.device.id: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
    arr = multihost_utils.host_local_array_to_global_array(x, mesh, P('dev'))
    after = {s.device.id: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}
    assert before == after


@multiprocess
def test_local_to_global_pytree_of_pspecs_and_prefix():
    """Pspecs can be a pytree matching the inputs, or a prefix of them."""
    mesh, n = host_mesh(), jax.process_count()
    out = multihost_utils.host_local_array_to_global_array(
        {'a': np.zeros((2, 2)), 'b': np.zeros(3)}, mesh, {'a': P('host'), 'b': P()}
    )
    assert out['a'].shape == (2 * n, 2) and out['b'].shape == (3,)
    out = multihost_utils.host_local_array_to_global_array(
        (np.zeros(2), np.zeros(4)), mesh, P('host')
    )
    assert [o.shape for o in out] == [(2 * n,), (4 * n,)]


@multiprocess
def test_prng_keys_and_float0_convert():
    """PRNG key arrays keep their key dtype; float0 becomes bool, as in JAX."""
    mesh, n = host_mesh(), jax.process_count()
    keys = jax.random.split(jax.random.key(jax.process_index()), 2)
    g = multihost_utils.host_local_array_to_global_array(keys, mesh, P('host'))
    assert g.shape == (2 * n,) and jax.dtypes.issubdtype(g.dtype, jax.dtypes.prng_key)
    back = multihost_utils.global_array_to_host_local_array(g, mesh, P('host'))
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(keys))
    f0 = np.zeros((2,), dtype=jax.dtypes.float0)
    g0 = multihost_utils.host_local_array_to_global_array(f0, mesh, P('host'))
    assert g0.dtype == np.bool_ and g0.shape == (2 * n,)


@multiprocess
def test_round_trip_local_global_local():
    """local -> global -> local gives back each host's data."""
    mesh, pid = host_mesh(), jax.process_index()
    local = np.arange(16, dtype=np.float32).reshape(4, 4) - pid
    g = multihost_utils.host_local_array_to_global_array(local, mesh, P('host', 'dev'))
    back = multihost_utils.global_array_to_host_local_array(g, mesh, P('host', 'dev'))
    assert back.is_fully_addressable and back.shape == local.shape
    np.testing.assert_array_equal(np.asarray(back), local)
    g2 = multihost_utils.host_local_array_to_global_array(back, mesh, P('host', 'dev'))
    np.testing.assert_array_equal(
        multihost_utils.process_allgather(g2, tiled=True),
        multihost_utils.process_allgather(g, tiled=True),
    )


@multiprocess
def test_non_contiguous_mesh_is_a_clear_error():
    """A mesh where a host's devices are not a sub-cube: ValueError naming the fix."""
    devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    order = [0, 2, 1, 3] + list(range(4, len(devs)))  # processes 0 and 1 interleaved
    mesh = Mesh(np.array([devs[i] for i in order]), ('a',))
    with pytest.raises(ValueError, match='not contiguous') as info:
        multihost_utils.host_local_array_to_global_array(np.arange(4), mesh, P('a'))
    assert 'jax.make_array_from_callback' in str(info.value)
    assert 'jax.make_array_from_single_device_arrays' in str(info.value)


# -- global_array_to_host_local_array -----------------------------------------------


@multiprocess
def test_global_to_local_shape_and_data():
    """Global (8, 2) sharded P('x', 'y') viewed through P('x') gives a (2, 2) local array."""
    devices = np.array(jax.devices()).reshape(4, 2)
    mesh = Mesh(devices, ('x', 'y'))
    value = np.arange(16).reshape(8, 2)
    g = jax.make_array_from_callback((8, 2), NamedSharding(mesh, P('x', 'y')), lambda i: value[i])
    local = multihost_utils.global_array_to_host_local_array(g, mesh, P('x'))
    assert local.shape == (2, 2) and local.is_fully_addressable
    pid = jax.process_index()
    np.testing.assert_array_equal(np.asarray(local), value[2 * pid : 2 * pid + 2])


@multiprocess
def test_global_to_local_fully_addressable_returned_as_is():
    """A host-local input is returned unchanged (same object)."""
    x = jnp.arange(4)
    assert multihost_utils.global_array_to_host_local_array(x, host_mesh(), P()) is x


@multiprocess
def test_global_to_local_zero_copy():
    """Already sharded like the target: the local array reuses the device buffers."""
    mesh = host_mesh()
    g = multihost_utils.host_local_array_to_global_array(
        np.arange(8.0),
        mesh,
        P(
            'host',
        ),
    )
    before = {s.device.id: s.data.unsafe_buffer_pointer() for s in g.addressable_shards}
    local = multihost_utils.global_array_to_host_local_array(g, mesh, P('host'))
    after = {s.device.id: s.data.unsafe_buffer_pointer() for s in local.addressable_shards}
    assert before == after


# -- traced conversions: under jit, vmap and grad, exactly what JAX's give ---------------

_SPECS = [P(), P('dev'), P('host'), P('host', 'dev'), P(None, 'dev')]


def _outcome(fn):
    """What ``fn()`` gives, comparable across implementations: its error type, or the
    result's shape, dtype, sharding, addressability and every local shard's data."""
    try:
        out = jax.block_until_ready(fn())
    except Exception as exc:  # the same failure counts as the same outcome
        return ('error', type(exc).__name__)
    shards = sorted((s.device.id, np.asarray(s.data).tolist()) for s in out.addressable_shards)
    return ('ok', out.shape, str(out.dtype), out.sharding, out.is_fully_addressable, shards)


def _both(make):
    """``make(module)`` run with multihost and with jax.experimental.multihost_utils."""
    return _outcome(lambda: make(multihost)), _outcome(lambda: make(jax_multihost_utils))


@multiprocess
def test_conversions_under_jit_match_jax():
    """Under jax.jit both conversions bind JAX's primitives: same results, same failures."""
    mesh, pid = host_mesh(), jax.process_index()
    local = np.arange(8, dtype=np.float32).reshape(4, 2) + 100 * pid
    succeeded = set()
    for spec in _SPECS:
        ours, theirs = _both(
            lambda m, spec=spec: jax.jit(
                lambda x: m.host_local_array_to_global_array(x * 2, mesh, spec)
            )(local)
        )
        assert ours == theirs, ('to global', spec)
        g = multihost.host_local_array_to_global_array(local, mesh, spec)
        ours, theirs = _both(
            lambda m, spec=spec, g=g: jax.jit(
                lambda x: m.global_array_to_host_local_array(x * 2, mesh, spec)
            )(g)
        )
        assert ours == theirs, ('to local', spec)
        if ours[0] == 'ok':
            succeeded.add(spec)
    assert {P(), P('dev'), P(None, 'dev')} <= succeeded  # not only equal failures

    # Tracing alone (no lowering): the global shape JAX's abstract evaluation gives.
    def to_global(m):
        convert = m.host_local_array_to_global_array
        return jax.eval_shape(lambda x: convert(x, mesh, P('host')), local)

    assert to_global(multihost) == to_global(jax_multihost_utils)
    assert to_global(multihost).shape == (4 * jax.process_count(), 2)
    jaxpr = str(
        jax.make_jaxpr(lambda x: multihost.host_local_array_to_global_array(x, mesh, P('host')))(
            local
        )
    )
    assert 'host_local_array_to_global_array' in jaxpr


@multiprocess
def test_conversions_under_vmap_match_jax():
    """Under jax.vmap (batch axis 0 or 1, and inside jit) and jax.grad: JAX's results."""
    mesh, pid = host_mesh(), jax.process_index()
    local = np.arange(16, dtype=np.float32).reshape(4, 4) + 100 * pid
    succeeded = 0
    for spec in [P(), P('host'), P('dev'), P(('host', 'dev'))]:  # per example: 1-D
        g = multihost.host_local_array_to_global_array(local, mesh, spec)
        for axis in (0, 1):
            for wrap in (lambda f: f, jax.jit):
                ours, theirs = _both(
                    lambda m, spec=spec, axis=axis, wrap=wrap: wrap(
                        jax.vmap(
                            lambda x: m.host_local_array_to_global_array(x, mesh, spec),
                            in_axes=axis,
                        )
                    )(local)
                )
                assert ours == theirs, ('to global', spec, axis, wrap)
                succeeded += ours[0] == 'ok'
            ours, theirs = _both(
                lambda m, spec=spec, axis=axis, g=g: jax.vmap(
                    lambda x: m.global_array_to_host_local_array(x, mesh, spec), in_axes=axis
                )(g)
            )
            assert ours == theirs, ('to local', spec, axis)
            succeeded += ours[0] == 'ok'
    assert succeeded >= 8  # not only equal failures
    ours, theirs = _both(
        lambda m: jax.grad(lambda x: m.host_local_array_to_global_array(x, mesh, P()).sum())(
            jnp.arange(3.0)
        )
    )
    assert ours == theirs and ours[0] == 'ok'


# -- live_devices ----------------------------------------------------------------------


@multiprocess
def test_live_devices_yields_every_device():
    """With every process alive, live_devices yields all devices, sorted by id."""
    with multihost_utils.live_devices(jax.devices()) as devices:
        assert devices == sorted(jax.devices(), key=lambda d: d.id)


def test_drop_in_surface_matches_jax():
    """Every public name of JAX's multihost_utils exists here, with a compatible signature."""
    import inspect

    from jax.experimental import multihost_utils as jmu

    names = [
        'broadcast_one_to_all',
        'sync_global_devices',
        'process_allgather',
        'assert_equal',
        'host_local_array_to_global_array',
        'global_array_to_host_local_array',
        'reached_preemption_sync_point',
        'live_devices',
        'ProcessFailureError',
    ]
    for name in names:
        ours, theirs = getattr(multihost, name), getattr(jmu, name)
        if inspect.isfunction(theirs):
            p_ours = list(inspect.signature(ours).parameters.values())
            p_theirs = list(inspect.signature(theirs).parameters.values())
            assert [p.name for p in p_ours[: len(p_theirs)]] == [p.name for p in p_theirs], name
            for p in p_ours[len(p_theirs) :]:
                assert p.kind == p.KEYWORD_ONLY, (
                    f'{name}: extra argument {p.name} must be keyword-only'
                )
