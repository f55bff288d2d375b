"""The engine tools: one registry that both kinds of job view call their hosts' tools from.

A notebook's job views reach their hosts two ways: a `Session`'s engines run a tool
through ipyparallel (the notebook's trampoline, `mhnotebook._trampoline.tool`, looks it
up here on the engine), an attached job's hosts run it on their debug threads in the stopped
frame (`multihost.engine.stopped`, which looks it up here too). Each `Tool` says once what
both need: its name (what travels), the function, whether its first argument is the
namespace it reads names in (a session's engine namespace, or the stopped frame's names),
its default timeout, and whether a stopped host may run it (an attached job's control key
grants the data tools, not every engine call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ['TOOLS', 'Tool', 'tool']


@dataclasses.dataclass(frozen=True)
class Tool:
    """One engine tool.

    Attributes:
        name: what the notebook asks for (``'layout'``).
        function: the function the host runs.
        namespace: its first argument is the namespace names are read in.
        timeout: seconds a view waits for it unless told otherwise.
        on_stopped: an attached job's stopped hosts may run it (`multihost.engine.stopped`); a
            session's engines run every tool.
    """

    name: str
    function: Callable[..., Any]
    namespace: bool
    timeout: float
    on_stopped: bool = True


def _tools() -> dict[str, Tool]:
    from multihost.engine import calls, cell, gather

    table = [
        Tool('gather_meta', gather.gather_meta, True, 600.0),
        Tool('gather_send', gather.gather_send, True, 600.0),
        Tool('gather_local', gather.gather_local, True, 600.0),
        # Shared memory on this machine: only a session's engines write there.
        Tool('gather_write', gather.gather_write, True, 600.0, on_stopped=False),
        Tool('layout', calls.layout, True, 120.0),
        Tool('diff', calls.diff, True, 120.0),
        Tool('nonfinite', calls.nonfinite, True, 120.0),
        # Compiles and runs the launch on copies: on an attached job, its hosts held before
        # the launch (their main threads wait in the hold, not inside a launch).
        Tool('replay', calls.replay, True, 600.0),
        Tool('memory_census', calls.memory_census, True, 120.0),
        Tool('env_diff', calls.env_diff, False, 120.0),
        # A %%mh cell on an attached job (only with --allow-exec; a session's engines run
        # cells through ipyparallel's execute instead).
        Tool('run_cell', cell.run_cell, True, 60.0),
    ]
    return {t.name: t for t in table}


#: Every engine tool by name (see `Tool`).
TOOLS: dict[str, Tool] = _tools()


def tool(name: str) -> Tool:
    """The tool called ``name``; a ValueError naming the known ones otherwise."""
    found = TOOLS.get(name)
    if found is None:
        raise ValueError(f'no engine tool {name!r}; known: {", ".join(sorted(TOOLS))}')
    return found
