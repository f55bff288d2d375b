"""Preemption sync points and live devices with real signals in real processes.

docs/API.md §2, last two rows. The module's cluster is 4 processes x 1 CPU device
with ``jax_enable_recoverability`` on (so survivors of a SIGKILL live on), the
preemption service on (the default) and a 5 s heartbeat timeout (so a dead
process is noticed quickly). The SIGKILL test breaks the cluster and so runs
last; the preemption-service-off check starts its own small cluster.

Seen on jax 0.10.2 and 0.12: a SIGTERM does not kill a process while the
preemption service runs (XLA's notifier catches it and notices reach every
host within ~1 s); after a SIGKILL, leaving a `live_devices` block waits until
the coordinator's heartbeat timeout declares the process dead, then every
survivor raises `ProcessFailureError` naming exactly its devices.
"""

from __future__ import annotations

import os
import signal
import time

import jax
import pytest

import multihost
from multihost.testing import LocalCluster

HEARTBEAT_TIMEOUT = 5
MP_CLUSTER = dict(n=4, devices_per_process=1, recoverable=True, heartbeat_timeout=HEARTBEAT_TIMEOUT)

# -- bodies run in every process (module level: the workers import this file) --


def _all_device_ids_twice() -> tuple[list[int], list[int], list[int]]:
    with multihost.live_devices(jax.devices()) as first:
        pass
    with multihost.live_devices(jax.devices()) as second:  # the remembered set
        pass
    return [d.id for d in first], [d.id for d in second], sorted(d.id for d in jax.devices())


def _train_until_preemption_sync(signal_step: int, delays: list[float], steps_after: int) -> dict:
    """Calls reached_preemption_sync_point at every step; process 1 SIGTERMs itself.

    Returns this process's [(step, result, monotonic time after the call)] and,
    for process 1, the step and time at which it sent the signal.
    """
    pid = jax.process_index()
    records: list[tuple[int, bool, float]] = []
    sent_at_step = sent_at_time = None
    synced_at = None
    deadline = time.monotonic() + 60
    step = 0
    while step < 5000 and time.monotonic() < deadline:
        reached = multihost.reached_preemption_sync_point(step)
        records.append((step, bool(reached), time.monotonic()))
        if reached and synced_at is None:
            synced_at = step
        if pid == 1 and step == signal_step:
            # After reporting `signal_step`: the agreed step must come later.
            sent_at_time = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)
            sent_at_step = step
        if synced_at is not None and step >= synced_at + steps_after:
            break
        step += 1
        time.sleep(delays[pid])  # hosts run at different speeds
    return dict(records=records, sent_at_step=sent_at_step, sent_at_time=sent_at_time)


def _preemption_service_off_errors() -> list[tuple[str, str]]:
    from jax.experimental import multihost_utils as jmu

    out = []
    for fn in (multihost.reached_preemption_sync_point, jmu.reached_preemption_sync_point):
        try:
            fn(0)
        except Exception as exc:  # compared in the test process
            out.append((type(exc).__name__, str(exc)))
        else:
            out.append(('no error', ''))
    return out


def _die_inside_live_devices(victim: int, wait: float) -> dict:
    """Every process enters live_devices; ``victim`` SIGKILLs itself inside."""
    pid = jax.process_index()
    with pytest.raises(multihost.ProcessFailureError) as info:
        with multihost.live_devices(jax.devices()) as entered:
            entered_ids = [d.id for d in entered]
            if pid == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(wait)  # longer than the heartbeat timeout
    failed = sorted(d.id for d in info.value.failed_devices)
    # Survivors live on: the next block yields only the live devices.
    with multihost.live_devices(jax.devices()) as after:
        after_ids = [d.id for d in after]
    return dict(
        entered=entered_ids,
        failed=failed,
        after=after_ids,
        victim_devices=[d.id for d in jax.devices() if d.process_index == victim],
    )


# -- tests ----------------------------------------------------------------------


def test_live_devices_outside_distributed_runtime_raises():
    """Without jax.distributed, live_devices raises 'Distributed JAX not initialized.'."""
    entered = False
    with pytest.raises(RuntimeError, match=r'^Distributed JAX not initialized\.$'):
        with multihost.live_devices(jax.devices()):
            entered = True
    assert not entered


def test_live_devices_yields_all_devices_in_every_process(mp_cluster):
    """With all processes alive, every process gets every device (sorted by id), twice in a row."""
    results = mp_cluster.run(_all_device_ids_twice)
    expected = results[0][2]
    assert len(expected) == MP_CLUSTER['n'] * MP_CLUSTER['devices_per_process']
    for first, second, all_ids in results:
        assert all_ids == expected
        assert first == expected
        assert second == expected


def test_preemption_sigterm_agrees_on_one_step(mp_cluster):
    """Real SIGTERM to process 1: all return True once, at one step past all pre-signal steps."""
    signal_step, steps_after = 20, 5
    delays = [0.01, 0.015, 0.02, 0.03]
    results = mp_cluster.run(
        _train_until_preemption_sync, signal_step, delays, steps_after, timeout=150
    )
    sender = results[1]
    assert sender['sent_at_step'] == signal_step
    t_signal = sender['sent_at_time']

    sync_steps = []
    reported_before_signal = []
    for i, r in enumerate(results):
        records = r['records']
        steps = [s for s, _, _ in records]
        assert steps == list(range(len(steps))), f'process {i} skipped a step'
        trues = [s for s, reached, _ in records if reached]
        assert len(trues) == 1, f'process {i} returned True at steps {trues} (want exactly one)'
        assert steps[-1] == trues[0] + steps_after, f'process {i} stopped early: {steps[-1]}'
        sync_steps.append(trues[0])
        reported_before_signal.append(max((s for s, _, t in records if t < t_signal), default=-1))

    # Precondition: the hosts really were at different steps when the signal was sent.
    assert len(set(reported_before_signal)) > 1, reported_before_signal
    assert len(set(sync_steps)) == 1, f'processes disagree on the sync step: {sync_steps}'
    sync_step = sync_steps[0]
    assert sync_step > signal_step
    # The safe step is max(reported step) + 1, and steps reported before the
    # notice existed count: no process had to step back.
    assert sync_step >= max(reported_before_signal) + 1, (sync_step, reported_before_signal)
    # SIGTERM did not kill the signalled process (the preemption notifier caught it).
    assert mp_cluster.cluster.alive


def test_preemption_service_off_raises_like_jax(tmp_path):
    """Preemption service off: reached_preemption_sync_point raises JAX's RuntimeError."""
    with LocalCluster(2, 1, preemption_service=False, log_dir=str(tmp_path)) as cluster:
        results = cluster.run(_preemption_service_off_errors, timeout=60)
    for ours, theirs in results:
        assert ours[0] == 'RuntimeError', ours
        assert 'jax_enable_preemption_service' in ours[1]
        assert ours == theirs  # same type and message as jax.experimental.multihost_utils


@pytest.mark.multiprocess(timeout=90, expect_exit=[2], bracket=False)
def test_sigkill_inside_live_devices_fails_survivors():
    """Process 2 SIGKILLed in live_devices: survivors raise ProcessFailureError with its devices.

    Runs last: it kills a process, and the harness restarts the cluster before
    any later use. Process 0 hosts the coordination service, so it is never the
    victim.
    """
    victim = 2
    out = _die_inside_live_devices(victim, wait=HEARTBEAT_TIMEOUT + 2)
    all_ids = sorted(d.id for d in jax.devices())
    assert out['entered'] == all_ids
    assert out['victim_devices'] and out['failed'] == out['victim_devices']
    assert out['after'] == [d for d in all_ids if d not in out['victim_devices']]
