"""The "where is every host" view: per host, its collective, step gate and stacks.

Built from `multihost.HostStacks` (one per host, taken by each engine's debug
thread, so it answers while the main thread is stuck). A table lists every
host; below it, hosts with identical stacks are grouped (with hundreds of
hosts, the odd ones stand out as small groups), each with its main thread's
stack and its other threads, collapsible.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ipywidgets as widgets

from mhnotebook.widgets._common import (
    CSS,
    View,
    add_classes,
    banner,
    esc,
    pre,
    run_action,
)
from multihost import HostStacks
from multihost._text import fmt_hosts

#: Hosts listed in the table (the stack groups below still cover every host).
MAX_ROWS = 64
#: Stack groups shown; more groups are counted.
MAX_GROUPS = 32
#: Groups expanded by default when there are at most this many.
_OPEN_GROUPS = 4

StacksLike = Mapping[int, HostStacks] | Iterable[HostStacks]


def _normalize(stacks: StacksLike) -> dict[int, HostStacks]:
    if isinstance(stacks, HostStacks):
        stacks = [stacks]
    items = stacks.items() if isinstance(stacks, Mapping) else ((s.process, s) for s in stacks)
    out = {}
    for p, s in items:
        if not isinstance(s, HostStacks):
            raise TypeError(
                'WhereView expects multihost.HostStacks (one per host, e.g. from '
                f'multihost.dump_stacks), got {type(s).__module__}.'
                f'{type(s).__qualname__}'
            )
        out[int(p)] = s
    return dict(sorted(out.items()))


def _current_key(s: HostStacks) -> Any:
    c = s.current
    return None if c is None else (c.seq, c.kind, c.name)


def odd_processes(stacks: Mapping[int, HostStacks]) -> tuple[int, ...]:
    """Hosts whose current collective (step, kind, name) differs from the most common one."""
    keys = {p: _current_key(s) for p, s in stacks.items()}
    if len(set(keys.values())) <= 1:
        return ()
    counts = collections.Counter(keys.values())
    best = max(counts.values())
    common = next(k for k in keys.values() if counts[k] == best)  # ties: the lowest host's
    return tuple(p for p, k in keys.items() if k != common)


def _where_line(s: HostStacks) -> str:
    if s.current is None:
        return 'no collective entered'
    return s.current.describe()


def table_html(stacks: Mapping[int, HostStacks], max_rows: int = MAX_ROWS) -> str:
    """One row per host: machine, answered or not, current collective, gate, innermost frame."""
    odd = set(odd_processes(stacks))
    rows = []
    for p, s in list(stacks.items())[:max_rows]:
        cls = (
            [f'mh-host-{p}']
            + (['mh-no-answer'] if not s.answered else [])
            + (['mh-odd-host'] if p in odd else [])
        )
        machine = f'{s.hostname} (pid {s.os_pid})' if s.hostname else ''
        state = 'answered' if s.answered else f'no answer: {s.error}'
        gate = '' if s.gate is None else f'waiting for release of #{s.gate}'
        current = '' if s.current is None else s.current.describe()
        cur_cls = ' class="mh-odd-host"' if p in odd else ''
        rows.append(
            f'<tr class="{" ".join(cls)}" data-host="{p}"><td>{p}</td>'
            f'<td>{esc(machine)}</td><td>{esc(state)}</td>'
            f'<td{cur_cls}>{esc(current)}</td><td>{esc(gate)}</td>'
            f'<td>{esc(s.where)}</td></tr>'
        )
    more = ''
    if len(stacks) > max_rows:
        more = f'<div>... {len(stacks) - max_rows} more hosts (all are in the groups below)</div>'
    return (
        f'{CSS}<div class="mh-scroll"><table class="mh-table mh-where-grid"><tr>'
        '<th>host</th><th>machine</th><th>state</th><th>collective</th><th>gate</th>'
        f'<th>where</th></tr>{"".join(rows)}</table></div>{more}'
    )


def _group_key(s: HostStacks) -> Any:
    c = s.current
    return (
        s.answered,
        '' if s.answered else s.error,
        None if c is None else (c.seq, c.kind, c.name, c.site),
        s.gate,
        tuple((t.name, t.main, t.frames) for t in s.threads),
    )


def stack_groups(stacks: Mapping[int, HostStacks]) -> list[tuple[int, ...]]:
    """Hosts with the same collective, gate and thread stacks, largest group last.

    The odd ones out come first: with hundreds of hosts, the one stuck
    elsewhere is a group of one at the top.
    """
    groups: dict[Any, list[int]] = {}
    for p, s in stacks.items():
        groups.setdefault(_group_key(s), []).append(p)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: (len(g), g[0]))


def stacks_html(stacks: Mapping[int, HostStacks], max_groups: int = MAX_GROUPS) -> str:
    """The grouped stacks: per group, the main thread's stack, then the other threads."""
    groups = stack_groups(stacks)
    odd = set(odd_processes(stacks))
    parts = []
    for g in groups[:max_groups]:
        s = stacks[g[0]]
        who = fmt_hosts(g) + (f' ({len(g)} hosts)' if len(g) > 1 else '')
        head = f'{who}: {_where_line(s)}'
        if s.gate is not None:
            head += f', waiting for release of step #{s.gate}'
        cls = (
            'mh-stack-group '
            + ' '.join(f'mh-host-{p}' for p in g[:64])
            + (' mh-odd-host' if odd & set(g) else '')
        )
        body = []
        if not s.answered:
            body.append(banner(esc(f'no answer: {s.error}'), 'mh-error'))
        else:
            if s.where:
                body.append(f'<div>where: <code>{esc(s.where)}</code></div>')
            main = s.main_thread
            if main is not None:
                body.append(
                    f'<details class="mh-stack mh-main-thread" open><summary>main thread '
                    f'({esc(main.name)})</summary>{pre(main.stack, "mh-stack-text")}'
                    '</details>'
                )
            for t in s.threads:
                if t.main:
                    continue
                kind = ' (daemon)' if t.daemon else ''
                body.append(
                    f'<details class="mh-stack mh-thread"><summary>thread '
                    f'{esc(t.name)}{kind}</summary>{pre(t.stack, "mh-stack-text")}'
                    '</details>'
                )
        opened = ' open' if len(groups) <= _OPEN_GROUPS else ''
        parts.append(
            f'<details class="{cls}" data-hosts="{",".join(map(str, g[:64]))}"'
            f'{opened}><summary><b>{esc(head)}</b></summary>'
            f'<div style="margin-left:1.2em">{"".join(body)}</div></details>'
        )
    if len(groups) > max_groups:
        rest = [p for g in groups[max_groups:] for p in g]
        parts.append(
            f'<div>... {len(groups) - max_groups} more groups ({esc(fmt_hosts(rest))})</div>'
        )
    return CSS + ''.join(parts)


def status_html(stacks: Mapping[int, HostStacks]) -> str:
    """How many hosts answered, and when the stacks were taken."""
    answered = sum(s.answered for s in stacks.values())
    times = [s.time for s in stacks.values() if s.time]
    when = f' at {time.strftime("%H:%M:%S", time.localtime(min(times)))}' if times else ''
    text = f'{answered}/{len(stacks)} host(s) answered{when}'
    missing = [p for p, s in stacks.items() if not s.answered]
    if missing:
        text += f'; no answer from {fmt_hosts(missing)}'
    odd = odd_processes(stacks)
    if odd:
        text += f'; in a different collective: {fmt_hosts(odd)}'
    return CSS + f'<span class="mh-where-state">{esc(text)}</span>'


class WhereView(View):
    """Where every host is: its current collective, step gate and Python stacks.

    Args:
        stacks: one `multihost.HostStacks` per host, as a mapping process ->
            stacks or an iterable of them.
        on_refresh: returns fresh stacks (same forms); enables the Refresh
            button, which can be pressed whenever the kernel is idle (e.g.
            after ``%%mh --timeout`` gave control back while hosts hang).

    Stable CSS classes: ``mh-where`` (the view), ``mh-where-status``,
    ``mh-where-message``, ``mh-where-table`` (rows ``mh-host-<p>``,
    ``mh-no-answer``, ``mh-odd-host``), ``mh-where-stacks`` (groups
    ``mh-stack-group``; ``mh-main-thread`` and ``mh-thread`` sections),
    ``mh-refresh-button``.
    """

    def __init__(self, stacks: StacksLike, *, on_refresh: Callable[[], StacksLike] | None = None):
        self._on_refresh = on_refresh
        self._refresh_button = add_classes(
            widgets.Button(
                description='Refresh',
                tooltip="take every host's stacks again",
                disabled=on_refresh is None,
            ),
            'mh-refresh-button',
            'mh-button',
        )
        self._refresh_button.on_click(lambda _b: self.refresh())
        self._status = add_classes(widgets.HTML(), 'mh-where-status')
        self._message = add_classes(widgets.HTML(), 'mh-where-message')
        self._table = add_classes(widgets.HTML(), 'mh-where-table')
        self._stacks_html = add_classes(widgets.HTML(), 'mh-where-stacks')
        top = widgets.HBox([self._refresh_button, self._status])
        self.widget = add_classes(
            widgets.VBox([top, self._message, self._table, self._stacks_html]), 'mh-where'
        )
        self.update(stacks)

    @property
    def stacks(self) -> dict[int, HostStacks]:
        """The stacks shown, by process."""
        return dict(self._stacks)

    def text(self) -> str:
        """Every host's own text (`HostStacks.format`)."""
        if not self._stacks:
            return 'no host stacks'
        return '\n\n'.join(s.format() for s in self._stacks.values())

    def update(self, stacks: StacksLike) -> None:
        """Shows other stacks."""
        self._stacks = _normalize(stacks)
        self._status.value = status_html(self._stacks)
        self._table.value = table_html(self._stacks)
        self._stacks_html.value = stacks_html(self._stacks)

    def refresh(self) -> None:
        """Calls ``on_refresh`` and shows what it returns."""
        if self._on_refresh is None:
            return
        ok, stacks = run_action(self._on_refresh, 'Refresh', self._error)
        if not ok:
            return
        try:
            self.update(stacks)
        except (TypeError, AttributeError, ValueError) as exc:
            self._error(f'Refresh: on_refresh returned something else than HostStacks: {exc}')
            return
        self._message.value = ''

    def _error(self, text: str) -> None:
        self._message.value = CSS + banner(esc(text), 'mh-error')
