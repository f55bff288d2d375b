"""Where each host of a stopped job was read: one frame's line and its launch counts (plain data).

The data tools of an attached job (`multihost.engine.stopped`) read each host's stopped frame.
Hosts stopped at different points (the failing host raised before building the batch the
others already launched with) hold values of different steps under one name: a value
combined across them (a gather, a diff, a layout, a NaN census) joins blocks no step ever
had. `apart` says so, naming which host was read where; the notebook prints it with the
tool's result.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from multihost._text import fmt_hosts


@dataclasses.dataclass(frozen=True)
class ReadPoint:
    """Where one host's data tool read its values.

    Attributes:
        process: the host.
        site: the frame read, ``train.py:95 in train`` ('' when unknown).
        launches: jitted function name -> how many times this host launched it so far.
    """

    process: int
    site: str
    launches: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {'process': self.process, 'site': self.site, 'launches': list(self.launches)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReadPoint:
        launches = tuple((str(k), int(v)) for k, v in data.get('launches', ()))
        return cls(int(data['process']), str(data.get('site', '')), launches)


def apart(points: list[ReadPoint]) -> str:
    """One sentence when the hosts were read at different points ('' when all at one): each
    group of hosts with its frame's line and the launches that differ between the groups."""
    if len({(p.site, p.launches) for p in points}) <= 1:
        return ''
    counts = [dict(p.launches) for p in points]
    names = sorted({n for c in counts for n in c})
    differ = [n for n in names if len({c.get(n, 0) for c in counts}) > 1]
    groups: dict[str, list[int]] = {}
    for point, count in zip(points, counts):
        made = ', '.join(f'{n} called {count.get(n, 0)}x' for n in differ)
        words = (point.site or 'an unknown line') + (f' ({made})' if made else '')
        groups.setdefault(words, []).append(point.process)
    said = '; '.join(f'{fmt_hosts(ps)} at {w}' for w, ps in groups.items())
    return (
        f'the processes were read at different points: {said}. Values combined across them '
        "come from different points of the program (a process behind holds an earlier step's "
        'values under the same name)'
    )
