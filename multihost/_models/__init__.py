"""The models: frozen, picklable dataclasses that cross the wire (engines -> notebook).

numpy and the standard library only, importing no engine code (no jax, no collectives): the
engines build these, the notebook's views draw them, tests build them by hand.

* `_records`: `CollectiveRecord` (one collective call as a host published it); the flight
  record (`FlightRecord`) is built by the recorder ring (`multihost._recorder`, floor 0).
* `_steps`: `StepTable`, `Step`, `PausedLaunch` (host x step; stepping).
* `_stacks`: `HostStacks`, `ThreadStack`, the frame model (`Frame`, `frame_package`, ...).
* `_wavefront`: `Wavefront`, `HostFront`.  `_timeline`: `Timeline`, `TimelineStep`, `Stragglers`.
* `_hardware`: `DeviceInfo`, `AxisLink` (chips, hosts, slices; how a mesh axis is wired).
* `_layout`: `Layout`, `LayoutBlock`, `ShardInfo` and the index helpers (`format_index`, ...).
* `_replicas`: `ReplicaReport`, `ReplicaGroup`, `ReplicaDigest`.
  `_replay`: `Replay`, `Equation` (exported as `ReplayEquation`): where a replayed launch parts.
  `_treelayout`: `TreeLayout`, `LeafLayout`.
* `_treediff`: `TreeDiff`, `LeafDiff`, `GlobalLeaf`.
* `_census`: `EnvDiff`, `EnvEntry`, `MemoryCensus`, `HostMemory`, `DeviceMemory`, `ArrayGroup`.
* `_nonfinite`: `NonfiniteReport`, `NonfiniteLeaf`, `NonfiniteShard`.
* `_audit`: `AuditReport`, `AuditFinding` (what the audit of a running job found).
* `_colltable`: `CollectiveTable`, `CollectiveOp` (a compiled program's collectives, in order).

What a job leaves on disk, and its reading, live here too, so that ``multihost analyze`` and
the notebook's ``postmortem`` read it without jax: `_dumpfile` (the dump format: `Dump`,
`write`, `read_dirs`), `_native` (the stacks faulthandler writes when the GIL is held:
`NativeStacks`, `arm`, `read_dirs`) and `_analyze` (dumps -> `Verdict`, pure). Importing this
package imports none of the three.
"""

from multihost._models._audit import AuditFinding, AuditReport
from multihost._models._census import (
    ArrayGroup,
    DeviceMemory,
    EnvDiff,
    EnvEntry,
    HostMemory,
    MemoryCensus,
)
from multihost._models._hardware import AxisLink, DeviceInfo
from multihost._models._layout import Layout, LayoutBlock, ShardInfo
from multihost._models._nonfinite import NonfiniteLeaf, NonfiniteReport, NonfiniteShard
from multihost._models._records import CollectiveRecord
from multihost._models._replay import Equation as ReplayEquation
from multihost._models._replay import Replay
from multihost._models._replicas import ReplicaDigest, ReplicaGroup, ReplicaReport
from multihost._models._stacks import HostStacks, ThreadStack
from multihost._models._steps import PausedLaunch, Step, StepTable
from multihost._models._timeline import Stragglers, Timeline, TimelineStep
from multihost._models._treediff import GlobalLeaf, LeafDiff, TreeDiff
from multihost._models._treelayout import LeafLayout, TreeLayout
from multihost._models._wavefront import HostFront, Wavefront
from multihost._recorder import FlightRecord

__all__ = [
    'ArrayGroup',
    'AuditFinding',
    'AuditReport',
    'CollectiveRecord',
    'DeviceMemory',
    'EnvDiff',
    'EnvEntry',
    'FlightRecord',
    'GlobalLeaf',
    'HostFront',
    'HostMemory',
    'HostStacks',
    'AxisLink',
    'DeviceInfo',
    'Layout',
    'LayoutBlock',
    'LeafDiff',
    'LeafLayout',
    'MemoryCensus',
    'NonfiniteLeaf',
    'NonfiniteReport',
    'NonfiniteShard',
    'PausedLaunch',
    'Replay',
    'ReplayEquation',
    'ReplicaDigest',
    'ReplicaGroup',
    'ReplicaReport',
    'ShardInfo',
    'Step',
    'StepTable',
    'Stragglers',
    'ThreadStack',
    'Timeline',
    'TimelineStep',
    'TreeDiff',
    'TreeLayout',
    'Wavefront',
]
