"""Synthetic layouts the layout-view tests share (pure models: no device, no cluster).

Four hosts with two devices each, device ids as a 4-process CPU job numbers them
(``0, 1, 2048, 2049, ...``), on a ``host x dev`` mesh unless said otherwise.
Importable from test modules as ``from _layout_cases import ...``.
"""

from __future__ import annotations

from collections.abc import Callable

from multihost import Layout, ReplicaDigest, ReplicaGroup, ReplicaReport, ShardInfo

IDS = (0, 1, 2048, 2049, 4096, 4097, 6144, 6145)
MESH = (('host', 4), ('dev', 2))
GOOD, BAD = '0d4e8c2a7b91f350', '6c1f0a9be2d34f11'


def did(host: int, dev: int) -> int:
    """The id of device ``dev`` of ``host``."""
    return IDS[2 * host + dev]


def _named(shape, placements, spec, mesh_axes=MESH, mesh_ids=IDS) -> Layout:
    return Layout.from_placements(
        shape,
        'float32',
        placements,
        mesh_axes=mesh_axes,
        mesh_device_ids=mesh_ids,
        spec=spec,
        sharding='NamedSharding',
    )


def replicated() -> Layout:
    """float32[8], P(): one block, a replica on each of the 8 devices."""
    return _named((8,), [([(0, 8)], did(h, d), h) for h in range(4) for d in range(2)], 'P()')


def rows_over_x() -> Layout:
    """float32[16, 12], P('x') on a 1-d mesh of all 8 devices: 8 row blocks."""
    placements = [([(2 * i, 2 * i + 2), (0, 12)], IDS[i], i // 2) for i in range(8)]
    return _named((16, 12), placements, "P('x')", mesh_axes=(('x', 8),))


def host_by_dev() -> Layout:
    """float32[16, 12], P('host', 'dev'): rows by host, columns by device (the quickstart's x)."""
    placements = [
        ([(4 * h, 4 * h + 4), (6 * d, 6 * d + 6)], did(h, d), h) for h in range(4) for d in range(2)
    ]
    return _named((16, 12), placements, "P('host', 'dev')")


def rows_by_host() -> Layout:
    """float32[16, 12], P('host', None): each host's row block on both of its devices."""
    placements = [([(4 * h, 4 * h + 4), (0, 12)], did(h, d), h) for h in range(4) for d in range(2)]
    return _named((16, 12), placements, "P('host', None)")


def rows_by_dev() -> Layout:
    """float32[8, 6], P('dev', None): each row block on one device of every host."""
    placements = [([(4 * d, 4 * d + 4), (0, 6)], did(h, d), h) for h in range(4) for d in range(2)]
    return _named((8, 6), placements, "P('dev', None)")


def batch_3d() -> Layout:
    """float32[8, 6, 4], P('host', 'dev', None): 4 facets over dim 0, 2 blocks each."""
    placements = [
        ([(2 * h, 2 * h + 2), (3 * d, 3 * d + 3), (0, 4)], did(h, d), h)
        for h in range(4)
        for d in range(2)
    ]
    return _named((8, 6, 4), placements, "P('host', 'dev', None)")


def layout_2d() -> Layout:
    """float32[4, 6]: 2x2 blocks, devices 0-1 on process 0, 2-3 on process 1 (no mesh)."""
    return Layout.from_placements(
        (4, 6),
        'float32',
        [
            ([(0, 2), (0, 3)], 0, 0),
            ([(0, 2), (3, 6)], 1, 0),
            ([(2, 4), (0, 3)], 2, 1),
            ([(2, 4), (3, 6)], 3, 1),
        ],
    )


def layout_3d() -> Layout:
    """float32[4, 6, 2]: dim 0 over 2 hosts, dim 2 in 2 blocks, each block on 2 devices."""
    placements = []
    for h in range(2):
        for k in range(2):
            for r in range(2):
                placements.append(([(2 * h, 2 * h + 2), (0, 6), (k, k + 1)], h * 4 + k * 2 + r, h))
    return Layout.from_placements((4, 6, 2), 'float32', placements)


def many_facets(n: int = 40) -> Layout:
    """float32[n, 4, 6]: dim 0 in n blocks dealt over the 8 devices: n facets."""
    placements = [([(i, i + 1), (0, 4), (0, 6)], IDS[i % 8], (i % 8) // 2) for i in range(n)]
    return Layout.from_placements((n, 4, 6), 'float32', placements)


def report(
    layout: Layout, odd: Callable[[ShardInfo], bool] = lambda s: s.process_index == 2
) -> ReplicaReport:
    """A ReplicaReport in which the replicas for which ``odd`` holds have another digest."""
    groups = []
    for b in layout.blocks():
        if b.replica_count < 2:
            continue
        groups.append(
            ReplicaGroup(
                b.index,
                tuple(
                    ReplicaDigest(
                        s.device_id, s.process_index, s.replica_id, BAD if odd(s) else GOOD
                    )
                    for s in b.shards
                ),
            )
        )
    return ReplicaReport(layout, tuple(groups))


def on_devices(*ids: int) -> Callable[[ShardInfo], bool]:
    """`report`'s ``odd``: the replicas on the devices ``ids`` (no ids: all replicas agree)."""
    return lambda s: s.device_id in ids
