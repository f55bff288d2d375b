"""The newer waits never hang: the wavefront, flight records and watched launch checks.

Real `jax.distributed` processes (4 x 2 devices; the dead-host test starts a
recoverable 4 x 1 cluster of its own) and scripted failures: hosts with no
debug thread yet, a frozen host (SIGSTOP), a host whose debug thread is stuck
in another command, a dead host (SIGKILL), a host that never reaches a
watched call, a host stuck compiling it, and hosts launching different
watched functions. Each failure must surface within its timeout (plus a
little), name the host, say the same thing on every host, and leave the
collective sequence aligned.

The first test needs processes that have not entered any multihost
collective yet, so it runs first (the module's cluster is fresh).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import wait_until

import multihost
from multihost import _recorder
from multihost._exchange import _bus, _kv
from multihost.testing import LocalCluster

MP_CLUSTER = dict(n=4, devices_per_process=2)
#: Its first test needs hosts that have not entered a collective yet (no debug thread).
MP_CLUSTER_FRESH = True
#: Every wait measured here: a failure must surface within T + SLACK seconds.
T = 2.0
#: Scheduling on a 2-core machine running 4 JAX processes, plus a few RPCs.
SLACK = 2.0


@contextlib.contextmanager
def _check_timeout(seconds: float) -> Iterator[None]:
    """``MULTIHOST_TIMEOUT`` (the watched check's timeout) set to ``seconds`` inside."""
    old = os.environ.get('MULTIHOST_TIMEOUT')
    os.environ['MULTIHOST_TIMEOUT'] = str(seconds)
    try:
        yield
    finally:
        if old is None:
            del os.environ['MULTIHOST_TIMEOUT']
        else:
            os.environ['MULTIHOST_TIMEOUT'] = old


def _ask(timeout: float) -> dict:
    """wavefront and flight_records (and the timeline of the latter), each timed."""
    t0 = time.monotonic()
    wf = multihost.wavefront(timeout=timeout)
    front_s = time.monotonic() - t0
    t0 = time.monotonic()
    recs = multihost.flight_records(timeout=timeout)
    records_s = time.monotonic() - t0
    timeline = multihost.Timeline.build(recs, _kv.process_count())
    return dict(
        front_s=front_s,
        silent=wf.silent,
        errors={h.process: h.error for h in wf.hosts if not h.answered},
        verdict=wf.verdict,
        text=wf.format(),
        records_s=records_s,
        records=sorted(recs),
        timeline_silent=timeline.silent,
        timeline=timeline.format(),
    )


def _os_pid(process: int) -> int:
    """The OS pid of ``process``, as its debug thread registered it."""
    return int(json.loads(_kv.get(_kv.client(), _kv.key('dmn', process)))['os_pid'])


def _dead(os_pid: int) -> bool:
    """Whether ``os_pid`` has exited (a zombie not yet reaped, or gone)."""
    try:
        with open(f'/proc/{os_pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except FileNotFoundError:
        return True


def _stopped(os_pid: int) -> bool:
    with open(f'/proc/{os_pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0] == 'T'


# -- the wavefront and flight records -------------------------------------------------


def _no_debug_thread_yet() -> dict:
    """Hosts 1-3 have not entered a multihost collective: host 0 asks anyway."""
    if _kv.process_index() != 0:
        time.sleep(1.0)  # busy elsewhere (no collective, no watched call yet)
        return {}
    return _ask(5.0)


# Release rotation; covered on every landing by a host that cannot answer, named within the
# timeout: test_a_host_that_cannot_answer_is_named_silent_within_the_timeout (below)
@pytest.mark.release
def test_hosts_without_a_debug_thread_are_named_at_once(mp_cluster):
    """No debug thread yet on hosts 1-3: named at once (not waited for), with the reason."""
    r = mp_cluster.run(_no_debug_thread_yet, timeout=60, bracket=False)[0]
    assert r['silent'] == (1, 2, 3), r['text']
    assert r['front_s'] < 1.0 and r['records_s'] < 1.0, r
    assert set(r['errors'].values()) == {
        'no debug thread yet (no collective or watched call so far)'
    }, r['errors']
    assert 'processes 1-3 are silent' in r['verdict'], r['verdict']
    assert '\n  process 1: no debug thread yet (no collective' in r['text'], r['text']
    assert r['records'] == [0] and r['timeline_silent'] == (1, 2, 3), r['timeline']
    assert 'no records from processes 1-3 (no answer)' in r['timeline'], r['timeline']


_debug_thread_held = threading.Event()
_release_debug_thread = threading.Event()


def _hold(client: object, order: dict) -> str:
    """A command whose handler blocks host 2's debug thread (as a handler that hangs would)."""
    if _kv.process_index() == 2:
        _debug_thread_held.set()
        _release_debug_thread.wait(60)
    return '{}'


_bus.register('test-hold', _hold)


def _one_host_cannot_answer(how: str, timeout: float) -> dict:
    """Host 2 cannot answer (``how``: 'frozen' by SIGSTOP, or its debug thread 'busy').

    Hosts 0 and 3 wait in a barrier meanwhile; host 1 asks for the wavefront
    and the flight records, then host 2 is let go and every host meets again.
    """
    pid = _kv.process_index()
    multihost.barrier('every debug thread runs', timeout=30)
    _debug_thread_held.clear()
    _release_debug_thread.clear()
    if how == 'busy' and pid == 2:
        _bus.command(_kv.client(), 'test-hold', 0.5)
        assert _debug_thread_held.wait(10), 'the debug thread never took the command'
    multihost.barrier('host 2 cannot answer now', timeout=30)
    out: dict = {}
    if how == 'frozen' and pid == 2:
        os.kill(os.getpid(), signal.SIGSTOP)  # host 1 lets it go again (SIGCONT)
    if pid == 1:
        os_pid = _os_pid(2)
        try:
            if how == 'frozen':
                wait_until(lambda: _stopped(os_pid), 10, 'host 2 stopped')
            # Hosts 0 and 3 may still be leaving the last barrier on a loaded machine: ask
            # once both wait at the next one (host 2 named gone here, so not waited for).
            wait_until(lambda: _both_at_asked(), 20, "hosts 0 and 3 at barrier('asked')")
            out = _ask(timeout)
        finally:
            if how == 'frozen':
                os.kill(os_pid, signal.SIGCONT)
    multihost.barrier('asked', timeout=60)
    _release_debug_thread.set()
    return out


def _both_at_asked() -> bool:
    front = multihost.wavefront(timeout=5.0, gone={2: 'cannot answer (this test)'})
    return all(
        h.waiting is not None and h.waiting.name == 'asked'
        for h in front.hosts
        if h.process in (0, 3)
    )


@pytest.mark.parametrize('how', ['frozen', 'busy'])
def test_a_host_that_cannot_answer_is_named_silent_within_the_timeout(mp_cluster, how):
    """A frozen host, or one whose debug thread is stuck: silent after the timeout, no longer."""
    r = mp_cluster.run(_one_host_cannot_answer, how, T, timeout=60, bracket=False)[1]
    print(f'\n[timing] {how} host: wavefront {r["front_s"]:.2f} s, records {r["records_s"]:.2f} s')
    for took in (r['front_s'], r['records_s']):
        assert T - 0.1 <= took <= T + SLACK, r
    assert r['silent'] == (2,), r['text']
    assert r['errors'] == {2: f'no answer within {T:g} s'}, r['errors']
    assert f'\n  process 2: no answer within {T:g} s' in r['text'], r['text']
    assert 'process 2 is silent (dead, frozen, or no debug thread)' in r['verdict'], r['verdict']
    assert 'processes 0, 3 are waiting at' in r['verdict'], r['verdict']
    assert r['records'] == [0, 1, 3] and r['timeline_silent'] == (2,), r['timeline']


# -- the watched launch check ---------------------------------------------------------


def _sharded(n: int = 16) -> jax.Array:
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ('x',))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('x'))
    return jax.make_array_from_callback(
        (n,), sharding, lambda idx: np.arange(n, dtype=np.float32)[idx]
    )


def load_shard(seconds: float) -> None:
    time.sleep(seconds)  # "reading data": this host is late for the launch


def _late_for_a_watched_launch(where: str, timeout: float) -> dict:
    """Host 2 is late by ``timeout`` + 1.5 s: before the check ('late'), or compiling it.

    'compiling': host 2 reaches the check in time, but tracing its first call
    of the signature takes longer than the timeout, so the others wait for it
    in the round that compares compiled programs.
    """
    pid = _kv.process_index()
    delay = timeout + 1.5

    def body(a: jax.Array) -> jax.Array:
        if where == 'compiling' and pid == 2:
            load_shard(delay)  # runs while tracing, i.e. inside lower().compile()
        return jnp.sum(a) * a

    step = multihost.watch(jax.jit(body), name='train_step')
    a = _sharded()
    if where == 'late':
        step(a).block_until_ready()  # the signature is known: a steady-state check
    multihost.barrier('before the late launch', timeout=30)
    if where == 'late' and pid == 2:
        load_shard(delay)
    t0 = time.monotonic()
    try:
        with _check_timeout(timeout):
            step(a)
        out: dict = dict(error=None)
    except multihost.BarrierTimeoutError as exc:
        out = dict(
            error=type(exc).__name__,
            head=str(exc).splitlines()[0],
            text=str(exc),
            missing=exc.missing,
        )
    out['elapsed'] = time.monotonic() - t0
    out['state'] = _recorder.snapshot(pid, 1)[0].state
    multihost.barrier('after the late launch', timeout=30)  # still in step
    out['aligned'] = True
    return out


@pytest.mark.parametrize('where', ['late', 'compiling'])
def test_a_host_late_for_a_watched_launch_is_named_by_every_host(mp_cluster, where):
    """Host 2 late at the check, or stuck compiling: all raise the same timeout naming it."""
    results = mp_cluster.run(_late_for_a_watched_launch, where, T, timeout=90, bracket=False)
    print(
        f'\n[timing] watched launch, host 2 {where}: '
        + ', '.join(f'p{p} {r["elapsed"]:.2f} s' for p, r in enumerate(results))
    )
    assert len({r['head'] for r in results}) == 1, results  # one verdict, the late host's too
    for pid, r in enumerate(results):
        assert r['error'] == 'BarrierTimeoutError' and r['missing'] == [2], (pid, r)
        assert r['state'] == 'failed' and r['aligned'], (pid, r)
        if pid != 2:
            assert T - 0.1 <= r['elapsed'] <= T + SLACK, (pid, r)
    head, text = results[0]['head'], results[0]['text']
    assert head.startswith(f"timed out after {T:g} s in launch('train_step')"), head
    assert 'process 2 did not arrive' in head, head
    if where == 'late':
        assert results[2]['elapsed'] < 1.0, results[2]  # late: the verdict waits for it
        assert "process 2: last reached barrier('before the late launch')" in text, text
    else:
        assert '(comparing the programs compiled for a new signature)' in head, head
        assert "process 2: still inside launch('train_step')" in text, text
        assert 'busy before this stage' in text, text


def _different_watched_functions(timeout: float) -> dict:
    """Host 1 launches eval_step while the others launch train_step."""
    pid = _kv.process_index()
    train = multihost.watch(jax.jit(lambda a: a * 2), name='train_step')
    evaluate = multihost.watch(jax.jit(lambda a: a + 1), name='eval_step')
    a = _sharded()
    t0 = time.monotonic()
    try:
        with _check_timeout(timeout):
            (evaluate if pid == 1 else train)(a)
        out: dict = dict(error=None)
    except multihost.CollectiveMismatchError as exc:
        out = dict(error=type(exc).__name__, text=str(exc))
    out['elapsed'] = time.monotonic() - t0
    multihost.barrier('after different functions', timeout=30)
    return out


def test_hosts_launching_different_watched_functions_all_raise_at_once(mp_cluster):
    """eval_step on host 1, train_step elsewhere: the same mismatch everywhere, not a timeout."""
    results = mp_cluster.run(_different_watched_functions, 30.0, timeout=90, bracket=False)
    print(
        '\n[timing] different watched functions: '
        + ', '.join(f'p{p} {r["elapsed"]:.2f} s' for p, r in enumerate(results))
    )
    assert len({r['text'] for r in results}) == 1, results
    text = results[0]['text']
    assert results[0]['error'] == 'CollectiveMismatchError', text
    assert 'processes are about to launch different functions' in text, text
    assert 'process 1: eval_step(' in text and 'processes 0, 2-3: train_step(' in text, text
    assert all(r['elapsed'] < 5.0 for r in results), results  # judged, not timed out (30 s)


# -- a dead host (a recoverable cluster of its own) ----------------------------------

HEARTBEAT = 5  # seconds until the coordinator declares a silent process dead


def _dead_host(timeout: float) -> dict:
    """Host 2 SIGKILLs itself; host 1 asks, at once and after the coordinator noticed."""
    pid = _kv.process_index()
    step = multihost.watch(jax.jit(lambda a: a * 2), name='train_step')
    x = np.ones(4, np.float32)
    step(x)
    multihost.barrier('before the kill', timeout=30)
    victim = _os_pid(2)  # registered by its debug thread before the barrier (kept after death)
    if pid == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    # Host 2 may leave the barrier after host 1 does: ask once it is really dead
    # (a zombie or reaped), not while its debug thread can still answer.
    wait_until(lambda: _dead(victim), 10, 'process 2 to die of its SIGKILL')
    killed = time.monotonic()
    out: dict = {}
    if pid == 1:
        out['at once'] = _ask(timeout)
    time.sleep(max(0.0, killed + HEARTBEAT + 1.0 - time.monotonic()))  # declared dead now
    if pid == 1:
        out['declared dead'] = _ask(timeout)
        # Known to be gone (a notebook knows which engine died): not waited for.
        gone = {2: 'gone (signal 9)'}
        t0 = time.monotonic()
        wf = multihost.wavefront(timeout=timeout, gone=gone)
        stacks = multihost.where(timeout=timeout, gone=gone)
        recs = multihost.flight_records(timeout=timeout, gone=gone)
        out['gone'] = dict(
            elapsed=time.monotonic() - t0,
            silent=wf.silent,
            doing=wf.hosts[2].doing,
            stacks={p: (s.answered, s.error) for p, s in stacks.items()},
            records=sorted(recs),
        )
    # The survivors meet (a barrier of just them), then launch: host 2 alone is missing.
    assert _kv.ack(_kv.client(), 'test/survivors', [0, 1, 3], timeout=30)
    t0 = time.monotonic()
    try:
        with _check_timeout(timeout):
            step(x)
        out['launch'] = dict(error=None)
    except multihost.BarrierTimeoutError as exc:
        out['launch'] = dict(head=str(exc).splitlines()[0], missing=exc.missing)
    out['launch']['elapsed'] = time.monotonic() - t0
    return out


# Release rotation; covered on every landing by a killed host named by the survivors:
# tests/engine/test_faults.py; a silent host: test_a_host_that_cannot_answer_is_named_silent_...
@pytest.mark.release
def test_a_dead_host_is_named_by_the_wavefront_records_and_watched_launches(tmp_path):
    """SIGKILL on host 2 (recoverable): silent within the timeout; watched launches time out."""
    here = os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))
    )  # the workers import _helpers from here
    path = os.pathsep.join(filter(None, [here, os.environ.get('PYTHONPATH', '')]))
    with LocalCluster(
        4,
        1,
        recoverable=True,
        heartbeat_timeout=HEARTBEAT,
        log_dir=str(tmp_path),
        env={'PYTHONPATH': path},
    ) as cluster:
        results = cluster.run(_dead_host, T, timeout=90, bracket=False, expect_exit=[2])
    for when in ('at once', 'declared dead'):
        r = results[1][when]
        print(
            f'\n[timing] dead host, {when}: wavefront {r["front_s"]:.2f} s, '
            f'records {r["records_s"]:.2f} s'
        )
        for took in (r['front_s'], r['records_s']):
            assert T - 0.1 <= took <= T + SLACK, (when, r)
        assert r['silent'] == (2,), (when, r['text'])
        assert r['errors'] == {2: f'no answer within {T:g} s'}, (when, r['errors'])
        assert r['records'] == [0, 1, 3] and r['timeline_silent'] == (2,), (when, r)
    gone = results[1]['gone']
    print(f'[timing] dead host named gone: wavefront + stacks + records {gone["elapsed"]:.2f} s')
    assert gone['elapsed'] < 1.5, gone  # three calls, none waiting for host 2
    assert gone['silent'] == (2,) and gone['doing'] == 'gone (signal 9)', gone
    assert gone['stacks'][2] == (False, 'gone (signal 9)'), gone
    assert all(gone['stacks'][p][0] for p in (0, 1, 3)), gone
    assert gone['records'] == [0, 1, 3], gone
    launches = {p: results[p]['launch'] for p in (0, 1, 3)}
    print(
        '[timing] dead host, watched launch: '
        + ', '.join(f'p{p} {r["elapsed"]:.2f} s' for p, r in launches.items())
    )
    assert len({r['head'] for r in launches.values()}) == 1, launches
    for p, r in launches.items():
        assert r['missing'] == [2], (p, r)
        assert T - 0.1 <= r['elapsed'] <= T + SLACK, (p, r)
    assert 'process 2 did not arrive' in launches[0]['head'], launches
