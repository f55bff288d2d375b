"""multihost: a drop-in for `jax.experimental.multihost_utils`, with diagnostics.

``import multihost as multihost_utils`` works wherever JAX's module is used:
same names, signatures, results and exceptions. On top, every collective is
sequence-checked across hosts, and barriers time out naming who is missing.

Runs on every host (one JAX process per host); depends on jax and numpy only.
"""

from multihost._checks._census import env_diff, memory_census
from multihost._checks._layout import describe_layout
from multihost._checks._nonfinite import nonfinite
from multihost._checks._preview import preview_layout
from multihost._checks._replicas import check_replicas
from multihost._checks._treediff import assert_equal, tree_diff
from multihost._core._arrays import (
    global_array_to_host_local_array,
    host_local_array_to_global_array,
)
from multihost._core._collectives import (
    barrier,
    broadcast_one_to_all,
    process_allgather,
    sync_global_devices,
)
from multihost._core._fault import live_devices, reached_preemption_sync_point
from multihost._debug._control import ControlClient, serve_control
from multihost._debug._stacks import where
from multihost._debug._stepgate import (
    DEFAULT_STEP_TIMEOUT,
    release,
    release_all,
    set_stepping,
    step_table,
    stepping_enabled,
)
from multihost._debug._timeline import timeline
from multihost._debug._watch import Watched, watch
from multihost._debug._wavefront import flight_records, wavefront
from multihost._errors import (
    AuditError,
    BarrierMismatchError,
    BarrierTimeoutError,
    CollectiveInterruptedError,
    CollectiveMismatchError,
    CoordinatorUnreachableError,
    HostFailedError,
    HostMismatchError,
    MultihostError,
    ProcessFailureError,
    StepTimeoutError,
)
from multihost._exchange import _threads  # noqa: F401  (handles collectives off the main thread)
from multihost._exchange._bus import start_debug_daemon
from multihost._exchange._sequence import DEFAULT_TIMEOUT
from multihost._job._audit import report as audit_report
from multihost._job._install import install, uninstall
from multihost._job._numbering import HostNumberingError
from multihost._models import (
    AuditFinding,
    AuditReport,
    AxisLink,
    CollectiveRecord,
    DeviceInfo,
    EnvDiff,
    FlightRecord,
    GlobalLeaf,
    HostFront,
    HostStacks,
    Layout,
    LayoutBlock,
    LeafDiff,
    LeafLayout,
    MemoryCensus,
    NonfiniteLeaf,
    NonfiniteReport,
    NonfiniteShard,
    ReplicaDigest,
    ReplicaGroup,
    ReplicaReport,
    ShardInfo,
    Step,
    StepTable,
    Stragglers,
    ThreadStack,
    Timeline,
    TimelineStep,
    TreeDiff,
    TreeLayout,
    Wavefront,
)

# The one place the version is written: pyproject.toml reads it (setuptools dynamic
# version) and mhnotebook.__version__ returns it.
__version__ = '0.1.0'

__all__ = [
    'AuditError',
    'AuditFinding',
    'AuditReport',
    'DEFAULT_STEP_TIMEOUT',
    'DEFAULT_TIMEOUT',
    'EnvDiff',
    'BarrierMismatchError',
    'BarrierTimeoutError',
    'CollectiveInterruptedError',
    'CollectiveMismatchError',
    'CoordinatorUnreachableError',
    'HostFailedError',
    'CollectiveRecord',
    'ControlClient',
    'FlightRecord',
    'GlobalLeaf',
    'HostFront',
    'HostMismatchError',
    'HostNumberingError',
    'HostStacks',
    'AxisLink',
    'DeviceInfo',
    'Layout',
    'LayoutBlock',
    'LeafDiff',
    'LeafLayout',
    'MemoryCensus',
    'MultihostError',
    'NonfiniteLeaf',
    'NonfiniteReport',
    'NonfiniteShard',
    'ProcessFailureError',
    'ReplicaDigest',
    'ReplicaGroup',
    'ReplicaReport',
    'ShardInfo',
    'Step',
    'StepTable',
    'StepTimeoutError',
    'Stragglers',
    'ThreadStack',
    'Timeline',
    'TimelineStep',
    'TreeDiff',
    'TreeLayout',
    'Watched',
    'Wavefront',
    'assert_equal',
    'audit_report',
    'barrier',
    'broadcast_one_to_all',
    'check_replicas',
    'describe_layout',
    'env_diff',
    'flight_records',
    'global_array_to_host_local_array',
    'host_local_array_to_global_array',
    'install',
    'live_devices',
    'memory_census',
    'nonfinite',
    'preview_layout',
    'process_allgather',
    'reached_preemption_sync_point',
    'release',
    'release_all',
    'serve_control',
    'set_stepping',
    'start_debug_daemon',
    'step_table',
    'stepping_enabled',
    'sync_global_devices',
    'timeline',
    'tree_diff',
    'uninstall',
    'watch',
    'wavefront',
    'where',
]
