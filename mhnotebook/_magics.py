"""IPython magics: ``%load_ext mhnotebook``.

Each magic only parses its arguments and delegates to a `Session` method;
user mistakes raise `UsageError` with a message that says what to do.
Nothing typed by the user is evaluated, except the code of a ``%%mh`` cell
(which runs on the engines).

{MAGIC_DOCS}
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import numpy as np
from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from mhnotebook._session import HostsError, Session, SessionError, SessionTimeout

NO_SESSION = (
    'no cluster yet: start one with  %mh_cluster start -n 4 -d 2  (simulated local '
    'hosts) or  %mh_cluster connect --profile NAME  (an existing ipyparallel cluster).'
)
_ANSI = re.compile(r'\x1b\[[0-9;]*m')
BAD_NAME = '{!r} is not a variable name; use e.g. x or state.params.'


def _valid_name(name: str, *, dotted: bool = True) -> str:
    parts = name.split('.') if dotted else [name]
    if not name or not all(p.isidentifier() for p in parts):
        raise UsageError(BAD_NAME.format(name))
    return name


def _nbytes(value: Any) -> int:
    import jax

    return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(value))


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

    SYMBOL = {'running': '…', 'done': '✓', 'error': '✗'}

    def __init__(self) -> None:
        from IPython.display import display

        self.handle = display({'text/plain': 'starting …'}, raw=True, display_id=True)

    def __call__(self, state: dict[int, str], elapsed: float) -> None:
        text = '  '.join(f'host {p} {self.SYMBOL[s]}' for p, s in sorted(state.items()))
        if self.handle is not None:
            self.handle.update({'text/plain': f'[{elapsed:5.1f} s]  {text}'}, raw=True)


@magics_class
class MultihostMagics(Magics):
    """The ``%mh_*`` magics. One session per IPython shell."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.stepping = False
        self.background: dict[int, Any] | None = None

    def _session(self) -> Session:
        if self.session is None or not self.session.running:
            raise UsageError(NO_SESSION)
        return self.session

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
        help='start: number of simulated hosts; connect: wait for N engines',
    )
    @magic_arguments.argument(
        '-d', '--devices', type=int, default=2, help='start: CPU devices per host'
    )
    @magic_arguments.argument('--profile', help='connect: ipython profile of the cluster')
    @magic_arguments.argument('--cluster-id', help='connect: cluster id within the profile')
    @magic_arguments.argument('--url-file', help='connect: ipcontroller-client.json path')
    @magic_arguments.argument('--coordinator', help='connect: host:port for jax.distributed')
    @magic_arguments.argument(
        '--timeout', type=float, default=180.0, help='seconds to wait for engines'
    )
    @line_magic
    def mh_cluster(self, line: str) -> Any:
        """Start, connect to, inspect, restart or stop the session's cluster.

        ``%mh_cluster start -n 4 -d 2`` starts 4 simulated hosts with 2 CPU
        devices each; ``%mh_cluster connect --profile mpi`` attaches to a
        running ipyparallel cluster (any launcher) and initializes JAX there.
        """
        args = magic_arguments.parse_argstring(self.mh_cluster, line)
        from mhnotebook import _session

        if args.action == 'start':
            if self.session is not None and self.session.running:
                raise UsageError(
                    'a cluster is already running: %mh_cluster stop it first, '
                    'or %mh_cluster restart.'
                )
            if args.n < 1 or args.devices < 1:
                raise UsageError('-n and -d must be at least 1, e.g. %mh_cluster start -n 4 -d 2')
            self.session = _session.start_local(args.n, args.devices, timeout=args.timeout)
            return None
        if args.action == 'connect':
            if self.session is not None and self.session.running:
                raise UsageError('a cluster is already running: %mh_cluster stop it first.')
            try:
                self.session = _session.connect(
                    args.url_file,
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
            for p, st in session.status().items():
                state = 'busy' if st['busy'] else 'idle'
                print(
                    f'host {p}: engine {st["engine_id"]} on {st["hostname"]} '
                    f'(pid {st["pid"]}), {state}'
                )
        elif args.action == 'restart':
            session.restart(timeout=args.timeout)
        elif args.action == 'stop':
            session.stop()
        return None

    # -- %%mh ----------------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        '--timeout', type=float, default=None, help='seconds to wait; then show where every host is'
    )
    @magic_arguments.argument(
        '--bg', action='store_true', help='return at once; collect the output with %%mh_wait'
    )
    @cell_magic
    def mh(self, line: str, cell: str) -> None:
        """Run the cell on every host; output is labelled by process index.

        While it runs, a live per-host status is shown. On ``--timeout`` or an
        interrupt, shows where each unfinished host is (its collective and
        stack) and gives control back; the cell keeps running on the hosts.
        """
        args = magic_arguments.parse_argstring(self.mh, line)
        session = self._session()
        if self.stepping or args.bg:
            # The kernel must stay free so the stepper's buttons can release steps.
            self.background = session.execute_async(cell)
            print(
                '%%mh: running in the background (stepping is on); release steps with the '
                'stepper, then collect the output with %mh_wait.'
            )
            return
        status = _LiveStatus()
        pending = session.execute_async(cell)
        try:
            session.wait_outputs(pending, timeout=args.timeout, on_status=status)
        except SessionTimeout as exc:
            self.background = pending  # %mh_wait collects it later
            print(
                f'%%mh: hosts {exc.pending} still running after {args.timeout:g} s '
                f'(finished: {exc.finished}); %mh_wait collects the output. Where they are:'
            )
            self._show_where(session)
        except KeyboardInterrupt:
            self.background = pending
            print(
                '%%mh: interrupted; the cell keeps running on the hosts (%mh_wait, or '
                'session.interrupt()). Where they are:'
            )
            self._show_where(session)
        except HostsError as exc:
            _print_errors(exc)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument('--timeout', type=float, default=None, help='seconds to wait')
    @line_magic
    def mh_wait(self, line: str) -> None:
        """Wait for the ``%%mh`` cell running in the background and print its output."""
        args = magic_arguments.parse_argstring(self.mh_wait, line)
        session = self._session()
        if self.background is None:
            raise UsageError('no %%mh cell is running in the background.')
        try:
            session.wait_outputs(self.background, timeout=args.timeout)
        except SessionTimeout as exc:
            print(f'%mh_wait: hosts {exc.pending} still running; see %mh_where or the stepper.')
            return
        except HostsError as exc:
            _print_errors(exc)
        self.background = None

    def _show_where(self, session: Session) -> None:
        from IPython.display import display

        try:
            display(session.where_view())
        except (SessionError, OSError, RuntimeError) as exc:
            print(f'(could not collect stacks: {exc})')

    # -- %mh_allgather -------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help='engine variable (x or state.params)')
    @magic_arguments.argument(
        '-o', '--out', help='notebook variable to store it in (default: NAME)'
    )
    @magic_arguments.argument(
        '--transport',
        choices=['auto', 'shm', 'zmq'],
        default='auto',
        help='shm: engines on this machine write into shared memory',
    )
    @line_magic
    def mh_allgather(self, line: str) -> None:
        """Bring the global value of an engine variable into the notebook as numpy.

        ``%mh_allgather params -o p`` stores the gathered value in ``p``. A
        global jax.Array comes back whole; host-local arrays are stacked along
        a new axis 0 (one row per process); pytrees keep their structure.
        Each shard is sent once, straight into its place.
        """
        args = magic_arguments.parse_argstring(self.mh_allgather, line)
        name = _valid_name(args.name)
        out = _valid_name(args.out or name.rsplit('.', 1)[-1], dotted=False)
        session = self._session()
        try:
            value = session.allgather(name, transport=args.transport)
        except SessionError as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns[out] = value
        print(f'{out} = {name} gathered from {session.num_processes} hosts: {_describe(value)}')

    # -- %mh_barrier -----------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help='barrier name (the same on every host)')
    @magic_arguments.argument('--timeout', type=float, default=30.0, help='seconds to wait')
    @line_magic
    def mh_barrier(self, line: str) -> None:
        """Run a timed barrier on every host and report who arrived and how long it took."""
        args = magic_arguments.parse_argstring(self.mh_barrier, line)
        session = self._session()
        results = session.barrier(args.name, timeout=args.timeout)
        for p, r in sorted(results.items()):
            if r['ok']:
                print(f'host {p}: passed {args.name!r} in {r["elapsed"] * 1e3:.1f} ms')
            else:
                print(f'host {p}: {r["error"]}: {r["message"].splitlines()[0]}')

    # -- views -----------------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help='engine array variable')
    @magic_arguments.argument('--axes', help='the two displayed axes, e.g. 0,2')
    @magic_arguments.argument(
        '--no-values',
        action='store_true',
        help='do not gather the values (selecting a block shows no data)',
    )
    @line_magic
    def mh_layout(self, line: str) -> Any:
        """Show how an engine array is laid out: blocks coloured by host, labelled by device.

        Replicas are digested on every host; blocks whose replicas disagree
        are flagged. ``--axes 0,2`` picks the displayed axes of a rank >= 3 array.
        """
        args = magic_arguments.parse_argstring(self.mh_layout, line)
        name = _valid_name(args.name)
        axes = None
        if args.axes:
            try:
                axes = tuple(int(a) for a in args.axes.split(','))
            except ValueError:
                raise UsageError(f'--axes takes two integers like 0,1; got {args.axes!r}') from None
        session = self._session()
        try:
            return session.layout_view(name, values=not args.no_values, axes=axes)
        except (SessionError, HostsError) as exc:
            raise UsageError(_first_line_error(exc)) from None

    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help='engine variable (any pytree)')
    @line_magic
    def mh_diff(self, line: str) -> Any:
        """Compare an engine value across hosts: which leaves differ, where, by how much."""
        args = magic_arguments.parse_argstring(self.mh_diff, line)
        name = _valid_name(args.name)
        session = self._session()
        try:
            return session.diff_view(name)
        except (SessionError, HostsError) as exc:
            raise UsageError(_first_line_error(exc)) from None

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
        """Step through barriers and collectives: a host x step grid with Step/Continue/Stop.

        ``%mh_step on`` makes every host pause before each collective; the next
        ``%%mh`` cell then runs in the background while the stepper shows
        who arrived where (divergence is highlighted before it deadlocks).
        """
        args = magic_arguments.parse_argstring(self.mh_step, line)
        session = self._session()
        if args.action == 'on':
            session.set_stepping(True)
            self.stepping = True
        elif args.action == 'off':
            session.set_stepping(False)
            self.stepping = False
        elif args.action == 'step':
            if args.count < 1:
                raise UsageError('step releases at least one collective: %mh_step step 1')
            session.release(args.count)
        elif args.action == 'continue':
            session.release_all()
            self.stepping = False
        return session.stepper_view()

    @line_magic
    def mh_where(self, line: str) -> Any:
        """Show where every host is: its current collective and Python stacks (works while busy)."""
        if line.strip():
            raise UsageError('%mh_where takes no arguments.')
        return self._session().where_view()


def _first_line_error(exc: BaseException) -> str:
    if isinstance(exc, HostsError):
        text = _ANSI.sub('', next(iter(exc.errors.values())))
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else str(exc)
    return str(exc)


def _print_errors(exc: HostsError) -> None:
    for p, text in sorted(exc.errors.items()):
        print(f'--- host {p} ---\n{text}')


def _magic_docs() -> str:
    parts = []
    for name, kind in [
        ('mh_cluster', '%'),
        ('mh', '%%'),
        ('mh_allgather', '%'),
        ('mh_barrier', '%'),
    ]:
        doc = (getattr(MultihostMagics, name).__doc__ or '').strip()
        parts.append(f'``{kind}{name}``\n\n    ' + doc.replace('\n', '\n    '))
    return '\n\n'.join(parts)


__doc__ = __doc__.replace('{MAGIC_DOCS}', _magic_docs())


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(MultihostMagics)
