"""Leaf paths of a flattened pytree, one distinct text per leaf (what the tree checks key by)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax


def leaf_paths(flat: Sequence[tuple[Any, Any]]) -> list[str]:
    """``jax.tree_util.keystr`` of each ``(key path, leaf)`` of ``tree_flatten_with_path``.

    The (rare) custom nodes whose keys print alike get ``#1``, ``#2``, ...
    after the first, so the paths can key rows that hosts compare.
    """
    seen: dict[str, int] = {}
    out = []
    for p in (jax.tree_util.keystr(k) for k, _ in flat):
        n = seen.get(p, 0)
        seen[p] = n + 1
        out.append(p if n == 0 else f'{p}#{n}')
    return out
