"""Reading what a view shows as a browser test would: its HTML parsed, its widgets by CSS class.

Importable from test modules as ``from _html import ...``. The HTML a view
renders is parsed (stdlib `html.parser`), never grepped: `elements` finds
elements by class and tag, with their attributes, their text and their
parent, so a test can say *which* row holds a word (`inside`). `find` and
`one` walk a live widget tree by the stable ``mh-*`` classes, and
`png_size` measures the pictures.
"""

from __future__ import annotations

import functools
from html.parser import HTMLParser
from typing import Any

#: Elements that never have an end tag (the HTML standard's void elements).
VOID = frozenset(
    {
        'area',
        'base',
        'br',
        'col',
        'embed',
        'hr',
        'img',
        'input',
        'link',
        'meta',
        'source',
        'track',
        'wbr',
    }
)


class _Elements(HTMLParser):
    """Every start tag as a dict: tag, attrs, classes, text inside it (no CSS), parent."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[dict[str, Any]] = []
        self.stack: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        el = {
            'tag': tag,
            'attrs': a,
            'classes': set((a.get('class') or '').split()),
            'text': '',
            'parent': self.stack[-1] if self.stack else None,
        }
        self.found.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()['tag'] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1]['tag'] == 'style':
            return  # a stylesheet is not text anyone reads
        for el in self.stack:
            el['text'] += data


@functools.lru_cache(maxsize=64)
def _parse(html: str) -> tuple[dict[str, Any], ...]:
    p = _Elements()
    p.feed(html)
    p.close()
    return tuple(p.found)


def elements(html: str, cls: str | None = None, tag: str | None = None) -> list[dict[str, Any]]:
    """Parsed elements of an HTML string, in document order, by class and tag.

    The same dicts on every call with the same string (parsed once), so that
    elements found by two calls can be compared by identity (`inside`).
    """
    return [
        e
        for e in _parse(html)
        if (cls is None or cls in e['classes']) and (tag is None or e['tag'] == tag)
    ]


def inside(el: dict[str, Any] | None, ancestor: dict[str, Any]) -> bool:
    """Whether parsed element ``el`` is ``ancestor`` or nested in it."""
    while el is not None:
        if el is ancestor:
            return True
        el = el['parent']
    return False


def find(widget: Any, cls: str) -> list[Any]:
    """Every widget in the tree below ``widget`` (itself included) with CSS class ``cls``."""
    out = [widget] if cls in getattr(widget, '_dom_classes', ()) else []
    for child in getattr(widget, 'children', ()):
        out += find(child, cls)
    return out


def one(widget: Any, cls: str) -> Any:
    """The one widget below ``widget`` with CSS class ``cls`` (fails if there are 0 or 2+)."""
    found = find(widget, cls)
    assert len(found) == 1, f'{len(found)} widgets with class {cls!r}'
    return found[0]


def is_png(data: bytes) -> bool:
    """Whether ``data`` is a PNG with something drawn in it (more than a header)."""
    return data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 1000


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, from its header."""
    return int.from_bytes(data[16:20], 'big'), int.from_bytes(data[20:24], 'big')
