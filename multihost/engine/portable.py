"""A gathered pytree's structure made picklable for the notebook (`NotShipped`, `CellObject`).

The structure travels pickled; what the notebook could not unpickle (a
static field such as optax closures, a class defined in an engine cell) is
replaced here, on the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ['CellObject', 'NotShipped', 'portable']


@dataclasses.dataclass(frozen=True)
class NotShipped:
    """What a gathered pytree holds in place of a static field that cannot be pickled.

    A pytree's structure travels to the notebook pickled; a static
    (non-pytree) field such as a flax ``TrainState``'s ``tx`` (optax closures)
    cannot, so the notebook's copy holds this instead: ``text`` is the
    field's ``repr`` (cut at 200 characters), the value itself stays on the hosts.
    """

    text: str

    def __repr__(self) -> str:
        return f'<not shipped from the hosts: {self.text}>'


class CellObject:
    """A gathered pytree node whose class was defined in an engine cell (``__main__``).

    The notebook cannot import such a class (its ``__main__`` is another
    one), so the node arrives as this: the class's name, its fields as
    attributes (``gathered.params``, ``gathered.dropout_key``), the static
    ones as they were (or `NotShipped`). A pytree like the original: its
    array fields are its children.
    """

    def __init__(self, type_name: str, fields: dict[str, Any], static: tuple[str, ...]):
        self.__dict__.update(fields)
        self._mh_type = type_name
        self._mh_order = tuple(fields)
        self._mh_static = static

    def __repr__(self) -> str:
        inner = ', '.join(f'{k}={getattr(self, k)!r}' for k in self._mh_order)
        return f'{self._mh_type}({inner})'[:2000]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CellObject) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass with eq

    def _children(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        import jax

        dynamic = [k for k in self._mh_order if k not in self._mh_static]
        children = tuple((jax.tree_util.GetAttrKey(k), getattr(self, k)) for k in dynamic)
        aux = (
            self._mh_type,
            self._mh_order,
            self._mh_static,
            tuple(getattr(self, k) for k in self._mh_static),
        )
        return children, aux

    @classmethod
    def _rebuild(cls, aux: tuple[Any, ...], children: Any) -> CellObject:
        type_name, order, static, values = aux
        fields = dict(zip(static, values))
        fields.update(zip([k for k in order if k not in static], children))
        return cls(type_name, {k: fields[k] for k in order}, static)


# Pickled (and documented, docs/API.md) under the public path, the package that re-exports them.
NotShipped.__module__ = CellObject.__module__ = 'multihost.engine'


def _register_cell_object() -> None:
    import jax

    jax.tree_util.register_pytree_with_keys(CellObject, CellObject._children, CellObject._rebuild)


_register_cell_object()


def _cell_object(node: Any) -> CellObject | None:
    """A node of a class defined in an engine cell as a `CellObject`, when its fields are known."""
    import jax

    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = [f.name for f in dataclasses.fields(node)]
    elif isinstance(node, tuple) and hasattr(type(node), '_fields'):
        names = list(type(node)._fields)  # type: ignore[attr-defined]  # a named tuple
    else:
        return None
    # Which fields are the node's pytree children: those the flattening walks into.
    # (The skeleton's leaves are ints, so a static int field is told apart only this way.)
    children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    dynamic = {
        p[0].name
        for p, _ in children
        if p and isinstance(p[0], jax.tree_util.GetAttrKey) and p[0].name in names
    }
    if isinstance(node, tuple):  # named tuples flatten by position
        dynamic = set(names)
    fields = {k: getattr(node, k) for k in names}
    static = tuple(k for k in names if k not in dynamic)
    return CellObject(
        type(node).__qualname__,
        {k: (portable(v) if k in dynamic else _portable_static(v)) for k, v in fields.items()},
        static,
    )


def _portable_static(value: Any) -> Any:
    if _ships(value):
        return value
    text = repr(value)
    return NotShipped(text if len(text) <= 200 else text[:199] + '…')


def _from_cell(obj: Any) -> bool:
    """Whether ``obj`` (a function, class or instance) was defined in an engine cell."""
    return '__main__' in (getattr(obj, '__module__', None), getattr(type(obj), '__module__', None))


def _ships(node: Any) -> bool:
    """Whether the notebook can unpickle ``node``: it pickles, and nothing in it is from a cell."""
    import io
    import pickle

    class _Probe(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if _from_cell(obj):
                raise pickle.PicklingError(f'{obj!r:.80} was defined in an engine cell')
            return NotImplemented

    try:
        _Probe(io.BytesIO()).dump(node)
        return True
    except Exception:
        return False


def portable(node: Any) -> Any:
    """``node`` (a skeleton: leaves are ints) as the notebook can unpickle it.

    Dataclasses (flax structs), named tuples, tuples, lists and dicts keep
    their type; only the static values the notebook could not unpickle inside
    them are replaced, by `NotShipped`. A node whose class was defined in an
    engine cell becomes a `CellObject` (the notebook cannot import it).
    """
    if _from_cell(node):
        cell = _cell_object(node)  # the notebook cannot import the class: ship its fields
        if cell is not None:
            return cell
    elif _ships(node):
        return node
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {
            f.name: portable(getattr(node, f.name)) for f in dataclasses.fields(node) if f.init
        }
        try:
            return dataclasses.replace(node, **changes)
        except Exception:
            pass
    elif isinstance(node, tuple) and hasattr(type(node), '_fields'):
        return type(node)(*(portable(v) for v in node))
    elif isinstance(node, list | tuple):
        return type(node)(portable(v) for v in node)
    elif isinstance(node, dict):
        return {k: portable(v) for k, v in node.items()}
    text = repr(node)
    return NotShipped(text if len(text) <= 200 else text[:199] + '…')
