"""replay on 3 real processes x 2 devices: why the hosts' replicas of one launch part.

A data-parallel step (parameters replicated, the batch sharded over processes): a
host-dependent `jax.pure_callback` inside it stands in for a faulty chip, named by its line;
a host fed another batch is named at the inputs; a clean step agrees everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import source_line
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost

try:
    from jax import shard_map
except ImportError:  # jax < 0.8
    from jax.experimental.shard_map import shard_map  # type: ignore[no-redef]

MP_CLUSTER = dict(n=3, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ('data',))


def _state_and_batch(mesh: Mesh, shift: float = 0.0):
    params = jax.device_put(
        {'w': jnp.linspace(-1.0, 1.0, 24, dtype=jnp.float32).reshape(8, 3), 'b': jnp.zeros(3)},
        NamedSharding(mesh, P()),
    )
    rows = np.arange(12 * 8, dtype=np.float32).reshape(12, 8) / 100.0
    sharding = NamedSharding(mesh, P('data'))
    batch = jax.make_array_from_callback(rows.shape, sharding, lambda i: rows[i] + shift)
    return params, batch


def _wobble(h: np.ndarray) -> np.ndarray:
    """Process 2's 'chip' adds 1e-3 to what it computes: a host-dependent result."""
    return np.asarray(h) + np.float32(1e-3 if jax.process_index() == 2 else 0.0)


def _on_every_device(g):
    """The callback on each device's own copy (a faulty chip computes on its own)."""
    return jax.pure_callback(_wobble, jax.ShapeDtypeStruct(g.shape, g.dtype), g)


def faulty_step(params, batch):
    h = jnp.tanh(batch @ params['w'] + params['b'])
    loss = jnp.mean(h**2)
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(batch @ w) ** 2))(params['w'])
    g = shard_map(_on_every_device, mesh=_mesh(), in_specs=P(), out_specs=P())(g)  # the fault
    return {'w': params['w'] - 0.1 * g, 'b': params['b']}, loss


def _labelled(h: np.ndarray) -> np.ndarray:
    return np.asarray(h) * np.float32(1.0)


def clean_step(params, batch):
    h = jnp.tanh(batch @ params['w'] + params['b'])
    h = jax.pure_callback(_labelled, jax.ShapeDtypeStruct(h.shape, h.dtype), h)  # on device 0
    loss = jnp.mean(h**2)
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(batch @ w) ** 2))(params['w'])
    return {'w': params['w'] - 0.1 * g, 'b': params['b']}, loss


@multiprocess
def test_a_host_dependent_operation_is_named_by_its_line_and_host():
    mesh = _mesh()
    params, batch = _state_and_batch(mesh)
    step = jax.jit(faulty_step, donate_argnums=0)
    report = multihost.replay(step, params, batch, timeout=120)

    assert report.verdict == 'operation', report.describe()
    assert report.inputs is not None and report.inputs.ok
    assert report.varying == {}  # every host repeats itself
    first = report.first
    assert first is not None and first.primitive == 'shard_map', report.describe()
    line = source_line(faulty_step, 'g = shard_map(')
    assert first.where == f'test_replay_multiprocess.py:{line} in faulty_step', first
    assert first.outputs == ('f32[8,3]',)
    assert report.difference is not None and report.difference.odd_processes == (2,)
    assert report.difference.max_abs_diff[2] == pytest.approx(1e-3, rel=1e-3)
    assert first.index < report.total_equations and report.equations > first.index
    assert all(e.index < first.index for e in report.fed_by) and report.fed_by
    text = str(report)
    assert 'first operation whose outputs differ between hosts' in text
    assert f'shard_map -> f32[8,3] at test_replay_multiprocess.py:{line}' in text
    # the user's arguments are untouched (the step donates: replay runs it on copies)
    assert not params['w'].is_deleted()
    # every host holds the same verdict
    got = multihost.process_allgather(np.frombuffer(text.encode(), np.uint8))
    assert all((row == got[0]).all() for row in got)


@multiprocess
def test_a_host_fed_another_batch_is_named_at_the_inputs():
    mesh = _mesh()
    params, _ = _state_and_batch(mesh)
    batch = np.arange(16, dtype=np.float32).reshape(2, 8) / 10.0
    if jax.process_index() == 1:
        batch = batch + np.float32(0.5)  # this host reads another batch
    report = multihost.replay(jax.jit(clean_step), params, batch, timeout=120)
    assert report.verdict == 'inputs', report.describe()
    # named as the step names its arguments
    assert report.inputs is not None and report.inputs.differing_paths == ("['batch']",)
    assert report.inputs.leaves[0].odd_processes == (1,)
    assert "inputs differ between hosts: ['batch']" in str(report)
    assert report.first is None and report.runs == 0  # it stopped there

    # canonical=True: process 0's host-local batch everywhere, then the hosts agree
    again = multihost.replay(jax.jit(clean_step), params, batch, canonical=True, timeout=120)
    assert again.verdict == 'agree', again.describe()
    assert again.canonical and "set to process 0's" in str(again)


@multiprocess
def test_a_clean_step_agrees_at_every_equation():
    mesh = _mesh()
    params, batch = _state_and_batch(mesh)
    report = multihost.replay(jax.jit(clean_step), params, batch, timeout=120)
    assert report.verdict == 'agree', report.describe()
    assert report.ok and report.runs == 2
    assert report.equations == report.total_equations > 20
    assert f'{report.equations} equations op by op' in str(report)


@multiprocess
def test_the_report_reads_as_a_verdict():
    mesh = _mesh()
    params, batch = _state_and_batch(mesh)
    report = multihost.replay(jax.jit(faulty_step), params, batch, timeout=120)
    lines = str(report).splitlines()
    assert lines[0] == 'replay of faulty_step on 3 processes:'
    assert lines[1] == '  first operation whose outputs differ between hosts:'
    assert lines[2].startswith('    #') and ' shard_map -> f32[8,3] at ' in lines[2]
    assert lines[3].startswith('    ') and 'on process 2' in lines[3], lines
    assert lines[4].startswith('    its inputs agreed (made by #'), lines


def broken_step(params, batch):
    if jax.process_index() == 1:
        raise ValueError('this host cannot trace the step')
    return clean_step(params, batch)


@multiprocess
def test_a_host_that_cannot_replay_fails_every_host_at_once():
    import time

    mesh = _mesh()
    params, batch = _state_and_batch(mesh)
    t0 = time.monotonic()
    with pytest.raises(multihost.HostFailedError, match='this host cannot trace the step') as e:
        multihost.replay(broken_step, params, batch, timeout=60)
    assert set(e.value.reasons) == {1}
    assert time.monotonic() - t0 < 45  # at its next comparison, not at a timeout


def _wobble_at(h: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Process 2's 'chip' is wrong at layer 2 only."""
    wrong = jax.process_index() == 2 and int(i) == 2
    return np.asarray(h) + np.float32(1e-3 if wrong else 0.0)


def scanned_step(params, batch):
    """Four 'layers' in a scan; the chip's fault is inside its body, at iteration 2."""

    def layer(c, i):
        c = jnp.tanh(c * 1.5 + 0.1)
        shape = jax.ShapeDtypeStruct(c.shape, c.dtype)
        on_device = lambda v, k: jax.pure_callback(_wobble_at, shape, v, k)  # noqa: E731
        c = shard_map(on_device, mesh=_mesh(), in_specs=(P(), P()), out_specs=P())(c, i)
        return c, jnp.sum(c)

    out, sums = jax.lax.scan(layer, params['w'], jnp.arange(4))
    return out, sums + jnp.sum(batch)


@multiprocess
def test_a_fault_inside_a_scan_is_named_at_its_iteration():
    mesh = _mesh()
    params, batch = _state_and_batch(mesh)
    report = multihost.replay(jax.jit(scanned_step), params, batch, timeout=120)
    assert report.verdict == 'operation', report.describe()
    first = report.first
    assert first is not None and first.primitive == 'shard_map', report.describe()
    assert first.scope.endswith('scan[2]'), first.scope  # the layer, not the whole scan
    line = source_line(scanned_step, 'c = shard_map(')
    assert first.where == f'test_replay_multiprocess.py:{line} in scanned_step.<locals>.layer'
    assert report.difference is not None and report.difference.odd_processes == (2,)
    # iterations 0-1 agreed before it, every scanned equation counted
    assert any('scan[1]' in e.scope for e in report.before), report.before
    assert report.total_equations > 4 * 3
    clean = multihost.replay(jax.jit(clean_step), params, batch, timeout=120)
    assert clean.ok


def local_step(w, x):
    """A host-local step (each process its own device 0): a small output on process 2 is off."""
    h = jnp.tanh(x @ w)
    h = jax.pure_callback(_wobble, jax.ShapeDtypeStruct(h.shape, h.dtype), h)
    return jnp.sum(h * h)


@multiprocess
def test_small_outputs_compared_from_host_copies_name_the_operation():
    """Under the device fingerprint (as on an accelerator), outputs of at most
    `SMALL_BYTES` are compared from host copies (no packing program per chunk); hosts still
    agree on a clean step and name the first small output that parts."""
    import os

    from multihost._checks import _replay

    os.environ['MULTIHOST_FINGERPRINT'] = 'device'  # this process's only (the cluster's own)
    try:
        dev = jax.local_devices()[0]
        w = jax.device_put(jnp.linspace(-1.0, 1.0, 24, dtype=jnp.float32).reshape(8, 3), dev)
        x = jax.device_put(np.arange(32, dtype=np.float32).reshape(4, 8) / 50.0, dev)
        assert _replay.SMALL_BYTES >= x.nbytes
        report = multihost.replay(jax.jit(local_step), w, x, timeout=120)
        clean_fn = jax.jit(lambda w, x: jnp.sum(jnp.tanh(x @ w)))
        clean = multihost.replay(clean_fn, w, x, timeout=120)
    finally:
        del os.environ['MULTIHOST_FINGERPRINT']
    assert report.verdict == 'operation', report.describe()
    assert report.first is not None and report.first.primitive == 'pure_callback'
    line = source_line(local_step, 'h = jax.pure_callback(')
    assert report.first.where == f'test_replay_multiprocess.py:{line} in local_step'
    assert report.difference is not None and report.difference.odd_processes == (2,)
    assert clean.ok, clean.describe()


def test_only_small_outputs_the_device_would_fingerprint_are_copied(monkeypatch):
    from multihost._checks import _replay

    small = jnp.ones((4, 3), jnp.float32)
    big = jnp.ones((_replay.SMALL_BYTES // 4 + 1,), jnp.float32)
    monkeypatch.setenv('MULTIHOST_FINGERPRINT', 'device')
    got = _replay._on_host([[small, 7], [big]])
    assert type(got[0][0]) is np.ndarray and (got[0][0] == 1).all() and got[0][1] == 7
    assert got[1][0] is big  # fingerprinted where it lives
    monkeypatch.setenv('MULTIHOST_FINGERPRINT', 'auto')  # a CPU's arrays: read in place anyway
    assert _replay._on_host([[small]])[0][0] is small
