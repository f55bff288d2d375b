"""Whether the replicas of each block agree, as plain data: `ReplicaDigest`, `ReplicaGroup`,
`ReplicaReport` (built by the collective `multihost._checks._replicas.check_replicas`).
"""

from __future__ import annotations

import collections
import dataclasses

from multihost._models._layout import MAX_TEXT_BLOCKS, Index, Layout, format_index
from multihost._text import fmt_hosts, fmt_list

MAX_TEXT_DIGESTS = 4
#: Devices named per digest in the text; the rest are counted, with their hosts.
MAX_DIGEST_DEVICES = 8


@dataclasses.dataclass(frozen=True)
class ReplicaDigest:
    """The digest of one replica of a block, computed by the host holding it.

    Attributes:
        device_id: the device holding the replica.
        process_index: the process owning the device.
        replica_id: the replica's id (see `ShardInfo.replica_id`).
        digest: hex fingerprint of the replica's bytes (`_checks.fingerprint`:
            ``'x'`` + XXH3-128 for a replica in host memory, the exact kernel
            computed on an accelerator; BLAKE2b-64 for dtypes it does not cover). ``''``
            in a report whose replicas all agree among more than
            `_kv.DIGEST_ABOVE` hosts, for a block not every host holds: only
            the agreement was read, not each host's digests.
    """

    device_id: int | None
    process_index: int
    replica_id: int
    digest: str


@dataclasses.dataclass(frozen=True)
class ReplicaGroup:
    """Every replica of one replicated block, with its digest.

    Attributes:
        index: the block's ``(start, stop)`` per dimension.
        replicas: one `ReplicaDigest` per device holding the block, in
            replica-id order.
    """

    index: Index
    replicas: tuple[ReplicaDigest, ...]

    @property
    def ok(self) -> bool:
        """Whether every replica has the same bytes."""
        return len({r.digest for r in self.replicas}) <= 1

    @property
    def digests(self) -> dict[str, tuple[int | None, ...]]:
        """Digest -> devices holding it, most common digest first."""
        by: dict[str, list[int | None]] = {}
        for r in self.replicas:
            by.setdefault(r.digest, []).append(r.device_id)
        return {d: tuple(by[d]) for d in self._ranked()}

    def _ranked(self) -> list[str]:
        """Distinct digests, most replicas first; ties: lowest replica id first."""
        count = collections.Counter(r.digest for r in self.replicas)
        first: dict[str, int] = {}
        for r in self.replicas:
            first.setdefault(r.digest, r.replica_id)
        return sorted(count, key=lambda d: (-count[d], first[d]))

    @property
    def majority(self) -> str:
        """The digest most replicas hold (on a tie: the one of the lowest replica id)."""
        ranked = self._ranked()
        return ranked[0] if ranked else ''

    @property
    def tied(self) -> bool:
        """Whether no digest has a strict majority of the most common ones (1 vs 1...)."""
        count = collections.Counter(r.digest for r in self.replicas)
        top = count.most_common(2)
        return len(top) == 2 and top[0][1] == top[1][1]

    @property
    def odd(self) -> tuple[ReplicaDigest, ...]:
        """The replicas whose digest differs from the majority."""
        m = self.majority
        return tuple(r for r in self.replicas if r.digest != m)

    @property
    def odd_devices(self) -> tuple[int | None, ...]:
        """Devices holding a replica that differs from the majority."""
        return tuple(r.device_id for r in self.odd)

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Sorted processes holding a replica that differs from the majority."""
        return tuple(sorted({r.process_index for r in self.odd}))

    def describe(self) -> str:
        """Which devices/hosts hold which digest, e.g. for an error message.

        Bounded at any number of hosts: `MAX_TEXT_DIGESTS` digests (most
        common first) with `MAX_DIGEST_DEVICES` devices each are named; the
        rest are counted, with the hosts that hold them.
        """
        procs = {r.device_id: r.process_index for r in self.replicas}
        digests = self.digests
        parts = []
        for digest, devices in list(digests.items())[:MAX_TEXT_DIGESTS]:
            where = ', '.join(f'{d} (process {procs[d]})' for d in devices[:MAX_DIGEST_DEVICES])
            if len(devices) > MAX_DIGEST_DEVICES:
                hosts = fmt_hosts(procs[d] for d in devices)
                where += f', ... ({len(devices)} devices on {hosts})'
            tag = ' (majority)' if digest == self.majority and not self.tied else ''
            parts.append(f'{digest}{tag} on device(s) {where}')
        rest = [d for devices in list(digests.values())[MAX_TEXT_DIGESTS:] for d in devices]
        if rest:
            parts.append(
                f'... {len(digests) - MAX_TEXT_DIGESTS} more digest(s) on {len(rest)} '
                f'device(s) of {fmt_hosts(procs[d] for d in rest)}'
            )
        return f'{format_index(self.index)}: ' + '; '.join(parts)


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    """Whether the replicas of every replicated block of an array hold the same bytes.

    Every host of a `check_replicas` call gets an equal report.

    Attributes:
        layout: the array's `Layout`.
        groups: one `ReplicaGroup` per block held by more than one device, in
            the order of `Layout.blocks`. Blocks held once have nothing to
            compare and are not digested.
    """

    layout: Layout
    groups: tuple[ReplicaGroup, ...]

    @property
    def ok(self) -> bool:
        """Whether every replicated block's replicas agree."""
        return all(g.ok for g in self.groups)

    @property
    def mismatches(self) -> tuple[ReplicaGroup, ...]:
        """The groups whose replicas disagree."""
        return tuple(g for g in self.groups if not g.ok)

    @property
    def odd_devices(self) -> tuple[int | None, ...]:
        """Devices holding a replica that differs from its block's majority, sorted."""
        return tuple(
            sorted(
                {d for g in self.mismatches for d in g.odd_devices},
                key=lambda d: -1 if d is None else d,
            )
        )

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Processes holding a replica that differs from its block's majority, sorted."""
        return tuple(sorted({p for g in self.mismatches for p in g.odd_processes}))

    def __str__(self) -> str:
        head = self.layout.headline()
        if not self.groups:
            return f'{head}: no block is replicated, nothing to compare'
        if self.ok:
            n = sum(len(g.replicas) for g in self.groups)
            return (
                f'{head}: replicas agree ({len(self.groups)} replicated block(s), {n} replica(s))'
            )
        bad = self.mismatches
        lines = [
            f'{head}: replicas DIFFER in {len(bad)} of {len(self.groups)} replicated '
            f'block(s); odd process(es) {fmt_list(self.odd_processes)}, odd device(s) '
            f'{fmt_list(self.odd_devices)}'
        ]
        lines += [f'  {g.describe()}' for g in bad[:MAX_TEXT_BLOCKS]]
        if len(bad) > MAX_TEXT_BLOCKS:
            lines.append(f'  ... {len(bad) - MAX_TEXT_BLOCKS} more block(s)')
        return '\n'.join(lines)
