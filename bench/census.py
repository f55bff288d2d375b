"""Non-finite localisation from the notebook, side by side (4 simulated hosts x 2 CPU devices).

A 256 MiB float32 global array sharded P('x') over all 8 devices (32 MiB per
shard, 64 MiB per host):

* ours: `Session.nonfinite` (`multihost.nonfinite` on every engine:
  one jitted screen per shard on its device, one coordination round with
  only the offending shards' numbers), returned to the notebook;
* the usual way: `Session.allgather` of the same array into the notebook
  (our fast gather: shared memory), then ``np.isfinite(full).all()``; also
  shown over zmq, the transport for engines on other machines.

Both on a clean array and on one with a NaN in one shard on host 2 (then ours
also counts NaN/Inf and finds the first position in that shard). Also shown:
`nonfinite` timed on the engines themselves (max over hosts). Goal: ours
>= 20x faster than the usual way. Medians of several repetitions, interleaved.

    python bench/census.py [--reps N] [--mib 256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import median_ms

SETUP = """
import time, jax, numpy as np, multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ('x',))
rows = {rows}
def _block(i, poison=False):
    v = np.arange(i[0].start * 1024, i[0].stop * 1024, dtype=np.float32).reshape(-1, 1024)
    if poison and jax.process_index() == 2 and i[0].start == rows // 8 * 5:
        v[3, 7] = np.nan  # one NaN, in host 2's second shard
    return v
big = jax.make_array_from_callback((rows, 1024), NamedSharding(mesh, P('x')), _block)
big_nan = jax.make_array_from_callback(
    (rows, 1024), NamedSharding(mesh, P('x')), lambda i: _block(i, True))
def _engine_times(name, reps):
    value = globals()[name]
    out = []
    for _ in range(reps):
        multihost.barrier('bench-census')
        t0 = time.perf_counter()
        multihost.nonfinite(value)
        out.append(time.perf_counter() - t0)
    return out
"""


def bench_nonfinite(session, reps: int, mib: int) -> dict[str, float]:
    rows = mib * (1 << 20) // (4 * 1024)
    session.execute(SETUP.format(rows=rows), timeout=600, echo=False)

    def ours(name: str):
        return lambda: session.nonfinite(name)

    def gather_isfinite(name: str, transport: str | None = None):
        def run():
            kw = {} if transport is None else {'transport': transport}
            full = session.allgather(name, **kw)
            ok = bool(np.isfinite(full).all())
            del full
            return ok

        return run

    # Same answers, once, before timing (this also compiles the jitted screens).
    clean, poisoned = session.nonfinite('big'), session.nonfinite('big_nan')
    assert clean.ok and gather_isfinite('big')()
    (shard,) = poisoned.shards
    assert shard.process == 2 and shard.nan == 1 and not gather_isfinite('big_nan')()
    first = (rows // 8 * 5 + 3, 7)
    assert shard.first == first, (shard.first, first)

    cases = {
        'ours': ours('big'),
        'gather': gather_isfinite('big'),
        'ours_nan': ours('big_nan'),
        'gather_nan': gather_isfinite('big_nan'),
        'gather_zmq': gather_isfinite('big', 'zmq'),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for key, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    m = {k: median_ms(v) for k, v in times.items()}
    # On the engines alone (no notebook round trip): per repetition the slowest host.
    for name in ('big', 'big_nan'):
        session.execute(f'_t = _engine_times({name!r}, {reps})', timeout=600, echo=False)
        per_host = session.call('multihost.engine.lookup', '_t', namespace=True)
        m[f'engine_{name}'] = median_ms([max(h[r] for h in per_host) for r in range(reps)])

    print(
        f'\nnon-finite check of a {mib} MiB float32 array sharded P("x") over 4 hosts x 2 '
        f'devices (median of {reps})'
    )
    for label, ours_key, base_key in (
        ('clean array', 'ours', 'gather'),
        ('one NaN on host 2', 'ours_nan', 'gather_nan'),
    ):
        ratio = m[base_key] / m[ours_key]
        print(f'   {label}:')
        print(f'     Session.nonfinite                     {m[ours_key]:8.1f} ms')
        print(
            f'     Session.allgather + np.isfinite       {m[base_key]:8.1f} ms   '
            f'speedup {ratio:6.1f}x   (goal >= 20x: {"met" if ratio >= 20 else "NOT met"})'
        )
    print(
        f'   (the gather over zmq, the path for engines on other machines, + np.isfinite: '
        f'{m["gather_zmq"]:.1f} ms, {m["gather_zmq"] / m["ours"]:.1f}x ours)'
    )
    print(
        f'   nonfinite on the engines alone: {m["engine_big"]:.1f} ms clean, '
        f'{m["engine_big_nan"]:.1f} ms with the NaN (slowest host)'
    )
    return m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reps', type=int, default=7)
    parser.add_argument('--mib', type=int, default=256)
    args = parser.parse_args()

    import platform

    import jax

    import mhnotebook

    print(f'python {platform.python_version()}, jax {jax.__version__}, numpy {np.__version__}')
    session = mhnotebook.start_local(4, 2, progress=False)
    try:
        bench_nonfinite(session, args.reps, args.mib)
    finally:
        session.stop()


if __name__ == '__main__':
    main()
