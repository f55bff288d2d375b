"""What the benchmark scripts share: the cluster, meshes, timing and the environment line.

Every script measures the same way: before each repetition all processes meet
at a coordination-service barrier (not timed), each records its own seconds,
and the parent takes per repetition the max over processes (a multi-host
program waits for its slowest host), then the median over repetitions.

Imported by the scripts as ``import _common`` (their folder is on the path),
in the parent and in the workers of `local_cluster` (which puts this folder
on their ``PYTHONPATH``). Programs we did not start are launched with
`multihost.testing.start_job`: plain processes, the way a scheduler does.
"""

from __future__ import annotations

import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multihost.testing import LocalCluster

NUM_PROCESSES = 4
DEVICES_PER_PROCESS = 2
BARRIER_TIMEOUT_MS = 300_000  # a bound for failures only: never reached in a healthy run

KIB = 1024
MIB = 1024 * KIB

_HERE = os.path.dirname(os.path.abspath(__file__))


def local_cluster(
    n: int = NUM_PROCESSES, devices_per_process: int = DEVICES_PER_PROCESS, **options: Any
) -> LocalCluster:
    """A `LocalCluster` whose workers can import `_common`, as the parent does."""
    paths = [_HERE, os.environ.get('PYTHONPATH', '')]
    env = {**options.pop('env', {}), 'PYTHONPATH': os.pathsep.join(filter(None, paths))}
    return LocalCluster(n, devices_per_process, env=env, **options)


# -- worker side ---------------------------------------------------------------------------


def host_mesh() -> Any:
    """('host', 'dev') mesh: row p holds process p's devices."""
    import jax
    from jax.sharding import Mesh

    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    return Mesh(devices, ('host', 'dev'))


def flat_mesh() -> Any:
    """Every device on one axis ``'x'``, in `jax.devices()` order."""
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), ('x',))


_barrier_ids = itertools.count()  # same sequence in every process: unique barrier names


def start_together() -> None:
    """Coordination-service barrier: every process leaves it at (about) the same time."""
    from multihost import _jax_adapter

    _jax_adapter.client().wait_at_barrier(f'bench/rep/{next(_barrier_ids)}', BARRIER_TIMEOUT_MS)


def per_call(fn: Callable[[], Any], reps: int, calls: int = 1) -> list[float]:
    """Seconds per call of ``fn``: one figure per repetition of ``calls`` back-to-back calls,
    every repetition started together (`start_together`, not timed)."""
    out = []
    for _ in range(reps):
        start_together()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return out


def interleaved(
    cases: dict[str, Callable[[], Any]], reps: int, calls: int = 1
) -> dict[str, list[float]]:
    """`per_call` of every case, interleaved per repetition (machine noise hits all alike)."""
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for key, fn in cases.items():
            out[key] += per_call(fn, 1, calls)
    return out


# -- parent side ---------------------------------------------------------------------------


def median_ms(samples: Sequence[float]) -> float:
    """The median of ``samples`` (seconds), in milliseconds."""
    return statistics.median(samples) * 1e3


def slowest_ms(per_process: Sequence[Sequence[float]]) -> list[float]:
    """Per repetition, the max over processes (ms): what a multi-host program waits for."""
    return [max(p[r] for p in per_process) * 1e3 for r in range(len(per_process[0]))]


def slowest_median_ms(per_process: Sequence[Sequence[float]]) -> float:
    """Per repetition the max over processes, then the median over repetitions (ms)."""
    return statistics.median(slowest_ms(per_process))


def environment(
    num_processes: int = NUM_PROCESSES, devices_per_process: int = DEVICES_PER_PROCESS
) -> dict[str, Any]:
    """Versions, machine and cluster shape, printed (and saved) with every result."""
    import jax
    import jaxlib

    import multihost

    return {
        'python': sys.version.split()[0],
        'jax': jax.__version__,
        'jaxlib': jaxlib.__version__,
        'numpy': np.__version__,
        'multihost': multihost.__version__,
        'platform': platform.platform(),
        'cpus': os.cpu_count(),
        'processes': num_processes,
        'devices_per_process': devices_per_process,
        'MULTIHOST_CHECK': os.environ.get('MULTIHOST_CHECK', '1 (default)'),
    }


FLAX_JOB = os.path.join(os.path.dirname(_HERE), 'tests', '_flax_job.py')


def run_flax_job(
    launch: Callable[[str], list[str]], hosts: int, steps: int, *, expect: str = ''
) -> dict[str, Any]:
    """One run of `tests/_flax_job.py` (flax + optax + orbax, nothing of multihost in it)
    in ``hosts`` plain processes x 2 CPU devices, launched like a scheduler with
    ``launch(tmp)`` (``[FLAX_JOB]`` plain, ``['-m', 'multihost', 'run', ..., FLAX_JOB]``)
    in a fresh directory ``tmp``. Returns ``times`` (per step after the two that compile:
    the slowest process's ``train_step`` plus reading its loss), process 0's ``losses``
    (hex) and ``records`` (the job's ``JOB_RECORDS`` folder's JSON files, by name). A
    failed run raises, with its log; so does a line on stderr that starts with ``expect``
    (something the healthy job must not say)."""
    import json
    import tempfile

    from multihost.testing import scheduler_env, start_job

    with tempfile.TemporaryDirectory(prefix='mh-bench-flax-') as tmp:
        records = os.path.join(tmp, 'records')
        os.makedirs(records)
        env = scheduler_env(
            hosts, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS=str(steps), JOB_RECORDS=records
        )
        tests = os.path.dirname(FLAX_JOB)
        env['PYTHONPATH'] = tests + os.pathsep + env.get('PYTHONPATH', '')
        with start_job(hosts, launch(tmp), env, cwd=tmp) as job:
            results = job.finish(1800)
        found = {}
        for name in sorted(os.listdir(records)):
            with open(os.path.join(records, name)) as f:
                found[name] = json.load(f)
    per: list[list[float]] = []
    for rc, out, err in results:
        if rc != 0 or 'DONE' not in out:
            raise RuntimeError(f'the job failed (exit {rc}):\n{err[-3000:]}')
        per.append([float(ln.split()[2]) for ln in out.splitlines() if ln.startswith('STEP ')])
        if expect and expect in err:
            raise RuntimeError(f'the healthy job said {expect!r}:\n{err[-3000:]}')
    losses = [ln.split()[2] for ln in results[0][1].splitlines() if ln.startswith('LOSS ')]
    times = [max(p[s] for p in per) for s in range(2, steps)]  # 0 and 1 compile
    return {'times': times, 'losses': tuple(losses), 'records': found}


def alternating_blocks(
    modes: Sequence[str], blocks: int, run: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``run(mode)`` for every mode, ``blocks`` times, the order reversed every block (a
    drift of the machine falls on every mode alike); each run's median and mean step printed
    (``times`` in seconds). Returns each mode's runs, in order."""
    got: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for block in range(blocks):
        for mode in modes if block % 2 == 0 else modes[::-1]:
            one = run(mode)
            got[mode].append(one)
            print(
                f'  block {block} {mode}: median step {statistics.median(one["times"]) * 1e3:.1f}'
                f' ms, mean {statistics.mean(one["times"]) * 1e3:.1f} ms',
                flush=True,
            )
    return got
