"""The single-process fast paths, run in the pytest process itself.

Here JAX is single-process with 4 CPU devices (set by conftest): every
collective must work unchanged, without a distributed runtime. Where
`jax.experimental.multihost_utils` defines the same result, it is compared
with ours.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils as jmu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
import multihost as multihost_utils

NONE_PSPEC = '`None` is not a valid input to the pspecs argument'


@pytest.fixture(autouse=True)
def _single_process():
    assert jax.process_count() == 1 and jax.device_count() == 4


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 2), ('x', 'y'))


# -- process_allgather -------------------------------------------------------------


def test_allgather_stacked_adds_axis_of_one():
    """tiled=False returns numpy of shape (1, *shape) holding the input, like JAX."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for inp in (x, jnp.asarray(x)):
        out = multihost_utils.process_allgather(inp)
        assert isinstance(out, np.ndarray) and out.shape == (1, 2, 3)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out[0], x)
        np.testing.assert_array_equal(out, jmu.process_allgather(inp))


def test_allgather_tiled_keeps_shape():
    """tiled=True returns numpy of the input's shape (a concatenation of one block), like JAX."""
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    for inp in (x, jnp.asarray(x)):
        out = multihost_utils.process_allgather(inp, tiled=True)
        assert isinstance(out, np.ndarray) and out.shape == (2, 3) and out.dtype == np.int16
        np.testing.assert_array_equal(out, x)
        np.testing.assert_array_equal(out, jmu.process_allgather(inp, tiled=True))


def test_allgather_scalars_always_stacked():
    """Scalars become shape (1,), tiled or not (docs/API.md §3, item 1: JAX's gives ())."""
    for tiled in (False, True):
        for scalar in (np.int32(7), jnp.float32(7), 7):
            out = multihost_utils.process_allgather(scalar, tiled=tiled)
            assert isinstance(out, np.ndarray) and out.shape == (1,), (scalar, tiled, out)
            assert out[0] == 7


def test_allgather_sharded_array_and_pytree():
    """A 4-device sharded array gathers to its value; pytrees keep structure and dtypes."""
    value = np.arange(32, dtype=np.float32).reshape(8, 4)
    sharded = jax.device_put(value, NamedSharding(_mesh(), P('x', 'y')))
    tree = {'w': sharded, 'u8': np.arange(3, dtype=np.uint8), 'pair': (np.bool_(True), [1.5])}
    out = multihost_utils.process_allgather(tree, tiled=True)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    np.testing.assert_array_equal(out['w'], value)
    assert out['u8'].dtype == np.uint8 and out['pair'][0].dtype == np.bool_
    assert out['pair'][0].shape == (1,) and out['pair'][1][0].shape == (1,)
    stacked = multihost_utils.process_allgather(sharded)
    assert stacked.shape == (1, 8, 4)


# -- broadcast_one_to_all / sync_global_devices / assert_equal ----------------------


def test_broadcast_returns_numpy_equal_to_input():
    """broadcast_one_to_all returns the input as numpy (dtype, shape kept), whatever is_source."""
    tree = {'a': jnp.arange(6, dtype=jnp.uint8).reshape(2, 3), 's': 2.5, 'n': np.int64(-3)}
    for is_source in (None, True, False):
        out = multihost_utils.broadcast_one_to_all(tree, is_source=is_source)
        assert jax.tree.structure(out) == jax.tree.structure(tree)
        for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
            assert isinstance(got, np.ndarray)
            assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype
            np.testing.assert_array_equal(got, np.asarray(want))
        expected = jmu.broadcast_one_to_all(tree, is_source=is_source)
        jax.tree.map(np.testing.assert_array_equal, out, expected)


def test_sync_global_devices_passes():
    """sync_global_devices returns None at once for any name, also inside a mesh context."""
    assert multihost_utils.sync_global_devices('step 1') is None
    assert multihost_utils.sync_global_devices('another name') is None
    with jax.set_mesh(_mesh()):
        assert multihost_utils.sync_global_devices('inside mesh') is None


def test_assert_equal_passes():
    """assert_equal accepts numpy, jax, scalar and sharded leaves in one process."""
    sharded = jax.device_put(np.ones((4, 4)), NamedSharding(_mesh(), P('x')))
    tree = {'a': np.arange(5), 'b': jnp.ones(3), 'c': 7, 'd': np.float32(0.5), 'g': sharded}
    assert multihost_utils.assert_equal(tree) is None
    assert multihost_utils.assert_equal(tree, fail_message='must not fail') is None


# -- host_local_array_to_global_array / global_array_to_host_local_array -----------


def test_local_global_round_trip_one_process():
    """On a 1-process mesh the global shape equals the local one and data round-trips unchanged."""
    mesh = _mesh()
    local = np.arange(32, dtype=np.float32).reshape(8, 4)
    g = multihost_utils.host_local_array_to_global_array(local, mesh, P('x', 'y'))
    assert g.shape == local.shape
    assert g.sharding == NamedSharding(mesh, P('x', 'y'))
    assert {s.data.shape for s in g.addressable_shards} == {(4, 2)}
    np.testing.assert_array_equal(np.asarray(g), local)
    back = multihost_utils.global_array_to_host_local_array(g, mesh, P('x', 'y'))
    assert back is g  # fully addressable: returned as is, as in JAX
    np.testing.assert_array_equal(np.asarray(back), local)
    from_numpy = multihost_utils.global_array_to_host_local_array(local, mesh, P('x', 'y'))
    assert from_numpy.shape == local.shape
    assert from_numpy.sharding == NamedSharding(mesh.local_mesh, P('x', 'y'))
    np.testing.assert_array_equal(np.asarray(from_numpy), local)
    rep = multihost_utils.host_local_array_to_global_array(np.arange(3.0), mesh, P())
    assert rep.shape == (3,) and rep.sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(rep), np.arange(3.0))


def test_local_to_global_reuses_buffers_of_matching_input():
    """A jax.Array already sharded like the target keeps its device buffers (zero copy)."""
    mesh = _mesh()
    x = jax.device_put(np.arange(16.0).reshape(4, 4), NamedSharding(mesh, P('x', 'y')))
    before = {s.device.id: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
    g = multihost_utils.host_local_array_to_global_array(x, mesh, P('x', 'y'))
    after = {s.device.id: s.data.unsafe_buffer_pointer() for s in g.addressable_shards}
    assert before == after


def test_none_pspec_rejected_both_ways():
    """pspecs=None (or a None leaf) raises ValueError with JAX's message, in both directions."""
    mesh = _mesh()
    x = np.arange(8.0)
    with pytest.raises(ValueError, match=re.escape(NONE_PSPEC)):
        multihost_utils.host_local_array_to_global_array(x, mesh, None)
    with pytest.raises(ValueError, match=re.escape(NONE_PSPEC)):
        multihost_utils.host_local_array_to_global_array([x], mesh, [None])
    g = multihost_utils.host_local_array_to_global_array(x, mesh, P('x'))
    with pytest.raises(ValueError, match=re.escape(NONE_PSPEC)):
        multihost_utils.global_array_to_host_local_array(g, mesh, None)
    with pytest.raises(ValueError, match=re.escape(NONE_PSPEC)):
        multihost_utils.global_array_to_host_local_array({'g': g}, mesh, {'g': None})


# -- preemption ----------------------------------------------------------------------


def test_reached_preemption_sync_point_false_without_runtime():
    """Without a distributed runtime reached_preemption_sync_point is False at every step."""
    for step in (0, 1, 7, 10_000):
        result = multihost_utils.reached_preemption_sync_point(step)
        assert result is False
        assert result == jmu.reached_preemption_sync_point(step)


# -- the public surface ----------------------------------------------------------------


def _type_checking_names() -> dict[str, tuple[str, str]]:
    """What ``multihost/__init__.py``'s ``TYPE_CHECKING`` block imports: name -> (module,
    name there), read from its source."""
    tree = ast.parse(inspect.getsource(multihost))
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and 'TYPE_CHECKING' in ast.unparse(n.test)
    )
    found = {}
    for node in ast.walk(block):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                found[alias.asname or alias.name] = (node.module, alias.name)
    return found


def _documentation(name: str) -> str:
    """The object's own docstring, or for a plain value the ``#:`` comment above its assignment."""
    obj = getattr(multihost, name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        doc = obj.__doc__ or ''  # its own: not inherited, unlike inspect.getdoc
        if inspect.isclass(obj) and doc.startswith(f'{obj.__name__}('):
            return ''  # the signature a dataclass makes up when it has no docstring
        return doc
    own = getattr(obj, '__doc__', None)
    if own and own != getattr(type(obj), '__doc__', None):
        return own  # an instance with its own docstring (e.g. live_devices)
    for modname, module in sorted(sys.modules.items()):  # the package and its rooms' modules
        if not (modname == 'multihost' or modname.startswith('multihost.')) or module is None:
            continue
        lines = inspect.getsource(module).splitlines()
        for i, line in enumerate(lines):
            if re.match(rf'{re.escape(name)}\s*(:[^=]*)?=', line):
                comment = []
                while i > 0 and lines[i - 1].startswith('#:'):
                    i -= 1
                    comment.insert(0, lines[i][2:].strip())
                if comment:
                    return ' '.join(comment)
    return ''


def test_public_surface_is_pinned_and_documented():
    """__all__ is `_HOMES`' names; the TYPE_CHECKING imports say the same; every name exists
    and is documented."""
    assert multihost.__all__ == sorted(multihost._HOMES)
    assert _type_checking_names() == multihost._HOMES
    assert len(set(multihost.__all__)) == len(multihost.__all__)
    for name in multihost.__all__:
        assert hasattr(multihost, name), name
        assert _documentation(name).strip(), f'{name} has no docstring'
    assert multihost.__doc__ and multihost.__doc__.strip()


def test_public_surface_is_in_the_api_contract():
    """Every public name appears in docs/API.md, the contract the docs site is built from."""
    api = (pathlib.Path(__file__).parent.parent.parent / 'docs' / 'API.md').read_text()
    missing = [name for name in multihost.__all__ if not re.search(rf'\b{name}\b', api)]
    assert not missing, f'not in docs/API.md: {missing}'


def test_the_version_is_written_once():
    """pyproject.toml reads multihost.__version__; the metadata and mhnotebook agree with it."""
    import importlib.metadata
    import tomllib

    import mhnotebook

    root = pathlib.Path(__file__).parent.parent.parent
    project = tomllib.loads((root / 'pyproject.toml').read_text())
    assert 'version' not in project['project'] and 'version' in project['project']['dynamic']
    assert mhnotebook.__version__ == multihost.__version__
    installed = importlib.metadata.version('mhnotebook')
    assert installed == multihost.__version__, 'stale install: pip install -e . again'


def test_process_failure_error_is_caught_by_jax_handlers():
    """Code that catches JAX's ProcessFailureError also catches ours, with the same message."""
    from jax.experimental import multihost_utils as jmu

    err = multihost.ProcessFailureError({'d0'})
    assert isinstance(err, jmu.ProcessFailureError)
    assert err.failed_devices == {'d0'}
    assert str(err) == str(jmu.ProcessFailureError({'d0'}))
