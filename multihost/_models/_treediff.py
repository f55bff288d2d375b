"""What a tree diff found: `TreeDiff`, `LeafDiff`, `GlobalLeaf` and their bounded text.

Plain, picklable data (Python values and read-only numpy arrays): the notebook
receives them from the engines and draws widgets from them.
`multihost._checks._treediff` computes them (see docs/ARCHITECTURE.md, "Tree diff").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from multihost._models._layout import Index, format_index
from multihost._text import fmt_hosts as _fmt_hosts

#: Leaves with at most this many elements keep every host's values in their
#: `LeafDiff` (so a view can show them side by side); larger leaves keep only
#: the per-host summary.
SMALL_LEAF = 64

_MAX_PATH_CHARS = 160  # longest leaf path quoted in a message
#: Characters of a string (or other non-array) leaf kept in its `LeafDiff`.
MAX_TEXT_CHARS = 200
_MAX_TEXT_SHOWN = 60  # characters of such a value quoted in a message
_MAX_PATHS_SHOWN = 5  # global leaves named in a summary's note


def _fmt_path(path: str) -> str:
    if len(path) <= _MAX_PATH_CHARS:
        return path
    half = (_MAX_PATH_CHARS - 3) // 2
    return path[:half] + '...' + path[-half:]


def _fmt_text(value: str) -> str:
    """A string leaf's value as Python writes it, cut to a bounded length."""
    if len(value) > _MAX_TEXT_SHOWN:
        return repr(value[: _MAX_TEXT_SHOWN - 3]) + '...'
    return repr(value)


def _fmt_sig(shape: tuple[int, ...] | None, dtype: str | None) -> str:
    if shape is None:
        return 'missing'
    return f'{dtype}[{",".join(map(str, shape))}]'


def _canon(value: Any) -> Any:
    """A hashable, exactly comparable stand-in (arrays by bytes, floats by repr)."""
    if isinstance(value, np.ndarray):
        return ('ndarray', value.dtype.str, value.dtype.name, value.shape, value.tobytes())
    if isinstance(value, float):
        return ('float', repr(value))
    if isinstance(value, Mapping):
        return tuple(sorted((k, _canon(v)) for k, v in value.items()))
    if isinstance(value, tuple | list):
        return tuple(_canon(v) for v in value)
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        try:
            return value.tolist()
        except (TypeError, ValueError):
            return repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf': JSON has no literal for them
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


#: `LeafDiff.describe` says the distance in ulps below this (values near each other: a
#: rounding, a flipped low bit); farther apart, the absolute difference says enough.
ULPS_SAID = 1 << 20


@dataclasses.dataclass(frozen=True, eq=False)
class LeafDiff:
    """One leaf path whose fingerprint is not the same on every host.

    Per-host mappings are keyed by process index. Equality is exact (arrays by
    their bytes, NaN equals NaN), so two hosts' diffs can be compared.

    Attributes:
        path: the leaf's path, ``jax.tree_util.keystr`` (e.g. ``"['w'][0]"``).
        kind: the most fundamental difference: ``'structure'`` (the leaf is
            missing on some hosts), ``'shape'``, ``'dtype'``, ``'sharding'``
            (a global array whose hosts place its blocks differently:
            ``digests`` are then digests of each host's placement) or
            ``'value'``.
        odd_processes: sorted hosts outside the majority (the odd ones out);
            empty on a `tie`, where no host is odd.
        majority_processes: sorted hosts holding the most common fingerprint (on a
            `tie`: the group with the lowest process index, the reference only).
        shapes: host -> shape of the compared data, or None where the leaf is
            missing (for a global array: the shape of the block compared; for
            a PRNG key array: the shape of its key data).
        dtypes: host -> dtype name (``'float32'``, ``'key<fry>'``; ``'str'``,
            ``'bytes'`` or the type's name for a non-array leaf), or None.
        digests: host -> 16-hex-digit digest of the bytes, or None.
        num_different: compared host (`compared_processes`) -> number of
            elements that differ from the majority value (bitwise). Only for
            those whose shape and dtype match the majority's.
        max_abs_diff: odd host -> max ``|x - majority|`` over the differing
            elements (float64; NaN when a NaN is involved or the dtype is not
            numeric). Same hosts as ``num_different``.
        first_index: odd host -> index of the first differing element (row
            major), a tuple (``()`` for a scalar). Same hosts as
            ``num_different``.
        values: host -> that host's value (a read-only numpy array), for every
            host holding the leaf when it has at most `SMALL_LEAF` elements;
            empty for larger leaves. For a string (or other non-array) leaf:
            a 0-d ``str`` array of the value (its ``repr`` for other
            objects), cut to `MAX_TEXT_CHARS` characters.
        block: for a global (non-fully-addressable) `jax.Array`, the block
            compared: its global index, ``(start, stop)`` per dimension. Only
            the hosts holding that block appear in the per-host mappings, and
            a global array has one `LeafDiff` per differing block. None for a
            host-local leaf.
        tie: no group of hosts is a majority (1 vs 1 on two hosts, 2 vs 2 on
            four): which side is wrong cannot be told, so no host is odd
            (`odd_processes` is empty) and `describe` says ``no majority``; the
            other hosts are still compared with the reference group
            (`compared_processes`: ``num_different`` and the rest are theirs).
        max_ulps: odd host -> the largest distance in units in the last place between its
            differing elements and the majority's (floats only: how many representable
            values apart; +0 and -0 are 1 apart); absent when a NaN is involved or the
            dtype is not a float. Same hosts as ``num_different`` otherwise.
    """

    path: str
    kind: str
    odd_processes: tuple[int, ...]
    majority_processes: tuple[int, ...]
    shapes: Mapping[int, tuple[int, ...] | None]
    dtypes: Mapping[int, str | None]
    digests: Mapping[int, str | None]
    num_different: Mapping[int, int] = dataclasses.field(default_factory=dict)
    max_abs_diff: Mapping[int, float] = dataclasses.field(default_factory=dict)
    first_index: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    values: Mapping[int, np.ndarray] = dataclasses.field(default_factory=dict)
    block: Index | None = None
    tie: bool = False
    max_ulps: Mapping[int, int] = dataclasses.field(default_factory=dict)

    @property
    def compared_processes(self) -> tuple[int, ...]:
        """The hosts compared with the reference: `odd_processes`, or on a `tie` every host
        outside the reference group."""
        return tuple(h for h in sorted(self.shapes) if h not in self.majority_processes)

    @property
    def reference_process(self) -> int:
        """The host whose value the odd hosts were compared with (lowest majority host)."""
        return self.majority_processes[0]

    @property
    def where(self) -> str:
        """The path, and for a global array the block: ``"['w'] block [0:4, 0:8]"``."""
        if self.block is None:
            return _fmt_path(self.path)
        return f'{_fmt_path(self.path)} block {format_index(self.block)}'

    @property
    def text_values(self) -> dict[str, tuple[int, ...]] | None:
        """For a string (or other non-array) leaf: value -> hosts holding it; else None."""
        if self.kind != 'value' or self.num_different or not self.values:
            return None
        if not all(v.ndim == 0 and v.dtype.kind == 'U' for v in self.values.values()):
            return None
        by: dict[str, list[int]] = {}
        for h in sorted(self.values):
            by.setdefault(str(self.values[h]), []).append(h)
        return {v: tuple(hs) for v, hs in by.items()}

    def placements(self) -> str:
        """For a ``'sharding'`` difference: which hosts place the blocks alike (bounded)."""
        by: dict[str | None, list[int]] = {}
        for h in sorted(self.digests):
            by.setdefault(self.digests[h], []).append(h)
        parts = [
            f'placement {(d or "")[:8]} on {_fmt_hosts(hs)}'
            for d, hs in sorted(by.items(), key=lambda g: g[1][0])
        ]
        more = f'; ... ({len(parts)} placements)' if len(parts) > 4 else ''
        return 'the processes place its blocks differently: ' + '; '.join(parts[:4]) + more

    def describe(self) -> str:
        """One bounded line: the path (and block), the odd hosts and how they differ."""
        head = f'{self.where} [{self.kind}] on {_fmt_hosts(self.odd_processes)}'
        if self.tie:
            sides = sorted(
                {
                    tuple(h for h in sorted(self.shapes) if self.digests[h] == d)
                    for d in self.digests.values()
                }  # fmt: skip
            )
            if len(sides) == 2:
                both = ' and '.join(_fmt_hosts(g).split(' ', 1)[1] for g in sides)
                head = f'{self.where} [{self.kind}]: processes {both} differ; no majority'
            else:
                head = f'{self.where} [{self.kind}]: no majority, {len(sides)} values'
        if self.kind == 'sharding':
            return f'{head}: {self.placements()}'
        if self.kind != 'value':
            groups: dict[tuple[Any, Any], list[int]] = {}
            for h in sorted(self.shapes):
                groups.setdefault((self.shapes[h], self.dtypes[h]), []).append(h)
            parts = [
                f'{_fmt_sig(*sig)} on {_fmt_hosts(hosts)}'
                for sig, hosts in sorted(groups.items(), key=lambda g: g[1][0])
            ]
            if len(parts) > 4:
                parts = parts[:4] + [f'... ({len(groups)} variants)']
            return f'{head}: ' + '; '.join(parts)
        texts = self.text_values
        if texts is not None:
            parts = [f'{_fmt_text(v)} on {_fmt_hosts(hs)}' for v, hs in list(texts.items())[:4]]
            if len(texts) > 4:
                parts.append(f'... ({len(texts)} values)')
            return f'{head}: ' + '; '.join(parts)
        shown = []
        compared = self.compared_processes
        for h in compared[:3]:
            who = '' if len(compared) == 1 and not self.tie else f'{_fmt_hosts([h])}: '
            if h in self.num_different:
                shown.append(
                    f'{who}{self.num_different[h]} of {math.prod(self.shapes[h] or ())} '
                    f'elements differ, max abs diff {self.max_abs_diff[h]:.6g}'
                    + (
                        f' ({self.max_ulps[h]} ulps)'
                        if self.max_ulps.get(h, ULPS_SAID) < ULPS_SAID
                        else ''
                    )
                    + f', first at index {self.first_index[h]}'
                )
            else:
                shown.append(f'{who}bytes differ')
        if len(compared) > 3:
            shown.append(f'... and {len(compared) - 3} more processes')
        if self.tie and self.values and len(set(self.digests.values())) == 2:  # both sides
            shown.append('values: ' + '; '.join(
                f'{_fmt_hosts([h])}: '
                f'{np.array2string(self.values[h], threshold=6, precision=5, max_line_width=10**6)}'
                for h in sorted(self.values)[:4]))  # fmt: skip
        return f'{head} (vs {_fmt_hosts(self.majority_processes)}): ' + '; '.join(shown)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able plain data (arrays as nested lists, NaN/inf as strings)."""
        return _jsonable(dataclasses.asdict(self))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LeafDiff):
            return NotImplemented
        return _canon(dataclasses.astuple(self)) == _canon(dataclasses.astuple(other))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking mappings: unhashable


#: Blocks a leaf's one entry lists by index (`describe_blocks`); more are counted.
_MAX_BLOCKS_SHOWN = 4


def describe_blocks(leaves: list[LeafDiff]) -> str:
    """One bounded line for one leaf, whichever of its blocks differ: `LeafDiff.describe`
    of the only one, or of the first with the others' blocks listed after the path
    (``['w'] blocks [0:4, 0:8], [4:8, 0:8] (2 of its blocks differ; the first): ...``)."""
    first = leaves[0]
    text = first.describe()
    if len(leaves) == 1 or first.block is None:
        return text
    shown = ', '.join(format_index(leaf.block) for leaf in leaves[:_MAX_BLOCKS_SHOWN] if leaf.block)
    more = f', ... ({len(leaves)} in all)' if len(leaves) > _MAX_BLOCKS_SHOWN else ''
    head = (
        f'{_fmt_path(first.path)} blocks {shown}{more} '
        f'({len(leaves)} of its blocks differ; the first:)'
    )
    return head + text[len(first.where) :]


@dataclasses.dataclass(frozen=True)
class GlobalLeaf:
    """How one global (non-fully-addressable) `jax.Array` leaf was compared.

    A global array is compared block by block (a block: one distinct global
    index of its sharding), and only across the hosts holding the same block
    (its replicas). A block held by one host has nothing to compare across
    hosts; a leaf none of whose blocks is held by two or more hosts (fully
    sharded, e.g. ``P(('data', 'model'))``) is neither equal nor different.

    Attributes:
        path: the leaf's path.
        num_blocks: distinct blocks of the array.
        num_compared: blocks held by two or more hosts (compared across them).
        min_hosts: fewest hosts holding one block.
        max_hosts: most hosts holding one block.
    """

    path: str
    num_blocks: int
    num_compared: int
    min_hosts: int
    max_hosts: int

    @property
    def compared(self) -> bool:
        """Whether some block is held by two or more hosts (and so was compared)."""
        return self.num_compared > 0

    def describe(self, num_processes: int) -> str:
        """How the leaf was compared, in one line."""
        path = _fmt_path(self.path)
        if not self.compared:
            return (
                f'{path}: nothing to compare across processes (each of its {self.num_blocks} '
                'block(s) is held by one process)'
            )
        if self.num_compared == self.num_blocks and self.min_hosts == num_processes:
            return f'{path}: every process holds all {self.num_blocks} block(s); compared on all'
        hosts = (
            str(self.max_hosts)
            if self.min_hosts == self.max_hosts
            else f'{max(2, self.min_hosts)}-{self.max_hosts}'
        )
        return (
            f'{path}: compared over its replicas ({self.num_compared} of {self.num_blocks} '
            f'block(s), each among the {hosts} processes holding it)'
        )


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TreeDiff:
    """Which leaves of a pytree differ between hosts (the result of `tree_diff`).

    Every host gets an equal `TreeDiff`.

    Attributes:
        leaves: one `LeafDiff` per differing leaf path (per differing block,
            for a global array), in tree order (the lowest host's order;
            paths it lacks follow, in the next hosts' order).
        num_processes: number of hosts compared.
        num_leaves: number of distinct leaf paths over all hosts.
        global_leaves: one `GlobalLeaf` per global (non-fully-addressable)
            `jax.Array` leaf that every host holds with the same shape, dtype
            and sharding, in tree order: how it was compared (over the
            replicas of its blocks, or not at all).
    """

    leaves: tuple[LeafDiff, ...]
    num_processes: int
    num_leaves: int
    global_leaves: tuple[GlobalLeaf, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing differs between hosts (same paths, shapes, dtypes, bytes).

        Blocks of a global array held by a single host are not compared: a
        fully sharded leaf (see `not_compared`) does not make a diff not ok.
        """
        return not self.leaves

    @property
    def differing_paths(self) -> tuple[str, ...]:
        """The distinct paths of the differing leaves, in order."""
        return tuple(dict.fromkeys(leaf.path for leaf in self.leaves))

    @property
    def not_compared(self) -> tuple[str, ...]:
        """Global leaves with no block held by two or more hosts: nothing to compare."""
        return tuple(g.path for g in self.global_leaves if not g.compared)

    @property
    def by_replicas(self) -> tuple[str, ...]:
        """Global leaves compared over their replicas only (not every host holds every block)."""
        return tuple(
            g.path
            for g in self.global_leaves
            if g.compared and (g.num_compared < g.num_blocks or g.min_hosts < self.num_processes)
        )

    def notes(self) -> list[str]:
        """Lines on the global leaves not compared on every host (bounded), for `summary`."""
        out = []
        for paths, what in (
            (
                self.not_compared,
                'nothing to compare across processes (no block is held by 2+ processes)',
            ),
            (
                self.by_replicas,
                'compared over their replicas only (each block among the processes holding it)',
            ),
        ):
            if paths:
                named = ', '.join(_fmt_path(p) or '(the root)' for p in paths[:_MAX_PATHS_SHOWN])
                more = f', ... ({len(paths)} in all)' if len(paths) > _MAX_PATHS_SHOWN else ''
                out.append(f'{len(paths)} global leaf/leaves: {what}: {named}{more}.')
        return out

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Sorted hosts that are odd ones out for at least one leaf."""
        return tuple(sorted({h for leaf in self.leaves for h in leaf.odd_processes}))

    def __getitem__(self, path: str) -> LeafDiff:
        """The `LeafDiff` of one path (``KeyError`` when that leaf does not differ)."""
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(path)

    def summary(self, max_leaves: int = 10) -> str:
        """A bounded human report: a headline, then at most ``max_leaves`` leaf lines."""
        notes = self.notes()
        if self.ok:
            if not notes:
                return (
                    f'All {self.num_processes} processes hold the same tree '
                    f'({self.num_leaves} leaves).'
                )
            return (
                f'All {self.num_processes} processes agree on every leaf they can compare '
                f'({self.num_leaves} leaves). ' + ' '.join(notes)
            )
        odd = (
            f'odd processes: {_fmt_hosts(self.odd_processes)}'
            if self.odd_processes
            else 'no majority, so no process is odd'
        )
        lines = [
            f'{len(self.differing_paths)} of {self.num_leaves} leaves differ across '
            f'{self.num_processes} processes; {odd}.'
        ]
        groups: dict[str, list[LeafDiff]] = {}
        for leaf in self.leaves:  # one entry per leaf, its differing blocks listed compactly
            groups.setdefault(leaf.path, []).append(leaf)
        lines += ['  ' + describe_blocks(g) for g in list(groups.values())[:max_leaves]]
        if len(groups) > max_leaves:
            lines.append(
                f'  ... and {len(groups) - max_leaves} more differing '
                'leaves (all of them are in the TreeDiff).'
            )
        lines += ['  ' + note for note in notes]
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (
            f'TreeDiff(ok={self.ok}, differing={len(self.differing_paths)}, '
            f'num_leaves={self.num_leaves}, num_processes={self.num_processes}, '
            f'odd_processes={list(self.odd_processes)})'
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able plain data (for the notebook side)."""
        return {
            'ok': self.ok,
            'num_processes': self.num_processes,
            'num_leaves': self.num_leaves,
            'leaves': [leaf.to_dict() for leaf in self.leaves],
            'global_leaves': [dataclasses.asdict(g) for g in self.global_leaves],
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TreeDiff):
            return NotImplemented
        return (self.num_processes, self.num_leaves, self.leaves, self.global_leaves) == (
            other.num_processes,
            other.num_leaves,
            other.leaves,
            other.global_leaves,
        )

    __hash__ = None  # type: ignore[assignment]  # its LeafDiffs are unhashable
