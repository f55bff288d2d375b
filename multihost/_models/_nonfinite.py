"""Where the non-finite values (NaN, inf) of a pytree are, as plain data: `NonfiniteShard`,
`NonfiniteLeaf`, `NonfiniteReport` (built by the collective
`multihost._checks._nonfinite.nonfinite`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from multihost._models._layout import Index, Layout, format_index
from multihost._text import fmt_hosts

#: Offending shards each host describes in full; beyond it, a host only counts
#: them (the report says how many were left out).
MAX_RECORDS = 64
#: Shard lines in `NonfiniteReport.format` by default.
MAX_TEXT_SHARDS = 16
# -- the model ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NonfiniteShard:
    """One shard that holds NaN or Inf values.

    Attributes:
        path: the leaf's path (``jax.tree_util.keystr``; ``''`` for a bare array).
        process: the host holding the shard.
        device: the `jax.Device.id` holding it; None for a value in host
            memory (a numpy array or a Python scalar).
        local_device: the device's position among its host's local devices
            (``jax.local_devices()``); None in host memory.
        index: the block the shard holds, ``(start, stop)`` per dimension
            (as `ShardInfo.index`): global coordinates for a global array,
            the host's own value's coordinates for a host-local one.
        nan: how many elements are NaN.
        inf: how many elements are +Inf or -Inf.
        first: the index of the first non-finite element (row-major within
            the shard), in the same coordinates as ``index``.
        host_local: whether the leaf is the host's own value (not a global array).
        replica: the shard's replica id (0 for a block held once).
    """

    path: str
    process: int
    device: int | None
    local_device: int | None
    index: Index
    nan: int
    inf: int
    first: tuple[int, ...] | None
    host_local: bool = False
    replica: int = 0

    @property
    def count(self) -> int:
        """NaN plus Inf elements."""
        return self.nan + self.inf

    def where(self) -> str:
        """``'process 2, device 5 (dev 1)'``, or ``'process 1, host memory'``."""
        if self.device is None:
            return f'process {self.process}, host memory'
        local = '' if self.local_device is None else f' (dev {self.local_device})'
        return f'process {self.process}, device {self.device}{local}'

    def describe(self) -> str:
        """``"['w'] block [0:4, 8:16] on process 2, device 5 (dev 1): 3 NaN, 0 Inf,
        first at (1, 9)"``."""
        path = _short_path(self.path) or '<value>'
        if self.host_local:
            path += ' (host-local)'
        replica = f' replica {self.replica}' if self.replica else ''
        first = '' if self.first is None else f', first at {self.first}'
        return (
            f'{path} block {format_index(self.index)}{replica} on {self.where()}: '
            f'{self.nan} NaN, {self.inf} Inf{first}'
        )


@dataclasses.dataclass(frozen=True)
class NonfiniteLeaf:
    """One leaf with NaN or Inf values somewhere (a summary of its offending shards).

    A global array is one leaf; a host-local value is one leaf per host that
    holds non-finite values in its own copy (``processes`` is then that host).

    Attributes:
        path: the leaf's path.
        host_local: whether it is a host's own value.
        processes: sorted hosts holding offending shards.
        shape: the array's shape (a host-local value: that host's shape).
        dtype: its dtype's name.
        nan: NaN elements over the listed offending shards (replicas counted
            each time).
        inf: Inf elements, likewise.
        shards: offending shards listed in the report.
        first: the first non-finite element over the listed shards (row-major).
        layout: the leaf's `Layout` (a host-local value: the offending host's
            own), for a picture with the offending blocks marked; None when
            not kept (beyond `MAX_LAYOUTS` leaves).
    """

    path: str
    host_local: bool
    processes: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    nan: int
    inf: int
    shards: int
    first: tuple[int, ...] | None
    layout: Layout | None = None

    def marked(self, report: NonfiniteReport) -> dict[Index, str]:
        """Offending block index -> a short note, for a picture: ``'3 NaN, 0 Inf on host 2,
        device 5'``; a replicated block names the host whose replica holds them:
        ``"3 NaN, 0 Inf in host 2's replica (device 5, replica 2 of 4)"``."""
        holders: dict[Index, int] = {}
        for sh in self.layout.shards if self.layout is not None else ():
            holders[sh.index] = holders.get(sh.index, 0) + 1
        out: dict[Index, list[str]] = {}
        for s in report.shards_of(self):
            counts = f'{s.nan} NaN, {s.inf} Inf'
            if s.device is None:
                note = f'{counts} in process {s.process} memory'
            elif holders.get(s.index, 1) > 1:
                note = (
                    f"{counts} in process {s.process}'s replica (device {s.device}, "
                    f'replica {s.replica + 1} of {holders[s.index]})'
                )
            else:
                note = f'{counts} on process {s.process}, device {s.device}'
            out.setdefault(s.index, []).append(note)
        return {index: '; '.join(notes) for index, notes in out.items()}

    def describe(self) -> str:
        """``"['w'] float32[8, 16] on processes 2-3: 3 NaN, 1 Inf in 2 shard(s)"``."""
        local = ' (host-local)' if self.host_local else ''
        shape = ', '.join(map(str, self.shape))
        first = '' if self.first is None else f', first at {self.first}'
        return (
            f'{_short_path(self.path) or "<value>"}{local} {self.dtype}[{shape}] on '
            f'{fmt_hosts(self.processes)}: {self.nan} NaN, {self.inf} Inf in {self.shards} '
            f'shard(s){first}'
        )


@dataclasses.dataclass(frozen=True)
class NonfiniteReport:
    """Which shards of a pytree hold NaN or Inf, on which hosts and devices (`multihost.nonfinite`).

    Every host of a `multihost.nonfinite` call gets an equal report.

    Attributes:
        shards: the offending shards (at most ``max_records`` per host), in
            leaf order, then by process and device.
        leaves: one `NonfiniteLeaf` per offending leaf (per host for a
            host-local value), in the same order.
        checked: what was checked: ``leaves`` (floating-point leaves of a
            host's tree; the most of any host), ``shards`` and ``elements``
            (over every host, replicas counted each time), ``skipped`` (leaves
            that are not floating point; the most of any host).
        num_processes: how many hosts took part.
        truncated: process -> offending shards that host found but did not
            list (beyond ``max_records``); empty when every one is listed.
        max_records: how many offending shards each host could list
            (`MAX_RECORDS`; fewer beyond 64 hosts, `MAX_TOTAL_RECORDS` over all).
    """

    shards: tuple[NonfiniteShard, ...]
    leaves: tuple[NonfiniteLeaf, ...]
    checked: Mapping[str, int]
    num_processes: int
    truncated: Mapping[int, int] = dataclasses.field(default_factory=dict)
    max_records: int = MAX_RECORDS

    @property
    def ok(self) -> bool:
        """True when no element of any leaf, on any host, is NaN or Inf."""
        return not self.shards and not self.truncated

    @property
    def processes(self) -> tuple[int, ...]:
        """Sorted hosts holding at least one offending shard."""
        return tuple(sorted({s.process for s in self.shards} | set(self.truncated)))

    @property
    def nan(self) -> int:
        """NaN elements over the listed shards (replicas counted each time)."""
        return sum(s.nan for s in self.shards)

    @property
    def inf(self) -> int:
        """Inf elements over the listed shards."""
        return sum(s.inf for s in self.shards)

    def shards_of(self, leaf: NonfiniteLeaf | str) -> tuple[NonfiniteShard, ...]:
        """The listed offending shards of one leaf (a `NonfiniteLeaf`, or a path)."""
        if isinstance(leaf, str):
            return tuple(s for s in self.shards if s.path == leaf)
        return tuple(
            s
            for s in self.shards
            if s.path == leaf.path
            and s.host_local == leaf.host_local
            and (not leaf.host_local or s.process in leaf.processes)
        )

    def __getitem__(self, path: str) -> NonfiniteLeaf:
        """The first `NonfiniteLeaf` with this path (``KeyError`` when it is clean)."""
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(f'{path!r} holds no NaN or Inf')

    def headline(self) -> str:
        """One line: clean, or how many shards of how many leaves hold NaN / Inf, and where."""
        c = self.checked
        what = (
            f'{_n(c.get("leaves", 0), "leaf", "leaves")}, {_n(c.get("shards", 0), "shard")}, '
            f'{_n(c.get("elements", 0), "element")} checked on '
            f'{_n(self.num_processes, "process", "processes")}'
        )
        if c.get('skipped'):
            what += f' ({_n(c["skipped"], "non-float leaf", "non-float leaves")} skipped)'
        if self.ok:
            return f'no NaN or Inf: {what}'
        more = sum(self.truncated.values())
        listed = f' ({more} not listed)' if more else ''
        return (
            f'NaN/Inf in {_n(len(self.shards) + more, "shard")}{listed} of '
            f'{_n(len(self.leaves), "leaf", "leaves")} on {fmt_hosts(self.processes)}: '
            f'{self.nan:,} NaN, {self.inf:,} Inf; {what}'
        )

    def format(self, max_shards: int = MAX_TEXT_SHARDS) -> str:
        """The headline, then one line per offending shard (at most ``max_shards``)."""
        lines = [self.headline()]
        lines += ['  ' + s.describe() for s in self.shards[:max_shards]]
        if len(self.shards) > max_shards:
            lines.append(f'  ... {len(self.shards) - max_shards} more shard(s) in .shards')
        for p, n in sorted(self.truncated.items()):
            lines.append(
                f'  ... process {p} found {n} more offending shard(s), not listed '
                f'(at most {self.max_records} per process travel)'
            )
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return (
            f'NonfiniteReport(ok={self.ok}, shards={len(self.shards)}, '
            f'leaves={len(self.leaves)}, processes={list(self.processes)}, '
            f'checked={dict(self.checked)})'
        )


def _n(count: int, one: str, many: str | None = None) -> str:
    """``_n(1, 'shard')`` -> ``'1 shard'``; ``_n(12345, 'shard')`` -> ``'12,345 shards'``."""
    return f'{count:,} {one if count == 1 else many or one + "s"}'


def _short_path(path: str) -> str:
    if len(path) <= 160:
        return path
    return path[:78] + '...' + path[-79:]


# -- on device --------------------------------------------------------------------------
