"""Gather into the notebook, side by side in one run (4 simulated hosts x 2 CPU devices).

1. A 256 MiB float32 global array sharded P('x') over all 8 devices:
   * ours: `Session.allgather` (shared memory when engines share this machine);
   * (a) the usual way: every engine runs JAX's `process_allgather(tiled=True)`,
     then the notebook pulls the result from one engine;
   * (b) the floor: one `np.copyto` of 256 MiB inside the notebook.
   Goals: ours >= 10x faster than (a), and <= 5x (b).
2. Startup: `mhnotebook.start_local(4, 2)` versus a bare `ipyparallel.Cluster(n=4)`
   start + connect + `jax.distributed.initialize` on every engine. Goal <= 1.2x.
3. A small `%mh_allgather` round trip versus `%px` of the same variable. Goal <= 2x.

Medians of several repetitions, interleaved, ratios reported.

    python bench/gather.py [--reps N] [--mib 256]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np
from _common import median_ms

SETUP = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils as jmu
mesh = Mesh(np.array(jax.devices()), ('x',))
rows = {rows}
big = jax.make_array_from_callback((rows, 1024), NamedSharding(mesh, P('x')),
        lambda i: np.arange(rows * 1024, dtype=np.float32).reshape(rows, 1024)[i])
small = np.arange(16, dtype=np.float32) + jax.process_index()
"""


def bench_gather(session, reps: int, mib: int) -> None:
    rows = mib * (1 << 20) // (4 * 1024)
    session.execute(SETUP.format(rows=rows), timeout=600, echo=False)
    expected_first_rows = np.arange(2 * 1024, dtype=np.float32).reshape(2, 1024)
    client = session.client
    e0 = session.engine_ids[0]
    dst = np.empty((rows, 1024), np.float32)
    src = np.ones_like(dst)

    def ours():
        return session.allgather('big')

    def ours_zmq():
        return session.allgather('big', transport='zmq')

    def via_jax():
        session.execute('full = jmu.process_allgather(big, tiled=True)', timeout=600, echo=False)
        return client[e0].pull('full', block=True)

    def copyto():
        np.copyto(dst, src)  # into a buffer already touched: no page faults
        return dst

    def copyto_fresh():
        out = np.empty_like(src)  # a new result, as any gather must produce
        np.copyto(out, src)
        return out

    # Same result from ours and (a), once, before timing.
    a, b = ours(), via_jax()
    assert a.shape == b.shape == (rows, 1024)
    np.testing.assert_array_equal(a[:2], expected_first_rows)
    np.testing.assert_array_equal(a, b)
    del a, b
    times = {'ours': [], 'ours_zmq': [], 'jax+pull': [], 'copyto': [], 'copyto_fresh': []}
    cases = (
        ('ours', ours),
        ('ours_zmq', ours_zmq),
        ('jax+pull', via_jax),
        ('copyto', copyto),
        ('copyto_fresh', copyto_fresh),
    )
    for _ in range(reps):
        for key, fn in cases:
            t0 = time.perf_counter()
            out = fn()
            times[key].append(time.perf_counter() - t0)
            del out
    m = {k: median_ms(v) for k, v in times.items()}
    # Once more with no buffer to reuse: a first gather pays first-touch page faults.
    session._gathers.pool.clear()
    t0 = time.perf_counter()
    out = ours()
    cold_ms = (time.perf_counter() - t0) * 1e3
    del out
    print(
        f'\n1. gather a {mib} MiB float32 array sharded P("x") over 4 hosts x 2 devices '
        f'(median of {reps})'
    )
    print(f'   Session.allgather            {m["ours"]:9.1f} ms   (buffers reused)')
    print(f'   Session.allgather, first     {cold_ms:9.1f} ms   (fresh shared memory)')
    print(
        f'   Session.allgather over zmq   {m["ours_zmq"]:9.1f} ms   (the path for remote engines)'
    )
    print(
        f'   (a) process_allgather + pull {m["jax+pull"]:9.1f} ms   '
        f'speedup {m["jax+pull"] / m["ours"]:6.1f}x   (goal >= 10x)'
    )
    print(
        f'   (b) np.copyto {mib} MiB        {m["copyto"]:9.1f} ms   '
        f'ours/(b) {m["ours"] / m["copyto"]:6.2f}x   (goal <= 5x; destination already touched)'
    )
    print(
        f"   (b') the same into a new buffer {m['copyto_fresh']:6.1f} ms   "
        f"ours/(b') {m['ours'] / m['copyto_fresh']:5.2f}x   (first-touch page faults included, "
        'as in any fresh result)'
    )


def bench_small_round_trip(session, reps: int) -> None:
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    ip = start_ipython()
    ip.run_line_magic('load_ext', 'mhnotebook')
    ip.magics_manager.registry['MultihostMagics'].session = session
    # ipyparallel's %px, on the same engines
    session.client[session.engine_ids].activate()
    ip.run_line_magic('pxconfig', '--block')  # %px waits for every engine, like ours
    times = {'mh': [], 'px': []}
    for _ in range(reps * 3):
        for key, (kind, line) in (('mh', ('mh_allgather', 'small')), ('px', ('px', 'small'))):
            with capture_output():
                t0 = time.perf_counter()
                ip.run_line_magic(kind, line)
                times[key].append(time.perf_counter() - t0)
    m = {k: median_ms(v) for k, v in times.items()}
    print(f'\n3. small round trip (16 floats per host, median of {reps * 3})')
    print(f'   %mh_allgather small {m["mh"]:8.1f} ms')
    print(
        f'   %px small           {m["px"]:8.1f} ms   ratio {m["mh"] / m["px"]:5.2f}x   (goal <= 2x)'
    )


def _bare_start(n: int, d: int) -> float:
    import ipyparallel as ipp

    from mhnotebook._trampoline import call as _call
    from multihost.local import free_port

    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=n, log_level=logging.WARNING)
    client = cluster.start_and_connect_sync()
    client.wait_for_engines(n, timeout=300)
    port = free_port()
    ars = [
        client[e].apply_async(
            _call, 'multihost.engine.initialize', f'127.0.0.1:{port}', n, i, d, platform='cpu'
        )
        for i, e in enumerate(sorted(client.ids))
    ]
    for ar in ars:
        ar.get(timeout=300)
    elapsed = time.perf_counter() - t0
    client.close()
    cluster.signal_engines_sync(9)
    cluster.stop_cluster_sync()
    return elapsed


def bench_startup(reps: int) -> None:
    import mhnotebook

    times = {'ours': [], 'bare': []}
    for _ in range(reps):
        t0 = time.perf_counter()
        s = mhnotebook.start_local(4, 2, progress=False)
        times['ours'].append(time.perf_counter() - t0)
        s.stop()
        times['bare'].append(_bare_start(4, 2))
    m = {k: statistics.median(v) for k, v in times.items()}
    print(f'\n2. startup, 4 hosts x 2 devices (median of {reps})')
    print(f'   mhnotebook.start_local(4, 2)           {m["ours"]:6.2f} s')
    print(
        f'   ipyparallel.Cluster(n=4) + JAX init    {m["bare"]:6.2f} s   '
        f'ratio {m["ours"] / m["bare"]:5.2f}x   (goal <= 1.2x)'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reps', type=int, default=5)
    parser.add_argument('--mib', type=int, default=256)
    parser.add_argument('--startup-reps', type=int, default=3)
    args = parser.parse_args()

    import platform

    import jax

    import mhnotebook

    print(f'python {platform.python_version()}, jax {jax.__version__}, numpy {np.__version__}')
    session = mhnotebook.start_local(4, 2, progress=False)
    try:
        bench_gather(session, args.reps, args.mib)
        bench_small_round_trip(session, args.reps)
    finally:
        session.stop()
    bench_startup(args.startup_reps)


if __name__ == '__main__':
    main()
