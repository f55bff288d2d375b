"""A pytree's layout, as plain data: a `Layout` and a `ReplicaReport` per leaf (`LeafLayout`,
`TreeLayout`; built by `multihost._checks._treelayout.tree_layout`).
"""

from __future__ import annotations

import dataclasses

from multihost._models._layout import Layout, format_bytes
from multihost._models._replicas import ReplicaReport
from multihost._text import fmt_hosts


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """One leaf of a `TreeLayout`.

    Attributes:
        path: the leaf's path, as `jax.tree_util.keystr` writes it
            (``"['block_0']['Dense_0']['kernel']"``).
        layout: its `Layout`; None for a leaf that is not an array (``note``
            says what it is).
        report: its `ReplicaReport` when replicas were checked (global
            `jax.Array` leaves), else None.
        note: why there is no layout.
    """

    path: str
    layout: Layout | None
    report: ReplicaReport | None = None
    note: str = ''

    @property
    def shape(self) -> tuple[int, ...] | None:
        return None if self.layout is None else self.layout.shape

    @property
    def dtype(self) -> str:
        return '' if self.layout is None else self.layout.dtype

    @property
    def spec(self) -> str:
        """The partition spec (``"P(None, 'model')"``), else the sharding's kind."""
        if self.layout is None:
            return ''
        return self.layout.spec or self.layout.sharding

    @property
    def bytes_per_host(self) -> dict[int, int]:
        """Process -> bytes of this leaf it holds (every copy on its devices)."""
        return {} if self.layout is None else self.layout.bytes_per_process()

    def bytes_text(self) -> str:
        """``'1.0 KiB each'`` when every host holds as much, else the range and the largest."""
        per = self.bytes_per_host
        if not per or self.layout is None:
            return ''
        sizes = set(per.values())
        n = self.layout.num_processes
        held = {p: b for p, b in per.items() if b}
        if self.host_local:
            p = min(held or per)
            return f"{format_bytes(per[p])} (host-local: process {p}'s own)"
        if len(sizes) == 1 and len(per) == n:
            return f'{format_bytes(sizes.pop())} each' if n > 1 else format_bytes(sizes.pop())
        return (
            f'{format_bytes(min(per.values()))} to {format_bytes(max(per.values()))} '
            f'(held on {fmt_hosts(sorted(held))})'
        )

    @property
    def host_local(self) -> bool:
        """Whether the leaf is each host's own value (numpy, or a jax.Array on one host's
        devices in a job of several): the layout is process 0's."""
        if self.layout is None:
            return False
        holders = {s.process_index for s in self.layout.shards}
        return self.layout.sharding == 'numpy' or (
            self.layout.num_processes > 1 and len(holders) == 1
        )

    @property
    def replicas_ok(self) -> bool | None:
        """True: every replica agrees; False: some differ; None: not checked or not replicated."""
        if self.report is None or not self.report.groups:
            return None
        return self.report.ok

    def replicas_text(self) -> str:
        """``'agree'``, ``'DIFFER on process 2'``, ``'not replicated'``, ``'not checked'``, or
        for a host-local leaf a pointer to ``%mh_diff``."""
        if self.host_local:
            return 'host-local: compare with %mh_diff'
        if self.report is None:
            return 'not checked' if self.layout is not None else ''
        if not self.report.groups:
            return 'not replicated'
        if self.report.ok:
            return 'agree'
        return f'DIFFER on {fmt_hosts(self.report.odd_processes)}'


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """The layout of every leaf of a pytree, in tree order.

    Attributes:
        name: what the tree is called (the engine name, e.g. ``'state.params'``).
        leaves: one `LeafLayout` per leaf.
        num_processes: the job's process count.
    """

    name: str
    leaves: tuple[LeafLayout, ...]
    num_processes: int

    @property
    def ok(self) -> bool:
        """Whether no leaf's replicas differ."""
        return all(leaf.replicas_ok is not False for leaf in self.leaves)

    @property
    def nbytes(self) -> int:
        """Bytes of data over all leaves (one copy each)."""
        return sum(leaf.layout.nbytes for leaf in self.leaves if leaf.layout is not None)

    def leaf(self, path: str) -> LeafLayout:
        """The leaf at ``path`` (as in `LeafLayout.path`).

        Raises:
            KeyError: no such leaf (the message lists some).
        """
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        some = ', '.join(leaf.path for leaf in self.leaves[:6])
        raise KeyError(f'{self.name} has no leaf {path!r}; its leaves: {some}, ...')

    def headline(self) -> str:
        differ = [leaf for leaf in self.leaves if leaf.replicas_ok is False]
        text = f'{self.name}: {len(self.leaves)} leaves, {format_bytes(self.nbytes)}'
        if differ:
            text += f'; replicas DIFFER in {len(differ)} leaf(s)'
        return text

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """(leaf, shape, dtype, spec, bytes per process, replicas) per leaf, as text."""
        return [
            (
                leaf.path,
                '' if leaf.shape is None else str(list(leaf.shape)),
                leaf.dtype or leaf.note,
                leaf.spec,
                leaf.bytes_text(),
                leaf.replicas_text(),
            )
            for leaf in self.leaves
        ]

    def __str__(self) -> str:
        head = ('leaf', 'shape', 'dtype', 'spec', 'bytes per process', 'replicas')
        rows = [head, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [self.headline()]
        lines += ['  ' + '  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return '\n'.join(lines)
