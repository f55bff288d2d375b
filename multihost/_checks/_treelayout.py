"""The layout of a whole pytree: one row per leaf (``%mh_layout state.params``).

`TreeLayout` is plain, picklable data (`multihost._models._treelayout`: frozen dataclasses of
the layout and replica models): per leaf its path, its `Layout` (shape, dtype, spec, bytes per
host) and, when checked, its `ReplicaReport`. `tree_layout` builds it on every host; with
``check`` it runs `check_replicas` once per global array leaf (collectives, in leaf order, so
every host must call it with the same tree).
"""

from __future__ import annotations

from typing import Any

from multihost._checks._layout import describe_layout
from multihost._checks._replicas import check_replicas

__all__ = ['LeafLayout', 'TreeLayout', 'tree_layout']
from multihost._models._treelayout import (  # noqa: F401  (the models live there; re-exported)
    LeafLayout,
    TreeLayout,
)


def tree_layout(
    tree: Any, name: str = '', *, check: bool = True, timeout: float | None = None
) -> TreeLayout:
    """The `TreeLayout` of ``tree``: `describe_layout` of every array leaf and, with ``check``,
    `check_replicas` of every `jax.Array` leaf (a collective per global leaf, in leaf order)."""
    import jax
    import numpy as np

    from multihost._exchange import _sequence

    flat = [
        (jax.tree_util.keystr(p) or '<root>', x)
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]
    if check and jax.process_count() > 1:
        # Which leaves take part in a replica check must agree first: a host whose tree
        # differs (a leaf host-local here, global there) fails every host at once here,
        # instead of leaving the others waiting in that leaf's check until their timeout.
        kinds = [
            (path, isinstance(x, jax.Array) and not x.is_fully_addressable) for path, x in flat
        ]
        _sequence.enter(
            'tree_layout',
            name,
            tree_digest=_sequence.digest(('tree_layout', kinds)),
            timeout=timeout,
        )
    leaves = []
    for key, x in flat:
        if isinstance(x, jax.Array | np.ndarray | np.generic | bool | int | float | complex):
            report = (
                check_replicas(x, timeout=timeout) if check and isinstance(x, jax.Array) else None
            )
            leaves.append(LeafLayout(key, describe_layout(x), report))
        else:
            leaves.append(LeafLayout(key, None, note=f'a {type(x).__name__}, not an array'))
    return TreeLayout(name, tuple(leaves), jax.process_count())
