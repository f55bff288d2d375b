"""multihost: a drop-in for `jax.experimental.multihost_utils`, with diagnostics.

``import multihost as multihost_utils`` works wherever JAX's module is used:
same names, signatures, results and exceptions. On top, every collective is
sequence-checked across hosts, and barriers time out naming who is missing.

Runs on every host (one JAX process per host); depends on jax and numpy only.

Importing it is cheap and needs no jax: the first public name used (``multihost.barrier``,
``from multihost import ...``) loads the whole drop-in at once, as importing it once did
(`_load`). So the rooms that import no jax (the models, the text helpers, the dump reader
and the analysis: `multihost._models`) serve the notebook without it.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what `_load` binds, for type checkers and readers
    from multihost._checks._census import env_diff, memory_census
    from multihost._checks._layout import describe_layout
    from multihost._checks._nonfinite import nonfinite
    from multihost._checks._preview import preview_layout
    from multihost._checks._replay import replay
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
    from multihost._defaults import DEFAULT_TIMEOUT
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
    from multihost._exchange._bus import start_debug_daemon
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
        Replay,
        ReplayEquation,
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


#: Each public name (but `__version__`) -> (its module, its name there). `_load` wires the
#: hooks (`multihost._job._wiring.wire`: the step gate's enter hook, the debug thread's commands,
#: collectives off the main thread, the audit's control method), then binds every name, so
#: a process that uses one name has the whole drop-in.
_HOMES: dict[str, tuple[str, str]] = {
    'env_diff': ('multihost._checks._census', 'env_diff'),
    'memory_census': ('multihost._checks._census', 'memory_census'),
    'describe_layout': ('multihost._checks._layout', 'describe_layout'),
    'nonfinite': ('multihost._checks._nonfinite', 'nonfinite'),
    'preview_layout': ('multihost._checks._preview', 'preview_layout'),
    'check_replicas': ('multihost._checks._replicas', 'check_replicas'),
    'replay': ('multihost._checks._replay', 'replay'),
    'assert_equal': ('multihost._checks._treediff', 'assert_equal'),
    'tree_diff': ('multihost._checks._treediff', 'tree_diff'),
    'global_array_to_host_local_array': (
        'multihost._core._arrays',
        'global_array_to_host_local_array',
    ),
    'host_local_array_to_global_array': (
        'multihost._core._arrays',
        'host_local_array_to_global_array',
    ),
    'barrier': ('multihost._core._collectives', 'barrier'),
    'broadcast_one_to_all': ('multihost._core._collectives', 'broadcast_one_to_all'),
    'process_allgather': ('multihost._core._collectives', 'process_allgather'),
    'sync_global_devices': ('multihost._core._collectives', 'sync_global_devices'),
    'live_devices': ('multihost._core._fault', 'live_devices'),
    'reached_preemption_sync_point': ('multihost._core._fault', 'reached_preemption_sync_point'),
    'ControlClient': ('multihost._debug._control', 'ControlClient'),
    'serve_control': ('multihost._debug._control', 'serve_control'),
    'where': ('multihost._debug._stacks', 'where'),
    'DEFAULT_STEP_TIMEOUT': ('multihost._debug._stepgate', 'DEFAULT_STEP_TIMEOUT'),
    'release': ('multihost._debug._stepgate', 'release'),
    'release_all': ('multihost._debug._stepgate', 'release_all'),
    'set_stepping': ('multihost._debug._stepgate', 'set_stepping'),
    'step_table': ('multihost._debug._stepgate', 'step_table'),
    'stepping_enabled': ('multihost._debug._stepgate', 'stepping_enabled'),
    'timeline': ('multihost._debug._timeline', 'timeline'),
    'Watched': ('multihost._debug._watch', 'Watched'),
    'watch': ('multihost._debug._watch', 'watch'),
    'flight_records': ('multihost._debug._wavefront', 'flight_records'),
    'wavefront': ('multihost._debug._wavefront', 'wavefront'),
    'AuditError': ('multihost._errors', 'AuditError'),
    'BarrierMismatchError': ('multihost._errors', 'BarrierMismatchError'),
    'BarrierTimeoutError': ('multihost._errors', 'BarrierTimeoutError'),
    'CollectiveInterruptedError': ('multihost._errors', 'CollectiveInterruptedError'),
    'CollectiveMismatchError': ('multihost._errors', 'CollectiveMismatchError'),
    'CoordinatorUnreachableError': ('multihost._errors', 'CoordinatorUnreachableError'),
    'HostFailedError': ('multihost._errors', 'HostFailedError'),
    'HostMismatchError': ('multihost._errors', 'HostMismatchError'),
    'MultihostError': ('multihost._errors', 'MultihostError'),
    'ProcessFailureError': ('multihost._errors', 'ProcessFailureError'),
    'StepTimeoutError': ('multihost._errors', 'StepTimeoutError'),
    'start_debug_daemon': ('multihost._exchange._bus', 'start_debug_daemon'),
    'DEFAULT_TIMEOUT': ('multihost._defaults', 'DEFAULT_TIMEOUT'),
    'audit_report': ('multihost._job._audit', 'report'),
    'install': ('multihost._job._install', 'install'),
    'uninstall': ('multihost._job._install', 'uninstall'),
    'HostNumberingError': ('multihost._job._numbering', 'HostNumberingError'),
    'AuditFinding': ('multihost._models', 'AuditFinding'),
    'AuditReport': ('multihost._models', 'AuditReport'),
    'AxisLink': ('multihost._models', 'AxisLink'),
    'CollectiveRecord': ('multihost._models', 'CollectiveRecord'),
    'DeviceInfo': ('multihost._models', 'DeviceInfo'),
    'EnvDiff': ('multihost._models', 'EnvDiff'),
    'FlightRecord': ('multihost._models', 'FlightRecord'),
    'GlobalLeaf': ('multihost._models', 'GlobalLeaf'),
    'HostFront': ('multihost._models', 'HostFront'),
    'HostStacks': ('multihost._models', 'HostStacks'),
    'Layout': ('multihost._models', 'Layout'),
    'LayoutBlock': ('multihost._models', 'LayoutBlock'),
    'LeafDiff': ('multihost._models', 'LeafDiff'),
    'LeafLayout': ('multihost._models', 'LeafLayout'),
    'MemoryCensus': ('multihost._models', 'MemoryCensus'),
    'NonfiniteLeaf': ('multihost._models', 'NonfiniteLeaf'),
    'NonfiniteReport': ('multihost._models', 'NonfiniteReport'),
    'NonfiniteShard': ('multihost._models', 'NonfiniteShard'),
    'Replay': ('multihost._models', 'Replay'),
    'ReplayEquation': ('multihost._models', 'ReplayEquation'),
    'ReplicaDigest': ('multihost._models', 'ReplicaDigest'),
    'ReplicaGroup': ('multihost._models', 'ReplicaGroup'),
    'ReplicaReport': ('multihost._models', 'ReplicaReport'),
    'ShardInfo': ('multihost._models', 'ShardInfo'),
    'Step': ('multihost._models', 'Step'),
    'StepTable': ('multihost._models', 'StepTable'),
    'Stragglers': ('multihost._models', 'Stragglers'),
    'ThreadStack': ('multihost._models', 'ThreadStack'),
    'Timeline': ('multihost._models', 'Timeline'),
    'TimelineStep': ('multihost._models', 'TimelineStep'),
    'TreeDiff': ('multihost._models', 'TreeDiff'),
    'TreeLayout': ('multihost._models', 'TreeLayout'),
    'Wavefront': ('multihost._models', 'Wavefront'),
}

#: The public names: `_HOMES`' keys, written nowhere else (the `TYPE_CHECKING` imports above
#: are checked against `_HOMES` by tests/engine/test_core_single.py).
__all__ = sorted(_HOMES)


def _load() -> None:
    """Binds every public name here, importing the whole drop-in (jax first)."""
    import importlib

    importlib.import_module('multihost._job._wiring').wire()  # the hooks, before any name is used
    for name, (module, attr) in _HOMES.items():
        globals()[name] = getattr(importlib.import_module(module), attr)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    _load()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
