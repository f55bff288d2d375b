"""Names of engine values: ``state.params['block_0']['Dense_0']['kernel']``, parsed, never run.

Every magic that takes a name (``%mh_allgather``, ``%mh_layout``,
``%mh_diff``, ``%mh_nonfinite``) goes through `resolve` on the engines, and the
notebook checks the same syntax first (`parse`). A name is a variable
followed by attribute accesses and subscripts with constant keys::

    x                         state.params.embed.embedding
    state.params['embed']     state.opt_state[0].mu['embed']
    x[::4, :128]              (a trailing cut of an array, where a magic allows it)

It is parsed with `ast`; nothing typed is evaluated. Each step resolves as:

* ``.name``: the object's attribute when it has a real one (a dataclass or
  flax struct field, an nnx attribute, a named tuple's field); on a mapping
  without such an attribute, its key ``'name'`` (so ``state.params.embed``
  works on a dict). A real attribute wins over a key of the same name
  (``d.items`` is the method); the error then says so.
* ``[k]`` with a string or an integer: a mapping's key or a sequence's item;
  on an array, an integer is the start of the trailing cut.
* ``[i, j]`` / ``[a:b:c]`` (slices, or several indices): a cut of an array,
  only as the last step and only where a magic allows it.

Standard library only (the notebook side imports it too).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ['BadName', 'Step', 'format_steps', 'parse', 'resolve', 'short_name']

#: Keys listed in an error.
MAX_KEYS = 12

EXAMPLES = 'e.g. x, state.params, state.params["embed"], state.opt_state[0] or x[::4, :128]'


class BadName(ValueError):
    """A name that does not parse or does not resolve (the message says which step and why)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One step after the variable: ``kind`` is ``'attr'`` (``.name``), ``'key'`` (``[k]``, a
    str or an int) or ``'index'`` (``[...]`` with slices or several indices: an array cut)."""

    kind: str
    value: Any

    def text(self) -> str:
        if self.kind == 'attr':
            return f'.{self.value}'
        if self.kind == 'key':
            return f'[{self.value!r}]'
        return format_index(self.value)


def format_index(index: tuple[Any, ...]) -> str:
    """``(slice(None, None, 4), 3)`` -> ``'[::4, 3]'``."""

    def one(i: Any) -> str:
        if isinstance(i, slice):
            text = f'{"" if i.start is None else i.start}:{"" if i.stop is None else i.stop}'
            return text + (f':{i.step}' if i.step is not None else '')
        return str(i)

    return '[' + ', '.join(one(i) for i in index) + ']'


def format_steps(head: str, steps: Sequence[Step]) -> str:
    """The canonical text of a name: ``state.params['embed']``."""
    return head + ''.join(s.text() for s in steps)


def short_name(text: str) -> str:
    """A notebook variable name for a value: its last attribute or identifier key, else the
    variable (``state.params['embed']['embedding'][::2]`` -> ``embedding``)."""
    head, steps = parse(text, cuts=True)
    for s in reversed(steps):
        if s.kind in ('attr', 'key') and isinstance(s.value, str) and s.value.isidentifier():
            return s.value
    return head


def _bad(text: str, why: str = '') -> BadName:
    return BadName(
        f'{text!r} is not a name of an engine value{": " + why if why else ""}; use {EXAMPLES} '
        '(a variable, then attributes and subscripts with constant keys; never evaluated).'
    )


def _integer(node: Any, text: str) -> int | None:
    if node is None:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        if isinstance(inner, ast.Constant) and type(inner.value) is int:
            return -inner.value
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    raise _bad(text, f'{ast.unparse(node)} is not an integer literal')


def _subscript(node: Any, text: str) -> Step:
    if isinstance(node, ast.Constant) and type(node.value) is str:
        return Step('key', node.value)
    if isinstance(node, ast.Slice):
        return Step(
            'index',
            (
                slice(
                    _integer(node.lower, text),
                    _integer(node.upper, text),
                    _integer(node.step, text),
                ),
            ),
        )
    if isinstance(node, ast.Tuple):
        parts: list[int | slice] = []
        for e in node.elts:
            if isinstance(e, ast.Slice):
                parts.append(
                    slice(_integer(e.lower, text), _integer(e.upper, text), _integer(e.step, text))
                )
            else:
                value = _integer(e, text)
                assert value is not None
                parts.append(value)
        return Step('index', tuple(parts))
    value = _integer(node, text)
    assert value is not None
    return Step('key', value)


def parse(text: Any, *, cuts: bool = False) -> tuple[str, tuple[Step, ...]]:
    """``'state.params["embed"]'`` -> ``('state', (Step('attr', 'params'), Step('key', 'embed')))``.

    Args:
        text: the name as typed.
        cuts: allow a trailing array cut (``[::4, :128]``: slices or several indices).

    Raises:
        BadName: anything else, saying what is accepted.
    """
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text))
    try:
        node = ast.parse(text.strip(), mode='eval').body
    except SyntaxError:
        raise _bad(text) from None
    steps: list[Step] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            steps.append(Step('attr', node.attr))
        else:
            steps.append(_subscript(node.slice, text))
        node = node.value
    if not isinstance(node, ast.Name):
        raise _bad(text)
    steps.reverse()
    for i, s in enumerate(steps):
        if s.kind != 'index':
            continue
        where = format_steps(node.id, steps[: i + 1])
        if not cuts:
            raise _bad(
                text,
                f'{where} cuts an array (slices or several indices), which only %mh_allgather does',
            )
        if i != len(steps) - 1:
            raise _bad(text, f'{where}: an array cut can only be the last step')
    return node.id, tuple(steps)


def _is_array(obj: Any) -> bool:
    """A numpy or jax array (jax is not imported here: checked by type name)."""
    if hasattr(obj, 'shape') and hasattr(obj, 'dtype') and hasattr(obj, 'ndim'):
        return True
    return False


def _keys_text(keys: Sequence[Any]) -> str:
    shown = ', '.join(str(k) for k in keys[:MAX_KEYS])
    return shown + (f', ... ({len(keys)} in all)' if len(keys) > MAX_KEYS else '')


def _fields(obj: Any) -> list[str]:
    """What ``.name`` can reach on a non-mapping: dataclass fields, named-tuple fields, public
    instance attributes."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj)]
    fields = getattr(type(obj), '_fields', None)
    if isinstance(fields, tuple):
        return [str(f) for f in fields]
    names = getattr(obj, '__dict__', None)
    if isinstance(names, dict):
        return [k for k in names if not k.startswith('_')]
    return []


def _suggest(word: str, options: Sequence[Any]) -> str:
    close = difflib.get_close_matches(word, [str(o) for o in options], n=1)
    return f'; did you mean {close[0]!r}?' if close else ''


def _what(obj: Any) -> str:
    name = type(obj).__name__
    return f'{"an" if name[:1].lower() in "aeiou" or name.startswith("nd") else "a"} {name}'


def _real_attribute(obj: Any, name: str) -> bool:
    """Whether ``obj`` has attribute ``name`` of its own or of its class (not one made up by
    a ``__getattr__``)."""
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return False
    return True


def _attr(obj: Any, name: str, where: str, full: str) -> Any:
    if isinstance(obj, Mapping):
        has_key = name in obj
        if _real_attribute(obj, name):
            value = getattr(obj, name)
            if has_key and callable(value):
                raise BadName(
                    f'{full}: {where} has a key {name!r} and an attribute {name!r}; a real '
                    f'attribute wins, and {where}.{name} is a method. For the key, write '
                    f'{where}[{name!r}].'
                )
            return value
        if has_key:
            return obj[name]
        try:
            return getattr(obj, name)  # a mapping with attribute access (e.g. nnx.State)
        except AttributeError:
            pass
        keys = list(obj.keys())
        raise BadName(
            f'{full}: {where} has no key or attribute {name!r}; keys: {_keys_text(keys)}'
            + _suggest(name, keys)
        )
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    fields = _fields(obj)
    listed = f'; fields: {_keys_text(fields)}' if fields else ''
    hint = ''
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        hint = f'; it is a sequence of {len(obj)}: use {where}[0]'
    raise BadName(
        f'{full}: {where} ({_what(obj)}) has no attribute {name!r}{listed}'
        + _suggest(name, fields)
        + hint
    )


def _key(obj: Any, key: Any, where: str, full: str) -> Any:
    if isinstance(obj, Mapping):
        try:
            return obj[key]
        except KeyError:
            pass
        keys = list(obj.keys())
        attr = ''
        if isinstance(key, str) and key.isidentifier() and _real_attribute(obj, key):
            attr = f' ({where}.{key} is an attribute, not a key)'
        raise BadName(
            f'{full}: {where} has no key {key!r}{attr}; keys: {_keys_text(keys)}'
            + (_suggest(key, keys) if isinstance(key, str) else '')
        )
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        if isinstance(key, int):
            try:
                return obj[key]
            except IndexError:
                raise BadName(
                    f'{full}: {where} ({_what(obj)} of {len(obj)}) has no item {key}'
                ) from None
        fields = getattr(type(obj), '_fields', None)
        if isinstance(fields, tuple) and key in fields:
            return getattr(obj, key)
        raise BadName(
            f'{full}: {where} is {_what(obj)} of {len(obj)}: index it with an integer, '
            f'e.g. {where}[0]'
        )
    if isinstance(key, str) and _fields(obj) and key in _fields(obj):
        return getattr(obj, key)
    raise BadName(
        f'{full}: {where} ({_what(obj)}) has no keys or items'
        + (f'; fields: {_keys_text(_fields(obj))} (use .name)' if _fields(obj) else '')
    )


#: Keys a namespace may hold to name itself in a missing name's message (``'in frame 0
#: (train.py:93 in train)'``) and to say what helps there (`multihost.engine.stopped`).
HELD_PLACE, HELD_HINT = '__mh_place__', '__mh_hint__'


def resolve(
    namespace: Mapping[str, Any], text: str, *, cuts: bool = False
) -> tuple[Any, tuple[int | slice, ...] | None]:
    """The value ``text`` names in ``namespace``, and the trailing array cut, if any.

    Args:
        namespace: the engine's user namespace.
        text: the name (see `parse`).
        cuts: allow a trailing array cut (``x[::4, :128]``, ``x[3]`` on an array),
            returned as a tuple of ints and slices, for the caller to apply.

    Raises:
        BadName: the name does not parse, or a step fails: the message names the
            step, what was there, and the keys or fields it has.
    """
    head, steps = parse(text, cuts=cuts)
    full = format_steps(head, steps)
    if head not in namespace:
        mine = [k for k in namespace if isinstance(k, str) and not k.startswith('_')]
        # A stopped frame's namespace (`engine.stopped`) says where it is and what helps there.
        place = namespace.get(HELD_PLACE, 'on this engine')
        hint = namespace.get(
            HELD_HINT, 'Define it in a %%mh cell first (every host runs the cell).'
        )
        raise BadName(f'name {head!r} is not defined {place}{_suggest(head, mine) or "."} {hint}')
    obj = namespace[head]
    for i, step in enumerate(steps):
        where = format_steps(head, steps[:i])
        last = i == len(steps) - 1
        if step.kind == 'index' or (
            step.kind == 'key' and type(step.value) is int and _is_array(obj)
        ):
            if not _is_array(obj):
                raise BadName(
                    f'{full}: {format_index(step.value)} cuts an array, but {where} is {_what(obj)}'
                )
            index = step.value if step.kind == 'index' else (step.value,)
            if not (cuts and last):
                raise BadName(
                    f'{full}: {where} is an array; '
                    + (
                        'an array cut can only be the last step'
                        if cuts
                        else f'only %mh_allgather cuts arrays: pass {where}'
                    )
                )
            return obj, tuple(index)
        parent = obj
        if step.kind == 'attr':
            obj = _attr(obj, step.value, where, full)
        else:
            obj = _key(obj, step.value, where, full)
        if inspect.ismethod(obj) or inspect.isbuiltin(obj) or inspect.isfunction(obj):
            here = format_steps(head, steps[: i + 1])
            raise BadName(
                f'{full}: {here} is a function or method ({getattr(obj, "__qualname__", obj)}), '
                'not a value'
                + (
                    f' (a key {step.value!r} would be {where}[{step.value!r}])'
                    if step.kind == 'attr' and isinstance(parent, Mapping)
                    else ''
                )
            )
    return obj, None
