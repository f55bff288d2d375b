"""The fingerprint's VMEM pack of small leaves (`pallas.vmem_bits`), compiled for a TPU v5e
here (libtpu, no chip): Mosaic's rules hold (a kernel that captured an array traced in
interpret mode, which the other tests use, yet failed on the chip, and its leaves fell back to
host copies unnoticed). The DMA pack is not compiled here: its lowering asks the local device
for the chip's memory spaces. Whether their bits survive is the chip's to say:
`bench/tpu_fingerprints.py`'s exactness section."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import pytest
from _helpers import libtpu_mark

from multihost._checks.fingerprint import pallas

pytestmark = libtpu_mark()


def _compiled_for_a_v5e(program, dtype, shape, k):
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu')
    one = jax.sharding.SingleDeviceSharding(topo.devices[0])
    specs = tuple(jax.ShapeDtypeStruct(shape, dtype, sharding=one) for _ in range(k))
    return program.trace(specs).lower(lowering_platforms=('tpu',)).compile().as_text()


@pytest.mark.parametrize(
    'dtype, shape',
    [(jnp.bfloat16, (8, 64)), (ml_dtypes.float8_e4m3fn, (2, 32, 64))],
    ids=['bfloat16', 'float8_e4m3fn'],
)
def test_the_vmem_pack_compiles_for_a_v5e_into_one_kernel(dtype, shape):
    text = _compiled_for_a_v5e(pallas.vmem_bits, dtype, shape, 3)
    assert text.count('custom_call_target="tpu_custom_call"') == 1, text
