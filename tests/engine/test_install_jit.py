"""The installed jit (`multihost._job._jit`): JAX's behaviour, every launch recorded, check_jit.

Single-process tests run in the pytest process (4 CPU devices); the
``multiprocess`` ones in each of 4 real JAX processes x 2 devices.
"""

from __future__ import annotations

import functools
import inspect
import os
import pickle
import re
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import flat_mesh, source_line
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost import _recorder
from multihost._exchange import _sequence
from multihost._job import _jit
from multihost._job._options import InstallOptions as Options

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess
#: JAX's jit, out of the patcher's reach (it replaces module globals that are the original).
JAX = types.SimpleNamespace(jit=jax.jit)


@pytest.fixture
def installed() -> Iterator[None]:
    _recorder.reset()
    _jit.patch(Options())
    try:
        yield
    finally:
        _jit.unpatch()
        _recorder.reset()
    assert jax.jit is JAX.jit


def test_checked_launches_wait_as_installed_calls_do(monkeypatch):
    """check_jit's check waits like an installed call: forever (logging) unless a timeout is
    asked for, by install(timeout=...) or MULTIHOST_TIMEOUT in the environment."""
    monkeypatch.delenv('MULTIHOST_TIMEOUT', raising=False)
    for options, wait in (
        (Options(check_jit=True), float('inf')),
        (Options(check_jit=True, timeout=7.0), 7.0),
    ):
        _jit.patch(options)
        try:
            assert _jit._state.wait == wait, options
        finally:
            _jit.unpatch()
    monkeypatch.setenv('MULTIHOST_TIMEOUT', '9')  # read once, by install's resolve
    _jit.patch(Options.resolve({'check_jit': True}))
    try:
        assert _jit._state.wait == 9.0
    finally:
        _jit.unpatch()


def _launches() -> list[_recorder.FlightRecord]:
    return [r for r in _recorder.snapshot(jax.process_index()) if r.kind == 'launch']


def _module(name: str, source: str) -> types.ModuleType:
    """A module made from ``source`` and imported (in `sys.modules`), as a library would be."""
    module = types.ModuleType(name)
    module.__file__ = f'/libs/{name}.py'
    sys.modules[name] = module
    exec(compile(source, module.__file__, 'exec'), module.__dict__)
    return module


# -- behaviour: that of JAX's jitted function ------------------------------------------


def _scale(x: jax.Array, k: Any) -> jax.Array:
    """Doc of scale."""
    return x * k


def test_results_stages_and_attributes_are_jax_s(installed):
    raw = JAX.jit(_scale)
    ours = jax.jit(_scale)
    assert isinstance(ours, _jit.Jitted) and not isinstance(raw, _jit.Jitted)
    x = jnp.arange(6.0)
    np.testing.assert_array_equal(ours(x, 3.0), raw(x, 3.0))
    assert ours.lower(x, 3.0).as_text() == raw.lower(x, 3.0).as_text()
    assert str(ours.trace(x, 3.0).jaxpr) == str(raw.trace(x, 3.0).jaxpr)
    assert ours.eval_shape(x, 3.0) == raw.eval_shape(x, 3.0)
    assert ours.__wrapped__ is _scale and ours.__name__ == '_scale'
    assert ours.__qualname__ == raw.__qualname__ and ours.__doc__ == raw.__doc__
    assert ours.__module__ == raw.__module__
    assert inspect.signature(ours) == inspect.signature(raw)
    assert (
        ours._jit_info is ours._multihost_unrecorded._jit_info
    )  # JAX's attributes, read by libraries
    assert re.sub('0x[0-9a-f]+', '', repr(ours)) == re.sub('0x[0-9a-f]+', '', repr(raw))
    assert isinstance(ours, jax.stages.Wrapped)
    ours.clear_cache()
    assert ours._cache_size() == 0
    ours(x, 3.0)
    assert ours._cache_size() == 1


def test_static_arguments_and_every_decorator_form(installed):
    @functools.partial(jax.jit, static_argnums=1)
    def power(x, n):
        return x**n

    @jax.jit(static_argnames='mode')
    def pick(x, mode):
        return x * 2 if mode == 'double' else x

    @jax.jit
    def plain(x):
        return x - 1

    both = jax.jit(lambda x, n: x + n, static_argnums=(1,))
    for f in (power, pick, plain, both):
        assert isinstance(f, _jit.Jitted), f
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(power(x, 3), x**3)
    np.testing.assert_array_equal(pick(x, mode='double'), x * 2)
    np.testing.assert_array_equal(pick(x, mode='same'), x)
    np.testing.assert_array_equal(plain(x), x - 1)
    np.testing.assert_array_equal(both(x, 2), x + 2)
    assert power._cache_size() == 1 and pick._cache_size() == 2
    with pytest.raises(ValueError, match='Non-hashable static arguments'):
        power(x, [1])  # JAX's own error, unchanged


def test_methods_bind_as_jax_s_do(installed):
    class Model:
        factor = 3.0

        @functools.partial(jax.jit, static_argnums=0)
        def apply(self, x):
            return x * self.factor

    m = Model()
    assert isinstance(Model.__dict__['apply'], _jit.Jitted)
    assert Model.apply is Model.__dict__['apply']
    np.testing.assert_array_equal(m.apply(jnp.ones(2)), np.full(2, 3.0))
    assert repr(m.apply).startswith('<bound method') and 'Model.apply' in repr(m.apply)


def _pickle_error(fn: Any) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        pickle.dumps(fn)
    return type(info.value), re.sub('0x[0-9a-f]+', '0x', str(info.value))


def test_pickling_fails_exactly_as_jax_s_does(installed):
    source = (
        'import jax\n@jax.jit\ndef g(x):\n    return x + 1\n'
        'def h(x):\n    return x\nhj = jax.jit(h)\n'
    )
    ours = _module('jitted_lib_ours', source)
    assert isinstance(ours.g, _jit.Jitted)
    _jit.unpatch()
    try:
        raw = _module('jitted_lib_ours', source)  # the same module name, jitted by JAX
        raw_errors = [_pickle_error(raw.g), _pickle_error(raw.hj)]
    finally:
        _jit.patch(Options())
    sys.modules['jitted_lib_ours'] = ours
    try:
        assert [_pickle_error(ours.g), _pickle_error(ours.hj)] == raw_errors
    finally:
        del sys.modules['jitted_lib_ours']


def _donation_warnings(jit: Any) -> tuple[list[tuple[Any, ...]], bool]:
    """(the warnings of a call donating an unusable and a usable buffer, whether x was deleted)."""
    unusable = jit(lambda x: jnp.sum(x), donate_argnums=0)
    usable = jit(lambda x: x * 2, donate_argnums=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        unusable(jnp.ones(8))
        x = jnp.ones(8)
        usable(x).block_until_ready()
    return [(w.category, str(w.message), w.filename, w.lineno) for w in caught], x.is_deleted()


def test_donation_and_its_warnings_are_jax_s(installed):
    ours = _donation_warnings(jax.jit)
    raw = _donation_warnings(JAX.jit)
    assert ours == raw
    assert any('donated buffers were not usable' in w[1] for w in raw[0])


def test_errors_are_jax_s_and_the_launch_reads_failed(installed):
    bad = jax.jit(lambda x: x @ x)
    with pytest.raises(TypeError) as ours:
        bad(jnp.ones((2, 3)))
    with pytest.raises(TypeError) as raw:
        JAX.jit(lambda x: x @ x)(jnp.ones((2, 3)))
    assert str(ours.value) == str(raw.value)
    assert _launches()[-1].state == 'failed'


# -- records ----------------------------------------------------------------------------


def test_every_launch_is_recorded_with_name_site_and_devices(installed):
    @jax.jit
    def train_step(x, lr):
        return x * lr

    x = jnp.ones(4)
    for k in range(3):
        out = train_step(x, 0.5 + k)
    out.block_until_ready()
    recs = _launches()
    assert [(r.kind, r.name, r.call) for r in recs] == [
        ('launch', 'train_step', k) for k in range(3)
    ]
    line = source_line(test_every_launch_is_recorded_with_name_site_and_devices, 'out = train')
    assert {r.site for r in recs} == {f'{__file__}:{line}'}
    assert all(r.spans is False for r in recs)  # one process: its own devices only
    assert recs[-1].state == 'done' and recs[-1].seq is None and not recs[-1].digest
    # The same records through the public surface.
    public = multihost.flight_records()[jax.process_index()]
    assert [r.name for r in public if r.kind == 'launch'] == ['train_step'] * 3


def test_the_site_is_the_first_frame_outside_jax(installed):
    lib = _module('a_training_lib', 'def run(step, x):\n    return step(x)\n')
    step = jax.jit(lambda x: x + 1)
    lib.run(step, jnp.ones(2))
    assert _launches()[-1].site == '/libs/a_training_lib.py:2'
    with _sequence.called_from('cell 7:3'):  # a notebook cell's site wins, as for collectives
        step(jnp.ones(2))
    assert _launches()[-1].site == 'cell 7:3'


def test_typed_key_outputs_are_asked_through_their_data(installed):
    split = jax.jit(lambda k: jax.random.split(k))
    keys = split(jax.random.key(0))
    jax.block_until_ready(keys)
    assert _launches()[-1].state == 'done'


def test_calls_being_traced_and_eager_operations_are_not_launches(installed):
    inner = jax.jit(lambda x: x * 2)
    outer = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, c: inner(c), x))
    x = jnp.ones(3)
    np.testing.assert_array_equal(outer(x), x * 8)
    jax.grad(lambda x: inner(x).sum())(x)
    jax.vmap(inner)(jnp.ones((2, 3)))
    jax.lax.scan(lambda c, _: (inner(c), None), x, None, length=2)
    no_args = jax.jit(lambda: jnp.ones(3))
    jax.jit(lambda x: x + no_args())(x)  # no tracer among its arguments, still traced
    with jax.disable_jit():
        inner(x)  # runs op by op: no launch
    _ = jnp.sin(x) + x * 3  # eager operations
    assert [r.name for r in _launches()] == ['<lambda>'] * 2  # outer, then the last jit


def test_functions_jax_or_the_toolkit_jit_themselves_are_left_alone(installed):
    toolkit = os.path.join(os.path.dirname(multihost.__file__), '_not_a_module.py')
    namespace: dict[str, Any] = {'jax': jax}
    exec(compile('f = jax.jit(lambda x: x)', toolkit, 'exec'), namespace)
    assert not isinstance(namespace['f'], _jit.Jitted)
    namespace['f'](jnp.ones(2))
    assert _launches() == []


def test_a_watched_installed_function_is_recorded_once(installed):
    step = multihost.watch(jax.jit(lambda x: x + 1), name='watched', check=False)
    step(jnp.ones(2))
    assert [r.name for r in _launches()] == ['watched']


# -- patch / unpatch ------------------------------------------------------------------


def test_references_taken_by_name_are_replaced_and_put_back():
    _recorder.reset()
    before = _module('imported_before', 'from jax import jit\nmy_jit = jit\n')
    assert before.jit is JAX.jit
    _jit.patch(Options())
    try:
        assert jax.jit is not JAX.jit and before.jit is jax.jit and before.my_jit is jax.jit
        during = _module('imported_during', 'from jax import jit\n')
        assert during.jit is jax.jit
        kept = before.jit(lambda x: x + 1)
        kept(jnp.ones(2))
        assert len(_launches()) == 1
    finally:
        _jit.unpatch()
        del sys.modules['imported_before'], sys.modules['imported_during']
    assert jax.jit is JAX.jit
    assert before.jit is JAX.jit and before.my_jit is JAX.jit
    assert during.jit is JAX.jit
    np.testing.assert_array_equal(kept(jnp.ones(2)), np.full(2, 2.0))  # still works
    assert len(_launches()) == 1  # ... and no longer records
    _recorder.reset()


def _pjit_original() -> Any:
    from jax._src import pjit as pjit_impl  # what jax.experimental.pjit serves

    return pjit_impl.pjit


def test_pjit_is_patched_with_its_deprecation_warning_and_restored():
    import jax.experimental.pjit as pjit_module

    original = _pjit_original()
    before = _module('pjit_user', 'from jax._src.pjit import pjit\n')
    _jit.patch(Options())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            served = pjit_module.pjit
        assert served is not original and served.__wrapped__ is original
        assert [w.category for w in caught] == [DeprecationWarning]
        assert before.pjit is served
        assert isinstance(served(lambda x: x * 2), _jit.Jitted)
    finally:
        _jit.unpatch()
        del sys.modules['pjit_user']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert pjit_module.pjit is original
    assert before.pjit is original


def test_patching_twice_only_takes_the_new_options():
    _jit.patch(Options())
    first = jax.jit
    try:
        _jit.patch(Options(check_jit=True))
        assert jax.jit is first and _jit._CHECK
    finally:
        _jit.unpatch()
    assert jax.jit is JAX.jit and not _jit._CHECK
    _jit.unpatch()  # twice: nothing to do


# -- several processes ------------------------------------------------------------------


def _global(rows: int, cols: int = 4) -> jax.Array:
    """A batch built the way training scripts build one: each process's local rows."""
    sharding = NamedSharding(flat_mesh(), P('x'))
    local = np.ones((rows, cols), np.float32) * (jax.process_index() + 1)
    return jax.make_array_from_process_local_data(sharding, local)


@multiprocess
def test_launches_record_whether_they_span_processes():
    _recorder.reset()
    _jit.patch(Options())
    try:
        step = jax.jit(lambda b: b * 2)
        local = jax.jit(lambda x: x + 1)
        step(_global(4)).block_until_ready()
        local(jnp.ones(3)).block_until_ready()
        spans = [(r.name, r.spans, r.seq) for r in _launches()]
        assert spans == [('<lambda>', True, None), ('<lambda>', False, None)], spans
    finally:
        _jit.unpatch()
        _recorder.reset()


@multiprocess
def test_check_jit_checks_spanning_launches_only():
    pid = jax.process_index()
    _recorder.reset()
    _jit.patch(Options(check_jit=True))
    try:

        @jax.jit
        def train_step(w, batch):
            return jnp.mean(batch @ w)

        @jax.jit
        def local_stats(x):
            return x.sum()

        w = jnp.ones((4, 2))
        loss = train_step(w, _global(4))
        loss.block_until_ready()
        seq_before = len(_sequence.history())
        stats = local_stats(jnp.ones(5 if pid == 1 else 3))  # hosts differ, nothing spans
        stats.block_until_ready()
        assert len(_sequence.history()) == seq_before  # ... so no check: no collective
        with pytest.raises(multihost.CollectiveMismatchError) as info:
            train_step(w, _global(6 if pid == 2 else 4))  # host 2 feeds a batch of another shape
        text = str(info.value)
        assert 'train_step has different inputs on process 2' in text, text
        assert 'caught before launch' in text
        recs = _launches()
        assert [(r.name, r.spans, r.seq is not None, r.state) for r in recs] == [
            ('train_step', True, True, 'done'),
            ('local_stats', False, False, 'done'),
            ('train_step', True, True, 'failed'),
        ], recs
        assert recs[0].digest and recs[0].fingerprint  # watch's signature and program
        multihost.barrier('aligned after check_jit')
    finally:
        _jit.unpatch()
        _recorder.reset()
