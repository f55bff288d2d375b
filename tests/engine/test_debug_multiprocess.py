"""Stack dumps and barrier stepping (docs/API.md §4.4), on 4 real JAX processes x 2 CPU devices.

The point of both features is that they work while the hosts' main threads
are blocked, so these tests block main threads on purpose (in barriers, at
step gates, in user code) and ask from another host, another thread, or
another process. Every wait is bounded: barrier and gate timeouts are short
in this cluster, helpers poll with deadlines, and the harness kills the
cluster after each test's own timeout.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import threading
import time

import jax
import pytest
from _helpers import wait_until

import multihost
from multihost import _jax_adapter
from multihost._exchange import _kv
from multihost._exchange._sequence import CollectiveRecord

MP_CLUSTER = dict(n=4, devices_per_process=2)
#: Read at call time: set in the shared cluster's workers while this module runs.
MP_CLUSTER_ENV = {'MULTIHOST_TIMEOUT': '60', 'MULTIHOST_STEP_TIMEOUT': '60'}
multiprocess = pytest.mark.multiprocess
HOSTS = (0, 1, 2, 3)


def _arrived_at(name, hosts=HOSTS):
    """The step (from step_table) where ``hosts`` have all published barrier ``name``, or None."""
    table = multihost.step_table()
    for step in table.steps:
        recs = [step.records[p] for p in hosts]
        if all(r is not None and r.name == name for r in recs):
            return table, step
    return None


def _signal(key):
    _jax_adapter.client().key_value_set(key, '1', allow_overwrite=True)


def _await_signal(key, timeout=60.0):
    _jax_adapter.client().blocking_key_value_get(key, int(timeout * 1000))


def _site_file(rec: CollectiveRecord) -> str:
    return rec.site.rsplit(':', 1)[0]


def _on_host_0(fn):
    """Starts ``fn()`` in a daemon thread of host 0 (while its main thread blocks); returns
    ``join(timeout)``, which gives ``fn``'s value or raises its error here. Other hosts: None."""
    if jax.process_index() != 0:
        return None
    out: dict = {}

    def run():
        try:
            out['value'] = fn()
        except BaseException as exc:
            out['error'] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout):
        thread.join(timeout)
        assert not thread.is_alive()
        if 'error' in out:
            raise out['error']
        return out['value']

    return join


def _stepping_on_everywhere(key):
    """Process 0 switches stepping on; the others wait until it confirms for all four."""
    multihost.barrier(key + '/warm')  # every debug thread runs
    if jax.process_index() == 0:
        try:
            assert multihost.set_stepping(True, timeout=20) == HOSTS
            assert multihost.step_table().released == ()  # earlier releases forgotten
        finally:
            _signal(key)
    else:
        _await_signal(key)
    assert multihost.stepping_enabled()


# -- stacks ------------------------------------------------------------------------


def _blocked_in_barrier():
    multihost.barrier('stacks-x', timeout=60)


@multiprocess(timeout=90)
def test_hosts_blocked_in_a_barrier_report_their_stacks():
    """Hosts 1-3 wait in a barrier for host 0, which collects their stacks: barrier, call site."""
    multihost.barrier('stacks-warm')
    if jax.process_index() != 0:
        _blocked_in_barrier()
        return
    wait_until(lambda: _arrived_at('stacks-x', (1, 2, 3)), 30, 'hosts 1-3 at stacks-x')
    t0, rpcs = time.monotonic(), _kv.rpc_count()
    stacks = multihost.where(timeout=20)
    rpcs = _kv.rpc_count() - rpcs
    assert time.monotonic() - t0 < 20
    assert sorted(stacks) == list(HOSTS)
    # Replies read in directory sweeps, not one get per host: a few RPCs whatever N.
    print(f'where at {len(HOSTS)} hosts: {rpcs} RPCs on the issuer')
    assert rpcs <= 16, rpcs
    for p in (1, 2, 3):
        s = stacks[p]
        assert s.answered, s.error
        assert s.process == p and s.os_pid > 0
        assert (s.current.kind, s.current.name) == ('barrier', 'stacks-x')
        assert _site_file(s.current) == __file__
        main = s.main_thread.stack
        assert '_blocked_in_barrier' in main and 'run_round' in main, main
        assert '_blocked_in_barrier' in s.where
        assert 'multihost-debug' not in {t.name for t in s.threads}
    own = stacks[0]
    assert own.answered and 'test_hosts_blocked_in_a_barrier_report_their_stacks' in own.where
    assert ', in where' in own.main_thread.stack  # multihost.where
    _blocked_in_barrier()  # host 0 joins: everyone is released


def _stuck_here():
    # Blocked in native code (a key-value wait), outside any collective.
    _await_signal('test/stuck/unstick', timeout=60)


def _stuck_in_user_code(stacks):
    return stacks if '_await_signal' in stacks[2].where else None


def _collect_while_main_blocked():
    try:
        wait_until(lambda: _arrived_at('stuck-b', (0, 1, 3)), 30, 'hosts 0, 1, 3 at stuck-b')
        # host 2 has left stuck-warm for the others, but on a busy machine its own call may
        # not have returned yet: ask until it stands in `_stuck_here` (a bound, not a sleep)
        return wait_until(
            lambda: _stuck_in_user_code(multihost.where(timeout=20)),
            30,
            'host 2 in _stuck_here',
            period=0.3,
        )
    finally:
        _signal('test/stuck/unstick')


@multiprocess(timeout=90)
def test_host_stuck_outside_collectives_is_located_from_a_thread():
    """Host 2 is stuck in user code; a thread of host 0 (main thread in a barrier) finds it."""
    pid = jax.process_index()
    multihost.barrier('stuck-warm')
    join = _on_host_0(_collect_while_main_blocked)
    if pid == 2:
        _stuck_here()
    multihost.barrier('stuck-b', timeout=60)
    if join is None:
        return
    stacks = join(30)
    assert all(stacks[p].answered for p in HOSTS)
    stuck = stacks[2]
    assert '_await_signal' in stuck.where, stuck.format()
    assert '_stuck_here' in stuck.main_thread.stack
    assert stuck.current.name == 'stuck-warm'  # the last collective it entered
    for p in (0, 1, 3):
        assert stacks[p].current.name == 'stuck-b'
    main0 = stacks[0].main_thread.stack
    assert 'run_round' in main0  # taken while host 0's main thread was blocked
    assert any('_collect_while_main_blocked' in t.stack for t in stacks[0].threads)


# -- stepping ----------------------------------------------------------------------


def _three_barriers():
    multihost.barrier('s1')
    multihost.barrier('s2')
    multihost.barrier('s3')


def _step_through():
    try:
        released = []
        for name in ('s1', 's2', 's3'):
            table, step = wait_until(lambda n=name: _arrived_at(n), 30, f'every host at {name}')
            assert step.status == 'paused' and not step.divergent, table.format()
            assert step.waiting == HOSTS
            assert all(_site_file(r) == __file__ for r in step.records)
            assert len({r.site for r in step.records}) == 1  # same line on every host
            assert table.stepping and table.pending == step
            time.sleep(0.3)  # the hosts really wait for the release
            table2 = multihost.step_table()
            assert table2.positions == (step.seq,) * 4, table2.format()
            stacks = multihost.where(timeout=20)
            assert [stacks[p].gate for p in HOSTS] == [step.seq] * 4
            assert multihost.release() == (step.seq,)
            released.append(step.seq)
        return released
    finally:
        multihost.set_stepping(False, timeout=20)


@multiprocess(timeout=120)
def test_stepping_pauses_every_barrier_until_released():
    """Stepping on: every host waits at each barrier until a thread of host 0 releases that step."""
    _stepping_on_everywhere('test/step1/on')
    join = _on_host_0(_step_through)
    _three_barriers()
    if join is not None:
        s1, s2, s3 = join(60)
        assert s2 == s1 + 1 and s3 == s2 + 1
    # host 0 turned stepping off once it had released s3; wait until every host heard it
    wait_until(lambda: not multihost.stepping_enabled(), 20, 'stepping off')
    multihost.barrier('step1-end')


def _show_divergence():
    try:
        return wait_until(
            lambda: (lambda t: t if t.pending and t.pending.complete else None)(
                multihost.step_table()
            ),
            30,
            'every host at the divergent step',
        )
    finally:
        multihost.release_all(timeout=20)


@multiprocess(timeout=120)
def test_stepping_shows_divergence_before_release():
    """Host 3 at another barrier: divergent in the table while held; all raise once released."""
    _stepping_on_everywhere('test/step2/on')
    join = _on_host_0(_show_divergence)
    name = 'div-b' if jax.process_index() == 3 else 'div-a'
    with pytest.raises(multihost.BarrierMismatchError) as info:
        multihost.barrier(name)
    assert info.value.names == {0: 'div-a', 1: 'div-a', 2: 'div-a', 3: 'div-b'}
    if join is not None:
        table = join(60)
        step = table.pending
        assert step.status == 'paused' and step.divergent and step.odd_processes == (3,)
        assert table.divergent == (step,)
        assert [r.name for r in step.records] == ['div-a'] * 3 + ['div-b']
        assert step.majority.name == 'div-a'
        assert 'DIVERGENT' in table.format() and 'differs' in table.format()
    wait_until(lambda: not multihost.stepping_enabled(), 20, 'stepping off')
    multihost.barrier('step2-end')  # aligned again, not paused


@multiprocess(timeout=90)
def test_unreleased_step_times_out_on_every_host():
    """A step nobody releases raises StepTimeoutError (MULTIHOST_STEP_TIMEOUT), not a hang."""
    _stepping_on_everywhere('test/step3/on')
    os.environ['MULTIHOST_STEP_TIMEOUT'] = '2'
    try:
        t0 = time.monotonic()
        with pytest.raises(multihost.StepTimeoutError, match='was not released within 2 s'):
            multihost.barrier('never-released')
        assert time.monotonic() - t0 < 15
    finally:
        os.environ['MULTIHOST_STEP_TIMEOUT'] = '60'
    # Stepping goes off once every host has timed out: a host that came to the gate late
    # would otherwise be let through by stepping off, into a barrier the others had left.
    _signal(f'test/step3/timed-out/{jax.process_index()}')
    if jax.process_index() == 0:
        for p in HOSTS:
            _await_signal(f'test/step3/timed-out/{p}')
        assert multihost.set_stepping(False, timeout=20) == HOSTS
    wait_until(lambda: not multihost.stepping_enabled(), 20, 'stepping off')
    multihost.barrier('step3-end')  # every host skipped the same step: still aligned


@multiprocess(timeout=60)
def test_release_ahead_lets_hosts_through_without_pausing():
    """Steps released before the hosts arrive do not pause them."""
    _stepping_on_everywhere('test/step4/on')
    if jax.process_index() == 0:
        first, second = multihost.release(2)
        assert second == first + 1
        _signal('test/step4/released')
    else:
        _await_signal('test/step4/released')
    os.environ['MULTIHOST_STEP_TIMEOUT'] = '10'  # a pause would raise, not hang
    try:
        t0 = time.monotonic()
        multihost.barrier('ahead-1')
        multihost.barrier('ahead-2')
        assert time.monotonic() - t0 < 10
    finally:
        os.environ['MULTIHOST_STEP_TIMEOUT'] = '60'
    assert multihost.stepping_enabled()  # released ahead: passed, and still stepping
    _signal(f'test/step4/checked/{jax.process_index()}')
    if jax.process_index() == 0:
        for p in HOSTS:  # every host looked before it is switched off (a slow one may not yet)
            _await_signal(f'test/step4/checked/{p}')
        multihost.set_stepping(False, timeout=20)
        _signal('test/step4/off')
    else:
        _await_signal('test/step4/off')
    multihost.barrier('step4-end')


# -- control endpoint (from a process outside the JAX job) -------------------------------


def _wait_until_stepping(timeout):
    wait_until(multihost.stepping_enabled, timeout, 'stepping switched on from outside')


def _external_body(authkey_hex, address_file):
    """Runs in every process: host 0 serves control; every main thread then blocks."""
    multihost.barrier('ext-warm')
    if jax.process_index() == 0:
        host, port = multihost.serve_control(bytes.fromhex(authkey_hex))
        with open(address_file + '.tmp', 'w') as f:
            f.write(f'{host} {port}')
        os.replace(address_file + '.tmp', address_file)
    _wait_until_stepping(60)
    multihost.barrier('ext-1')
    multihost.barrier('ext-2')
    multihost.barrier('ext-end')
    return jax.process_index()


def _table_at(ctl, name):
    table = ctl.step_table()
    step = table.pending
    if step is not None and step.complete and {r.name for r in step.records} == {name}:
        return table
    return None


def test_control_endpoint_steps_and_dumps_a_blocked_cluster(mp_cluster):
    """From outside the JAX job: stacks and stepping while every engine's main thread is blocked."""
    key = secrets.token_bytes(16)
    address_file = os.path.join(tempfile.mkdtemp(), 'control-address')
    result: dict = {}

    def run():
        try:
            result['value'] = mp_cluster.run(_external_body, key.hex(), address_file, timeout=120)
        except BaseException as exc:
            result['error'] = exc

    engines = threading.Thread(target=run, daemon=True)
    engines.start()
    ctl = None
    try:

        def read_address():
            if not os.path.exists(address_file):
                return None
            host, port = open(address_file).read().split()
            return host, int(port)

        address = wait_until(read_address, 90, 'the control address')
        assert address[0] == socket.gethostname()  # bound to every interface
        ctl = multihost.ControlClient(address, key, timeout=20)
        assert ctl.info()['num_processes'] == 4
        stacks = wait_until(
            lambda: (
                lambda s: (
                    s
                    if all(
                        s[p].answered and '_wait_until_stepping' in s[p].main_thread.stack
                        for p in HOSTS
                    )
                    else None
                )
            )(ctl.where()),
            30,
            'every engine blocked waiting for stepping',
        )
        assert all(s.current.name == 'ext-warm' for s in stacks.values())
        assert ctl.set_stepping(True) == HOSTS
        table = wait_until(lambda: _table_at(ctl, 'ext-1'), 30, 'every host at ext-1')
        seq = table.pending.seq
        stacks = ctl.where()
        assert [stacks[p].gate for p in HOSTS] == [seq] * 4
        assert all(s.current.name == 'ext-1' for s in stacks.values())
        assert ctl.release() == (seq,)
        table = wait_until(lambda: _table_at(ctl, 'ext-2'), 30, 'every host at ext-2')
        assert table.pending.seq == seq + 1
        assert ctl.release_all() == (seq + 1,)
        engines.join(60)
        assert not engines.is_alive()
        if 'error' in result:
            raise result['error']
        assert result['value'] == list(HOSTS)
        assert not ctl.step_table().stepping
    finally:
        if engines.is_alive() and ctl is not None:
            try:
                ctl.release_all()
            except Exception:
                pass
        engines.join(150)
        if ctl is not None:
            ctl.close()
