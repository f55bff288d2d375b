"""A check with no error reads O(1) bytes per process: 8 real JAX processes, counters of `_kv`.

Each host counts what it asks of the coordination service (`_kv.COUNTERS`)
around barriers and gathers that agree: at most 1 KiB read per host per
check, whatever the number of hosts (the hosts' records are not read, only
the one digest they agree on). A disagreement still reads everything and
raises on every host.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import multihost
from multihost._exchange import _kv

MP_CLUSTER = dict(n=8, devices_per_process=1)
#: The most a host may read per check that finds nothing wrong (issue 21).
PER_CHECK = 1024
CHECKS = 20


def per_check_reads(n_checks: int = CHECKS) -> dict[str, float]:
    """Per host: bytes read, RPCs and values written per agreeing barrier (after a warm-up)."""
    multihost.barrier('warm-up')
    before = _kv.COUNTERS.snapshot()
    for i in range(n_checks):
        multihost.barrier(f'step {i}')
    used = _kv.COUNTERS.since(before)
    return {
        'bytes_read': used.bytes_read / n_checks,
        'rpcs': used.rpcs / n_checks,
        'values_written': used.values_written / n_checks,
    }


@pytest.mark.multiprocess
def test_agreeing_barriers_read_under_1_kib_per_host_at_8_hosts():
    used = per_check_reads()
    assert used['bytes_read'] <= PER_CHECK, used
    # record, digest, the barrier's count and wait (counted since it is made of keys), one read
    assert used['rpcs'] <= 5, used
    # the error path is unchanged: a different name still raises on every host
    name = 'eval' if jax.process_index() == 5 else 'save'
    with pytest.raises(multihost.BarrierMismatchError) as info:
        multihost.barrier(name, timeout=30)
    assert info.value.names[5] == 'eval' and info.value.names[0] == 'save'
    gathered = multihost.process_allgather(np.array([jax.process_index()]))
    assert gathered.ravel().tolist() == list(range(8))


def _late_barrier(timeout: float) -> list[int] | None:
    """Host 6 arrives after the others gave up: every host gets the same timeout verdict."""
    import time

    multihost.barrier('warm-up late')
    if jax.process_index() == 6:
        time.sleep(timeout + 1.5)
    try:
        multihost.barrier('late', timeout=timeout)
    except multihost.BarrierTimeoutError as exc:
        return list(exc.missing)
    return None


def test_a_late_host_gets_the_timeout_verdict_of_the_digest_round(mp_cluster):
    """The hosts that gave up mark the agreement directory before writing their verdict."""
    missing = mp_cluster.run(_late_barrier, 2.0, timeout=60)
    mp_cluster.get().broken = True  # whatever the late host did next, start afresh
    assert missing == [[6]] * 8, missing


def _assert_equal_reads() -> tuple[float, tuple[int, ...]]:
    tree = {'w': np.arange(64, dtype=np.float32), 'b': np.ones(3, np.int32), 'step': 7}
    multihost.assert_equal(tree)  # warm-up
    before = _kv.COUNTERS.snapshot()
    for _ in range(5):
        multihost.assert_equal(tree)
    used = _kv.COUNTERS.since(before)
    drifted = dict(tree, w=tree['w'] + (1.0 if jax.process_index() == 3 else 0.0))
    diff = multihost.tree_diff(drifted)
    assert [leaf.path for leaf in diff.leaves] == ["['w']"], diff
    return used.bytes_read / 5, diff.leaves[0].odd_processes


def test_assert_equal_of_equal_trees_reads_a_digest_not_every_hosts_and_a_drift_is_named(
    mp_cluster,
):
    """Equal trees agree through the fingerprint round's agreement directory; a drift reads all."""
    got = mp_cluster.run(_assert_equal_reads, timeout=120)
    # Every host's fingerprint digest (8 x ~80 B) would be read without the agreement round.
    assert all(read <= 256 for read, _ in got), got
    assert all(odd == (3,) for _, odd in got), got


def _broadcast_reads() -> tuple[float, list[float], list[int], str]:
    x = np.full((4,), float(jax.process_index()), np.float32)
    multihost.broadcast_one_to_all(x)  # warm-up
    before = _kv.COUNTERS.snapshot()
    for _ in range(5):
        got = multihost.broadcast_one_to_all(x, is_source=jax.process_index() == 5)
    used = _kv.COUNTERS.since(before)
    two = multihost.broadcast_one_to_all(x, is_source=jax.process_index() in (2, 3))
    odd = np.zeros(5 if jax.process_index() == 7 else 4, np.float32)
    try:
        multihost.broadcast_one_to_all(odd)
        error = ''
    except multihost.CollectiveMismatchError as exc:
        error = type(exc).__name__
    return used.bytes_read / 5, np.asarray(got).tolist(), np.asarray(two).tolist(), error


def test_a_small_broadcast_reads_the_sources_payload_not_every_hosts_record(mp_cluster):
    got = mp_cluster.run(_broadcast_reads, timeout=120)
    # One source's 16 bytes (base64 in its record) and a digest, not 8 records.
    assert all(read <= 512 for read, *_ in got), got
    assert all(one == [5.0] * 4 for _, one, _, _ in got), got
    assert all(two == [5.0] * 4 for _, _, two, _ in got), got  # sources 2 + 3 summed
    assert all(error == 'CollectiveMismatchError' for *_, error in got), got


def _replica_reads() -> dict[str, object]:
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    pid = jax.process_index()
    flat = Mesh(np.array(jax.devices()), ('x',))
    pairs = Mesh(np.array(jax.devices()).reshape(4, 2), ('a', 'b'))  # 2 hosts per block

    def global_(value: np.ndarray, mesh: Mesh, spec: P) -> jax.Array:
        return jax.make_array_from_callback(
            value.shape, NamedSharding(mesh, spec), lambda i: value[i]
        )

    value = np.arange(32, dtype=np.float32)
    replicated = global_(value, flat, P())
    by_pairs = global_(value.reshape(4, 8), pairs, P('a'))
    multihost.check_replicas(replicated)  # warm-up
    before = _kv.COUNTERS.snapshot()
    for _ in range(5):
        ok_replicated = multihost.check_replicas(replicated)
        ok_pairs = multihost.check_replicas(by_pairs)
    used = _kv.COUNTERS.since(before)
    odd_replicated = multihost.check_replicas(global_(value + (pid == 6), flat, P()))
    odd_pairs = multihost.check_replicas(global_(value.reshape(4, 8) + (pid == 3), pairs, P('a')))
    return {
        'read': used.bytes_read / 10,
        'reports': (ok_replicated, ok_pairs, odd_replicated, odd_pairs),
    }


def test_check_replicas_that_agree_reads_a_reference_per_block_and_a_difference_is_named(
    mp_cluster,
):
    """Each host compares its replicas with one reference per block; only an odd one reads all."""
    got = mp_cluster.run(_replica_reads, timeout=120)
    # Eight hosts' digests would be read without the reference (8 x ~40 B per check, plus records).
    assert all(r['read'] <= PER_CHECK / 4 for r in got), [r['read'] for r in got]
    reports = [r['reports'] for r in got]
    assert all(r == reports[0] for r in reports[1:])  # every host has the same reports
    ok_replicated, ok_pairs, odd_replicated, odd_pairs = reports[0]
    assert ok_replicated.ok and ok_pairs.ok
    # every host holds the replicated block: its digest is known everywhere; the pairs' are not
    assert len({r.digest for r in ok_replicated.groups[0].replicas}) == 1
    assert ok_replicated.groups[0].replicas[0].digest != ''
    assert {r.digest for g in ok_pairs.groups for r in g.replicas} == {''}
    assert len(ok_pairs.groups) == 4
    # a difference: the full read, as among few hosts
    assert not odd_replicated.ok and odd_replicated.odd_processes == (6,)
    (group,) = odd_replicated.mismatches
    assert len(group.digests[group.majority]) == 7 and '' not in group.digests
    assert not odd_pairs.ok and len(odd_pairs.mismatches) == 1
    (pair,) = odd_pairs.mismatches
    assert pair.tied and {r.process_index for r in pair.replicas} == {2, 3}
    assert odd_pairs.groups[0].ok and odd_pairs.groups[0].replicas[0].digest != ''
