"""A flax + optax training job under `multihost.watch` and the checked collectives (4 x 2 CPUs).

The program is `_flax_program`, written the way flax, optax and orbax document
one: a `TrainState` with static fields (`apply_fn`, `tx`: functions, whose
reprs carry memory addresses that differ per process) and a typed dropout key
(`jax.random.key`: no `weak_type`, no `is_ready`). Healthy steps must raise
nothing; a host that differs must get a short message that names what differs
first.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import flax.struct
import jax
import numpy as np
import optax
import pytest
from _flax_program import (
    LOCAL_BATCH,
    SEQ,
    TrainState,
    create_state,
    global_batch,
    make_mesh,
    train_step,
)
from _helpers import compiles
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost import _recorder

pytestmark = pytest.mark.release  # checked on the release rotation (CONTRIBUTING.md)

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


_STEPS = 4


@multiprocess(timeout=900)
def test_a_watched_train_step_runs_healthy_steps_records_them_and_computes_the_same_losses():
    pid = jax.process_index()
    mesh = make_mesh()
    step = multihost.watch(train_step)
    state = create_state(mesh)
    losses, signatures = [], []
    before = compiles()
    for i in range(_STEPS):
        state, loss = step(state, global_batch(mesh, i))
        losses.append(float(loss))
        signatures.append(step.signatures)
    # The first step's state comes from init, later ones from the step itself
    # (XLA picks other output shardings): JAX compiles twice, watch adds nothing.
    assert signatures[-1] == signatures[1] <= 2, signatures
    assert compiles() - before == step.signatures
    recs = [r for r in _recorder.snapshot(pid) if r.name == 'train_step']
    assert [r.call for r in recs] == list(range(_STEPS))
    assert all(r.kind == 'launch' and r.seq is not None and r.fingerprint for r in recs)
    jax.block_until_ready(state)
    assert _recorder.snapshot(pid, 1)[0].state == 'done'
    # The same program unwatched: the same losses and parameters.
    plain = create_state(mesh)
    want = []
    for i in range(_STEPS):
        plain, loss = train_step(plain, global_batch(mesh, i))
        want.append(float(loss))
    assert losses == want and np.all(np.isfinite(losses))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain.params)):
        np.testing.assert_array_equal(np.asarray(a.addressable_data(0)), b.addressable_data(0))


@multiprocess(timeout=900)
def test_broadcast_and_allgather_take_a_train_state_with_static_functions():
    mesh = make_mesh()
    state = create_state(mesh)
    # Key arrays convert to numpy nowhere (JAX's collectives refuse them too): their data.
    plain = state.replace(dropout_key=jax.random.key_data(state.dropout_key))
    full = multihost.process_allgather(plain, tiled=True)
    assert type(full) is TrainState and full.tx is state.tx and full.apply_fn == state.apply_fn
    want = multihost_utils.process_allgather(plain, tiled=True)
    jax.tree.map(np.testing.assert_array_equal, full, want)
    # JAX's semantics: a global array that is not fully addressable needs tiled=True.
    with pytest.raises(ValueError, match='tiled=True'):
        multihost.process_allgather(plain)
    stacked = multihost.process_allgather(full)  # host-local now: stacked per host
    assert stacked.step.shape == (4,)
    assert stacked.params['embed']['embedding'].shape == (
        4,
        *full.params['embed']['embedding'].shape,
    )
    mine = jax.tree.map(lambda x: x + jax.process_index(), full)  # sources differ
    back = multihost.broadcast_one_to_all(mine)
    assert type(back) is TrainState and back.tx is state.tx
    jax.tree.map(np.testing.assert_array_equal, back, full)
    small = multihost.broadcast_one_to_all({'step': mine.step, 'tx': mine.opt_state})
    np.testing.assert_array_equal(small['step'], full.step)


@functools.partial(jax.jit, donate_argnums=1)
def _noisy(x: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    k1, k2 = jax.random.split(key)
    return k2, x + jax.random.normal(k1, x.shape)


def _global_key(seed: int, sharding: Any, n: int | None = None) -> jax.Array:
    """A typed key (or ``n`` of them) placed by ``sharding`` on every host."""

    def make() -> jax.Array:
        key = jax.random.key(seed)
        return key if n is None else jax.random.split(key, n)

    return jax.jit(make, out_shardings=sharding)()


@multiprocess(timeout=300)
def test_a_watched_step_takes_and_returns_typed_keys_and_checks_their_shape_and_sharding():
    pid = jax.process_index()
    mesh = make_mesh()
    replicated = NamedSharding(mesh, P())
    step = multihost.watch(_noisy)
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P('data')), np.zeros((2, 4), np.float32)
    )
    key = _global_key(7, replicated)
    for _ in range(3):
        key, x = step(x, key)
    jax.block_until_ready((key, x))
    assert step.signatures == 1
    last = _recorder.snapshot(pid, 1)[0]
    assert last.name == '_noisy' and last.state == 'done', last  # asked of the key's data
    assert np.isfinite(np.asarray(x.addressable_data(0))).all()
    # A key of another shape on one host: caught before launch, naming the key.
    other = _global_key(1, replicated, 2 if pid == 1 else None)
    with pytest.raises(multihost.CollectiveMismatchError) as info:
        step(x, other)
    first = str(info.value).splitlines()[1]
    assert first.startswith("first difference: argument 'key': key<fry>[] P() on mesh("), first
    assert re.search(r'; key<fry>\[2\] P\(.*\) on mesh\(.* on process 1$', first), first
    # A key placed otherwise on one host: on one of its devices instead of the mesh.
    other = jax.random.key(2) if pid == 3 else _global_key(2, replicated)
    with pytest.raises(multihost.CollectiveMismatchError) as info:
        step(x, other)
    first = str(info.value).splitlines()[1]
    assert "argument 'key'" in first and 'key<fry>[] on one device on process 3' in first, first
    multihost.barrier('aligned after keys')


@flax.struct.dataclass
class _Batch:
    x: jax.Array
    mode: str = flax.struct.field(pytree_node=False)


@multiprocess(timeout=300)
def test_a_static_field_that_differs_on_one_host_is_shown_in_the_structure():
    pid = jax.process_index()
    step = multihost.watch(jax.jit(lambda b: b.x * 2), name='eval_step')
    batch = _Batch(np.ones(4, np.float32), 'eval' if pid == 3 else 'train')
    with pytest.raises(multihost.CollectiveMismatchError) as info:
        step(batch)
    lines = str(info.value).splitlines()
    assert 'eval_step has different inputs on process 3' in lines[0], lines
    assert lines[1].startswith('first difference: the input structure'), lines
    assert "_Batch{x,mode}<('train',)>(*)" in lines[1] and 'on processes 0-2;' in lines[1], lines
    assert "_Batch{x,mode}<('eval',)>(*)" in lines[1] and lines[1].endswith(' on process 3'), lines
    assert lines[2] == 'the one argument has the same shape, dtype and sharding on every host'
    multihost.barrier('aligned after static field')


def _local_batch_of(rows: int) -> dict[str, jax.Array]:
    mesh = make_mesh()
    sharding = NamedSharding(mesh, P('data'))
    tokens = np.zeros((rows, SEQ), np.int32)
    return {
        'tokens': jax.make_array_from_process_local_data(sharding, tokens),
        'targets': jax.make_array_from_process_local_data(sharding, tokens),
    }


@multiprocess(timeout=900)
def test_one_host_with_another_batch_shape_gets_a_short_message_naming_the_batch_first():
    pid = jax.process_index()
    mesh = make_mesh()
    state = create_state(mesh)
    step = multihost.watch(train_step)
    batch = _local_batch_of(2 * LOCAL_BATCH if pid == 1 else LOCAL_BATCH)
    with pytest.raises(multihost.CollectiveMismatchError) as info:
        step(state, batch)
    text = str(info.value)
    lines = text.splitlines()
    assert lines[0].startswith('watched launch mismatch at #'), text
    assert 'train_step' in lines[0] and 'on process 1' in lines[0], text
    n = 4 * LOCAL_BATCH
    assert lines[1] == (
        f"first difference: argument \"batch['targets']\": i32[{n},{SEQ}] P('data',) on "
        f"mesh(data=4,model=2) on processes 0, 2-3; i32[{2 * n},{SEQ}] P('data',) on "
        'mesh(data=4,model=2) on process 1'
    ), text
    assert "batch['tokens']" in lines[2], text  # the other differing argument
    leaves = len(jax.tree.leaves((state, batch)))
    assert f'{leaves - 2} other arguments are the same on every host' in text, text
    assert len(text) < 1000, (len(text), text)
    assert 'embedding' not in text  # identical parameters are counted, not listed
    # Nothing was launched (the state was not donated): a healthy step goes on.
    state, loss = step(state, global_batch(mesh, 0))
    assert np.isfinite(float(loss))


_NAME = re.compile(r'%[\w.\-]+|\b[\w.\-]+(?=: )')


@multiprocess(timeout=900)
def test_a_host_dependent_branch_names_an_hlo_line_that_differs_in_substance():
    pid = jax.process_index()
    mesh = make_mesh()

    @functools.partial(jax.jit, donate_argnums=0)
    def scaled_step(state: Any, batch: dict[str, jax.Array]) -> tuple[Any, jax.Array]:
        def loss_fn(params: Any) -> jax.Array:
            logits = state.apply_fn({'params': params}, batch['tokens'])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
            if pid == 2:  # host-dependent Python: another loss scale on process 2
                return loss.mean() * 2
            return loss.mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    step = multihost.watch(scaled_step)
    state = create_state(mesh)
    with pytest.raises(multihost.CollectiveMismatchError) as info:
        step(state, global_batch(mesh, 0))
    text = str(info.value)
    assert 'compiles to different programs on process 2' in text, text
    assert 'same collectives, different program; first differing HLO line' in text, text
    shown = dict(re.findall(r'^  process (\d): (.*)$', text, re.M))
    assert set(shown) == {'0', '2'}, text
    a, b = (_NAME.sub('%', shown[p]) for p in ('0', '2'))
    assert a != b, f'the lines shown differ only in instruction names:\n{text}'
    assert len(text) < 1500, text
    multihost.barrier('aligned after branch')


# -- single process: what counts as the structure -----------------------------------------


def _small_state(**kw: Any) -> TrainState:
    """A TrainState as `TrainState.create` builds one (new optax closures, a new module)."""
    from _flax_program import Transformer

    args = dict(params={'w': np.zeros(2, np.float32)}, tx=optax.adamw(1e-3))
    args.update(kw)
    return TrainState.create(apply_fn=Transformer().apply, dropout_key=jax.random.key(0), **args)


def test_two_train_states_built_alike_have_the_same_structure_text_though_str_differs():
    from multihost._structure import structure

    a, b = jax.tree.structure(_small_state()), jax.tree.structure(_small_state())
    assert str(a) != str(b)  # the static functions' addresses (as on two hosts)
    assert ' at 0x' in str(a)
    assert structure(a) == structure(b)
    text = structure(a)
    assert '0x' not in text
    assert 'TrainState{step,apply_fn,params,tx,opt_state,dropout_key}' in text
    assert (
        'function chain.<locals>.init_fn' in text and 'method Module.apply of Transformer(' in text
    )


def test_the_structure_text_tells_apart_what_differs_by_value_or_type():
    import flax.struct

    from multihost._structure import static, structure

    def text(tree: Any) -> str:
        return structure(jax.tree.structure(tree))

    # Another optimizer: other node types in opt_state, other functions in tx.
    assert text(_small_state()) != text(_small_state(tx=optax.sgd(1e-3)))
    # Other keys.
    assert text(_small_state()) != text(_small_state(params={'v': np.zeros(2, np.float32)}))

    @flax.struct.dataclass
    class Batch:
        x: Any
        mode: str = flax.struct.field(pytree_node=False)

    assert text(Batch(1, 'train')) == text(Batch(2, 'train'))
    assert text(Batch(1, 'train')) != text(Batch(1, 'eval'))
    # Static values: by value, functions by name, partials by their arguments.
    assert static(functools.partial(max, 1)) != static(functools.partial(max, 2))
    assert static(functools.partial(max, 1)) == static(functools.partial(max, 1))
    assert static(np.arange(3)) != static(np.arange(1, 4))

    class Opaque:  # identity semantics: its type alone
        pass

    assert static(Opaque()) == static(Opaque()) == Opaque.__qualname__

    class Tagged:  # value semantics, but the repr holds an address: its type alone
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Tagged)

        __hash__ = object.__hash__

    assert static(Tagged()) == static(Tagged()) == Tagged.__qualname__


def test_the_input_differences_stay_short_at_a_thousand_hosts():
    from multihost._debug._watch import _input_differences

    same = [(f"state.params['w{i}']", 'f32[64,32] P() on mesh(data=1000)') for i in range(500)]

    def info(p: int) -> dict[str, Any]:
        rows = 16 + p % 7  # seven different batch shapes
        return {'args': [*same, ('batch', f'f32[{rows},3]')], 'tree': 't', 'ident': 'train_step'}

    lines = _input_differences({p: info(p) for p in range(1000)})
    assert lines[0].startswith("first difference: argument 'batch': f32[16,3] on processes 0, 7, ")
    assert '3 other values on processes' in lines[0] and len(lines[0]) < 400, lines[0]
    assert lines[1] == '500 other arguments are the same on every host', lines


def test_programs_that_differ_in_names_only_normalize_alike_and_the_excerpt_shows_substance():
    from multihost._debug._watch import _differing_excerpts, _normalized

    a = [
        'ENTRY %main.3 (x.1: f32[8], w.1: f32[8]) -> f32[8] {',
        '  %x.1 = f32[8]{0} parameter(0)',
        '  %mul.1231 = f32[8]{0} multiply(%x.1, %x.1)',
        '  %c.7 = f32[] constant(2)',
        '  ROOT %r = f32[8]{0} add(%mul.1231, %c.7)' + ', backend_config={"x":0}' * 40,
        '}',
    ]
    renamed = [line.replace('1231', '1234').replace('x.1', 'x.9') for line in a]
    assert renamed != a and _normalized(renamed) == _normalized(a)
    b = [*renamed[:4], renamed[4].replace('add(', 'subtract('), renamed[5]]
    na, nb = _normalized(a), _normalized(b)
    j = next(j for j, (x, y) in enumerate(zip(na, nb)) if x != y)
    assert j == 4
    la, lb = _differing_excerpts({'raw': a, 'norm': na}, {'raw': b, 'norm': nb}, j)
    assert 'add(%mul.1231' in la and 'subtract(%mul.1234' in lb, (la, lb)
    assert la.endswith('...') and len(la) < 300
