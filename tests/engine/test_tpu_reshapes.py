"""The kernel's reads (`layout.read_layout`), compiled for a TPU v5e here (libtpu, no chip):
every block the Pallas kernel reads reaches it through ``bitcast``s only (the tiles stay in
memory: nothing moves through the vector units, which rewrote bfloat16 NaN payloads and
subnormals on the chip), in the layout XLA gives such an array on the chip. A leaf stored
transposed is read in its stored order; merging leading axes and a vector's rows of 128 are
bitcasts. `bench/tpu_reshapes.py` prints the reshape cases."""

from __future__ import annotations

import importlib.util
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import pytest

from multihost._checks.fingerprint import layout, xla

HAVE_LIBTPU = importlib.util.find_spec('libtpu') is not None
pytestmark = [
    pytest.mark.skipif(
        not HAVE_LIBTPU, reason="libtpu is not installed (the test extra's, Python 3.11)"
    ),
    pytest.mark.release,
]
#: An HLO instruction line: ``[ROOT] %name = type op(``: its type and op.
_LINE = re.compile(r'\s*(?:ROOT\s+)?%\S+\s*=\s*(\S+)\s+([a-z][\w-]*)\(')


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
    return [m.group(2) for m in map(_LINE.match, compiled.as_text().splitlines()) if m]


@pytest.mark.parametrize('shape', [(64, 32, 256), (8, 96, 768), (4, 16, 128)])
def test_merging_leading_axes_is_a_bitcast_on_a_tpu(shape):
    target = layout.read_layout(ml_dtypes.bfloat16, shape, True).shape
    assert target == (shape[0] * shape[1], shape[2])
    ops = _ops(shape, target)
    assert 'bitcast' in ops and 'reshape' not in ops, ops


def test_a_relayout_shows_as_a_reshape_op():
    """The probe's other side: (32, 768) to 1-D changed 309 bfloat16 values on the chip."""
    assert 'reshape' in _ops((32, 768), (24576,))


#: Leaf shapes: a flax transformer's (768, 8, 96) attention kernels (stored (8, 96, 768)),
#: arrays XLA stores transposed ((4096, 64), (1000, 5), (512, 8, 64), a conv kernel), ones
#: in C order, vectors, and ones read from host copies (to check `plan` says so).
SHAPES = [(768, 8, 96), (8, 96, 768), (64, 32, 256), (4096, 64), (100, 200), (1000, 5),
          (512, 8, 64), (4, 16, 128), (1024, 3, 3, 64), (3, 3, 64, 128), (1 << 20,), (2176,),
          (300, 16, 8)]  # fmt: skip
_HLO = {'bfloat16': 'bf16', 'float8_e5m2': 'f8e5m2', 'float8_e4m3fn': 'f8e4m3fn', 'float32': 'f32'}


@pytest.mark.parametrize('dt', [jnp.bfloat16, jnp.float8_e5m2, jnp.float8_e4m3fn, jnp.float32],
                         ids=lambda d: jnp.dtype(d).name)  # fmt: skip
def test_every_block_the_kernel_reads_reaches_it_by_bitcasts_only(dt):
    """The program that reads a whole leaf (`xla.pallas_out`), compiled for a v5e
    with the leaf in XLA's layout there: no instruction makes a value of the leaf's dtype
    but the parameter and bitcasts (a copy, transpose or reshape kernel would be a
    relayout). Before the stored order, (768, 8, 96) and (4096, 64) went through one."""
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu')
    sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
    read = 0
    for shape in SHAPES:
        spec = jax.ShapeDtypeStruct(shape, dt, sharding=sharding)
        probe = jax.jit(lambda v: v).trace(spec).lower(lowering_platforms=('tpu',)).compile()
        order = tuple(probe.input_formats[0][0].layout.major_to_minor)
        how = layout.read_layout(dt, shape, True, order)
        if how is None:
            continue  # read from host copies
        read += 1
        strides = xla.c_strides(shape)
        compiled = (
            xla.pallas_out.trace(spec, None, strides, True, False, how)
            .lower(lowering_platforms=('tpu',))
            .compile()
        )
        name = _HLO[jnp.dtype(dt).name] + '['
        ops = {m.group(2) for m in map(_LINE.match, compiled.as_text().splitlines())
               if m and m.group(1).startswith(name)}  # fmt: skip
        assert ops <= {'parameter', 'bitcast'}, (shape, order, ops)
    assert read >= 7
