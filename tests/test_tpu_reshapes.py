"""The whole-leaf reshapes `_raw_lanes.plan` asks for, compiled for a TPU v5e here (libtpu,
no chip): merging a leaf's leading axes is a ``bitcast`` in XLA (the tiles stay in memory:
nothing moves through the vector units, which rewrite bfloat16 NaN payloads and subnormals
on the chip). `bench/tpu_reshapes.py` prints every case, the 2-D rows copies included."""

from __future__ import annotations

import importlib.util
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import pytest

from multihost._checks import _raw_lanes

HAVE_LIBTPU = importlib.util.find_spec('libtpu') is not None
pytestmark = pytest.mark.skipif(
    not HAVE_LIBTPU, reason="libtpu is not installed (the test extra's, Python 3.11)"
)
_OP = re.compile(r'\s*(?:ROOT\s+)?%\S+\s*=\s*\S+\s+([a-z][\w-]*)\(')


def _ops(shape: tuple[int, ...], target: tuple[int, ...]) -> list[str]:
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu')
    spec = jax.ShapeDtypeStruct(
        shape, jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(topo.devices[0])
    )
    compiled = (
        jax.jit(lambda v: v.reshape(target))
        .trace(spec)
        .lower(lowering_platforms=('tpu',))
        .compile()
    )
    return [m.group(1) for m in map(_OP.match, compiled.as_text().splitlines()) if m]


@pytest.mark.parametrize('shape', [(64, 32, 256), (8, 96, 768), (4, 16, 128)])
def test_merging_leading_axes_is_a_bitcast_on_a_tpu(shape):
    target = _raw_lanes.plan(ml_dtypes.bfloat16, shape, True)
    assert target == (shape[0] * shape[1], shape[2])
    ops = _ops(shape, target)
    assert 'bitcast' in ops and 'reshape' not in ops, ops


def test_a_relayout_shows_as_a_reshape_op():
    """The probe's other side: (32, 768) to 1-D changed 309 bfloat16 values on the chip."""
    assert 'reshape' in _ops((32, 768), (24576,))
