"""What every view shares: host colours, HTML helpers, the view base class.

A view is a thin object around an ipywidgets container (``view.widget``) and a
model (a frozen dataclass from `multihost`). Its text/plain form is the
model's own text, so a terminal IPython, a log or a failed widget frontend
still shows something useful.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any

#: Host colours: matplotlib's ``tab20`` reordered so the first ten hosts get
#: the saturated colours and the next ten their light twins. Hosts beyond 20
#: reuse colours (``host % 20``); the label and the legend name the host.
PALETTE = (
    '#1f77b4',
    '#ff7f0e',
    '#2ca02c',
    '#d62728',
    '#9467bd',
    '#8c564b',
    '#e377c2',
    '#7f7f7f',
    '#bcbd22',
    '#17becf',
    '#aec7e8',
    '#ffbb78',
    '#98df8a',
    '#ff9896',
    '#c5b0d5',
    '#c49c94',
    '#f7b6d2',
    '#c7c7c7',
    '#dbdb8d',
    '#9edae5',
)

#: Host lists in headers are cut after this many ranges.


def host_color(process: int) -> str:
    """The fill colour of a host (``'#rrggbb'``); colours repeat every ``len(PALETTE)`` hosts."""
    return PALETTE[process % len(PALETTE)]


def text_color(fill: str) -> str:
    """Black or white, whichever reads better on ``fill`` (``'#rrggbb'``)."""
    r, g, b = (int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5))
    luminance = 0.299 * r + 0.587 * g + 0.114 * b
    return '#000000' if luminance > 0.55 else '#ffffff'


def esc(value: Any) -> str:
    """HTML-escaped text (call sites such as ``<ipython-input-3>`` contain brackets)."""
    return html.escape(str(value), quote=True)


def swatch(process: int) -> str:
    """A small coloured square for a host, as HTML."""
    return (
        f'<span class="mh-swatch" style="display:inline-block;width:0.9em;height:0.9em;'
        f'vertical-align:middle;border:1px solid #0003;background:{host_color(process)}">'
        '</span>'
    )


#: Shared CSS for the HTML tables of the views. Class names are the public,
#: stable selectors (see `mhnotebook.widgets`); colours are only defaults.
CSS = """<style>
.mh-table {border-collapse:collapse;font-size:12px;font-family:var(--jp-code-font-family,monospace)}
.mh-table th,.mh-table td {border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
.mh-table th {background:#f3f3f3}
.mh-table td.mh-odd-host,.mh-table th.mh-odd-host {background:#ffd6d6;font-weight:bold}
.mh-table td.mh-arrived {background:#d9f2d9}
.mh-table td.mh-waiting {background:#cfe5fb}
.mh-table td.mh-missing {background:#fff3c4;color:#7a6000}
.mh-table td.mh-mismatched {background:#ffb3b3;font-weight:bold}
.mh-table td.mh-passed {background:#eeeeee;color:#777}
.mh-table tr.mh-no-answer td {background:#fff3c4}
.mh-banner {padding:4px 8px;border-radius:3px;margin:2px 0}
.mh-banner.mh-divergent,.mh-banner.mh-flagged,.mh-banner.mh-error {background:#ffd6d6;
  border:1px solid #d62728}
.mh-banner.mh-ok {background:#d9f2d9;border:1px solid #2ca02c}
.mh-banner.mh-info {background:#eef4fb;border:1px solid #9ab}
.mh-values {margin:2px 0;font-size:11px;max-height:20em;overflow:auto}
details.mh-stack > summary {cursor:pointer}
.mh-scroll {overflow-x:auto;max-width:100%}
</style>"""


def pre(text: str, cls: str = 'mh-values') -> str:
    """Preformatted, escaped text."""
    return f'<pre class="{cls}">{esc(text)}</pre>'


def banner(text_html: str, *classes: str) -> str:
    """A coloured one-paragraph message (``mh-ok``, ``mh-divergent``, ``mh-error``...)."""
    return f'<div class="mh-banner {" ".join(classes)}">{text_html}</div>'


class View:
    """Base of the views: a model, an ipywidgets container and a text fallback.

    Subclasses set ``self.widget`` and implement `text`. Displaying the view
    (``display(view)`` or leaving it last in a cell) shows the widget in a
    notebook and ``text()`` everywhere else.
    """

    widget: Any

    def text(self) -> str:
        """The plain-text form of what the view shows (the model's own text)."""
        raise NotImplementedError

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_() or {})
        data['text/plain'] = self.text()
        return data

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        first = self.text().split('\n', 1)[0]
        return f'<{type(self).__name__}: {first}>'

    def close(self) -> None:
        """Closes the widgets (frees their comms); the view cannot be shown afterwards."""
        _close_tree(self.widget)


def _close_tree(widget: Any) -> None:
    """Closes a widget, its children, and its layout and style (widgets of their own)."""
    for child in getattr(widget, 'children', ()):
        _close_tree(child)
    for part in (getattr(widget, 'layout', None), getattr(widget, 'style', None)):
        if hasattr(part, 'close'):
            part.close()
    widget.close()


def close_widgets(widgets: Iterable[Any]) -> None:
    """Closes widgets that are being replaced, so their comms do not leak."""
    for w in widgets:
        _close_tree(w)


def add_classes(widget: Any, *classes: str) -> Any:
    """Adds CSS classes (stable selectors for tests and styling) to a widget; returns it."""
    for cls in classes:
        widget.add_class(cls)
    return widget


def run_action(fn: Callable[[], Any], what: str, report: Callable[[str], None]) -> tuple[bool, Any]:
    """Calls an injected callback; an exception becomes a message instead of vanishing.

    Button callbacks run in the kernel's comm handler, where a traceback
    would only reach the browser's log console; the views show it instead.

    Returns:
        ``(True, result)`` on success, ``(False, None)`` after reporting the error.
    """
    try:
        return True, fn()
    except Exception as exc:  # shown to the user, who can act on it
        report(f'{what} failed: {type(exc).__name__}: {exc}')
        return False, None
