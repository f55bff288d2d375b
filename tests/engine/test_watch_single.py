"""`multihost.watch` and the flight recorder in one process: records, states, bounds, statics."""

from __future__ import annotations

import gc
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multihost
from multihost import _recorder


@pytest.fixture(autouse=True)
def fresh_recorder():
    _recorder.reset()
    yield
    _recorder.reset()


def test_watch_behaves_like_the_function_and_records_each_call():
    step = multihost.watch(jax.jit(lambda x, k: x * k), name='scale')
    x = jnp.arange(4.0)
    for k in range(3):
        out = step(x, k)
    np.testing.assert_array_equal(np.asarray(out), np.arange(4.0) * 2)
    recs = _recorder.snapshot(0)
    assert [(r.kind, r.name, r.call) for r in recs] == [('launch', 'scale', k) for k in range(3)]
    assert recs[-1].label == 'scale call #2' and recs[-1].fingerprint
    assert step.signatures == 1  # a Python scalar is keyed by type, not value
    assert len({r.digest for r in recs}) == 1


def test_as_a_decorator_with_and_without_arguments():
    @multihost.watch
    @jax.jit
    def plain(x):
        return x + 1

    @multihost.watch(name='named', check=False)
    @jax.jit
    def other(x):
        return x - 1

    assert float(plain(jnp.float32(1))) == 2.0 and float(other(jnp.float32(1))) == 0.0
    assert [r.name for r in _recorder.snapshot(0)] == ['plain', 'named']
    assert plain.__name__ == 'plain'


def test_static_arguments_are_keyed_by_value():
    @partial(jax.jit, static_argnames=('mode',))
    def f(x, mode):
        return x * 2 if mode == 'double' else x

    step = multihost.watch(f)
    step(jnp.ones(2), mode='double')
    step(jnp.ones(2), mode='double')
    step(jnp.ones(2), mode='same')
    assert step.signatures == 2


def test_a_donated_launch_is_done_when_a_later_one_on_its_devices_is():
    """In-order completion: a launch whose only output was donated (deleted before anyone
    asked) reads done once a later launch of the thread on the same devices is done."""
    step = multihost.watch(jax.jit(lambda x: x * 2, donate_argnums=0), name='donating')
    a = step(jnp.ones(1000))
    b = step(a)  # a is donated: deleted before anyone asked whether it was ready
    assert a.is_deleted()
    assert _recorder.snapshot(0)[0].state in ('unknown', 'done')  # b may still run
    b.block_until_ready()
    assert [r.state for r in _recorder.snapshot(0)] == ['done', 'done']


def test_an_output_that_is_collected_reads_unknown_never_blocks():
    step = multihost.watch(jax.jit(lambda x: x + 1), name='dropped')
    step(jnp.ones(3000))  # the output (larger than the recorder holds) is dropped at once
    gc.collect()
    assert _recorder.snapshot(0)[-1].state == 'unknown'


def test_a_small_last_output_tells_a_step_done_though_the_state_is_donated():
    """A step's ``(state, loss)``: the state donated to the next step, the loss dropped by
    the user (``float(loss)``): the loss, small, is held while the launch is recent."""
    step = multihost.watch(jax.jit(lambda s: (s * 2, s.sum()), donate_argnums=0), name='stepping')
    state = jnp.ones(3000)
    state, loss = step(state)
    float(loss)
    del loss
    gc.collect()
    assert _recorder.snapshot(0)[-1].state == 'done'
    before = state
    state, _ = step(state)  # donates the first step's state output
    assert before.is_deleted()
    state.block_until_ready()
    assert [r.state for r in _recorder.snapshot(0)] == ['done', 'done']


def test_the_recorder_keeps_the_last_2000_records():
    step = multihost.watch(jax.jit(lambda x: x), name='many', check=False)
    x = jnp.ones(1)
    for _ in range(_recorder.CAPACITY + 150):
        step(x)
    recs = _recorder.snapshot(0)
    assert len(recs) == _recorder.CAPACITY == 2000
    assert recs[0].call == 150 and recs[-1].call == 2149


def test_a_tracer_passes_through_unrecorded():
    inner = multihost.watch(jax.jit(lambda x: x * 3), name='inner')
    out = jax.jit(lambda x: inner(x) + 1)(jnp.ones(2))
    grads = jax.grad(lambda x: inner(x).sum())(jnp.ones(2))
    np.testing.assert_array_equal(np.asarray(out), [4.0, 4.0])
    np.testing.assert_array_equal(np.asarray(grads), [3.0, 3.0])
    assert _recorder.snapshot(0) == []


def test_errors_of_the_function_are_its_own_and_recorded_as_failed():
    @multihost.watch
    @jax.jit
    def bad(x):
        return x @ x  # a shape error for a 1-D x of the wrong kind

    with pytest.raises(TypeError):
        bad(jnp.ones((2, 3)))
    assert _recorder.snapshot(0)[-1].state == 'failed'


def test_a_non_callable_is_refused_clearly():
    with pytest.raises(TypeError, match='multihost.watch needs a callable'):
        multihost.watch(42)


def test_single_process_wavefront_and_records():
    step = multihost.watch(jax.jit(lambda x: x + 1), name='w')
    keep = step(jnp.ones(2))
    keep.block_until_ready()
    multihost.barrier('after')
    front = multihost.wavefront()
    assert front.hosts[0].last_launch.label == 'w call #0'
    assert front.hosts[0].last_collective.kind == 'barrier'
    # Nothing pending, no check waited at: the verdict says what the stack shows (the
    # asking line itself: the main thread asked).
    assert front.verdict.startswith('process 0 is running user code at test_watch_single.py:'), (
        front.verdict
    )
    assert front.verdict.endswith('in test_single_process_wavefront_and_records'), front.verdict
    records = multihost.flight_records(last=5)
    assert [r.kind for r in records[0]] == ['launch', 'barrier']


def test_a_group_site_says_whose_cell_when_the_hosts_numbers_differ():
    """Each engine numbers its own cells: a group of hosts names its first host's site and the
    others' (one site when all agree)."""
    from multihost._debug._watch import _group_site

    same = {0: 'Cell In[4], line 3', 1: 'Cell In[4], line 3'}
    assert _group_site(same) == 'Cell In[4], line 3'
    differ = {**same, 2: 'Cell In[5], line 3'}
    assert (
        _group_site(differ) == "Cell In[4], line 3 (process 0's; Cell In[5], line 3 on process 2)"
    )
