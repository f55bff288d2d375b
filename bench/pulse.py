"""What busy-or-wedged costs a host: ``python bench/pulse.py [--depth 60] [--samples 2000]``.

The sampler (`multihost._debug._pulse`) takes one sample a second on every host. This
times one sample (the process's CPU time, the main thread's from /proc, the main
thread's stack signature) while the main thread sits ``--depth`` Python frames deep in a
busy loop, the median over ``--samples`` samples, and prints it beside the second it
is taken in: the share of one core the sampler uses. Then it times the same busy loop
with the sampler thread running and without, side by side (medians of 5 runs each):
the main thread's slowdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from multihost._debug import _pulse  # noqa: E402


def _deep(depth: int, until: threading.Event) -> None:
    if depth > 0:
        _deep(depth - 1, until)
        return
    while not until.is_set():
        sum(range(1000))


def _busy(seconds: float) -> int:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--depth', type=int, default=60)
    parser.add_argument('--samples', type=int, default=2000)
    args = parser.parse_args()

    # One sample's cost, from another thread, the main thread deep in a loop.
    stop = threading.Event()
    times: list[float] = []

    def sampler() -> None:
        for _ in range(args.samples):
            t0 = time.perf_counter()
            _pulse.sample()
            times.append(time.perf_counter() - t0)
        stop.set()

    t = threading.Thread(target=sampler)
    t.start()
    _deep(args.depth, stop)
    t.join()
    med = statistics.median(times)
    print(f'one sample, main thread {args.depth} frames deep: median {med * 1e6:.0f} us '
          f'(p90 {sorted(times)[int(len(times) * 0.9)] * 1e6:.0f} us); at one a second: '
          f'{med / _pulse.PERIOD_S * 100:.4f}% of one core')  # fmt: skip

    # The main thread's work with the sampler thread running and without, side by side.
    rounds: dict[str, list[int]] = {'without': [], 'with': []}
    for i in range(5):
        rounds['without'].append(_busy(1.0))
        if i == 0:
            _pulse.ensure_started()  # from now on it samples once a second, as on a host
        rounds['with'].append(_busy(1.0))
    a, b = statistics.median(rounds['without']), statistics.median(rounds['with'])
    print(f'busy loop iterations per second: without the sampler {a:.0f}, with it {b:.0f} '
          f'(ratio {b / a:.4f}; run-to-run spread without: '
          f'{(max(rounds["without"]) - min(rounds["without"])) / a * 100:.1f}%)')  # fmt: skip


if __name__ == '__main__':
    main()
