"""`multihost.replay` of the tests' flax job's step on N CPU-simulated processes: its time.

The real flax + optax job's model and step (`tests/_flax_program.py`: a linen transformer,
adamw, a jitted donating ``train_step`` over a ('data',) mesh of every device), on ``--n``
real `jax.distributed` processes of one CPU device each (`multihost.testing.LocalCluster`).
Every process replays the same launch (inputs compared, the compiled step run again, then its
jaxpr op by op, the outputs of every 256 equations compared between the hosts); the time is
the slowest process's, first (each operation compiled) and again. ``FAULTY_HOST=1`` (a host
callback moving one gradient on process 1's devices) makes the replay stop at that operation;
without it every equation is evaluated and the hosts agree.

Usage: ``python bench/replay_hosts.py [--n 4] [--faulty]``; the result goes to
``bench/results/cpu/replay_hosts.json`` (`_results`), or to ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests')


def _replay_twice() -> dict[str, Any]:
    """In every process: the job's state and first batch, then two replays, timed."""
    import _flax_program as job
    import jax

    import multihost

    mesh = job.make_mesh()
    state = job.create_state(mesh)
    batch = job.global_batch(mesh, 0)
    out: dict[str, Any] = {}
    for name in ('first_s', 'again_s'):
        multihost.barrier(f'replay-{name}')
        t0 = time.perf_counter()
        report = multihost.replay(job.train_step, state, batch, timeout=600)
        out[name] = time.perf_counter() - t0
        out['verdict'] = report.verdict
        out['equations'] = report.equations
        out['total_equations'] = report.total_equations
        out['stages_' + name] = dict(report.seconds)
        out['said'] = report.describe().splitlines()[:3]
    out['process'] = jax.process_index()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--n', type=int, default=4)
    parser.add_argument('--faulty', action='store_true', help='FAULTY_HOST=1')
    parser.add_argument('--json', default='')
    args = parser.parse_args(argv)
    import _common
    import _results

    # the workers import the job's program from tests/ (local_cluster adds this folder)
    os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [_TESTS, os.environ.get('PYTHONPATH')]))
    env = {'FAULTY_HOST': '1'} if args.faulty else {}
    t0 = time.perf_counter()
    with _common.local_cluster(args.n, 1, env=env) as cluster:
        started = time.perf_counter() - t0
        per = cluster.run(_replay_twice, timeout=1500)
    got = {
        'processes': args.n,
        'devices_per_process': 1,
        'faulty_host': 1 if args.faulty else None,
        'cluster_start_s': started,
        'replay_first_s': max(r['first_s'] for r in per),
        'replay_again_s': max(r['again_s'] for r in per),
        'verdict': per[0]['verdict'],
        'equations': per[0]['equations'],
        'total_equations': per[0]['total_equations'],
        'stages_first_s': per[0]['stages_first_s'],
        'stages_again_s': per[0]['stages_again_s'],
        'said': per[0]['said'],
        'same_verdict_everywhere': len({json.dumps(r['said']) for r in per}) == 1,
    }
    print(json.dumps(got, indent=1))
    print('written to', _results.save('replay_hosts', got, 'cpu', args.json))
    return 0 if got['same_verdict_everywhere'] else 1


if __name__ == '__main__':
    sys.exit(main())
