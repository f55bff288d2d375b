"""`replay`: run one launch again on every host and name where the hosts' replicas part.

Collective: every process calls ``replay(fn, *args)`` with its own arguments, as it would
call ``fn``. Three stages (`multihost._models._replay`), each stopping at what it finds:

1. **inputs**: `tree_diff` of the arguments;
2. **again**: the compiled launch run ``again`` times on copies of the arguments (the
   user's arrays are never donated or changed); a host whose runs differ is named;
3. **op by op**: ``jax.make_jaxpr(fn)`` evaluated one equation at a time (nested jit,
   custom_jvp/vjp and remat entered; scan, while, cond and shard_map evaluated as one
   equation each), the outputs of every `CHUNK` equations compared between hosts by
   `tree_diff` (replicas of global arrays block by block). Hosts run the same equations in
   the same order, so an equation on global arrays is one SPMD launch on every host, as in
   the job. On one process the op-by-op run is done twice and compared equation by equation.

The first equation whose outputs part is named with its line in the job's own code (from
the equation's traceback: the innermost frame outside every installed package) and in the
library that made it. Values are compared bitwise: an equation evaluated alone may round
differently from the same operation fused inside the compiled launch, so hosts are compared
with each other, never with the compiled launch.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from multihost import _jax_adapter
from multihost._checks import fingerprint
from multihost._checks._treediff import tree_diff
from multihost._errors import MultihostError
from multihost._models._replay import BEFORE, Equation, Replay
from multihost._models._stacks import display_path, frame_package

#: Equations evaluated between two comparisons (one `tree_diff` each).
CHUNK = 256
#: ... or fewer, once their outputs hold this many bytes on this host.
CHUNK_BYTES = 256 << 20
#: Outputs of at most this many bytes on an accelerator are compared from host copies
#: (`_on_host`): each chunk's small outputs form a list of shapes never seen before, and
#: fingerprinting them on the device would compile a packing program per chunk (on a TPU
#: v5e, the flax step's 8,123 equations: 149 programs, 56 with this bound), where copying
#: a few kilobytes costs microseconds.
SMALL_BYTES = 256 << 10

#: Primitives whose inner jaxpr is entered: name -> the parameter that holds it.
_ENTERED = {
    'pjit': 'jaxpr',
    'jit': 'jaxpr',
    'closed_call': 'call_jaxpr',
    'core_call': 'call_jaxpr',
    'custom_jvp_call': 'call_jaxpr',
    'custom_vjp_call': 'call_jaxpr',
    'custom_vjp_call_jaxpr': 'fun_jaxpr',
    'remat': 'jaxpr',
    'checkpoint': 'jaxpr',
}
#: Packages whose frames never name an equation's line (JAX itself, Python's own).
_NOT_A_LIBRARY = frozenset({'jax', 'jaxlib', 'multihost', 'mhnotebook', 'runpy', 'threading'})


def replay(
    fn: Callable[..., Any],
    *args: Any,
    again: int = 2,
    canonical: bool = False,
    op_by_op: bool = True,
    timeout: float | None = None,
    **kwargs: Any,
) -> Replay:
    """Replays ``fn(*args, **kwargs)`` on every host and says where the hosts part.

    Args:
        fn: the launch's function (jitted or not: it is traced, compiled and evaluated op
            by op, never with donation).
        args, kwargs: this host's arguments, as the job passes them (global arrays,
            host-local arrays, scalars). Never changed.
        again: how many times the compiled launch runs on copies of the arguments (>= 1).
        canonical: when the inputs differ between hosts, go on with every host given
            process 0's host-local arguments, and every global array whose replicas
            differ given the first replica of each block in its mesh (`_first_replica`).
        op_by_op: evaluate the jaxpr one equation at a time (the third stage).
        timeout: seconds each comparison between hosts may wait (the default of
            `tree_diff`).

    Returns:
        A `Replay`, equal on every host.

    Raises:
        ValueError: ``again`` < 1, or ``canonical`` with a differing global array that
            has no mesh (not a `NamedSharding`).
    """
    if not isinstance(again, int) or again < 1:
        raise ValueError(f'replay: again must be an int >= 1, got {again!r}')
    # A jitted function under `multihost.install` or `watch`: JAX's own inside (a replay is
    # no launch of the job's: never recorded, checked or audited).
    fn = getattr(fn, '_multihost_unrecorded', fn)
    name = getattr(fn, '__name__', None) or type(fn).__name__
    n = jax.process_count()
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    # Compared by the names the function gives its arguments (``['state'].params``), then
    # keyword arguments by theirs.
    names = arg_names(positional_names(fn), len(args))
    named = {**dict(zip(names, args)), **kwargs}
    inputs = tree_diff(named, timeout=timeout) if n > 1 else None
    seconds['inputs'] = time.perf_counter() - t0
    if inputs is not None and not inputs.ok:
        if not canonical:
            return Replay(name, n, 'inputs', inputs=inputs, seconds=seconds)
        named = _canonical(inputs, named)
        args = tuple(named[k] for k in names)
        kwargs = {k: named[k] for k in kwargs}
    base = dict(name=name, num_processes=n, inputs=inputs, canonical=bool(canonical))

    try:
        return _replay(fn, args, kwargs, again, op_by_op, timeout, base, seconds)
    except Exception as exc:
        if n == 1 or isinstance(exc, MultihostError):
            raise
        # This host cannot go on: it takes its turn with its reason, so the others raise
        # the same HostFailedError at their next comparison instead of waiting for it.
        from multihost._exchange import _sequence

        said = f'{type(exc).__name__}: {exc}'.strip()
        if len(said) > 600:  # its first line and its end (a traceback's last lines say why)
            said = f'{said.splitlines()[0][:200]} ... {said[-400:]}'
        _sequence.fail_turn('replay', name, said, timeout=timeout)


def _replay(
    fn: Callable[..., Any], args: Any, kwargs: Any, again: int, op_by_op: bool,
    timeout: float | None, base: dict[str, Any], seconds: dict[str, float],
) -> Replay:  # fmt: skip
    """Stages 2 and 3 of `replay`."""
    n = base['num_processes']
    t0 = time.perf_counter()
    # Traced first, and agreed on: a host that cannot trace the launch (a Python error)
    # says so before any host runs it (the others would wait in its collectives).
    closed = _jaxpr(fn, args, kwargs)
    if n > 1:
        from multihost._exchange import _sequence

        _sequence.exchange('replay', 'traced', b'', tree_digest='', timeout=timeout)
    varying, outputs = _again(fn, args, kwargs, again, timeout)
    seconds['again'] = time.perf_counter() - t0
    base.update(runs=again, varying=varying, outputs=outputs, seconds=seconds)
    if varying:
        return Replay(verdict='again', **base)
    if not op_by_op:
        verdict = 'outputs' if outputs is not None and not outputs.ok else 'agree'
        return Replay(verdict=verdict, **base)

    t0 = time.perf_counter()
    walk = _Walk(n, timeout)
    walk.total = _count(closed.jaxpr)
    flat = _flat_arguments(fn, args, kwargs)
    walk.mesh = _explicit_mesh((args, kwargs))
    found = walk.evaluate(closed, flat)
    if found is None and n == 1:  # one host: a second run, compared with the first
        walk.second = True
        found = walk.evaluate(closed, flat)
    seconds['op_by_op'] = time.perf_counter() - t0
    base.update(equations=walk.done, total_equations=walk.total)
    if found is not None:
        first, difference, fed_by, before = found
        return Replay(
            verdict='operation',
            first=first,
            difference=difference,
            fed_by=fed_by,
            before=before,
            **base,
        )
    verdict = 'outputs' if outputs is not None and not outputs.ok else 'agree'
    return Replay(verdict=verdict, **base)


# -- stages 1 and 2 --------------------------------------------------------------------------


def _canonical(inputs: Any, tree: Any) -> Any:
    """``tree`` with every host-local leaf replaced by process 0's, and every global array
    whose replicas differ rebuilt from the first replica of each block in its mesh's order
    (`_first_replica`)."""
    from multihost._core._collectives import broadcast_one_to_all

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    treedef = jax.tree.structure(tree)
    leaves = [x for _, x in flat]
    is_global = [isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves]
    differing = set(inputs.differing_paths)
    out = list(leaves)
    for i, ((path, x), g) in enumerate(zip(flat, is_global)):
        if g and jax.tree_util.keystr(path) in differing:
            out[i] = _first_replica(x, jax.tree_util.keystr(path))
    local = [x for x, g in zip(leaves, is_global) if not g]
    shared = iter(broadcast_one_to_all(local) if local else [])
    return jax.tree.unflatten(treedef, [x if g else next(shared) for x, g in zip(out, is_global)])


def _first_replica(x: jax.Array, path: str) -> jax.Array:
    """A global array whose every replica of a block holds the first replica's bits: the
    block of the first device along the mesh axes the array is not sharded over (in a mesh
    laid out by process, as `jax.make_mesh` lays it, the lowest process's). Exact for every
    dtype (the blocks are gathered, not summed); the gather holds the replicas of one block
    at once on each device, for the time of the call.

    Raises:
        ValueError: ``x`` is not laid out by a mesh (a `NamedSharding`): its replicas cannot
            be told apart from here.
    """
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f'replay(canonical=True): {path} differs between hosts and is laid out by '
            f'{type(sharding).__name__}, not a NamedSharding, so its replicas cannot be '
            'told apart; give it a NamedSharding (jax.device_put(x, NamedSharding(mesh, '
            'spec))), or replay from a step whose global arrays agree.'
        )
    mesh, spec = sharding.mesh, sharding.spec
    used: set[str] = set()
    for entry in spec:
        if entry is not None:
            used.update((entry,) if isinstance(entry, str) else entry)
    replicas = tuple(a for a in mesh.axis_names if a not in used)
    if not replicas:  # no axis holds replicas: nothing can differ between them
        return x

    def first(block: Any) -> Any:
        return jax.lax.all_gather(block, replicas, axis=0, tiled=False)[0]

    # check_vma off: the blocks are the devices' own bits (replicas that differ), which the
    # type system would take as equal; the gather makes them so.
    return jax.jit(jax.shard_map(first, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))(
        x
    )


def _check_room(tree: Any) -> None:
    """Raises MemoryError before the first copy when a copy of the arguments' blocks
    would not fit a device's free memory (what the device reports: `Device.memory_stats`;
    CPU devices report none and are not checked). The launch's own temporaries need room
    too: fitting here is necessary, not sufficient."""
    need: dict[Any, int] = {}
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and not x.is_deleted():
            for s in x.addressable_shards:
                need[s.device] = need.get(s.device, 0) + s.data.nbytes
    for device, nbytes in need.items():
        try:
            stats = device.memory_stats()
        except Exception:  # a backend that does not say
            stats = None
        if not stats or 'bytes_limit' not in stats:
            continue
        limit = int(stats['bytes_limit'])
        free = limit - int(stats.get('bytes_in_use', 0))
        if nbytes > free:
            raise MemoryError(
                f'replay: a copy of the arguments needs {nbytes / 2**20:,.0f} MiB on {device}, '
                f'which has {free / 2**20:,.0f} MiB free (of {limit / 2**20:,.0f}): '
                'the launch is run on copies so that your arrays are never donated. Free memory '
                'first (del the references to arrays you no longer need, jax.clear_caches()), '
                'or replay a smaller step (a smaller batch or model), or pass op_by_op=False '
                'with again=1 after freeing what you can.'
            )


def _copy(x: Any) -> Any:
    if isinstance(x, jax.Array):
        return jnp.copy(x)
    if isinstance(x, np.ndarray):
        return x.copy()
    return x


def _local_digests(tree: Any) -> dict[str, str]:
    """This host's digest of each leaf's every addressable block: ``path@index`` -> digest."""
    keys: list[str] = []
    datas: list[Any] = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        p = jax.tree_util.keystr(path)
        if isinstance(x, jax.Array) and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            for s in x.addressable_shards:
                keys.append(f'{p}@{s.device.id}')
                datas.append(s.data)
        elif isinstance(x, (np.ndarray, np.generic, int, float, bool, complex)):
            keys.append(p)
            datas.append(np.asarray(x))
    digests = fingerprint.digests(datas) if datas else []
    return dict(zip(keys, digests))


def _again(
    fn: Callable[..., Any], args: Any, kwargs: Any, again: int, timeout: float | None
) -> tuple[dict[int, tuple[str, ...]], Any]:
    """Runs the compiled launch ``again`` times on copies; which leaves varied on which host,
    and the first run's outputs compared between hosts (None on one process)."""
    program = fn if hasattr(fn, 'lower') else jax.jit(fn)
    _check_room((args, kwargs))
    first_out = None
    first: dict[str, str] = {}
    changed: set[str] = set()
    for r in range(again):
        c_args, c_kwargs = jax.tree.map(_copy, (args, kwargs))
        out = program(*c_args, **c_kwargs)
        got = _local_digests(out)
        if r == 0:
            first_out, first = out, got
        else:
            changed |= {
                k.split('@')[0] or '(the result)' for k, d in got.items() if first.get(k) != d
            }
    n = jax.process_count()
    if n == 1:
        return ({0: tuple(sorted(changed))} if changed else {}), None
    import json

    from multihost._exchange import _sequence

    raw = _sequence.exchange(
        'replay',
        'again',
        json.dumps(sorted(changed)).encode(),
        tree_digest=_sequence.digest(('replay again', again)),
        timeout=timeout,
    )
    varying = {p: tuple(json.loads(b)) for p, b in raw.items() if json.loads(b)}
    outputs = tree_diff(first_out, timeout=timeout)
    return varying, outputs


# -- stage 3: op by op -------------------------------------------------------------------------


def _statics(fn: Callable[..., Any]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    return _jax_adapter.jit_statics(fn) or ((), ())


def positional_names(fn: Callable[..., Any]) -> list[str] | None:
    """The names of ``fn``'s positional parameters; None when its signature cannot be read."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def arg_names(names: list[str] | None, n: int) -> list[str]:
    """``n`` arguments named by ``names`` (`positional_names`), ``args[i]`` past them."""
    names = names or []
    return [names[i] if i < len(names) else f'args[{i}]' for i in range(n)]


def _explicit_mesh(tree: Any) -> Any:
    """The mesh the arguments are laid out on when it has explicit axes (`jax.make_mesh`'s
    default), else None: an equation evaluated alone on such arrays needs it as its context
    (`_bind`), as the job's jit took it from its arguments."""
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, 'sharding', None)
        if isinstance(x, jax.Array) and isinstance(sharding, NamedSharding):
            types = getattr(sharding.mesh, 'axis_types', ())
            if any('Explicit' in str(t) for t in types):
                return sharding.mesh
    return None


def _jaxpr(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    nums, names = _statics(fn)
    if names:
        raise ValueError(
            f'replay: {getattr(fn, "__name__", fn)} has static keyword arguments {names}; '
            'pass them positionally (static_argnums) or wrap the call in a lambda'
        )
    return jax.make_jaxpr(fn, static_argnums=nums)(*args, **kwargs)


def _flat_arguments(fn: Callable[..., Any], args: Any, kwargs: Any) -> list[Any]:
    """The jaxpr's arguments: the leaves of the dynamic arguments, in make_jaxpr's order."""
    nums = set(_statics(fn)[0])
    dynamic = tuple(a for i, a in enumerate(args) if i not in nums)
    return jax.tree.leaves((dynamic, kwargs))


def _scan_body(eqn: Any) -> Any:
    """A scan's body (a ClosedJaxpr) when its iterations are replayed one by one: a scan of
    at least one step. Its length is static, so every host runs the same equations (a cond's
    branch or a while loop's count depends on the values, which may differ between hosts:
    those stay one equation each)."""
    if eqn.primitive.name != 'scan' or int(eqn.params.get('length', 0)) < 1:
        return None
    body = eqn.params.get('jaxpr')
    return body if hasattr(body, 'jaxpr') and hasattr(body, 'consts') else None


def _count(jaxpr: Any) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        inner = _inner(eqn)
        body = _scan_body(eqn)
        if body is not None:
            total += _count(body.jaxpr) * int(eqn.params['length'])
            continue
        total += _count(inner[0]) if inner is not None else 1
    return total


def _inner(eqn: Any) -> tuple[Any, list[Any]] | None:
    """(jaxpr, consts) of an equation that is entered, or None."""
    param = _ENTERED.get(eqn.primitive.name)
    if param is None or param not in eqn.params:
        return None
    sub = eqn.params[param]
    if hasattr(sub, 'jaxpr') and hasattr(sub, 'consts'):  # a ClosedJaxpr
        return sub.jaxpr, list(sub.consts)
    if hasattr(sub, 'eqns'):  # an open Jaxpr (remat)
        return sub, []
    return None


def _type(x: Any) -> str:
    """``f32[8,512]``: an aval's, an array's or a value's type."""
    aval = x if hasattr(x, 'str_short') else getattr(x, 'aval', None)
    if aval is not None and hasattr(aval, 'str_short'):
        return str(aval.str_short(short_dtypes=True))
    a = np.asarray(x)
    return f'{a.dtype.name}{list(a.shape)}'


def _lines(eqn: Any) -> tuple[str, str]:
    """(the job's line, the library's line) of an equation: innermost frames first."""
    where = library = ''
    for file, line, func in _jax_adapter.equation_frames(eqn):
        package = frame_package(file)
        text = f'{display_path(file)}:{line} in {func}'
        if package is None:
            if not where:
                where = text
        elif package not in _NOT_A_LIBRARY and not library:
            library = text
        if where and library:
            break
    return where, library


@dataclass
class _Done:
    """One evaluated equation waiting for its comparison."""

    index: int
    eqn: Any
    scope: tuple[str, ...]
    ins: tuple[str, ...]
    outs: list[Any]
    fed: tuple[int, ...]


class _Walk:
    """Evaluates a jaxpr one equation at a time and compares every `CHUNK` equations."""

    def __init__(self, num_processes: int, timeout: float | None) -> None:
        self.n = num_processes
        self.timeout = timeout
        self.total = 0
        self.done = 0
        self.second = False  # one process: the run compared with `digests`
        self.digests: list[tuple[str, ...]] = []
        self.pending: list[_Done] = []
        self.pending_bytes = 0
        self.made: dict[int, _Done] = {}  # equations (by index) kept for `fed_by`
        self.mesh: Any = None  # `_explicit_mesh`: the context of an equation run alone

    def evaluate(self, closed: Any, flat: Sequence[Any]) -> Any:
        self.index = 0
        self.pending, self.pending_bytes = [], 0
        try:
            self._run(closed.jaxpr, list(closed.consts), list(flat), (), [None] * len(flat))
            return self._flush()
        except _Found as found:
            return found.result

    def _run(
        self, jaxpr: Any, consts: list[Any], args: list[Any], scope: tuple[str, ...],
        arg_made: list[int | None],
    ) -> tuple[list[Any], list[int | None]]:  # fmt: skip
        env: dict[Any, Any] = {}
        made: dict[Any, int | None] = {}
        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x, m in zip(jaxpr.invars, args, arg_made):
            env[v], made[v] = x, m
        last = _last_uses(jaxpr)

        def read(v: Any) -> Any:
            return v.val if _is_literal(v) else env[v]

        for i, eqn in enumerate(jaxpr.eqns):
            ins = [read(v) for v in eqn.invars]
            fed = [None if _is_literal(v) else made.get(v) for v in eqn.invars]
            inner = _inner(eqn)
            if _scan_body(eqn) is not None:
                outs, out_made = self._scan(eqn, ins, scope, fed)
            elif inner is not None:
                label = str(eqn.params.get('name') or eqn.primitive.name)
                outs, out_made = self._run(inner[0], inner[1], ins, scope + (label,), fed)
            else:
                got = _bind(eqn, ins, self.mesh)
                outs = list(got) if eqn.primitive.multiple_results else [got]
                out_made = [self._record(eqn, scope, ins, outs, fed)] * len(outs)
            for v, x, m in zip(eqn.outvars, outs, out_made):
                if not _is_drop(v):
                    env[v], made[v] = x, m
            for v in last.get(i, ()):
                env.pop(v, None)
        return [read(v) for v in jaxpr.outvars], [
            None if _is_literal(v) else made.get(v) for v in jaxpr.outvars
        ]

    def _scan(
        self, eqn: Any, ins: list[Any], scope: tuple[str, ...], fed: list[int | None]
    ) -> tuple[list[Any], list[int | None]]:
        """A scan replayed one iteration at a time, its body op by op (scope ``scan[i]``):
        iteration ``i`` takes the carry and the ``i``-th slice of each scanned input, its
        outputs past the carry are stacked back as the scan stacks them."""
        p = eqn.params
        body = p['jaxpr']
        nc, ncarry, length = int(p['num_consts']), int(p['num_carry']), int(p['length'])
        consts, carry, xs = ins[:nc], ins[nc : nc + ncarry], ins[nc + ncarry :]
        made_c, made_carry, made_xs = fed[:nc], fed[nc : nc + ncarry], fed[nc + ncarry :]
        ys: list[list[Any]] = []
        made_ys: list[int | None] = []
        steps = range(length - 1, -1, -1) if p.get('reverse') else range(length)
        for i in steps:
            outs, made = self._run(
                body.jaxpr, list(body.consts), [*consts, *carry, *(x[i] for x in xs)],
                scope + (f'scan[{i}]',), [*made_c, *made_carry, *made_xs],
            )  # fmt: skip
            carry, made_carry = outs[:ncarry], made[:ncarry]
            ys.append(outs[ncarry:])
            made_ys = made[ncarry:]
        if p.get('reverse'):
            ys.reverse()
        stacked = [jnp.stack([y[k] for y in ys]) for k in range(len(eqn.outvars) - ncarry)]
        return [*carry, *stacked], [*made_carry, *made_ys]

    def _record(
        self, eqn: Any, scope: tuple[str, ...], ins: list[Any], outs: list[Any],
        fed: list[int | None],
    ) -> int:  # fmt: skip
        index = self.index
        self.index += 1
        self.done = max(self.done, self.index)
        done = _Done(
            index, eqn, scope, tuple(_type(x) for x in ins), outs,
            tuple(dict.fromkeys(m for m in fed if m is not None)),
        )  # fmt: skip
        self.pending.append(done)
        self.made[index] = done
        self.pending_bytes += sum(int(getattr(x, 'nbytes', 0)) for x in outs)
        if len(self.pending) >= CHUNK or self.pending_bytes >= CHUNK_BYTES:
            found = self._flush()
            if found is not None:
                raise _Found(found)
        return index

    def _flush(self) -> Any:
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        for d in pending:  # keep the equations' descriptions, not their values
            self.made[d.index] = _Done(d.index, d.eqn, d.scope, d.ins, [], d.fed)
        if not pending:  # every host evaluates the same equations: empty on all
            return None
        values = _on_host([[_comparable(x) for x in d.outs] for d in pending])
        if self.n > 1:
            diff = tree_diff(values, timeout=self.timeout)
            if diff.ok:
                return None

            # The first equation in order (paths sort as text: '[176]' before '[20]').
            def position(leaf: Any) -> tuple[int, int]:
                m = re.match(r'\[(\d+)\](?:\[(\d+)\])?', leaf.path)
                return (int(m.group(1)), int(m.group(2) or 0)) if m else (0, 0)

            leaf = min(diff.leaves, key=position)
            i, k = position(leaf)
            named = dataclasses.replace(leaf, path=f'output {k}')  # the path is the walk's
            return self._answer(pending[i], named)
        # One fingerprint call for the chunk (its cost is per call more than per byte), the
        # digests then grouped by equation: keys are '[i][k]@device' or '[i][k]'.
        grouped: list[list[str]] = [[] for _ in values]
        for key, digest in _local_digests(values).items():
            grouped[int(key[1 : key.index(']')])].append(digest)
        digests = [tuple(g) for g in grouped]
        if not self.second:
            self.digests += digests
            return None
        for d, got in zip(pending, digests):
            if self.digests[d.index] != got:
                return self._answer(d, None)
        return None

    def _answer(self, at: _Done, leaf: Any) -> Any:
        fed = tuple(self._equation(self.made[i]) for i in at.fed if i in self.made)
        before = tuple(
            self._equation(self.made[i])
            for i in range(max(0, at.index - BEFORE), at.index)
            if i in self.made
        )
        return self._equation(at), leaf, fed, before

    @staticmethod
    def _equation(d: _Done) -> Equation:
        where, library = _lines(d.eqn)
        outs = tuple(_type(v) for v in d.eqn.outvars)
        return Equation(
            index=d.index,
            primitive=d.eqn.primitive.name,
            scope=' > '.join(d.scope),
            inputs=d.ins,
            outputs=outs,
            where=where,
            library=library,
        )


#: Primitives that run on one device (device 0) of a program over many: alone, their result
#: would stay there (a sharding the next operation cannot take), so they are evaluated in a
#: program whose result is replicated, as inside the launch.
_ON_ONE_DEVICE = frozenset({'pure_callback', 'io_callback'})
#: Primitives evaluated as one compiled program, as inside the launch: eagerly, JAX runs a
#: shard_map's body operation by operation on each device's block, and a host callback in it
#: then gets that block as a jax.Array instead of numpy's (code written for the launch fails).
_COMPILED = frozenset({'shard_map'})


def _bind(eqn: Any, ins: list[Any], mesh: Any = None) -> Any:
    """The equation's primitive applied to ``ins`` now, as `jax.core.eval_jaxpr` does it
    (``get_bind_params`` returns the parameters, or ``(subfuns, parameters)`` in older jax),
    in ``mesh``'s context when given (an explicit mesh; never around a compiled program: a
    host callback in it would run its own operations in that context)."""
    if eqn.primitive.name in _ON_ONE_DEVICE:
        spread = [x.sharding for x in ins if isinstance(x, jax.Array) and len(x.devices()) > 1]
        if spread:
            s = spread[0]
            mesh = s.mesh if isinstance(s, NamedSharding) else Mesh(
                np.array(sorted(s.device_set, key=lambda d: int(getattr(d, 'id', 0)))), ('devices',)
            )  # fmt: skip
            return jax.jit(
                lambda *a: _bind_now(eqn, list(a)), out_shardings=NamedSharding(mesh, P())
            )(*ins)
    if eqn.primitive.name in _COMPILED:
        many = eqn.primitive.multiple_results
        return jax.jit(
            lambda *a: list(_bind_now(eqn, list(a))) if many else _bind_now(eqn, list(a))
        )(*ins)
    if mesh is not None:
        with jax.set_mesh(mesh):
            return _bind_now(eqn, ins)
    return _bind_now(eqn, ins)


def _bind_now(eqn: Any, ins: list[Any]) -> Any:
    got = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = got if isinstance(got, tuple) else ((), got)
    ctx = getattr(getattr(eqn, 'ctx', None), 'manager', None)
    if ctx is None:
        return eqn.primitive.bind(*subfuns, *ins, **params)
    with ctx:
        return eqn.primitive.bind(*subfuns, *ins, **params)


class _Found(Exception):
    def __init__(self, result: Any) -> None:
        super().__init__('found')
        self.result = result


def _comparable(x: Any) -> Any:
    """An output as `tree_diff` compares it (PRNG keys by their data; tokens as 0)."""
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x
    if isinstance(x, (np.ndarray, np.generic, int, float, bool, complex)):
        return x
    return 0


def _on_host(values: list[list[Any]]) -> list[list[Any]]:
    """``values`` with each small accelerator array (`SMALL_BYTES`, fully addressable)
    replaced by its host copy, every copy started before the first is waited for; arrays
    that `fingerprint` reads in host memory anyway (a CPU's, under ``auto``) stay. Every host
    replaces the same outputs (same equations, same shapes), so hosts compare alike."""
    how = fingerprint.mode()
    small = [
        x
        for outs in values
        for x in outs
        if isinstance(x, jax.Array)
        and x.nbytes <= SMALL_BYTES
        and x.is_fully_addressable
        and not fingerprint.host_kind(x, how)
    ]
    if not small:
        return values
    for x in small:
        x.copy_to_host_async()
    ids = {id(x) for x in small}
    return [[np.asarray(x) if id(x) in ids else x for x in outs] for outs in values]


def _is_literal(v: Any) -> bool:
    return isinstance(v, jex_core.Literal)


def _is_drop(v: Any) -> bool:
    return isinstance(v, jex_core.DropVar)


def _last_uses(jaxpr: Any) -> dict[int, list[Any]]:
    """Equation index -> the variables read there for the last time (never the outputs)."""
    outs = {id(v) for v in jaxpr.outvars if not _is_literal(v)}
    last: dict[int, tuple[int, Any]] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not _is_literal(v) and id(v) not in outs:
                last[id(v)] = (i, v)
    by: dict[int, list[Any]] = {}
    for i, v in last.values():
        by.setdefault(i, []).append(v)
    return by


def equations(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Equation]:
    """The equations `replay` evaluates op by op, in order (nothing is run)."""
    closed = _jaxpr(fn, args, kwargs)
    index = 0

    def walk(jaxpr: Any, scope: tuple[str, ...]) -> Iterator[Equation]:
        nonlocal index
        for eqn in jaxpr.eqns:
            inner = _inner(eqn)
            if inner is not None:
                yield from walk(
                    inner[0], scope + (str(eqn.params.get('name') or eqn.primitive.name),)
                )
                continue
            where, library = _lines(eqn)
            ins = tuple(_type(v) for v in eqn.invars)
            outs = tuple(_type(v) for v in eqn.outvars)
            yield Equation(index, eqn.primitive.name, ' > '.join(scope), ins, outs, where, library)
            index += 1

    yield from walk(closed.jaxpr, ())
