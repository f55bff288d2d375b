"""A Session's data tools while a recorded launch runs: host copies, no device queue (issue 46).

2 real processes x 2 CPU devices, the accelerator path forced (``MULTIHOST_FINGERPRINT=
device``: fingerprints by the device kernel, as on a TPU). Each host's device is busy with a
long watched launch (seconds of matmuls, dispatched asynchronously). The engine functions a
notebook calls (`multihost.engine`: diff, layout, nonfinite, memory census) on a global array
that is ready answer while that launch still runs, reading host copies (a device program
would wait for it: the tools then ended after it); its unfinished output is named, with the
launch, on every host at once.
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import host_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost.engine import calls

MP_CLUSTER = dict(n=2, devices_per_process=2)
MP_CLUSTER_ENV = {'MULTIHOST_FINGERPRINT': 'device'}
multiprocess = pytest.mark.multiprocess
# Release rotation; covered on every landing by the tools reading host copies on one process:
# tests/engine/test_hostreads.py; a recorded launch's output named:
# tests/engine/test_launch_tracking.py
pytestmark = pytest.mark.release

LONG = 6000  # iterations of the long launch's loop: many seconds here


@partial(jax.jit, static_argnums=1)
def _busy(s: jax.Array, iters: int) -> jax.Array:
    m = jnp.eye(s.shape[0], dtype=s.dtype) * 0.5

    def body(c):
        i, v = c
        return i + 1, v @ m + 0.5

    return jax.lax.while_loop(lambda c: c[0] < iters, body, (0, s))[1]


@multiprocess
def test_the_tools_answer_while_a_recorded_launch_runs_and_name_its_output():
    mesh = host_mesh()
    full = np.arange(64, dtype=np.float32).reshape(8, 8)
    full[5, 1] = np.inf
    # Sharded over hosts, replicated over each host's devices: blocks compared, replicas too.
    x = jax.make_array_from_callback((8, 8), NamedSharding(mesh, P('host')), lambda i: full[i])
    x.block_until_ready()
    busy = multihost.watch(_busy, name='long_step')
    seed = jnp.ones((384, 384), jnp.float32).block_until_ready()
    busy(seed, 1).block_until_ready()  # compiled first
    out = busy(seed, LONG)
    assert not out.is_ready()
    ns = {'x': x, 'out': out}
    took = {}
    t0 = time.monotonic()
    diff = calls.diff(ns, 'x', timeout=60)
    took['diff'] = time.monotonic() - t0
    assert diff.ok, diff
    t0 = time.monotonic()
    described, report = calls.layout(ns, 'x')
    took['layout'] = time.monotonic() - t0
    assert report is not None and report.ok and described.shape == (8, 8), report
    t0 = time.monotonic()
    found = calls.nonfinite(ns, 'x', timeout=60)
    took['nonfinite'] = time.monotonic() - t0
    assert sum(s.inf for s in found.shards) == 2 and {s.first for s in found.shards} == {(5, 1)}
    t0 = time.monotonic()
    census = calls.memory_census(ns, timeout=60)
    took['census'] = time.monotonic() - t0
    assert len(census.hosts) == 2
    t0 = time.monotonic()
    with pytest.raises((multihost.HostFailedError, calls.GatherError)) as e:
        calls.diff(ns, 'out', timeout=60)
    took['not ready'] = time.monotonic() - t0
    assert 'output of a launch that has not finished' in str(e.value), e.value
    assert 'long_step call #1' in str(e.value), e.value
    # All of it while the long launch still ran (a device program would have waited for it).
    assert not out.is_ready(), took
    out.block_until_ready()
