"""Session lifecycle on real ipyparallel clusters: connect() to a cluster started by
someone else (engine ids != process indices), restart, stop, and start failures."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from _helpers import env_var, magic_shell, wait_until

import mhnotebook
from mhnotebook import SessionError

pytestmark = pytest.mark.cluster


def test_connect_discovers_process_order_and_gathers():
    """connect() to a cluster whose JAX processes were numbered in reverse engine order."""
    import ipyparallel as ipp

    from multihost.testing import free_port

    cluster = ipp.Cluster(n=3, log_level=logging.WARNING)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(3, timeout=120)
        ids = sorted(client.ids)
        port = free_port()
        from mhnotebook._trampoline import call as _call

        pending = [
            client[e].apply_async(
                _call,
                'multihost.engine.initialize',
                f'127.0.0.1:{port}',
                3,
                2 - i,
                2,
                platform='cpu',
            )
            for i, e in enumerate(ids)
        ]
        for ar in pending:
            ar.get(timeout=120)
        session = mhnotebook.connect(
            cluster_id=cluster.cluster_id, profile='default', progress=False, timeout=60
        )
        try:
            assert session.engine_ids == list(reversed(ids))
            session.execute(
                'import jax, numpy as np\nv = np.full(2, jax.process_index())', echo=False
            )
            out = session.allgather('v')
            np.testing.assert_array_equal(out, [[0, 0], [1, 1], [2, 2]])
            # Installed on every engine (connect's install is a no-op after initialize's).
            assert all(session.call('multihost._job._install.installed'))
        finally:
            said = session.stop()
        assert not session.running
        # The cluster belongs to whoever started it: a connected session leaves it running.
        assert len(client.ids) == 3
        assert said.startswith('disconnected from the cluster of 3 processes') and (
            'keep running' in said
        ), said
    finally:
        client.close()
        cluster.signal_engines_sync(9)
        cluster.stop_cluster_sync()


def test_restart_and_stop_are_safe(tmp_path):
    """restart() gives fresh initialized engines; stop() is idempotent; stopped says so;
    ``%mh_cluster stop`` says what it stopped and that nothing of it is left running."""
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    # A %mh_attach that failed before this session was held is history once it is stopped:
    # the magics then say the cluster was stopped, not that the attach failed.
    ip, _ = magic_shell(None)
    with pytest.raises(UsageError):
        ip.run_line_magic('mh_attach', f'{tmp_path}/no-job.json --timeout 1')
    session = mhnotebook.start_local(2, 1, progress=False)
    cap = None
    try:
        old_pids = {h.pid for h in session.processes}
        session.execute('x = 41', echo=False)
        session.restart()
        assert {h.pid for h in session.processes}.isdisjoint(old_pids)
        with pytest.raises(SessionError, match="name 'x' is not defined"):
            session.allgather('x')
        session.execute('import jax\nx = jax.process_index() + 1', echo=False)
        np.testing.assert_array_equal(session.allgather('x'), [1, 2])
        pids = {h.pid for h in session.processes}
        ip, _ = magic_shell(session)
        with capture_output() as cap:
            ip.run_line_magic('mh_cluster', 'stop')
    finally:
        session.stop()
    assert cap is not None and cap.stdout == (
        '%mh_cluster stop: stopped the cluster of 2 processes x 1 device: its engines, '
        'controller and watchdog ended; nothing of it is left running.\n'
    ), cap.stdout
    assert not pids & _engine_processes()
    assert session.stop().startswith('the session was stopped already')
    with pytest.raises(SessionError, match='this session is stopped'):
        session.allgather('x')
    # A magic after the stop says the cluster was stopped, not that there never was one.
    for magic, line in (('mh_cluster', 'stop'), ('mh_allgather', 'x')):
        with pytest.raises(UsageError, match='^no cluster: the last one was stopped. Start'):
            ip.run_line_magic(magic, line)


def test_start_local_rejects_bad_sizes():
    """Bad sizes fail at once with the expected form, before starting anything."""
    with pytest.raises(ValueError, match='n >= 1'):
        mhnotebook.start_local(0, 2)


def _engine_processes(mark: bytes = b'') -> set[int]:
    """Engines and controllers running (with ``mark`` in their environment: this test's)."""
    import os

    pids = set()
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/cmdline', 'rb') as f:
                    cmd = f.read().replace(b'\0', b' ')
                if mark:
                    with open(f'/proc/{entry}/environ', 'rb') as f:
                        if mark not in f.read().split(b'\0'):
                            continue
            except OSError:
                continue
            if b'ipyparallel.engine' in cmd or b'ipyparallel.controller' in cmd:
                pids.add(int(entry))
    return pids


def test_start_timeout_is_clear_and_leaves_nothing_running():
    """Engines not up in time: a SessionError saying so; no engine or controller left."""

    import secrets

    # Marked by an environment variable they inherit: another test process (pytest-xdist's
    # other worker) may start engines meanwhile.
    token = f'MH_LIFECYCLE_TEST={secrets.token_hex(4)}'
    with env_var('MH_LIFECYCLE_TEST', token.split('=', 1)[1]):
        with pytest.raises(SessionError, match=r'engines came up within'):
            mhnotebook.start_local(2, 1, timeout=0.05, progress=False)
    mark = token.encode()
    wait_until(lambda: not _engine_processes(mark), 30, 'the engines to exit', period=0.5)
