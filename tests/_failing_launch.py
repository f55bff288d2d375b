"""A launch that fails on the device, recorded (test_launch_tracking): prints one JSON line.

A slow launch runs; a launch whose host callback raises is queued behind it (its dispatch
returns at once). What the recorder and the wavefront say while both run and after.
"""

import json
import os
import sys
import time

import jax

# the test module that runs this script, in tests/engine/ (this script is in tests/)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'engine'))
from test_launch_tracking import _state, _wait, _work, slow_iters  # noqa: E402

import multihost  # noqa: E402
from multihost import _recorder  # noqa: E402
from multihost._debug import _wavefront  # noqa: E402


def broken(v):
    raise ValueError('a bad value on the device')


@jax.jit
def check(v):
    return jax.pure_callback(broken, jax.ShapeDtypeStruct(v.shape, v.dtype), v) + 1


def main():
    slow = multihost.watch(jax.jit(_work, static_argnums=1), name='slow')
    checked = multihost.watch(check, name='check')
    out = slow(_state(), slow_iters())
    try:
        bad = checked(out)  # returns at once: it waits for `out` on the device
    except Exception as exc:  # jax 0.12.1 on CPU: the dispatch runs the callback, and raises
        bad, at_dispatch = None, str(exc)
    else:
        at_dispatch = ''
    running = [r.state for r in _recorder.snapshot(0)]
    _wait(out)
    deadline = time.monotonic() + 60
    while bad is not None and not bad.is_ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    after = [r.state for r in _recorder.snapshot(0)]
    awaited = _recorder.awaited_launch(0)
    front = _wavefront.front(0)
    try:
        if bad is not None:
            bad.block_until_ready()
        raised = at_dispatch
    except Exception as exc:
        raised = str(exc)
    got = {
        'at_dispatch': bool(at_dispatch),
        'while_running': running,
        'after': after,
        'awaited': None if awaited is None else awaited.label,
        'pending': None if front.pending is None else front.pending.label,
        'last_launch': front.last_launch.state if front.last_launch else None,
        'raised': raised[:2000],
    }
    print(json.dumps(got), flush=True)


if __name__ == '__main__':
    main()
