"""Starting sessions: `start_local` (a local ipyparallel cluster and its watchdog) and
`connect` (an existing cluster); JAX initialized on every engine.

Both bring engines up and hand them to `Session` as `Engines`; the session
starts process 0's control endpoint itself (it does again after `restart`).
A cluster started here is a `StartedCluster`: the session asks it how an
engine ended, stops it, and relaunches it on `Session.restart`.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mhnotebook._cleanup import start_watchdog, stop_watchdog, sweep_shm, watchdog_ready
from mhnotebook._errors import RemoteFailure, SessionError
from mhnotebook._session import Engines, HostInfo, Session, controller_url
from mhnotebook._trampoline import call as _call

__all__ = ['StartedCluster', 'connect', 'start_local']

log = logging.getLogger('mhnotebook')

_RECOVERABLE_HEARTBEAT = 10  # seconds; JAX's default of 100 is long to wait in a notebook
# start_local's own arguments; the rest of its options go to ipyparallel.Cluster.
_OWN_OPTIONS = ('n', 'devices_per_process', 'progress', 'recoverable', 'heartbeat_timeout')


class _Progress:
    """A one-line progress display: a widget in a notebook, a line on a terminal."""

    def __init__(self, enabled: bool, label: str):
        self.enabled = enabled
        self.handle: Any = None
        self.last = label
        if enabled:
            try:
                from IPython import get_ipython
                from IPython.display import display

                if get_ipython() is not None:
                    self.handle = display({'text/plain': label}, raw=True, display_id=True)
            except ImportError:
                pass
            if self.handle is None:
                print(label, file=sys.stderr, flush=True)

    def update(self, text: str) -> None:
        if not self.enabled or text == self.last:
            return
        self.last = text
        if self.handle is not None:
            self.handle.update({'text/plain': text}, raw=True)
        else:
            print(text, file=sys.stderr, flush=True)


class StartedCluster:
    """A local ipyparallel cluster that `start_local` started, and its watchdog.

    Attributes:
        cluster: the `ipyparallel.Cluster`.
        watchdog: the watchdog process (`_cleanup.start_watchdog`) that kills
            the cluster if this process dies.
        options: the `start_local` arguments (``relaunch`` starts the same).
    """

    def __init__(self, cluster: Any, watchdog: Any, options: Mapping[str, Any]):
        self.cluster = cluster
        self.watchdog = watchdog
        self._options = dict(options)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self._options)

    def _launcher(self, pid: int) -> Any:
        """The ipyparallel launcher of the engine with OS process id ``pid``, or None."""
        try:
            engine_sets = list(self.cluster.engines.values())
        except Exception:
            return None
        for engine_set in engine_sets:
            for launcher in getattr(engine_set, 'launchers', {}).values():
                if getattr(launcher, 'pid', None) == pid:
                    return launcher
        return None

    def exited(self, pid: int) -> bool:
        """Whether that engine has ended (its launcher's process is gone or a zombie)."""
        process = getattr(self._launcher(pid), 'process', None)
        if process is None:
            return False
        try:
            return not process.is_running() or process.status() == 'zombie'
        except Exception:  # psutil.NoSuchProcess: reaped
            return True

    def exit_code(self, pid: int, wait: float = 1.0) -> int | None:
        """That engine's exit code (negative: killed by that signal), if known."""
        process = getattr(self._launcher(pid), 'process', None)
        if process is None:
            return None
        try:
            # psutil caches the code once its launcher's waiter thread reaped the process.
            code = process.wait(timeout=wait)
        except Exception:  # still running, or reaped by someone else
            return None
        return None if code is None else int(code)

    def _kill_engines(self) -> None:
        """SIGKILLs every engine, one by one.

        (ipyparallel's ``signal_engines`` stops at the first engine that is
        already dead, leaving the rest running.)
        """
        for engine_set in list(self.cluster.engines.values()):
            for launcher in list(getattr(engine_set, 'launchers', {}).values()):
                try:
                    launcher.signal(signal.SIGKILL)
                except Exception:  # already gone
                    pass

    def stop(self) -> None:
        """Kills the engines, stops the cluster, then the watchdog (which kills any straggler)."""
        try:
            # JAX's preemption service catches SIGTERM (a preemption notice),
            # so engines of a local cluster are killed outright, and
            # ipyparallel's warnings about the non-zero exit (with each
            # engine's whole log) are expected noise here.
            self.cluster.log.setLevel(logging.ERROR)
            self._kill_engines()
        except Exception:
            pass
        try:
            self.cluster.stop_cluster_sync()
        except Exception as exc:
            log.warning('stopping the local cluster failed: %s', exc)
        if self.watchdog is not None:
            watchdog, self.watchdog = self.watchdog, None
            stop_watchdog(watchdog)

    def relaunch(self, timeout: float) -> Engines:
        """A fresh cluster with the same options (for `Session.restart`)."""
        return _launch_local(self._options, timeout)


def _hosts_from_infos(infos: dict[int, dict[str, Any]]) -> list[HostInfo]:
    return [
        HostInfo(
            process_index=i['process_index'],
            engine_id=e,
            hostname=i['hostname'],
            address=i['address'],
            machine=i['machine'],
            pid=i['pid'],
            local_devices=tuple(i.get('local_devices', ())),
        )
        for e, i in infos.items()
    ]


def _initialize(
    client: Any,
    engine_ids: list[int],
    coordinator: str,
    devices: int | None,
    platform: str | None,
    timeout: float,
    progress: _Progress,
    bind: str | None = None,
    *,
    recoverable: bool = False,
    heartbeat_timeout: int | None = None,
    placed: str = '',
) -> dict[int, dict[str, Any]]:
    """Runs `multihost.engine.initialize` on every engine (the i-th becomes process i).

    ``placed`` says how the coordinator address was chosen (for the error).
    """
    n = len(engine_ids)
    pending = {}
    for pid, e in enumerate(engine_ids):
        pending[e] = client[e].apply_async(
            _call,
            'multihost.engine.initialize',
            coordinator,
            n,
            pid,
            devices,
            platform=platform,
            initialization_timeout=int(max(timeout, 10)),
            coordinator_bind_address=bind,
            recoverable=recoverable,
            heartbeat_timeout=heartbeat_timeout,
        )
    infos: dict[int, dict[str, Any]] = {}
    failures: dict[int, RemoteFailure] = {}
    deadline = time.monotonic() + timeout
    while len(infos) + len(failures) < n and time.monotonic() < deadline:
        for pid, (e, ar) in enumerate(pending.items()):
            if e in infos or e in failures or not ar.ready():
                continue
            try:
                infos[e] = ar.get(0)
            except Exception as exc:
                failures[e] = RemoteFailure.from_exception(pid, exc)
        progress.update(f'mhnotebook: JAX initialized on {len(infos)}/{n} hosts')
        time.sleep(0.05)
    if failures or len(infos) < n:
        missing = sorted(set(engine_ids) - set(infos) - set(failures))
        detail = ''.join(f'\n--- engine {e} ---\n{f.text}' for e, f in failures.items())
        raise SessionError(
            f'jax.distributed.initialize failed (coordinator {coordinator}'
            f'{"; " + placed if placed else ""}): '
            f'engines {sorted(failures)} raised, engines {missing} did not finish within '
            f'{timeout:g} s.{detail}\nCheck that every engine can reach the coordinator '
            f'address (pass coordinator="host:port" to choose it); it listens on '
            f'{bind or "every interface"} only (coordinator_bind="[::]:PORT": every interface).'
        )
    return infos


def _engine_infos(client: Any, engine_ids: list[int]) -> dict[int, dict[str, Any]]:
    """`multihost.engine.engine_info` of each engine (address: the one toward the controller)."""
    results = client[engine_ids].apply_sync(
        _call, 'multihost.engine.engine_info', controller_url(client)
    )
    return dict(zip(engine_ids, results, strict=True))


def _place_coordinator(client: Any, first: int, info: Mapping[str, Any]) -> tuple[str, str]:
    """``(coordinator, how)``: engine ``first``'s address toward the controller, a port free there.

    Engine ``first`` becomes process 0 and hosts the coordination service. Its
    address is the one it uses to reach the controller (`multihost.engine.
    controller_address`): every other host reaches the controller, so it is
    on their network, unlike a host name. The port is probed on engine
    ``first``, bound to that very address.
    """
    from multihost.engine import host_port

    address = str(info['address'])
    how = f'engine {first} (process 0): {info.get("address_from", "its address")}'
    try:
        port = client[first].apply_sync(_call, 'multihost.engine.free_port', address)
    except Exception as exc:
        raise SessionError(
            f'cannot place the JAX coordinator on engine {first} at {address} ({how}): probing '
            f'a free port there failed: {RemoteFailure.from_exception(0, exc).evalue}. Pass '
            'coordinator="HOST:PORT" with an address of that host every host reaches.'
        ) from None
    return host_port(address, int(port)), f'{how}; port {port} probed free there'


def _is_local_launcher(engines: Any) -> bool:
    """Whether ``engines`` names ipyparallel's local engine launcher (the default)."""
    if engines is None:
        return True
    if isinstance(engines, str):
        return engines.lower() in ('local', 'localenginesetlauncher') or engines.endswith(
            '.LocalEngineSetLauncher'
        )
    return getattr(engines, '__name__', '') == 'LocalEngineSetLauncher'


def _launcher_name(engines: Any) -> str:
    return engines if isinstance(engines, str) else getattr(engines, '__name__', str(engines))


def _route_to(host: str) -> str | None:
    """The address this machine sends from to reach ``host`` (``user@host:port`` allowed)."""
    import socket

    name = host.rsplit('@', 1)[-1]
    if name.count(':') == 1:  # host:port (an IPv6 address has more colons)
        name = name.split(':', 1)[0]
    try:
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(
            name.strip('[]'), 9, type=socket.SOCK_DGRAM
        ):
            with socket.socket(family, kind, proto) as s:
                try:
                    s.connect(sockaddr)  # UDP: picks the route, sends nothing
                    return str(s.getsockname()[0])
                except OSError:
                    continue
    except OSError:
        pass
    return None


def _cluster_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """The `ipyparallel.Cluster` options of ``options``: launchers and their settings.

    ``hosts`` (SSH) becomes ``SSHEngineSetLauncher.engines`` (one engine per
    entry), and the controller listens on the address this machine uses to
    reach the first host unless ``controller_ip`` is given.
    """
    from traitlets.config import Config

    cluster_options = {k: v for k, v in options.items() if k not in _OWN_OPTIONS}
    hosts = cluster_options.pop('hosts', None)
    engines = cluster_options.get('engines')
    if hosts:
        if _launcher_name(engines).lower() not in ('ssh', 'sshenginesetlauncher'):
            raise ValueError(
                f"hosts= is for engines='ssh' (ipyparallel's SSH launcher), not {engines!r}; "
                'pass other launchers their settings in config='
            )
        config = Config(cluster_options.pop('config', None) or {})
        counts: dict[str, int] = {}
        for host in hosts:
            counts[host] = counts.get(host, 0) + 1
        config.SSHEngineSetLauncher.engines = counts
        cluster_options['config'] = config
        if not cluster_options.get('controller_ip'):
            address = _route_to(hosts[0])
            if address is not None:
                cluster_options['controller_ip'] = address
    elif isinstance(cluster_options.get('config'), Mapping):
        cluster_options['config'] = Config(cluster_options['config'])
    return cluster_options


def start_local(
    n: int = 4,
    devices_per_process: int | None = None,
    *,
    engines: str | None = None,
    hosts: Sequence[str] | None = None,
    timeout: float = 180.0,
    progress: bool = True,
    recoverable: bool = False,
    heartbeat_timeout: int | None = None,
    **cluster_options: Any,
) -> Session:
    """Starts an ipyparallel cluster of ``n`` engines, each a JAX process, and a session on it.

    By default the engines are local processes simulating hosts with CPU
    devices: each sets ``jax_num_cpu_devices`` and joins ``jax.distributed``
    on a free loopback port (a local simulated cluster is the only place
    that uses 127.0.0.1). Every port of the cluster (ipyparallel's, JAX's
    coordination service, the control endpoint) listens on loopback only.

    With ``engines='ssh'``, ``'mpi'``, ``'slurm'`` (or any other
    ipyparallel engine launcher), ``ipyparallel.Cluster`` starts the engines
    with that launcher; nothing else is launched by this package. JAX then
    runs on the hosts' own devices, the coordinator on the first engine at
    the address it uses to reach the controller (as `connect` does), and the
    controller must listen where the hosts reach it (``controller_ip``; for
    SSH it defaults to the address this machine uses to reach the first host).

    The cluster dies with this process: a watchdog process (see
    `mhnotebook._cleanup`) SIGKILLs the controller and the engines running
    on this machine within a second when this process ends in any way,
    ``kill -9`` included; `Session.stop` stops remote engines through their
    launcher.

    Args:
        n: number of hosts (engines).
        devices_per_process: CPU devices to simulate per host (default: 2
            for local engines; with another launcher, None uses the hosts'
            own devices, a number simulates CPU devices there for testing).
        engines: ipyparallel's engine launcher (``Cluster(engines=...)``):
            ``'local'`` (default), ``'ssh'``, ``'mpi'``, ``'slurm'``, ...
        hosts: SSH only: one ``[user@]host[:port]`` per engine
            (``SSHEngineSetLauncher.engines``; repeat a host for more engines).
        timeout: seconds for the engines to come up and initialize JAX.
        progress: show progress while starting.
        recoverable: hosts survive the death of one. JAX's default is
            fate-sharing: once the coordination service notices a dead
            process (its heartbeat timeout), it terminates all the others.
            With ``recoverable`` the engines set ``jax_enable_recoverability``
            before ``jax.distributed.initialize`` and use a heartbeat timeout
            of 10 s, so survivors stay inspectable (``%%mh`` runs on them)
            and `multihost.live_devices` reports them.
        heartbeat_timeout: seconds before the coordination service declares a
            silent process dead (default: 10 with ``recoverable``, else JAX's 100).
        **cluster_options: passed to `ipyparallel.Cluster`: e.g.
            ``controller_ip``, ``controller_args``, ``engine_args`` and
            ``config`` (a traitlets ``Config`` or a dict of launcher settings,
            e.g. ``{'SSHEngineSetLauncher': {'ssh_args': [...], 'remote_python':
            '/opt/venv/bin/python'}}``, ``{'SlurmEngineSetLauncher': {'account':
            'me'}}``, ``{'MPIEngineSetLauncher': {'mpi_args': [...]}}``).

    Raises:
        SessionError: an engine did not come up in time (nothing is left running).
    """
    local = _is_local_launcher(engines)
    if devices_per_process is None and local:
        devices_per_process = 2
    if n < 1 or (devices_per_process is not None and devices_per_process < 1):
        raise ValueError(
            f'need n >= 1 and devices_per_process >= 1, got n={n}, '
            f'devices_per_process={devices_per_process}'
        )
    if heartbeat_timeout is None and recoverable:
        heartbeat_timeout = _RECOVERABLE_HEARTBEAT
    cluster_options.setdefault('log_level', logging.WARNING)
    if engines is not None:
        cluster_options['engines'] = engines
    if hosts is not None:
        cluster_options['hosts'] = list(hosts)
    options = dict(
        n=n,
        devices_per_process=devices_per_process,
        progress=progress,
        recoverable=recoverable,
        heartbeat_timeout=heartbeat_timeout,
        **cluster_options,
    )
    _cluster_config(options)  # mistakes in the launcher options raise here, before any start
    return Session(_launch_local(options, timeout))


def _launch_local(options: Mapping[str, Any], timeout: float) -> Engines:
    """Starts the cluster ``options`` describe, its watchdog, and JAX on every engine."""
    import ipyparallel as ipp

    from multihost.local import free_port

    n = int(options['n'])
    devices = options['devices_per_process']
    local = _is_local_launcher(options.get('engines'))
    what = (
        f'{n} engines x {devices} CPU devices'
        if local
        else f"{n} engines with ipyparallel's {_launcher_name(options['engines'])} launcher"
    )
    show = _Progress(bool(options['progress']), f'mhnotebook: starting {what} ...')
    sweep_shm()  # shared memory left by kernels that died
    t0 = time.monotonic()
    # A cluster id of its own: the watchdog finds the cluster's processes by it.
    cluster_options = _cluster_config(options)
    cluster_options.setdefault('cluster_id', f'mhnb-{os.getpid()}-{secrets.token_hex(4)}')
    cluster = ipp.Cluster(n=n, **cluster_options)
    log_dir = os.path.join(cluster.profile_dir, 'log')
    os.makedirs(log_dir, exist_ok=True)
    watchdog = start_watchdog(
        cluster.cluster_id,
        cluster.profile_dir,
        os.path.join(log_dir, f'mhnotebook-watchdog-{cluster.cluster_id}.log'),
    )
    try:
        cluster.start_cluster_sync()
        client = cluster.connect_client_sync()
        try:
            # interactive=False: no tqdm widget (a saved notebook could not show it); the
            # progress line above says how far the start is.
            client.wait_for_engines(n, timeout=timeout, interactive=False)
        except TimeoutError:
            raise SessionError(
                f'only {len(client.ids)} of {n} engines came up within '
                f'{timeout:g} s; see the engine logs in '
                f'{cluster.profile_dir}/log'
            ) from None
        engine_ids = sorted(client.ids)[:n]
        show.update(
            f'mhnotebook: {n} engines up in {time.monotonic() - t0:.1f} s; initializing JAX ...'
        )
        if local:
            coordinator, placed = f'127.0.0.1:{free_port()}', 'loopback (a local cluster)'
        else:
            first = engine_ids[0]
            coordinator, placed = _place_coordinator(
                client, first, _engine_infos(client, [first])[first]
            )
        left = max(10.0, timeout - (time.monotonic() - t0))
        infos = _initialize(
            client,
            engine_ids,
            coordinator,
            devices,
            'cpu' if devices else None,
            left,
            show,
            coordinator,
            recoverable=bool(options['recoverable']),
            heartbeat_timeout=options['heartbeat_timeout'],
            placed=placed,
        )
        if not watchdog_ready(watchdog, 10.0):
            log.warning(
                'mhnotebook: the watchdog of the local cluster did not start (see %s); '
                'its engines may outlive a crash of this process.',
                log_dir,
            )
    except BaseException:
        try:
            cluster.stop_cluster_sync()
        except Exception:
            pass
        stop_watchdog(watchdog)
        raise
    shape = f'{n} hosts x {devices} devices' if devices else f'{n} hosts'
    show.update(
        f'mhnotebook: {shape} ready in {time.monotonic() - t0:.1f} s (engines {engine_ids})'
    )
    return Engines(
        client,
        _hosts_from_infos(infos),
        control_host='127.0.0.1' if local else None,
        local=StartedCluster(cluster, watchdog, options),
    )


def connect(
    url_file: str | None = None,
    *,
    profile: str | None = None,
    cluster_id: str | None = None,
    n: int | None = None,
    coordinator: str | None = None,
    coordinator_bind: str | None = None,
    devices_per_process: int | None = None,
    platform: str | None = None,
    timeout: float = 120.0,
    progress: bool = True,
) -> Session:
    """Attaches to an existing ipyparallel cluster, started by any launcher (ssh, mpi, slurm...).

    If JAX is not distributed on the engines yet, initializes it: engine ids
    in ascending order become process indices, and the coordinator runs on
    the first engine, at the address that engine uses to reach the
    ipyparallel controller (on a port probed free there), unless
    ``coordinator`` is given. The coordination service (unauthenticated)
    listens on that address only, and so does process 0's control endpoint
    (authenticated). Engines it did not start are never stopped or killed by
    this session.

    Args:
        url_file: the client connection file (``ipcontroller-client.json``,
            or ``ipcontroller-<cluster_id>-client.json``) the controller wrote.
        profile: ipython profile name (alternative to ``url_file``).
        cluster_id: cluster id within the profile.
        n: wait until this many engines are registered.
        coordinator: ``host:port`` for `jax.distributed.initialize`.
        coordinator_bind: ``host:port`` the coordination service listens on
            (default: ``coordinator`` itself; ``'[::]:PORT'``: every interface).
        devices_per_process: CPU devices to simulate per engine (testing only).
        platform: force a JAX platform on the engines (e.g. ``'cpu'``).
        timeout: seconds to wait for engines and initialization.
        progress: show progress while connecting.

    Raises:
        SessionError: no engines, a mix of initialized and uninitialized
            engines, or initialization failed (the message says where the
            coordinator was placed and why).
        OSError: the connection file is missing.
    """
    import ipyparallel as ipp

    sweep_shm()  # shared memory left by kernels that died
    show = _Progress(progress, 'mhnotebook: connecting to the ipyparallel cluster ...')
    kwargs = {k: v for k, v in dict(profile=profile, cluster_id=cluster_id).items() if v}
    if url_file is not None:
        url_file = os.path.abspath(os.path.expanduser(os.fspath(url_file)))
        if not os.path.exists(url_file):
            raise OSError(f'connection file {url_file} not found; is the controller running?')
    # ipyparallel 8+ takes the connection file as its first argument
    # (`connection_info`); its `url_file=` keyword is ignored.
    client = ipp.Client(url_file, timeout=timeout, **kwargs)
    try:
        if n is not None:
            try:
                client.wait_for_engines(n, timeout=timeout, interactive=False)
            except TimeoutError:
                raise SessionError(
                    f'only {len(client.ids)} of {n} engines registered within {timeout:g} s '
                    f"(controller {controller_url(client)}); see the engines' logs."
                ) from None
        engine_ids = sorted(client.ids)
        if not engine_ids:
            raise SessionError(
                'the cluster has no engines; start some (ipcluster engines '
                '-n N) or pass n=N to wait for them.'
            )
        infos = _engine_infos(client, engine_ids)
        ready = [e for e, i in infos.items() if i['initialized']]
        if ready and len(ready) != len(engine_ids):
            raise SessionError(
                f'JAX is distributed on engines {ready} but not on '
                f'{sorted(set(engine_ids) - set(ready))}; restart the engines.'
            )
        if not ready:
            placed = 'given'
            if coordinator is None:
                coordinator, placed = _place_coordinator(
                    client, engine_ids[0], infos[engine_ids[0]]
                )
            infos = _initialize(
                client,
                engine_ids,
                coordinator,
                devices_per_process,
                platform,
                timeout,
                show,
                coordinator_bind or coordinator,
                placed=placed,
            )
        counts = {i['process_count'] for i in infos.values()}
        if counts != {len(engine_ids)}:
            raise SessionError(
                f'engines report process_count {sorted(counts)} but the cluster '
                f'has {len(engine_ids)} engines; one engine per JAX process '
                'is required.'
            )
    except BaseException:
        client.close()
        raise
    session = Session(Engines(client, _hosts_from_infos(infos)))
    show.update(
        f'mhnotebook: connected to {session.num_processes} hosts (engines {session.engine_ids})'
    )
    return session
