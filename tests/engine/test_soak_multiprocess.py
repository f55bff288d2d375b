"""Days, not minutes, at a small N (issue 33): checked barriers leave process 0 flat.

Process 0 hosts JAX's coordination service, which keeps every barrier id it has
seen (about 0.9 KB each); the checked barriers are made of keys that go with
their round, so 3,000 of them (after a warm-up that fills the flight recorder's
bounded ring) must not grow process 0 by the 2.7 MB a new id per call would.
The full-size figures (15,000 calls, side by side with JAX's barrier) are
``bench/soak.py``'s, in docs/SCALE.md.
"""

from __future__ import annotations

import time

import jax
import pytest

import multihost
from multihost import _recorder

pytestmark = pytest.mark.release  # checked on the release rotation (CONTRIBUTING.md)

MP_CLUSTER = dict(n=4, devices_per_process=1)
CALLS = 3000
#: Process 0's growth allowed for CALLS checked barriers (a new service barrier id per
#: call would be ~2.7 MB; the measured figure is ~0.07 KB per call, ~0.2 MB).
BOUND_KB = 1200


def _rss_kb() -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    raise RuntimeError('no VmRSS')


@pytest.mark.slow
@pytest.mark.multiprocess(timeout=240)  # ~25 s alone; 60 s beside a heavy test (2 workers)
def test_3000_checked_barriers_leave_process_0_flat():
    for _ in range(_recorder.CAPACITY + 100):  # the recorder's ring fills first, by design
        multihost.sync_global_devices('soak')
    multihost.sync_global_devices('soak: measure')
    time.sleep(0.2)
    before = _rss_kb()
    for _ in range(CALLS):
        multihost.sync_global_devices('soak')
    multihost.sync_global_devices('soak: done')
    time.sleep(0.2)
    grown = _rss_kb() - before
    if jax.process_index() == 0:
        assert grown <= BOUND_KB, f'process 0 grew {grown} KB over {CALLS} checked barriers'
    assert len(_recorder.snapshot(jax.process_index())) <= _recorder.CAPACITY
