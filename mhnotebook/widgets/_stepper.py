"""The barrier stepper: host x step grid with Step, Continue, Stop and Refresh.

The grid is a pure function of a `multihost.StepTable`. The buttons call
callables the caller injects (the session passes e.g. ``session.release``);
the view never talks to the cluster itself.

Cell states (CSS classes on the grid's cells), in the model's words:

* ``mh-waiting``: the host arrived and is paused at the step's gate,
  waiting for its release (`Step.waiting`);
* ``mh-arrived``: the host arrived and went on (the step is released or
  open), waiting in the barrier for the others;
* ``mh-missing``: the host has not arrived yet;
* ``mh-mismatched``: the host arrived but is about to call something else
  than the majority (the step is divergent);
* ``mh-passed``: every host got through the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from mhnotebook.widgets._common import (
    CSS,
    RefreshableView,
    add_classes,
    banner,
    esc,
    expect_model,
    run_action,
)
from multihost._models import CollectiveRecord, Step, StepTable
from multihost._text import fmt_hosts, short_site

#: More hosts than this: hosts whose columns are identical share one column.
MAX_HOST_COLUMNS = 16
#: Divergent steps explained in the banner.
MAX_BANNER_STEPS = 3


def _call(rec: CollectiveRecord) -> str:
    """``barrier('ckpt')`` (the call without its site)."""
    return f'{rec.kind}({rec.name!r})' if rec.name else rec.kind


#: Every cell state, most important first.
STATES = ('mismatched', 'passed', 'missing', 'waiting', 'arrived')


def cell_state(step: Step, process: int) -> str:
    """One host at one step: one of `STATES` (see the module docstring)."""
    rec = step.records[process] if process < len(step.records) else None
    if rec is not None and process in step.odd_processes:
        return 'mismatched'
    if step.passed:
        return 'passed'
    if rec is None:
        return 'missing'
    return 'waiting' if process in step.waiting else 'arrived'


def host_groups(table: StepTable) -> list[tuple[int, ...]]:
    """The grid's columns: one host each, or (many hosts) hosts with identical columns."""
    n = table.num_processes
    if n <= MAX_HOST_COLUMNS:
        return [(p,) for p in range(n)]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for p in range(n):
        position = table.positions[p] if p < len(table.positions) else None
        cells = tuple((cell_state(s, p), _call_key(s.records[p])) for s in table.steps)
        groups.setdefault((position, *cells), []).append(p)
    return [tuple(g) for g in groups.values()]


def _call_key(rec: CollectiveRecord | None) -> tuple[str, str, str, str] | None:
    return None if rec is None else (rec.kind, rec.name, rec.digest, rec.site)


def divergence_html(step: Step) -> str:
    """Which hosts call what at a divergent step."""
    ref = step.majority
    if ref is None:
        raise ValueError(f'step #{step.seq}: no process arrived, so no process diverges')
    by_call: dict[tuple[str, str], list[int]] = {}
    for p in step.odd_processes:
        rec = step.records[p]
        if rec is None:  # odd_processes holds arrived hosts only
            continue
        by_call.setdefault((_call(rec), short_site(rec.site)), []).append(p)
    majority = [p for p in step.arrived if p not in step.odd_processes]
    odd = '; '.join(
        f'<b class="mh-odd-host">{esc(fmt_hosts(hosts))}</b> '
        f'call{"s" if len(hosts) == 1 else ""} <code>{esc(call)}</code> at {esc(site)}'
        for (call, site), hosts in by_call.items()
    )
    return (
        f'<b>Divergence at step #{step.seq}:</b> {odd}, while {esc(fmt_hosts(majority))} '
        f'call <code>{esc(_call(ref))}</code> at {esc(short_site(ref.site))}.'
    )


def banner_html(table: StepTable) -> str:
    """A warning naming the odd hosts of every divergent step (empty when none diverges)."""
    steps = table.divergent
    if not steps:
        return ''
    parts = [divergence_html(s) for s in steps[:MAX_BANNER_STEPS]]
    if len(steps) > MAX_BANNER_STEPS:
        parts.append(f'... and {len(steps) - MAX_BANNER_STEPS} more divergent steps.')
    parts.append(
        'These processes are about to call different collectives: releasing the step '
        "fails it on every process. Look at the odd processes' code paths (Where)."
    )
    return CSS + banner('<br>'.join(parts), 'mh-divergent')


def status_html(table: StepTable) -> str:
    """One line: stepping on or off, the current step, who waits and who is missing."""
    when = time.strftime('%H:%M:%S', time.localtime(table.time)) if table.time else ''
    head = f'{table.num_processes} process(es), stepping {"on" if table.stepping else "off"}'
    current = table.pending or next((s for s in table.steps if not s.passed), None)
    if current is not None:
        ref = current.majority
        text = (
            f'step #{current.seq} <code>{esc(_call(ref) if ref else "?")}</code> is '
            f'{current.status}: {len(current.arrived)}/{table.num_processes} processes arrived'
        )
        if current.waiting:
            text += f', {esc(fmt_hosts(current.waiting))} waiting for its release'
        if current.missing:
            text += f', {esc(fmt_hosts(current.missing))} not arrived yet'
    elif table.stepping:
        text = f'no step paused; Step releases #{table.next_release} ahead of the processes'
    else:
        text = 'no collective in flight'
    paused = table.launches
    if paused:
        by_call: dict[str, list[int]] = {}
        for h in paused:
            by_call.setdefault(f'{h.name} @ {short_site(h.site)}', []).append(h.process)
        text += '; paused before a launch (Step releases it): ' + ', '.join(
            f'<code>{esc(call)}</code>: {esc(fmt_hosts(ps))}' for call, ps in by_call.items()
        )
    return CSS + (
        f'<div class="mh-stepper-state">{head}: {text}'
        + (f' <span class="mh-time">(as of {when})</span>' if when else '')
        + '</div>'
    )


def grid_html(table: StepTable) -> str:
    """The host x step grid: one row per visible step, one column per host (or host group)."""
    if not table.steps:
        return CSS + '<div class="mh-stepper-empty">no collective in flight</div>'
    groups = host_groups(table)
    head = ['<th>step</th>']
    for g in groups:
        odd = any(p in s.odd_processes for s in table.steps for p in g)
        cls = f'mh-host-{g[0]}' + (' mh-odd-host' if odd else '')
        name = f'process {g[0]}' if len(g) == 1 else f'{fmt_hosts(g)} ({len(g)} processes)'
        head.append(f'<th class="{cls}" data-hosts="{",".join(map(str, g[:64]))}">{esc(name)}</th>')
    position = ['<td>at step</td>']
    for g in groups:
        pos = table.positions[g[0]] if g[0] < len(table.positions) else None
        position.append(f'<td class="mh-position">{"-" if pos is None else f"#{pos}"}</td>')
    rows = [f'<tr>{"".join(head)}</tr>', f'<tr class="mh-positions">{"".join(position)}</tr>']
    for s in table.steps:
        label = f'#{s.seq} {s.status}' + (' DIVERGENT' if s.divergent else '')
        cells = [f'<td class="mh-step-label">{esc(label)}</td>']
        for g in groups:
            p = g[0]
            state = cell_state(s, p)
            rec = s.records[p] if p < len(s.records) else None
            if rec is None:
                text = 'not arrived' if state == 'missing' else ''
                title = ''
            else:
                text = f'{esc(_call(rec))}<br><small>{esc(short_site(rec.site))}</small>'
                if state == 'waiting':
                    text += '<br><small>waiting for release</small>'
                title = esc(rec.describe())
            cells.append(
                f'<td class="mh-cell mh-{state} mh-host-{p}" data-host="{p}" '
                f'data-state="{state}" title="{title}">{text}</td>'
            )
        cls = f'mh-step mh-step-{s.status}' + (' mh-divergent' if s.divergent else '')
        rows.append(f'<tr class="{cls}" data-seq="{s.seq}">{"".join(cells)}</tr>')
    return (
        f'{CSS}<div class="mh-scroll"><table class="mh-table mh-stepper-table">'
        f'{"".join(rows)}</table></div>'
    )


Action = Callable[[], Any]


class StepperView(RefreshableView):
    """The barrier stepper: a host x step grid and Step / Continue / Stop / Refresh buttons.

    The buttons call the injected callables; none of them is required (a
    missing one disables its button). After Step, Continue or Stop, the view
    shows the `StepTable` the callable returned, if it returned one, and
    otherwise calls ``on_refresh``. Errors raised by a callable are shown in
    the view. Note: button callbacks run when the kernel is idle, not while
    a cell is executing.

    Args:
        table: a `multihost.StepTable` (``multihost.step_table()``).
        on_step: releases the next step (e.g. ``session.release``).
        on_continue: lets the hosts run on (e.g. releases everything).
        on_stop: stops the program (e.g. interrupts the hosts).
        on_refresh: returns a fresh `StepTable`.

    Stable CSS classes: ``mh-stepper`` (the view), ``mh-stepper-banner``,
    ``mh-stepper-status``, ``mh-stepper-message``, ``mh-stepper-grid`` (cells
    ``mh-waiting`` / ``mh-arrived`` / ``mh-missing`` / ``mh-mismatched`` /
    ``mh-passed``, ``mh-host-<p>``), ``mh-step-button``, ``mh-continue-button``,
    ``mh-stop-button``, ``mh-refresh-button``.
    """

    def __init__(
        self,
        table: StepTable,
        *,
        on_step: Action | None = None,
        on_continue: Action | None = None,
        on_stop: Action | None = None,
        on_refresh: Callable[[], StepTable] | None = None,
    ):
        self._on_step, self._on_continue, self._on_stop = on_step, on_continue, on_stop
        self._on_refresh = on_refresh
        self._banner = add_classes(widgets.HTML(), 'mh-stepper-banner')
        self._status = add_classes(widgets.HTML(), 'mh-stepper-status')
        self._message = add_classes(widgets.HTML(), 'mh-stepper-message')
        self._grid = add_classes(widgets.HTML(), 'mh-stepper-grid')
        self._step_button = self._button(
            'Step', 'mh-step-button', on_step, lambda: self._act(self._on_step, 'Step')
        )
        self._continue_button = self._button(
            'Continue',
            'mh-continue-button',
            on_continue,
            lambda: self._act(self._on_continue, 'Continue'),
            'release every step: let the processes run on',
        )
        self._stop_button = self._button(
            'Stop',
            'mh-stop-button',
            on_stop,
            lambda: self._act(self._on_stop, 'Stop'),
            'stop the program on every process',
            style='danger',
        )
        self._refresh = self._button(
            'Refresh', 'mh-refresh-button', on_refresh, self.refresh, 'read the table again'
        )
        buttons = add_classes(
            widgets.HBox(
                [self._step_button, self._continue_button, self._stop_button, self._refresh]
            ),
            'mh-stepper-buttons',
        )
        self.widget = add_classes(
            widgets.VBox([self._banner, buttons, self._status, self._message, self._grid]),
            'mh-stepper',
        )
        self.update(table)

    @property
    def table(self) -> StepTable:
        """The step table shown."""
        return self._table

    def text(self) -> str:
        """The table's own text grid (`StepTable.format`)."""
        return self._table.format()

    def update(self, table: StepTable) -> None:
        """Shows another step table."""
        expect_model('StepperView', table, StepTable, 'multihost.step_table()')
        self._table = table
        self._banner.value = banner_html(table)
        self._status.value = status_html(table)
        self._grid.value = grid_html(table)
        self._step_button.tooltip = f'release step #{table.next_release}'

    def _refreshed(self, table: Any) -> None:
        if not isinstance(table, StepTable):
            raise TypeError(f'{type(table).__name__}, expected a multihost.StepTable')
        self.update(table)

    def _act(self, fn: Action | None, what: str) -> None:
        if fn is None:
            return
        ok, result = run_action(fn, what, self._error)
        if not ok:
            return
        self._message.value = ''
        if isinstance(result, StepTable):
            self.update(result)
        elif self._on_refresh is not None:
            self.refresh()

    @staticmethod
    def _button(
        label: str,
        cls: str,
        callback: Any,
        handler: Callable[[], None],
        tooltip: str = '',
        style: str = '',
    ) -> widgets.Button:
        button = add_classes(
            widgets.Button(
                description=label, tooltip=tooltip, button_style=style, disabled=callback is None
            ),
            cls,
            'mh-button',
        )
        button.on_click(lambda _b: handler())
        return button
