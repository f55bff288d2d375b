"""The ``multihost`` command (also ``python -m multihost``): demo, run, analyze, audit-diff.

    multihost [demo] [--hosts N] [--devices D]
    multihost run [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]   (see _job._run)
    multihost analyze DIR [DIR ...]   (the dumps of --dump-dir: see _models._analyze)
    multihost audit-diff DIR_A DIR_B  (two runs' --audit-log: see _job._auditlog)

The parser and every option's help are in `multihost._job._cli`. The demo
starts N local JAX processes (default 4) with D CPU devices each (default 2),
runs the eight `multihost` APIs in all of them, and prints what each process
got back. Then shows a diagnostic: two hosts passing different barrier names,
caught on every host instead of hanging.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def demo_body() -> list[str]:
    """Runs in every process; returns the lines that process reports."""
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import multihost

    pid, n = jax.process_index(), jax.process_count()
    mesh = Mesh(np.array(jax.devices()).reshape(n, jax.local_device_count()), ('host', 'dev'))
    lines = []

    def show(name: str, value: object) -> None:
        text = (
            np.array2string(np.asarray(value), threshold=16)
            if not isinstance(value, str)
            else value
        )
        lines.append(f'{name:<34} {text}')

    show(
        'broadcast_one_to_all(arange(4)+4*p)',
        multihost.broadcast_one_to_all(np.arange(4) + 4 * pid),
    )
    multihost.sync_global_devices('demo')
    show('sync_global_devices("demo")', 'passed')
    show('process_allgather(p)', multihost.process_allgather(np.int32(pid)))
    show(
        'process_allgather([p,p], tiled)', multihost.process_allgather(np.full(2, pid), tiled=True)
    )
    multihost.assert_equal(np.arange(3), 'all hosts hold arange(3)')
    show('assert_equal(arange(3))', 'passed')
    local = np.arange(4.0) + 10 * pid
    g = multihost.host_local_array_to_global_array(local, mesh, P('host'))
    show('host_local_array_to_global_array', f'global shape {g.shape}, {g.sharding.spec}')
    back = multihost.global_array_to_host_local_array(g, mesh, P('host'))
    show('global_array_to_host_local_array', np.asarray(back))
    show('reached_preemption_sync_point(0)', str(multihost.reached_preemption_sync_point(0)))
    with multihost.live_devices(jax.devices()) as devices:
        show('live_devices(jax.devices())', f'{len(devices)} live devices')
    name = 'save' if pid != n - 1 else 'eval'
    try:
        multihost.sync_global_devices(name)
    except multihost.BarrierMismatchError as exc:
        show('divergent barrier caught', f'names by process: {exc.names}')
    return lines


def main(argv: list[str] | None = None, prog: str = 'python -m multihost') -> int:
    """The command (`multihost._job._cli`): ``demo`` (also bare), ``run``, ``analyze``.

    Returns the exit status; a mistake on the command line prints one line and returns 2.
    """
    from multihost import __version__
    from multihost._job import _cli

    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _cli.parse(argv, prog, __version__)
    except _cli.UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == 'run':  # an unmodified program, installed first
        import multihost
        from multihost._job import _run

        multihost._load()  # the whole drop-in, as on every host that uses one of its names

        options, target, is_module, program_args = args.target
        _run.run(options, target, is_module, program_args, prog=f'{prog} run')
        return 0
    if args.command == 'analyze':  # the verdict from the dumps a job left
        from multihost._models import _analyze

        return _analyze.report(args.dirs, prog=f'{prog} analyze')
    if args.command == 'audit-diff':  # where two runs' data first differ (--audit-log)
        from multihost._job import _auditlog

        return _auditlog.report(args.run_a, args.run_b, prog=f'{prog} audit-diff', shift=args.shift)
    return demo(args.hosts, args.devices)


def cli() -> int:
    """The ``multihost`` console script: `main` under its own name."""
    return main(prog='multihost')


def demo(hosts: int, devices: int) -> int:
    """Runs `demo_body` on ``hosts`` local processes of ``devices`` CPU devices; prints it."""
    from multihost.testing import LocalCluster

    t0 = time.perf_counter()
    print(f'starting {hosts} local JAX processes x {devices} CPU devices ...', flush=True)
    with LocalCluster(hosts, devices) as cluster:
        print(f'  up in {time.perf_counter() - t0:.1f} s', flush=True)
        results = cluster.run(demo_body, timeout=300)
    for pid, lines in enumerate(results):
        print(f'\n== process {pid} ==')
        print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
