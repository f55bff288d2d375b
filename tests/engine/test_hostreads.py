"""Host copies (`_checks._hostreads`) in one process, 4 CPU devices: the same digests, no wait.

Inside `_recorder.reading_host_copies` fingerprints come from host copies of each block by
the kernel's numpy implementation: the same bytes as the device path, for every dtype class
and sharding (blocks at offsets, replicas skipped), so hosts on either path compare. A value
that is not ready (a launch in flight makes it) is named, not waited for.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost import _recorder
from multihost._checks import _hostreads, _nonfinite
from multihost._checks import fingerprint as _fingerprint


@pytest.fixture(autouse=True)
def fresh_recorder():
    _recorder.reset()
    yield
    _recorder.reset()


def _leaves() -> list[jax.Array]:
    devices = np.array(jax.devices()[:4])
    rows = NamedSharding(Mesh(devices, ('d',)), P('d'))
    grid = NamedSharding(Mesh(devices.reshape(2, 2), ('a', 'b')), P('a', 'b'))
    half = NamedSharding(Mesh(devices.reshape(2, 2), ('a', 'b')), P(None, 'a'))  # replicas
    rng = np.random.default_rng(3)
    out = []
    for dtype in (np.float32, ml_dtypes.bfloat16, np.int8, np.complex64, np.bool_):
        base = rng.standard_normal((8, 12)) * 40
        if dtype is np.complex64:
            base = base + 1j * rng.standard_normal((8, 12))
        a = base.astype(dtype)
        for sharding in (rows, grid, half):
            out.append(jax.device_put(a, sharding))
    out.append(jnp.arange(7, dtype=jnp.int32))  # one device
    out.append(jnp.zeros((0, 3)))  # empty
    return out


def test_host_copies_give_the_device_kernels_bytes_for_every_dtype_and_sharding():
    leaves = _leaves()
    on_device = _fingerprint.fingerprints(leaves)
    with _recorder.reading_host_copies():
        copied = _fingerprint.fingerprints(leaves)
        digests = _fingerprint.digests(leaves, 'device')
    assert copied == on_device
    assert digests == [b.hex() for b in on_device]


def test_a_value_a_launch_in_flight_makes_is_named_with_the_launch_not_waited_for():
    @jax.jit
    def long_step(s, iters):
        def body(c):
            i, v = c
            return i + 1, v @ (jnp.eye(v.shape[0]) * 0.5) + 0.5

        return jax.lax.while_loop(lambda c: c[0] < iters, body, (0, s))[1]

    step = multihost.watch(long_step, name='long_step')
    seed = jnp.ones((512, 512)).block_until_ready()
    step(seed, 1).block_until_ready()
    ready = jnp.arange(16.0).at[3].set(jnp.nan).block_until_ready()
    out = step(seed, 600)
    t0 = time.monotonic()
    with _recorder.reading_host_copies():
        assert _hostreads.unready(ready, 'ready') is None
        why = _hostreads.unready({'w': out}, 'state')
        with pytest.raises(_hostreads.NotReadyError, match='long_step call #1'):
            _fingerprint.digests([out], 'device')
        report = _nonfinite.nonfinite({'x': ready})
    took = time.monotonic() - t0
    assert not out.is_ready(), f'the launch ended first ({took:.2f} s): nothing was shown'
    assert why is not None and why.startswith("state['w'] is the output of a launch that"), why
    assert 'in flight here: long_step call #1' in why, why
    assert [(s.nan, s.first) for s in report.shards] == [(1, (3,))]
    out.block_until_ready()
    donated = jnp.ones(3)
    donated.delete()
    with _recorder.reading_host_copies():
        assert 'was deleted (donated' in (_hostreads.unready(donated, 'd') or '')
