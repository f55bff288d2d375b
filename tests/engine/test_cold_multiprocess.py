"""A cold host whose first collective differs: every host names every host's call (issue 19, 4).

Real `jax.distributed` processes (4 x 2 CPU devices) whose JAX backend is cold:
`jax.distributed.initialize` ran, no JAX operation yet. Starting a backend there
waits for every other host's backend, so a host that starts it before its
collective's sequence check waits forever when the others are in another
collective (they time out saying it "reached no collective yet"). Here process
2's first call differs from the others' ``sync_global_devices('ckpt')``: every
host raises the same `CollectiveMismatchError` at once, naming what each host
called and where, no backend starts, and the next collective lines up.

Every test leaves every host's backend cold (that is what they check), so they
share the module's cold cluster; each ends with a barrier every host reaches
before it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import multihost
from multihost import _jax_adapter
from multihost._core import _collectives
from multihost._exchange import _kv

MP_CLUSTER = dict(n=4, devices_per_process=2, init_backend=False)
#: The others' barrier timeout: a host stuck in backend start shows as a timeout after it.
TIMEOUT = 15.0
HERE = os.path.abspath(__file__)


def _double(x: jax.Array) -> jax.Array:
    return x * 2


#: Over `SMALL_EXCHANGE_BYTES` with 4 hosts: the device path (check first, then devices).
_LARGE = np.zeros(_collectives.SMALL_EXCHANGE_BYTES // 8, np.float32)

#: What process 2 calls first -> (the call, how its record describes it).
CALLS = {
    'process_allgather': (
        lambda: multihost.process_allgather(np.arange(3, dtype=np.float32)),
        "process_allgather('tiled=False')",
    ),
    'process_allgather large': (
        lambda: multihost.process_allgather(_LARGE, tiled=True),
        "process_allgather('tiled=True')",
    ),
    'broadcast_one_to_all': (
        lambda: multihost.broadcast_one_to_all({'step': np.int32(7)}),
        'broadcast_one_to_all',
    ),
    'broadcast_one_to_all large': (
        lambda: multihost.broadcast_one_to_all(_LARGE),
        'broadcast_one_to_all',
    ),
    'assert_equal': (lambda: multihost.assert_equal(np.arange(3)), 'assert_equal'),
    'watched launch': (
        lambda: multihost.watch(jax.jit(_double))(np.ones(4, np.float32)),
        "launch('_double')",
    ),
}


def _first_collective_differs(what: str) -> dict:
    """Process 2 calls ``CALLS[what]`` first; the others ``sync_global_devices('ckpt')``."""
    pid = _kv.process_index()
    out: dict = dict(cold_before=not _jax_adapter.backends_started(), error=None)
    t0 = time.monotonic()
    try:
        if pid == 2:
            CALLS[what][0]()
        else:
            multihost.sync_global_devices('ckpt', timeout=TIMEOUT)
    except multihost.CollectiveMismatchError as exc:
        out.update(
            error=type(exc).__name__,
            text=str(exc),
            seq=exc.seq,
            calls={p: (c.kind, c.name) for p, c in exc.calls.items()},
        )
    except Exception as exc:  # anything else is a failure the test reports
        out.update(error=type(exc).__name__, text=str(exc))
    out['elapsed'] = time.monotonic() - t0
    out['cold_after'] = not _jax_adapter.backends_started()
    # Every host reaches the next collective (aligned again) before anyone reports.
    multihost.barrier(f'reported {what}', timeout=TIMEOUT)
    out['cold_at_end'] = not _jax_adapter.backends_started()
    return out


@pytest.mark.parametrize('what', list(CALLS))
def test_every_cold_host_names_every_hosts_first_call(mp_cluster, what):
    """Same error on every host at once, each host's call and site in it; no backend started."""
    results = mp_cluster.run(_first_collective_differs, what, timeout=3 * TIMEOUT, bracket=False)
    described = CALLS[what][1]
    texts = set()
    for pid, r in enumerate(results):
        assert r['error'] == 'CollectiveMismatchError', (pid, r)
        assert r['cold_before'] and r['cold_after'] and r['cold_at_end'], (pid, r)
        assert r['elapsed'] < TIMEOUT / 2, (pid, r)  # the verdict, not a timeout
        assert 'processes called different collectives' in r['text'], r['text']
        # Hosts with the same call are one line (ranges): bounded at any number of hosts.
        assert f'\n  process 2: {described} at {HERE}:' in r['text'], (pid, r['text'])
        assert f"\n  processes 0-1, 3: barrier('ckpt') at {HERE}:" in r['text'], r['text']
        assert r['calls'][2][0] == described.split('(')[0], r['calls']
        assert {r['calls'][p] for p in (0, 1, 3)} == {('barrier', 'ckpt')}, r['calls']
        # One verdict: every host's message lists the same calls (its first line
        # may keep JAX's "sync_global_devices name mismatch" wording).
        texts.add(r['text'].split('\n', 1)[1])
    assert len(texts) == 1, texts
    assert len({r['seq'] for r in results}) == 1, results


# -- launched as a scheduler launches a job: the processes exit after the error ----------

_SCRIPT = """
import json, os, sys
import jax
import numpy as np

jax.config.update('jax_platforms', 'cpu')
jax.config.update('jax_num_cpu_devices', 2)
jax.distributed.initialize(
    coordinator_address=os.environ['COORDINATOR'],
    num_processes=int(os.environ['NUM_PROCESSES']),
    process_id=int(os.environ['PROCESS_ID']),
    initialization_timeout=60,
)
import multihost

pid = int(os.environ['PROCESS_ID'])  # jax.process_index() would start the backend
try:
    if pid == 2:
        multihost.process_allgather(np.arange(3))
    else:
        multihost.sync_global_devices('ckpt', timeout=20)
    out = {'error': None}
except multihost.CollectiveMismatchError as exc:
    out = {'error': type(exc).__name__, 'text': str(exc)}
with open(os.path.join(sys.argv[1], f'{pid}.json'), 'w') as f:
    json.dump(out, f)
# Process 0's exit takes the others down (fate-sharing): everyone reports first.
multihost.barrier('reported', timeout=20)
jax.distributed.shutdown()  # every process leaves together (its own barrier)
"""


def test_a_cold_job_reports_on_every_host_before_it_exits(tmp_path):
    """Plain processes (env vars, `jax.distributed.initialize` in the script) that exit after."""
    from multihost.testing import free_port

    script = tmp_path / 'job.py'
    script.write_text(_SCRIPT)
    env = {**os.environ, 'COORDINATOR': f'127.0.0.1:{free_port()}', 'NUM_PROCESSES': '4'}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)],
            env={**env, 'PROCESS_ID': str(i)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            p.communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
    # Exit codes are JAX's: processes 1-3 often abort in its own exit path
    # ("terminate called ...", also without multihost); what counts is that
    # every host said what it knew before process 0 left.
    site = str(script)
    for i in range(4):
        r = json.loads((tmp_path / f'{i}.json').read_text())
        assert r['error'] == 'CollectiveMismatchError', (i, r)
        assert f"\n  process 2: process_allgather('tiled=False') at {site}:" in r['text'], r
        assert f"\n  processes 0-1, 3: barrier('ckpt') at {site}:" in r['text'], r
