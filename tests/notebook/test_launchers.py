"""Real clusters, without starting one: launcher options passed through to ipyparallel,
the connection file handed to ipyparallel's Client, the controller-facing address.

(Starting engines with the SSH launcher and connecting to hosts with their own
addresses is tested for real in ``test_netns_cluster.py``.)
"""

from __future__ import annotations

import time

import pytest
from _helpers import magic_shell
from IPython.core.error import UsageError

import mhnotebook
from mhnotebook._cluster import local
from mhnotebook._magics import _cluster_actions
from multihost import engine
from multihost.engine import net


def _cluster(**options):
    """The ipyparallel.Cluster `start_local` would start with these options (not started)."""
    import ipyparallel as ipp

    base = dict(n=2, devices_per_process=None, progress=False, recoverable=False)
    base['heartbeat_timeout'] = None
    return ipp.Cluster(n=2, **local._cluster_config({**base, **options}))


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
    assert not local._is_local_launcher(engines) and local._is_local_launcher(None)


def test_the_controller_pings_every_second_unless_told_otherwise():
    """The controller's ping period is 1 s (an engine registers at the first ping after it
    connects: a start waits less) with 30 misses allowed (ipyparallel's 30 s before an engine
    is taken for dead); a caller's own HeartMonitor settings and other arguments stay."""
    assert _cluster().controller_args == [
        '--HeartMonitor.period=1000',
        '--HeartMonitor.max_heartmonitor_misses=30',
    ]
    own = ['--HeartMonitor.period=5000', '--log-level=DEBUG']
    assert _cluster(controller_args=own).controller_args == own
    other = _cluster(controller_args=['--log-level=DEBUG']).controller_args
    assert other == ['--log-level=DEBUG', *_cluster().controller_args]


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
    monkeypatch.setattr(net, '_controller_hint', None)
    address, how = engine.controller_address('tcp://127.0.0.1:5555')
    assert address == '127.0.0.1'
    assert 'reach the controller at 127.0.0.1' in how and "notebook's connection file" in how
    monkeypatch.setattr(net, '_controller_hint', None)
    monkeypatch.setattr(net, '_engine_registration_url', lambda: None)
    address, how = engine.controller_address()
    assert 'fell back to the address of host name' in how
    assert engine.split_url('tcp://10.1.2.3:4567') == ('10.1.2.3', 4567)
    assert engine.split_url('tcp://[fd00::2]:80') == ('fd00::2', 80)
    assert engine.host_port('fd00::2', 80) == '[fd00::2]:80'
    assert engine.host_port('10.1.2.3', 80) == '10.1.2.3:80'
    port = engine.free_port('127.0.0.1')
    assert 0 < port < 65536


def test_one_route_lookup_and_one_free_port_for_both_sides():
    """SSH host specs and URLs are read alike (user part dropped, a bare IPv6 address kept
    whole); a host with no route and an address not of this machine are errors naming them."""
    import multihost.testing

    assert multihost.testing.free_port is engine.free_port
    assert net.split_url('root@10.1.2.3:2222') == ('10.1.2.3', 2222)
    assert net.split_url('fd00::2') == ('fd00::2', 0)
    assert net.split_url('me@[fd00::2]:22') == ('fd00::2', 22)
    assert net.route_source('me@127.0.0.1:2222') == '127.0.0.1'
    assert net.route_source('tcp://127.0.0.1:5555') == '127.0.0.1'
    with pytest.raises(OSError, match="no route from .* to 'no-such-host.invalid'"):
        net.route_source('no-such-host.invalid')
    with pytest.raises(mhnotebook.SessionError, match="'no-such-host.invalid'.*controller_ip="):
        _cluster(engines='ssh', hosts=['me@no-such-host.invalid:22'])
    with pytest.raises(OSError, match="cannot bind a TCP port on '192.0.2.1'"):
        net.free_port('192.0.2.1')


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


class _Result:
    """An ipyparallel AsyncResult stand-in: ready with a value or an error, or never ready."""

    def __init__(self, value=None, error=None, ready=True):
        self.value, self.error, self._ready = value, error, ready

    def ready(self):
        return self._ready

    def wait(self, timeout):
        if not self._ready:
            time.sleep(timeout)

    def get(self, timeout):
        if self.error is not None:
            raise self.error
        return self.value


def test_jax_initialization_names_the_engines_that_raised_and_those_that_did_not_finish():
    """Engine ids 5, 7, 9 become processes 0, 1, 2; each gets the coordinator once, also as
    the bind address; 7 raises, 9 never answers: the error names both by engine id."""
    from mhnotebook._cluster import jaxinit
    from mhnotebook._cluster.progress import Progress

    calls = {}
    results = {5: _Result({'pid': 5}), 7: _Result(error=RuntimeError('no coordinator')), 9: None}

    class View:
        def __init__(self, e):
            self.e = e

        def apply_async(self, _f, qualname, *args, **kwargs):
            calls[self.e] = (qualname, args, kwargs)
            return results[self.e] or _Result(ready=False)

    client = {e: View(e) for e in results}
    with pytest.raises(mhnotebook.SessionError) as info:
        jaxinit.initialize(
            client,
            [5, 7, 9],
            coordinator='10.0.0.1:1234',
            timeout=0.3,
            progress=Progress(False, ''),
        )
    message = str(info.value)
    assert 'engines [7] raised, engines [9] did not finish within 0.3 s' in message
    assert 'no coordinator' in message and 'listens on 10.0.0.1:1234 only' in message
    assert [calls[e][1][:3] for e in (5, 7, 9)] == [('10.0.0.1:1234', 3, p) for p in range(3)]
    assert {calls[e][2]['coordinator_bind_address'] for e in calls} == {'10.0.0.1:1234'}
    results[7], results[9] = _Result({'pid': 7}), _Result({'pid': 9})
    infos = jaxinit.initialize(
        client, [5, 7, 9], coordinator='10.0.0.1:1234', timeout=5, progress=Progress(False, '')
    )
    assert infos == {e: {'pid': e} for e in (5, 7, 9)}
