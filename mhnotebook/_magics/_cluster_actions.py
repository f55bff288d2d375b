"""``%mh_cluster``'s actions, one function each, and their options as shared decorators.

Each action takes the magics' session (None before the first ``start``), the
parsed arguments and the typed line, and returns the session the magics use
afterwards. The options are grouped by the action that reads them
(`start_options`, `connect_options`) and stacked on ``%mh_cluster`` (with
`action_options`, after `ACTIONS`: the choices are its keys).
"""

from __future__ import annotations

import shlex
from argparse import Namespace
from collections.abc import Callable
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError

# The one import of the startup functions in this room.
from mhnotebook._cluster.connect import connect
from mhnotebook._cluster.local import start_local
from mhnotebook._errors import SessionTimeoutError
from mhnotebook._magics._entry import delegate, running
from mhnotebook._magics._options import literal, options, unquote
from mhnotebook._session import Session
from multihost._text import fmt_hosts

start_options = options(
    magic_arguments.argument(
        '-d',
        '--devices',
        type=int,
        default=None,
        help='start: CPU devices to simulate per host (default 2 for local engines; with '
        "--engines, the hosts' own devices unless given)",
    ),
    magic_arguments.argument(
        '--engines',
        default=None,
        help="start: ipyparallel's engine launcher: local (default), ssh, mpi, slurm, or any "
        'other ipyparallel.Cluster(engines=...) accepts',
    ),
    magic_arguments.argument(
        '--hosts',
        default=None,
        help='start --engines ssh: comma-separated [user@]host[:port], one engine each '
        '(repeat a host for more)',
    ),
    magic_arguments.argument(
        '--controller-ip',
        default=None,
        help='start: the address the controller listens on, one every host reaches '
        '(--engines ssh: default, the address this machine uses to reach the first host)',
    ),
    magic_arguments.argument(
        '--ssh-args',
        default=None,
        help='start --engines ssh: extra ssh/scp arguments, quoted, e.g. "-i ~/.ssh/key"',
    ),
    magic_arguments.argument(
        '--remote-python',
        default=None,
        help='start --engines ssh: the Python (with mhnotebook installed) on the hosts',
    ),
    magic_arguments.argument(
        '--set',
        action='append',
        default=[],
        metavar='CLASS.TRAIT=VALUE',
        help='start: any launcher setting, passed to ipyparallel as config, e.g. --set '
        'SlurmEngineSetLauncher.account=me --set MPIEngineSetLauncher.mpi_args=\'["-x", "A"]\''
        ' (VALUE: a Python literal, else a string)',
    ),
    magic_arguments.argument(
        '--recoverable',
        action='store_true',
        help='start: hosts survive the death of one (jax_enable_recoverability); the '
        'survivors stay inspectable',
    ),
)

connect_options = options(
    magic_arguments.argument('--profile', help='connect: ipython profile of the cluster'),
    magic_arguments.argument('--cluster-id', help='connect: cluster id within the profile'),
    magic_arguments.argument(
        '--url-file', help="connect: the controller's ipcontroller[-ID]-client.json"
    ),
    magic_arguments.argument('--coordinator', help='connect: host:port for jax.distributed'),
)


def launcher_options(args: Namespace) -> dict[str, Any]:
    """`start_local` keywords for ipyparallel's launchers from ``%mh_cluster start`` options."""
    for name in ('engines', 'hosts', 'controller_ip', 'ssh_args', 'remote_python'):
        setattr(args, name, unquote(getattr(args, name)))
    keywords: dict[str, Any] = {}
    config: dict[str, dict[str, Any]] = {}
    if args.engines:
        keywords['engines'] = args.engines
    ssh_only = {
        '--hosts': args.hosts,
        '--ssh-args': args.ssh_args,
        '--remote-python': args.remote_python,
    }
    given = [k for k, v in ssh_only.items() if v]
    if given and (args.engines or '').lower() != 'ssh':
        raise UsageError(f'{", ".join(given)} go with --engines ssh')
    if args.hosts:
        keywords['hosts'] = [h.strip() for h in args.hosts.split(',') if h.strip()]
    if args.ssh_args:
        words = shlex.split(args.ssh_args)
        config.setdefault('SSHEngineSetLauncher', {}).update(ssh_args=words, scp_args=words)
    if args.remote_python:
        config.setdefault('SSHEngineSetLauncher', {})['remote_python'] = args.remote_python
    if args.controller_ip:
        keywords['controller_ip'] = args.controller_ip
    for setting in args.set:
        key, sep, value = str(unquote(setting)).partition('=')
        cls, dot, trait = key.strip().rpartition('.')
        if not sep or not dot or not cls.isidentifier() or not trait.isidentifier():
            raise UsageError(
                f'--set {setting!r}: expected CLASS.TRAIT=VALUE, e.g. '
                '--set SlurmEngineSetLauncher.account=me'
            )
        config.setdefault(cls, {})[trait] = literal(value.strip())
    if config:
        keywords['config'] = config
    return keywords


def start(session: Session | None, args: Namespace, line: str) -> Session | None:
    """New hosts; a running session is reused if it has the shape asked for (`Session.reuse`)."""
    if args.n < 1 or (args.devices is not None and args.devices < 1):
        raise UsageError('-n and -d must be at least 1, e.g. %mh_cluster start -n 4 -d 2')
    launcher = launcher_options(args)
    if session is not None and session.running:
        current = session
        devices = args.devices or (2 if 'engines' not in launcher else current.shape[1])
        print(delegate(lambda: current.reuse(args.n, devices, recoverable=args.recoverable)))
        return current
    try:
        return start_local(
            args.n,
            args.devices,
            timeout=args.timeout,
            recoverable=args.recoverable,
            **launcher,
        )
    except (ValueError, TypeError) as exc:  # launcher options ipyparallel refused
        raise UsageError(f'%mh_cluster start: {exc}') from None


def attach(session: Session | None, args: Namespace, line: str) -> Session | None:
    """``connect``: attach to a running ipyparallel cluster and initialize JAX there."""
    if session is not None and session.running:
        raise UsageError('a cluster is already running: %mh_cluster stop it first.')
    try:
        return connect(
            unquote(args.url_file),
            profile=args.profile,
            cluster_id=args.cluster_id,
            n=args.n if '-n' in shlex.split(line) else None,  # else: every engine there
            coordinator=args.coordinator,
            timeout=args.timeout,
        )
    except SessionTimeoutError:  # a TimeoutError too, but the session's own: raised as it is
        raise
    except (OSError, TimeoutError) as exc:
        raise UsageError(
            f'cannot connect: {exc}. Pass --profile, --cluster-id or '
            '--url-file of a running ipyparallel cluster.'
        ) from None


def status(session: Session | None, args: Namespace, line: str) -> Session | None:
    """Which engine, machine and pid each host is; idle, busy or dead."""
    live = running(session)
    states = delegate(live.status)
    for p, st in states.items():
        state = f'dead ({st["how"]})' if not st['alive'] else 'busy' if st['busy'] else 'idle'
        address = live.processes[p].address
        print(
            f'process {p}: engine {st["engine_id"]} on {st["hostname"]} '
            f'({address}, pid {st["pid"]}), {state}'
        )
    dead = [p for p, st in states.items() if not st['alive']]
    if dead:
        print(f'{fmt_hosts(dead)} {"is" if len(dead) == 1 else "are"} gone: %mh_cluster restart')
    return live


def restart(session: Session | None, args: Namespace, line: str) -> Session | None:
    """The same hosts, started again."""
    live = running(session)
    delegate(lambda: live.restart(timeout=args.timeout))
    print(
        "%mh_cluster restart: new processes, the old ones' values are gone: "
        'run your %%mh setup cells again.'
    )
    return live


def stop(session: Session | None, args: Namespace, line: str) -> Session | None:
    """End the hosts (the magics keep the stopped session: `current_session` says so)."""
    live = running(session)
    print(f'%mh_cluster stop: {live.stop()}')
    return live


Action = Callable[[Session | None, Namespace, str], Session | None]

#: ``%mh_cluster ACTION``: the function that does it (in the order the usage lists them).
ACTIONS: dict[str, Action] = {
    'start': start,
    'connect': attach,
    'status': status,
    'restart': restart,
    'stop': stop,
}

action_options = options(
    magic_arguments.argument('action', choices=list(ACTIONS), help='what to do with the cluster'),
    magic_arguments.argument(
        '-n',
        type=int,
        default=4,
        help='start: number of hosts (engines); connect: wait for N engines',
    ),
)
