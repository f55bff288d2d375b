"""Census views: what differs between the hosts' environments, and their memory.

`EnvView` draws a `multihost.EnvDiff` as a table (key, the majority value,
each odd host's value), keys that differ per host by design listed apart.
`MemoryView` draws a `multihost.MemoryCensus`: a host x device heatmap of
live bytes (matplotlib; ``memory_stats()`` figures where the backend reports
them), the hosts that stand out, and the kinds of arrays only some hosts
hold. Both are pure functions of their model, with a text/plain fallback.
"""

from __future__ import annotations

import io
import statistics
from typing import Any

import ipywidgets as widgets

from mhnotebook.widgets._common import (
    View,
    add_classes,
    banner,
    esc,
    expect_model,
    odd_host,
)
from multihost._models import EnvDiff, MemoryCensus
from multihost._text import fmt_hosts

#: Keys listed in the environment table; more are counted.
MAX_KEYS = 60
#: Hosts drawn as heatmap rows; more are summarised (the text lists them).
MAX_HEAT_ROWS = 64
_MAX_VALUE = 120


def _cut(value: str | None) -> str:
    if value is None:
        return '(unset)'
    return value if len(value) <= _MAX_VALUE else value[: _MAX_VALUE - 1] + '…'


def env_table_html(diff: EnvDiff, max_keys: int = MAX_KEYS) -> str:
    """The differing keys: key, majority value (on which hosts), odd hosts' values."""
    if diff.ok:
        return ''
    rows = []
    for e in diff.entries[:max_keys]:
        majority = [p for p in range(diff.num_processes) if p not in e.odd_processes]
        odd = '<br>'.join(
            odd_host(p, f'{esc(fmt_hosts([p]))}: <code>{esc(_cut(e.values[p]))}</code>')
            for p in e.odd_processes[:16]
        )
        if len(e.odd_processes) > 16:
            odd += f'<br>… {len(e.odd_processes) - 16} more'
        rows.append(
            f'<tr class="mh-env-row"><td><code>{esc(e.key)}</code></td>'
            f'<td><code>{esc(_cut(e.majority))}</code><br><small>{esc(fmt_hosts(majority))}'
            f'</small></td><td>{odd}</td></tr>'
        )
    more = (
        f'<tr><td colspan="3">… {len(diff.entries) - max_keys} more keys</td></tr>'
        if len(diff.entries) > max_keys
        else ''
    )
    return (
        '<table class="mh-env-table mh-table"><tr><th>key</th><th>most processes</th>'
        f'<th>odd processes</th></tr>{"".join(rows)}{more}</table>'
    )


class EnvView(View):
    """A `multihost.EnvDiff`: keys that differ between hosts, majority vs odd hosts.

    Stable CSS classes: ``mh-env`` (the view), ``mh-env-summary``,
    ``mh-env-table`` (rows ``mh-env-row``, odd values ``mh-odd-host``),
    ``mh-env-per-host`` (keys that differ by design).
    """

    def __init__(self, diff: EnvDiff):
        expect_model('EnvView', diff, EnvDiff, 'multihost.env_diff() on every process')
        self.diff = diff
        if diff.ok:
            head = banner(
                f'environments of {diff.num_processes} processes are identical '
                f'({diff.compared} keys compared)',
                'mh-ok',
            )
        else:
            head = banner(
                f'{len(diff.entries)} key(s) differ between {diff.num_processes} processes; odd: '
                f'{esc(fmt_hosts(diff.odd_processes))}',
                'mh-bad',
            )
        per_host = ''
        if diff.per_host:
            keys = ', '.join(f'<code>{esc(e.key)}</code>' for e in diff.per_host[:30])
            per_host = f'<div class="mh-env-per-host">differ per process by design: {keys}</div>'
        parts = [
            add_classes(widgets.HTML(head), 'mh-env-summary'),
            add_classes(widgets.HTML(env_table_html(diff)), 'mh-env-table-box'),
            add_classes(widgets.HTML(per_host), 'mh-env-per-host-box'),
        ]
        self.widget = add_classes(widgets.VBox(parts), 'mh-env')

    def text(self) -> str:
        return self.diff.format()


def mib_label(mib: float) -> str:
    """A heatmap cell's MiB, never a small value read as zero: ``'0'`` (nothing), ``'<0.01'``,
    ``'0.27'``, ``'3.5'``, ``'512'``."""
    if mib <= 0:
        return '0'
    if mib < 0.01:
        return '<0.01'
    if mib < 1:
        return f'{mib:.2f}'
    if mib < 10:
        return f'{mib:.1f}'
    return f'{mib:.0f}'


MAX_REST_GROUPS = 8  # rows for the hosts not drawn one by one, grouped by live bytes


def shown_hosts(census: MemoryCensus, max_rows: int = MAX_HEAT_ROWS) -> tuple[Any, ...]:
    """The hosts drawn one by one: all, in process order, up to ``max_rows``; beyond, those
    that stand out first (odd hosts, then the farthest from the median), ``max_rows // 2``."""
    if len(census.hosts) <= max_rows:
        return census.hosts
    odd, med = set(census.odd_processes), census.median_bytes
    ranked = sorted(
        census.hosts, key=lambda h: (h.process not in odd, -abs(h.live_bytes - med), h.process)
    )
    return tuple(ranked[: max_rows // 2])


def rest_groups(census: MemoryCensus, max_rows: int = MAX_HEAT_ROWS) -> list[tuple[str, str]]:
    """The hosts not shown one by one, grouped by live bytes (to 0.1 MiB): (hosts, summary)
    rows, largest groups first, at most `MAX_REST_GROUPS`, then one row counting the rest."""
    drawn = {h.process for h in shown_hosts(census, max_rows)}
    by: dict[str, list[Any]] = {}
    for h in census.hosts:
        if h.process not in drawn:
            by.setdefault(f'{h.live_bytes / (1 << 20):.1f} MiB', []).append(h)
    groups = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0].process))
    rows = [
        (fmt_hosts(h.process for h in hs), f'{len(hs)} processes, {mib}, {_counts(hs)} arrays')
        for mib, hs in groups[:MAX_REST_GROUPS]
    ]
    left = [h for _, hs in groups[MAX_REST_GROUPS:] for h in hs]
    if left:
        sizes = sorted(h.live_bytes for h in left)
        rows.append(
            (
                fmt_hosts(h.process for h in left),
                f'{len(left)} processes, {sizes[0] / (1 << 20):.1f} to '
                f'{sizes[-1] / (1 << 20):.1f} MiB (median '
                f'{statistics.median(sizes) / (1 << 20):.1f} MiB)',
            )
        )
    return rows


def _counts(hosts: list[Any]) -> str:
    counts = sorted(h.live_count for h in hosts)
    return str(counts[0]) if counts[0] == counts[-1] else f'{counts[0]}-{counts[-1]}'


def heatmap_cells(census: MemoryCensus, max_rows: int = MAX_HEAT_ROWS) -> list[list[float]]:
    """The heatmap's values (MiB), row per host drawn, column per local device (NaN: none)."""
    hosts = shown_hosts(census, max_rows)
    width = max((len(h.devices) for h in hosts), default=1)
    grid = [[float('nan')] * width for _ in hosts]
    for i, h in enumerate(hosts):
        for d in h.devices:
            value = d.in_use if census.stats_available and d.in_use is not None else d.live_bytes
            grid[i][d.local] = value / (1 << 20)
    return grid


def render_memory_png(census: MemoryCensus, max_rows: int = MAX_HEAT_ROWS) -> bytes:
    """Host x device heatmap (MiB): live-array bytes, or `memory_stats()` in use where reported."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np

    hosts = shown_hosts(census, max_rows)
    grid = np.array(heatmap_cells(census, max_rows), dtype=float).reshape(len(hosts), -1)
    width = grid.shape[1] if hosts else 1
    top = np.nanmax(grid) if np.isfinite(grid).any() else 0.0
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * width, 0.8 + 0.32 * len(hosts)), dpi=100)
    im = ax.imshow(grid, aspect='auto', cmap='viridis')
    ax.set_xticks(range(width), [f'dev {j}' for j in range(width)])
    ax.set_yticks(range(len(hosts)), [f'process {h.process}' for h in hosts])
    odd = set(census.odd_processes)
    for i, h in enumerate(hosts):
        if h.process in odd:
            ax.get_yticklabels()[i].set_color('#c0392b')
            ax.get_yticklabels()[i].set_fontweight('bold')
        for d in h.devices:
            v = grid[i, d.local]
            if np.isfinite(v) and len(hosts) <= 16 and width <= 8:
                # Dark text on viridis' bright (high) end, white on its dark end.
                color = '#222222' if top > 0 and v > 0.6 * top else 'w'
                ax.text(d.local, i, mib_label(v), ha='center', va='center', color=color, fontsize=8)
    what = 'in use (memory_stats)' if census.stats_available else 'live-array bytes'
    ax.set_title(f'MiB per device: {what}', fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.05, pad=0.04)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png')
    plt.close(fig)
    return buf.getvalue()


def memory_html(census: MemoryCensus) -> str:
    """The per-host table and the kinds of arrays only some hosts hold."""
    heavy = set(census.heavy_processes)
    rows = ''.join(
        f'<tr class="mh-mem-host{" mh-odd-host" if h.process in heavy else ""}">'
        f'<td>process {h.process}</td><td>{h.live_count}</td>'
        f'<td>{h.live_bytes / (1 << 20):.1f} MiB</td></tr>'
        for h in shown_hosts(census)
    ) + ''.join(
        f'<tr class="mh-mem-rest"><td>{esc(who)}</td><td colspan="2">{esc(what)}</td></tr>'
        for who, what in rest_groups(census)
    )
    table = (
        '<table class="mh-mem-table mh-table"><tr><th>process</th><th>live arrays</th>'
        f'<th>live bytes</th></tr>{rows}</table>'
    )
    leaks = ''
    if census.only_some:
        items = []
        for g in census.only_some[:12]:
            names = f' ({esc(", ".join(g.names[:3]))})' if g.names else ''
            per: dict[int, list[int]] = {}
            for p, c in enumerate(g.counts):
                if c:
                    per.setdefault(c, []).append(p)
            who = '; '.join(f'{fmt_hosts(ps)}: {c}' for c, ps in sorted(per.items())[:8])
            items.append(
                f'<li class="mh-mem-leak"><code>{esc(g.kind)}</code>{names}, '
                f'{g.host_bytes / (1 << 20):.1f} MiB each — {esc(who)}</li>'
            )
        leaks = (
            f'<div>only some processes hold:</div><ul class="mh-mem-leaks">{"".join(items)}</ul>'
        )
    stats = (
        _hbm_html(census)
        if census.stats_available
        else '<div class="mh-mem-nostats"><small>memory_stats(): not reported by this backend '
        '(CPU); the heatmap shows live-array bytes.</small></div>'
    )
    return table + leaks + stats


def _hbm_html(census: MemoryCensus) -> str:
    """Device memory (`MemoryCensus.hbm_lines`): a list, the warning near the limit in red
    (``mh-mem-hbm``, items ``mh-mem-hbm-line``, the warning ``mh-mem-near-limit``)."""
    items = []
    for line in census.hbm_lines():
        text = line.strip()
        cls = 'mh-mem-hbm-line'
        style = ''
        if text.startswith('WARNING'):
            cls += ' mh-mem-near-limit'
            style = ' style="color:#b00020;font-weight:bold"'
        items.append(f'<li class="{cls}"{style}>{esc(text)}</li>')
    if not items:
        return ''
    return f'<div>device memory:</div><ul class="mh-mem-hbm">{"".join(items)}</ul>'


class MemoryView(View):
    """A `multihost.MemoryCensus`: host x device heatmap, hosts that stand out, leak candidates.

    Stable CSS classes: ``mh-mem`` (the view), ``mh-mem-summary``, ``mh-mem-heatmap``
    (the PNG), ``mh-mem-table`` (rows ``mh-mem-host``, odd ones ``mh-odd-host``),
    ``mh-mem-leaks``, ``mh-mem-hbm`` (device memory where ``memory_stats()`` reports:
    headroom, largest free block, padding, outliers; ``mh-mem-near-limit`` the warning).
    """

    def __init__(self, census: MemoryCensus):
        expect_model(
            'MemoryView', census, MemoryCensus, 'multihost.memory_census() on every process'
        )
        self.census = census
        odd = census.odd_processes
        head = banner(
            (
                f'{esc(fmt_hosts(odd))} {"stands" if len(odd) == 1 else "stand"} out'
                if odd
                else f'no process stands out among {len(census.hosts)}'
            )
            + f' (median {census.median_bytes / (1 << 20):.1f} MiB of live arrays per process)',
            'mh-bad' if odd else 'mh-ok',
        )
        image = add_classes(
            widgets.Image(value=render_memory_png(census), format='png'), 'mh-mem-heatmap'
        )
        self.widget = add_classes(
            widgets.VBox(
                [
                    add_classes(widgets.HTML(head), 'mh-mem-summary'),
                    image,
                    widgets.HTML(memory_html(census)),
                ]
            ),
            'mh-mem',
        )

    def text(self) -> str:
        return self.census.format()
