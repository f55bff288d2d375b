"""What the notebook side calls on each engine (one engine = one host = one JAX process).

`mhnotebook` ships a tiny trampoline over ipyparallel that imports this
package on the engine and calls ``multihost.engine.<name>``, so the real code
is installed, versioned and tested here rather than pickled from the
notebook. Everything returns plain, picklable data. Where this engine is:
`net`; the gather export: `gather` (structure made portable: `portable`);
the other calls: `calls`; on a job the notebook attached to, the data tools in each
host's stopped frame and, with ``--allow-exec``, its ``%%mh`` cells (`run_cell`): `stopped`,
`cell`; every tool a job view calls on its hosts, once: `tools`. A session's engine starts
with `start` (JAX, then `multihost.install`): it and this face stand above `_job`, whose
installer runs `stopped`, the rest of the room below it (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from multihost.engine.calls import (
    barrier,
    diff,
    env_diff,
    layout,
    memory_census,
    nonfinite,
    realign_sequence,
    sequence_position,
    serve_control,
)
from multihost.engine.cell import run_cell
from multihost.engine.gather import (
    GatherError,
    gather_local,
    gather_meta,
    gather_send,
    gather_write,
    lookup,
    meta_digest,
)
from multihost.engine.net import (
    controller_address,
    engine_info,
    free_port,
    host_port,
    machine_id,
    route_source,
    split_url,
)
from multihost.engine.portable import CellObject, NotShipped
from multihost.engine.start import initialize, install, same_cell_names

__all__ = [
    'CellObject',
    'GatherError',
    'NotShipped',
    'barrier',
    'controller_address',
    'diff',
    'engine_info',
    'env_diff',
    'free_port',
    'gather_local',
    'gather_meta',
    'gather_send',
    'gather_write',
    'host_port',
    'run_cell',
    'initialize',
    'install',
    'layout',
    'lookup',
    'machine_id',
    'memory_census',
    'meta_digest',
    'nonfinite',
    'realign_sequence',
    'route_source',
    'same_cell_names',
    'sequence_position',
    'serve_control',
    'split_url',
]
