"""A real cluster path: 4 hosts with their own addresses (network namespaces on a bridge).

The notebook side (this process) is the head node: an ``ipcontroller`` listens
on the bridge's address only, one ``ipengine`` runs in each namespace, and
`mhnotebook.connect` / ``%mh_cluster connect`` attaches through the
controller's connection file. JAX's coordinator must then sit at the address
engine 0 uses to reach the controller (here: its namespace address), since
every host shares this machine's host name. Then ipyparallel's SSH launcher
starts engines through an ``sshd`` in each namespace (``%mh_cluster start
--engines ssh``), and the real-cluster tutorial runs against these hosts.

Root only (``ip netns``); skips elsewhere, fails under ``MH_REQUIRE_NETNS=1``
(CI). Only addresses inside the namespaces made here (and the bridge's) are
contacted.
"""

from __future__ import annotations

import os
import pathlib
import re
import socket
import sys
import time

import _netns
import numpy as np
import pytest
from _helpers import magic_shell, notebook_text, wait_until

import mhnotebook
from multihost.engine import split_url

pytestmark = [pytest.mark.netns, pytest.mark.cluster, pytest.mark.release]

N = 4
ROOT = pathlib.Path(__file__).parent.parent.parent

SETUP = """
import jax, numpy as np, multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
pid = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ('host',))
x = jax.make_array_from_callback(
    (8, 6), NamedSharding(mesh, P('host')), lambda i: np.arange(48.0).reshape(8, 6)[i])
local = np.full(3, pid, dtype=np.int32)
"""


@pytest.fixture(scope='module')
def hosts():
    with _netns.namespace_hosts(N) as made:
        yield made


@pytest.fixture(scope='module')
def controller(hosts, tmp_path_factory):
    made = _netns.start_controller(hosts, str(tmp_path_factory.mktemp('netns-profile')))
    _netns.start_engines(hosts, made)
    return made


@pytest.fixture(scope='module')
def session(controller):
    s = mhnotebook.connect(
        controller.client_file,
        n=N,
        devices_per_process=1,
        platform='cpu',
        timeout=120,
        progress=False,
    )
    try:
        s.execute(SETUP, timeout=120, echo=False)
        yield s
    finally:
        s.stop()


def _listening(pid: int) -> set[tuple[str, int]]:
    """TCP addresses process ``pid`` listens on, read in its own network namespace.

    IPv4-mapped IPv6 listeners (gRPC's) are given as IPv4; ``::`` as ``0.0.0.0``.
    """
    inodes = set()
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            target = os.readlink(f'/proc/{pid}/fd/{fd}')
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    found = set()
    for table in ('tcp', 'tcp6'):  # the tables of the process's namespace
        with open(f'/proc/{pid}/net/{table}') as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != '0A' or cols[9] not in inodes:  # LISTEN
                    continue
                hex_ip, hex_port = cols[1].split(':')
                raw = bytes.fromhex(hex_ip)
                # /proc prints each 32-bit word in host (little-endian) order
                raw = b''.join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                if len(raw) == 16 and raw[:12] == b'\0' * 10 + b'\xff\xff':
                    raw = raw[12:]
                if len(raw) == 16:
                    ip = '0.0.0.0' if raw == b'\0' * 16 else socket.inet_ntop(socket.AF_INET6, raw)
                else:
                    ip = socket.inet_ntop(socket.AF_INET, raw)
                found.add((ip, int(hex_port, 16)))
    return found


def test_without_namespaces_ci_fails_instead_of_skipping(monkeypatch):
    """Where namespaces cannot be made, these tests skip, unless MH_REQUIRE_NETNS=1 (CI)."""
    monkeypatch.setattr(_netns, 'unavailable', lambda: 'network namespaces need root')
    monkeypatch.setenv(_netns.REQUIRE_ENV, '1')
    with pytest.raises(pytest.fail.Exception, match='MH_REQUIRE_NETNS=1 requires'):
        with _netns.namespace_hosts(1):
            pass
    monkeypatch.setenv(_netns.REQUIRE_ENV, '0')
    with pytest.raises(pytest.skip.Exception, match='need root'):
        with _netns.namespace_hosts(1):
            pass


def test_connect_url_file_puts_the_coordinator_on_engine_0s_namespace_address(
    session, hosts, controller
):
    """connect(url_file): coordinator and control endpoint at the address engine 0 uses to
    reach the controller (its namespace address: not loopback, not the shared host name)."""
    p0 = session.processes[0]
    assert sorted(h.address for h in session.processes) == sorted(hosts.addresses)
    infos = session.call('multihost.engine.engine_info')
    assert [i['address'] for i in infos] == [h.address for h in session.processes]
    for info in infos:
        assert f'reach the controller at {hosts.gateway}' in info['address_from'], info
    host, port = split_url(infos[0]['coordinator'])
    assert host == p0.address and host.startswith(hosts.prefix + '.'), infos[0]
    assert not host.startswith('127.') and host != p0.hostname
    assert {i['coordinator'] for i in infos} == {infos[0]['coordinator']}
    assert session._control_address[0] == p0.address
    # Process 0 listens on its namespace address only: coordination service, control endpoint.
    listening = _listening(p0.pid)
    assert (p0.address, port) in listening
    assert tuple(session._control_address) in listening
    wide = [a for a in listening if a[0] == '0.0.0.0']
    assert not wide, f'engine 0 listens on every interface: {wide}'


def test_gather_with_shared_memory_and_zmq_across_namespaces(session):
    """Same machine: /dev/shm works across namespaces; zmq forced travels over the bridge."""
    want = np.arange(48.0).reshape(8, 6)
    for transport in ('auto', 'shm', 'zmq'):
        np.testing.assert_array_equal(session.allgather('x', transport=transport), want)
        got = session.allgather('local', transport=transport)
        np.testing.assert_array_equal(got, np.repeat(np.arange(N), 3).reshape(N, 3))
    # Device collectives (gloo) between the hosts, beyond the small-data path (> 512 KiB).
    session.execute(
        'firsts = multihost.process_allgather(np.full(200_000, pid, np.float32))[:, 0]\n'
        'total = float(jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(x))',
        timeout=120,
        echo=False,
    )
    firsts = session.allgather('firsts', transport='zmq')
    np.testing.assert_array_equal(firsts, [list(range(N))] * N)
    assert session.allgather('total').tolist() == [want.sum()] * N


def test_tcp_stream_across_namespaces_and_fallback_when_unreachable(session):
    """'tcp' streams over the bridge into the notebook; a host that cannot reach the
    notebook's listener makes 'auto' fall back to ipyparallel and 'tcp' say why."""
    from mhnotebook import SessionError
    from mhnotebook._transfer._gather import allgather
    from mhnotebook._transfer._stream import Listener

    want = np.arange(48.0).reshape(8, 6)
    big = 'big = np.arange(2.0**19).reshape(512, 1024) + pid'  # 4 MiB per host: streamed
    session.execute(big, echo=False)
    np.testing.assert_array_equal(session.allgather('x', transport='tcp'), want)
    got = session.allgather('big', transport='tcp')
    assert got.shape == (N, 512, 1024) and got[:, 0, 0].tolist() == list(range(N))
    state = session._gathers
    assert not state.listener().address[0].startswith('127.')  # the bridge address
    # A listener on the notebook's loopback: no namespace host can reach it.
    good = state._listener
    state._listener = Listener('127.0.0.1')
    state.plans.clear()
    try:
        with pytest.raises(SessionError, match="transport='tcp': a host cannot reach"):
            session.allgather('big', transport='tcp')
        state.unreachable = None
        # 'auto' as for hosts on other machines (here they share /dev/shm): falls back.
        got = allgather(
            session.call_tool,
            'big',
            machines=['elsewhere'] * N,
            state=state,
            timeout=60,
            transport='auto',
            progress=False,
        )
        assert got[:, 0, 0].tolist() == list(range(N))
        assert state.unreachable and '127.0.0.1' in state.unreachable
    finally:
        state._listener.close()
        state._listener, state.unreachable = good, None


def test_every_magic_on_namespace_hosts(session, hosts):
    """%%mh, %mh_allgather (default and zmq), %mh_barrier, %mh_where and %mh_step (control
    endpoint at engine 0's namespace address), %mh_cluster status."""
    from IPython.utils.capture import capture_output

    from mhnotebook.widgets import WhereView

    ip, magics = magic_shell(session)
    try:
        with capture_output() as cap:
            ip.run_cell_magic('mh', '--timeout 60', 'y = x * 2\nprint("ok", pid)')
        assert all(f'[process {p}] ok {p}' in cap.stdout for p in range(N)), cap.stdout
        with capture_output() as cap:
            ip.run_line_magic('mh_allgather', 'y -o full')
        np.testing.assert_array_equal(ip.user_ns['full'], np.arange(48.0).reshape(8, 6) * 2)
        np.testing.assert_array_equal(
            session.allgather('y', transport='zmq'), np.arange(48.0).reshape(8, 6) * 2
        )
        with capture_output() as cap:
            ip.run_line_magic('mh_barrier', 'ckpt --timeout 30')
        assert cap.stdout.count("passed 'ckpt'") == N, cap.stdout
        with capture_output() as cap:
            ip.run_line_magic('mh_cluster', 'status')
        for p, h in enumerate(session.processes):
            said = f'process {p}: engine {h.engine_id} on {h.hostname} ({h.address}, pid'
            assert said in cap.stdout, cap.stdout
        # Stepping: every host pauses at the gate; where and the stepper answer meanwhile.
        ip.run_line_magic('mh_step', 'on')
        with capture_output() as cap:
            ip.run_cell_magic(
                'mh', '', 'multihost.barrier("s1")\nmultihost.barrier("s2")\nprint("done")'
            )
        assert 'running in the background' in cap.stdout

        def at(name):
            step = session.step_table().pending
            return step is not None and step.complete and step.majority.name == name

        wait_until(lambda: at('s1'), 60, 'every host at s1', period=0.2)
        view = ip.run_line_magic('mh_where', '')
        assert isinstance(view, WhereView)
        assert sorted(view.stacks) == list(range(N)) and 's1' in view.text(), view.text()
        ip.run_line_magic('mh_step', 'step')
        wait_until(lambda: at('s2'), 60, 'every host at s2', period=0.2)
        ip.run_line_magic('mh_step', 'continue')
        with capture_output() as cap:
            ip.run_line_magic('mh_wait', '--timeout 60')
        assert cap.stdout.count('] done') == N, cap.stdout
    finally:
        magics.session = None


def test_cluster_connect_magic_attaches_to_initialized_engines(session, controller):
    """%mh_cluster connect --url-file: a second kernel-side session on the same hosts."""
    from IPython.utils.capture import capture_output

    ip, magics = magic_shell(session)
    magics.session = None
    try:
        ip.run_line_magic('mh_cluster', f'connect --url-file {controller.client_file} -n {N}')
        attached = magics.session
        assert attached is not None and attached is not session
        assert [h.address for h in attached.processes] == [h.address for h in session.processes]
        with capture_output() as cap:
            ip.run_cell_magic('mh', '--timeout 60', 'print("again", pid)')
        assert all(f'[process {p}] again {p}' in cap.stdout for p in range(N)), cap.stdout
        assert sorted(attached.where()) == list(range(N))
        ip.run_line_magic('mh_cluster', 'stop')
        assert not attached.running and session.running  # the engines stay: not ours
    finally:
        magics.session = None


def test_real_cluster_tutorial_runs_against_the_namespace_hosts(session, controller, monkeypatch):
    """notebooks/05_real_cluster.ipynb with MH_CLUSTER_URL_FILE: connects to these hosts."""
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / 'notebooks' / '05_real_cluster.ipynb'
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv('MH_CLUSTER_URL_FILE', controller.client_file)
    monkeypatch.setenv('MH_CLUSTER_HOSTS', str(N))
    NotebookClient(nb, timeout=120, kernel_name='python3').execute()
    text = notebook_text(nb)
    assert f'connected to {N} processes' in text, text
    assert 'a real cluster' in text and 'stand-in' not in text, text
    for h in session.processes:
        assert h.address in text, text
    assert f'JAX coordinator: {session.processes[0].address}:' in text, text


def test_ssh_launcher_starts_engines_on_the_namespace_hosts(hosts, tmp_path):
    """%mh_cluster start --engines ssh: ipyparallel's SSH launcher, through an sshd in each
    namespace (a key made here); the controller listens on the bridge address.

    Two of the hosts: the launcher starts engines one by one, a few ssh round trips each.
    """
    from IPython.utils.capture import capture_output

    ssh = _netns.start_sshd(hosts, str(tmp_path / 'ssh'))
    logins = [ssh.logins[1], ssh.logins[3]]
    ip, magics = magic_shell(None)
    line = (
        f'start -n {len(logins)} -d 1 --engines ssh --hosts {",".join(logins)} '
        f'--ssh-args "{" ".join(ssh.options)}" --remote-python {sys.executable} '
        # A profile dir of the hosts' own, as on hosts without a shared file system
        # (and a launcher setting that goes through --set).
        f'--set SSHEngineSetLauncher.remote_profile_dir={tmp_path / "remote-profile"} '
        '--timeout 120'
    )
    t0 = time.monotonic()
    try:
        ip.run_line_magic('mh_cluster', line)
        session = magics.session
        started = time.monotonic() - t0
        assert session._local.cluster.controller_ip == hosts.gateway
        addresses = [login.split('@')[1] for login in logins]
        assert sorted(h.address for h in session.processes) == sorted(addresses)
        launchers = session._local.cluster.engine_set.launchers
        assert sorted(k.split('/')[0] for k in launchers) == sorted(logins)
        remote = {launcher.remote_profile_dir for launcher in launchers.values()}
        assert remote == {str(tmp_path / 'remote-profile')}
        infos = session.call('multihost.engine.engine_info')
        host, _ = split_url(infos[0]['coordinator'])
        assert host == session.processes[0].address
        with capture_output() as cap:
            code = SETUP + 'print("on", multihost.engine.engine_info()["address"])'
            ip.run_cell_magic('mh', '--timeout 60', code)
        for h in session.processes:
            assert f'[process {h.process_index}] on {h.address}' in cap.stdout, cap.stdout
        np.testing.assert_array_equal(
            session.allgather('x', transport='zmq'), np.arange(48.0).reshape(8, 6)
        )
        pids = [h.pid for h in session.processes]
        ip.run_line_magic('mh_cluster', 'stop')
        wait_until(
            lambda: not any(_netns._alive(p) for p in pids),
            20,
            lambda: f'SSH-launched engines to end: {[p for p in pids if _netns._alive(p)]}',
            period=0.2,
        )
        print(f'ssh cluster of {len(logins)} up and JAX initialized in {started:.1f} s')
    finally:
        if magics.session is not None and magics.session.running:
            magics.session.stop()
        magics.session = None


def test_stopping_leaves_nothing_running(session, hosts, controller):
    """After the session stops and the hosts are torn down: no engine, controller, sshd,
    namespace or link of this module is left."""
    session.stop()
    hosts.close()
    assert _netns.leftovers(hosts) == []
    mine = re.compile(re.escape(controller.profile_dir) + '|' + re.escape(hosts.tag))
    left = []
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            try:
                cmdline = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\0', b' ').decode()
            except OSError:
                continue
            if mine.search(cmdline) and int(pid) != os.getpid():
                left.append(f'{pid}: {cmdline}')
    assert not left, left
