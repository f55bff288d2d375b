"""The cross-host census on 4 real processes x 2 devices: environments and memory that differ."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multihost

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


@multiprocess
def test_identical_hosts_give_an_empty_env_diff():
    diff = multihost.env_diff(timeout=60)
    assert diff.ok, diff.format()
    assert diff.entries == () and diff.odd_processes == ()
    assert diff.compared > 50
    assert 'identical' in str(diff)


@multiprocess
def test_an_xla_flag_set_on_host_1_is_named_with_host_1():
    pid = jax.process_index()
    saved = os.environ.get('XLA_FLAGS')
    if pid == 1:
        os.environ['XLA_FLAGS'] = (saved or '') + ' --xla_cpu_enable_fast_math=true'
    os.environ['TPU_WORKER_ID'] = str(pid)  # differs per host by design: listed apart
    try:
        diff = multihost.env_diff(timeout=60)
    finally:
        os.environ.pop('TPU_WORKER_ID')
        if saved is None:
            os.environ.pop('XLA_FLAGS', None)
        else:
            os.environ['XLA_FLAGS'] = saved
    assert [e.key for e in diff.entries] == ['env.XLA_FLAGS'], diff.format()
    entry = diff['env.XLA_FLAGS']
    assert entry.odd_processes == (1,)
    assert 'fast_math' in (entry.values[1] or '')
    assert diff.odd_processes == (1,)
    assert [e.key for e in diff.per_host] == ['env.TPU_WORKER_ID']
    assert 'process 1' in diff.format() and 'XLA_FLAGS' in diff.format()


@multiprocess
def test_an_extra_64_mib_array_on_host_3_makes_host_3_odd():
    pid = jax.process_index()
    keep = {'w': jnp.ones((256, 256))}
    if pid == 3:
        keep['cache'] = jnp.zeros((16, 1024, 1024), jnp.float32)  # 64 MiB, on host 3 only
    keep['cache' if pid == 3 else 'w'].block_until_ready()
    census = multihost.memory_census(keep, timeout=60)
    assert census.odd_processes == (3,), census.format()
    assert census.heavy_processes == (3,)
    leak = census.only_some[0]
    assert leak.shape == (16, 1024, 1024) and leak.counts == (0, 0, 0, 1)
    assert leak.extra_processes == (3,) and 'cache' in leak.names
    assert census.hosts[3].live_bytes - census.hosts[0].live_bytes >= 64 << 20
    assert not census.stats_available  # CPU reports no memory_stats(): said plainly
    assert 'not reported by this backend' in census.format()
    assert all(len(h.devices) == 2 for h in census.hosts)
    del keep


@multiprocess
def test_a_clean_census_has_no_odd_host():
    census = multihost.memory_census({}, timeout=60)
    assert census.odd_processes == (), census.format()
    assert np.isclose(
        sum(h.live_bytes for h in census.hosts), 4 * census.hosts[0].live_bytes, rtol=0.2
    )
