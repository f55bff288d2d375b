"""Issue 21's scale targets, measured on 256 simulated hosts (`bench/manyhost.py`).

256 forked clients of one real coordination service run the no-error checks
that need no JAX backend (`sync_global_devices`, a sequence-checked small
broadcast, `assert_equal` of a small equal tree); the harness counts every
RPC and reply byte per host. Then host 0 issues `where`, `wavefront`
and `flight_records(200)` while the others wait in a barrier (their debug
threads answer), counting host 0's own RPCs. The same run as ``python bench/scale.py --many
16,256 --check``. About 30 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.release, pytest.mark.alone]  # release: CONTRIBUTING.md

BENCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'bench'
)
#: O(1) per host: the sequence check's digest round (above 4 hosts), a small
#: broadcast's source payload read beside it, assert_equal's fingerprint digests agreed
#: on the same way. (A small allgather is O(N) per host by nature: every host's data.)
FLAT = ('sync_global_devices', 'broadcast (small)', 'assert_equal (small)')
ISSUERS = ('where', 'wavefront', 'flight_records')


@pytest.fixture(scope='module')
def many(tmp_path_factory):
    """One harness run at 16 and 256 hosts (both tests read it)."""
    out = tmp_path_factory.mktemp('many') / 'many.json'
    env = {**os.environ, 'OPENBLAS_NUM_THREADS': '1', 'JAX_PLATFORMS': 'cpu'}
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH, 'scale.py'), '--many', '16,256', '--reps', '2']
        + ['--json', str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f'the harness failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}')
    lo, hi = json.loads(out.read_text())['records']
    # The harness itself must work: these raise (a failure, never the expected xfail).
    if (lo['n'], hi['n']) != (16, 256) or hi['backend_started']:
        raise RuntimeError(
            f'bad harness run: N={lo["n"]},{hi["n"]}, backend {hi["backend_started"]}'
        )
    if set(hi['issuers']) != set(ISSUERS):
        raise RuntimeError(f'bad harness run: issuers {sorted(hi["issuers"])}')
    for check in FLAT:
        a, b = lo['checks'][check], hi['checks'][check]
        if min(a['served_rpcs'], b['served_rpcs'], a['read_max'], b['read_max']) <= 0:
            raise RuntimeError(f'{check}: the harness counted no RPC or no byte read')
    return lo, hi


def _targets(lo, hi, checks):
    for check in checks:
        a, b = lo['checks'][check], hi['checks'][check]
        assert b['read_max'] <= 1024, f'{check}: a host read {b["read_max"]:.0f} B at N=256'
        assert b['read_max'] <= 1.5 * a['read_max'], (
            f'{check}: per host x{b["read_max"] / a["read_max"]:.1f}'
        )
        assert b['served_bytes'] <= 20 * a['served_bytes'], (
            f'{check}: served x{b["served_bytes"] / a["served_bytes"]:.1f} for 16x hosts'
        )


@pytest.mark.slow
def test_256_hosts_barriers_broadcast_and_assert_equal_read_o1_per_host_and_the_service_serves_o_n(
    many,
):
    _targets(*many, FLAT)


@pytest.mark.slow
def test_256_hosts_where_wavefront_and_flight_records_read_every_reply_in_at_most_50_rpcs(
    many,
):
    lo, hi = many
    for name in ISSUERS:
        for rec in (lo, hi):
            m = rec['issuers'][name]
            assert m['answered_min'] == rec['n'], f'{name}: {m["answered_min"]:.0f} answered'
            assert m['rpcs_max'] <= 50, f'{name} at N={rec["n"]}: {m["rpcs_max"]:.0f} RPCs'
        # Every reply is read (200 flight records of 256 hosts: ~8 MB, in <= 1 MiB batches).
        assert hi['issuers'][name]['read_bytes'] >= 16 * lo['issuers'][name]['read_bytes'] * 0.9
