"""Real clusters, without starting one: launcher options passed through to ipyparallel,
the connection file handed to ipyparallel's Client, the controller-facing address.

(Starting engines with the SSH launcher and connecting to hosts with their own
addresses is tested for real in ``test_netns_cluster.py``.)
"""

from __future__ import annotations

import pytest
from _helpers import magic_shell
from IPython.core.error import UsageError

import mhnotebook
from mhnotebook._cluster import _startup
from mhnotebook._magics import _cluster_actions
from multihost import engine


def _cluster(**options):
    """The ipyparallel.Cluster `start_local` would start with these options (not started)."""
    import ipyparallel as ipp

    base = dict(n=2, devices_per_process=None, progress=False, recoverable=False)
    base['heartbeat_timeout'] = None
    return ipp.Cluster(n=2, **_startup._cluster_config({**base, **options}))


@pytest.mark.parametrize(
    ('engines', 'launcher'),
    [
        ('mpi', 'MPIEngineSetLauncher'),
        ('slurm', 'SlurmEngineSetLauncher'),
        ('ssh', 'SSHEngineSetLauncher'),
    ],
)
def test_start_local_hands_the_engines_to_ipyparallels_launcher(engines, launcher):
    """engines='mpi'|'slurm'|'ssh' becomes ipyparallel.Cluster's engine launcher class, and
    config= settings reach it: nothing of ours launches anything."""
    config = {launcher: {'engine_args': ['--log-level=DEBUG']}}
    cluster = _cluster(engines=engines, controller_ip='10.0.0.2', config=config)
    assert cluster.engine_launcher_class.__name__ == launcher
    assert cluster.controller_ip == '10.0.0.2'
    assert cluster.config[launcher].engine_args == ['--log-level=DEBUG']
    assert not _startup._is_local_launcher(engines) and _startup._is_local_launcher(None)


def test_ssh_hosts_become_the_launchers_engines_and_place_the_controller():
    """hosts=[...] is SSHEngineSetLauncher.engines (one engine per entry); the controller
    listens on the address this machine reaches the first host from."""
    hosts = ['root@127.0.0.1', 'me@127.0.0.1:2222', 'root@127.0.0.1']
    cluster = _cluster(engines='ssh', hosts=hosts)
    assert cluster.config.SSHEngineSetLauncher.engines == {
        'root@127.0.0.1': 2,
        'me@127.0.0.1:2222': 1,
    }
    assert cluster.controller_ip == '127.0.0.1'
    assert (
        _cluster(engines='ssh', hosts=hosts, controller_ip='10.0.0.2').controller_ip == '10.0.0.2'
    )
    with pytest.raises(ValueError, match="hosts= is for engines='ssh'"):
        mhnotebook.start_local(2, engines='slurm', hosts=['a', 'b'])


def test_cluster_start_magic_passes_launcher_options_through(monkeypatch):
    """%mh_cluster start --engines/--controller-ip/--set/--hosts/--ssh-args/--remote-python
    reach start_local as ipyparallel options; mistakes are UsageErrors."""
    calls = []
    monkeypatch.setattr(_cluster_actions, 'start_local', lambda *a, **kw: calls.append((a, kw)))
    ip, magics = magic_shell(None)
    try:
        ip.run_line_magic(
            'mh_cluster',
            'start -n 8 --engines slurm --controller-ip 10.0.0.2 --timeout 60 '
            '--set SlurmEngineSetLauncher.account=me '
            '--set SlurmEngineSetLauncher.timelimit=1:00:00 '
            """--set 'MPIEngineSetLauncher.mpi_args=["-x", "A B"]'""",
        )
        args, kwargs = calls.pop()
        assert args == (8, None)
        assert kwargs['engines'] == 'slurm' and kwargs['controller_ip'] == '10.0.0.2'
        assert kwargs['config'] == {
            'SlurmEngineSetLauncher': {'account': 'me', 'timelimit': '1:00:00'},
            'MPIEngineSetLauncher': {'mpi_args': ['-x', 'A B']},
        }
        ip.run_line_magic(
            'mh_cluster',
            'start -n 2 -d 1 --engines ssh --hosts a@h0,h1:2222 '
            '--ssh-args "-i /k/id -o BatchMode=yes" --remote-python /opt/venv/bin/python',
        )
        args, kwargs = calls.pop()
        assert args == (2, 1) and kwargs['hosts'] == ['a@h0', 'h1:2222']
        ssh = kwargs['config']['SSHEngineSetLauncher']
        assert ssh['ssh_args'] == ssh['scp_args'] == ['-i', '/k/id', '-o', 'BatchMode=yes']
        assert ssh['remote_python'] == '/opt/venv/bin/python'
        with pytest.raises(UsageError, match='--hosts go with --engines ssh'):
            ip.run_line_magic('mh_cluster', 'start --hosts a,b')
        with pytest.raises(UsageError, match='expected CLASS.TRAIT=VALUE'):
            ip.run_line_magic('mh_cluster', 'start --engines mpi --set mpi_args')
        assert not calls
        doc = ip.find_line_magic('mh_cluster').__doc__ or ''
        assert '--engines ssh' in doc and 'connect --url-file' in doc
    finally:
        magics.session = None


def test_connect_hands_the_connection_file_to_ipyparallel(monkeypatch, tmp_path):
    """ipyparallel 8+ ignores Client(url_file=...): connect passes the file as its first
    argument (connection_info); a missing file says so before anything else."""
    import ipyparallel as ipp

    with pytest.raises(OSError, match='not found'):
        mhnotebook.connect(str(tmp_path / 'nope.json'), progress=False)
    path = tmp_path / 'ipcontroller-client.json'
    path.write_text('{}')
    seen = []

    class Refused(Exception):
        pass

    def client(*args, **kwargs):
        seen.append((args, kwargs))
        raise Refused

    monkeypatch.setattr(ipp, 'Client', client)
    with pytest.raises(Refused):
        mhnotebook.connect(str(path), progress=False, timeout=5)
    ((args, kwargs),) = seen
    assert args == (str(path),) and 'url_file' not in kwargs


def test_controller_address_is_the_route_to_the_controller(monkeypatch):
    """The engine's address is the one it sends from toward the controller (no traffic);
    without a controller, the old host-name lookup, and the reason says so."""
    monkeypatch.setattr(engine, '_controller_hint', None)
    address, how = engine.controller_address('tcp://127.0.0.1:5555')
    assert address == '127.0.0.1'
    assert 'reach the controller at 127.0.0.1' in how and "notebook's connection file" in how
    monkeypatch.setattr(engine, '_controller_hint', None)
    monkeypatch.setattr(engine, '_engine_registration_url', lambda: None)
    address, how = engine.controller_address()
    assert 'fell back to the address of host name' in how
    assert engine.split_url('tcp://10.1.2.3:4567') == ('10.1.2.3', 4567)
    assert engine.split_url('tcp://[fd00::2]:80') == ('fd00::2', 80)
    assert engine.host_port('fd00::2', 80) == '[fd00::2]:80'
    assert engine.host_port('10.1.2.3', 80) == '10.1.2.3:80'
    port = engine.free_port('127.0.0.1')
    assert 0 < port < 65536


def test_cluster_connect_magic_passes_the_connection_file(monkeypatch):
    """%mh_cluster connect --url-file F -n N: the file (quotes removed) and N reach connect."""
    calls = []
    monkeypatch.setattr(_cluster_actions, 'connect', lambda *a, **kw: calls.append((a, kw)))
    ip, magics = magic_shell(None)
    try:
        ip.run_line_magic('mh_cluster', 'connect --url-file "/head node/client.json" -n 16')
        ((args, kwargs),) = calls
        assert args == ('/head node/client.json',) and kwargs['n'] == 16
    finally:
        magics.session = None
