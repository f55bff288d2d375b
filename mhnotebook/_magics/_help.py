"""``%mh_help``'s table and the room's module docstring, made from the magics' docstrings.

Each magic's docstring is the one source: its first line says what it
answers, its ``Example::`` block how to ask; a new magic shows up here as it is.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

_HEAD = ('magic', 'what it answers', 'example')
_NOTE = 'One magic in full (usage, options, examples): %mh_layout?'


def _magic_doc(method: Any) -> str:
    """A magic's own docstring (for magic_arguments ones: without the generated usage/options)."""
    parser = getattr(method, 'parser', None)
    doc = parser.description if parser is not None else method.__doc__
    return inspect.cleandoc(doc or '')


def _magic_examples(doc: str) -> list[str]:
    """The magic lines (``%...``, ``%%...``) of a docstring's ``Example::``/``Examples::`` block."""
    lines = inspect.cleandoc(doc).splitlines()
    starts = [i for i, ln in enumerate(lines) if re.fullmatch(r'Examples?::', ln.strip())]
    if not starts:
        return []
    found = []
    for ln in lines[starts[0] + 1 :]:
        if ln.strip() and not ln.startswith(' '):  # the literal block ends
            break
        if ln.strip().startswith('%'):
            found.append(ln.strip())
    return found


def _registered_magics(owner: Any) -> list[tuple[str, Any]]:
    """``('%name' or '%%name', method)`` of each magic of a `Magics` class or instance.

    In the order of the class body (``%%mh`` after ``%mh_cluster``, ``%mh_help`` last).
    """
    found = []
    for kind, prefix in (('line', '%'), ('cell', '%%')):
        for name, method in owner.magics[kind].items():
            method = getattr(owner, method) if isinstance(method, str) else method  # class: names
            found.append((prefix + name, method))
    order = list(vars(owner if isinstance(owner, type) else type(owner)))
    return sorted(found, key=lambda f: order.index(f[1].__name__) if f[1].__name__ in order else 0)


def help_table(owner: Any) -> dict[str, str]:
    """What ``%mh_help`` shows (text and HTML): one row per magic of ``owner``, from its docstring.

    Purpose: the docstring's first line; example: the shortest line of its
    ``Example::`` block.
    """
    import html

    rows = []
    for form, method in _registered_magics(owner):
        doc = _magic_doc(method)
        purpose = doc.splitlines()[0].replace('``', '') if doc else ''
        rows.append((form, purpose, min(_magic_examples(doc) or [form], key=len)))
    widths = [max(len(r[i]) for r in [_HEAD, *rows]) for i in range(3)]
    text = [
        '  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [_HEAD, *rows]
    ]
    head = ''.join(f'<th style="text-align:left">{h}</th>' for h in _HEAD)
    body = ''.join(
        f'<tr><td style="text-align:left"><code>{html.escape(form)}</code></td>'
        f'<td style="text-align:left">{html.escape(purpose)}</td>'
        f'<td style="text-align:left"><code>{html.escape(example)}</code></td></tr>'
        for form, purpose, example in rows
    )
    return {
        'text/plain': '\n'.join([*text, '', _NOTE]),
        'text/html': f'<table class="mh-help"><thead><tr>{head}</tr></thead>'
        f'<tbody>{body}</tbody></table><p>{html.escape(_NOTE)}</p>',
    }


def magic_docs(magics: type) -> str:
    """Every magic of the `Magics` class ``magics`` with its docstring (reStructuredText)."""
    parts = []
    for form, method in _registered_magics(magics):
        doc = _magic_doc(method).replace('\n', '\n    ')
        parts.append(f'``{form}``\n\n    {doc}')
    return '\n\n'.join(parts)
