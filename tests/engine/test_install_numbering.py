"""Install checks that the hosts are numbered one way (`multihost._job._numbering`): JAX's
``process_index`` against the devices' and the launcher's ``TPU_WORKER_ID`` (modulo the hosts per
slice with ``MEGASCALE_NUM_SLICES``). On 4 real JAX processes x 2 CPU devices (initialized: the
check runs at install); the environment is restored after each test.
"""

from __future__ import annotations

import os

import jax
import pytest

import multihost
from multihost._job import _install
from multihost._job._numbering import HostNumberingError, check_numbering

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


@multiprocess(timeout=60)
def test_worker_ids_that_follow_jax_pass_and_others_fail_at_install():
    pid = jax.process_index()
    check_numbering({'TPU_WORKER_ID': str(pid)})  # as a TPU launcher numbers them
    check_numbering({'TPU_WORKER_ID': str(pid % 2), 'MEGASCALE_NUM_SLICES': '2'})
    check_numbering({})  # no launcher variable: nothing to compare
    swapped = str(3 - pid)  # a launcher that numbered the hosts backwards
    with pytest.raises(HostNumberingError, match=f'TPU_WORKER_ID={swapped} but jax.process_'):
        check_numbering({'TPU_WORKER_ID': swapped})
    old = os.environ.get('TPU_WORKER_ID')
    os.environ['TPU_WORKER_ID'] = swapped
    try:
        with pytest.raises(HostNumberingError, match=f'process_index\\(\\) is {pid}'):
            multihost.install()
        assert _install.installed() is None  # the failed install left nothing behind
    finally:
        if old is None:
            os.environ.pop('TPU_WORKER_ID', None)
        else:
            os.environ['TPU_WORKER_ID'] = old
    multihost.install()  # numbered right: installs
    multihost.uninstall()
