"""IPython magics: ``%load_ext mhnotebook``.

Each magic only parses its arguments and delegates to a `Session` method
(or, for the views, to `_views`, which asks the session for models and
returns a widget); user mistakes raise `UsageError` with a message that says
what to do; a failure on the hosts is shown as its ``ename: evalue``.
Nothing typed by the user is evaluated, except the code of a ``%%mh`` cell
(which runs on the engines).

{MAGIC_DOCS}
"""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Callable
from typing import Any

import numpy as np
from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from mhnotebook._cluster.connect import connect
from mhnotebook._cluster.local import start_local
from mhnotebook._errors import (
    HostDied,
    HostsError,
    InterruptReport,
    RemoteFailure,
    SessionError,
    SessionInterrupted,
    SessionTimeout,
    hosts_phrase,
)
from mhnotebook._session import Session
from mhnotebook._views import (
    diff_view,
    env_view,
    host_local,
    layout_view,
    memory_view,
    nonfinite_view,
    stacks_view,
    stepper_view,
    timeline_view,
    where_view,
)

NO_SESSION = (
    'no cluster yet: start one with  %mh_cluster start -n 4 -d 2  (simulated local '
    'hosts) or  %mh_cluster connect --profile NAME  (an existing ipyparallel cluster).'
)


def _valid_name(name: str, *, cuts: bool = False) -> str:
    """``name`` if it names an engine value (`multihost._names`: ``state.params['embed']``,
    ``state.opt_state[0].mu``; with ``cuts``, also ``x[::4, :128]``), else a `UsageError`."""
    from multihost import _names

    try:
        _names.parse(name, cuts=cuts)
    except _names.BadName as exc:
        raise UsageError(str(exc)) from None
    return name


def _compact_subscripts(line: str) -> str:
    """``x[::4, :128] -o y`` -> ``x[::4,:128] -o y``: a subscript stays one argument
    (spaces inside quotes are kept)."""
    out, depth, quote = [], 0, ''
    for ch in line:
        if quote:
            quote = '' if ch == quote else quote
        elif ch in '\'"':
            quote = ch
        elif ch == '[':
            depth += 1
        elif ch == ']':
            depth = max(depth - 1, 0)
        elif ch.isspace() and depth:
            continue
        out.append(ch)
    return ''.join(out)


def _nbytes(value: Any) -> int:
    import jax

    from mhnotebook._transfer._gather import KeyData

    def one(leaf: Any) -> int:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        return int(np.asarray(leaf.data if isinstance(leaf, KeyData) else leaf).nbytes)

    return sum(one(leaf) for leaf in jax.tree.leaves(value))


def _describe(value: Any) -> str:
    import jax

    leaves = jax.tree.leaves(value)
    size = _nbytes(value)
    unit = next((u for u, s in (('GiB', 30), ('MiB', 20), ('KiB', 10)) if size >= 1 << s), 'B')
    human = f'{size / (1 << {"GiB": 30, "MiB": 20, "KiB": 10, "B": 0}[unit]):.1f} {unit}'
    if isinstance(value, np.ndarray):
        return f'{value.dtype}{list(value.shape)} ({human})'
    return f'pytree of {len(leaves)} arrays ({human})'


_current: list[Session | None] = [None]  # the magics' session (one per kernel)


def current_session() -> Session:
    """The session the ``%mh_*`` magics use (started by ``%mh_cluster``), for Python code."""
    session = _current[0]
    if session is None or not session.running:
        raise SessionError(NO_SESSION)
    return session


class _LiveStatus:
    """A one-line per-host status that updates in place while a cell runs."""

    SYMBOL = {'running': '…', 'done': '✓', 'error': '✗', 'died': '† died'}

    def __init__(self) -> None:
        from IPython.display import display

        self.handle = display({'text/plain': 'starting …'}, raw=True, display_id=True)

    def __call__(self, state: dict[int, str], elapsed: float) -> None:
        text = '  '.join(f'host {p} {self.SYMBOL[s]}' for p, s in sorted(state.items()))
        if self.handle is not None:
            self.handle.update({'text/plain': f'[{elapsed:5.1f} s]  {text}'}, raw=True)


def _literal(text: str) -> Any:
    """A Python literal (number, list, dict, quoted string...) or, failing that, the text."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _unquote(text: str | None) -> str | None:
    """``text`` without one pair of enclosing quotes (IPython keeps them in magic arguments)."""
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in '"\'':
        return text[1:-1]
    return text


def _launcher_options(args: Any) -> dict[str, Any]:
    """`start_local` keywords for ipyparallel's launchers from ``%mh_cluster start`` options."""
    for name in ('engines', 'hosts', 'controller_ip', 'ssh_args', 'remote_python'):
        setattr(args, name, _unquote(getattr(args, name)))
    options: dict[str, Any] = {}
    config: dict[str, dict[str, Any]] = {}
    if args.engines:
        options['engines'] = args.engines
    ssh_only = {
        '--hosts': args.hosts,
        '--ssh-args': args.ssh_args,
        '--remote-python': args.remote_python,
    }
    given = [k for k, v in ssh_only.items() if v]
    if given and (args.engines or '').lower() != 'ssh':
        raise UsageError(f'{", ".join(given)} go with --engines ssh')
    if args.hosts:
        options['hosts'] = [h.strip() for h in args.hosts.split(',') if h.strip()]
    if args.ssh_args:
        words = shlex.split(args.ssh_args)
        config.setdefault('SSHEngineSetLauncher', {}).update(ssh_args=words, scp_args=words)
    if args.remote_python:
        config.setdefault('SSHEngineSetLauncher', {})['remote_python'] = args.remote_python
    if args.controller_ip:
        options['controller_ip'] = args.controller_ip
    for setting in args.set:
        key, sep, value = str(_unquote(setting)).partition('=')
        cls, dot, trait = key.strip().rpartition('.')
        if not sep or not dot or not cls.isidentifier() or not trait.isidentifier():
            raise UsageError(
                f'--set {setting!r}: expected CLASS.TRAIT=VALUE, e.g. '
                '--set SlurmEngineSetLauncher.account=me'
            )
        config.setdefault(cls, {})[trait] = _literal(value.strip())
    if config:
        options['config'] = config
    return options


@magics_class
class MultihostMagics(Magics):
    """The ``%mh_*`` magics. One session per IPython shell."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.background: dict[int, Any] | None = None

    def _session(self) -> Session:
        if self.session is None or not self.session.running:
            raise UsageError(NO_SESSION)
        return self.session

    @property
    def stepping(self) -> bool:
        """Whether the step gate is on: the session asks the hosts (one source of truth)."""
        session = self.session
        return session is not None and session.running and session.stepping

    @property
    def session(self) -> Session | None:
        return _current[0]

    @session.setter
    def session(self, value: Session | None) -> None:
        _current[0] = value

    # -- %mh_cluster -----------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'action',
        choices=['start', 'connect', 'status', 'restart', 'stop'],
        help='what to do with the cluster',
    )
    @magic_arguments.argument(
        '-n',
        type=int,
        default=4,
        help='start: number of hosts (engines); connect: wait for N engines',
    )
    @magic_arguments.argument(
        '-d',
        '--devices',
        type=int,
        default=None,
        help='start: CPU devices to simulate per host (default 2 for local engines; with '
        "--engines, the hosts' own devices unless given)",
    )
    @magic_arguments.argument(
        '--engines',
        default=None,
        help="start: ipyparallel's engine launcher: local (default), ssh, mpi, slurm, or any "
        'other ipyparallel.Cluster(engines=...) accepts',
    )
    @magic_arguments.argument(
        '--hosts',
        default=None,
        help='start --engines ssh: comma-separated [user@]host[:port], one engine each '
        '(repeat a host for more)',
    )
    @magic_arguments.argument(
        '--controller-ip',
        default=None,
        help='start: the address the controller listens on, one every host reaches '
        '(--engines ssh: default, the address this machine uses to reach the first host)',
    )
    @magic_arguments.argument(
        '--ssh-args',
        default=None,
        help='start --engines ssh: extra ssh/scp arguments, quoted, e.g. "-i ~/.ssh/key"',
    )
    @magic_arguments.argument(
        '--remote-python',
        default=None,
        help='start --engines ssh: the Python (with mhnotebook installed) on the hosts',
    )
    @magic_arguments.argument(
        '--set',
        action='append',
        default=[],
        metavar='CLASS.TRAIT=VALUE',
        help='start: any launcher setting, passed to ipyparallel as config, e.g. --set '
        'SlurmEngineSetLauncher.account=me --set MPIEngineSetLauncher.mpi_args=\'["-x", "A"]\''
        ' (VALUE: a Python literal, else a string)',
    )
    @magic_arguments.argument('--profile', help='connect: ipython profile of the cluster')
    @magic_arguments.argument('--cluster-id', help='connect: cluster id within the profile')
    @magic_arguments.argument(
        '--url-file', help="connect: the controller's ipcontroller[-ID]-client.json"
    )
    @magic_arguments.argument('--coordinator', help='connect: host:port for jax.distributed')
    @magic_arguments.argument(
        '--timeout', type=float, default=180.0, help='seconds to wait for engines'
    )
    @magic_arguments.argument(
        '--recoverable',
        action='store_true',
        help='start: hosts survive the death of one (jax_enable_recoverability); the '
        'survivors stay inspectable',
    )
    @line_magic
    def mh_cluster(self, line: str) -> Any:
        """Get hosts to debug: start or attach to them; check, restart, stop.

        ``%mh_cluster start -n 4 -d 2`` starts 4 simulated hosts with 2 CPU
        devices each (run again with the same shape, it reuses the running
        cluster); ``--recoverable`` keeps the other hosts alive when one dies.
        ``%mh_cluster start -n 8 --engines ssh --hosts h0,h1,...`` starts the
        engines with ipyparallel's SSH launcher (``--engines mpi``,
        ``--engines slurm``: its MPI and Slurm launchers; their settings with
        ``--set``), a controller here listening on ``--controller-ip``.
        ``%mh_cluster connect --url-file ipcontroller-client.json -n 8``
        attaches to a running ipyparallel cluster (any launcher, or engines
        you started yourself) and initializes JAX there, the coordinator on
        the first engine's address toward the controller.
        ``%mh_cluster status`` says which engine, machine and pid each host
        is and whether it is idle, busy or dead; ``%mh_cluster restart``
        starts the same hosts again; ``%mh_cluster stop`` ends them.

        Examples::

            %mh_cluster start -n 4 -d 2
            %mh_cluster start -n 4 --engines ssh --hosts h0,h1,h2,h3 --remote-python /opt/py
            %mh_cluster start -n 16 --engines slurm --set SlurmEngineSetLauncher.account=me
            %mh_cluster connect --url-file ~/job42/ipcontroller-client.json -n 8
        """
        args = magic_arguments.parse_argstring(self.mh_cluster, line)
        if not args.timeout > 0:
            raise UsageError(f'--timeout must be > 0 seconds, got {args.timeout:g}; e.g. 180')
        if args.action == 'start':
            if args.n < 1 or (args.devices is not None and args.devices < 1):
                raise UsageError('-n and -d must be at least 1, e.g. %mh_cluster start -n 4 -d 2')
            launcher = _launcher_options(args)
            if self.session is not None and self.session.running:
                session = self.session
                devices = args.devices or (2 if 'engines' not in launcher else session.shape[1])
                print(
                    _delegate(lambda: session.reuse(args.n, devices, recoverable=args.recoverable))
                )
                return None
            try:
                self.session = start_local(
                    args.n,
                    args.devices,
                    timeout=args.timeout,
                    recoverable=args.recoverable,
                    **launcher,
                )
            except (ValueError, TypeError) as exc:  # launcher options ipyparallel refused
                raise UsageError(f'%mh_cluster start: {exc}') from None
            return None
        if args.action == 'connect':
            if self.session is not None and self.session.running:
                raise UsageError('a cluster is already running: %mh_cluster stop it first.')
            try:
                self.session = connect(
                    _unquote(args.url_file),
                    profile=args.profile,
                    cluster_id=args.cluster_id,
                    n=args.n if '-n' in shlex.split(line) else None,
                    coordinator=args.coordinator,
                    timeout=args.timeout,
                )
            except (OSError, TimeoutError) as exc:
                raise UsageError(
                    f'cannot connect: {exc}. Pass --profile, --cluster-id or '
                    '--url-file of a running ipyparallel cluster.'
                ) from None
            return None
        session = self._session()
        if args.action == 'status':
            status = _delegate(session.status)
            for p, st in status.items():
                state = (
                    f'dead ({st["how"]})' if not st['alive'] else 'busy' if st['busy'] else 'idle'
                )
                address = session.processes[p].address
                print(
                    f'host {p}: engine {st["engine_id"]} on {st["hostname"]} '
                    f'({address}, pid {st["pid"]}), {state}'
                )
            dead = [p for p, st in status.items() if not st['alive']]
            if dead:
                print(
                    f'{"host" if len(dead) == 1 else "hosts"} {", ".join(map(str, dead))} '
                    f'{"is" if len(dead) == 1 else "are"} gone: %mh_cluster restart'
                )
        elif args.action == 'restart':
            _delegate(lambda: session.restart(timeout=args.timeout))
        elif args.action == 'stop':
            session.stop()
        return None

    # -- %%mh ----------------------------------------------------------------------
    @magic_arguments.magic_arguments('%mh')  # its usage line then says %%mh
    @magic_arguments.argument(
        '--timeout', type=float, default=None, help='seconds to wait; then show where every host is'
    )
    @magic_arguments.argument(
        '--bg', action='store_true', help='return at once; collect the output with %%mh_wait'
    )
    @cell_magic
    def mh(self, line: str, cell: str) -> None:
        """Run this cell on every host, its output labelled by host.

        While it runs, a live per-host status is shown. On ``--timeout``,
        shows where each unfinished host is (its collective and stack) and
        gives control back; the cell keeps running on the hosts (``%mh_wait``).
        Interrupting the kernel interrupts every host too, says who stopped
        and where each host was. A host that dies is named in one line.
        ``--bg`` gives control back at once (``%mh_wait`` collects the output).

        Examples::

            %%mh
            import jax
            print(jax.process_index(), jax.local_devices())

            %%mh --timeout 60
            state, loss = train_step(state, batch)
            print(float(loss))
        """
        args = magic_arguments.parse_argstring(self.mh, line)
        _check_timeout(args.timeout, '%%mh --timeout 30')
        session = self._session()
        background = args.bg or session.stepping  # the hosts' own setting
        pending = _delegate(lambda: session.execute_async(cell))
        dead = session.dead
        if dead:  # a recoverable session: the cell runs on the survivors
            print(
                f'%%mh: {hosts_phrase(sorted(dead))} gone; '
                f'running on {hosts_phrase(sorted(pending))}.'
            )
        if background:
            # The kernel must stay free so the stepper's buttons can release steps.
            self.background = pending
            print(background_note(stepping=session.stepping))
            return
        self.background = None
        status = _LiveStatus()
        try:
            session.wait_outputs(pending, timeout=args.timeout, on_status=status)
        except SessionTimeout as exc:
            self.background = pending  # %mh_wait collects it later
            print(
                f'%%mh: hosts {exc.pending} still running after {args.timeout:g} s '
                f'(finished: {exc.finished}); %mh_wait collects the output. Where they are:'
            )
            self._show_where(session)
        except SessionInterrupted as exc:
            self.background = pending if exc.report.running else None
            _show_interrupt(exc.report)
        except HostDied as exc:
            self.background = pending if exc.pending else None
            print(f'%%mh: {exc}')
            _print_errors(exc.failures)
        except HostsError as exc:
            _print_errors(exc.failures)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument('--timeout', type=float, default=None, help='seconds to wait')
    @line_magic
    def mh_wait(self, line: str) -> None:
        """Is my background ``%%mh`` cell done? Wait for it and print its output.

        For a cell started with ``%%mh --bg``, or while stepping is on
        (``%mh_step``). ``--timeout`` gives control back if the hosts are still
        busy (the cell keeps running; see ``%mh_where``).

        Examples::

            %mh_wait
            %mh_wait --timeout 60
        """
        args = magic_arguments.parse_argstring(self.mh_wait, line)
        _check_timeout(args.timeout, '%mh_wait --timeout 30')
        session = self._session()
        if self.background is None:
            raise UsageError('no %%mh cell is running in the background.')
        try:
            session.wait_outputs(self.background, timeout=args.timeout)
        except SessionTimeout as exc:
            print(f'%mh_wait: hosts {exc.pending} still running; see %mh_where or the stepper.')
            return
        except SessionInterrupted as exc:
            _show_interrupt(exc.report)
            if exc.report.running:
                return
        except HostDied as exc:
            print(f'%mh_wait: {exc}')
            if exc.pending:
                return
        except HostsError as exc:
            _print_errors(exc.failures)
        self.background = None

    def _show_where(self, session: Session) -> None:
        from IPython.display import display

        try:
            display(where_view(session))
        except (SessionError, OSError, RuntimeError) as exc:
            print(f'(could not collect stacks: {exc})')

    # -- %mh_allgather -------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'name', help="engine value: x, state.params, state.params['embed'], x[::4, :128]"
    )
    @magic_arguments.argument(
        '-o', '--out', help='notebook variable to store it in (default: NAME)'
    )
    @magic_arguments.argument(
        '--transport',
        choices=['auto', 'shm', 'tcp', 'zmq'],
        default='auto',
        help='shm: engines on this machine write into shared memory; tcp: engines '
        'elsewhere stream into the result; zmq: through ipyparallel (default: the fastest '
        'that works)',
    )
    @magic_arguments.argument(
        '--max-bytes',
        help='refuse a larger result (default: half the available memory), e.g. 8GiB',
    )
    @line_magic
    def mh_allgather(self, line: str) -> None:
        """What is the global value? Gather an engine variable here, as numpy.

        ``%mh_allgather params -o p`` stores the gathered value in ``p``. A
        global jax.Array comes back whole; host-local arrays are stacked along
        a new axis 0 (one row per process); pytrees keep their structure.
        Each shard is sent once, straight into its place.
        ``%mh_allgather x[::4, :128]`` slices on the hosts: only the slice
        travels. Names reach into pytrees by attribute or key
        (``state.params.embed.embedding``, ``state.opt_state[0].mu``); a
        PRNG key leaf comes back as a key array of the same implementation.
        A result larger than half of this machine's available memory is
        refused before anything is allocated (``--max-bytes`` to allow it).

        Examples::

            %mh_allgather loss
            %mh_allgather state.params -o params
            %mh_allgather x[::4,:128] -o preview
            %mh_allgather state.params['embed']['embedding'][::2] -o rows
            %mh_allgather activations --max-bytes 8GiB
        """
        from mhnotebook._transfer._gather import parse_target
        from multihost import _names

        # A subscript may contain spaces (x[::4, :128]): one argument.
        args = magic_arguments.parse_argstring(self.mh_allgather, _compact_subscripts(line))
        try:
            parse_target(args.name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        out = args.out or _names.short_name(args.name)
        if not out.isidentifier():
            raise UsageError(f'-o {out!r} is not a notebook variable name; use e.g. -o params')
        max_bytes = _parse_bytes(args.max_bytes) if args.max_bytes is not None else None
        session = self._session()
        value = _delegate(
            lambda: session.allgather(args.name, transport=args.transport, max_bytes=max_bytes)
        )
        if value is _INTERRUPTED:
            return
        if self.shell is None:  # a Magics made without a shell has no namespace to fill
            raise UsageError(f'%mh_allgather: no IPython shell to define {out} in')
        self.shell.user_ns[out] = value
        print(
            f'{out} = {args.name} gathered from {session.num_processes} hosts: {_describe(value)}'
        )

    # -- %mh_barrier -----------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help='barrier name (the same on every host)')
    @magic_arguments.argument('--timeout', type=float, default=30.0, help='seconds to wait')
    @line_magic
    def mh_barrier(self, line: str) -> None:
        """Do all hosts get here? A timed barrier: who arrived, how long it took.

        Every host waits at barrier ``NAME`` for up to ``--timeout`` seconds;
        each one's time in it, or the error that names the hosts that never
        arrived, is printed per host.

        Examples::

            %mh_barrier ckpt
            %mh_barrier after-data-load --timeout 120
        """
        args = magic_arguments.parse_argstring(self.mh_barrier, line)
        _check_timeout(args.timeout, '%mh_barrier NAME --timeout 30')
        session = self._session()
        results = _delegate(lambda: session.barrier(args.name, timeout=args.timeout))
        if results is _INTERRUPTED:
            return
        for p, r in sorted(results.items()):
            if r['ok']:
                print(f'host {p}: passed {args.name!r} in {r["elapsed"] * 1e3:.1f} ms')
            else:
                print(f'host {p}: {r["error"]}: {r["message"].splitlines()[0]}')

    # -- views -----------------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'name', help="engine array or pytree: x, state.params, state.params['embed']['embedding']"
    )
    @magic_arguments.argument('--axes', help='the two displayed axes, e.g. 0,2')
    @magic_arguments.argument(
        '--no-values',
        action='store_true',
        help='do not gather the values (selecting a block shows no data)',
    )
    @line_magic
    def mh_layout(self, line: str) -> Any:
        """Which host and device holds which block? An array's layout, drawn.

        Draws the array's blocks by host and device; click one for its
        shard, devices and values. Replicas are digested on every host; the
        replica matrix marks those that disagree. A rank >= 3 array is shown
        as facets over its other axes; ``--axes 0,2`` picks the displayed axes
        (default: the last two). ``--no-values`` gathers no data (for a large
        array: the picture only).

        A pytree (``%mh_layout state.params``) is one table, a row per leaf:
        shape, dtype, spec, bytes per host, whether its replicas agree; click
        a leaf for its picture. Names reach into pytrees by attribute or key:
        ``state.params.embed.embedding`` and
        ``state.params['embed']['embedding']`` are the same leaf.

        Examples::

            %mh_layout x
            %mh_layout state.params
            %mh_layout state.params['block_0']['Dense_0']['kernel']
            %mh_layout state.params.embed.embedding --axes 1,0 --no-values
        """
        args = magic_arguments.parse_argstring(self.mh_layout, _compact_subscripts(line))
        name = _valid_name(args.name)
        axes = None
        if args.axes:
            try:
                axes = tuple(int(a) for a in args.axes.split(','))
            except ValueError:
                raise UsageError(f'--axes takes two integers like 0,1; got {args.axes!r}') from None
        session = self._session()
        try:
            view = _delegate(
                lambda: layout_view(session, name, values=not args.no_values, axes=axes)
            )
        except UsageError as exc:
            if str(exc).startswith('axes '):
                raise UsageError(f'--{exc}') from None
            raise
        if view is _INTERRUPTED:
            return None
        from mhnotebook.widgets import LayoutView

        if isinstance(view, LayoutView) and host_local(view.layout):
            print(
                f"{name} is host-local (each host holds its own value): showing process 0's; "
                f'compare the hosts with %mh_diff {name}'
            )
        return view

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'name', help='engine value (any pytree): params, state.params, state.opt_state[0].mu'
    )
    @line_magic
    def mh_diff(self, line: str) -> Any:
        """Do the hosts agree? Which leaves differ, on which host, by how much.

        Compares an engine value (any pytree) across hosts, leaf by leaf (each
        leaf's fingerprint travels, then only the leaves that differ): the
        table marks the hosts that hold something else; expand a leaf for
        each host's value.

        Examples::

            %mh_diff params
            %mh_diff state.opt_state[0].mu
        """
        args = magic_arguments.parse_argstring(self.mh_diff, _compact_subscripts(line))
        name = _valid_name(args.name)
        session = self._session()
        view = _delegate(lambda: diff_view(session, name))
        return None if view is _INTERRUPTED else view

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'name', help="engine value (an array or any pytree): grads, state.params['embed']"
    )
    @line_magic
    def mh_nan(self, line: str) -> Any:
        """Where are the NaNs? The shards holding NaN/Inf: host, device, block.

        Every host counts NaN and Inf in each of its shards on device (global
        arrays shard by shard, replicas included; host-local values in their
        own copy); only the offending shards' counts travel. Shows the
        offending shards, and the layout picture with their blocks marked:
        ``%mh_nan params`` names e.g. ``['w'] block [8:12, 4:8] on
        process 2, device 5 (host 2 · dev 1): 2 NaN, 0 Inf, first at (9, 6)``.

        Examples::

            %mh_nan grads
            %mh_nan state.params
        """
        args = magic_arguments.parse_argstring(self.mh_nan, _compact_subscripts(line))
        name = _valid_name(args.name)
        session = self._session()
        view = _delegate(lambda: nonfinite_view(session, name))
        return None if view is _INTERRUPTED else view

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'action',
        nargs='?',
        default='show',
        choices=['on', 'off', 'show', 'step', 'continue'],
        help='on: pause every host before each collective; step: release '
        'one; continue: release all and turn stepping off',
    )
    @magic_arguments.argument(
        'count', nargs='?', type=int, default=1, help='step: how many collectives to release'
    )
    @line_magic
    def mh_step(self, line: str) -> Any:
        """Which host takes another path? Step the hosts one collective at a time.

        ``%mh_step on`` makes every host pause before each collective; the next
        ``%%mh`` cell then runs in the background while the stepper (a host x
        step grid with Step/Continue/Stop) shows who arrived where: divergence
        is highlighted before it deadlocks. ``%mh_step step 3`` releases three
        collectives, ``%mh_step continue`` all of them and turns stepping off;
        ``%mh_wait`` then collects the cell's output.

        Examples::

            %mh_step on
            %mh_step step 3
            %mh_step continue
        """
        args = magic_arguments.parse_argstring(self.mh_step, line)
        session = self._session()
        if args.action == 'step' and args.count < 1:
            raise UsageError('step releases at least one collective: %mh_step step 1')
        actions = {
            'on': lambda: session.set_stepping(True),
            'off': lambda: session.set_stepping(False),
            'step': lambda: session.release(args.count),
            'continue': session.release_all,
            'show': lambda: None,
        }
        _delegate(actions[args.action])
        return _delegate(lambda: stepper_view(session))

    @magic_arguments.magic_arguments()
    @line_magic
    def mh_env(self, line: str) -> Any:
        """Why does one host behave differently? Versions, flags, code that differ.

        Compares Python/jax/jaxlib/numpy and runtime versions, ``JAX_*``,
        ``XLA_*``, ``TPU_*``, ``NCCL_*``, ``CUDA_*`` variables, ``jax.config``
        values, the git commit and the user's source files; only keys that
        differ are shown, majority vs odd hosts.

        Example::

            %mh_env
        """
        if line.strip():
            raise UsageError('%mh_env takes no arguments.')
        session = self._session()
        view = _delegate(lambda: env_view(session))
        return None if view is _INTERRUPTED else view

    @magic_arguments.magic_arguments()
    @line_magic
    def mh_mem(self, line: str) -> Any:
        """Which host holds more memory, and what? Per device; arrays few hosts hold.

        A host x device heatmap of live-array bytes (``memory_stats()`` where
        the backend reports it), the hosts whose live bytes stand out, and the
        kinds of arrays (shape, dtype, sharding, engine names) that only some
        hosts hold: leak candidates.

        Example::

            %mh_mem
        """
        if line.strip():
            raise UsageError('%mh_mem takes no arguments.')
        session = self._session()
        view = _delegate(lambda: memory_view(session))
        return None if view is _INTERRUPTED else view

    @magic_arguments.magic_arguments()
    @line_magic
    def mh_where(self, line: str) -> Any:
        """Where is every host? Its current collective and stacks, even while busy.

        Answered by the control endpoint, not the engines' queues, so it
        works while a cell hangs; led by the verdict in one line (which hosts
        are inside which collective, which never got there), then one row per
        state with its stacks.

        Example::

            %mh_where
        """
        if line.strip():
            raise UsageError('%mh_where takes no arguments.')
        session = self._session()
        return _delegate(lambda: where_view(session))

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        '--last', type=int, default=200, help="each host's last N flight records (default 200)"
    )
    @magic_arguments.argument(
        '--chrome', metavar='PATH', help='also write Chrome trace-event JSON (open in Perfetto)'
    )
    @line_magic
    def mh_timeline(self, line: str) -> Any:
        """Who arrives late? A host x time chart of collectives and watched launches.

        Gathers every host's last ``--last`` flight records (works while the
        engines are busy) and names the host that arrived last most often,
        e.g. ``process 3 arrived last in 87% of the last 200 steps (174 of
        200), median +180 ms after the first host``; a table gives the
        slowest host of each step. ``--chrome trace.json`` also writes Chrome
        trace-event JSON, one track per host, to open in https://ui.perfetto.dev.

        Examples::

            %mh_timeline
            %mh_timeline --last 500 --chrome /tmp/steps.json
        """
        args = magic_arguments.parse_argstring(self.mh_timeline, line)
        if args.last < 1:
            raise UsageError(
                f'--last takes a positive number of records, got {args.last}; e.g. 200'
            )
        session = self._session()
        view = _delegate(lambda: timeline_view(session, last=args.last))
        if view is _INTERRUPTED:
            return None
        if args.chrome:
            try:
                path = view.timeline.to_chrome_trace(args.chrome)
            except OSError as exc:
                raise UsageError(f'--chrome: cannot write {args.chrome!r}: {exc}') from None
            print(
                f'wrote a Chrome trace of {len(view.timeline.steps)} steps (one track per host) '
                f'to {path}: open it in https://ui.perfetto.dev'
            )
        return view

    # -- %mh_help --------------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @line_magic
    def mh_help(self, line: str) -> None:
        """Which magic answers my question? This table: every magic, an example each.

        One row per registered magic, made from its docstring: the first line
        (the question it answers) and its shortest example. ``%mh_layout?``
        (any magic's name, then ``?``) shows that one's usage, options and
        examples.

        Example::

            %mh_help
        """
        if line.strip():
            raise UsageError('%mh_help takes no arguments; %mh_NAME? shows one magic in full.')
        from IPython.display import display

        display(_help_table(self), raw=True)


_INTERRUPTED = object()  # what _delegate returns after an interrupt


def _delegate(fn: Callable[[], Any]) -> Any:
    """Runs a `Session` call for a magic.

    An interrupt (Ctrl-C while it waited) shows what happened on the hosts
    and returns `_INTERRUPTED`; errors become a one-line `UsageError` that
    says what to do.
    """
    try:
        return fn()
    except SessionInterrupted as exc:
        _show_interrupt(exc.report)
        return _INTERRUPTED
    except HostsError as exc:
        raise UsageError(_first_error(exc)) from None
    except (SessionError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _show_interrupt(report: InterruptReport) -> None:
    """The interrupt's one line, then where each host was when it came."""
    print(f'%mh: {report.message}')
    if report.where:
        from IPython.display import display

        print('Where each host was:')
        display(stacks_view(report.where))


def background_note(*, stepping: bool) -> str:
    """What ``%%mh`` says when a cell runs in the background: the stepper only when stepping
    is on (the hosts pause at each collective until it releases them)."""
    if stepping:
        return (
            '%%mh: running in the background (stepping is on); release steps with the '
            'stepper (%mh_step), then collect the output with %mh_wait.'
        )
    return (
        '%%mh: running in the background (--bg); %mh_wait collects the output '
        '(%mh_where shows where the hosts are meanwhile).'
    )


def _check_timeout(timeout: float | None, example: str) -> None:
    if timeout is not None and not timeout > 0:
        raise UsageError(f'--timeout must be > 0 seconds, got {timeout:g}; e.g. {example}')


_UNITS = {'': 1, 'b': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9, 't': 1e12}


def _parse_bytes(text: str) -> int:
    """``'1000'``, ``'500MB'``, ``'8GiB'``, ``'1.5g'`` -> bytes."""
    m = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*', text.lower())
    if not m:
        raise UsageError(f'--max-bytes takes a size like 1000000, 500MB or 8GiB; got {text!r}')
    number, unit, binary = m.groups()
    scale = 1024 ** 'bkmgt'.index(unit or 'b') if binary else _UNITS[unit]
    return int(float(number) * scale)


def _first_error(exc: HostsError) -> str:
    """The lowest failing host's ``ename: evalue`` (the same error is usually on every host)."""
    if not exc.failures:
        return str(exc)
    return exc.failures[min(exc.failures)].summary


def _print_errors(failures: dict[int, RemoteFailure]) -> None:
    for p, failure in sorted(failures.items()):
        print(f'--- host {p} ---\n{failure.text}')


def _magic_doc(method: Any) -> str:
    """A magic's own docstring (for magic_arguments ones: without the generated usage/options)."""
    parser = getattr(method, 'parser', None)
    doc = parser.description if parser is not None else method.__doc__
    return inspect.cleandoc(doc or '')


def _magic_examples(doc: str) -> list[str]:
    """The magic lines (``%...``, ``%%...``) of a docstring's ``Example::``/``Examples::`` block."""
    lines = inspect.cleandoc(doc).splitlines()
    starts = [i for i, ln in enumerate(lines) if re.fullmatch(r'Examples?::', ln.strip())]
    if not starts:
        return []
    found = []
    for ln in lines[starts[0] + 1 :]:
        if ln.strip() and not ln.startswith(' '):  # the literal block ends
            break
        if ln.strip().startswith('%'):
            found.append(ln.strip())
    return found


def _registered_magics(owner: Any) -> list[tuple[str, Any]]:
    """``('%name' or '%%name', method)`` of each magic of a `Magics` class or instance.

    In the order of the class body (``%%mh`` after ``%mh_cluster``, ``%mh_help`` last).
    """
    found = []
    for kind, prefix in (('line', '%'), ('cell', '%%')):
        for name, method in owner.magics[kind].items():
            method = getattr(owner, method) if isinstance(method, str) else method  # class: names
            found.append((prefix + name, method))
    order = list(vars(MultihostMagics))
    return sorted(found, key=lambda f: order.index(f[1].__name__) if f[1].__name__ in order else 0)


_HEAD = ('magic', 'what it answers', 'example')
_NOTE = 'One magic in full (usage, options, examples): %mh_layout?'


def _help_table(owner: Any) -> dict[str, str]:
    """What ``%mh_help`` shows (text and HTML): one row per magic of ``owner``, from its docstring.

    Purpose: the docstring's first line; example: the shortest line of its
    ``Example::`` block.
    """
    import html

    rows = []
    for form, method in _registered_magics(owner):
        doc = _magic_doc(method)
        purpose = doc.splitlines()[0].replace('``', '') if doc else ''
        rows.append((form, purpose, min(_magic_examples(doc) or [form], key=len)))
    widths = [max(len(r[i]) for r in [_HEAD, *rows]) for i in range(3)]
    text = [
        '  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [_HEAD, *rows]
    ]
    head = ''.join(f'<th style="text-align:left">{h}</th>' for h in _HEAD)
    body = ''.join(
        f'<tr><td style="text-align:left"><code>{html.escape(form)}</code></td>'
        f'<td style="text-align:left">{html.escape(purpose)}</td>'
        f'<td style="text-align:left"><code>{html.escape(example)}</code></td></tr>'
        for form, purpose, example in rows
    )
    return {
        'text/plain': '\n'.join([*text, '', _NOTE]),
        'text/html': f'<table class="mh-help"><thead><tr>{head}</tr></thead>'
        f'<tbody>{body}</tbody></table><p>{html.escape(_NOTE)}</p>',
    }


def _magic_docs() -> str:
    parts = []
    for form, method in _registered_magics(MultihostMagics):
        doc = _magic_doc(method).replace('\n', '\n    ')
        parts.append(f'``{form}``\n\n    {doc}')
    return '\n\n'.join(parts)


__doc__ = __doc__.replace('{MAGIC_DOCS}', _magic_docs())


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(MultihostMagics)
