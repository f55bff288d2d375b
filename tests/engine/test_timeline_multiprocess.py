"""The timeline on 4 real processes x 2 devices: an injected straggler is named.

Each process runs a few dozen steps of a small watched jitted step (a sum
over a globally sharded array: a real cross-host all-reduce); process 3
sleeps before every step. Process 0 then gathers every host's flight records
(`multihost.timeline`) and must name process 3: from each process's own wait at
the check (``check=True``), or from wall clocks (``check=False``, one
machine here, so the clocks agree).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import flat_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost

MP_CLUSTER = dict(n=4, devices_per_process=2)

STEPS = 30
DELAY = 0.05  # process 3's extra work before every step
SLOW = 3


def _sharded(n: int = 16) -> jax.Array:
    sharding = NamedSharding(flat_mesh(), P('x'))
    return jax.make_array_from_callback(
        (n,), sharding, lambda idx: np.arange(n, dtype=np.float32)[idx]
    )


def _straggler_run(check: bool) -> dict | None:
    """STEPS watched steps, process 3 late to each; process 0 returns its timeline."""
    pid = jax.process_index()
    name = f'tl_step_{"checked" if check else "unchecked"}'
    step = multihost.watch(jax.jit(lambda a: jnp.sum(a) * 0.5 + a), name=name, check=check)
    a = _sharded()
    a = step(a)  # compile (and, checked, compare fingerprints) outside the window
    a.block_until_ready()
    for _ in range(STEPS):
        if pid == SLOW:
            time.sleep(DELAY)
        a = step(a)
        a.block_until_ready()
    multihost.barrier(f'{name}-end')
    if pid != 0:
        return None
    t0 = time.monotonic()
    tl = multihost.timeline(last=STEPS + 1, timeout=10.0)  # the steps and the end barrier
    took = time.monotonic() - t0
    path = os.path.join(tempfile.mkdtemp(), 'trace.json')
    tl.to_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    return dict(timeline=tl, took=took, trace=trace, name=name)


@pytest.mark.parametrize('check', [True, False], ids=['checked', 'unchecked'])
def test_the_timeline_names_the_injected_straggler(mp_cluster, check):
    result = mp_cluster.run(_straggler_run, check, timeout=60)[0]
    tl: multihost.Timeline = result['timeline']
    text = tl.format()
    assert tl.hosts == (0, 1, 2, 3) and tl.silent == (), text
    steps = [s for s in tl.steps if s.name == result['name']]
    assert len(steps) == STEPS, text
    assert all(s.complete and s.clock_compared is (not check) for s in steps), text
    if check:
        assert [s.seq for s in steps] == sorted(s.seq for s in steps), text
    else:
        assert [s.call for s in steps] == list(range(1, STEPS + 1)), text
    st = tl.stragglers()
    assert st.host == SLOW and st.share >= 0.8, text
    last3 = [s for s in steps if s.last_host == SLOW]
    assert len(last3) >= 0.8 * STEPS, text
    # Late by about the injected delay (not by a clock offset, not by nothing).
    assert 0.6 * DELAY < st.median_behind < 4 * DELAY, text
    summary = str(st)
    assert summary.startswith(f'process {SLOW} arrived last in '), summary
    assert ('wall clocks compared' in summary) is (not check), summary
    assert text.splitlines()[0] == summary
    # Chrome trace: one named track per host, every step on every track.
    events = result['trace']['traceEvents']
    tracks = {e['pid']: e['args']['name'] for e in events if e.get('name') == 'process_name'}
    assert tracks == {p: f'process {p}' for p in range(4)}
    for p in range(4):
        mine = [e for e in events if e['ph'] == 'X' and e['pid'] == p and e['cat'] == 'launch']
        assert len(mine) == STEPS
    late = [e for e in events if e['ph'] == 'X' and e['args'].get('arrived_last')]
    assert sum(e['pid'] == SLOW for e in late) >= 0.8 * STEPS
    assert result['took'] < 5.0
