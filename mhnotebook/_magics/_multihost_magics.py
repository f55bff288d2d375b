"""`MultihostMagics`: every magic's arguments and docstring; the work is the session's.

Each magic parses its line, checks what was typed (a `UsageError` says what
to do), then delegates: to a `Session` method, to `_views` (which asks the
session for models and returns a widget), or to this room's helpers for
``%mh_cluster`` (`_cluster_actions`), ``%%mh`` (`_run`) and ``%mh_help``
(`_help`). The magics are registered through this room's `line_magic` and
`cell_magic`, which show an interrupt that came while a magic waited.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class

from mhnotebook._attach import AttachedJob, AttachError, attach
from mhnotebook._errors import HostsError, SessionError
from mhnotebook._jobview import DataView, JobView
from mhnotebook._magics import _cluster_actions, _help, _results, _run
from mhnotebook._magics._entry import (
    cell_magic,
    delegate,
    in_use,
    line_magic,
    print_errors,
    running,
    use,
)
from mhnotebook._magics._options import (
    check_timeout,
    compact_subscripts,
    gather_target,
    no_arguments,
    parse_axes,
    parse_bytes,
    parse_call,
    timeout_option,
    valid_name,
)
from mhnotebook._postmortem import PostMortemError, postmortem
from mhnotebook._session import Session
from mhnotebook._views import (
    Shown,
    audit_view,
    diff_view,
    env_view,
    layout_view,
    memory_view,
    nonfinite_view,
    replay_view,
    stepper_view,
    timeline_view,
    where_view,
)

R = TypeVar('R')

#: What a tree-taking magic's ``name`` is (`%mh_nonfinite`, under both its names).
_TREE_NAME = "engine value (an array or any pytree): grads, state.params['embed']"


def _frame_arg(text: str) -> int | str:
    """``--frame``: a frame number, or the name of a function of the program."""
    return int(text) if text.lstrip('-').isdigit() else text


def _framed(view: DataView, frame: int | str | None, build: Callable[[], R]) -> R:
    """``build()`` with ``view``'s data tools reading frame ``frame`` (an attached job's
    ``--frame N``; None: as before), inside the magic's `delegate`."""
    with view.in_frame(frame):
        return build()


#: ``--frame N`` of the data magics: which frame of an attached job's program names are read in.
_frame_option = magic_arguments.argument(
    '--frame',
    type=_frame_arg,
    help='attached job: read the names in this frame of the program: a number (0, the '
    "innermost, by default) or a function's name (job.frames() lists them)",
)


@magics_class
class MultihostMagics(Magics):
    """The ``%mh_*`` magics. One session per IPython shell."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.background: dict[int, Any] | None = None
        self.attached: AttachedJob | None = None
        self.attach_failed = ''  # the last %mh_attach's error, until one succeeds ...
        self.failed_beside: Session | None = None  # ... or another session is in use since
        self.shown = Shown(getattr(shell, 'user_ns', None))

    def _session(self, what: str | None = None) -> Session:
        """The running session, for magics that run code on the hosts (refused while attached).

        ``what`` (the magic, ``'%mh_diff'``): it runs on the engines, so a background cell
        still running there refuses it, and one that finished is shown first
        (`_run.before_another`)."""
        if self.attached is not None:
            raise UsageError(
                f'attached to a job started outside the notebook ({self.attached.path}): '
                'this magic runs code on the hosts, which only a %mh_cluster session can; '
                '%mh_where, %mh_timeline, %mh_step and the data magics (%mh_allgather, '
                '%mh_layout, %mh_diff, %mh_nonfinite, %mh_env, %mh_memory_census, %mh_replay: '
                'they read '
                "the stopped hosts' frames) work here, and %%mh when the job was started with "
                '--allow-exec; %mh_detach ends the attachment'
            )
        session = self._running()
        if what is not None:
            _run.before_another(self, session, what)
        return session

    def _data(self, form: str, frame: int | str | None = None) -> DataView:
        """Where a data magic (``%mh_allgather``, ``%mh_layout``, ...) reads: the attached
        job (in its hosts' stopped frames, ``--frame N``), else the running session."""
        if self.attached is not None:
            if isinstance(frame, int) and frame < 0:
                raise UsageError(
                    f'{form} --frame N: N >= 0 (0: the innermost frame of the program)'
                )
            return self.attached
        if frame is not None:
            raise UsageError(
                f"{form} --frame is for an attached job (its hosts' stopped frames); a session's "
                'engines have one namespace'
            )
        return self._session(form)

    def _inspected(self) -> JobView:
        """The attached job if any, else the running session (where, timeline, step)."""
        return self.attached if self.attached is not None else self._running()

    def _running(self) -> Session:
        """The running session; with none, after a failed ``%mh_attach``, that the attach
        failed (not how to start a cluster: the user has a batch job)."""
        session = self.session
        failed = self.attach_failed and session is self.failed_beside  # the latest event
        if (session is None or not session.running) and failed:
            raise UsageError(
                f'not attached to a job: {self.attach_failed}; %mh_attach PATH again once the '
                "job runs (its process 0 writes PATH), or %mh_postmortem DIR reads a job's dumps"
            )
        return running(session)

    @property
    def stepping(self) -> bool:
        """Whether the step gate is on: the session asks the hosts (one source of truth)."""
        session = self.session
        return session is not None and session.running and session.stepping

    @property
    def session(self) -> Session | None:
        return in_use()

    @session.setter
    def session(self, value: Session | None) -> None:
        use(value)

    # -- %mh_cluster -----------------------------------------------------------
    @magic_arguments.magic_arguments()
    @_cluster_actions.action_options
    @_cluster_actions.start_options
    @_cluster_actions.connect_options
    @timeout_option(180.0, 'seconds to wait for engines')
    @line_magic
    def mh_cluster(self, line: str) -> None:
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
        check_timeout(args.timeout, '180')
        self.session = _cluster_actions.ACTIONS[args.action](self.session, args, line)
        if args.action in ('restart', 'stop') and self.background is not None:
            self.background = None  # its engines are gone
            print(f'%mh_cluster {args.action}: the background %%mh cell ended with its engines.')

    # -- %%mh ----------------------------------------------------------------------
    @magic_arguments.magic_arguments('%mh')  # its usage line then says %%mh
    @timeout_option(None, 'seconds to wait; then show where every host is')
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
        check_timeout(args.timeout, '%%mh --timeout 30')
        if self.attached is not None:  # in the stopped frames, if the job allows it
            if args.bg:
                raise UsageError('%%mh --bg is for a %mh_cluster session, not an attached job')
            try:
                self.attached.execute(cell, timeout=args.timeout)  # None: run_cell's default
            except HostsError as exc:
                if any(f.ename == 'PermissionError' for f in exc.failures.values()):
                    raise UsageError(f'%%mh: {exc}') from None
                print(f'%%mh: {exc}')
                print_errors(dict(exc.failures))
            except SessionError as exc:  # not stopped, a host gone, no answer
                raise UsageError(f'%%mh: {exc}') from None
            return
        _run.run_cell(self, self._session(), cell, timeout=args.timeout, bg=args.bg)

    @magic_arguments.magic_arguments()
    @timeout_option(None, 'seconds to wait')
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
        check_timeout(args.timeout, '%mh_wait --timeout 30')
        _run.wait(self, self._session(), timeout=args.timeout)

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
    @_frame_option
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
        # A subscript may contain spaces (x[::4, :128]): one argument.
        args = magic_arguments.parse_argstring(self.mh_allgather, compact_subscripts(line))
        out = gather_target(args.name, args.out)
        max_bytes = parse_bytes(args.max_bytes) if args.max_bytes is not None else None
        session = self._data('%mh_allgather', args.frame)
        value = delegate(
            lambda: session.allgather(
                args.name, transport=args.transport, max_bytes=max_bytes, frame=args.frame
            )
        )
        if self.shell is None:  # a Magics made without a shell has no namespace to fill
            raise UsageError(f'%mh_allgather: no IPython shell to define {out} in')
        self.shell.user_ns[out] = value
        _results.print_gathered(out, args.name, session.num_processes, value)

    # -- %mh_barrier -----------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help='barrier name (the same on every host)')
    @timeout_option(
        None, 'seconds to wait (default: MULTIHOST_TIMEOUT, 600 s, as multihost.barrier)'
    )
    @line_magic
    def mh_barrier(self, line: str) -> None:
        """Do all hosts get here? A timed barrier: who arrived, how long it took.

        Every host waits at barrier ``NAME`` for up to ``--timeout`` seconds (default: as
        long as ``multihost.barrier`` does, ``MULTIHOST_TIMEOUT``, 600 s unless set; Ctrl-C
        ends it sooner); each one's time in it, or the error that names the hosts that never
        arrived, is printed per host. It returns at its timeout even when a host's engine is
        busy with another task: that host is named busy (where it is) and its barrier call
        is withdrawn, so it never runs late.

        Examples::

            %mh_barrier ckpt
            %mh_barrier after-data-load --timeout 120
        """
        args = magic_arguments.parse_argstring(self.mh_barrier, line)
        check_timeout(args.timeout, '%mh_barrier NAME --timeout 30')
        session = self._session('%mh_barrier')
        results = delegate(lambda: session.barrier(args.name, timeout=args.timeout))
        _results.print_barrier(args.name, results)

    # -- views -----------------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'name',
        nargs='?',
        help="engine array or pytree: x, state.params, state.params['embed']['embedding']",
    )
    @magic_arguments.argument('--axes', help='the two displayed axes, e.g. 0,2')
    @magic_arguments.argument(
        '--topology',
        help='preview on a TPU pod, no session needed (needs libtpu): v5e:4x4, v5p:2x2x4',
    )
    @magic_arguments.argument('--shape', help='with --topology: the global shape, e.g. 1024,512')
    @magic_arguments.argument('--dtype', default='float32', help='with --topology: the dtype')
    @magic_arguments.argument('--mesh', default='', help='with --topology: data=4,model=4')
    @magic_arguments.argument(
        '--spec', default='', help="with --topology: the partition spec, e.g. P('data', 'model')"
    )
    @magic_arguments.argument(
        '--slices', type=int, default=1, help='with --topology: slices joined by DCN'
    )
    @magic_arguments.argument(
        '--no-values',
        action='store_true',
        help='do not gather the values (selecting a block shows no data)',
    )
    @_frame_option
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
            %mh_layout --topology v5e:4x4 --shape 8192,4096 --mesh data=4,model=4 --spec data,model

        ``--topology`` previews, from a laptop, how an array would lie on a TPU pod (no
        session, no TPU: libtpu describes the pod, ``JAX_PLATFORMS=cpu``): the chips at
        their coordinates, coloured by host, with the blocks they hold, bytes per chip and
        per host, and per mesh axis whether it rides an ICI ring, crosses hosts or DCN.
        """
        args = magic_arguments.parse_argstring(self.mh_layout, compact_subscripts(line))
        if args.topology:
            return self._layout_preview(args)
        if not args.name:
            raise UsageError('%mh_layout NAME (an engine array), or --topology KIND:SHAPE ...')
        name = valid_name(args.name)
        axes = parse_axes(args.axes) if args.axes else None
        session = self._data('%mh_layout', args.frame)
        try:
            view = delegate(
                lambda: _framed(
                    session,
                    args.frame,
                    lambda: layout_view(session, name, values=not args.no_values, axes=axes),
                )
            )
        except UsageError as exc:
            if str(exc).startswith('axes '):  # the view's complaint names the option
                raise UsageError(f'--{exc}') from None
            raise
        _results.note_host_local(name, view)
        return self.shown.replace(f'%mh_layout {name}', view)

    def _layout_preview(self, args: Any) -> Any:
        """``%mh_layout --topology ...``: the layout of an abstract array on a TPU pod."""
        from mhnotebook.widgets import LayoutView
        from multihost._checks._preview import preview_from_text

        if args.name:
            raise UsageError(
                f'%mh_layout --topology previews an array described by --shape/--dtype/--mesh/'
                f'--spec; drop {args.name!r} (or drop --topology to show that engine array)'
            )
        if not args.shape:
            raise UsageError('%mh_layout --topology needs --shape, e.g. --shape 1024,512')
        try:
            layout = preview_from_text(
                args.topology, args.shape, args.dtype, args.mesh, args.spec or '', args.slices
            )
            view = LayoutView(layout, axes=parse_axes(args.axes) if args.axes else None)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise UsageError(f'%mh_layout --topology {args.topology}: {exc}') from None
        return self.shown.replace(f'%mh_layout --topology {args.topology}', view)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'name', help='engine value (any pytree): params, state.params, state.opt_state[0].mu'
    )
    @_frame_option
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
        args = magic_arguments.parse_argstring(self.mh_diff, compact_subscripts(line))
        name = valid_name(args.name)
        session = self._data('%mh_diff', args.frame)
        view = delegate(lambda: _framed(session, args.frame, lambda: diff_view(session, name)))
        return self.shown.replace(f'%mh_diff {name}', view)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        'call', nargs='+', help="the launch, as the job calls it: 'train_step(state, batch)'"
    )
    @magic_arguments.argument(
        '--again', type=int, default=2, help='times the compiled launch runs (default 2)'
    )
    @magic_arguments.argument(
        '--canonical',
        action='store_true',
        help="when the inputs differ, go on with process 0's host-local arguments everywhere",
    )
    @_frame_option
    @line_magic
    def mh_replay(self, line: str) -> Any:
        """Why do the hosts part? Replays one launch on every host and names the cause.

        First the arguments (do they already differ between hosts?), then the compiled
        launch run again on copies (does a host repeat itself?), then its jaxpr one
        equation at a time, each equation's outputs compared between hosts: the first one
        whose outputs part is named with its line in your code, the hosts that differ and
        by how much. Nothing the job holds is changed (the launch runs on copies).

        Examples::

            %mh_replay train_step(state, batch)
            %mh_replay train_step(state, batch) --canonical
        """
        args = magic_arguments.parse_argstring(self.mh_replay, line)
        fn, names = parse_call(' '.join(args.call))
        if args.again < 1:
            raise UsageError('%mh_replay --again N: N >= 1 (the times the launch runs again)')
        session = self._data('%mh_replay', args.frame)
        view = delegate(
            lambda: replay_view(
                session, fn, names, again=args.again, canonical=args.canonical, frame=args.frame
            )
        )
        return self.shown.replace(f'%mh_replay {fn}', view)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument('name', help=_TREE_NAME)
    @_frame_option
    @line_magic
    def mh_nonfinite(self, line: str) -> Any:
        """Where are the NaNs? The shards holding NaN/Inf: host, device, block.

        Every host counts NaN and Inf in each of its shards on device (global
        arrays shard by shard, replicas included; host-local values in their
        own copy); only the offending shards' counts travel. Shows the
        offending shards, and the layout picture with their blocks marked:
        ``%mh_nonfinite params`` names e.g. ``['w'] block [8:12, 4:8] on
        process 2, device 5 (dev 1): 2 NaN, 0 Inf, first at (9, 6)``.

        Examples::

            %mh_nonfinite grads
            %mh_nonfinite state.params
        """
        args = magic_arguments.parse_argstring(self.mh_nonfinite, compact_subscripts(line))
        name = valid_name(args.name)
        session = self._data('%mh_nonfinite', args.frame)
        view = delegate(lambda: _framed(session, args.frame, lambda: nonfinite_view(session, name)))
        return self.shown.replace(f'%mh_nonfinite {name}', view)

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
        session = self._inspected()
        if args.action == 'step' and args.count < 1:
            raise UsageError('step releases at least one collective: %mh_step step 1')
        actions = {
            'on': lambda: session.set_stepping(True),
            'off': lambda: session.set_stepping(False),
            'step': lambda: session.release(args.count),
            'continue': session.release_all,
            'show': lambda: None,
        }
        delegate(actions[args.action])
        return self.shown.replace('%mh_step', delegate(lambda: stepper_view(session)))

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
        no_arguments(line, '%mh_env takes no arguments.')
        session = self._data('%mh_env')
        return self.shown.replace('%mh_env', delegate(lambda: env_view(session)))

    @magic_arguments.magic_arguments()
    @_frame_option
    @line_magic
    def mh_memory_census(self, line: str) -> Any:
        """Which host holds more memory, and what? Per device; arrays few hosts hold.

        A host x device heatmap of live-array bytes (``memory_stats()`` where
        the backend reports it), the hosts whose live bytes stand out, and the
        kinds of arrays (shape, dtype, sharding, engine names) that only some
        hosts hold: leak candidates.

        Example::

            %mh_memory_census
        """
        args = magic_arguments.parse_argstring(self.mh_memory_census, line)
        session = self._data('%mh_memory_census', args.frame)
        view = delegate(lambda: _framed(session, args.frame, lambda: memory_view(session)))
        return self.shown.replace('%mh_memory_census', view)

    @magic_arguments.magic_arguments()
    @line_magic
    def mh_audit(self, line: str) -> Any:
        """What did the audit find? Drift, duplicate data, the first NaN, as it ran.

        For a job started with ``multihost run --audit`` and attached with ``%mh_attach``
        (its dumps: ``%mh_postmortem DIR --view audit``): one row per finding, the launch
        and call it was first seen at, the argument as you write it, the processes it names.

        Example::

            %mh_audit
        """
        no_arguments(line, '%mh_audit takes no arguments.')
        session = self._inspected()
        return self.shown.replace('%mh_audit', delegate(lambda: audit_view(session)))

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
        no_arguments(line, '%mh_where takes no arguments.')
        session = self._inspected()
        return self.shown.replace('%mh_where', delegate(lambda: where_view(session)))

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
        session = self._inspected()
        view = delegate(lambda: timeline_view(session, last=args.last))
        if args.chrome:
            _results.write_chrome_trace(view, args.chrome)
        return self.shown.replace('%mh_timeline', view)

    # -- %mh_attach / %mh_detach -------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('path', help='the connection file the job wrote (--control-file)')
    @timeout_option(15.0, 'seconds to connect')
    @line_magic
    def mh_attach(self, line: str) -> Any:
        """Is my batch job stuck? Attach to it (started elsewhere) through its file.

        The job runs under ``python -m multihost run --control-file PATH``
        (or ``MULTIHOST_CONTROL_FILE``); its process 0 wrote ``PATH``. While
        attached, ``%mh_where``, ``%mh_timeline`` and ``%mh_step`` act on
        that job (they work while every host is blocked); magics that run
        code on the hosts refuse. ``%mh_detach`` ends it; the job goes on.

        Examples::

            %mh_attach /shared/job42/control.json
            %mh_attach ~/control.json --timeout 30
        """
        args = magic_arguments.parse_argstring(self.mh_attach, line)
        check_timeout(args.timeout, '%mh_attach PATH --timeout 30')
        path = os.path.expanduser(args.path.strip('"\''))
        try:
            job = attach(path, timeout=args.timeout or 15.0)
        except AttachError as exc:
            self.attach_failed = f'%mh_attach {args.path} failed'
            self.failed_beside = self.session
            raise UsageError(str(exc)) from None
        if self.attached is not None:
            self.attached.detach()
        self.attached, self.attach_failed = job, ''
        return job

    @magic_arguments.magic_arguments()
    @line_magic
    def mh_detach(self, line: str) -> None:
        """Done with the batch job: detach from it (it goes on running).

        The magics act on the ``%mh_cluster`` session again, if there is one.
        Stepping stays as it was left: ``%mh_step continue`` first to let it run freely.

        Example::

            %mh_detach
        """
        no_arguments(line, '%mh_detach takes no arguments.')
        if self.attached is None:
            raise UsageError('not attached to a job: %mh_attach PATH attaches to one')
        self.attached.detach()
        self.attached = None

    # -- %mh_postmortem ----------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument('dirs', nargs='+', help="the job's --dump-dir (one or several)")
    @magic_arguments.argument(
        '--view',
        choices=('summary', 'where', 'timeline', 'verdict', 'audit'),
        default='summary',
        help='what to show: the dumps and verdict (default), where view, timeline, verdict '
        "text, the audit's findings (--audit)",
    )
    @line_magic
    def mh_postmortem(self, line: str) -> Any:
        """My batch job died: what do its dumps say? No cluster needed.

        Reads the ``process-<i>.json`` files a job run with ``--dump-dir``
        wrote (`mhnotebook.postmortem`): who dumped and why, whose dump is
        missing, and the ``python -m multihost analyze`` verdict; ``--view
        where`` / ``--view timeline`` / ``--view audit`` show the views ``%mh_where``,
        ``%mh_timeline`` and ``%mh_audit`` show for a live job.

        Examples::

            %mh_postmortem /shared/job42/dumps
            %mh_postmortem host0/dumps host1/dumps --view where
        """
        args = magic_arguments.parse_argstring(self.mh_postmortem, line)
        try:
            pm = postmortem(*(os.path.expanduser(d.strip('"\'')) for d in args.dirs))
        except PostMortemError as exc:
            raise UsageError(str(exc)) from None
        if args.view == 'where':
            return where_view(pm)
        if args.view == 'timeline':
            return timeline_view(pm)
        if args.view == 'audit':
            return audit_view(pm)
        if args.view == 'verdict':
            print(pm.verdict())
            return None
        return pm

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
        no_arguments(line, '%mh_help takes no arguments; %mh_NAME? shows one magic in full.')
        from IPython.display import display

        display(_help.help_table(self), raw=True)
