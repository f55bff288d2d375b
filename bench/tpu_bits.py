"""Which programs keep a narrow float's raw bits on this chip (probes for docs/API.md 4.2).

For random bits of bfloat16, float16, float8_e4m3fn and float8_e5m2 (NaN payloads and
subnormals included), each probe reads the bits back through a different program and
counts the elements whose bits changed: an identity program, a reshape, XLA's
bitcast to unsigned integers (default options and with ``xla_allow_excess_precision``
off), and Pallas kernels that reinterpret the block in VMEM (``--kernel``; small leaves read
whole into VMEM by one kernel: ``--vmem``). On CPU the Pallas probes run in interpret mode.
Usage: ``python bench/tpu_bits.py [--kernel | --vmem | --tiles] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SHAPES = [(16, 128), (37, 1001), (64, 3000), (100, 3000), (3, 5, 70001), (300, 700),
          (512, 8, 64), (8, 64, 512), (4, 5, 1000), (2, 37, 1001), (3, 32, 70001),
          (6, 16, 9000), (1000, 5), (5, 1000), (50000, 3), (2, 3, 4, 50)]  # fmt: skip
DTYPES = [jnp.bfloat16, jnp.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
ROWS = 512


def _uint(dt: Any) -> Any:
    return {1: jnp.uint8, 2: jnp.uint16}[np.dtype(dt).itemsize]


def _sint(dt: Any) -> Any:
    return {1: jnp.int8, 2: jnp.int16}[np.dtype(dt).itemsize]


def _pallas(kernel: Any, x: jax.Array, out_dtype: Any) -> Any:
    interpret = jax.devices()[0].platform != 'tpu'
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, out_dtype), interpret=interpret
    )(x)


def probes(dt: Any) -> dict[str, Any]:
    u = _uint(dt)
    raw = np.random.default_rng(0).integers(0, np.iinfo(u).max + 1, (ROWS, 128), dtype=u)
    host = raw.view(dt)
    x = jax.device_put(host)
    want = raw.astype(np.int64)

    def bits(got: Any) -> np.ndarray:
        a = np.asarray(got)
        if a.dtype == np.dtype(dt):
            a = a.view(u)
        return a.astype(np.int64) & int(np.iinfo(u).max)

    def check(fn: Any) -> Any:
        try:
            got = bits(fn())
        except Exception as e:  # a probe that does not lower is a finding too
            return f'error: {type(e).__name__}: {str(e).splitlines()[0][:160]}'
        bad = got.reshape(-1) != want.reshape(-1)
        return int(bad.sum())

    def bitcast_u(v: Any) -> Any:
        return jax.lax.bitcast_convert_type(v, u)

    out: dict[str, Any] = {'elements': int(raw.size)}
    out['np.asarray'] = check(lambda: np.asarray(x))
    out['jit identity'] = check(lambda: jax.jit(lambda v: v)(x))
    out['jit reshape'] = check(lambda: jax.jit(lambda v: v.reshape(-1))(x).reshape(ROWS, 128))
    out['xla bitcast'] = check(lambda: jax.jit(bitcast_u)(x))
    opts = {'xla_allow_excess_precision': False}
    out['xla bitcast, no excess precision'] = check(
        lambda: jax.jit(bitcast_u).lower(x).compile(compiler_options=opts)(x)
    )
    out['xla bitcast to int, then uint'] = check(
        lambda: jax.jit(lambda v: jax.lax.bitcast_convert_type(v, _sint(dt)).astype(u))(x)
    )

    def k_value(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jax.lax.bitcast_convert_type(x_ref[...], _sint(dt))

    def k_pltpu(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = pltpu.bitcast(x_ref[...], _sint(dt))

    def k_widen(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jax.lax.bitcast_convert_type(x_ref[...], _sint(dt)).astype(jnp.int32)

    def k_ref(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref.bitcast(_sint(dt))[...]

    out['pallas value bitcast'] = check(lambda: _pallas(k_value, x, _sint(dt)))
    out['pallas pltpu.bitcast'] = check(lambda: _pallas(k_pltpu, x, _sint(dt)))
    out['pallas bitcast, widened to int32'] = check(lambda: _pallas(k_widen, x, jnp.int32))
    out['pallas ref bitcast'] = check(lambda: _pallas(k_ref, x, _sint(dt)))
    try:
        hlo = jax.jit(bitcast_u).lower(x).compile().as_text()
        ops = [
            ln.strip()[:200] for ln in hlo.splitlines() if re.match(r'\s*(ROOT )?%?\S+ = \S+\[', ln)
        ]
        out['xla bitcast hlo'] = ops[:12]
        got = bits(jax.jit(bitcast_u)(x)).reshape(-1)
        diff = np.nonzero(got != want.reshape(-1))[0][:6]
        out['xla bitcast changed (want, got)'] = [
            (hex(int(want.reshape(-1)[i])), hex(int(got[i]))) for i in diff
        ]
    except Exception as e:
        out['xla bitcast hlo'] = repr(e)[:200]
    return out


def kernel_words(dt: Any) -> dict[str, Any]:
    """The shipped routing (`fingerprint.device_results`: the Pallas kernel, a 2-D read of
    a whole leaf, or host copies) on this device against numpy, per shape: 'o' or 'x' for
    the lanes and the two flags, and which way it went; random bits (NaN payloads) and the
    same with NaNs replaced (arithmetic alone)."""
    from multihost._checks import fingerprint as F
    from multihost._checks.fingerprint import execute, layout

    F.CONFIG.platform = 'tpu'  # off a TPU: its plan, the kernels in interpret mode
    u = _uint(dt)
    out: dict[str, Any] = {}
    for shape in SHAPES:
        raw = np.random.default_rng(1).integers(0, np.iinfo(u).max + 1, shape, dtype=u)
        for label, a in (('bits', raw.view(dt)), ('finite', _finite(raw.view(dt)))):
            x = jax.device_put(a)
            way = layout.read_layout(dt, shape, True, layout.stored_order(x))
            how = 'host' if way is None else f'kernel {way.shape} stored {way.order}'
            how = 'host (small)' if int(np.prod(shape)) <= F.SMALL else how
            if F.bits_lost_on_chip(x):
                got = execute._copied_with_flags(x, True)
                lanes = np.frombuffer(got[0], '<u4')
                flags = got[1:]
            else:
                res = F.device_results([(x, (0,) * len(shape), shape)], flags=True)[0]
                lanes, flags = res[:4], (bool(res[4]), bool(res[5]))
            ok = [(lanes == F.numpy_lanes(a).reshape(-1)).all(), flags == F.numpy_flags(a)]
            out[f'{shape} {label}'] = ''.join('o' if w else 'x' for w in ok) + ' ' + how
    return out


#: Small leaves' shapes for `vmem_pack`: stored in C order on a v5e, then stored transposed.
VMEM_SHAPES = [(8, 64), (16, 64), (8, 96), (8, 128), (1, 64), (4, 8, 64), (2, 16, 128),
               (96, 8), (768, 3), (3, 5, 7)]  # fmt: skip


def vmem_pack(dt: Any) -> dict[str, Any]:
    """`fingerprint.pallas.vmem_bits` (5 leaves of random bits per shape, read whole into VMEM
    by one kernel, their bits widened to int32 there) against the leaves' bits, called directly
    (whatever the plan would route): per shape, the stored order and the elements changed."""
    from multihost._checks.fingerprint import layout, pallas

    u = _uint(dt)
    program = pallas.vmem_bits if jax.devices()[0].platform == 'tpu' else pallas.vmem_bits_interpret
    out: dict[str, Any] = {}
    for shape in VMEM_SHAPES:
        raws = [np.random.default_rng(k).integers(0, np.iinfo(u).max + 1, shape, dtype=u)
                for k in range(5)]  # fmt: skip
        xs = tuple(jax.device_put(r.view(dt)) for r in raws)
        got = np.asarray(program(xs)).astype(np.int64)
        changed = sum(int((got[k] != raws[k].astype(np.int64)).sum()) for k in range(5))
        out[str(shape)] = {'stored': list(layout.stored_order(xs[0])), 'changed': changed}
    return out


def tile_sweep() -> dict[str, Any]:
    """Median ms of the kernel's results for 16 x (1024, 4096) bfloat16 per tile size,
    beside one jitted read of the same leaves."""
    import statistics
    import time

    from multihost._checks import fingerprint as F
    from multihost._checks.fingerprint import pallas

    xs = [jax.device_put(np.random.default_rng(i).standard_normal((1024, 4096), np.float32)
                         .astype(jnp.bfloat16)) for i in range(16)]  # fmt: skip
    read = jax.jit(lambda v: sum(jnp.sum(x.astype(jnp.float32)) for x in v))
    blocks = [(x, (0, 0), x.shape) for x in xs]

    def med(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            ts.append(time.perf_counter() - t0)
        return round(statistics.median(ts) * 1e3, 3)

    out: dict[str, Any] = {'read_ms': med(lambda: read(xs))}
    for t in (1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18):
        pallas.TILE = t
        F.CACHE.clear()  # compiled anew for this tile
        t0 = time.perf_counter()
        F.device_results(blocks, flags=True)
        first = time.perf_counter() - t0
        out[f'tile {t}'] = {
            'first_s': round(first, 2),
            'ms': med(lambda: F.device_results(blocks, flags=True)),
        }
    return out


def _finite(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[~np.isfinite(a.astype(np.float32))] = 0.5
    return a


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--json', help='write the results here (default: bench/results/<kind>/)')
    dev = jax.devices()[0]
    res = {'device': dev.device_kind, 'jax': jax.__version__, 'platform': dev.platform}
    p.add_argument('--kernel', action='store_true', help='only the Pallas kernel, word by word')
    p.add_argument('--tiles', action='store_true', help='only the tile-size sweep')
    p.add_argument('--vmem', action='store_true', help="only the small leaves' VMEM pack")
    args = p.parse_args(argv)
    if args.tiles:
        res['tiles'] = tile_sweep()
    for dt in DTYPES if not args.tiles else []:
        if args.vmem:
            if np.dtype(dt) != np.float16:
                res[np.dtype(dt).name] = vmem_pack(dt)
        elif args.kernel:
            if np.dtype(dt) != np.float16:
                res[np.dtype(dt).name] = kernel_words(dt)
        else:
            res[np.dtype(dt).name] = probes(dt)
    print(json.dumps(res, indent=1))
    import _results

    kind = res.pop('device')
    name = 'tpu_bits' + (
        '_vmem' if args.vmem else '_kernel' if args.kernel else '_tiles' if args.tiles else ''
    )
    print('written to', _results.save(name, res, kind, args.json or ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
