import json, os, sys, time, statistics, functools
import numpy as np, jax, jax.numpy as jnp, ml_dtypes
from multihost._checks import _fingerprint as F
OUT = os.environ.get('OUT', '/tmp')
log = open(os.path.join(OUT, 'explore.jsonl'), 'a')
def rec(**kw):
    print(json.dumps(kw), flush=True); log.write(json.dumps(kw) + '\n'); log.flush()
rec(device=str(jax.devices()[0].device_kind), jax=jax.__version__)
def med(fn, reps=7):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); jax.block_until_ready(fn()); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
def first(fn):
    t0 = time.perf_counter(); jax.block_until_ready(fn()); return time.perf_counter() - t0

@jax.jit
def one_read(xs):
    return sum(jnp.sum(x.astype(jnp.float32) if not jnp.iscomplexobj(x) else jnp.real(x)) for x in xs)

# variadic-reduce variant of the block kernel
def _block_var(x, flags):
    dt = np.dtype(x.dtype); size = dt.itemsize if dt.itemsize <= 2 else 4
    e = F._index(tuple(x.shape), None, None)
    ops = []
    sets = F._raw_sets(x)
    for r in sets:
        ops += F._terms(r, size, e)
    n = len(ops)
    init = [jnp.uint32(0)] * n
    if flags:
        for r in sets:
            ops += [r, r]; init += [jnp.uint32(0), jnp.uint32(0xFFFFFFFF)]
    def comb(a, b):
        out = [a[i] + b[i] for i in range(n)]
        for j in range(n, len(a), 2):
            out += [jnp.maximum(a[j], b[j]), jnp.minimum(a[j+1], b[j+1])]
        return tuple(out)
    got = jax.lax.reduce(tuple(ops), tuple(init), comb, tuple(range(x.ndim)))
    ks = [F.K1, F.K1, F.K2, F.K2]
    lanes = [got[i] * jnp.uint32(ks[i % 4]) for i in range(n)]
    return jnp.stack(lanes + list(got[n:]))
@functools.partial(jax.jit, static_argnums=(1,))
def fused_var(xs, flags):
    return jnp.concatenate([_block_var(x, flags) for x in xs])

def fused(xs, flags=False):
    return F._fused(tuple(xs), (None,) * len(xs), (None,) * len(xs), flags)

rng = np.random.default_rng(0)
DT = [('float32', np.float32), ('bfloat16', ml_dtypes.bfloat16), ('float16', np.float16), ('int8', np.int8),
      ('uint8', np.uint8), ('bool', np.bool_), ('int32', np.int32), ('float8_e4m3fn', ml_dtypes.float8_e4m3fn),
      ('float8_e5m2', ml_dtypes.float8_e5m2), ('complex64', np.complex64)]
which = sys.argv[1:] or ['dtypes', 'small', 'shapes']
if 'dtypes' in which:
    for name, dt in DT:
        item = np.dtype(dt).itemsize
        rows = 16 * 2**20 // item // 4096
        base = rng.standard_normal((rows, 4096), np.float32) * 8
        if dt == np.complex64:
            a = (base[: rows // 2] + 1j * base[rows // 2 :]).astype(dt)
        elif dt == np.bool_:
            a = base > 0
        else:
            a = base.astype(dt)
        x0 = jax.device_put(a)
        xs = [x0] + [x0 + (x0 if dt != np.bool_ else ~x0) * 0 for _ in range(15)] if False else [jax.device_put(a) for _ in range(16)]
        jax.block_until_ready(xs)
        ok = bool((np.asarray(fused(xs[:1]))[:-0 or None].reshape(-1)[: 4 * F.lane_sets(a.dtype)] == F.numpy_lanes(a).reshape(-1)).all())
        okv = bool((np.asarray(fused_var(tuple(xs[:1]), False)).reshape(-1) == F.numpy_lanes(a).reshape(-1)).all())
        t_first = first(lambda: fused(xs))
        r = dict(kind='dtype', dtype=name, exact=ok, exact_var=okv, first_s=t_first,
                 read_ms=(first(lambda: one_read(tuple(xs))), med(lambda: one_read(tuple(xs))))[1],
                 fused_ms=med(lambda: fused(xs)), fused_flags_ms=(fused(xs, True), med(lambda: fused(xs, True)))[1],
                 var_ms=(fused_var(tuple(xs), False), med(lambda: fused_var(tuple(xs), False)))[1],
                 var_flags_ms=(fused_var(tuple(xs), True), med(lambda: fused_var(tuple(xs), True)))[1])
        r['ratio'] = r['fused_ms'] / r['read_ms']
        rec(**r)
        del xs, x0
if 'small' in which:
    shapes = [(i % 100 + 3, i // 100 + 2) for i in range(1000)]
    xs = [jax.device_put(rng.standard_normal(s, np.float32)) for s in shapes]
    jax.block_until_ready(xs)
    t_read_first = first(lambda: one_read(tuple(xs)))
    read = med(lambda: one_read(tuple(xs)))
    t1 = first(lambda: fused(xs))
    steady = med(lambda: fused(xs))
    rec(kind='small1000', read_first_s=t_read_first, read_ms=read, fused_first_s=t1, fused_ms=steady)
    # chunks of 64 inputs (16 programs)
    shapes2 = [(i % 100 + 3, i // 100 + 12) for i in range(1000)]
    ys = [jax.device_put(rng.standard_normal(s, np.float32)) for s in shapes2]
    t0 = time.perf_counter()
    outs = [fused(ys[i:i+64]) for i in range(0, 1000, 64)]
    jax.block_until_ready(outs); tc = time.perf_counter() - t0
    steady_c = med(lambda: [fused(ys[i:i+64]) for i in range(0, 1000, 64)])
    rec(kind='small1000_chunk64', first_s=tc, ms=steady_c)
    # pack program: flatten + pad + concat 1000 inputs into one buffer
    shapes3 = [(i % 100 + 3, i // 100 + 22) for i in range(1000)]
    zs = [jax.device_put(rng.standard_normal(s, np.float32)) for s in shapes3]
    @jax.jit
    def pack(xs):
        return jnp.concatenate([jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1) for x in xs])
    tp = first(lambda: pack(tuple(zs)))
    rec(kind='pack1000', first_s=tp, ms=med(lambda: pack(tuple(zs))))
    # per-leaf separate dispatch (one program per shape): 50 shapes compile
    t0 = time.perf_counter()
    for x in zs[:50]:
        jax.block_until_ready(fused([x]))
    rec(kind='per_shape_compile50', s=time.perf_counter() - t0)
if 'shapes' in which:
    # a flax-like state: 586 leaves, 21 shapes, bf16 + f32
    shapes = [(256, 1024), (1024, 256), (256, 256), (256,), (1024,), (8000, 256), (256, 768),
              (768,), (512, 256), (256, 512), (512,), (128, 256), (256, 128), (128,), (8, 256),
              (4, 256, 64), (4, 64, 256), (4, 64), (1,), (2, 256), (256, 4, 64)]
    leaves = []
    for i in range(586):
        s = shapes[i % 21]
        dt = ml_dtypes.bfloat16 if i < 195 else np.float32
        leaves.append(jax.device_put(rng.standard_normal(s, np.float32).astype(dt)))
    jax.block_until_ready(leaves)
    mib = sum(x.nbytes for x in leaves) / 2**20
    t_read_first = first(lambda: one_read(tuple(leaves)))
    read = med(lambda: one_read(tuple(leaves)))
    t1 = first(lambda: fused(leaves))
    rec(kind='flaxlike', mib=mib, read_first_s=t_read_first, read_ms=read, fused_first_s=t1, fused_ms=med(lambda: fused(leaves)))
