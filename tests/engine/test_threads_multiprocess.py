"""Collectives off the main thread on 4 real processes x 2 devices: never a false mismatch.

A background thread's barriers interleave with the main thread's collectives
differently on every host (orbax finalising an async save); they are matched
by barrier name, other collectives by thread name and count, and the main
thread's sequence is untouched by them.
"""

from __future__ import annotations

import os
import random
import threading
import time

import jax
import numpy as np
import pytest

import multihost
from multihost import _recorder
from multihost._exchange import _sequence

MP_CLUSTER = dict(n=4, devices_per_process=2)


def _saver(out: dict, rounds: int) -> None:
    """A background thread: named barriers at this host's own pace, and one unkeyed gather."""
    rng = random.Random(jax.process_index())  # a different interleaving on every host
    try:
        for i in range(rounds):
            time.sleep(rng.uniform(0, 0.05))
            if i % 2:
                multihost.sync_global_devices(f'ckpt:finalize_{i}')
            else:
                multihost.barrier(f'ckpt:commit_{i}')
            multihost.barrier('ckpt:reused')  # a name used again: matched by its count
        # Not name-keyed: matched by (thread name, count), alike on every host.
        out['gathered'] = multihost.process_allgather(np.full(3, jax.process_index())).tolist()
    except BaseException as exc:  # reported, not lost in the thread
        out['error'] = repr(exc)


def _interleaved_body(rounds: int, steps: int) -> dict:
    """Main thread: a loop of collectives; a thread named 'saver' does barriers meanwhile."""
    rng = random.Random(100 + jax.process_index())
    out: dict = {}
    start = _sequence.position()
    thread = threading.Thread(target=_saver, args=(out, rounds), name='saver')
    thread.start()
    for step in range(steps):
        multihost.process_allgather(np.arange(4) + step)
        time.sleep(rng.uniform(0, 0.03))
        multihost.barrier(f'step-{step}')
    thread.join(60)
    out['alive'] = thread.is_alive()
    out['main_count'] = _sequence.position() - start
    mine = [r for r in _recorder.snapshot(jax.process_index()) if r.thread == 'saver']
    out['saver_records'] = [(r.kind, r.name, r.lane, r.state, r.label) for r in mine]
    out['after'] = multihost.process_allgather(np.array([_sequence.position()])).tolist()
    return out


def test_background_barriers_at_any_interleaving_never_mismatch(mp_cluster):
    """Every host's barriers and gather in thread 'saver' complete; main stays aligned."""
    rounds, steps = 6, 12
    results = mp_cluster.run(_interleaved_body, rounds, steps, timeout=60)
    for r in results:
        assert 'error' not in r, r.get('error')
        assert not r['alive']
        assert r['main_count'] == 2 * steps  # the thread's calls took no main number
        assert r['gathered'] == [[0] * 3, [1] * 3, [2] * 3, [3] * 3]
        assert len({p[0] for p in r['after']}) == 1  # every host at the same main position
        records = r['saver_records']
        assert len(records) == 2 * rounds + 1
        assert all(state == 'passed' for _, _, _, state, _ in records), records
        lanes = [lane for _, _, lane, _, _ in records]
        assert 'n:ckpt:reused#0' in lanes and f'n:ckpt:reused#{rounds - 1}' in lanes
        assert lanes[-1] == 't:saver#0'
        assert "[thread 'saver']" in records[0][4]
    assert len({tuple(map(tuple, r['saver_records'])) for r in results}) == 1


def _stuck(timeout: float, out: dict) -> None:
    try:
        multihost.barrier('ckpt:finalize_7', timeout=timeout)
    except multihost.BarrierTimeoutError as exc:
        out['missing'] = exc.missing
        out['message'] = str(exc)
    except BaseException as exc:
        out['error'] = repr(exc)


def _missing_thread_body(timeout: float) -> dict:
    """Process 3's thread never reaches barrier 'ckpt:finalize_7'; main threads carry on."""
    pid = jax.process_index()
    out: dict = {}
    multihost.barrier('before')
    thread = None
    if pid != 3:
        thread = threading.Thread(target=_stuck, args=(timeout, out), name='finalizer')
        thread.start()
    for step in range(4):
        multihost.barrier(f'main-{step}')
        multihost.process_allgather(np.ones(2) * step)
    if thread is not None:
        thread.join(timeout + 30)
    multihost.barrier('after')  # the main sequence is still aligned
    out['positions'] = multihost.process_allgather(np.array([_sequence.position()])).tolist()
    out['record'] = [
        (r.state, r.label) for r in _recorder.snapshot(pid) if r.name == 'ckpt:finalize_7'
    ]
    return out


def test_background_barrier_timeout_names_the_host_and_the_thread(mp_cluster):
    """The waiting hosts' thread times out naming process 3 and thread 'finalizer'; main goes on."""
    timeout = 3.0
    results = mp_cluster.run(_missing_thread_body, timeout, timeout=60)
    for pid, r in enumerate(results):
        assert len({p[0] for p in r['positions']}) == 1
        if pid == 3:
            assert 'message' not in r and r['record'] == []
            continue
        assert 'error' not in r, r.get('error')
        assert r['missing'] == [3]
        msg = r['message']
        assert "barrier('ckpt:finalize_7')" in msg and "[thread 'finalizer']" in msg, msg
        assert 'process 3 did not arrive' in msg, msg
        assert "process 3: main thread last reached barrier('" in msg, msg
        assert "no thread named 'finalizer' entered a collective" in msg, msg
        assert r['record'] == [('failed', "barrier('ckpt:finalize_7') [thread 'finalizer']")]


def _unkeyed_body(timeout: float) -> dict:
    """Threads of different names gather: unkeyed collectives do not meet across names."""
    pid = jax.process_index()
    out: dict = {}

    def gather() -> None:
        try:
            multihost.process_allgather(np.ones(2), tiled=True)
        except multihost.BarrierTimeoutError as exc:
            out['message'] = str(exc)

    os.environ['MULTIHOST_TIMEOUT'] = str(timeout)
    try:
        t = threading.Thread(target=gather, name='loader' if pid != 1 else 'loader-1')
        t.start()
        t.join(timeout + 30)
    finally:
        del os.environ['MULTIHOST_TIMEOUT']

    def mismatched() -> None:  # same thread name, other shapes on process 2: a mismatch
        try:
            multihost.process_allgather(np.ones(3 if pid == 2 else 2))
        except multihost.CollectiveMismatchError as exc:
            out['mismatch'] = str(exc)

    t = threading.Thread(target=mismatched, name='checker')
    t.start()
    t.join(30)
    multihost.barrier('after-unkeyed')
    return out


def test_unkeyed_collective_in_a_thread_of_another_name_times_out(mp_cluster):
    """process_allgather off the main thread is matched by thread name: a host whose thread is
    named otherwise is reported missing, with where its threads are; alike-named threads
    passing other shapes get a mismatch on every host."""
    results = mp_cluster.run(_unkeyed_body, 3.0, timeout=60)
    for pid, r in enumerate(results):
        msg = r['message']
        if pid == 1:
            assert 'processes 0, 2-3 did not arrive' in msg, msg
            continue
        assert 'process 1 did not arrive' in msg, msg
        assert "thread 'loader-1' last reached process_allgather" in msg, msg
        assert "no thread named 'loader' entered a collective" in msg, msg
    for r in results:
        assert "collective sequence mismatch at #0 of thread 'checker'" in r['mismatch']


def _orbax_body(path: str) -> dict:
    """A real orbax async save while the main thread runs multihost collectives.

    orbax's barriers are routed into multihost as an install would route them:
    ``multihost_utils.sync_global_devices`` (main thread) and the coordination
    client's ``wait_at_barrier`` of every key that is not multihost's own
    (orbax's threads ``async_save`` and ``save_finalize``).
    """
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from multihost import _jax_adapter

    state = _jax_adapter.distributed_state()
    real = state.client
    threads: list[tuple[str, str]] = []

    class Routed:
        def __getattr__(self, attr: str):
            return getattr(real, attr)

        def wait_at_barrier(self, key, timeout_ms, process_ids=None):
            if key.startswith('mh/') or key.startswith('harness/') or process_ids is not None:
                return real.wait_at_barrier(key, timeout_ms, process_ids)
            threads.append((threading.current_thread().name, key))
            return multihost.barrier(key, timeout=timeout_ms / 1000)

    original = multihost_utils.sync_global_devices
    multihost_utils.sync_global_devices = multihost.sync_global_devices
    state.client = Routed()
    try:
        mesh = jax.make_mesh((jax.device_count(),), ('x',))
        local = np.arange(jax.local_device_count() * 4, dtype=np.float32) + jax.process_index()
        arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), local)
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2)
        manager = ocp.CheckpointManager(path, options=options)
        rng = random.Random(jax.process_index())
        for step in range(3):
            manager.save(step, args=ocp.args.StandardSave({'w': arr}))
            for i in range(3):  # the training loop goes on while the save finishes
                time.sleep(rng.uniform(0, 0.05))
                multihost.process_allgather(np.ones(3) * step)
                multihost.barrier(f'train-{step}-{i}')
        manager.wait_until_finished()
        restored = manager.restore(2, args=ocp.args.StandardRestore({'w': arr}))
        manager.close()
    finally:
        state.client = real
        multihost_utils.sync_global_devices = original
    ok = bool(np.array_equal(np.asarray(restored['w'].addressable_data(0)), local[:4]))
    return dict(
        threads=sorted({t for t, _ in threads}),
        off_main=[k for t, k in threads if t != 'MainThread'],
        restored=ok,
        position=multihost.process_allgather(np.array([_sequence.position()])).tolist(),
    )


def test_orbax_async_save_beside_main_thread_collectives(mp_cluster, tmp_path):
    """orbax's background barriers (threads 'async_save', 'save_finalize') never mismatch."""
    pytest.importorskip('orbax.checkpoint')
    results = mp_cluster.run(_orbax_body, str(tmp_path / 'ckpt'), timeout=90)
    for r in results:
        assert r['restored']
        assert {'async_save', 'save_finalize'} <= set(r['threads']), r['threads']
        assert r['off_main'], r
        assert len({p[0] for p in r['position']}) == 1
    # The thread names and the off-main barrier names are the same on every host.
    assert len({tuple(r['threads']) for r in results}) == 1
    assert len({tuple(r['off_main']) for r in results}) == 1


# -- one process, and the views ---------------------------------------------------------


def test_one_process_thread_collectives_are_recorded_in_lanes_not_the_sequence():
    """Off the main thread a collective takes no sequence number; its record names the thread."""
    before = _sequence.position()
    out: dict = {}

    def work() -> None:
        multihost.barrier('solo')
        multihost.barrier('solo')
        out['gathered'] = multihost.process_allgather(np.arange(2)).tolist()
        out['records'] = [(r.lane, r.thread, r.seq, r.label) for r in _recorder.snapshot(0)[-2:]]

    t = threading.Thread(target=work, name='solo-thread')
    t.start()
    t.join(30)
    assert _sequence.position() == before
    assert out['gathered'] == [[0, 1]]
    assert out['records'] == [
        ('n:solo#0', 'solo-thread', None, "barrier('solo') [thread 'solo-thread']"),
        ('n:solo#1', 'solo-thread', None, "barrier('solo') [thread 'solo-thread']"),
    ]  # one process: process_allgather enters no collective


def test_timeline_aligns_thread_collectives_by_lane_at_any_position():
    """Hosts whose threads' barrier sits at different flight-record positions share one step."""
    from multihost import FlightRecord, Timeline

    def rec(p: int, n: int, kind: str, name: str, seq: int | None, lane: str, t: float):
        thread = 'async_save' if lane else ''
        return FlightRecord(
            n, kind, name, -1, seq, '', '', 'x.py:1', t, 0.01, 'passed', p, thread=thread, lane=lane
        )

    records = {
        0: [
            rec(0, 0, 'barrier', 'step-0', 0, '', 1.0),
            rec(0, 1, 'barrier', 'ckpt_0', None, 'n:ckpt_0#0', 1.1),
        ],
        1: [
            rec(1, 0, 'barrier', 'ckpt_0', None, 'n:ckpt_0#0', 1.05),
            rec(1, 1, 'barrier', 'step-0', 0, '', 1.2),
        ],
    }
    tl = Timeline.build(records, 2)
    labels = sorted(s.label for s in tl.steps)
    assert labels == ["barrier('ckpt_0') [thread 'async_save']", "barrier('step-0') #0"]
    assert all(s.complete and not s.clock_compared for s in tl.steps)
