"""Facets: small multiples of a layout over its non-displayed axes, pure.

An array of rank 3 or more shows two axes; along every other axis the block
boundaries cut it into ranges, and each combination of ranges is one facet
(one `LayoutGrid`), at most `MAX_FACETS` at a time.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

from mhnotebook.widgets.layout.grid import (
    LayoutGrid,
    fixed_positions,
    layout_and_report,
    layout_grid,
    normalize_axes,
)
from multihost._models import Layout, ReplicaReport
from multihost._models._layout import Index

#: Facets (small multiples over the non-displayed axes) shown at a time.
MAX_FACETS = 16
#: Facets side by side in a row (of the picture and of the widget's block buttons).
MAX_FACET_COLUMNS = 4


@dataclasses.dataclass(frozen=True)
class Facet:
    """One small multiple: the displayed plane where the other axes lie in one range each.

    Attributes:
        number: the facet's place among all facets (row-major over the
            non-displayed axes), from 0.
        ranges: ``(axis, (start, stop))`` per non-displayed axis: a range in
            which every block boundary is the same, so one picture holds for it.
        grid: the `LayoutGrid` of the plane (at each range's start).
    """

    number: int
    ranges: tuple[tuple[int, tuple[int, int]], ...]
    grid: LayoutGrid

    @property
    def title(self) -> str:
        """The facet's slice, numpy style: ``'[0:2, :, :]'`` (``''`` with no other axes)."""
        if not self.ranges:
            return ''
        ranges = dict(self.ranges)
        return (
            '['
            + ', '.join(
                (
                    f'{ranges[d][0]}'
                    if ranges[d][1] - ranges[d][0] == 1
                    else '{}:{}'.format(*ranges[d])
                )
                if d in ranges
                else ':'
                for d in range(self.grid.layout.ndim)
            )
            + ']'
        )


@dataclasses.dataclass(frozen=True)
class LayoutFacets:
    """What `layout_facets` returns: the facets shown, out of how many.

    Attributes:
        layout: the layout viewed.
        axes: the displayed axes (as in `LayoutGrid.axes`).
        facets: the facets shown (at most ``max_facets``), in order.
        total: how many facets the array has (the product of the number of
            ranges along each non-displayed axis; 1 for a 0-d to 2-d array).
        current: the number of the facet holding the requested position.
        report: the `ReplicaReport` that flagged blocks, if any.
    """

    layout: Layout
    axes: tuple[int, ...]
    facets: tuple[Facet, ...]
    total: int
    current: int = 0
    report: ReplicaReport | None = None

    @property
    def other_axes(self) -> tuple[int, ...]:
        """The non-displayed axes the facets run over."""
        return tuple(d for d in range(self.layout.ndim) if d not in self.axes)

    @property
    def more(self) -> int:
        """Facets not shown."""
        return self.total - len(self.facets)

    def describe(self) -> str:
        """``'4 facets over dim 0'``, ``'facets 17-32 of 40 over dims 0, 1'`` or ``''``."""
        if self.total <= 1 and not self.other_axes:
            return ''
        dims = ', '.join(map(str, self.other_axes))
        over = f'dim {dims}' if len(self.other_axes) == 1 else f'dims {dims}'
        if not self.more:
            return f'{self.total} facet{"s" if self.total != 1 else ""} over {over}'
        first, last = self.facets[0].number + 1, self.facets[-1].number + 1
        return f'facets {first}-{last} of {self.total} over {over}'

    def more_text(self) -> str:
        """``'+24 more facets: move the dim 0 slider'``; ``''`` when every facet is shown."""
        if not self.more:
            return ''
        dims = ', '.join(f'dim {d}' for d in self.other_axes)
        first, last = self.facets[0].number + 1, self.facets[-1].number + 1
        return (
            f'+{self.more} more facets not drawn (facets {first}-{last} of {self.total} '
            f'shown; the {dims} slider pages)'
        )


def _segments(layout: Layout, axis: int) -> tuple[tuple[int, int], ...]:
    """The ranges along ``axis`` between consecutive block boundaries."""
    n = layout.shape[axis]
    if n == 0:
        return ((0, 0),)
    cuts = sorted({0, n, *(v for b in layout.blocks() for v in b.index[axis])})
    return tuple(zip(cuts[:-1], cuts[1:]))


def layout_facets(
    layout: Layout | ReplicaReport,
    axes: int | Sequence[int] | None = None,
    fixed: Mapping[int, int] | None = None,
    report: ReplicaReport | None = None,
    *,
    marked: Mapping[Index, str] | None = None,
    max_facets: int = MAX_FACETS,
) -> LayoutFacets:
    """The small multiples of a layout: one `LayoutGrid` per range of the other axes.

    An array of rank 3 or more shows two axes (default: the last two); along
    every other axis, the block boundaries cut it into ranges, and each
    combination of ranges is one facet. Facets come in pages of
    ``max_facets``: the page shown holds the position ``fixed`` (default 0).
    A 0-d to 2-d array is one facet. Pure: no widgets, no devices.

    Args:
        layout: a `multihost.Layout` or a `multihost.ReplicaReport`.
        axes: the displayed axes (see `layout_grid`).
        fixed: a position along the other axes; its facet's page is shown.
        report: a `ReplicaReport` of the same array (flags blocks).
        marked: block index -> a note, for blocks to mark (see `layout_grid`).
        max_facets: facets per page.

    Returns:
        A `LayoutFacets`.
    """
    layout, report = layout_and_report(layout, report)
    axes = normalize_axes(axes, layout.ndim)
    positions = fixed_positions(layout, axes, fixed)
    others = [d for d in range(layout.ndim) if d not in axes]
    segments = [_segments(layout, d) for d in others]
    total = math.prod(len(s) for s in segments)
    current = 0
    for d, segs in zip(others, segments):
        p = positions.get(d, 0)
        k = next((i for i, (a, b) in enumerate(segs) if a <= p < b), 0)
        current = current * len(segs) + k
    max_facets = max(int(max_facets), 1)
    first = (current // max_facets) * max_facets
    facets = []
    chosen = itertools.islice(itertools.product(*segments), first, first + max_facets)
    for number, combo in enumerate(chosen, start=first):
        ranges = tuple(zip(others, combo))
        grid = layout_grid(layout, axes, {d: r[0] for d, r in ranges}, report, marked=marked)
        facets.append(Facet(number=number, ranges=ranges, grid=grid))
    return LayoutFacets(
        layout=layout,
        axes=axes,
        facets=tuple(facets),
        total=total,
        current=current,
        report=report,
    )
