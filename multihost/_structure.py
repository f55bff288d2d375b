"""A pytree structure as text that is the same on every host running the same program.

``str(treedef)`` is not: it shows a node's static (aux) data by ``repr``, and
the repr of a function or of an object without value equality holds its
memory address (``<function chain.<locals>.init_fn at 0x7f...>``, the ``tx``
of every flax ``TrainState``), which differs per process. `structure` walks
the treedef instead and writes, per node:

* its type by qualified name (not the module: a module may be imported under
  other names on different hosts: scripts, notebooks, test harnesses), with
  the field names of namedtuples and dataclasses;
* its static data: ``None``, numbers, strings, bytes, enums, types and
  numpy arrays by value; tuples, lists, dicts (in their order), sets (sorted)
  and dataclass instances that compare by value by their items; functions,
  methods and ``functools.partial`` by qualified name (a method also by what
  it is bound to, a partial also by its arguments); any other object by value
  (type and repr) when it compares by value and its repr holds no address,
  else by its type alone.

Leaves are ``*``; shapes and dtypes are the callers' business.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
from typing import Any

import numpy as np
import xxhash

#: Static data nested deeper than this is described by its type alone.
_MAX_DEPTH = 8
#: Treedefs remembered (treedef -> text), so a collective on the same tree walks it once.
_CACHE_SIZE = 256
_ADDRESS = re.compile(r'\bat 0x[0-9a-fA-F]+|\b0x[0-9a-fA-F]{6,}')
_SCALARS = (type(None), bool, int, float, complex, str, bytes)

_cache: dict[Any, str] = {}


def structure(treedef: Any) -> str:
    """``treedef`` as text without anything that differs between processes (see the module)."""
    try:
        hit = _cache.get(treedef)
    except Exception:  # unhashable (or incomparable) static data: not cached
        return _walk(treedef)
    if hit is None:
        hit = _walk(treedef)
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[treedef] = hit
    return hit


def static(value: Any) -> str:
    """One static value (a node's aux data, a jit's static argument) as host-independent text."""
    return _static(value, 0)


def qualname(obj: Any) -> str:
    """The qualified name of a type or function (``TrainState``, ``chain.<locals>.init_fn``)."""
    return str(
        getattr(obj, '__qualname__', None)
        or getattr(obj, '__name__', None)
        or type(obj).__qualname__
    )


def _walk(treedef: Any) -> str:
    try:
        data = treedef.node_data()
        children = treedef.children()
    except AttributeError:  # a jax without PyTreeDef.node_data: its text, addresses cut
        return _ADDRESS.sub('at 0x?', str(treedef))
    if data is None:
        return '*'
    kind, aux = data
    name = _type_name(kind)
    inner = ','.join(_walk(c) for c in children)
    if aux is None:
        return f'{name}({inner})'
    if type(aux) is list and all(type(k) is str for k in aux):  # a dict's keys
        return f'{name}<{aux!r}>({inner})'
    return f'{name}<{_static(aux, 0)}>({inner})'


@functools.lru_cache(maxsize=1024)
def _type_name(kind: type) -> str:
    name = qualname(kind)
    fields = getattr(kind, '_fields', None)  # namedtuple
    if isinstance(fields, tuple):
        return f'{name}{{{",".join(map(str, fields))}}}'
    if dataclasses.is_dataclass(kind):
        return f'{name}{{{",".join(f.name for f in dataclasses.fields(kind))}}}'
    return name


def _static(v: Any, depth: int) -> str:
    t = type(v)
    if t in _SCALARS:
        return repr(v)
    if depth >= _MAX_DEPTH:
        return qualname(t)
    d = depth + 1
    if isinstance(v, enum.Enum):
        return f'{qualname(t)}.{v.name}'
    if isinstance(v, type):
        return f'type {qualname(v)}'
    if isinstance(v, tuple | list | dict | set | frozenset):
        return _container(v, d)
    if isinstance(v, np.ndarray):
        # XXH3 of the bytes read in place (no copy of a contiguous array), as fingerprints do.
        a = np.ascontiguousarray(v)
        data: bytes | memoryview = b''
        if a.dtype.hasobject or not a.itemsize:
            data = repr(a.tolist()).encode()
        else:
            data = a.reshape(-1).view(np.uint8).data  # read in place
        digest = xxhash.xxh3_64_hexdigest(data)
        return f'ndarray {v.dtype}{list(v.shape)} {digest}'
    if isinstance(v, np.generic):
        return f'{v.dtype} {v!r}'
    described = _function(v, d)
    return described if described is not None else _by_value(v, d)


def _container(v: Any, d: int) -> str:
    """A tuple (or namedtuple), list, dict or set, item by item."""
    t = type(v)
    if isinstance(v, tuple):
        items = ','.join(_static(x, d) for x in v)
        fields = getattr(t, '_fields', None)
        if isinstance(fields, tuple):  # namedtuple: its fields by name
            items = ','.join(f'{f}={_static(x, d)}' for f, x in zip(fields, v))
            return f'{qualname(t)}({items})'
        if len(v) == 1:
            items += ','  # (x,) as Python writes it
        return f'({items})' if t is tuple else f'{qualname(t)}({items})'
    if isinstance(v, list):
        return ('[' if t is list else f'{qualname(t)}[') + ','.join(_static(x, d) for x in v) + ']'
    if isinstance(v, dict):
        items = ','.join(f'{_static(k, d)}:{_static(x, d)}' for k, x in v.items())
        return ('{' if t is dict else f'{qualname(t)}{{') + items + '}'
    return f'{qualname(t)}{{{",".join(sorted(_static(x, d) for x in v))}}}'


def _function(v: Any, d: int) -> str | None:
    """A method, function or partial by qualified name (never its address); None otherwise."""
    if isinstance(v, types.MethodType):
        return f'method {qualname(v.__func__)} of {_static(v.__self__, d)}'
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.BuiltinMethodType)):
        return f'function {qualname(v)}'
    if isinstance(v, functools.partial):
        args = ','.join(_static(x, d) for x in v.args)
        kwargs = ','.join(f'{k}={_static(x, d)}' for k, x in v.keywords.items())
        return f'partial({_static(v.func, d)};{args};{kwargs})'
    return None


def _by_value(v: Any, d: int) -> str:
    """Any other object: its type alone, or what it compares by (fields, address-free repr)."""
    t = type(v)
    if t.__eq__ is object.__eq__:  # no value equality: the type alone
        return qualname(t)
    if dataclasses.is_dataclass(v):  # compares by value: by its fields
        items = ','.join(
            f'{f.name}={_static(getattr(v, f.name, None), d)}' for f in dataclasses.fields(v)
        )
        return f'{qualname(t)}({items})'
    try:  # compares by value: by its repr, unless that holds an address
        text = repr(v)
    except Exception:
        return qualname(t)
    return qualname(t) if _ADDRESS.search(text) else f'{qualname(t)} {text}'
