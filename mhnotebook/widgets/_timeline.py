"""The timeline view: a host x time chart of collectives and watched launches, and who is late.

Built from a `multihost.Timeline` (every host's flight records aligned step
by step). Pure parts, testable without a widget: `chart_hosts` picks the
rows (every host up to `MAX_ROWS`, else the ones most often last),
`render_timeline_png` draws the chart with matplotlib (Agg, no pyplot
state), `steps_table_html` is the newest steps' table.
"""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from mhnotebook.widgets._common import (
    CSS,
    RefreshableView,
    _png_b64,
    add_classes,
    banner,
    esc,
    expect_model,
    host_color,
    swatch,
    widget_html,
)
from multihost._models import Timeline
from multihost._text import fmt_hosts, fmt_seconds

#: Host rows drawn at most; with more hosts, those most often last are drawn.
MAX_ROWS = 32
#: Steps listed in the table (the newest).
TABLE_ROWS = 20
#: Per-host lateness columns in the table up to this many hosts.
MAX_HOST_COLUMNS = 16
#: Hosts named in the chart's legend of who arrived last.
_LEGEND_HOSTS = 8

_DPI = 100
_ROW_IN = 0.26  # height of one host row
_ROW_IN_MANY = 0.18  # ... with more than 16 rows
_SKEW_IN = 1.3  # height of the skew panel
_TOP_IN = 0.4  # title
_LEGEND_IN = 1.45  # right margin for the legend
_BOTTOM_IN = 0.5  # x axis label
_GAP_IN = 0.3
_LAST_MARK = '#000000'  # black: no host colour is black
_TIED = '#555555'  # a step whose latest arrival is a tie: nobody's colour (none is this)
_MAGIC = '#e4e4e4'  # the notebook's own collectives (%mh_diff...): grey, hatched


def chart_hosts(timeline: Timeline, max_rows: int = MAX_ROWS) -> tuple[list[int], bool]:
    """The hosts that get a row, in process order, and whether some were left out.

    Every host up to ``max_rows``; beyond, the hosts most often last (then
    the latest on average), so the stragglers are always drawn.
    """
    hosts = list(timeline.hosts)
    if len(hosts) <= max_rows:
        return hosts, False
    counts = timeline.stragglers().counts
    total: dict[int, float] = {}
    for s in timeline.steps:
        if s.notebook:
            continue
        for p, late in s.lateness.items():
            total[p] = total.get(p, 0.0) + late
    ranked = sorted(hosts, key=lambda p: (-counts.get(p, 0), -total.get(p, 0.0), p))
    return sorted(ranked[:max_rows]), True


def render_timeline_png(timeline: Timeline, *, width: int = 860, max_rows: int = MAX_ROWS) -> bytes:
    """Draws the host x time chart and the skew of every step as a PNG.

    Top panel, one row per host (process 0 at the top), x = seconds since
    the first entry on each host's own clock: a bar from a host's arrival at
    a checked step to its release (its wait: long for hosts that waited for
    others), a tick for an unchecked launch, and a black triangle on the host
    that arrived last at each step. Bottom panel: each step's skew (first to
    last arrival), coloured by the host that arrived last; hollow markers
    compare wall clocks (unchecked launches). Uses matplotlib's Agg canvas
    directly (no pyplot, no global backend switch).

    Args:
        timeline: a `multihost.Timeline`.
        width: the image's width in pixels.
        max_rows: host rows at most (see `chart_hosts`); the title says how
            many were left out.

    Returns:
        The PNG file's bytes.
    """
    hosts, capped = chart_hosts(timeline, max_rows)
    fig, ax, ax_skew = _chart_axes(timeline, hosts, capped, width)
    if not timeline.steps:
        ax.text(0.5, 0.5, 'no steps recorded', ha='center', va='center', transform=ax.transAxes)
        ax.set_yticks([])
        ax_skew.set_yticks([])
        return _png(fig)
    _draw_hosts(ax, timeline, hosts)
    _draw_skew(ax_skew, timeline, timeline.origin)
    return _png(fig)


def _chart_axes(
    timeline: Timeline, hosts: list[int], capped: bool, width: int
) -> tuple[Any, Any, Any]:
    """The figure, sized for ``hosts`` rows, with its title: (figure, host axes, skew axes)."""
    from matplotlib.figure import Figure

    n_rows = max(len(hosts), 1)
    row_in = _ROW_IN if n_rows <= 16 else _ROW_IN_MANY
    top_h = max(row_in * n_rows + 0.3, 1.0)
    fig_w = width / _DPI
    magic = any(s.notebook for s in timeline.steps)
    lines = int(capped) + int(magic)  # title lines beyond the first
    fig_h = _TOP_IN + 0.18 * lines + top_h + _GAP_IN + _SKEW_IN + _BOTTOM_IN
    fig = Figure(figsize=(fig_w, fig_h), dpi=_DPI)
    left, right = 0.95 / fig_w, 1 - _LEGEND_IN / fig_w
    ax = fig.add_axes(
        (left, (_BOTTOM_IN + _SKEW_IN + _GAP_IN) / fig_h, right - left, top_h / fig_h)
    )
    ax_skew = fig.add_axes((left, _BOTTOM_IN / fig_h, right - left, _SKEW_IN / fig_h), sharex=ax)
    title = 'process x time: bar = wait at a checked step (long: waited for others), '
    title += '| = unchecked launch, ▼ = arrived last'
    if magic:
        title += (
            "\ngrey hatched bar = a collective of the notebook's magics (%mh_diff...): "
            'not a step of the program, left out of the straggler verdict'
        )
    if capped:
        title += (
            f'\n{len(hosts)} of {len(timeline.hosts)} processes drawn (those most often last); '
            'the table and text cover every process'
        )
    fig.suptitle(title, fontsize=8, y=1 - 0.08 / fig_h, va='top')
    return fig, ax, ax_skew


@dataclasses.dataclass
class _HostMarks:
    """What the host panel draws on one host's row (x: seconds since the origin)."""

    bars: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    magic_bars: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    arrivals: list[float] = dataclasses.field(default_factory=list)
    ticks: list[float] = dataclasses.field(default_factory=list)


def _host_marks(
    timeline: Timeline, rows: dict[int, int]
) -> tuple[dict[int, _HostMarks], list[tuple[float, float]]]:
    """Each drawn host's marks, and the (x, y) of every "arrived last" triangle."""
    marks = {p: _HostMarks() for p in rows}
    last_marks: list[tuple[float, float]] = []
    for s in timeline.steps:
        last = s.last_host if s.complete and not s.notebook else None
        for p, r in s.records.items():
            if p not in rows:
                continue
            x = r.time - timeline.origin
            if s.seq is not None:
                marks[p].arrivals.append(x)
                if r.wait is not None:
                    (marks[p].magic_bars if s.notebook else marks[p].bars).append((x, r.wait))
            else:
                marks[p].ticks.append(x)
            if p == last:
                last_marks.append((x, rows[p] - 0.42))
    return marks, last_marks


def _draw_hosts(ax: Any, timeline: Timeline, hosts: list[int]) -> None:
    """The top panel: one row per host with its waits, launches and "arrived last" marks."""
    rows = {p: i for i, p in enumerate(hosts)}
    marks, last_marks = _host_marks(timeline, rows)
    for p in hosts:
        y, m, color = rows[p], marks[p], host_color(p)
        if m.bars:
            ax.broken_barh(m.bars, (y - 0.3, 0.6), facecolors=color, edgecolors='none', alpha=0.8)
        if m.magic_bars:  # the notebook's own collectives (%mh_diff...): grey, hatched, not counted
            ax.broken_barh(
                m.magic_bars,
                (y - 0.3, 0.6),
                facecolors=_MAGIC,
                edgecolors='#888888',
                hatch='///',
                linewidth=0.3,
            )
        if m.arrivals:
            ax.vlines(m.arrivals, y - 0.34, y + 0.34, colors='#333333', linewidth=0.6)
        if m.ticks:
            ax.vlines(m.ticks, y - 0.4, y + 0.4, colors=color, linewidth=1.2)
    if last_marks:
        xs, ys = zip(*last_marks)
        ax.scatter(list(xs), list(ys), marker='v', s=22, c=_LAST_MARK, zorder=3, linewidths=0)
    ax.set_ylim(max(len(hosts), 1) - 0.5, -0.8)
    ax.set_yticks(range(len(hosts)))
    ax.set_yticklabels([f'process {p}' for p in hosts], fontsize=7 if len(hosts) > 16 else 8)
    for label, p in zip(ax.get_yticklabels(), hosts):
        label.set_color(host_color(p) if p % 20 < 10 else '#333333')
    ax.tick_params(axis='x', labelbottom=False)
    ax.grid(axis='x', color='#dddddd', linewidth=0.5)
    ax.set_axisbelow(True)


def _draw_skew(ax: Any, timeline: Timeline, origin: float) -> None:
    """Each step's skew (ms) at its first arrival, coloured by the host that arrived last."""
    from matplotlib.lines import Line2D

    xs, ys, colors, hollow = [], [], [], []
    lasts: dict[int, int] = {}
    for s in timeline.steps:
        if not s.complete or s.notebook:  # the notebook's own collectives: not the program's
            continue
        last = s.last_host  # None: a tie, nobody was last
        xs.append(s.start - origin)
        ys.append(s.skew * 1e3)
        colors.append(_TIED if last is None else host_color(last))
        hollow.append(s.clock_compared)
        if last is not None:
            lasts[last] = lasts.get(last, 0) + 1
    if xs:
        ax.vlines(xs, 0, ys, colors=colors, linewidth=1.0, alpha=0.7)
        solid = [i for i, h in enumerate(hollow) if not h]
        empty = [i for i, h in enumerate(hollow) if h]
        if solid:
            ax.scatter(
                [xs[i] for i in solid],
                [ys[i] for i in solid],
                s=16,
                c=[colors[i] for i in solid],
                zorder=3,
                edgecolors='#444444',  # light host colours stay visible
                linewidths=0.4,
            )
        if empty:
            ax.scatter(
                [xs[i] for i in empty],
                [ys[i] for i in empty],
                s=16,
                facecolors='white',
                edgecolors=[colors[i] for i in empty],
                zorder=3,
                linewidths=1.0,
            )
        ax.set_ylim(0, max(ys) * 1.15 or 1.0)
    else:
        ax.text(
            0.5,
            0.5,
            'no step passed by two or more processes yet',
            ha='center',
            va='center',
            transform=ax.transAxes,
            fontsize=8,
        )
    ax.set_ylabel('skew (ms)', fontsize=8)
    ax.set_xlabel("seconds since the first entry (each process's own clock)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(axis='y', color='#dddddd', linewidth=0.5)
    ax.set_axisbelow(True)
    top = sorted(lasts, key=lambda p: (-lasts[p], p))[:_LEGEND_HOSTS]
    handles = [
        Line2D(
            [],
            [],
            marker='o',
            linestyle='',
            color=host_color(p),
            markeredgecolor='#444444',
            markeredgewidth=0.4,
            markersize=5,
            label=f'process {p} last ({lasts[p]})',
        )
        for p in top
    ]
    if any(hollow):
        handles.append(
            Line2D(
                [],
                [],
                marker='o',
                linestyle='',
                markerfacecolor='white',
                markeredgecolor='#555555',
                markersize=5,
                label='wall clocks compared',
            )
        )
    if handles:
        ax.legend(
            handles=handles,
            fontsize=7,
            loc='upper left',
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
            borderaxespad=0.2,
        )


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=_DPI)
    return buf.getvalue()


def summary_html(timeline: Timeline) -> str:
    """The straggler sentence as a banner (flagged when a host stands out), the clock caveat."""
    st = timeline.stragglers()
    cls = 'mh-flagged' if st.host is not None else 'mh-info'
    text = str(st)
    claim, _, caveat = text.partition(' (wall clocks compared')
    body = f'<b>{esc(claim)}</b>'
    if caveat:
        body += esc(' (wall clocks compared' + caveat)
    elif timeline.clock_compared:
        body += (
            '<br>Unchecked launches (<code>watch(..., check=False)</code>) compare wall '
            'clocks: clock skew between machines adds to their lateness.'
        )
    return CSS + f'<div class="mh-timeline-summary">{banner(body, cls)}</div>'


def steps_table_html(timeline: Timeline, rows: int = TABLE_ROWS) -> str:
    """The newest ``rows`` steps: the host that arrived last, the skew, each host's lateness.

    Cells of the last host have class ``mh-odd-host``; rows ``mh-timeline-step``.
    """
    if not timeline.steps:
        return ''
    shown = timeline.steps[-rows:]
    hosts = list(timeline.hosts) if len(timeline.hosts) <= MAX_HOST_COLUMNS else []
    head = '<th>step</th><th>last to arrive</th><th>skew</th>'
    head += ''.join(f'<th class="mh-host-{p}">{swatch(p)} {p}</th>' for p in hosts)
    body = []
    for s in reversed(shown):
        last = s.last_host if s.complete and not s.notebook else None
        star = '*' if s.clock_compared else ''
        if s.notebook and s.complete:
            who, skew = f'(not counted: {esc(s.magic)})', f'+{esc(fmt_seconds(s.skew))}'
        elif last is not None:
            who = f'{swatch(last)} process {last}'
            skew = f'+{esc(fmt_seconds(s.skew))}{star}'
        elif s.complete and s.tied:
            who, skew = esc(s.tie), f'+{esc(fmt_seconds(s.skew))}{star}'
        else:
            who, skew = esc(s.describe().split(': ', 1)[-1]), ''
        mark = f' <span class="mh-timeline-magic">[{esc(s.magic)}]</span>' if s.notebook else ''
        if s.inside and not s.notebook:
            mark = f' <span class="mh-timeline-magic">[inside {esc(s.inside)}]</span>'
        cells = [f'<td><code>{esc(s.label)}</code>{mark}</td><td>{who}</td><td>{skew}</td>']
        for p in hosts:
            cls = f'mh-host-{p}' + (' mh-odd-host' if p == last else '')
            if p in s.lateness:
                text = f'{s.lateness[p] * 1e3:.1f}'
            elif p in s.waiting:
                text = 'waiting'
            elif p in s.missing:
                text = 'absent'
            else:
                text = ''
            cells.append(f'<td class="{cls}">{text}</td>')
        row_cls = 'mh-timeline-step' + (' mh-timeline-notebook' if s.notebook else '')
        body.append(f'<tr class="{row_cls}">{"".join(cells)}</tr>')
    notes = []
    if hosts:
        notes.append('per process: ms after the first process to arrive')
    if any(s.notebook for s in shown):
        notes.append("[%mh_...]: the notebook's own collective, left out of the straggler verdict")
    if any(s.clock_compared for s in shown):
        notes.append('* wall clocks compared (unchecked launch)')
    more = len(timeline.steps) - len(shown)
    if more:
        notes.append(f'{more} older steps in the chart and the Chrome trace')
    return (
        f'{CSS}<div class="mh-timeline-table"><div class="mh-scroll"><table class="mh-table">'
        f'<tr>{head}</tr>{"".join(body)}</table></div>'
        + (f'<div style="font-size:11px">{esc("; ".join(notes))}</div>' if notes else '')
        + '</div>'
    )


def status_html(timeline: Timeline) -> str:
    """How many steps and hosts, and who sent nothing."""
    text = (
        f'{len(timeline.steps)} steps from {len(timeline.hosts)} of '
        f'{timeline.num_processes} processes, read at {time.strftime("%H:%M:%S")}'
    )
    if timeline.silent:
        text += f'; no records from {fmt_hosts(timeline.silent)}'
    return CSS + f'<span class="mh-timeline-state">{esc(text)}</span>'


class TimelineView(RefreshableView):
    """A `multihost.Timeline` as a host x time chart, the straggler summary and a step table.

    Args:
        timeline: a `multihost.Timeline` (``multihost.timeline()`` on a
            host, ``session.timeline()`` in the notebook).
        on_refresh: returns a fresh timeline; enables the Refresh button.
        max_rows: host rows of the chart at most (see `chart_hosts`).

    Stable CSS classes: ``mh-timeline`` (the view), ``mh-timeline-status``,
    ``mh-timeline-summary`` (the straggler sentence), ``mh-timeline-chart``
    (the PNG), ``mh-timeline-table`` (rows ``mh-timeline-step``, cells
    ``mh-host-<p>``, the last host's ``mh-odd-host``),
    ``mh-timeline-message``, ``mh-refresh-button``.
    """

    def __init__(
        self,
        timeline: Timeline,
        *,
        on_refresh: Callable[[], Timeline] | None = None,
        max_rows: int = MAX_ROWS,
    ):
        self._on_refresh = on_refresh
        self.max_rows = int(max_rows)
        self._refresh = self._refresh_button("read every process's flight records again")
        self._status = add_classes(widgets.HTML(), 'mh-timeline-status')
        self._message = add_classes(widgets.HTML(), 'mh-timeline-message')
        self._summary = add_classes(widgets.HTML(), 'mh-timeline-summary')
        self._chart = add_classes(widgets.Image(format='png'), 'mh-timeline-chart')
        self._table = add_classes(widgets.HTML(), 'mh-timeline-table')
        top = widgets.HBox([self._refresh, self._status])
        self.widget = add_classes(
            widgets.VBox([top, self._message, self._summary, self._chart, self._table]),
            'mh-timeline',
        )
        self.update(timeline)

    @property
    def timeline(self) -> Timeline:
        """The timeline shown."""
        return self._timeline

    def text(self) -> str:
        """The timeline's own text (`Timeline.format`): the summary and the newest steps."""
        return self._timeline.format()

    def static_html(self) -> str:
        """The widget's picture; its parts keep their ``mh-timeline*`` classes."""
        chart = (
            f'<img class="mh-timeline-chart" src="data:image/png;base64,'
            f'{_png_b64(self._chart.value)}" alt="process x time chart of the timeline">'
        )
        inner = widget_html(self.widget, {id(self._chart): chart})
        return f'<div class="mh-timeline">{inner}</div>'

    def update(self, timeline: Timeline) -> None:
        """Shows another timeline."""
        expect_model(
            'TimelineView',
            timeline,
            Timeline,
            'multihost.timeline() in a process, session.timeline() in the notebook',
        )
        self._timeline = timeline
        self._status.value = status_html(timeline)
        self._summary.value = summary_html(timeline)
        self._chart.value = render_timeline_png(timeline, max_rows=self.max_rows)
        self._table.value = steps_table_html(timeline)
