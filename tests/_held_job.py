"""A batch job holding `_same_values.VALUES` when process 3 raises (test_attach_models).

Plain JAX, nothing of multihost imported; run under ``python -m multihost run
--hold-on-error --control-file F``: process 3 raises before the barrier, the others
hold at it, every host's module frame holds ``x`` and ``tree``.
"""

import os
import sys

import jax

jax.config.update('jax_platforms', 'cpu')
jax.config.update('jax_num_cpu_devices', 2)
jax.distributed.initialize(
    coordinator_address=os.environ['COORDINATOR_ADDRESS'],
    num_processes=int(os.environ['NUM_PROCESSES']),
    process_id=int(os.environ['PROCESS_ID']),
)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _same_values import VALUES  # noqa: E402

exec(VALUES)  # x, tree (and their helpers) at the top level, as in the session's engines
from jax.experimental import multihost_utils  # noqa: E402

# Every host has made x and tree before process 3 fails (a host still inside VALUES'
# collective would hold there, before x exists): the others hold at the next barrier.
multihost_utils.sync_global_devices('the values are made')
if jax.process_index() == 3:
    raise ValueError('bad batch')
multihost_utils.sync_global_devices('after the values')
