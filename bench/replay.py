"""`multihost.replay` of a flax transformer's train step, one process: its time, first and again.

On one process the op-by-op stage evaluates the step's jaxpr twice (two runs of the same
host compared equation by equation, every equation's outputs fingerprinted), after the inputs
and two runs of the compiled step. The first replay compiles each operation; the second finds
them compiled. Also: the step's own time, and that the job's losses after a replay are bitwise
those of the same job without one.

Usage: ``python bench/replay.py [--layers 12] [--width 512] [--profile PATH]``. The result
goes to ``bench/results/<device kind>/replay.json`` (`_results`), or to ``--json PATH``;
``--profile``: the second replay under cProfile, its top functions written to PATH.
On a device that reports its memory (`Device.memory_stats`), also: a replay whose argument
takes 60% of the free memory is refused before any copy (MemoryError, its message kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _copy(x: Any) -> Any:
    import jax

    return x.copy() if isinstance(x, jax.Array) else x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--layers', type=int, default=12)
    parser.add_argument('--width', type=int, default=512)
    parser.add_argument('--json', default='')
    parser.add_argument('--profile', default='')
    args = parser.parse_args(argv)
    import _results
    import jax
    import numpy as np
    from tpu_fingerprints import flax_job

    import multihost
    from multihost._checks import _replay

    state, make_batch, step = flax_job(args.layers, args.width)
    batch = make_batch(0)
    before = jax.tree.map(_copy, state)  # the job as it would be, never replayed
    t0 = time.perf_counter()
    plain_state, loss = step(jax.tree.map(_copy, state), batch)
    jax.block_until_ready(loss)
    compile_s = time.perf_counter() - t0
    got: dict[str, Any] = {
        'layers': args.layers,
        'width': args.width,
        'leaves': len(jax.tree.leaves(state)),
        'equations': sum(1 for _ in _replay.equations(step, state, batch)),
        'step_first_s': compile_s,
    }
    t0 = time.perf_counter()
    jax.block_until_ready(step(jax.tree.map(_copy, state), batch))
    got['step_s'] = time.perf_counter() - t0
    for name in ('replay_first_s', 'replay_again_s'):
        profile = None
        if args.profile and name == 'replay_again_s':
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        t0 = time.perf_counter()
        report = multihost.replay(step, state, batch)
        got[name] = time.perf_counter() - t0
        if profile is not None:
            import io
            import pstats

            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats('tottime').print_stats(40)
            with open(args.profile, 'w') as f:
                f.write(text.getvalue())
        got[name.replace('_s', '_stages_s')] = dict(report.seconds)
        got['verdict'] = report.verdict
        got['evaluated'] = report.equations
        print(json.dumps({k: got[k] for k in (name, 'verdict', 'evaluated')}), flush=True)
    # the job goes on as if nothing happened: its next losses, bitwise those of the job
    # never replayed
    losses = []
    for s in (state, before):
        for i in range(2):
            s, loss = step(s, make_batch(i + 1))
            losses.append(np.asarray(loss).tobytes())
    got['losses_bitwise_after_replay'] = losses[:2] == losses[2:]
    del plain_state
    dev = jax.devices()[0]
    got['room'] = _room(dev)
    print(json.dumps(got, indent=1))
    print('written to', _results.save('replay', got, dev.device_kind, args.json))
    room_ok = got['room'] is None or got['room']['refused']
    return 0 if got['verdict'] == 'agree' and got['losses_bitwise_after_replay'] and room_ok else 1


def _room(dev: Any) -> dict[str, Any] | None:
    """A replay whose argument takes 60% of the device's free memory: refused before any
    copy, saying what to do (None where the device reports no memory)."""
    import jax
    import jax.numpy as jnp

    import multihost

    stats = dev.memory_stats()
    if not stats or 'bytes_limit' not in stats:
        return None
    free = int(stats['bytes_limit']) - int(stats.get('bytes_in_use', 0))
    big = jnp.zeros((int(free * 0.6) // 4,), jnp.float32)
    t0 = time.perf_counter()
    try:
        multihost.replay(jax.jit(lambda v: v.sum()), big)
        said = ''
    except MemoryError as exc:
        said = str(exc)
    seconds = time.perf_counter() - t0
    del big
    return {'argument_mib': int(free * 0.6) >> 20, 'refused': bool(said), 'message': said,
            'seconds': seconds}  # fmt: skip


if __name__ == '__main__':
    sys.exit(main())
