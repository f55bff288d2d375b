"""What every view shares: host colours, HTML helpers, the view base class.

A view is a thin object around an ipywidgets container (``view.widget``) and a
model (a frozen dataclass from `multihost`). Its text/plain form is the
model's own text, so a terminal IPython, a log or a failed widget frontend
still shows something useful.

Displayed in a kernel, a view leaves two outputs: the live widget, and a
static picture of it (``text/html`` with images inlined, plus ``image/png``
when it draws one) made from the widget tree itself (`widget_html`), so every
view, including later ones, has it with no code of its own. A saved notebook
reopened without its kernel (JupyterLab shows "Error displaying widget: model
not found" and nothing else for a widget), nbviewer and GitHub show the
picture. While the widget is alive, a ``<style>`` inside it hides the
picture, so a live notebook shows it once.
"""

from __future__ import annotations

import base64
import colorsys
import html
import uuid
from collections.abc import Callable, Iterable, Mapping
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


def host_color(process: int) -> str:
    """The fill colour of a host (``'#rrggbb'``): `PALETTE`'s for the first hosts, then a hue of
    its own per host (spread by the golden ratio, at two lightnesses), so colours never wrap
    around: 64 hosts of a v5e-256 are 64 colours, the same in every view."""
    if 0 <= process < len(PALETTE):
        return PALETTE[process]
    hue = (process * 0.6180339887498949) % 1.0
    light = 0.5 if process % 2 == 0 else 0.7
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.62)
    return '#{:02x}{:02x}{:02x}'.format(*(round(v * 255) for v in (r, g, b)))


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


def odd_host(process: int, inner_html: str) -> str:
    """``inner_html`` marked as host ``process``'s (a bar of its colour), class ``mh-odd-host``."""
    return (
        f'<span class="mh-odd-host" style="border-left:4px solid {host_color(process)};'
        f'padding-left:4px">{inner_html}</span>'
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
.mh-replica-box,.mh-mesh-view {max-width:600px;margin-bottom:8px}
.mh-replica-caption,.mh-mesh-caption,.mh-replica-note,.mh-mesh-more,.mh-layout-facets-more
  {font-size:12px;color:#444;margin:2px 0}
.mh-table.mh-replica-matrix td,.mh-table.mh-replica-matrix th {padding:1px 4px;text-align:center}
.mh-table.mh-replica-matrix td.mh-replica-cell {min-width:1.2em;border:1px solid #bbb}
.mh-table.mh-replica-matrix td.mh-replica-odd {outline:3px solid #d62728;outline-offset:-3px;
  font-weight:bold;color:#a00000;background-image:repeating-linear-gradient(45deg,
  rgba(214,39,40,.45) 0 2px,transparent 2px 6px)}
.mh-table.mh-replica-matrix td.mh-replica-empty {background:#fafafa}
.mh-table.mh-replica-matrix td.mh-replica-gap,.mh-table.mh-replica-matrix th.mh-replica-gap
  {background:#fff;color:#777;border-style:dashed}
.mh-table.mh-replica-matrix tr.mh-flagged > th:first-child {color:#d62728}
.mh-table.mh-mesh-devices td.mh-mesh-device {white-space:nowrap;font-size:11px}
.mh-table.mh-mesh-axes tr.mh-crosses-hosts td:last-child {font-weight:bold}
.mh-layout-facets {display:flex;flex-flow:row wrap;gap:8px 16px}
.mh-layout-facet-title {font-size:12px;font-weight:bold;margin:2px 0}
.mh-layout-facet-grid {display:grid;gap:2px}
div.mh-layout-block {min-height:24px;padding:2px 6px;font-size:12px;display:flex;
  align-items:center;justify-content:center;border-radius:2px;white-space:nowrap}
div.mh-layout-block.mh-flagged {outline:3px solid #000;outline-offset:-3px}
div.mh-layout-block.mh-marked {outline:3px dashed #000;outline-offset:-3px}
div.mh-layout-block.mh-selected {font-weight:bold}
</style>"""


def expect_model(view: str, value: Any, cls: type, made_by: str) -> None:
    """Raises TypeError unless ``value`` is a ``cls`` (naming what makes one, and what it got)."""
    if not isinstance(value, cls):
        raise TypeError(
            f'{view} expects a multihost.{cls.__name__} ({made_by}), '
            f'got {type(value).__module__}.{type(value).__qualname__}'
        )


def pre(text: str, cls: str = 'mh-values') -> str:
    """Preformatted, escaped text."""
    return f'<pre class="{cls}">{esc(text)}</pre>'


def banner(text_html: str, *classes: str) -> str:
    """A coloured one-paragraph message (``mh-ok``, ``mh-divergent``, ``mh-error``...)."""
    return f'<div class="mh-banner {" ".join(classes)}">{text_html}</div>'


def _png_b64(value: Any) -> str:
    return base64.b64encode(bytes(value)).decode('ascii')


def widget_html(widget: Any, replace: Mapping[int, str] | None = None) -> str:
    """Static HTML of a widget tree as it shows now: what a page without a kernel can show.

    HTML and labels keep their content, images are inlined (``data:`` URLs),
    boxes keep their direction, accordions and tabs become ``<details>``
    sections, output widgets show their outputs; controls that need a kernel
    (buttons, sliders, dropdowns) and hidden widgets are left out.

    Args:
        widget: the root widget, or a `View` (its `View.static_html`: the view's
            own picture, with the parts it fills only on demand).
        replace: ``id(widget)`` -> HTML to show instead of that widget's own
            content (e.g. sections filled only when expanded).

    Raises:
        TypeError: ``widget`` is neither an ipywidgets widget nor a view.
    """
    import ipywidgets as w

    if isinstance(widget, View) and not replace:
        return widget.static_html()
    if isinstance(widget, View):
        widget = widget.widget
    if not isinstance(widget, w.Widget):
        raise TypeError(
            'widget_html takes an ipywidgets widget or a mhnotebook view (e.g. where_view(...)), '
            f'got {type(widget).__module__}.{type(widget).__qualname__}'
        )
    replace = replace or {}

    def walk(x: Any) -> str:
        if getattr(getattr(x, 'layout', None), 'display', None) == 'none':
            return ''
        if id(x) in replace:
            return replace[id(x)]
        if isinstance(x, w.Accordion | w.Tab):
            return _sections_html(x, walk)
        if isinstance(x, w.Stack):
            i = x.selected_index
            return walk(x.children[i]) if i is not None and i < len(x.children) else ''
        if isinstance(x, w.Box):
            return _box_html(x, walk)
        if isinstance(x, w.Output):
            return _output_html(x)
        return _leaf_html(x)

    return walk(widget)


def _sections_html(x: Any, walk: Callable[[Any], str]) -> str:
    """An accordion or tabs as ``<details>`` sections (the selected one open)."""
    titles = tuple(getattr(x, 'titles', ()) or ())
    parts = []
    for i, child in enumerate(x.children):
        title = titles[i] if i < len(titles) and titles[i] else f'{i + 1}'
        opened = ' open' if i == x.selected_index else ''
        parts.append(f'<details{opened}><summary>{esc(title)}</summary>{walk(child)}</details>')
    return f'<div>{"".join(parts)}</div>' if parts else ''


def _box_html(x: Any, walk: Callable[[Any], str]) -> str:
    """A box's children in a div: a wrapping row for an HBox or a grid, a column otherwise."""
    import ipywidgets as w

    inner = ''.join(walk(child) for child in x.children)
    if not inner:
        return ''
    row = isinstance(x, w.HBox | w.GridBox)
    style = 'display:flex;flex-flow:row wrap;gap:8px;align-items:flex-start' if row else ''
    return f'<div style="{style}">{inner}</div>'


def _output_html(x: Any) -> str:
    """An output widget's outputs: HTML, PNG or plain text, in that preference."""
    parts = []
    for out in x.outputs:
        data = out.get('data', {})
        if 'text/html' in data:
            parts.append(str(data['text/html']))
        elif 'image/png' in data:
            parts.append(f'<img src="data:image/png;base64,{data["image/png"]}" alt="">')
        elif 'text/plain' in data or 'text' in out:
            parts.append(pre(str(data.get('text/plain', out.get('text', '')))))
    return ''.join(parts)


def _leaf_html(x: Any) -> str:
    """HTML, a label or an image as it shows; a control (it needs a kernel) as nothing."""
    import ipywidgets as w

    if isinstance(x, w.HTML | w.HTMLMath):
        return f'<div>{x.value}</div>' if x.value else ''
    if isinstance(x, w.Label):
        return f'<div>{esc(x.value)}</div>' if x.value else ''
    if isinstance(x, w.Image):
        if not x.value:
            return ''
        return f'<img src="data:image/{x.format};base64,{_png_b64(x.value)}" alt="">'
    return ''


def first_png(widget: Any) -> bytes | None:
    """The value of the first visible PNG image in a widget tree, or None."""
    import ipywidgets as w

    if getattr(getattr(widget, 'layout', None), 'display', None) == 'none':
        return None
    if isinstance(widget, w.Image) and widget.format == 'png' and widget.value:
        return bytes(widget.value)
    for child in getattr(widget, 'children', ()):
        found = first_png(child)
        if found is not None:
            return found
    return None


class View:
    """Base of the views: a model, an ipywidgets container and a text fallback.

    Subclasses set ``self.widget`` and implement `text`. Displaying the view
    (``display(view)`` or leaving it last in a cell) shows the widget in a
    notebook and ``text()`` everywhere else; in a kernel it also leaves a
    static picture of the widget (`static_bundle`) that a saved notebook,
    nbviewer or GitHub shows where the widget cannot render.
    """

    widget: Any
    _static_token: str | None = None
    _live_widget: Any = None
    _closed: bool = False

    def text(self) -> str:
        """The plain-text form of what the view shows (the model's own text)."""
        raise NotImplementedError

    def static_html(self) -> str:
        """What the widget shows now, as static HTML (images inlined); see `widget_html`.

        Views whose widget fills parts only on demand override it to show them.
        """
        return widget_html(self.widget)

    def static_bundle(self) -> dict[str, Any]:
        """The static picture as a display bundle: ``text/html`` and, if drawn, ``image/png``.

        Its outer element has class ``mh-static`` and ``mh-static-<token>``,
        the token this view's live widget hides while it is alive.
        """
        if self._static_token is None:
            self._static_token = uuid.uuid4().hex[:12]
        data: dict[str, Any] = {
            'text/html': (
                f'<div class="mh-static mh-static-{self._static_token}">{self.static_html()}</div>'
            )
        }
        png = first_png(self.widget)
        if png is not None:
            data['image/png'] = _png_b64(png)
        return data

    def _live(self) -> Any:
        """The widget as displayed: the view's widget plus the style that hides its picture."""
        import ipywidgets as w

        if self._live_widget is None:
            if self._static_token is None:
                self._static_token = uuid.uuid4().hex[:12]
            cls = f'mh-static-{self._static_token}'
            hider = w.HTML(
                f'<style>.{cls}{{display:none}}'
                f'.jp-OutputArea-child:has(> .jp-OutputArea-output > .{cls}),'
                f'.output_area:has(> .output_subarea > .{cls}){{display:none}}</style>'
            )
            hider.layout.display = 'none'
            hider.add_class('mh-static-hider')
            self._live_widget = w.VBox([self.widget, hider])
            self._live_widget.layout.padding = '0'
        return self._live_widget

    def close(self) -> int:
        """Closes every widget of the view (ipywidgets' ``close()``; their layouts and styles
        and the views inside it too) and lets the kernel free all it held (widgets, PNGs,
        gathered values, the model): what is left is its text, which showing it again
        shows. The magics call it on the view that a new run of theirs replaces. Returns
        the number of widgets closed."""
        if self._closed:
            return 0
        text = self.text()
        seen: set[int] = set()
        closed = 0
        for value in list(vars(self).values()):
            items = value.values() if isinstance(value, dict) else value
            for item in items if isinstance(value, (tuple, list, dict)) else (value,):
                if isinstance(item, View) and item is not self:  # a view inside this one
                    closed += item.close()
                else:
                    _close_tree(item, seen)
        vars(self).clear()  # nothing will show it again: the kernel frees what it held
        self._closed = True
        self.text = lambda: text  # type: ignore[method-assign]
        return closed + len(seen)

    def _ipython_display_(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        if shell is None or getattr(shell, 'kernel', None) is None or self._closed:
            display(self._repr_mimebundle_(), raw=True)  # a terminal: the text
            return
        bundle = dict(self._live()._repr_mimebundle_() or {})
        bundle['text/plain'] = self.text()
        display(bundle, raw=True)
        display(self.static_bundle(), raw=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self._closed:  # its widgets are gone: the text is what is left to show
            return {'text/plain': self.text()}
        data = dict(self.widget._repr_mimebundle_() or {})
        data['text/plain'] = self.text()
        return data

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        first = self.text().split('\n', 1)[0]
        return f'<{type(self).__name__}: {first}>'


def _close_tree(widget: Any, seen: set[int] | None = None) -> None:
    """Closes a widget and every widget its traits hold (children, layout, style), each once
    (``seen``: the ids closed so far, shared across calls)."""
    import ipywidgets as w

    seen = set() if seen is None else seen
    if not isinstance(widget, w.Widget) or id(widget) in seen:
        return
    seen.add(id(widget))
    for key in widget.keys:
        value = getattr(widget, key, None)
        for child in value if isinstance(value, (tuple, list)) else (value,):
            _close_tree(child, seen)
    widget.close()


def close_widgets(widgets: Iterable[Any]) -> None:
    """Closes widgets that are being replaced, so their comms do not leak."""
    for w in widgets:
        _close_tree(w)


def add_classes(widget: Any, *classes: str) -> Any:
    """Adds CSS classes (stable selectors for tests and styling) to a widget; returns it.

    One assignment for all of them (``add_class`` per class copies the list each time: a
    block held by 1,000 hosts, one ``mh-host-<p>`` each, took seconds).
    """
    new = tuple(dict.fromkeys((*widget._dom_classes, *classes)))
    if new != tuple(widget._dom_classes):
        widget._dom_classes = new
    return widget


class RefreshableView(View):
    """A view with a Refresh button: ``on_refresh`` returns a fresh model, which `_refreshed`
    shows (``update``). An error, raised by ``on_refresh`` or by a model the view cannot show,
    becomes a message in the view (`_error`), never a traceback lost in the browser's log.

    A subclass sets ``self._on_refresh`` and ``self._message`` (an HTML widget) and makes its
    button with `_refresh_button`; it overrides `_refreshed` when a refresh shows more than
    ``update(model)``.
    """

    _on_refresh: Callable[[], Any] | None = None
    _message: Any

    def _refresh_button(self, tooltip: str) -> Any:
        """The Refresh button (``mh-refresh-button``), disabled without ``on_refresh``."""
        import ipywidgets as widgets

        button = add_classes(
            widgets.Button(
                description='Refresh', tooltip=tooltip, disabled=self._on_refresh is None
            ),
            'mh-refresh-button',
            'mh-button',
        )
        button.on_click(lambda _b: self.refresh())
        return button

    def refresh(self) -> None:
        """Calls ``on_refresh`` and shows what it returns."""
        if self._on_refresh is None:
            return
        ok, got = run_action(self._on_refresh, 'Refresh', self._error)
        if not ok:
            return
        self._message.value = ''
        try:
            self._refreshed(got)
        except (TypeError, AttributeError, ValueError) as exc:
            self._error(f'Refresh: on_refresh returned something this view cannot show: {exc}')

    def _refreshed(self, got: Any) -> None:
        self.update(got)  # type: ignore[attr-defined]

    def _error(self, text: str) -> None:
        import textwrap

        self._message.value = CSS + banner(esc(textwrap.shorten(text, 2000)), 'mh-error')


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
