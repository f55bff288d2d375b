"""The check path never hangs and every host tells the same story (4 real processes x 2 devices).

Scripted failures on real `jax.distributed` processes: a host whose JAX
backend is still cold, a host that never arrives, hosts that leave (exit) right
after the error, a host that cannot take part in a collective, an interrupted
host. Each must end within its bound, with the same verdict on every host, and
the next collective must line up.
"""

from __future__ import annotations

import json
import os
import signal
import time

import jax
import numpy as np
import pytest
from _helpers import wait_until

import multihost
from multihost import engine
from multihost._exchange import _kv

# The backend stays cold until a test's first JAX operation: the first test
# needs that (host 2 "still loading data").
MP_CLUSTER = dict(n=4, devices_per_process=2, init_backend=False)
multiprocess = pytest.mark.multiprocess


def _timeout_result(exc: multihost.BarrierTimeoutError, t0: float) -> dict:
    return dict(
        elapsed=time.monotonic() - t0,
        missing=exc.missing,
        head=str(exc).splitlines()[0],
        positions={p: r.seq for p, r in exc.positions.items()},
    )


def _cold_host_body(timeout: float) -> dict:
    """Host 2 sits in 'data loading' (no JAX operation yet); the others meet at a barrier."""
    pid = _kv.process_index()
    if pid == 2:
        time.sleep(timeout + 2)
    t0 = time.monotonic()
    try:
        multihost.barrier('step-1', timeout=timeout)
        out: dict = dict(elapsed=time.monotonic() - t0, missing=None)
    except multihost.BarrierTimeoutError as exc:
        out = _timeout_result(exc, t0)
    # The late host raised at once too; the next barrier lines up for everyone.
    multihost.barrier('step-2', timeout=30)
    out['backend_cold_until_now'] = True
    return out


def test_cold_host_does_not_block_the_others_barrier(mp_cluster):
    """A host whose backend is cold and busy: the others get BarrierTimeoutError([2]) in time."""
    timeout = 4.0
    results = mp_cluster.run(_cold_host_body, timeout, timeout=60, bracket=False)
    heads = {r['head'] for r in results}
    assert len(heads) == 1, heads  # the same verdict on every host, the late one included
    for pid, r in enumerate(results):
        assert r['missing'] == [2], (pid, r)
        if pid != 2:
            assert timeout - 0.5 <= r['elapsed'] <= timeout + 1.0, (pid, r['elapsed'])
        else:
            assert r['elapsed'] < 1.0, r  # late: the verdict is waiting for it


def _missing_host_rounds(timeout: float, rounds: int) -> list:
    """``rounds`` times: host 2 arrives late; every host records its verdict."""
    out = []
    for i in range(rounds):
        if _kv.process_index() == 2:
            time.sleep(timeout + 0.7)
        t0 = time.monotonic()
        try:
            multihost.barrier(f'round-{i}', timeout=timeout)
            out.append(None)
        except multihost.BarrierTimeoutError as exc:
            out.append(_timeout_result(exc, t0))
    return out


def test_every_host_reports_the_same_missing_hosts_every_time(mp_cluster):
    """Five rounds of a late host 2: all four hosts name [2], with one identical message."""
    results = mp_cluster.run(_missing_host_rounds, 1.5, 5, timeout=90, bracket=False)
    for i in range(5):
        verdicts = [r[i] for r in results]
        assert all(v is not None for v in verdicts), verdicts
        assert all(v['missing'] == [2] for v in verdicts), verdicts
        assert len({v['head'] for v in verdicts}) == 1, verdicts


def _leave_after_error(out_dir: str, timeout: float) -> None:
    """Hosts 0, 1, 3 time out and leave at once; process 0 exits (the service dies with it).

    Process 0 exits as a program does: JAX's exit hook (`jax.distributed.shutdown`)
    runs, then the process is gone. (A hard `os._exit` of process 0 makes JAX's
    fate-sharing kill every other process within milliseconds, before any of them
    can even print the error it holds.)
    """
    pid = _kv.process_index()
    if pid == 2:
        time.sleep(timeout + 30)  # killed with the cluster
        return
    record: dict = {}
    try:
        multihost.barrier('before-exit', timeout=timeout)
    except Exception as exc:  # whatever it is, it must be the verdict, on every host
        record = dict(type=type(exc).__name__, missing=getattr(exc, 'missing', None))
        record['head'] = str(exc).splitlines()[0]
    tmp = os.path.join(out_dir, f'{pid}.tmp')
    with open(tmp, 'w') as f:
        json.dump(record, f)
    os.rename(tmp, os.path.join(out_dir, f'{pid}.json'))
    if pid == 0:
        jax.distributed.shutdown()  # what its exit hook does; then the service is gone
        os._exit(0)


def _records_written(out):
    want = [out / f'{p}.json' for p in (0, 1, 3)]
    return lambda: all(f.exists() for f in want)


# Release rotation; covered on every landing by the same verdict on every host:
# test_every_host_reports_the_same_missing_hosts_every_time
@pytest.mark.release
def test_hosts_that_leave_after_the_error_all_saw_the_same_verdict(mp_cluster, tmp_path):
    """Process 0 exits right after its error: hosts 1 and 3 have still read the whole verdict."""
    for attempt in range(3):
        out = tmp_path / str(attempt)
        out.mkdir()
        # Nobody is awaited: once process 0 exits, JAX's fate-sharing terminates the
        # others soon after (before some can answer the harness). What each host
        # saw is in its record file, written right after its error.
        try:
            mp_cluster.run(
                _leave_after_error,
                str(out),
                1.0,
                timeout=60,
                bracket=False,
                expect_exit=[0, 1, 2, 3],
            )
            wait_until(_records_written(out), 20, f'records in {out}', period=0.1)
        finally:  # process 0 is gone: the next run restarts the cluster
            mp_cluster.cluster.broken = True
        records = {int(p.stem): json.loads(p.read_text()) for p in out.glob('*.json')}
        assert sorted(records) == [0, 1, 3], records
        for pid, r in records.items():
            assert r['type'] == 'BarrierTimeoutError', (attempt, pid, r)
            assert r['missing'] == [2], (attempt, pid, r)
        assert len({r['head'] for r in records.values()}) == 1, records


def _diff_of_partial_name() -> dict:
    pid = _kv.process_index()
    ns = {} if pid in (2, 3) else {'partial': {'w': np.ones(3)}}
    t0 = time.monotonic()
    try:
        engine.diff(ns, 'partial', timeout=20)
        out: dict = dict(error=None)
    except multihost.HostFailedError as exc:
        out = dict(error=str(exc), reasons=sorted(exc.reasons), elapsed=time.monotonic() - t0)
    multihost.barrier('after partial diff', timeout=20)  # still in step
    return out


def test_tree_diff_of_a_partial_name(mp_cluster):
    """Hosts 2, 3 lack the name: all raise the same HostFailedError at once; still in step."""
    results = mp_cluster.run(_diff_of_partial_name, timeout=60)
    assert len({r['error'] for r in results}) == 1, results
    for r in results:
        assert r['reasons'] == [2, 3], r
        assert r['elapsed'] < 5.0, r
        assert "'partial' is not defined" in r['error'], r
        assert 'processes 2-3' in r['error'], r


class Unconvertible:
    """A leaf that refuses to become an array."""

    def __array__(self, *args, **kwargs):
        raise TypeError('Unconvertible cannot become an array')


def _diff_of_unconvertible_leaf() -> dict:
    pid = _kv.process_index()
    tree = {'w': np.ones(3), 'odd': Unconvertible() if pid == 1 else np.zeros(2)}
    try:
        multihost.tree_diff(tree, timeout=20)
        return dict(error=None)
    except multihost.HostFailedError as exc:
        return dict(error=str(exc), reasons=sorted(exc.reasons))


def test_tree_diff_of_an_unconvertible_leaf_on_one_host(mp_cluster):
    """One host's leaf is not an array: every host names host 1 and the leaf."""
    results = mp_cluster.run(_diff_of_unconvertible_leaf, timeout=60)
    assert len({r['error'] for r in results}) == 1, results
    assert results[0]['reasons'] == [1]
    assert "['odd']" in results[0]['error']


def _interrupted_wait() -> dict:
    """Host 1 is interrupted (SIGINT) while everyone but host 3 waits at a barrier."""
    pid = _kv.process_index()
    if pid == 3:
        time.sleep(4.0)
    t0 = time.monotonic()
    try:
        multihost.barrier('interrupted', timeout=30)
        out: dict = dict(error=None)
    except KeyboardInterrupt:
        out = dict(error='KeyboardInterrupt')
    except multihost.CollectiveInterruptedError as exc:
        out = dict(error=type(exc).__name__, by=exc.by)
    out['elapsed'], out['ended'] = time.monotonic() - t0, time.time()
    multihost.barrier('after interrupt', timeout=30)  # lines up again
    return out


def test_an_interrupt_stops_the_wait_and_every_host_hears_of_it(mp_cluster):
    """SIGINT on host 1 mid-wait: it stops within a slice; the others hear of it at once."""
    cluster = mp_cluster.get()
    import threading

    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.time())
        cluster.signal(1, signal.SIGINT)

    threading.Timer(1.5, interrupt).start()
    results = mp_cluster.run(_interrupted_wait, timeout=60, bracket=False)
    assert results[1]['error'] == 'KeyboardInterrupt', results
    # Times from the signal (same machine, one clock), not from each host's start: a loaded
    # machine starts the hosts' waits late, the bounds are about the signal's effect.
    assert results[1]['ended'] - sent[0] < 1.5, (sent, results)  # at most one slice
    for pid in (0, 2):
        assert results[pid]['error'] == 'CollectiveInterruptedError', results
        assert results[pid]['by'] == 1
        # Heard at its next look for a verdict: a waiting host looks at growing intervals
        # (0.5 s doubling up to _kv._LOOK_MAX), so at most that long after host 1 wrote it.
        heard = results[pid]['ended'] - results[1]['ended']
        assert heard < _kv._LOOK_MAX + 0.5, results
    assert results[3]['error'] == 'CollectiveInterruptedError', results  # late: told at once


def _many_collectives(count: int) -> dict:
    for _ in range(count):  # each leaves keys in its epoch (the fingerprint digests)
        multihost.tree_diff({'x': np.ones(2)}, timeout=30)
    c = _kv.client()
    return dict(
        seq=multihost._exchange._sequence.position(),
        epoch0=len(c.key_value_dir_get(_kv.epoch_dir(0) + '/')),
        current=len(
            c.key_value_dir_get(_kv.epoch_dir(multihost._exchange._sequence.position() - 1) + '/')
        ),
    )


def test_old_epochs_are_deleted(mp_cluster):
    """After 2 epochs of collectives, epoch 0's keys are gone; the current epoch's stay."""
    results = mp_cluster.run(_many_collectives, 2 * _kv.EPOCH + 4, timeout=120)
    for r in results:
        assert r['seq'] >= 2 * _kv.EPOCH + 1, r
        assert r['epoch0'] == 0, r
        assert r['current'] > 0, r


def _big_values() -> dict:
    """A 3 MiB value and a 600 KiB value per host round-trip; no stored key exceeds 1 MiB."""
    pid = _kv.process_index()
    c = _kv.client()
    big = str(pid) * (3 << 20)
    _kv.put(c, f'mh/test/big/{pid}', big)
    assert _kv.get(c, f'mh/test/big/{pid}') == big
    _kv.publish(c, 'mh/test/dir', chr(ord('a') + pid) * (600 << 10))
    multihost.barrier('published', timeout=30)
    values = _kv.read_dir(c, 'mh/test/dir')
    sizes = [len(v) for _, v in c.key_value_dir_get_bytes('mh/')]
    multihost.barrier('read', timeout=30)
    return dict(
        ok=values == {p: chr(ord('a') + p) * (600 << 10) for p in range(4)},
        largest=max(sizes),
        raw_dir=sum(len(v) for _, v in c.key_value_dir_get('mh/test/dir/')),
    )


def test_values_and_reads_are_bounded(mp_cluster):
    """Values beyond the bound are chunked: each stored value and each directory read ≤ 1 MiB."""
    for r in mp_cluster.run(_big_values, timeout=60):
        assert r['ok']
        assert r['largest'] <= _kv.MAX_BYTES, r
        assert r['raw_dir'] <= _kv.MAX_BYTES, r


def _jax_still_works() -> int:
    return int(np.asarray(multihost.process_allgather(jax.process_index())).sum())


def test_the_cluster_still_computes_afterwards(mp_cluster):
    """After all of the above (in the same cluster where it survived), device collectives work."""
    assert mp_cluster.run(_jax_still_works, timeout=60) == [6, 6, 6, 6]
