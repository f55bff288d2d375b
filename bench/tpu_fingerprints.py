"""The checks' reads on an accelerator: fingerprints and the audit vs one jitted read, one process.

Run on a machine with a TPU (or GPU); on CPU it forces the kernel (what
``MULTIHOST_FINGERPRINT=device`` does) and gives CI's figures. See CONTRIBUTING.md.
Side by side in one run, medians of ``--reps``:

* exactness first: for every dtype the kernel handles on a chip (f32, bf16, f16, int8,
  uint8, bool, int32, fp8 e4m3fn / e5m2, complex64), leaves small (host path, packed on
  the device first where `fingerprint.settings.PACK_DTYPES` says, bfloat16's 1-D leaves of
  whole tiles by DMA, `fingerprint.pallas.dma_pack`) and large
  (the fused program), several of one shape (one program), blocks at offsets, the NaN/Inf
  and constant flags: the same bytes as numpy's implementation of the definition;
* the four rows of issue 47: 16 x 16 MiB float32, the same in bfloat16, a flax
  transformer's train state (bf16 params, adamw moments), 1,000 small float32 leaves each
  of its own shape; per row one read (a jitted sum of every leaf, compiled first), the
  fingerprints' first call (compiles included, and how many XLA compiles) and their median;
* the audit's read of a real flax step's arguments and results (`_audit._read`, what
  ``--audit`` does per audited launch: each of a new launch, its donated state gone) vs
  one read of the same leaves and vs the step.

Usage: ``python bench/tpu_fingerprints.py [--reps 7] [--json PATH] [--layers 8]``. The
result goes to ``bench/results/<device kind>/tpu_fingerprints.json`` (`_results`), or to
``--json PATH``. Exits 1 when any exactness check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault('MULTIHOST_FINGERPRINT', 'device')


class _Compiles:
    """XLA compiles counted through jax.monitoring (the backend-compile event)."""

    def __init__(self) -> None:
        import jax

        self.n = 0

        def seen(event: str, *_: Any, **__: Any) -> None:
            if event == '/jax/core/compile/backend_compile_duration':
                self.n += 1

        jax.monitoring.register_event_duration_secs_listener(seen)


def _median_ms(fn: Any, reps: int) -> float:
    import jax

    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _read_fn() -> Any:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def read(xs: Any) -> Any:
        return sum(jnp.sum(jnp.real(x).astype(jnp.float32)) for x in jax.tree.leaves(xs))

    return read


def exactness() -> dict[str, Any]:
    """Every dtype: device results == numpy's (lanes and flags), over every path."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes

    from multihost._checks import fingerprint as F

    rng = np.random.default_rng(0)
    dtypes = [np.float32, ml_dtypes.bfloat16, np.float16, np.int8, np.uint8, np.bool_, np.int32,
              ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.complex64]  # fmt: skip
    # (768, 8, 96): a leaf a TPU stores transposed, read in its stored order (8, 96, 768) with
    # the leading axes merged; (64, 32, 256): in C order, its leading axes merged
    shapes = [(3,), (37, 1001), (3, 5, 70001), (3, 5, 70001), (3, 5, 70001), (1 << 18) + 7,
              (768, 8, 96), (64, 32, 256)]  # fmt: skip
    out = {}
    for dt in dtypes:
        arrays = []
        for s in shapes:
            raw = rng.integers(0, 256, int(np.prod(s)) * np.dtype(dt).itemsize, dtype=np.uint8)
            a = (
                raw.view(dt).reshape(s)
                if dt != np.bool_
                else (raw[: int(np.prod(s))] & 1).astype(bool).reshape(s)
            )
            arrays.append(a)
        # small, fingerprinted together: packed on a TPU (1-D bfloat16 by DMA; narrow floats of
        # two axes or more stored in C order, several of a shape, through VMEM), or copied one
        # by one ((96, 8), (768, 3) and (3, 5, 7) are stored transposed there)
        for s in [(5,), (768,), (8, 96), (3, 7), (1,), (), (4096,), (8, 96), (96, 8), (96, 8),
                  (768, 3), (768, 3), (3, 5, 7), (3, 5, 7), (8, 64), (8, 64), (8, 64),
                  (2, 16, 64), (2, 16, 64)]:  # fmt: skip
            n = int(np.prod(s))
            raw = rng.integers(0, 256, n * np.dtype(dt).itemsize, dtype=np.uint8)
            arrays.append(
                raw.view(dt).reshape(s) if dt != np.bool_ else (raw[:n] & 1).astype(bool).reshape(s)
            )
        arrays.append(np.zeros((300, 700), dt))  # constant
        if jnp.issubdtype(dt, jnp.inexact):
            nan = np.zeros((300, 700), np.float32)
            nan[7, 9] = np.nan
            arrays.append(nan.astype(dt))
        dev = [jax.device_put(a) for a in arrays]
        packs = F.plan(dev).packs
        out[np.dtype(dt).name + '_packed'] = sum(len(c.blocks) for c in packs)
        out[np.dtype(dt).name + '_vmem'] = sum(len(c.blocks) for c in packs if c.kind == 'vmem')
        on_device, on_host = F.fingerprints(dev), F.fingerprints(arrays)
        # packing programs that did not compile (their leaves copied one by one instead)
        out[np.dtype(dt).name + '_packs_not_compiled'] = sum(
            F.CACHE.peek('programs', c.key) is False for c in packs
        )
        # again: the programs and host copies kept from the first call
        again = [F.fingerprints(dev) for _ in range(2)]
        ok = on_device == on_host and all(a == on_host for a in again)
        out[np.dtype(dt).name + '_again'] = all(a == on_host for a in again)
        if not ok:  # which leaves: their shapes
            out[np.dtype(dt).name + '_differ'] = [
                str(a.shape) for a, d, h in zip(arrays, on_device, on_host) if d != h
            ]
        want = [F.numpy_flags(a) for a in arrays]
        for _ in range(2):  # the first call, then with what it kept
            got = F.digests_with_flags(dev, 'device')
            ok = ok and [g[1:] for g in got] == want
        # blocks at offsets: four quarters of a (600, 1400) leaf add up to it
        big = arrays[-1] if arrays[-1].shape == (300, 700) else arrays[-2]
        leaf = np.concatenate([np.concatenate([big, big[::-1]], 1)] * 2, 0)
        quarters = [(jnp.asarray(leaf[r : r + 300, c : c + 700]), (r, c), leaf.shape)
                    for r in (0, 300) for c in (0, 700)]  # fmt: skip
        with np.errstate(over='ignore'):
            total = sum(F.device_lanes(quarters)[1:], F.device_lanes(quarters)[0])
        ok = ok and bool((total == F.numpy_lanes(leaf)).all())
        out[np.dtype(dt).name] = ok
    out.update(_one_bit_pairs())
    return out


#: Raw values of two leaves that must get different digests: (dtype, a, b) one subnormal
#: against another, one NaN payload against another.
_PAIRS = [
    ('bfloat16', 0x0001, 0x0002), ('bfloat16', 0x7FC1, 0x7FC3), ('bfloat16', 0xFF81, 0xFF82),
    ('float16', 0x0001, 0x0002), ('float16', 0x7E01, 0x7E03),
    ('float8_e4m3fn', 0x01, 0x02), ('float8_e4m3fn', 0x7F, 0xFF),
    ('float8_e5m2', 0x01, 0x02), ('float8_e5m2', 0x7D, 0x7E),
    ('float32', 0x00000001, 0x00000002), ('float32', 0x7FC00001, 0x7FC00003),
]  # fmt: skip


def _one_bit_pairs() -> dict[str, Any]:
    """Leaves that differ in one element's raw bits (a subnormal, a NaN payload), of every
    shape class (small alone, small packed or copied together, large), fingerprinted together
    on the device: each pair's digests differ, and each equals numpy's."""
    import jax
    import ml_dtypes

    from multihost._checks import fingerprint as F

    rng = np.random.default_rng(3)
    out: dict[str, Any] = {}
    for name, a_bits, b_bits in _PAIRS:
        dt = np.dtype(getattr(ml_dtypes, name, None) or name)
        unsigned = np.dtype(f'u{dt.itemsize}')
        arrays = []
        for shape in [(768, 3), (768, 3), (96, 8), (1024,), (512,), (37, 1001), (768, 8, 96),
                      (8, 64)]:  # fmt: skip
            n = int(np.prod(shape))
            base = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(unsigned)
            for bits in (a_bits, b_bits):
                raw = base.copy()
                raw[n // 3] = bits
                arrays.append(raw.view(dt).reshape(shape))
        dev = [jax.device_put(a) for a in arrays]
        on_device, on_host = F.fingerprints(dev), F.fingerprints(arrays)
        parted = all(on_device[i] != on_device[i + 1] for i in range(0, len(dev), 2))
        key = f'pair_{name}_{a_bits:#x}_{b_bits:#x}'
        out[key] = bool(parted and on_device == on_host)
        if not out[key]:
            out[key + '_differ'] = [str(a.shape) for a, d, h in zip(arrays, on_device, on_host)
                                    if d != h]  # fmt: skip
    return out


def _uniform(dtype: Any) -> list[Any]:
    import jax

    rng = np.random.default_rng(1)
    leaves = []
    for _ in range(16):
        a = rng.standard_normal((1024, 4096), np.float32)
        leaves.append(jax.device_put(a.astype(dtype) if dtype != np.float32 else a))
    return leaves


def _small_tree() -> list[Any]:
    import jax

    rng = np.random.default_rng(2)
    shapes = [(i % 100 + 3, i // 100 + 2) for i in range(1000)]  # 1,000 shapes
    return [jax.device_put(rng.standard_normal(s, np.float32)) for s in shapes]


def row(name: str, leaves: list[Any], reps: int, compiles: _Compiles) -> dict[str, Any]:
    """One read vs the fingerprints (first call with its compiles, then the median)."""
    import jax

    from multihost._checks import fingerprint as F

    jax.block_until_ready(leaves)
    read = _read_fn()
    t0 = time.perf_counter()
    jax.block_until_ready(read(leaves))
    read_first = time.perf_counter() - t0
    n0 = compiles.n
    t0 = time.perf_counter()
    F.digests(leaves, 'device')
    first = time.perf_counter() - t0
    n_first = compiles.n - n0
    n0 = compiles.n
    t0 = time.perf_counter()
    F.digests(leaves, 'device')
    second = time.perf_counter() - t0
    n_second = compiles.n - n0
    got = {
        'row': name,
        'leaves': len(leaves),
        'mib': sum(x.nbytes for x in leaves) / 2**20,
        'shapes': len({(x.shape, str(x.dtype)) for x in leaves}),
        'read_first_s': read_first,
        'first_s': first,
        'first_compiles': n_first,
        'second_s': second,
        'second_compiles': n_second,
        'read_ms': _median_ms(lambda: read(leaves), reps),
        'fingerprints_ms': _median_ms(lambda: F.digests(leaves, 'device'), reps),
    }
    F.digests_with_flags(leaves, 'device')
    got['with_flags_ms'] = _median_ms(lambda: F.digests_with_flags(leaves, 'device'), reps)
    got['ratio'] = got['fingerprints_ms'] / got['read_ms']
    got['flags_ratio'] = got['with_flags_ms'] / got['read_ms']
    # The same data in new arrays each time (as each step makes them): jax keeps the host
    # copy it made of an array, so the calls above read small leaves' copies again.
    host = [np.array(x) for x in leaves]
    fresh = []
    for _ in range(reps):
        new = jax.device_put(host, leaves[0].sharding)
        jax.block_until_ready(new)
        t0 = time.perf_counter()
        F.digests(new, 'device')
        fresh.append(time.perf_counter() - t0)
        del new
    got['fresh_arrays_ms'] = statistics.median(fresh) * 1e3
    got['fresh_ratio'] = got['fresh_arrays_ms'] / got['read_ms']
    # Where the time goes: the small whole leaves (host copies, packs) and the others
    # (programs per shape, the kernel), each fingerprinted alone, with its own read.
    small = [x for x in leaves if x.size <= F.SMALL]
    large = [x for x in leaves if x.size > F.SMALL]
    for name, part in (('small', small), ('large', large)):
        if part and len(part) < len(leaves):
            jax.block_until_ready(read(part))
            got[f'{name}_leaves'] = len(part)
            got[f'{name}_read_ms'] = _median_ms(lambda p=part: read(p), reps)
            got[f'{name}_fingerprints_ms'] = _median_ms(lambda p=part: F.digests(p, 'device'), reps)
    got['breakdown_ms'] = breakdown(leaves, reps)
    print(json.dumps(got), flush=True)
    return got


def flax_job(layers: int, width: int) -> tuple[Any, Any, Any]:
    """A linen transformer (bf16 params), adamw (f32 first moment), a jitted donating step."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import train_state

    vocab, seq, batch = 32000, 256, 8

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            y = nn.LayerNorm(param_dtype=jnp.bfloat16)(x)
            y = nn.SelfAttention(num_heads=8, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)(y)
            x = x + y
            y = nn.LayerNorm(param_dtype=jnp.bfloat16)(x)
            y = nn.Dense(4 * width, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)(y)
            y = nn.Dense(width, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)(nn.gelu(y))
            return x + y

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens: Any) -> Any:
            embed = nn.Embed(vocab, width, param_dtype=jnp.bfloat16)
            x = embed(tokens)
            for _ in range(layers):
                x = Block()(x)
            return embed.attend(nn.LayerNorm(param_dtype=jnp.bfloat16)(x)).astype(jnp.float32)

    model = Model()
    tokens = jnp.zeros((batch, seq), jnp.int32)
    params = model.init(jax.random.key(0), tokens)['params']
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.adamw(1e-4, mu_dtype=jnp.float32)
    )

    @jax.jit
    def make_batch(step: Any) -> Any:
        t = jax.random.randint(jax.random.key(step), (batch, seq + 1), 0, vocab)
        return {'tokens': t[:, :-1], 'targets': t[:, 1:]}

    def train_step(state: Any, batch: Any) -> Any:
        def loss_fn(p: Any) -> Any:
            logits = state.apply_fn({'params': p}, batch['tokens'])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets']).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    return state, make_batch, jax.jit(train_step, donate_argnums=0)


def _audit_parts(item: Any) -> dict[str, Any]:
    """Where the audit's read of one new launch goes (`_audit._read`'s phases, each timed
    on its own: its leaves and paths, the blocks it holds, their fingerprints with flags;
    the audit's time less these is its own work on the table), and how its blocks are
    read: small device leaves per packing program (by the program's name) or copied alone,
    and the others (group programs on a device, host memory read in place)."""
    import jax

    from multihost._checks import fingerprint as F
    from multihost._job import _audit

    t0 = time.perf_counter()
    found = _audit._leaves(item)
    t1 = time.perf_counter()
    held = _audit._held(found)
    t2 = time.perf_counter()
    datas = [d for _, _, d, _ in held]
    wanted = [f and d.nbytes >= _audit.MIN_DUP_BYTES for _, _, d, f in held]
    F.digests_with_flags(datas, constant=wanted)
    t3 = time.perf_counter()
    small = [d for d in datas if isinstance(d, jax.Array) and d.size <= F.SMALL]
    planned = F.plan(small)
    routes: dict[str, int] = {
        'small, copied alone': len(planned.copies),
        'others': len(datas) - len(small),
    }
    for call in planned.packs:
        routes[f'packed by {call.kind}'] = routes.get(f'packed by {call.kind}', 0) + len(
            call.blocks
        )
    return {'leaves_ms': (t1 - t0) * 1e3, 'blocks_ms': (t2 - t1) * 1e3,
            'digests_ms': (t3 - t2) * 1e3, 'routes': routes}  # fmt: skip


def audit_row(
    layers: int, width: int, reps: int, compiles: _Compiles
) -> tuple[Any, dict[str, Any]]:
    """The audit's read of the flax step's arguments and results vs one read and the step."""
    import jax

    from multihost._job import _audit

    state, make_batch, step = flax_job(layers, width)
    batch = make_batch(0)
    state, loss = step(state, batch)  # compiles
    jax.block_until_ready(loss)

    def launch(i: int) -> tuple[Any, float]:
        """One step as the job runs it; its audited launch as `_audit.after` queues it: its
        arguments (the state it was given, donated: deleted, and the batch), its results."""
        nonlocal state
        batch = make_batch(i)
        jax.block_until_ready(batch)
        t0 = time.perf_counter()
        prev = state
        state, loss = step(prev, batch)
        jax.block_until_ready(loss)
        took = time.perf_counter() - t0
        return _audit._Item('train_step', 10, 'bench', step, (prev, batch), {}, (state, loss)), took

    item, _ = launch(1)
    n0 = compiles.n
    t0 = time.perf_counter()
    _audit._read(item)
    first = time.perf_counter() - t0
    steps, audits = [], []
    for i in range(reps):  # each read is of a new launch's arrays (nothing cached on them)
        item, took = launch(i + 2)
        steps.append(took)
        t0 = time.perf_counter()
        _audit._read(item)
        audits.append(time.perf_counter() - t0)
    read = _read_fn()
    leaves = jax.tree.leaves((item.args[1], item.out))  # what the audit can read
    jax.block_until_ready(read(leaves))
    got = {
        'row': 'audit read of a flax step',
        'leaves': len(leaves),
        'mib': sum(x.nbytes for x in leaves) / 2**20,
        'step_ms': statistics.median(steps) * 1e3,
        'audit_first_s': first,
        'audit_first_compiles': compiles.n - n0,
        'read_ms': _median_ms(lambda: read(leaves), reps),
        'audit_ms': statistics.median(audits) * 1e3,
        # the same launch read again: jax keeps the host copies of its small leaves
        'audit_same_launch_again_ms': _median_ms(lambda: _audit._read(item), reps),
    }
    parts = [_audit_parts(launch(i + 100)[0]) for i in range(reps)]  # new launches again
    got['audit_parts_ms'] = {
        k: statistics.median(p[k] for p in parts) for k in parts[0] if k.endswith('_ms')
    }
    got['audit_routes'] = parts[0]['routes']
    got['audit_vs_read'] = got['audit_ms'] / got['read_ms']
    got['audit_vs_step'] = got['audit_ms'] / got['step_ms']
    every = _audit.DEFAULT_EVERY
    got['default_rate_share'] = got['audit_ms'] / (every * got['step_ms'])
    print(json.dumps(got), flush=True)
    return state, got


def breakdown(leaves: list[Any], reps: int) -> dict[str, Any]:
    """Where one fingerprint call of ``leaves`` spends its time (medians of ``reps`` calls,
    ms): the plan, the programs' arguments, the launches, the host copies, numpy's share, the
    wait for the programs' results; and how many of each the plan holds."""
    import jax

    from multihost._checks import fingerprint as F
    from multihost._checks.fingerprint import execute, planning

    F.digests(leaves, 'device')  # compiled
    p = planning.plan(leaves)
    spent: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return wrapper

    patches = {
        'plan': (planning, 'plan'),
        'arguments': (execute, '_arguments'),
        'host copies': (execute, '_host_copies'),
        'numpy': (execute, 'numpy_many'),
    }
    saved = {name: getattr(mod, attr) for name, (mod, attr) in patches.items()}
    saved_get = jax.device_get
    calls: list[dict[str, float]] = []
    try:
        for name, (mod, attr) in patches.items():
            setattr(mod, attr, timed(name, saved[name]))
        jax.device_get = timed('wait and copy results', saved_get)
        for _ in range(reps):
            spent.clear()
            t0 = time.perf_counter()
            F.digests(leaves, 'device')
            spent['whole call'] = time.perf_counter() - t0
            calls.append(dict(spent))
    finally:
        for name, (mod, attr) in patches.items():
            setattr(mod, attr, saved[name])
        jax.device_get = saved_get
    got: dict[str, Any] = {
        k: round(statistics.median(c.get(k, 0.0) for c in calls) * 1e3, 3) for k in calls[0]
    }
    got['rest (launches, packs, sums)'] = round(
        got['whole call'] - sum(v for k, v in got.items() if k != 'whole call'), 3
    )
    got['programs'] = len(p.programs)
    got['packs'] = {k: sum(c.kind == k for c in p.packs) for k in ('rows', 'concat', 'dma', 'vmem')}
    got['packed leaves'] = sum(len(c.blocks) for c in p.packs)
    got['copied alone'] = len(p.copies)
    got['routes'] = {r: p.routes.count(r) for r in sorted(set(p.routes))}
    return got


def first_call(layers: int, width: int) -> int:
    """The first fingerprints of the flax state in this process: XLA compiles and seconds
    (the state's own init compiles before the count starts)."""
    import jax

    try:
        from multihost._checks import fingerprint as F
    except ImportError:  # a checkout before the package (the before of a before/after)
        from multihost._checks import _fingerprint as F  # type: ignore[no-redef]

    state, _, _ = flax_job(layers, width)
    leaves = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    jax.block_until_ready(leaves)
    compiles = _Compiles()
    t0, cpu0 = time.perf_counter(), time.process_time()
    F.digests(leaves, 'device')
    first, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    got = {
        'row': f'first fingerprints of a flax state ({layers} blocks, width {width})',
        'platform': jax.devices()[0].platform,
        'leaves': len(leaves),
        'mib': round(sum(x.nbytes for x in leaves) / 2**20, 1),
        'first_s': round(first, 3),
        'first_cpu_s': round(cpu, 3),  # this process's CPU seconds (a busy machine's wall
        'first_compiles': compiles.n,  # time is not the program's)
    }
    print(json.dumps(got), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reps', type=int, default=7)
    parser.add_argument('--layers', type=int, default=8)
    parser.add_argument('--width', type=int, default=768)
    parser.add_argument('--json', default='')
    parser.add_argument(
        '--groups', default='1', help='comma-separated MAX_GROUP values to try on the flax state'
    )
    parser.add_argument(
        '--skip', default='', help='comma-separated: exact,uniform,flax,small,audit'
    )
    parser.add_argument(
        '--first',
        action='store_true',
        help='only the first fingerprints of the flax state: XLA compiles and seconds '
        '(issue 55 on CPU: --layers 12 --width 512)',
    )
    args = parser.parse_args(argv)
    if args.first:
        return first_call(args.layers, args.width)
    import jax

    from multihost._checks import fingerprint as F

    skip = set(filter(None, args.skip.split(',')))
    compiles = _Compiles()
    dev = jax.devices()[0]
    result: dict[str, Any] = {
        'device_kind': dev.device_kind,
        'platform': dev.platform,
        'jax': jax.__version__,
        'rows': [],
    }
    print(json.dumps({k: result[k] for k in ('device_kind', 'platform', 'jax')}), flush=True)
    if 'exact' not in skip:
        result['exact'] = exactness()
        print(json.dumps({'exact': result['exact']}), flush=True)
    if 'uniform' not in skip:
        import ml_dtypes

        for name, dt in (
            ('16 x 16 MiB float32', np.float32),
            ('16 x 16 MiB bfloat16', ml_dtypes.bfloat16),
        ):
            leaves = _uniform(dt)
            result['rows'].append(row(name, leaves, args.reps, compiles))
            del leaves
    if 'flax' not in skip or 'audit' not in skip:
        state, got = audit_row(args.layers, args.width, args.reps, compiles)
        if 'audit' not in skip:
            result['rows'].append(got)
        if 'flax' not in skip:
            leaves = jax.tree.leaves(state)
            result['rows'].append(
                row("a flax transformer's train state", leaves, args.reps, compiles)
            )
            saved = F.CONFIG.max_group
            for most in sorted({int(g) for g in args.groups.split(',') if g} - {saved}):
                with F.configured(max_group=most):  # smaller programs, more of them
                    name = f'the same, {most} blocks per program at most'
                    result['rows'].append(row(name, leaves, args.reps, compiles))
            del leaves
        del state
    if 'small' not in skip:
        result['rows'].append(
            row(
                '1,000 small float32 leaves, each its own shape', _small_tree(), args.reps, compiles
            )
        )
    print('\n' + json.dumps(result, indent=1))
    import _results

    kind = result.pop('device_kind')
    print('written to', _results.save('tpu_fingerprints', result, kind, args.json))
    failed = [k for k, v in result.get('exact', {}).items() if v is False]
    if failed:
        print('EXACTNESS FAILED:', ', '.join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
