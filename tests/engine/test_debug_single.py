"""Stack dumps, stepping and the control endpoint in one process; the debug model on its own."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import threading
import time
from multiprocessing import AuthenticationError

import pytest
from _helpers import source_line, wait_until

import multihost
from multihost._debug import _stacks, _stepgate
from multihost._exchange._sequence import CollectiveRecord


def _rec(seq, process, name='a', kind='barrier', digest='', site='train.py:10'):
    return CollectiveRecord(
        seq=seq, kind=kind, name=name, digest=digest, site=site, time=0.0, process=process
    )


# -- the model ---------------------------------------------------------------------------


def test_step_table_marks_divergence_and_odd_host():
    """Host 3 at another barrier: the held step is divergent, host 3 is the odd one out."""
    records = [_rec(6, p) for p in range(4)] + [_rec(7, p, 'save') for p in range(3)]
    records.append(_rec(7, 3, 'eval', site='train.py:99'))
    table = multihost.StepTable.build(
        records, released=[6], num_processes=4, stepping=True, waiting=[(7, p) for p in range(4)]
    )
    old, new = table.steps
    assert (old.seq, old.status, old.divergent) == (6, 'passed', False)
    assert (new.seq, new.status, new.divergent) == (7, 'paused', True)
    assert new.odd_processes == (3,) and new.majority.name == 'save'
    assert table.pending is new and table.next_release == 7
    assert table.divergent == (new,)
    assert table.positions == (7, 7, 7, 7)
    text = table.format()
    assert 'DIVERGENT' in text and "barrier('eval') @ train.py:99" in text
    assert text.count('<-- differs') == 1 and text.count('[waiting]') == 4


def test_step_table_missing_hosts_and_release_ahead():
    """Hosts not yet arrived are listed as missing; with nothing held, release runs ahead."""
    table = multihost.StepTable.build(
        [_rec(4, 0), _rec(4, 2)],
        released=[],
        num_processes=3,
        stepping=True,
        waiting=[(4, 0), (4, 2)],
    )
    (step,) = table.steps
    assert step.arrived == (0, 2) and step.missing == (1,) and not step.complete
    assert step.records[1] is None and 'not arrived' in table.format()
    assert table.next_release == 4
    opened = multihost.StepTable.build(
        [_rec(4, p) for p in range(3)], released=[5, 6], num_processes=3, stepping=False
    )
    assert opened.steps[0].status == 'open' and opened.pending is None
    assert opened.next_release == 7
    empty = multihost.StepTable.build([], [], 2, False)
    assert empty.next_release == 0 and 'no collective in flight' in empty.format()


def test_host_stacks_json_round_trip():
    """A captured HostStacks survives the key-value store's JSON unchanged."""
    stacks = _stacks.capture(0)
    assert multihost.HostStacks.from_json(stacks.to_json()) == stacks
    missing = multihost.HostStacks(process=3, answered=False, current=_rec(9, 3), error='gone')
    assert multihost.HostStacks.from_json(missing.to_json()) == missing
    assert 'no answer: gone' in missing.format()


# -- single process ----------------------------------------------------------------------


def test_where_single_process_sees_blocked_main_thread():
    """From a helper thread while the main thread waits: this process's stacks, main included."""
    out = {}
    done = threading.Event()

    main = threading.get_ident()
    this = test_where_single_process_sees_blocked_main_thread
    wait_line = source_line(this, 'assert done.wait(20)')

    def main_is_waiting():
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_code is not this.__code__:
            frame = frame.f_back
        return frame is not None and frame.f_lineno == wait_line

    def helper():
        # Collect only once the main thread is really blocked in done.wait().
        try:
            wait_until(main_is_waiting, 10, 'the main thread in done.wait()', period=0.01)
            out['stacks'] = multihost.where(timeout=5)
        except AssertionError as exc:
            out['error'] = exc
        done.set()

    threading.Thread(target=helper, daemon=True).start()
    assert done.wait(20)  # the main thread is blocked here while the helper collects
    assert 'error' not in out, out.get('error')
    stacks = out['stacks']
    assert list(stacks) == [0]
    me = stacks[0]
    assert me.answered and me.os_pid == os.getpid() and me.hostname == socket.gethostname()
    assert 'test_where_single_process_sees_blocked_main_thread' in me.where
    assert 'done.wait(20)' in me.main_thread.stack
    assert any('helper' in t.stack for t in me.threads if not t.main)


def test_stepping_single_process_never_pauses():
    """One process has nothing to wait for: stepping is recorded but barriers return at once."""
    try:
        assert multihost.set_stepping(True) == (0,)
        assert multihost.stepping_enabled()
        t0 = time.monotonic()
        multihost.barrier('alone')
        multihost.sync_global_devices('alone too')
        assert time.monotonic() - t0 < 1
        table = multihost.step_table()
        assert table.num_processes == 1 and table.stepping and table.steps == ()
        assert multihost.release() == ()
        with pytest.raises(ValueError, match='steps must be >= 1'):
            multihost.release(0)
        assert multihost.start_debug_daemon() is False
    finally:
        assert multihost.release_all() == ()
    assert not multihost.stepping_enabled()


def test_step_timeout_setting_is_validated(monkeypatch):
    """MULTIHOST_STEP_TIMEOUT must be a positive number; unset means the default."""
    monkeypatch.delenv('MULTIHOST_STEP_TIMEOUT', raising=False)
    assert _stepgate.step_timeout() == multihost.DEFAULT_STEP_TIMEOUT
    monkeypatch.setenv('MULTIHOST_STEP_TIMEOUT', 'soon')
    with pytest.raises(ValueError, match='MULTIHOST_STEP_TIMEOUT'):
        _stepgate.step_timeout()
    monkeypatch.setenv('MULTIHOST_STEP_TIMEOUT', '-1')
    with pytest.raises(ValueError, match='positive'):
        _stepgate.step_timeout()


# -- control endpoint --------------------------------------------------------------------


def test_control_endpoint_round_trip_single_process():
    """A ControlClient gets stacks and the step table from an endpoint in this process."""
    key = secrets.token_bytes(16)
    host, port = multihost.serve_control(key)
    assert host == socket.gethostname() and port > 0
    with multihost.ControlClient((host, port), key, timeout=10) as ctl:
        assert ctl.info()['num_processes'] == 1
        stacks = ctl.where(timeout=5)
        assert stacks[0].answered
        assert 'test_control_endpoint_round_trip_single_process' in stacks[0].where
        assert isinstance(ctl.step_table(), multihost.StepTable)
        with pytest.raises(RuntimeError, match='steps must be >= 1'):
            ctl.release(0)
        assert ctl.release_all() == ()
    bound = multihost.serve_control(key, ('127.0.0.1', 0))
    assert bound[0] == '127.0.0.1'


def test_control_endpoint_rejects_a_wrong_key():
    """A client with another authkey is refused, not served."""
    host, port = multihost.serve_control(secrets.token_bytes(16), ('127.0.0.1', 0))
    with pytest.raises(AuthenticationError, match='refused the authkey'):
        multihost.ControlClient((host, port), secrets.token_bytes(16), timeout=5)


def test_control_client_times_out_on_a_silent_server():
    """A server that accepts but never answers makes the client raise TimeoutError, not hang."""
    silent = socket.create_server(('127.0.0.1', 0))
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match='handshake'):
            multihost.ControlClient(silent.getsockname(), b'key', timeout=1)
        assert time.monotonic() - t0 < 10
    finally:
        silent.close()


def test_control_client_requires_bytes_key():
    """authkey must be bytes on both sides."""
    with pytest.raises(TypeError, match='authkey'):
        multihost.serve_control('secret')
    with pytest.raises(TypeError, match='authkey'):
        multihost.ControlClient(('127.0.0.1', 1), 'secret')


def test_a_poll_loop_through_pythons_library_stands_still_a_call_elsewhere_moves():
    """Busy or wedged: the stack signature of a main thread that polls (``os.path.exists``,
    ``Event.wait``: Python's own library, in and out every turn) is the same at every
    turn; the main thread in another function of the program is a move."""
    import os.path

    from multihost._debug import _pulse

    def sampled(loop) -> list[int | None]:
        seen: list[int | None] = []
        done = threading.Event()

        def sampler() -> None:
            time.sleep(0.02)  # the main thread is in its loop
            for _ in range(40):
                seen.append(_pulse._stack_signature())
                time.sleep(0.003)
            done.set()

        t = threading.Thread(target=sampler)
        t.start()
        loop(done)
        t.join(10)
        return seen

    def poll(done: threading.Event) -> None:
        event = threading.Event()
        while not done.is_set():
            os.path.exists('/nonexistent/mh')  # genericpath: Python code
            event.wait(0.002)  # threading: Python code around a lock
            time.sleep(0.001)

    def elsewhere(done: threading.Event) -> None:
        while not done.is_set():
            time.sleep(0.001)

    polling = sampled(poll)
    assert len(set(polling)) == 1, polling
    assert polling[0] not in sampled(elsewhere), 'another function of the program is a move'
