"""The late, skipped and mismatched cases of the reliability tests, on the digest path.

`MULTIHOST_DIGEST_ABOVE=0` on 4 real processes x 2 devices: every round
agrees through its digest directory, as above 4 hosts by default, and the
imported tests assert the very verdicts they assert on the read-all path
(`_digest_path`). Not copies: the tests themselves, from
`test_sequence_multiprocess`, `test_real_program_align` and
`test_layout_multiprocess` (replica checks: each block's reference, then
the agreement); only the cases in
which some host reads the digest directory after a failure (the others are
the read-all path's code whatever the knob: see notes in `_digest_path`).
"""

from __future__ import annotations

import pytest
import test_real_program_align as align
from _digest_path import (
    check_on_the_digest_path,
    digest_path_everywhere,
    on_the_digest_path,
    use_the_default_path,
    use_the_digest_path,
)
from test_layout_multiprocess import (
    test_check_replicas_finds_disagreement_within_and_across_hosts,
    test_check_replicas_names_the_odd_host,
    test_check_replicas_ok_for_consistent_data,
)
from test_real_program_align import test_a_skipper_late_at_a_later_failed_collective_raises_that_one
from test_sequence_multiprocess import (
    test_barrier_names_differ_raises_on_every_host,
    test_different_collective_raises_on_every_host,
    test_shapes_differ_raises_before_device_collective,
)

from multihost._exchange import _kv

MP_CLUSTER = dict(n=4, devices_per_process=2)
MP_CLUSTER_ENTER = use_the_digest_path
MP_CLUSTER_LEAVE = use_the_default_path

__all__ = [
    'digest_path_everywhere',
    'test_a_skipper_late_at_a_later_failed_collective_raises_that_one',
    'test_barrier_names_differ_raises_on_every_host',
    'test_check_replicas_finds_disagreement_within_and_across_hosts',
    'test_check_replicas_names_the_odd_host',
    'test_check_replicas_ok_for_consistent_data',
    'test_different_collective_raises_on_every_host',
    'test_shapes_differ_raises_before_device_collective',
]


def test_a_host_late_at_the_same_open_barrier_raises_the_verdict_then_lines_up(mp_cluster):
    """`test_real_program_align`'s case 'open' (its barrier completes: it reads `g/`, sees `!`)."""
    align.test_a_host_late_at_the_same_barrier_raises_the_verdict_then_lines_up(
        mp_cluster, align.TIMEOUT + 1.5
    )


def test_the_cluster_is_on_the_digest_path(mp_cluster):
    check_on_the_digest_path(mp_cluster.run(on_the_digest_path, timeout=60))


def test_the_knob_takes_a_whole_number_of_hosts_and_says_so_otherwise():
    assert _kv.digest_above(None) == _kv.digest_above('') == _kv.DEFAULT_DIGEST_ABOVE == 4
    assert _kv.digest_above('0') == 0 and _kv.digest_above(' 16 ') == 16
    for bad in ('-1', 'four', '2.5'):
        with pytest.raises(ValueError, match=r'^MULTIHOST_DIGEST_ABOVE must be a whole') as info:
            _kv.digest_above(bad)
        assert repr(bad) in str(info.value) and '\n' not in str(info.value)
