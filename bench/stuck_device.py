"""The data tools while a long launch holds the device: host copies vs a device program.

One process, its first device (a TPU chip where there is one; CPU here). A watched launch
of about ``--launch-s`` seconds (a loop of matmuls, its length calibrated first) is put in
flight, then, while it runs, on a ready tree (float32, bfloat16 and int32 leaves,
``--mib`` MiB in all):

* each data tool's engine function as a notebook calls it (`multihost.engine`: diff,
  layout with its replica check, nonfinite, gather_local, memory_census, env_diff): with a
  recorded launch in flight they read host copies of the ready shards and launch nothing;
* what they compute, alone: the kernel's digests of the tree from host copies, and its
  NaN/Inf counts, inside ``reading_host_copies`` (one process has no one to diff against,
  so `tree_diff` itself returns at once);
* side by side, the way the tools used to go: ``np.asarray`` of one ready leaf (a
  device-to-host copy) and the device kernel's fingerprint of that leaf (a device program,
  queued behind the launch: it waits for the launch's end).

Prints one line per measurement (seconds; and whether the launch was still running when
it returned) and a JSON summary; the run fails (exit 1) when any tool took 1 s or more or
returned after the launch ended. Run: ``python bench/stuck_device.py [--launch-s 10]
[--mib 64]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

import numpy as np

LIMIT_S = 1.0


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--launch-s', type=float, default=10.0, help='the long launch (seconds)')
    p.add_argument('--mib', type=float, default=64.0, help='the ready tree (MiB)')
    p.add_argument('--size', type=int, default=0, help='matmul side (0: by platform)')
    return p.parse_args()


def _long_launch(seconds: float, size: int) -> tuple[Any, Any, int, float]:
    """A watched launch and its input, its loop calibrated to about ``seconds`` seconds."""
    import jax
    import jax.numpy as jnp

    import multihost

    @jax.jit
    def long_step(s: jax.Array, iters: jax.Array) -> jax.Array:
        m = jnp.eye(s.shape[0], dtype=s.dtype) * 0.5

        def body(c: Any) -> Any:
            i, v = c
            return i + 1, v @ m + 0.5

        return jax.lax.while_loop(lambda c: c[0] < iters, body, (jnp.int32(0), s))[1]

    step = multihost.watch(long_step, name='long_step')
    seed = jnp.ones((size, size), jnp.float32).block_until_ready()
    step(seed, jnp.int32(1)).block_until_ready()  # compiled once (the count is an argument)
    probe = 8
    while True:  # time a short loop, grow it until it is long enough to time
        t0 = time.perf_counter()
        step(seed, jnp.int32(probe)).block_until_ready()
        took = time.perf_counter() - t0
        if took > 0.5 or probe > 1 << 26:
            break
        probe *= 4
    iters = max(1, min(int(probe * seconds / took), 2**31 - 1))
    return step, seed, iters, iters / probe * took


def _tree(mib: float) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    n = int(mib * (1 << 20) / 4 / 2)  # half float32, a quarter bfloat16 (2 B), a quarter int32
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n, dtype=np.float32).reshape(-1, 1024)
    w[3, 5] = np.nan
    tree = {
        'w': jnp.asarray(w),
        'h': jnp.asarray(rng.standard_normal(n // 2, dtype=np.float32), jnp.bfloat16),
        'i': jnp.asarray(np.arange(n // 2, dtype=np.int32)),
        'b': jnp.zeros(7),
    }
    return jax.block_until_ready(tree)


def _timed(results: list[dict[str, Any]], what: str, out: Any, fn: Any, check: bool) -> Any:
    t0 = time.perf_counter()
    value = fn()
    took = time.perf_counter() - t0
    running = not out.is_ready()
    results.append({'what': what, 'seconds': round(took, 4), 'launch_running': running})
    print(f'{what:<44} {took:9.4f} s   launch still running: {running}', flush=True)
    if check and (took >= LIMIT_S or not running):
        results[-1]['failed'] = True
    return value


def _tools(results: list[dict[str, Any]], out: Any, trees: list[dict[str, Any]]) -> None:
    """Each tool on a tree of its own (made before the launch): a jax.Array keeps its host
    copy once made, so a tool after another would not pay for its copies."""
    from multihost import _recorder
    from multihost._checks import _nonfinite
    from multihost._checks import fingerprint as _fingerprint
    from multihost.engine import calls, gather

    ns = {'tree': trees.pop()}
    _timed(results, 'engine diff (Session path)', out, lambda: calls.diff(ns, 'tree'), True)
    ns = {'tree': trees.pop()}
    _timed(results, 'engine layout + replicas', out, lambda: calls.layout(ns, 'tree'), True)
    ns = {'tree': trees.pop()}
    report = _timed(
        results, 'engine nonfinite', out, lambda: calls.nonfinite(ns, 'tree', timeout=60), True
    )
    assert sum(s.nan for s in report.shards) == 1, report
    ns = {'tree': trees.pop()}
    _timed(results, 'engine gather_local', out, lambda: gather.gather_local(ns, 'tree'), True)
    _timed(results, 'engine memory_census', out, lambda: calls.memory_census(ns, timeout=60), True)
    _timed(results, 'engine env_diff', out, lambda: calls.env_diff(timeout=60), True)
    leaves = list(trees.pop().values())
    tree = trees.pop()
    with _recorder.reading_host_copies():
        _timed(
            results,
            'kernel digests of the tree (host copies)',
            out,
            lambda: _fingerprint.digests(leaves, 'device'),
            True,
        )
        _timed(
            results,
            'nonfinite counts of the tree (host copies)',
            out,
            lambda: _nonfinite.nonfinite(tree, timeout=60),
            True,
        )


def main() -> int:
    args = _args()
    import jax

    import multihost
    from multihost._checks import fingerprint as _fingerprint

    device = jax.devices()[0]
    size = args.size or (4096 if device.platform == 'tpu' else 384)
    step, seed, iters, expect = _long_launch(args.launch_s, size)
    trees = [_tree(args.mib) for _ in range(8)]  # one per measurement (see `_tools`)
    w = trees.pop()['w']
    with multihost._recorder.reading_host_copies():  # compiled for the reference, not timed
        _fingerprint.fingerprints([trees[0]['b']])
    _fingerprint.fingerprints([trees[0]['b']])
    results: list[dict[str, Any]] = []
    print(f'long launch: about {expect:.1f} s; tree {args.mib:g} MiB', flush=True)
    t0 = time.perf_counter()
    out = step(seed, jax.numpy.int32(iters))
    _tools(results, out, trees)
    _timed(results, 'np.asarray of a ready leaf (reference)', out, lambda: np.asarray(w), False)
    _timed(
        results,
        'device kernel fingerprint (queued: the old way)',
        out,
        lambda: _fingerprint.fingerprints([w]),
        False,
    )
    out.block_until_ready()
    launch = time.perf_counter() - t0
    print(f'the long launch took {launch:.2f} s', flush=True)
    summary = {
        'device_kind': device.device_kind,
        'platform': device.platform,
        'jax': jax.__version__,
        'python': platform.python_version(),
        'launch_s': round(launch, 2),
        'tree_mib': args.mib,
        'results': results,
    }
    print(json.dumps(summary), flush=True)
    return 1 if any(r.get('failed') for r in results) else 0


if __name__ == '__main__':
    sys.exit(main())
