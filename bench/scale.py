"""How the diagnostics scale with the number of hosts (simulated: N processes x 1 CPU device).

Usage::

    python bench/scale.py [--hosts 2,4,8,16,32] [--reps 7] [--png scale.png] [--json PATH]
    python bench/scale.py --quick            # smoke run: 2 and 4 hosts, 2 repetitions
    python bench/scale.py --many 16,64,256,512 [--check]   # forked simulated hosts

``--many``: the key-value checks at many simulated hosts (``bench/manyhost.py``:
N forked clients of one real coordination service, bytes and RPCs counted per
check), side by side per N, with the log-log slope of each curve; ``--check``
exits 1 unless bytes read per host grow <= 1.5x and bytes served <= 20x from
the smallest N to the largest, and the issuers (`where`, `wavefront`,
`flight_records`, from host 0 while the others wait) read every reply in <= 50
RPCs at every N (issue 21's targets). The older method follows.

Method
------
For each N in ``--hosts``, one `LocalCluster` of N real JAX processes with
one CPU device each; in every process these operations run interleaved per
repetition (machine noise hits all alike), every repetition started together
at a coordination barrier (not timed):

* ``barrier``: `multihost.barrier` (one coordination round);
* ``sequence check``: `_sequence.enter`, the check every collective makes
  (record, publish, barrier, compare), without the collective itself;
* ``assert_equal 1k leaves``: `multihost.assert_equal` of 1,000 leaves of
  16 float32 each (equal on every host: the head-digest round);
* ``where``: `multihost.where` from process 0 while the
  other hosts wait at the next repetition's barrier (their debug threads
  answer: what ``%mh_where`` does);
* ``step_table``: `multihost.step_table` from process 0;
* ``watched call``: a call of ``multihost.watch(jax.jit(f), check=True)``
  on a local array (signature seen before: one launch-check round, then the
  launch, waited for).

Per operation and N: the wall time per call of the slowest host (a
multi-host program waits for it), median over repetitions; and the CPU time
per call of the busiest host, median over repetitions: of the process
(``time.process_time``: every thread, the waiter thread and the RPC
library's included) and of the main thread alone (``time.thread_time``:
encoding, parsing, judging). For ``where`` and ``step_table`` the
busiest host is process 0, which reads every host's reply (the other hosts'
debug threads answer outside the timed call).
Then a least-squares fit of each curve (wall, process CPU, main-thread CPU)
to ``a*N + b`` and to ``a*N*log2(N) + b``, with the RMS residuals of both and
which fits better, and the better fit's value at 1,000 hosts, printed as an
EXTRAPOLATION (never measured here). A log-log chart of the three curves
goes to ``--png``. Message sizes at 1,000 hosts: ``bench/messages.py``.

THIS MACHINE IS OVERSUBSCRIBED ABOVE ITS CORE COUNT (2 cores here): with N
processes on 2 cores the wall times include waiting for a core and grow at
least like N/2 for anything every host does at once; read the per-host CPU
time as the cost of an operation on a real cluster (one host per machine),
and the wall curves as an upper bound.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _common
import numpy as np

#: Operations in table order (keys of the per-process results).
OPS = (
    'barrier',
    'sequence check',
    'assert_equal 1k leaves',
    'where',
    'step_table',
    'watched call',
)
LEAVES = 1000


def _timed(fn: Callable[[], Any]) -> tuple[float, float, float]:
    """(wall, process CPU, main-thread CPU) seconds of one call, started together everywhere."""
    _common.start_together()
    m0, c0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0


def _body(reps: int) -> dict[str, dict[str, list[float]]]:
    """Runs in every process: per operation, wall and CPU seconds per repetition."""
    import jax
    import jax.numpy as jnp

    import multihost
    from multihost._exchange import _sequence

    p0 = jax.process_index() == 0
    tree = {f'w{i:04d}': np.full(16, i, np.float32) for i in range(LEAVES)}
    watched = multihost.watch(jax.jit(lambda x: x * 2.0 + 1.0), name='scale_step', check=True)
    x = jnp.ones(16, jnp.float32)
    cases: dict[str, Callable[[], Any]] = {
        'barrier': lambda: multihost.barrier('scale'),
        'sequence check': lambda: _sequence.enter('bench', 'scale'),
        'assert_equal 1k leaves': lambda: multihost.assert_equal(tree),
        'where': lambda: multihost.where(timeout=120) if p0 else None,
        'step_table': lambda: multihost.step_table() if p0 else None,
        'watched call': lambda: watched(x).block_until_ready(),
    }
    for fn in cases.values():  # warm-up: compiles, debug threads, first signatures
        _timed(fn)
    out: dict[str, dict[str, list[float]]] = {k: {'wall': [], 'cpu': [], 'main': []} for k in cases}
    for _ in range(reps):
        for key, fn in cases.items():
            wall, cpu, main = _timed(fn)
            out[key]['wall'].append(wall)
            out[key]['cpu'].append(cpu)
            out[key]['main'].append(main)
    return out


# -- parent side ---------------------------------------------------------------------------


def fit(ns: list[int], ys: list[float], model: str) -> tuple[float, float, float]:
    """Least squares ``y = a*f(N) + b``, f = N or N*log2(N): (a, b, RMS residual)."""
    f = [n if model == 'N' else n * math.log2(n) for n in ns]
    a, b = np.polyfit(np.array(f, float), np.array(ys, float), 1)
    res = [y - (a * x + b) for x, y in zip(f, ys)]
    return float(a), float(b), math.sqrt(sum(r * r for r in res) / len(res))


def _best(ns: list[int], ys: list[float]) -> dict[str, Any]:
    lin, nlog = fit(ns, ys, 'N'), fit(ns, ys, 'NlogN')
    return {'N': lin, 'NlogN': nlog, 'best': 'O(N)' if lin[2] <= nlog[2] else 'O(N log N)'}


def _hosts(values: list[str]) -> list[int]:
    return [int(v) for item in values for v in item.split(',') if v.strip()]


def _plot(path: str, ns: list[int], panels: dict[str, dict], cores: int) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), sharex=True)
    for ax, (title, data) in zip(axes, panels.items()):
        for op in OPS:
            ax.plot(ns, [data[op][n] for n in ns], marker='o', label=op)
        # A line proportional to N through the first barrier point: reads growth at a glance.
        y0 = data['barrier'][ns[0]]
        ax.plot(ns, [y0 * n / ns[0] for n in ns], ls=':', color='0.5', label='∝ N')
        ax.set_xscale('log', base=2)
        ax.set_yscale('log')
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel('hosts (processes, 1 CPU device each)')
        ax.set_title(title, fontsize=10)
        ax.grid(True, which='both', alpha=0.3)
        if cores < max(ns):
            ax.axvline(cores, color='0.4', ls='--', lw=1)
            ax.text(
                cores * 1.05,
                0.02,
                f'oversubscribed ({cores} cores) →',
                transform=ax.get_xaxis_transform(),
                fontsize=8,
                color='0.35',
            )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc='lower center', ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle('multihost diagnostics: cost per call vs number of hosts (log-log)', fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _fits(ns: list[int], title: str, data: dict[str, dict[int, float]]) -> dict[str, Any]:
    print(f'fit of {title} (ms): a*N + b vs a*N*log2(N) + b, RMS residuals')
    out = {}
    for op in OPS:
        out[op] = r = _best(ns, [data[op][n] for n in ns])
        (a1, b1, e1), (a2, b2, e2) = r['N'], r['NlogN']
        print(
            f'  {op:<24} N: {a1:7.3f}*N {b1:+8.2f} (rms {e1:6.2f})   '
            f'NlogN: {a2:7.4f}*NlogN {b2:+8.2f} (rms {e2:6.2f})   -> {r["best"]}'
        )
    return out


def _at(fit: dict[str, Any], n: int) -> float:
    """The better fit's value at ``n`` hosts (an extrapolation)."""
    a, b, _ = fit['N'] if fit['best'] == 'O(N)' else fit['NlogN']
    return a * (n if fit['best'] == 'O(N)' else n * math.log2(n)) + b


#: ``--many`` columns: (title, key of `manyhost.summarize`, scale, format).
MANY_METRICS = (
    ('bytes read per host, median', 'read_median', 1, '.0f'),
    ('bytes read per host, max', 'read_max', 1, '.0f'),
    ('bytes served (KB, all hosts)', 'served_bytes', 1e-3, '.1f'),
    ('RPCs served', 'served_rpcs', 1, '.0f'),
    ('wall of the slowest host (ms)', 'wall_ms', 1, '.1f'),
    ('RPC latency, median (ms)', 'rpc_ms', 1, '.2f'),
    ('CPU per host, median (ms)', 'cpu_ms', 1, '.2f'),
    ('service CPU, process 0 - median (ms)', 'service_cpu_ms', 1, '.2f'),
)
#: Issuer columns (host 0's own RPCs, its debug thread's left out): (title, key, scale, format).
ISSUER_METRICS = (
    ('issuer RPCs per command, median', 'rpcs', 1, '.0f'),
    ('issuer bytes read (KB)', 'read_bytes', 1e-3, '.1f'),
    ('issuer wall (ms)', 'wall_ms', 1, '.0f'),
    ('issuer main-thread CPU (ms)', 'cpu_ms', 1, '.1f'),
    ('hosts that answered (min)', 'answered_min', 1, '.0f'),
)
#: Issue 21: an issuer reads every reply in at most this many RPCs, at any N.
ISSUER_RPCS = 50
#: Checks whose no-error path must be O(1) per host (`--check`); an allgather's payload is O(N).
FLAT = ('sync_global_devices', 'broadcast (small)', 'assert_equal (small)')


def slope(ns: list[int], ys: list[float]) -> float:
    """The log-log slope of ``ys`` over ``ns`` (0: flat, 1: linear, 2: quadratic)."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y > 0]
    if len(pts) < 2:
        return float('nan')
    return float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0])


def many(ns: list[int], reps: int) -> list[dict[str, Any]]:
    """One fresh `bench/manyhost.py` process per N (it forks the hosts); their records."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, 'OPENBLAS_NUM_THREADS': '1', 'JAX_PLATFORMS': 'cpu'}
    out = []
    for n in ns:
        proc = subprocess.run(
            [sys.executable, os.path.join(here, 'manyhost.py'), str(n), str(reps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600 + 10 * n,
        )
        if proc.returncode != 0:
            raise RuntimeError(f'manyhost.py {n} failed:\n{proc.stderr[-3000:]}')
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(
            f'{n} hosts: PSS {out[-1]["pss_mib"]:.0f} MiB, {out[-1]["elapsed_s"]:.1f} s', flush=True
        )
    return out


def many_table(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Prints one table per metric (checks x N, with the log-log slope); returns the slopes."""
    ns = [r['n'] for r in records]
    slopes: dict[str, dict[str, float]] = {}
    for title, k, scale, fmt in MANY_METRICS:
        head = f'{title:<40}' + ''.join(f'{f"N={n}":>11}' for n in ns) + f'{"slope":>8}'
        print('\n' + head + '\n' + '-' * len(head))
        for check in records[0]['checks']:
            ys = [r['checks'][check][k] for r in records]
            slopes.setdefault(check, {})[k] = s = slope(ns, ys)
            cells = ''.join(f'{format(y * scale, fmt):>11}' for y in ys)
            print(f'  {check:<38}{cells}{s:>8.2f}')
    issued = [r for r in records if r.get('issuers')]
    for title, k, scale, fmt in ISSUER_METRICS if issued else ():
        cols = ''.join(f'{"N=" + str(r["n"]):>11}' for r in issued)
        head = f'{title:<40}{cols}{"slope":>8}'
        print('\n' + head + '\n' + '-' * len(head))
        for name in issued[0]['issuers']:
            ys = [r['issuers'][name][k] for r in issued]
            s = slope([r['n'] for r in issued], ys)
            slopes.setdefault(name, {})[k] = s
            cells = ''.join(f'{format(y * scale, fmt):>11}' for y in ys)
            print(f'  {name:<38}{cells}{s:>8.2f}')
    print(
        f'\n{"total PSS of the hosts (MiB)":<40}'
        + ''.join(f'{r["pss_mib"]:>11.0f}' for r in records)
    )
    return slopes


def many_verdict(records: list[dict[str, Any]]) -> list[str]:
    """Issue 21's targets from the smallest N to the largest: what fails (empty: all met)."""
    lo, hi = records[0], records[-1]
    span = f'from N={lo["n"]} to {hi["n"]}'
    fails = []
    for check in FLAT:
        a, b = lo['checks'][check], hi['checks'][check]
        per_host = b['read_max'] / max(1.0, a['read_max'])
        served = b['served_bytes'] / max(1.0, a['served_bytes'])
        if per_host > 1.5:
            fails.append(f'{check}: bytes read per host x{per_host:.1f} {span} (target <= 1.5)')
        if served > 20 * (hi['n'] / lo['n']) / 16:
            fails.append(
                f'{check}: bytes served x{served:.1f} {span} (target <= 20x per 16x hosts)'
            )
    for r in records:
        for name, m in (r.get('issuers') or {}).items():
            if m['rpcs'] > ISSUER_RPCS or m['answered_min'] < r['n']:
                fails.append(
                    f'{name} at N={r["n"]}: {m["rpcs"]:.0f} RPCs (target <= {ISSUER_RPCS}), '
                    f'{m["answered_min"]:.0f} of {r["n"]} hosts answered'
                )
    return fails


def main_many(ns: list[int], reps: int, check: bool, path: str | None) -> int:
    records = many(ns, reps)
    if any(r['backend_started'] for r in records):
        print('WARNING: a simulated host started its JAX backend', flush=True)
    slopes = many_table(records)
    fails = many_verdict(records)
    print(
        '\n'
        + (
            '\n'.join(fails)
            if fails
            else 'issue 21 targets met (per host <= 1.5x, served <= 20x per 16x hosts, '
            f'issuers <= {ISSUER_RPCS} RPCs)'
        )
    )
    if path:
        with open(path, 'w') as f:
            json.dump(
                {'env': _common.environment(0, 1), 'records': records, 'slopes': slopes},
                f,
                indent=1,
            )
    return 1 if check and fails else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', nargs='+', default=['2,4,8,16,32'], help='e.g. 2,4,8,16,32')
    parser.add_argument('--reps', type=int, default=7)
    parser.add_argument('--png', default='scale.png', help='where to write the chart')
    parser.add_argument('--json', help='also write the results here')
    parser.add_argument('--quick', action='store_true', help='smoke run: 2,4 hosts, 2 reps')
    parser.add_argument('--many', nargs='+', help='forked simulated hosts, e.g. 16,64,256,512')
    parser.add_argument('--check', action='store_true', help='with --many: exit 1 off target')
    args = parser.parse_args(argv)
    if args.many:
        return main_many(
            _hosts(args.many), args.reps if args.reps != 7 else 3, args.check, args.json
        )
    ns = [2, 4] if args.quick else _hosts(args.hosts)
    reps = 2 if args.quick else args.reps
    cores = os.cpu_count() or 1
    env = _common.environment(0, 1)
    print(json.dumps(env), flush=True)
    if max(ns) > cores:
        print(
            f'NOTE: {cores} cores: {", ".join(str(n) for n in ns if n > cores)} processes '
            'oversubscribe them; wall times include waiting for a core (an upper bound), '
            'per-host CPU time is the cost per host.',
            flush=True,
        )
    wall: dict[str, dict[int, float]] = {op: {} for op in OPS}
    cpu: dict[str, dict[int, float]] = {op: {} for op in OPS}
    main_cpu: dict[str, dict[int, float]] = {op: {} for op in OPS}
    started: dict[int, float] = {}
    for n in ns:
        t0 = time.perf_counter()
        # 32 processes importing JAX on 2 cores take a while: a generous bound.
        with _common.local_cluster(n, 1, start_timeout=120 + 20 * n) as cluster:
            started[n] = time.perf_counter() - t0
            per = cluster.run(_body, reps, timeout=600 + 60 * n)
        for op in OPS:
            wall[op][n] = _common.slowest_median_ms([p[op]['wall'] for p in per])
            # The busiest host: for where / step_table, process 0 (it reads every reply).
            cpu[op][n] = max(statistics.median(p[op]['cpu']) * 1e3 for p in per)
            main_cpu[op][n] = max(statistics.median(p[op]['main']) * 1e3 for p in per)
        print(f'{n} hosts done (cluster started in {started[n]:.1f} s)', flush=True)

    width = 22
    head = f'{"operation":<24}' + ''.join(f'{f"N={n}":>{width}}' for n in ns)
    print(f'\nper call (ms), median of {reps} reps: wall of the slowest host / CPU of the')
    print('busiest host: process / main thread')
    print(head + '\n' + '-' * len(head))
    for op in OPS:
        cells = ''.join(
            f'{f"{wall[op][n]:.1f} / {cpu[op][n]:.1f} / {main_cpu[op][n]:.1f}":>{width}}'
            for n in ns
        )
        print(f'{op:<24}{cells}')
    print(f'{"cluster start (s)":<24}' + ''.join(f'{started[n]:>{width}.1f}' for n in ns))

    panels = {
        'wall per call, slowest host (ms)': wall,
        'process CPU per call, busiest host (ms)': cpu,
        'main-thread CPU per call, busiest host (ms)': main_cpu,
    }
    fits: dict[str, dict[str, Any]] = {}
    if len(ns) >= 3:
        for title, data in panels.items():
            print()
            fits[title] = _fits(ns, title.split(' per call')[0], data)
        far = 1000
        print(
            f'\nEXTRAPOLATED to N={far} from the better fit (not measured; the wall curve is '
            f'that of {far} processes sharing {cores} cores, not of {far} machines):'
        )
        print(f'  {"operation":<24}{"wall":>12}{"process CPU":>14}{"main CPU":>12}')
        for op in OPS:
            cells = [_at(fits[title][op], far) for title in panels]
            widths = (12, 14, 12)
            print(f'  {op:<24}' + ''.join(f'{c:.0f} ms'.rjust(w) for c, w in zip(cells, widths)))
    if max(ns) > cores:
        print(
            f'\n{cores} cores, up to {max(ns)} processes: OVERSUBSCRIBED above {cores} hosts. '
            'Wall times include waiting for a core; the CPU per host is what a host of a '
            "real cluster spends (process CPU includes the RPC library's threads, which "
            'also burn CPU while waiting on a contended machine).'
        )
    if args.png:
        _plot(args.png, ns, panels, cores)
        print(f'chart: {args.png}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(
                {
                    'env': env,
                    'hosts': ns,
                    'reps': reps,
                    'wall_ms': wall,
                    'cpu_ms': cpu,
                    'main_thread_cpu_ms': main_cpu,
                    'start_s': started,
                    'fits': fits,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == '__main__':
    sys.exit(main())
