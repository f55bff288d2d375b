"""The skipped, late, mismatched and dead cases of the reliability tests, on the digest path.

`MULTIHOST_DIGEST_ABOVE=0` on 4 real processes x 2 devices: every round
(barriers, core collectives, watched launches, off-main-thread lanes) agrees
through its digest directory, as above 4 hosts by default, and the imported
tests assert the very verdicts they assert on the read-all path
(`_digest_path`). Not copies: the tests themselves, from
`test_sequence_multiprocess`, `test_real_program_align`,
`test_never_hangs_watch` and `test_threads_multiprocess`.
"""

from __future__ import annotations

import pytest
from _digest_path import ENV, check_on_the_digest_path, digest_path_everywhere, on_the_digest_path
from test_never_hangs_watch import (
    test_a_dead_host_is_named_by_the_wavefront_records_and_watched_launches,
    test_a_host_late_for_a_watched_launch_is_named_by_every_host,
    test_hosts_launching_different_watched_functions_all_raise_at_once,
)
from test_real_program_align import (
    test_a_host_that_skipped_a_barrier_joins_the_next_collective,
    test_a_skipper_late_at_a_later_failed_collective_raises_that_one,
)
from test_sequence_multiprocess import (
    test_barrier_names_differ_raises_on_every_host,
    test_different_collective_raises_on_every_host,
    test_shapes_differ_raises_before_device_collective,
    test_skipped_barrier_times_out_naming_missing_host,
)
from test_threads_multiprocess import (
    test_background_barrier_timeout_names_the_host_and_the_thread,
    test_unkeyed_collective_in_a_thread_of_another_name_times_out,
)

from multihost._exchange import _kv

MP_CLUSTER = dict(n=4, devices_per_process=2, env=ENV)

__all__ = [
    'digest_path_everywhere',
    'test_a_dead_host_is_named_by_the_wavefront_records_and_watched_launches',
    'test_a_host_late_for_a_watched_launch_is_named_by_every_host',
    'test_a_host_that_skipped_a_barrier_joins_the_next_collective',
    'test_a_skipper_late_at_a_later_failed_collective_raises_that_one',
    'test_background_barrier_timeout_names_the_host_and_the_thread',
    'test_barrier_names_differ_raises_on_every_host',
    'test_different_collective_raises_on_every_host',
    'test_hosts_launching_different_watched_functions_all_raise_at_once',
    'test_shapes_differ_raises_before_device_collective',
    'test_skipped_barrier_times_out_naming_missing_host',
    'test_unkeyed_collective_in_a_thread_of_another_name_times_out',
]


def test_the_cluster_is_on_the_digest_path(mp_cluster):
    check_on_the_digest_path(mp_cluster.run(on_the_digest_path, timeout=60))


def test_the_knob_takes_a_whole_number_of_hosts_and_says_so_otherwise():
    assert _kv.digest_above(None) == _kv.digest_above('') == _kv.DEFAULT_DIGEST_ABOVE == 4
    assert _kv.digest_above('0') == 0 and _kv.digest_above(' 16 ') == 16
    for bad in ('-1', 'four', '2.5'):
        with pytest.raises(
            ValueError, match=r'^MULTIHOST_DIGEST_ABOVE must be a whole number'
        ) as info:
            _kv.digest_above(bad)
        assert repr(bad) in str(info.value) and '\n' not in str(info.value)
