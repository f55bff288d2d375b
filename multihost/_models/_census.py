"""What differs between hosts, as plain data: the environment (`EnvEntry`, `EnvDiff`) and the
memory census (`DeviceMemory`, `ArrayGroup`, `HostMemory`, `MemoryCensus`), built by the
collectives of `multihost._checks._census`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from multihost._text import fmt_hosts

#: Host groups, and devices, that `MemoryCensus.format` lists; the rest are counted.
MAX_TEXT_LINES = 16
#: A device whose peak comes within this fraction of its limit is warned about.
NEAR_LIMIT = 0.10


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One key whose value differs between hosts.

    Attributes:
        key: ``'env.XLA_FLAGS'``, ``'version.jaxlib'``, ``'jax.config.jax_enable_x64'``,
            ``'git.commit'``, ``'source.train.py'``, ...
        values: indexed by process: the value there (None: absent on that host).
        majority: the most common value (ties: the lowest process's).
        odd_processes: hosts whose value is not the majority's.
    """

    key: str
    values: tuple[str | None, ...]
    majority: str | None
    odd_processes: tuple[int, ...]

    def describe(self) -> str:
        odd = '; '.join(
            f'{fmt_hosts([p])}: {_show(self.values[p])}' for p in self.odd_processes[:8]
        )
        more = f' (+{len(self.odd_processes) - 8} more)' if len(self.odd_processes) > 8 else ''
        return f'{self.key}: {_show(self.majority)} on most; {odd}{more}'


def _show(value: str | None) -> str:
    return '(unset)' if value is None else repr(value)


def _entry(key: str, values: Mapping[int, str | None], n: int) -> EnvEntry:
    vals = tuple(values.get(p) for p in range(n))
    counts: dict[str | None, int] = {}
    for v in vals:
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.values())
    majority = next(v for v in vals if counts[v] == best)
    odd = tuple(p for p, v in enumerate(vals) if v != majority)
    return EnvEntry(key=key, values=vals, majority=majority, odd_processes=odd)


@dataclasses.dataclass(frozen=True)
class EnvDiff:
    """What differs between the hosts' environments (`env_diff`).

    Attributes:
        num_processes: how many hosts were compared.
        entries: keys that differ, ordered by key (empty: identical hosts).
        per_host: keys that differ per host by design (ranks, worker ids,
            visible devices, host names, ports, addresses), listed apart.
        compared: how many keys each host compared (process 0's count).
    """

    num_processes: int
    entries: tuple[EnvEntry, ...]
    per_host: tuple[EnvEntry, ...] = ()
    compared: int = 0

    @property
    def ok(self) -> bool:
        """No key differs (keys that differ by design do not count)."""
        return not self.entries

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Hosts that differ from the majority in at least one key."""
        return tuple(sorted({p for e in self.entries for p in e.odd_processes}))

    def __getitem__(self, key: str) -> EnvEntry:
        for e in self.entries + self.per_host:
            if e.key == key:
                return e
        raise KeyError(f'{key!r} does not differ between processes')

    def format(self) -> str:
        head = (
            f'environments of {self.num_processes} processes ({self.compared} keys compared): '
            + (
                'identical'
                if self.ok
                else f'{len(self.entries)} key(s) differ, odd: {fmt_hosts(self.odd_processes)}'
            )
        )
        lines = [head] + [f'  {e.describe()}' for e in self.entries]
        if self.per_host:
            lines.append(
                f'  differ per process by design: {", ".join(e.key for e in self.per_host[:20])}'
                + (' ...' if len(self.per_host) > 20 else '')
            )
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format()


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device's memory.

    Attributes:
        id: the jax device id.
        process: the host's process index.
        local: the device's index among its host's devices.
        live_bytes: bytes of live arrays' shards on this device (always known).
        in_use / peak / limit: from ``memory_stats()``; None where the backend
            reports none (CPU does not).
        largest_free: ``memory_stats()['largest_free_block_bytes']`` (TPU): the
            biggest allocation that still fits (fragmentation); None where not reported.
        padded_bytes: bytes live arrays take on the device with the layout's
            padding (``on_device_size_in_bytes``); None: as ``live_bytes``.
        kind: the device kind (``'TPU v5 lite'``); ``''`` unknown.
        coords: the chip's coordinates (TPU); ``()`` where the platform has none.
    """

    id: int
    process: int
    local: int
    live_bytes: int
    in_use: int | None = None
    peak: int | None = None
    limit: int | None = None
    largest_free: int | None = None
    padded_bytes: int | None = None
    kind: str = ''
    coords: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        text = f'process {self.process} · dev {self.local} (id {self.id})'
        if self.coords:
            text += f' chip ({",".join(map(str, self.coords))})'
        return text

    @property
    def headroom(self) -> int | None:
        """``limit - peak``: what the worst moment so far left free; None unknown."""
        if self.limit is None or self.peak is None:
            return None
        return self.limit - self.peak

    @property
    def near_limit(self) -> bool:
        """Whether the peak came within `NEAR_LIMIT` of the limit."""
        if not self.limit:
            return False
        return (self.peak or 0) >= self.limit * (1 - NEAR_LIMIT)


@dataclasses.dataclass(frozen=True)
class ArrayGroup:
    """Live arrays of one kind: (shape, dtype, sharding spec), counted per host.

    Attributes:
        shape, dtype, spec: what identifies the kind.
        counts: indexed by process: how many such arrays that host holds.
        host_bytes: bytes one such array takes on a host (its addressable shards).
        names: engine-namespace names that refer to such arrays, where known.
    """

    shape: tuple[int, ...]
    dtype: str
    spec: str
    counts: tuple[int, ...]
    host_bytes: int
    names: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return f'{self.dtype}{list(self.shape)} {self.spec}'.rstrip()

    @property
    def extra_processes(self) -> tuple[int, ...]:
        """Hosts holding more of these than the fewest any host holds."""
        low = min(self.counts)
        return tuple(p for p, c in enumerate(self.counts) if c > low)


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """One host's live arrays and devices."""

    process: int
    live_count: int
    live_bytes: int
    devices: tuple[DeviceMemory, ...]
    largest: tuple[ArrayGroup, ...] = ()


@dataclasses.dataclass(frozen=True)
class MemoryCensus:
    """Memory across hosts (`memory_census`).

    Attributes:
        hosts: one `HostMemory` per process.
        only_some: kinds of live arrays whose count differs between hosts
            (leak candidates), largest first.
        stats_available: whether the backend reports ``memory_stats()``.
    """

    hosts: tuple[HostMemory, ...]
    only_some: tuple[ArrayGroup, ...] = ()
    stats_available: bool = False

    @property
    def median_bytes(self) -> float:
        return statistics.median(h.live_bytes for h in self.hosts) if self.hosts else 0.0

    @property
    def heavy_processes(self) -> tuple[int, ...]:
        """Hosts whose live bytes exceed the median by more than 10% and 1 MiB."""
        med = self.median_bytes
        return tuple(
            h.process
            for h in self.hosts
            if h.live_bytes > med * 1.1 and h.live_bytes - med > (1 << 20)
        )

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Hosts that stand out: heavy, or holding arrays the others do not (1 MiB or more)."""
        extra = {p for g in self.only_some if g.host_bytes >= (1 << 20) for p in g.extra_processes}
        return tuple(sorted(extra | set(self.heavy_processes)))

    def format(self) -> str:
        """The verdict, then hosts and devices grouped by identical lines, and the kinds of
        arrays only some hosts hold. Bounded at any number of hosts: at most
        `MAX_TEXT_LINES` lines of hosts (those that stand out always among them) and of
        devices, the rest counted."""
        lines = [
            f'memory of {len(self.hosts)} processes: live arrays per process, median '
            f'{_mib(self.median_bytes)}'
            + (
                f'; odd: {fmt_hosts(self.odd_processes)}'
                if self.odd_processes
                else '; no process stands out'
            )
        ]
        lines += self._host_lines()
        if not self.stats_available:
            lines.append(
                '  device memory_stats(): not reported by this backend (CPU); '
                'device figures are live-array bytes'
            )
        else:
            lines += self.hbm_lines()
            if sum(d.in_use is not None for d in self.devices) <= MAX_TEXT_LINES:
                lines += self._device_lines()  # a few devices: each one's figures
        for g in self.only_some[:10]:
            names = f' ({", ".join(g.names[:3])})' if g.names else ''
            lines.append(
                f'  only some processes hold {g.kind}{names}, {_mib(g.host_bytes)} each: '
                + _by_count(g.counts)
            )
        if len(self.only_some) > 10:
            lines.append(
                f'  ... and {len(self.only_some) - 10} more kinds only some processes hold'
            )
        return '\n'.join(lines)

    def _host_lines(self) -> list[str]:
        """``'  processes 0-2, 4: 3 arrays, 8.0 MiB'``: hosts with the same line grouped."""
        heavy = set(self.heavy_processes)
        groups: dict[str, list[int]] = {}
        for h in self.hosts:
            mark = ' <-- stands out' if h.process in heavy else ''
            line = f'{h.live_count} arrays, {_mib(h.live_bytes)}{mark}'
            groups.setdefault(line, []).append(h.process)
        items = list(groups.items())
        if len(items) > MAX_TEXT_LINES:
            # The hosts that stand out first, then the largest groups; shown in process order.
            ranked = sorted(items, key=lambda kv: (heavy.isdisjoint(kv[1]), -len(kv[1])))
            items = sorted(ranked[: MAX_TEXT_LINES - 1], key=lambda kv: kv[1][0])
        lines = [f'  {fmt_hosts(ps)}: {text}' for text, ps in items]
        shown = {p for _, ps in items for p in ps}
        left = [h.live_bytes for h in self.hosts if h.process not in shown]
        if left:
            lines.append(
                f'  ... and {len(left)} more processes ({len(groups) - len(items)} other lines), '
                f'{_span(left)} each'
            )
        return lines

    @property
    def devices(self) -> tuple[DeviceMemory, ...]:
        return tuple(d for h in self.hosts for d in h.devices)

    def near_limit(self) -> tuple[DeviceMemory, ...]:
        """Devices whose peak came within `NEAR_LIMIT` of their limit."""
        return tuple(d for d in self.devices if d.near_limit)

    def hbm_lines(self) -> list[str]:
        """Device memory in a few lines at any number of chips: in use, peak and limit
        (median and range), the least headroom and the smallest largest-free-block (and where),
        padded against logical bytes, the devices that stand out by in use and by peak
        (grouped by host), and a warning when a peak nears the limit."""
        devs = [d for d in self.devices if d.in_use is not None]
        if not devs:
            return []
        kinds = sorted({d.kind for d in devs if d.kind})
        what = f'{len(devs)} device{"s" * (len(devs) != 1)}' + (
            f' ({", ".join(kinds)})' if kinds else ''
        )
        lines = [
            f'  device memory of {what}: in use {_stat([d.in_use or 0 for d in devs])}, '
            f'peak {_stat([d.peak or 0 for d in devs])}'
            + (
                f', limit {_span([d.limit for d in devs if d.limit])}'
                if any(d.limit for d in devs)
                else ''
            )
        ]
        room = [d for d in devs if d.headroom is not None]
        parts = []
        if room:
            worst = min(room, key=lambda d: d.headroom or 0)
            parts.append(
                f'headroom (limit - peak) least {_mib(worst.headroom or 0)} on {worst.label}'
            )
        free = [d for d in devs if d.largest_free is not None]
        if free:
            worst = min(free, key=lambda d: d.largest_free or 0)
            parts.append(
                f'largest free block smallest {_mib(worst.largest_free or 0)} on {worst.label}'
            )
        else:
            parts.append('largest free block: not reported by this backend')
        lines.append('  ' + '; '.join(parts))
        logical = sum(d.live_bytes for d in self.devices)
        padded = sum(
            d.padded_bytes if d.padded_bytes is not None else d.live_bytes for d in self.devices
        )
        if padded != logical:
            lines.append(
                f'  live arrays on device: {_mib(padded)} with padding, {_mib(logical)} logical '
                f'(+{100 * (padded - logical) / max(logical, 1):.0f}%)'
            )
        for name, key in (('in use', 'in_use'), ('peak', 'peak')):
            line = _outliers(devs, name, key)
            if line:
                lines.append(line)
        near = [d for d in devs if d.near_limit]
        if near:
            least = min(near, key=lambda d: d.headroom or 0)
            lines.append(
                f'  WARNING: peak within {NEAR_LIMIT:.0%} of the limit on {_who(near)}: '
                f'least headroom {_mib(least.headroom or 0)} ({least.label}); a step that '
                'needs more than that fails with RESOURCE_EXHAUSTED'
            )
        return lines

    def _device_lines(self) -> list[str]:
        """Devices that report ``memory_stats()``, those with the same line grouped; beyond
        `MAX_TEXT_LINES` groups, the largest group and the most memory in use, the rest
        counted."""
        groups: dict[str, list[DeviceMemory]] = {}
        for h in self.hosts:
            for d in h.devices:
                if d.in_use is None:
                    continue
                lim = f' of {_mib(d.limit)}' if d.limit else ''
                line = f'in use {_mib(d.in_use)}{lim}, peak {_mib(d.peak or 0)}'
                groups.setdefault(line, []).append(d)
        items = list(groups.items())
        if len(items) > MAX_TEXT_LINES:
            largest = max(items, key=lambda kv: len(kv[1]))[0]
            heaviest = sorted(
                (text for text in groups if text != largest),
                key=lambda text: -max(d.in_use or 0 for d in groups[text]),
            )
            keep = {largest, *heaviest[: MAX_TEXT_LINES - 2]}
            items = [kv for kv in items if kv[0] in keep]
        lines = []
        for text, devs in items:
            who = (
                devs[0].label
                if len(devs) == 1
                else f'{len(devs)} devices of {fmt_hosts({d.process for d in devs})}'
            )
            lines.append(f'  {who}: {text}')
        shown = {text for text, _ in items}
        left = [d.in_use or 0 for text, devs in groups.items() if text not in shown for d in devs]
        if left:
            lines.append(
                f'  ... and {len(left)} more devices ({len(groups) - len(items)} other lines), '
                f'in use {_span(left)}'
            )
        return lines

    def __str__(self) -> str:
        return self.format()


def _by_count(counts: Sequence[int], max_groups: int = 4) -> str:
    """``(0, 0, 0, 1)`` -> ``'1 on process 3; 0 on processes 0-2'`` (fewest hosts first)."""
    hosts: dict[int, list[int]] = {}
    for p, c in enumerate(counts):
        hosts.setdefault(c, []).append(p)
    ranked = sorted(hosts.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    text = '; '.join(f'{c} on {fmt_hosts(ps)}' for c, ps in ranked[:max_groups])
    if len(ranked) > max_groups:
        rest = sum(len(ps) for _, ps in ranked[max_groups:])
        text += f'; ... {len(ranked) - max_groups} other counts on {rest} processes'
    return text


def _stat(values: Sequence[int]) -> str:
    """``'median 1.0 MiB (0.9 MiB to 3.1 MiB)'``."""
    med = _mib(statistics.median(values))
    span = _span(values)
    return f'median {med}' if span == med else f'median {med} ({span})'


def _who(devs: Sequence[DeviceMemory]) -> str:
    """``'process 3 · dev 0 (id 6)'`` for one, ``'5 devices of processes 2, 7'``."""
    if len(devs) == 1:
        return devs[0].label
    return f'{len(devs)} devices of {fmt_hosts({d.process for d in devs})}'


def _outliers(devs: Sequence[DeviceMemory], name: str, key: str) -> str:
    """The devices whose ``key`` exceeds the median by more than 10% and 1 MiB, grouped."""
    values = [getattr(d, key) or 0 for d in devs]
    med = statistics.median(values)
    odd = [d for d, v in zip(devs, values) if v > med * 1.1 and v - med > (1 << 20)]
    if not odd:
        return ''
    span = _span([getattr(d, key) or 0 for d in odd])
    return f'  stand out by {name}: {_who(odd)}, {span} (median {_mib(med)})'


def _mib(n: float | int) -> str:
    return f'{n / (1 << 20):.1f} MiB'


def _span(values: Sequence[int]) -> str:
    """``'8.0 MiB'`` or ``'8.0 MiB to 9.6 MiB'``: the range of byte counts."""
    lo, hi = _mib(min(values)), _mib(max(values))
    return lo if lo == hi else f'{lo} to {hi}'
