"""The cold, late, failed and interrupted cases of the reliability tests, on the digest path.

`MULTIHOST_DIGEST_ABOVE=0` on 4 real processes x 2 devices with cold
backends: every round agrees through its digest directory (as above 4 hosts
by default), and the imported tests assert the very verdicts they assert on
the read-all path (`_digest_path`). Not copies: the tests themselves, from
`test_cold_multiprocess` and `test_never_hangs`.
"""

from __future__ import annotations

import pytest
from _digest_path import (
    check_on_the_digest_path,
    digest_path_everywhere,
    on_the_digest_path,
    use_the_default_path,
    use_the_digest_path,
)
from test_cold_multiprocess import (
    test_a_cold_job_reports_on_every_host_before_it_exits,
    test_every_cold_host_names_every_hosts_first_call,
)
from test_never_hangs import (
    test_an_interrupt_stops_the_wait_and_every_host_hears_of_it,
    test_cold_host_does_not_block_the_others_barrier,
    test_tree_diff_of_a_partial_name,
    test_tree_diff_of_an_unconvertible_leaf_on_one_host,
)

MP_CLUSTER = dict(n=4, devices_per_process=2, init_backend=False)
# Release rotation; covered on every landing by the digest path: test_digest_path_multiprocess.py;
# cold backends: test_cold_multiprocess.py and test_never_hangs.py (the tests imported here)
pytestmark = pytest.mark.release
MP_CLUSTER_ENTER = use_the_digest_path
MP_CLUSTER_LEAVE = use_the_default_path

__all__ = [
    'digest_path_everywhere',
    'test_a_cold_job_reports_on_every_host_before_it_exits',
    'test_an_interrupt_stops_the_wait_and_every_host_hears_of_it',
    'test_cold_host_does_not_block_the_others_barrier',
    'test_every_cold_host_names_every_hosts_first_call',
    'test_tree_diff_of_a_partial_name',
    'test_tree_diff_of_an_unconvertible_leaf_on_one_host',
]


def test_the_cold_cluster_is_on_the_digest_path(mp_cluster):
    check_on_the_digest_path(mp_cluster.run(on_the_digest_path, timeout=60))
