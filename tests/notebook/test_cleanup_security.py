"""Nothing outlives the notebook kernel, and nothing listens wider than it must.

Real processes throughout: a "kernel" is a Python subprocess that starts a local
cluster (or connects to one) and is then killed with ``kill -9``; listeners are
read from the OS (psutil); the control endpoint is attacked with a real socket.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from multiprocessing import AuthenticationError

import psutil
import pytest

import mhnotebook
from mhnotebook import _cleanup
from mhnotebook._transfer._shm import ShmPool
from multihost import ControlClient

pytestmark = pytest.mark.cluster

LOOPBACK = ('127.', '::1', '::ffff:127.')
WILDCARD = ('0.0.0.0', '::', '')


def _start_kernel(code: str, timeout: float = 240.0) -> tuple[subprocess.Popen, dict]:
    """Runs ``code`` in a fresh Python process (the "kernel"); returns it and its JSON line."""
    proc = subprocess.Popen(
        [sys.executable, '-c', textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ''
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f'the kernel process did not get ready within {timeout} s:\n{err[-4000:]}')
    return proc, json.loads(line)


def _alive(procs: list[psutil.Process]) -> list[int]:
    """Pids still running (a zombie is dead: it holds nothing but its exit status)."""
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return left


def _listeners(pid: int) -> list[tuple[str, int]]:
    try:
        conns = psutil.Process(pid).net_connections(kind='inet')
    except psutil.NoSuchProcess:
        return []
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]


KERNEL_CODE = """
import glob, json
import mhnotebook
from mhnotebook import _cleanup
s = mhnotebook.start_local(2, 1, progress=False)
s.execute('import numpy as np\\nbig = np.ones(1 << 20, np.float32)', echo=False)
got = s.allgather('big', transport='shm')  # a 8 MiB file in /dev/shm, kept in the pool
assert got.shape == (2, 1 << 20) and float(got.sum()) == 2 * (1 << 20)
print(json.dumps(dict(
    engines=[h.pid for h in s.processes],
    watchdog=s._local.watchdog.pid,
    shm=sorted(glob.glob('/dev/shm/' + _cleanup.shm_prefix() + '*')),
)))
"""


# kill -9 on every landing; a shutdown on the release rotation (what either must leave: none).
# Not `_helpers.rotating`: LocalCluster's workers load this module by its path alone.
@pytest.mark.parametrize('how', [pytest.param('shutdown', marks=pytest.mark.release), 'kill'])
def test_a_dead_kernel_leaves_no_process_and_no_shared_memory(how):
    """A real IPython kernel (jupyter_client, as JupyterLab runs it) starts a local cluster
    and gathers through /dev/shm; then a shutdown request (JupyterLab stopping) or
    ``kill -9`` (OOM, crash) ends it. At most 10 s later no process of the cluster (controller,
    schedulers, engines, nannies) runs, the kernel's shared-memory file is gone, and so is
    the watchdog."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name='python3')
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        out = []
        reply = kc.execute_interactive(
            KERNEL_CODE,
            timeout=240,
            output_hook=lambda m: out.append(m['content'].get('text', '')),
        )
        assert reply['content']['status'] == 'ok', reply['content']
        info = json.loads(''.join(out).strip().splitlines()[-1])
        kernel = psutil.Process(km.provisioner.pid)
        tree = [p for p in kernel.children(recursive=True) if p.pid != info['watchdog']]
        cmdlines = [' '.join(p.cmdline()) for p in tree]
        assert set(info['engines']) <= {p.pid for p in tree}
        assert sum('ipyparallel.controller' in c for c in cmdlines) >= 1
        assert sum('ipyparallel.engine' in c for c in cmdlines) >= 2
        assert info['shm'], 'the gather left no shared-memory file to clean up'
        for path in info['shm']:
            assert f'mhnb-{kernel.pid}-' in os.path.basename(path)  # the owner is in the name
            assert os.stat(path).st_mode & 0o777 == 0o600
        watchdog = psutil.Process(info['watchdog'])
        kc.stop_channels()
    finally:
        t0 = time.monotonic()
        if how == 'kill':
            os.kill(km.provisioner.pid, signal.SIGKILL)
            km.provisioner.process.wait(30)
        km.shutdown_kernel(now=how == 'kill')
    kernel_gone = time.monotonic()
    deadline = kernel_gone + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = time.monotonic() - kernel_gone
    left = _alive(tree)
    for proc in tree:  # do not leave them to the next test
        if proc.pid in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # psutil checks the pid still names this process
    assert not left, f'{len(left)} process(es) still run 10 s after the kernel ended ({how})'
    print(f'\n{how}: kernel ended after {kernel_gone - t0:.2f} s, its cluster {gone:.2f} s later')
    while any(map(os.path.exists, info['shm'])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in info['shm'] if os.path.exists(p)]
    watchdog.wait(timeout=max(deadline - time.monotonic(), 0.1))  # not our child: no code
    assert not _alive([watchdog])


PIPE_DROPPER = """
    import json, os, time
    from mhnotebook import _cleanup
    from mhnotebook._transfer._shm import ShmPool
    buf = ShmPool().acquire(1 << 16)
    dog = _cleanup.start_watchdog('mhnb-no-such-cluster', '/nonexistent-profile')
    assert _cleanup.watchdog_ready(dog, 30)
    dog.stdin.close()  # what a dying kernel's closed files look like to the watchdog
    print(json.dumps(dict(shm=buf.path, watchdog=dog.pid)), flush=True)
    time.sleep(600)
"""


def test_a_pipe_closed_without_stop_is_not_a_stop_the_owners_death_still_cleans_up():
    """A killed kernel closes its end of the watchdog's pipe before /proc shows it dead; the
    watchdog must not take that for ``stop`` (which sweeps nothing): it waits for the pid."""
    owner, info = _start_kernel(PIPE_DROPPER, timeout=60)
    try:
        watchdog = psutil.Process(info['watchdog'])
        time.sleep(1.0)  # several of its 0.25 s looks
        assert _alive([watchdog]), 'the watchdog ended when its pipe closed, the owner alive'
        assert os.path.exists(info['shm'])  # the owner lives: its file stays
    finally:
        owner.kill()
        owner.wait(30)
    deadline = time.monotonic() + 10
    while os.path.exists(info['shm']) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(info['shm']), "the dead owner's shared memory was left"
    watchdog.wait(timeout=max(deadline - time.monotonic(), 0.1))
    assert not _alive([watchdog])


STALE_OWNER = """
    import os
    from mhnotebook._transfer._shm import ShmPool
    buf = ShmPool().acquire(1 << 16)
    print(buf.path, flush=True)
    os.kill(os.getpid(), 9)  # dies without unlinking it
"""


@pytest.fixture(scope='module')
def local_session():
    """A local session, started after a dead process left a shared-memory file behind."""
    stale = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(STALE_OWNER)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    path = stale.stdout.strip()
    assert stale.returncode == -signal.SIGKILL and os.path.exists(path), stale.stderr
    assert os.stat(path).st_mode & 0o777 == 0o600
    live_pool = ShmPool()
    live = live_pool.acquire(1 << 16)  # this process is alive: its file must stay
    logs = _old_watchdog_logs()
    try:
        session = mhnotebook.start_local(1, 1, progress=False)
        try:
            yield session, path, live.path, logs
        finally:
            session.stop()
    finally:
        live_pool.release(live)
        live_pool.close()
        for log in logs:
            if os.path.exists(log):
                os.unlink(log)


def _old_watchdog_logs() -> list[str]:
    """Watchdog logs of 7 clusters of a dead kernel, a day old and older, and an older one
    of a kernel that still runs (this test's parent process), in the profile's ``log/``."""
    from IPython.paths import get_ipython_dir

    log_dir = os.path.join(get_ipython_dir(), 'profile_default', 'log')
    os.makedirs(log_dir, exist_ok=True)
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    owners = [dead] * 7 + [str(os.getppid())]
    logs = []
    for i, owner in enumerate(owners):
        log = os.path.join(log_dir, f'mhnotebook-watchdog-mhnb-{owner}-{i:08x}.log')
        with open(log, 'w') as f:
            f.write('watchdog: ...\n')
        old = time.time() - 86400 * (1 + i)
        os.utime(log, (old, old))
        logs.append(log)
    return logs


def test_next_start_sweeps_shared_memory_of_dead_owners_only(local_session):
    session, stale, live, _ = local_session
    assert not os.path.exists(stale)
    assert os.path.exists(live)


def test_next_start_keeps_the_last_few_watchdog_logs_and_a_running_kernels(local_session):
    """Issue 32 item 9: one watchdog log per cluster started no longer piles up in the
    profile's ``log/``; a log whose kernel still runs stays, however old."""
    session, _, _, seeded = local_session
    log_dir = os.path.join(session._local.cluster.profile_dir, 'log')
    mine = f'mhnotebook-watchdog-{session._local.cluster.cluster_id}.log'
    left = [n for n in os.listdir(log_dir) if n.startswith('mhnotebook-watchdog-')]
    assert mine in left, left
    # 7 dead kernels' logs seeded, at most KEEP_LOGS of any kind kept: the oldest dead go
    # (which of the newer ones stay depends on how many clusters this run started before)
    assert not os.path.exists(seeded[-2]) and os.path.exists(seeded[-1]), left
    others = [n for n in left if n != os.path.basename(seeded[-1])]

    def owner_runs(name: str) -> bool:  # mhnotebook-watchdog-mhnb-<pid>-<id>.log
        pid = name[len('mhnotebook-watchdog-mhnb-') :].split('-')[0]
        return pid.isdigit() and _cleanup.is_alive(int(pid), None)

    # the newest few and this start's own; beyond them only logs of kernels that still run
    # (this test process's earlier clusters among them)
    dead = [n for n in others if not owner_runs(n)]
    assert len(dead) <= _cleanup.KEEP_LOGS + 1, left


def test_local_cluster_listens_on_loopback_only(local_session):
    """Controller, schedulers, engines, nannies: every listening socket is on loopback,
    the JAX coordination service and the control endpoint included."""
    session, _, _, _ = local_session
    cluster = session._local.cluster
    pids = _cleanup.cluster_processes(cluster.cluster_id, cluster.profile_dir)
    engine = session.processes[0].pid
    assert engine in pids and len(pids) >= 3
    found = {pid: _listeners(pid) for pid in pids}
    wide = {p: [a for a in addrs if not a[0].startswith(LOOPBACK)] for p, addrs in found.items()}
    assert not any(wide.values()), f'listening beyond loopback: {wide}'
    # process 0 hosts both the coordination service and the control endpoint
    assert session._control_address in found[engine]
    assert len(found[engine]) >= 2


def test_control_endpoint_refuses_a_wrong_key_and_unpickles_nothing(local_session, tmp_path):
    session, _, _, _ = local_session
    address = session._control_address
    with pytest.raises(AuthenticationError, match='refused the authkey'):
        ControlClient(address, b'not the key 0123', timeout=10)

    # A raw client that skips the handshake and sends a pickle at once: the server
    # must close the connection without unpickling it (it would create `marker`).
    marker = tmp_path / 'unpickled'

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), 'w'))

    payload = pickle.dumps(('info', Evil()))
    with socket.create_connection(address, timeout=10) as sock:
        sock.settimeout(10)
        sock.recv(4096)  # the server's challenge
        sock.sendall(len(payload).to_bytes(4, 'big') + payload)
        try:
            rest = sock.recv(4096)
            while rest and b'FAILURE' not in rest:
                rest = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            pass
    time.sleep(0.5)
    assert not marker.exists()
    # the right key still works
    assert session.control.info()['process'] == 0


def _worker_pid() -> int:  # runs in a LocalCluster worker
    return os.getpid()


def test_simulated_hosts_of_multihost_listen_on_loopback_only():
    """multihost.testing.LocalCluster (tests, benchmarks, scripts): its coordination service too."""
    from multihost.testing import LocalCluster

    with LocalCluster(n=2, devices_per_process=1) as cluster:
        pids = cluster.run(_worker_pid)
        found = {pid: _listeners(pid) for pid in pids}
    assert found[pids[0]], 'process 0 hosts the coordination service'
    wide = {p: [a for a in addrs if not a[0].startswith(LOOPBACK)] for p, addrs in found.items()}
    assert not any(wide.values()), f'listening beyond loopback: {wide}'


def test_a_stray_peer_on_the_harness_listener_neither_stalls_nor_joins_the_cluster():
    """LocalCluster's listener is on an ephemeral port that a leftover peer may still dial (an
    ipyparallel engine reconnecting to its dead controller): a peer that connects and says
    nothing, and one that speaks another protocol, are dropped; the processes start."""
    from multihost.testing import LocalCluster

    strays: list[socket.socket] = []

    class WithStrays(LocalCluster):
        def _accept_all(self, authkey: bytes) -> None:
            assert self._listener is not None
            for greeting in (b'', b'\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f'):  # ZMTP's
                peer = socket.create_connection(self._listener.address, timeout=10)
                peer.sendall(greeting)
                strays.append(peer)
            super()._accept_all(authkey)

    start = time.monotonic()
    try:
        with WithStrays(n=2, devices_per_process=1) as cluster:
            pids = cluster.run(_worker_pid)
    finally:
        for peer in strays:
            peer.close()
    assert len(set(pids)) == 2 and os.getpid() not in pids, pids
    assert time.monotonic() - start < 60  # the silent peer held nobody up


KERNEL_CONNECT = """
    import json, time
    import mhnotebook
    s = mhnotebook.connect(cluster_id={cluster_id!r}, profile='default', progress=False,
                           timeout=120, platform='cpu', devices_per_process=1)
    s.execute('import jax\\nx = jax.process_index()', echo=False)
    print(json.dumps(dict(engines=[h.pid for h in s.processes],
                          address=s.processes[0].address,
                          control=list(s._control_address),
                          watchdog=s._local is not None)), flush=True)
    time.sleep(600)
"""


@pytest.mark.release
def test_connect_binds_the_cluster_address_only_and_never_kills_engines_it_did_not_start():
    """A kernel connects to a cluster someone else started, initializes JAX there, and is
    killed with kill -9: the engines live on, and nothing listened on every interface."""
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=2, log_level=logging.WARNING)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(2, timeout=120)
        engine_pids = client[:].apply_async(os.getpid).get(timeout=60)
        kernel, info = _start_kernel(KERNEL_CONNECT.format(cluster_id=cluster.cluster_id))
        try:
            assert sorted(info['engines']) == sorted(engine_pids)
            assert info['watchdog'] is False
            assert info['control'][0] == info['address']
            listening = {pid: _listeners(pid) for pid in engine_pids}
            wild = {pid: [a for a in addrs if a[0] in WILDCARD] for pid, addrs in listening.items()}
            assert not any(wild.values()), f'listening on every interface: {wild}'
            assert tuple(info['control']) in listening[info['engines'][0]]
        finally:
            kernel.send_signal(signal.SIGKILL)
            kernel.wait(30)
        time.sleep(5)  # 5x longer than a local cluster takes to die with its kernel
        assert client[:].apply_async(os.getpid).get(timeout=30) == engine_pids
    finally:
        client.close()
        cluster.signal_engines_sync(signal.SIGKILL)
        cluster.stop_cluster_sync()
