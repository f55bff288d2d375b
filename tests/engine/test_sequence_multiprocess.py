"""Timed barriers and collective-sequence checking on 4 real processes x 2 devices.

Scripted divergent programs: each must end within its timeout with the right
error, and the structured attributes set, on every host.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np
import pytest
from _helpers import source_line

import multihost

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


def _skip_barrier_body(timeout: float):
    """Process 2 skips barrier 'sync-a'; the others wait and must time out."""
    pid = jax.process_index()
    multihost.barrier('warm-up')
    if pid == 2:
        time.sleep(timeout + 3)  # "busy elsewhere": never arrives in time
        return None
    t0 = time.monotonic()
    try:
        multihost.barrier('sync-a', timeout=timeout)
    except multihost.BarrierTimeoutError as exc:
        return dict(
            elapsed=time.monotonic() - t0,
            missing=exc.missing,
            positions={p: (r.kind, r.name, r.site) for p, r in exc.positions.items()},
            message=str(exc),
            is_timeout=isinstance(exc, TimeoutError),
        )
    return dict(elapsed=time.monotonic() - t0, missing=None)


def test_skipped_barrier_times_out_naming_missing_host(mp_cluster):
    """Waiting hosts raise BarrierTimeoutError in timeout + 1 s naming host 2 and its place."""
    timeout = 3.0
    results = mp_cluster.run(_skip_barrier_body, timeout, timeout=60, bracket=False)
    mp_cluster.get().broken = True  # host 2 is now behind by one collective: restart
    for pid, r in enumerate(results):
        if pid == 2:
            continue
        assert r['missing'] == [2], r
        assert r['is_timeout']
        assert timeout - 0.5 <= r['elapsed'] <= timeout + 1.0, r['elapsed']
        kind, name, site = r['positions'][2]
        assert (kind, name) == ('barrier', 'warm-up')
        assert site.endswith(f'{os.path.basename(__file__)}:{_WARM_UP_LINE}'), site
        assert 'process 2 did not arrive' in r['message']
        assert "barrier('warm-up')" in r['message']


_WARM_UP_LINE = source_line(_skip_barrier_body, "multihost.barrier('warm-up')")


@multiprocess
def test_barrier_names_differ_raises_on_every_host():
    """Different names at the same barrier: BarrierMismatchError with .names on every host."""
    pid = jax.process_index()
    name = 'eval' if pid == 1 else 'save'
    with pytest.raises(multihost.BarrierMismatchError) as info:
        multihost.barrier(name, timeout=30)
    assert info.value.names == {0: 'save', 1: 'eval', 2: 'save', 3: 'save'}
    assert isinstance(info.value, AssertionError)
    assert "process 1: barrier('eval')" in str(info.value)
    multihost.barrier('aligned again', timeout=30)  # the sequence did not drift


@multiprocess
def test_different_collective_raises_on_every_host():
    """Host 2 gathers while the others sync: CollectiveMismatchError naming each call and site."""
    pid = jax.process_index()
    with pytest.raises(multihost.CollectiveMismatchError) as info:
        if pid == 2:
            multihost.process_allgather(np.arange(3))
        else:
            multihost.sync_global_devices('ckpt')
    calls = info.value.calls
    assert calls[2].kind == 'process_allgather'
    assert {calls[p].kind for p in (0, 1, 3)} == {'barrier'}
    assert calls[0].name == 'ckpt'
    text = str(info.value)
    assert 'process 2: process_allgather' in text and "barrier('ckpt')" in text
    assert os.path.basename(__file__) in calls[2].site
    multihost.sync_global_devices('aligned again')


@multiprocess
def test_shapes_differ_raises_before_device_collective():
    """Host 3 gathers a different shape: every host raises instead of crashing in XLA."""
    n = 5 if jax.process_index() == 3 else 4
    with pytest.raises(
        multihost.CollectiveMismatchError, match='different structure, shapes or dtypes'
    ):
        multihost.process_allgather(np.zeros(n, np.float32))
    with pytest.raises(multihost.CollectiveMismatchError):
        dtype = np.int32 if jax.process_index() == 0 else np.float32
        multihost.broadcast_one_to_all(np.zeros(3, dtype))
    out = multihost.process_allgather(np.zeros(2, np.float32))
    assert out.shape == (jax.process_count(), 2)


@multiprocess
def test_sequence_numbers_agree_and_history_is_recorded():
    """After the same calls every host holds the same sequence of kinds and names."""
    from multihost._exchange import _sequence

    multihost.barrier('h1')
    multihost.process_allgather(np.zeros(2))
    multihost.broadcast_one_to_all(np.zeros(2))
    recent = _sequence.history()[-3:]
    assert [(r.kind, r.name) for r in recent] == [
        ('barrier', 'h1'),
        ('process_allgather', 'tiled=False'),
        ('broadcast_one_to_all', ''),
    ]
    seqs = multihost.process_allgather(np.array([r.seq for r in recent]))
    assert (seqs == seqs[0]).all()


@multiprocess
def test_check_can_be_switched_off():
    """MULTIHOST_CHECK=0: device collectives skip the sequence check (barriers still checked)."""
    from multihost._exchange import _sequence

    os.environ['MULTIHOST_CHECK'] = '0'
    try:
        before = len(_sequence.history())
        out = multihost.process_allgather(np.arange(2))
        assert out.shape == (jax.process_count(), 2)
        assert len(_sequence.history()) == before
        multihost.barrier('still checked')
        assert _sequence.history()[-1].name == 'still checked'
    finally:
        del os.environ['MULTIHOST_CHECK']


def test_bad_timeout_env_is_a_clear_error(monkeypatch):
    """MULTIHOST_TIMEOUT that is not a positive number names the variable and the fix."""
    from multihost._exchange import _sequence

    monkeypatch.setenv('MULTIHOST_TIMEOUT', 'soon')
    with pytest.raises(ValueError, match='MULTIHOST_TIMEOUT must be a number of seconds'):
        _sequence.default_timeout()
    monkeypatch.setenv('MULTIHOST_TIMEOUT', '-1')
    with pytest.raises(ValueError, match='must be positive'):
        _sequence.default_timeout()
    monkeypatch.setenv('MULTIHOST_TIMEOUT', '12.5')
    assert _sequence.default_timeout() == 12.5
