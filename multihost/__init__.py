"""multihost: a drop-in for `jax.experimental.multihost_utils`, with diagnostics.

``import multihost as multihost_utils`` works wherever JAX's module is used:
same names, signatures, results and exceptions. On top, every collective is
sequence-checked across hosts, and barriers time out naming who is missing.

Runs on every host (one JAX process per host); depends on jax and numpy only.
"""

from multihost._arrays import (
    global_array_to_host_local_array,
    host_local_array_to_global_array,
)
from multihost._collectives import (
    assert_equal,
    barrier,
    broadcast_one_to_all,
    process_allgather,
    sync_global_devices,
)
from multihost._errors import (
    BarrierMismatchError,
    BarrierTimeoutError,
    CollectiveMismatchError,
    HostMismatchError,
    MultihostError,
    ProcessFailureError,
)
from multihost._fault import live_devices, reached_preemption_sync_point
from multihost._sequence import DEFAULT_TIMEOUT, CollectiveRecord

__version__ = '0.1.0'

__all__ = [
    'DEFAULT_TIMEOUT',
    'BarrierMismatchError',
    'BarrierTimeoutError',
    'CollectiveMismatchError',
    'CollectiveRecord',
    'HostMismatchError',
    'MultihostError',
    'ProcessFailureError',
    'assert_equal',
    'barrier',
    'broadcast_one_to_all',
    'global_array_to_host_local_array',
    'host_local_array_to_global_array',
    'live_devices',
    'process_allgather',
    'reached_preemption_sync_point',
    'sync_global_devices',
]
