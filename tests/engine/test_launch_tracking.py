"""Launch completion through donation, run-ahead and failure, in one process (issue 46).

A slow launch (a loop of matmuls, seconds on CPU, dispatched asynchronously) holds the
device while the host runs ahead: the launches after it queue behind it. The recorder must
name the launch the device is in, not the newest one; tell a failed launch from a done one;
and date a queued launch from when its device could start it, not from its dispatch.
"""

from __future__ import annotations

import functools
import gc
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import pytest

import multihost
from multihost import _recorder
from multihost._debug import _wavefront

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
SLOW_SECONDS = 5.0  # how long the slow launch holds the device, on whatever machine runs this


@pytest.fixture(autouse=True)
def fresh_recorder():
    _recorder.reset()
    yield
    _recorder.reset()


def _work(s: jax.Array, iters: int) -> jax.Array:
    m = jnp.eye(s.shape[0], dtype=s.dtype) * 0.5

    def body(c):
        i, v = c
        return i + 1, v @ m + 0.5

    return jax.lax.while_loop(lambda c: c[0] < iters, body, (0, s))[1]


def _state() -> jax.Array:
    s = jnp.ones((512, 512), jnp.float32)
    return s.block_until_ready()


@functools.cache
def slow_iters(seconds: float = SLOW_SECONDS) -> int:
    """Iterations of `_work`'s loop that take about `seconds` here: timed, not guessed (600 took
    0.8 s on one 2-core machine and ended before a CI run could ask about it)."""
    timed = jax.jit(_work, static_argnums=1)
    timed(_state(), 40).block_until_ready()  # compiled outside the timing
    start = time.perf_counter()
    timed(_state(), 40).block_until_ready()
    per_iter = max((time.perf_counter() - start) / 40, 1e-6)
    return max(600, int(seconds / per_iter))


def _wait(x: jax.Array, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not x.is_ready():
        assert time.monotonic() < deadline, 'the slow launch did not end'
        time.sleep(0.05)


def test_a_run_ahead_with_donated_state_names_the_launch_the_device_is_in():
    """Step 0 runs, steps 1-3 queue behind it; each step's state is donated to the next and
    its loss dropped by the user: the wavefront names step 0, not step 3 (the only one whose
    output was still alive); step 1 has not started (no age yet), step 0's age counts."""

    @partial(jax.jit, static_argnums=1, donate_argnums=0)
    def train_step(s, iters):
        new = _work(s, iters)
        return new, new[0, 0]

    step = multihost.watch(train_step, name='train_step')
    for iters in (slow_iters(), 3 * slow_iters()):  # more work if the first ended too soon
        state = _state()
        step(state, 1)  # compiled for the fast steps first: their dispatch is then quick
        state, _ = step(_state(), 1)
        _recorder.reset()
        state, _ = step(state, iters)
        for _ in range(3):
            state, _ = step(state, 1)  # the loss dropped (a real loop: float(loss) after)
        del _
        gc.collect()
        front = _wavefront.front(0)
        records = _recorder.snapshot(0)
        awaited = _recorder.awaited_launch(0)
        if not state.is_ready():
            break
        _wait(state)
    assert not state.is_ready(), 'the slow launch ended before it could be asked about'
    assert front.pending is not None and front.pending.call == 0, front.doing
    assert front.pending_from is None
    assert front.doing.startswith('train_step call #0 not done on device'), front.doing
    assert [r.state for r in records] == ['launched'] * 4
    assert records[0].started == records[0].time
    assert records[1].started is None  # queued behind call #0: not started
    assert awaited.call == 0  # the hang watchdog's: the running one
    _wait(state)
    records = _recorder.snapshot(0)
    assert [r.state for r in records] == ['done'] * 4
    assert all(r.started is not None for r in records)
    assert records[1].started >= records[0].time


def test_when_every_output_is_gone_the_wavefront_says_somewhere_in_calls():
    """A step whose only output (the state, too large to hold) is donated to the next: the
    launches before the newest cannot be told done or not: "somewhere in calls #0..#3"."""

    @partial(jax.jit, static_argnums=1, donate_argnums=0)
    def train_step(s, iters):
        return _work(s, iters)

    step = multihost.watch(train_step, name='train_step')
    for iters in (slow_iters(), 3 * slow_iters()):  # more work if the first ended too soon
        state = step(_state(), 1)
        _recorder.reset()
        state = step(state, iters)
        for _ in range(3):
            state = step(state, 1)
        front = _wavefront.front(0)
        if not state.is_ready():
            break
        _wait(state)
    assert not state.is_ready(), 'the slow launch ended before it could be asked about'
    assert front.pending is not None and front.pending.call == 3
    assert front.pending_from is not None and front.pending_from.call == 0
    assert front.doing.startswith('somewhere in train_step calls #0..#3 not done on device')
    _wait(state)
    # Then in-order completion: call #3 done says #0..#2 are done too.
    assert [r.state for r in _recorder.snapshot(0)] == ['done'] * 4


def test_a_launch_that_fails_on_the_device_reads_failed():
    """A launch whose program raises on the device (a host callback inside it, queued behind a
    slow launch so its dispatch returns first; on jax 0.12.1's CPU the dispatch itself raises)
    reads 'failed' once it ends, not 'done'; the host is not waiting in it. In a process of
    its own: JAX keeps the error's runtime token and reports it again at exit."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, os.path.join(HERE, '_failing_launch.py')],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{')]
    assert lines, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    got = json.loads(lines[-1])
    if got['at_dispatch']:  # jax 0.12.1 on CPU: the call raised, its launch failed at once
        assert got['while_running'] == ['done', 'failed'], got
    else:
        assert got['while_running'] == ['launched', 'launched'], got
    assert got['after'] == ['done', 'failed'], got
    assert got['awaited'] is None and got['pending'] is None, got
    assert got['last_launch'] == 'failed' and 'a bad value on the device' in got['raised'], got
