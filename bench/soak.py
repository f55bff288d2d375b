"""Days, not minutes: what N checked collectives leave behind in process 0 and the others.

4 processes x 1 CPU device. Process 0 hosts JAX's coordination service, so
whatever the service keeps per call shows up in its memory. For each case,
in every process: a warm-up, then ``--calls`` calls back to back; the RSS
growth per call (VmRSS of the process, before and after, after a short
settle; after a warm-up that fills the flight recorder's bounded ring) and the
time per call over the first and the last tenth of the calls (flat when
nothing accumulates). Side by side in one run:

* ``multihost.sync_global_devices`` (a checked barrier: the sequence check's
  round and its barrier, made of keys that go with their epoch);
* the coordination client's ``wait_at_barrier`` with a new id each call (what
  the checked barrier used before: the service keeps every id it has seen)
  and with one id reused (flat: the reference for "nothing kept");
* JAX's own ``multihost_utils.sync_global_devices`` (a device allgather plus
  a service barrier with a new id each call);
* a mixed round of ours: barrier + broadcast + assert_equal + allgather
  (``--calls`` / 4 rounds, so about as many checked collectives);
* the same round and a watched jitted step over a global array (``multihost.watch``: its
  check across hosts, its launch recorded; ``--calls`` / 5 rounds).

Run: ``python bench/soak.py [--calls N] [--cases I,J]`` (default 4,000 calls, every case;
the bound is 2 MB of process 0's memory for 15,000 checked collectives: ``--calls 15000``).
``--json PATH``: where the result goes (default ``bench/results/cpu/soak.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import _common
import numpy as np

CASES = ('ours sync_global_devices', 'service barrier, new id', 'service barrier, one id',
         'jax sync_global_devices', 'ours mixed round (4 collectives)',
         'ours mixed round + watched step (5)')  # fmt: skip


def _rss_kb() -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    raise RuntimeError('no VmRSS in /proc/self/status')


def _soak(case: str, calls: int) -> dict[str, Any]:
    """In every process: RSS growth per call and time per call, early and late."""
    from jax.experimental import multihost_utils as jax_mhu

    import multihost
    from multihost import _jax_adapter

    client = _jax_adapter.client()
    tree = {'w': np.arange(256, dtype=np.float32), 'b': np.ones(16, np.float32)}
    counter = iter(range(10**9))
    if case.endswith('watched step (5)'):
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = jax.make_mesh((jax.device_count(),), ('d',))
        x = jax.device_put(
            jnp.ones((jax.device_count(), 64), jnp.float32), NamedSharding(mesh, P('d'))
        )
        step = multihost.watch(jax.jit(lambda v: (v * 1.0001).sum()), name='soak_step')

    def one() -> None:
        if case == 'ours sync_global_devices':
            multihost.sync_global_devices('soak')
        elif case == 'service barrier, new id':
            client.wait_at_barrier(f'soak/new/{next(counter)}', 60_000)
        elif case == 'service barrier, one id':
            client.wait_at_barrier('soak/one', 60_000)
        elif case == 'jax sync_global_devices':
            jax_mhu.sync_global_devices('soak')
        else:
            multihost.barrier('soak')
            multihost.broadcast_one_to_all(tree)
            multihost.assert_equal(tree, 'soak')
            multihost.process_allgather(tree['b'])
            if case.endswith('watched step (5)'):
                step(x).block_until_ready()

    from multihost import _recorder

    mixed = case.startswith('ours mixed')
    per_round = 5 if case.endswith('(5)') else 4 if mixed else 1
    n = calls // per_round
    # Warm-up: compiles, caches, the first epochs, and the flight recorder's ring filled
    # (it keeps the last CAPACITY entries by design: growing until then is not a leak).
    for _ in range(_recorder.CAPACITY // per_round + 100):
        one()
    _common.start_together()
    time.sleep(0.3)
    before = _rss_kb()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    time.sleep(0.3)
    tenth = max(1, n // 10)
    return {
        'kb_per_call': (_rss_kb() - before) / n,
        'kb': _rss_kb() - before,
        'first_ms': statistics.median(times[:tenth]) * 1e3,
        'last_ms': statistics.median(times[-tenth:]) * 1e3,
        'calls': n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--calls', type=int, default=4000, help='calls per case (default 4000)')
    parser.add_argument(
        '--cases',
        default='',
        help='the cases to run, by number (0-based), '
        'comma-separated: ' + '; '.join(f'{i} {c}' for i, c in enumerate(CASES)),
    )
    parser.add_argument('--json', default='', help='where the result goes')
    args = parser.parse_args(argv)
    if args.calls < 100:
        parser.error('--calls must be >= 100')
    try:
        picked = [CASES[int(i)] for i in args.cases.split(',')] if args.cases else list(CASES)
    except (ValueError, IndexError):
        parser.error(f'--cases: numbers 0-{len(CASES) - 1}, comma-separated, got {args.cases!r}')
    env = _common.environment(4, 1)
    print('environment: ' + ', '.join(f'{k}={v}' for k, v in env.items()))
    rows = []
    with _common.local_cluster(4, 1) as cluster:
        for case in picked:
            per = cluster.run(_soak, case, args.calls, timeout=3600)
            rows.append((case, per))
            p0, rest = per[0], per[1:]
            print(
                f'{case:34s} {p0["calls"]:6d} calls  process 0 {p0["kb_per_call"]:+6.2f} KB/call '
                f'({p0["kb"] / 1024:+6.1f} MB), others {max(r["kb_per_call"] for r in rest):+6.2f} '
                f'KB/call; time per call {max(r["first_ms"] for r in per):6.2f} ms first tenth, '
                f'{max(r["last_ms"] for r in per):6.2f} ms last tenth',
                flush=True,
            )
    import _results

    result = {'calls': args.calls, 'environment': env,
              'cases': {case: per for case, per in rows}}  # fmt: skip
    print('written to', _results.save('soak', result, 'cpu', args.json))
    return 0


if __name__ == '__main__':
    sys.exit(main())
