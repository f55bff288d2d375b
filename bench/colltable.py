"""What the collective table costs: on the launch path (before / after, same run) and once.

Usage::

    python bench/colltable.py [--before REF] [--pairs K] [--reps R] [--calls C] [--json PATH]

Part 1: per recorded launch, before and after
---------------------------------------------
The installed jit keeps, per launch, the call in flight (a dict entry set and removed) and
asks JAX whether the call compiled (`_jax_adapter.cache_size`): that is all the table adds to
a launch; the table itself is made when a dump asks. ``--before`` (default ``main``) is
checked out (``git archive``) into a temporary folder; ``--pairs`` child processes of each
version, alternating, one process and 8 CPU devices each, jit the same step (a sum over
the 8 devices: an all-reduce, plus an elementwise update of 16 leaves) twice, uninstalled and
installed (record-only), and time ``--calls`` back-to-back calls ``--reps`` times, the two
interleaved. A figure: the installed minus the uninstalled main-thread CPU per call
(``time.thread_time``) of the same repetition; the median per child, then the median and
range over the children of each version, and the after/before difference.

Part 2: the table, once per executable
--------------------------------------
Median of 5 of: `collective_table` of that step's executable (8 CPU devices); the lowering
again plus the table that a dump pays (`_launchtable.table_of` through JAX's caches); what
the record path adds per launch, alone in a loop (the in-flight entry, JAX's cache size); and,
with libtpu, `collective_table` of a v5e:4x4 training-like program compiled on CPU. The
JSON size of each table.

The machine is small and shared: absolute times are noisy; read the paired differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, os, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def step(t, x):
    s = jnp.sum(x)
    return jax.tree.map(lambda a: a * 0.5 + s, t), x
mesh = Mesh(np.array(jax.devices()), ('d',))
sh = NamedSharding(mesh, P('d'))
x = jax.device_put(jnp.ones(64), sh)
t = [jnp.ones(8) for _ in range(16)]
plain = jax.jit(step)
from multihost._job import _jit
from multihost._job._options import InstallOptions
_jit.patch(InstallOptions())  # record-only: check_jit off
installed = jax.jit(step)
assert isinstance(installed, _jit.Jitted)
reps, calls = int(sys.argv[1]), int(sys.argv[2])
for f in (plain, installed):
    jax.block_until_ready(f(t, x))
diffs = []
for _ in range(reps):
    out = {}
    for name, f in (('plain', plain), ('installed', installed)):
        c0 = time.thread_time()
        for _ in range(calls):
            r = f(t, x)
        out[name] = (time.thread_time() - c0) / calls
        jax.block_until_ready(r)
    diffs.append(out['installed'] - out['plain'])
print(json.dumps({'median_us': statistics.median(diffs) * 1e6}))
"""


def _checkout(ref: str, into: str) -> str:
    """``ref``'s ``multihost`` package in ``into`` (``git archive``); the folder to import it."""
    tar = subprocess.run(
        ['git', '-C', _ROOT, 'archive', ref, 'multihost'], capture_output=True, check=True
    ).stdout
    subprocess.run(['tar', '-x', '-C', into], input=tar, check=True)
    return into


def _child(path: str, reps: int, calls: int) -> float:
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS='cpu', JAX_NUM_CPU_DEVICES='8')
    out = subprocess.run(
        [sys.executable, '-c', _CHILD, str(reps), str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])['median_us'])


def part1(before: str, pairs: int, reps: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        old = _checkout(before, tmp)
        figures: dict[str, list[float]] = {'before': [], 'after': []}
        for i in range(pairs):
            order = (('before', old), ('after', _ROOT))
            for name, path in order if i % 2 == 0 else order[::-1]:
                figures[name].append(_child(path, reps, calls))
    out: dict[str, Any] = {k: _summary(v) for k, v in figures.items()}
    out['after_minus_before_us'] = round(
        statistics.median(figures['after']) - statistics.median(figures['before']), 2
    )
    return out


def _summary(values: list[float]) -> dict[str, float]:
    return {
        'median_us': round(statistics.median(values), 2),
        'min_us': round(min(values), 2),
        'max_us': round(max(values), 2),
        'n': len(values),
    }


def part2() -> dict[str, Any]:
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    os.environ.setdefault('JAX_NUM_CPU_DEVICES', '8')
    sys.path.insert(0, _ROOT)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from multihost._debug._colltable import collective_table
    from multihost._job import _jit, _launchtable
    from multihost._job._options import InstallOptions

    def step(t: Any, x: Any) -> Any:
        s = jnp.sum(x)
        return jax.tree.map(lambda a: a * 0.5 + s, t), x

    sh = NamedSharding(Mesh(np.array(jax.devices()), ('d',)), P('d'))
    x = jax.device_put(jnp.ones(64), sh)
    t = [jnp.ones(8) for _ in range(16)]
    out: dict[str, Any] = {}
    _jit.patch(InstallOptions())
    try:
        f = jax.jit(step)
        jax.block_until_ready(f(t, x))
        compiled = jax.jit(step).lower(t, x).compile()
        out['cpu_8_devices'] = _timed(lambda: collective_table(compiled))
        table = collective_table(compiled)
        out['cpu_8_devices']['json_bytes'] = len(table.to_json())
        out['cpu_8_devices']['collectives'] = len(table.ops)
        entry = f._entry
        out['dump_lowering_and_table'] = _timed(lambda: _launchtable.table_of(entry))
        out['added_to_a_launch_alone'] = _added_alone(f)
    finally:
        _jit.unpatch()
    try:
        out['v5e_4x4'] = _v5e()
    except Exception as exc:  # no libtpu here
        out['v5e_4x4'] = f'skipped: {type(exc).__name__}: {str(exc)[:120]}'
    return out


def _added_alone(jitted: Any, n: int = 200_000) -> dict[str, float]:
    """What the record path does per launch for the table, alone, in a loop: the in-flight
    entry set and removed, and JAX asked whether the call compiled (median of 5)."""
    import threading

    from multihost import _jax_adapter
    from multihost._job import _launchtable

    fn, slot = jitted._fn, _launchtable.IN_FLIGHT
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            ident = threading.get_ident()
            slot[ident] = (None, jitted, (), {})
            slot.pop(ident, None)
            _jax_adapter.cache_size(fn)
        runs.append((time.perf_counter() - t0) / n)
    return {'median_us': round(statistics.median(runs) * 1e6, 3)}


def _v5e() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from multihost._debug._colltable import collective_table

    os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
    topo = topologies.get_topology_desc(topology_name='v5e:4x4', platform='tpu')
    mesh = Mesh(np.array(topo.devices).reshape(4, 4), ('data', 'model'))
    s = NamedSharding(mesh, P('data', 'model'))
    w = NamedSharding(mesh, P(None, 'model'))

    def loss(params: Any, x: Any) -> Any:
        h = x
        for p in params:
            h = jnp.tanh(h @ p)
        return jnp.mean(h**2)

    def train(params: Any, x: Any) -> Any:
        g = jax.grad(loss)(params, x)
        return [p - 0.1 * gi for p, gi in zip(params, g)]

    params = [jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=w) for _ in range(8)]
    xs = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=s)
    compiled = (
        jax.jit(train, in_shardings=([w] * 8, s))
        .trace(params, xs)
        .lower(lowering_platforms=('tpu',))
        .compile()
    )
    out = _timed(lambda: collective_table(compiled))
    table = collective_table(compiled)
    out['json_bytes'] = len(table.to_json())
    out['collectives'] = len(table.ops)
    out['hlo_chars'] = len(compiled.as_text())
    return out


def _timed(fn: Any, n: int = 5) -> dict[str, Any]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {'median_ms': round(statistics.median(times) * 1e3, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--before', default='main')
    ap.add_argument('--pairs', type=int, default=6)
    ap.add_argument('--reps', type=int, default=15)
    ap.add_argument('--calls', type=int, default=200)
    ap.add_argument('--json', default='')
    a = ap.parse_args()
    result: dict[str, Any] = {'once_per_executable': part2()}
    print(json.dumps(result, indent=2), flush=True)
    result['launch_overhead_per_call'] = part1(a.before, a.pairs, a.reps, a.calls)
    print(json.dumps(result, indent=2))
    import _results

    print('written to', _results.save('colltable', result, 'cpu', a.json))


if __name__ == '__main__':
    main()
