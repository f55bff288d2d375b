"""Soak of the view magics: kernel and engine memory per call, views replacing themselves vs not.

A real local cluster (4 hosts x 2 CPU devices) and a real IPython shell with the extension;
each view magic is run as a notebook cell (``ip.run_cell``, so IPython's output history holds
every view, as a notebook's does) ``--calls`` times after a warm-up, in two modes side by side:

- ``replace``: as shipped: a new run closes the widgets of the view it replaces;
- ``keep``: every view treated as kept by the user (nothing closed: the toolkit before).

Per call: the kernel's RSS growth (this process), the engines' summed RSS growth, the widgets
alive in the kernel, and the median time per call over the first and the last fifth.

    python bench/soak_views.py --calls 60
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any

_SETUP = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
x = jax.make_array_from_callback(
    (512, 512), NamedSharding(mesh, P('x', 'y')),
    lambda idx: np.arange(512 * 512, dtype=np.float32).reshape(512, 512)[idx])
params = {'w': np.ones((64, 64)), 'b': np.zeros(64)}
"""

CASES = {
    '%mh_layout x': 'x is 1 MiB, sharded over 8 devices',
    '%mh_diff params': '',
    '%mh_nonfinite params': '',
    '%mh_where': '',
    '%mh_timeline': '',
    '%mh_env': '',
    '%mh_memory_census': '',
}


def _rss_kb(pid: int | str = 'self') -> int:
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    raise RuntimeError(f'no VmRSS for {pid}')


def _soak(ip: Any, magics: Any, cell: str, calls: int, pids: list[int]) -> dict[str, Any]:
    import ipywidgets.widgets.widget as ww
    from IPython.utils.capture import capture_output

    def run() -> float:
        t = time.perf_counter()
        with capture_output():
            result = ip.run_cell(cell, store_history=True)
        result.raise_error()
        return time.perf_counter() - t

    for _ in range(max(5, calls // 10)):  # warm-up: compiles, caches, first allocations
        run()
    gc.collect()
    k0, e0, w0 = _rss_kb(), sum(_rss_kb(p) for p in pids), len(ww._instances)
    times = [run() for _ in range(calls)]
    gc.collect()
    k1, e1, w1 = _rss_kb(), sum(_rss_kb(p) for p in pids), len(ww._instances)
    fifth = max(1, calls // 5)
    return {
        'kernel_kb': (k1 - k0) / calls,
        'engines_kb': (e1 - e0) / calls,
        'widgets': w1 - w0,
        'first_ms': statistics.median(times[:fifth]) * 1e3,
        'last_ms': statistics.median(times[-fifth:]) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--calls', type=int, default=60, help='calls per case (default 60)')
    parser.add_argument('--only', default='', help='run only the cases containing this text')
    args = parser.parse_args(argv)

    from IPython.testing.globalipapp import get_ipython, start_ipython

    import mhnotebook
    from mhnotebook._views import Shown

    session = mhnotebook.start_local(n=4, devices_per_process=2)
    try:
        session.execute(_SETUP, echo=False)
        pids = [int(p) for p in session.client[:].apply_sync(__import__('os').getpid)]
        ip = start_ipython() or get_ipython()
        ip.run_line_magic('load_ext', 'mhnotebook')
        magics = ip.magics_manager.registry['MultihostMagics']
        magics.session = session
        print(f'{args.calls} calls per case after a warm-up; per call: KB of RSS, widgets alive')
        print(f'{"case":18} {"mode":8} {"kernel KB":>10} {"engines KB":>11} {"widgets":>8} '
              f'{"ms first":>9} {"ms last":>8}')  # fmt: skip
        kept = Shown._kept
        for cell in [c for c in CASES if args.only in c]:
            for mode in ('keep', 'replace'):
                Shown._kept = (lambda self, view: True) if mode == 'keep' else kept  # type: ignore[method-assign]
                r = _soak(ip, magics, cell, args.calls, pids)
                print(f'{cell:18} {mode:8} {r["kernel_kb"]:10.1f} {r["engines_kb"]:11.1f} '
                      f'{r["widgets"]:8d} {r["first_ms"]:9.1f} {r["last_ms"]:8.1f}',
                      flush=True)  # fmt: skip
        Shown._kept = kept  # type: ignore[method-assign]
        magics.session = None
    finally:
        session.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
