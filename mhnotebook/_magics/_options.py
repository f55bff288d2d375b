"""The magics' arguments: options several magics share, and the checks of what was typed.

A shared option is a decorator (stacked under ``@magic_arguments.magic_arguments()``
like IPython's own ``argument``), so its spelling and help are written once.
Nothing typed is evaluated: names are parsed (`multihost._names`), values are
Python literals at most.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core import magic_arguments
from IPython.core.error import UsageError

F = TypeVar('F', bound=Callable[..., Any])


def options(*arguments: magic_arguments.argument) -> Callable[[F], F]:
    """One decorator for several ``magic_arguments.argument``s, in the order written."""

    def add(fn: F) -> F:
        for argument in reversed(arguments):  # the parser reads decorators bottom-up
            fn = argument(fn)
        return fn

    return add


def timeout_option(default: float | None, help: str) -> Callable[[F], F]:
    """``--timeout SECONDS``, of the magics that wait (checked by `check_timeout`)."""
    return options(magic_arguments.argument('--timeout', type=float, default=default, help=help))


def check_timeout(timeout: float | None, example: str) -> None:
    """A `UsageError` unless ``timeout`` is None or > 0 seconds (``example``: a valid use)."""
    from mhnotebook._jobview import seconds

    try:
        seconds(timeout)
    except ValueError:
        raise UsageError(
            f'--timeout must be > 0 seconds, got {timeout:g}; e.g. {example}'
        ) from None


def no_arguments(line: str, message: str) -> None:
    """A `UsageError` saying ``message`` if a magic that takes no arguments got some."""
    if line.strip():
        raise UsageError(message)


def valid_name(name: str, *, cuts: bool = False) -> str:
    """``name`` if it names an engine value (`multihost._names`: ``state.params['embed']``,
    ``state.opt_state[0].mu``; with ``cuts``, also ``x[::4, :128]``), else a `UsageError`."""
    from multihost import _names

    try:
        _names.parse(name, cuts=cuts)
    except _names.BadName as exc:
        raise UsageError(str(exc)) from None
    return name


def parse_call(text: str) -> tuple[str, list[str]]:
    """``'train_step(state, batch)'`` -> ``('train_step', ['state', 'batch'])``: a launch as
    the job calls it, each part an engine name (parsed, never evaluated), else a `UsageError`."""
    import ast

    example = 'e.g. %mh_replay train_step(state, batch)'
    try:
        node = ast.parse(text.strip(), mode='eval').body
    except SyntaxError:
        node = None
    if not isinstance(node, ast.Call) or node.keywords:
        raise UsageError(
            f'%mh_replay takes a call with positional arguments, got {text!r}; {example}'
        )
    parts = [ast.unparse(node.func)] + [ast.unparse(a) for a in node.args]
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise UsageError(f'%mh_replay: name each argument (no *args), got {text!r}; {example}')
    return valid_name(parts[0]), [valid_name(p) for p in parts[1:]]


def gather_target(name: str, out: str | None) -> str:
    """The notebook variable ``%mh_allgather NAME [-o OUT]`` fills (default: NAME's last part),
    if NAME names what can be gathered (slices too); else a `UsageError`."""
    from mhnotebook._transfer._gather import parse_target
    from multihost import _names

    try:
        parse_target(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = out or _names.short_name(name)
    if not out.isidentifier():
        raise UsageError(f'-o {out!r} is not a notebook variable name; use e.g. -o params')
    return out


def parse_axes(text: str) -> tuple[int, ...]:
    """``'0,2'`` -> ``(0, 2)`` (the view checks them against the array's shape)."""
    try:
        return tuple(int(a) for a in text.split(','))
    except ValueError:
        raise UsageError(f'--axes takes two integers like 0,1; got {text!r}') from None


def compact_subscripts(line: str) -> str:
    """``x[::4, :128] -o y`` -> ``x[::4,:128] -o y``: a subscript stays one argument
    (spaces inside quotes are kept)."""
    out, depth, quote = [], 0, ''
    for ch in line:
        if quote:
            quote = '' if ch == quote else quote
        elif ch in '\'"':
            quote = ch
        elif ch == '[':
            depth += 1
        elif ch == ']':
            depth = max(depth - 1, 0)
        elif ch.isspace() and depth:
            continue
        out.append(ch)
    return ''.join(out)


def literal(text: str) -> Any:
    """A Python literal (number, list, dict, quoted string...) or, failing that, the text."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def unquote(text: str | None) -> str | None:
    """``text`` without one pair of enclosing quotes (IPython keeps them in magic arguments)."""
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in '"\'':
        return text[1:-1]
    return text


_UNITS = {'': 1, 'b': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9, 't': 1e12}


def parse_bytes(text: str) -> int:
    """``'1000'``, ``'500MB'``, ``'8GiB'``, ``'1.5g'`` -> bytes."""
    m = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*', text.lower())
    if not m:
        raise UsageError(f'--max-bytes takes a size like 1000000, 500MB or 8GiB; got {text!r}')
    number, unit, binary = m.groups()
    scale = 1024 ** 'bkmgt'.index(unit or 'b') if binary else _UNITS[unit]
    return int(float(number) * scale)
