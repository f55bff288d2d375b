"""The "where is every host" view: what each host is doing now, in words, grouped.

Built from `multihost.HostStacks` (one per host, taken by each engine's debug
thread, so it answers while the main thread is stuck). Hosts in the same
state (`HostStacks.state`: the same check waited at, the same step gate, or
the same innermost user frame) share one row that says in words what they
are doing (`HostStacks.doing`): a thousand hosts in ten states are ten rows.
Below the table, each group's stack, collapsed: the user's frames first (the
innermost highlighted), the framework frames (ipyparallel, ipykernel,
asyncio, jax, multihost...) folded into one line that opens the full stack,
then the other threads. An optional verdict line (e.g. the wavefront's)
comes first.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from mhnotebook.widgets._common import (
    CSS,
    RefreshableView,
    add_classes,
    banner,
    esc,
    pre,
    run_action,
)
from mhnotebook.widgets.layout.chips import chip_grid_html
from multihost._cells import is_cell
from multihost._models import HostStacks, ThreadStack
from multihost._models._chipgrid import ChipGrid
from multihost._models._stacks import Frame, framework_summary
from multihost._text import fmt_duration, fmt_hosts

#: State groups listed in the table; more groups are counted.
MAX_ROWS = 64
#: Stack groups shown; more groups are counted.
MAX_GROUPS = 32
#: User frames listed per thread (innermost ones); the full stack has them all.
MAX_USER_FRAMES = 12
#: Host ranges named in a group's label.
_RANGES = 4

StacksLike = Mapping[int, HostStacks] | Iterable[HostStacks]
VerdictLike = str | Callable[[], str | None] | None

_WHERE_CSS = """<style>
.mh-where-grid td.mh-where-hosts {white-space:nowrap}
.mh-where-grid td.mh-where-doing {font-weight:bold}
.mh-where-frame {font-family:var(--jp-code-font-family,monospace);font-size:12px;
  padding:0 4px;white-space:pre-wrap}
.mh-where-frame.mh-where-innermost {background:#fff3c4;border-left:3px solid #d4a000}
.mh-where-frame code {color:#444}
details.mh-stack-group {margin:1px 0}
details.mh-stack-group summary {font-size:13px}
details.mh-stack-group > summary,details.mh-where-fold > summary,
details.mh-where-threads > summary {cursor:pointer}
details.mh-where-fold > summary {color:#666;font-size:12px}
.mh-where-verdict {font-weight:bold}
.mh-where-machines {color:#666;font-size:12px}
</style>"""


def _normalize(stacks: StacksLike) -> dict[int, HostStacks]:
    if isinstance(stacks, HostStacks):
        stacks = [stacks]
    items = stacks.items() if isinstance(stacks, Mapping) else ((s.process, s) for s in stacks)
    out = {}
    for p, s in items:
        if not isinstance(s, HostStacks):
            raise TypeError(
                'WhereView expects multihost.HostStacks (one per process, e.g. from '
                f'multihost.where), got {type(s).__module__}.'
                f'{type(s).__qualname__}'
            )
        out[int(p)] = s
    return dict(sorted(out.items()))


def _current_key(s: HostStacks) -> Any:
    c = s.current
    return None if c is None else (c.seq, c.kind, c.name)


def odd_processes(stacks: Mapping[int, HostStacks]) -> tuple[int, ...]:
    """Hosts whose last collective (step, kind, name) differs from the most common one."""
    keys = {p: _current_key(s) for p, s in stacks.items()}
    if len(set(keys.values())) <= 1:
        return ()
    counts = collections.Counter(keys.values())
    best = max(counts.values())
    common = next(k for k in keys.values() if counts[k] == best)  # ties: the lowest host's
    return tuple(p for p, k in keys.items() if k != common)


def state_groups(stacks: Mapping[int, HostStacks]) -> list[tuple[int, ...]]:
    """Hosts in the same state (`HostStacks.state`), smallest group first.

    The odd ones out come first: with hundreds of hosts, the one stuck
    elsewhere is a group of one at the top.
    """
    groups: dict[Any, list[int]] = {}
    for p, s in stacks.items():
        groups.setdefault(s.state, []).append(p)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: (len(g), g[0]))


def who(group: Sequence[int]) -> str:
    """``'processes 0-2, 5 (4 hosts)'``, ``'process 3'`` (a cut list says how many in all)."""
    text = fmt_hosts(group, _RANGES)
    if len(group) > 1 and 'in all)' not in text:
        text += f' ({len(group)} processes)'
    return text


def _span(values: Sequence[float]) -> str:
    lo, hi = fmt_duration(min(values)), fmt_duration(max(values))
    return hi if lo == hi else f'{lo} to {hi}'


def group_doing(stacks: Mapping[int, HostStacks], group: Sequence[int]) -> str:
    """What a state group is doing, in words; durations as their range over the group."""
    members = [stacks[p] for p in group]
    return members[0].describe_doing(
        _span([s.waiting_for for s in members]), _span([s.idle for s in members])
    )


def _frame_line(s: HostStacks, frame: Frame) -> str:
    source = frame[3].strip()
    return s.frame_label(frame) + (f': {source}' if source else '')


def _innermost(s: HostStacks) -> str:
    frames = s.user_frames()
    return _frame_line(s, frames[-1]) if frames else (s.where or '')


def cells_note(stacks: Mapping[int, HostStacks], group: Sequence[int]) -> str:
    """``''``, or which host's cell numbers a group's frames show when its hosts numbered the
    cell they are in differently (each engine counts its own cells): ``" (process 0's cell;
    Cell In[5] on process 2)"``."""
    names: dict[str | None, list[int]] = {}
    for p in group:
        s = stacks[p]
        cells = [f for f in s.user_frames() if is_cell(f[0])]
        names.setdefault(s.cell_name(cells[-1][0]) if cells else None, []).append(p)
    if len(names) <= 1:
        return ''
    shown = next(iter(names))
    others = ', '.join(
        f'{n or "no cell"} on {fmt_hosts(ps)}' for n, ps in names.items() if n != shown
    )
    return f" (process {group[0]}'s cell; {others})"


def _natural(name: str) -> list[Any]:
    """Sort key: ``node2`` before ``node10``."""
    return [int(x) if x.isdigit() else x for x in re.split(r'(\d+)', name)]


def _machines(stacks: Mapping[int, HostStacks], group: Sequence[int]) -> str:
    names = [f'{stacks[p].hostname} (pid {stacks[p].os_pid})' for p in group if stacks[p].hostname]
    if not names:
        return ''
    if len(names) == 1:
        return names[0]
    machines = sorted({stacks[p].hostname for p in group if stacks[p].hostname}, key=_natural)
    if len(machines) == 1:
        pids = [str(stacks[p].os_pid) for p in group]
        what = f'pids {", ".join(pids)}' if len(pids) <= 4 else f'{len(pids)} processes'
        return f'{machines[0]} ({what})'
    shown = ', '.join(machines[:4]) + (', ...' if len(machines) > 4 else '')
    return f'{len(machines)} machine{"s" if len(machines) > 1 else ""}: {shown}'


# -- HTML -----------------------------------------------------------------------------


def verdict_html(verdict: str | None) -> str:
    """The one-line verdict (class ``mh-where-verdict``), or nothing."""
    if not verdict:
        return ''
    return CSS + _WHERE_CSS + banner(esc(verdict), 'mh-info', 'mh-where-verdict')


def table_html(
    stacks: Mapping[int, HostStacks],
    max_rows: int = MAX_ROWS,
    groups: list[tuple[int, ...]] | None = None,
) -> str:
    """One row per state group: its hosts, what they are doing now, the innermost user
    frame and the last collective entered."""
    groups = state_groups(stacks) if groups is None else groups
    odd = set(odd_processes(stacks))
    rows = []
    for g in groups[:max_rows]:
        s = stacks[g[0]]
        cls = (
            ['mh-where-row']
            + [f'mh-host-{p}' for p in g]
            + (['mh-no-answer'] if not s.answered else [])
            + (['mh-odd-host'] if odd & set(g) else [])
        )
        cur_cls = ' class="mh-odd-host"' if odd & set(g) else ''
        current = '' if s.current is None else s.current.describe()
        machines = _machines(stacks, g)
        title = f' title="{esc(machines)}"' if machines else ''
        rows.append(
            f'<tr class="{" ".join(cls)}" data-host="{g[0]}" data-hosts="{",".join(map(str, g))}">'
            f'<td class="mh-where-hosts"{title}>{esc(who(g))}</td>'
            f'<td class="mh-where-doing">{esc(group_doing(stacks, g))}</td>'
            f'<td class="mh-where-at">{esc(_innermost(s) + cells_note(stacks, g))}</td>'
            f'<td{cur_cls}>{esc(current)}</td></tr>'
        )
    more = ''
    if len(groups) > max_rows:
        rest = [p for g in groups[max_rows:] for p in g]
        more = f'<div>... {len(groups) - max_rows} more states ({esc(fmt_hosts(rest))})</div>'
    return (
        f'{CSS}{_WHERE_CSS}<div class="mh-scroll"><table class="mh-table mh-where-grid"><tr>'
        '<th>processes</th><th>doing now</th><th>innermost user frame</th>'
        f'<th>last collective entered</th></tr>{"".join(rows)}</table></div>{more}'
    )


def _frames_html(s: HostStacks, t: ThreadStack) -> str:
    """A thread's user frames (innermost highlighted), then its framework frames folded
    into one line that opens the full stack."""
    user = s.user_frames(t)
    parts = []
    if len(user) > MAX_USER_FRAMES:
        parts.append(
            f'<div class="mh-where-frame">... {len(user) - MAX_USER_FRAMES} outer user '
            'frames (in the full stack)</div>'
        )
    shown = user[-MAX_USER_FRAMES:]
    for i, f in enumerate(shown):
        cls = 'mh-where-frame' + (' mh-where-innermost' if i == len(shown) - 1 else '')
        source = f[3].strip()
        code = f': <code>{esc(source)}</code>' if source else ''
        parts.append(f'<div class="{cls}" title="{esc(f[0])}">{esc(s.frame_label(f))}{code}</div>')
    if not user:
        parts.append('<div class="mh-where-frame">no user frames</div>')
    parts.append(
        f'<details class="mh-where-fold"><summary>... {esc(framework_summary(t.frames))}: '
        f'full stack</summary>{pre(s.thread_text(t), "mh-stack-text")}</details>'
    )
    return ''.join(parts)


def _group_html(stacks: Mapping[int, HostStacks], g: tuple[int, ...], odd: set[int]) -> str:
    s = stacks[g[0]]
    cls = (
        'mh-stack-group '
        + ' '.join(f'mh-host-{p}' for p in g)
        + (' mh-odd-host' if odd & set(g) else '')
    )
    main = s.main_thread
    body = []
    if not s.answered:
        head = f'{who(g)}: no answer'
        body.append(banner(esc(f'no answer: {s.error}'), 'mh-error'))
    else:
        inner = _innermost(s)
        head = f'{who(g)}: ' + (f'stack at {inner}' if inner else 'stack') + cells_note(stacks, g)
        machines = _machines(stacks, g)
        if machines:
            body.append(f'<div class="mh-where-machines">{esc(machines)}</div>')
        if main is not None:
            body.append(
                f'<details class="mh-stack mh-main-thread" open><summary>main thread '
                f'({esc(main.name)})</summary>{_frames_html(s, main)}</details>'
            )
        others = [t for t in s.threads if not t.main]
        if others:
            names = ', '.join(t.name for t in others[:4]) + (', ...' if len(others) > 4 else '')
            inner_threads = ''.join(
                f'<details class="mh-stack mh-thread"><summary>thread {esc(t.name)}'
                f'{" (daemon)" if t.daemon else ""}</summary>{_frames_html(s, t)}</details>'
                for t in others
            )
            body.append(
                f'<details class="mh-where-threads"><summary>{len(others)} other '
                f'thread{"s" if len(others) > 1 else ""} ({esc(names)})</summary>'
                f'<div style="margin-left:1.2em">{inner_threads}</div></details>'
            )
    return (
        f'<details class="{cls}" data-hosts="{",".join(map(str, g))}"><summary>{esc(head)}'
        f'</summary><div style="margin-left:1.2em">{"".join(body)}</div></details>'
    )


def stacks_html(
    stacks: Mapping[int, HostStacks],
    max_groups: int = MAX_GROUPS,
    groups: list[tuple[int, ...]] | None = None,
) -> str:
    """Each state group's stack, collapsed: user frames first, framework frames folded."""
    groups = state_groups(stacks) if groups is None else groups
    odd = set(odd_processes(stacks))
    parts = [_group_html(stacks, g, odd) for g in groups[:max_groups]]
    if len(groups) > max_groups:
        rest = [p for g in groups[max_groups:] for p in g]
        parts.append(
            f'<div>... {len(groups) - max_groups} more groups ({esc(fmt_hosts(rest))})</div>'
        )
    return CSS + _WHERE_CSS + ''.join(parts)


def status_text(
    stacks: Mapping[int, HostStacks],
    groups: Sequence[Any] | None = None,
    dumps: int | None = None,
) -> str:
    """How many hosts answered, when, in how many states; who is silent or elsewhere.

    ``dumps``: the job's size when the stacks were read from dump files (one per host
    that wrote one): then it says how many of the job's hosts left a dump, and which not.
    """
    times = [s.time for s in stacks.values() if s.time]
    when = f' at {time.strftime("%H:%M:%S", time.localtime(min(times)))}' if times else ''
    if dumps is None:
        answered = sum(s.answered for s in stacks.values())
        text = f'{answered}/{len(stacks)} processes answered{when}'
    else:
        text = f'{len(stacks)} of {dumps} process{"" if dumps == 1 else "es"} left a dump{when}'
    n = len(state_groups(stacks) if groups is None else groups)
    text += f'; {n} state{"" if n == 1 else "s"}'
    if dumps is not None:
        missing = [p for p in range(dumps) if p not in stacks]
        if missing:
            text += f'; no dump from {fmt_hosts(missing, _RANGES)}'
    missing = [p for p, s in stacks.items() if not s.answered]
    if missing:
        text += f'; no answer from {fmt_hosts(missing, _RANGES)}'
    odd = odd_processes(stacks)
    if odd:
        text += f'; last in a different collective: {fmt_hosts(odd, _RANGES)}'
    return text


def status_html(
    stacks: Mapping[int, HostStacks], groups: Sequence[Any] | None = None, dumps: int | None = None
) -> str:
    return CSS + f'<span class="mh-where-state">{esc(status_text(stacks, groups, dumps))}</span>'


# -- text ----------------------------------------------------------------------------------


def _frames_text(s: HostStacks, t: ThreadStack, indent: str) -> list[str]:
    user = s.user_frames(t)
    lines = []
    if len(user) > MAX_USER_FRAMES:
        lines.append(f'{indent}  ... {len(user) - MAX_USER_FRAMES} outer user frames')
    shown = user[-MAX_USER_FRAMES:]
    for i, f in enumerate(shown):
        mark = '> ' if i == len(shown) - 1 else '  '
        lines.append(f'{indent}{mark}{_frame_line(s, f)}')
    if not user:
        lines.append(f'{indent}  no user frames')
    if len(user) < len(t.frames):
        lines.append(f'{indent}  ... {framework_summary(t.frames)}')
    return lines


def where_text(
    stacks: Mapping[int, HostStacks],
    verdict: str | None = None,
    max_groups: int = MAX_GROUPS,
    dumps: int | None = None,
) -> str:
    """The view as plain text: verdict, status, then per state group what it is doing and its
    main thread's user frames (framework frames as one line); ``dumps``: `status_text`."""
    if not stacks:
        return (verdict + '\n' if verdict else '') + 'no stacks'
    groups = state_groups(stacks)
    lines = [verdict] if verdict else []
    lines.append(status_text(stacks, groups, dumps))
    for g in groups[:max_groups]:
        s = stacks[g[0]]
        lines.append(f'{who(g)}: {group_doing(stacks, g)}{cells_note(stacks, g)}')
        main = s.main_thread
        if main is not None:
            lines += _frames_text(s, main, '    ')
        others = [t.name for t in s.threads if not t.main]
        if others:
            lines.append(f'      {len(others)} other thread(s): {", ".join(others[:8])}')
        if s.current is not None and s.answered:
            lines.append(f'      last collective entered: {s.current.describe()}')
    if len(groups) > max_groups:
        rest = [p for g in groups[max_groups:] for p in g]
        lines.append(f'... {len(groups) - max_groups} more states ({fmt_hosts(rest)})')
    return '\n'.join(lines)


class WhereView(RefreshableView):
    """What every host is doing now, grouped by state, with its stack a click away.

    Args:
        stacks: one `multihost.HostStacks` per host, as a mapping process ->
            stacks or an iterable of them.
        on_refresh: returns fresh stacks (same forms); enables the Refresh
            button, which can be pressed whenever the kernel is idle (e.g.
            after ``%%mh --timeout`` gave control back while hosts hang).
        verdict: a one-line verdict shown first (e.g. ``Wavefront.verdict``),
            or a callable returning it (or a `multihost.Wavefront`: its verdict, and the
            pod under the collective it names, `Wavefront.stuck_grid`, on chips with
            coordinates), called again at every refresh. A string describes these
            stacks only: a refresh drops it.
        dumps: the job's size when the stacks come from the hosts' dump files
            (`mhnotebook.postmortem`): the status says how many of its hosts
            left a dump and which did not, not how many answered.

    Stable CSS classes: ``mh-where`` (the view), ``mh-where-verdict`` (the
    verdict line, in the ``mh-where-verdict-box`` widget), ``mh-where-status``,
    ``mh-where-message``, ``mh-where-table`` (table ``mh-where-grid``, one row
    ``mh-where-row`` per state group, classed ``mh-host-<p>`` for each of its
    hosts, ``mh-no-answer``, ``mh-odd-host``; ``data-hosts`` lists them,
    ``data-host`` is the first; cells ``mh-where-hosts``, ``mh-where-doing``,
    ``mh-where-at``), ``mh-where-stacks`` (groups ``mh-stack-group``, collapsed;
    ``mh-main-thread`` with frames ``mh-where-frame``, the innermost
    ``mh-where-innermost``, and the folded line ``mh-where-fold``;
    ``mh-where-threads`` holding ``mh-thread`` sections), ``mh-refresh-button``,
    ``mh-where-chips`` (the pod under the stuck collective: `chip_grid_html`).
    """

    def __init__(
        self,
        stacks: StacksLike,
        *,
        on_refresh: Callable[[], StacksLike] | None = None,
        verdict: VerdictLike = None,
        dumps: int | None = None,
    ):
        self._on_refresh = on_refresh
        self._dumps = dumps
        self._verdict_source = verdict
        self._verdict: str | None = None
        self._grid: ChipGrid | None = None
        self._refresh = self._refresh_button("take every process's stacks again")
        self._verdict_box = add_classes(widgets.HTML(), 'mh-where-verdict-box')
        self._status = add_classes(widgets.HTML(), 'mh-where-status')
        self._message = add_classes(widgets.HTML(), 'mh-where-message')
        self._table = add_classes(widgets.HTML(), 'mh-where-table')
        self._stacks_html = add_classes(widgets.HTML(), 'mh-where-stacks')
        self._chips = add_classes(widgets.HTML(), 'mh-where-chips')
        top = widgets.HBox([self._refresh, widgets.VBox([self._verdict_box, self._status])])
        self.widget = add_classes(
            widgets.VBox([top, self._message, self._table, self._stacks_html, self._chips]),
            'mh-where',
        )
        verdict_now = self._call_verdict()
        self.update(stacks, verdict=verdict_now, grid=self._grid)

    @property
    def stacks(self) -> dict[int, HostStacks]:
        """The stacks shown, by process."""
        return dict(self._stacks)

    @property
    def verdict(self) -> str | None:
        """The verdict line shown, if any."""
        return self._verdict

    @property
    def grid(self) -> ChipGrid | None:
        """The pod under the collective the verdict names (chips with coordinates), if any."""
        return self._grid

    def text(self) -> str:
        """The verdict, status, and per state group its words and user frames (and the pod
        under the stuck collective, when there is one)."""
        text = where_text(self._stacks, self._verdict, dumps=self._dumps)
        return text + ('\n' + self._grid.text() if self._grid is not None else '')

    def _call_verdict(self) -> str | None:
        source = self._verdict_source
        self._grid = None
        if source is None or isinstance(source, str):
            return source
        ok, got = run_action(source, 'Verdict', self._error)
        if not ok or not got:
            return None
        if hasattr(got, 'verdict'):  # a Wavefront: its line, and the pod under its collective
            grid = getattr(got, 'stuck_grid', None)
            self._grid = grid() if grid is not None else None
            return str(got.verdict) or None
        return str(got)

    def update(
        self, stacks: StacksLike, *, verdict: str | None = None, grid: ChipGrid | None = None
    ) -> None:
        """Shows other stacks (and ``verdict``, or none; ``grid``: the pod under the
        collective it names, or none)."""
        self._stacks = _normalize(stacks)
        self._grid = grid
        self._verdict = verdict or None
        groups = state_groups(self._stacks)
        self._verdict_box.value = verdict_html(self._verdict)
        self._verdict_box.layout.display = None if self._verdict else 'none'
        self._status.value = status_html(self._stacks, groups, self._dumps)
        self._table.value = table_html(self._stacks, groups=groups)
        self._stacks_html.value = stacks_html(self._stacks, groups=groups)
        self._chips.value = chip_grid_html(self._grid)
        self._chips.layout.display = None if self._grid is not None else 'none'

    def _refreshed(self, stacks: Any) -> None:
        # the stacks, and a verdict callable's answer (a string verdict described the
        # stacks before this refresh: dropped)
        verdict = None if isinstance(self._verdict_source, str) else self._call_verdict()
        if isinstance(self._verdict_source, str):
            self._verdict_source = None
        self.update(stacks, verdict=verdict, grid=self._grid)
