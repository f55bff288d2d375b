"""`start_local`: an ipyparallel cluster started here (any launcher), its watchdog, JAX on it.

A cluster started here is a `StartedCluster`: the session asks it how an
engine ended, stops it, and relaunches it on `Session.restart`.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mhnotebook._cleanup import (
    cluster_processes,
    prune_watchdog_logs,
    start_watchdog,
    stop_watchdog,
    sweep_shm,
    watchdog_ready,
)
from mhnotebook._cluster.jaxinit import (
    engine_infos,
    hosts_from_infos,
    initialize,
    place_coordinator,
)
from mhnotebook._cluster.progress import Progress
from mhnotebook._errors import SessionError
from mhnotebook._session import Engines, Session

__all__ = ['StartedCluster', 'start_local']

log = logging.getLogger('mhnotebook')

_RECOVERABLE_HEARTBEAT = 10  # seconds; JAX's default of 100 is long to wait in a notebook
# start_local's own arguments; the rest of its options go to ipyparallel.Cluster.
_OWN_OPTIONS = ('n', 'devices_per_process', 'progress', 'recoverable', 'heartbeat_timeout')
#: The controller's ping period (ms; ipyparallel's default is 3,000): an engine counts as
#: registered at the first ping after it connects, so a shorter period starts a cluster sooner
#: (`bench/cluster_start.py`, docs/SCALE.md). 30 misses keep ipyparallel's 30 s before the
#: controller takes a silent engine for dead.
_PING_MS, _PING_MISSES = 1000, 30


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
        """That engine's exit code (negative: killed by that signal), if known within ``wait`` s.

        Never reaps the process itself: the launcher's waiter thread does, and two
        waiters race (the one that loses gets no code). The status is peeked at while
        the process is a zombie, else read from what the launcher recorded at its end.
        """
        launcher = self._launcher(pid)
        process = getattr(launcher, 'process', None)
        if process is None:
            return None
        deadline = time.monotonic() + wait
        while True:
            code = _peek_exit(pid)
            if code is None:  # reaped: the code psutil kept for the launcher's own wait()
                code = getattr(process, '_exitcode', None)
            if code is None or not isinstance(code, int):
                code = (getattr(launcher, 'stop_data', None) or {}).get('exit_code')
            if isinstance(code, int):
                return code
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

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

    def left_running(self, wait: float = 3.0) -> list[int]:
        """Pids of the cluster's processes still alive after `stop` (waiting up to ``wait`` s
        for the killed ones to go); empty when nothing of it is left running."""
        deadline = time.monotonic() + wait
        while True:
            left = cluster_processes(self.cluster.cluster_id, self.cluster.profile_dir)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def relaunch(self, timeout: float) -> Engines:
        """A fresh cluster with the same options (for `Session.restart`)."""
        return _launch_local(self._options, timeout)


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


def _cluster_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """The `ipyparallel.Cluster` options of ``options``: launchers and their settings.

    ``hosts`` (SSH) becomes ``SSHEngineSetLauncher.engines`` (one engine per
    entry), and the controller listens on the address this machine uses to
    reach the first host unless ``controller_ip`` is given.
    """
    from traitlets.config import Config

    from multihost._net import route_source

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
            try:
                cluster_options['controller_ip'] = route_source(hosts[0])
            except OSError as exc:
                raise SessionError(
                    f'cannot choose where the controller listens for the SSH hosts: {exc} '
                    'Or pass controller_ip="ADDRESS", an address of this machine the hosts reach.'
                ) from None
    elif isinstance(cluster_options.get('config'), Mapping):
        cluster_options['config'] = Config(cluster_options['config'])
    args = list(cluster_options.get('controller_args') or [])
    if not any('HeartMonitor.' in str(a) for a in args):  # the caller's own settings stay
        args += [
            f'--HeartMonitor.period={_PING_MS}',
            f'--HeartMonitor.max_heartmonitor_misses={_PING_MISSES}',
        ]
    cluster_options['controller_args'] = args
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
        SessionError: an engine did not come up in time (nothing is left running),
            or, with ``hosts``, the first host has no route from here (and no
            ``controller_ip`` is given).
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

    from multihost._net import free_port

    n = int(options['n'])
    devices = options['devices_per_process']
    local = _is_local_launcher(options.get('engines'))
    what = (
        f'{n} engines x {devices} CPU devices'
        if local
        else f"{n} engines with ipyparallel's {_launcher_name(options['engines'])} launcher"
    )
    show = Progress(bool(options['progress']), f'mhnotebook: starting {what} ...')
    sweep_shm()  # shared memory left by kernels that died
    t0 = time.monotonic()
    # A cluster id of its own: the watchdog finds the cluster's processes by it.
    cluster_options = _cluster_config(options)
    cluster_options.setdefault('cluster_id', f'mhnb-{os.getpid()}-{secrets.token_hex(4)}')
    cluster = ipp.Cluster(n=n, **cluster_options)
    log_dir = os.path.join(cluster.profile_dir, 'log')
    os.makedirs(log_dir, exist_ok=True)
    prune_watchdog_logs(log_dir)  # one log per cluster started: the last few are kept
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
            coordinator, placed = place_coordinator(
                client, first, engine_infos(client, [first])[first]
            )
        infos = initialize(
            client,
            engine_ids,
            coordinator=coordinator,
            timeout=max(10.0, timeout - (time.monotonic() - t0)),
            progress=show,
            devices=devices,
            platform='cpu' if devices else None,
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
    shape = f'{n} processes x {devices} devices' if devices else f'{n} processes'
    show.update(
        f'mhnotebook: {shape} ready in {time.monotonic() - t0:.1f} s (engines {engine_ids})'
    )
    return Engines(
        client,
        hosts_from_infos(infos),
        control_host='127.0.0.1' if local else None,
        local=StartedCluster(cluster, watchdog, options),
    )


def _peek_exit(pid: int) -> int | None:
    """The exit code of child ``pid`` if it has ended and is not reaped yet (it stays so)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):  # not our child, or reaped already
        return None
    if info is None:  # still running
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
