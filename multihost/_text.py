"""Small text helpers shared by the models' messages and the notebook's views.

Durations come in two grains: `fmt_seconds` keeps the digits a skew needs
(``0.42 ms``, ``1.25 s``); `fmt_duration` rounds a wait or an age to a whole
unit (``850 ms``, ``12 s``, ``5 min``), so hosts described by it group alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MAX_RANGES = 8  # host lists are cut after this many ranges


def runs(values: Iterable[int], min_run: int = 2) -> list[str]:
    """``[0, 1, 2, 5]`` -> ``['0-2', '5']``: sorted distinct integers, runs of at least
    ``min_run`` joined (``min_run=3``: ``[5, 6]`` stays ``['5', '6']``)."""
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        if j - i + 1 >= max(min_run, 2):
            out.append(f'{vals[i]}-{vals[j]}')
        else:
            out.extend(str(v) for v in vals[i : j + 1])
        i = j + 1
    return out


def fmt_hosts(hosts: Iterable[int], max_ranges: int = MAX_RANGES) -> str:
    """``[0, 1, 2, 5]`` -> ``'processes 0-2, 5'``; ``[3]`` -> ``'process 3'`` (bounded)."""
    hosts = sorted(set(hosts))
    if not hosts:
        return 'no process'
    ranges = runs(hosts)
    text = ', '.join(ranges[:max_ranges])
    if len(ranges) > max_ranges:
        text += f', ... ({len(hosts)} in all)'
    return ('process ' if len(hosts) == 1 else 'processes ') + text


def fmt_list(values: Iterable[int | None], max_items: int = 16) -> str:
    """A list of ids as Python shows it up to ``max_items`` (``'[2, 5]'``); longer, as ranges,
    bounded: ``'[0-499, 600] (501 in all)'``, ``'[0, 2, 4, ...] (500 in all)'``."""
    vals = list(values)
    if len(vals) <= max_items:
        return str(vals)
    items = [str(v) for v in vals if v is None] + runs(v for v in vals if v is not None)
    text = ', '.join(items[:MAX_RANGES]) + (', ...' if len(items) > MAX_RANGES else '')
    return f'[{text}] ({len(vals)} in all)'


def fmt_seconds(seconds: float) -> str:
    """A duration to a few digits: ``0.42 ms``, ``4.2 ms``, ``180 ms``, ``1.25 s``, ``95 s``.

    For skews and lateness, where a fraction of a millisecond matters.
    """
    s = abs(seconds)
    if s < 1e-3:
        return f'{seconds * 1e3:.2f} ms'
    if s < 1e-2:
        return f'{seconds * 1e3:.1f} ms'
    if s < 1:
        return f'{seconds * 1e3:.0f} ms'
    if s < 10:
        return f'{seconds:.2f} s'
    return f'{seconds:.0f} s'


def fmt_duration(seconds: float) -> str:
    """A wait or an age in a whole unit: ``'850 ms'``, ``'12 s'``, ``'5 min'``, ``'3.2 h'``.

    Negative values (clocks of different hosts) read as ``'0 ms'``.
    """
    if seconds < 1:
        return f'{max(seconds, 0) * 1000:.0f} ms'
    if seconds < 120:
        return f'{seconds:.0f} s'
    if seconds < 3 * 3600:
        return f'{seconds / 60:.0f} min'
    return f'{seconds / 3600:.1f} h'


def short_site(site: str) -> str:
    """``/long/path/train.py:42`` -> ``train.py:42``: a call site by its file's name only."""
    return site.rsplit('/', 1)[-1]


def first_line(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters (``...`` when cut)."""
    line = str(text).split('\n', 1)[0]
    return line if len(line) <= limit else line[: limit - 3] + '...'


def failure_phrase(failure: dict[str, Any]) -> str:
    """``process 2 failed: ValueError('bad batch') at train.py:118`` (or ``process 2 exited
    with code 3 at ...``, ``process 2 ended early (exit code 0) at ...``, ``process 1 timed
    out after 10 s in barrier('ckpt') #2 waiting for process 2``) from a failure's fields
    (``by`` or ``early``, ``error``, ``message``, ``site``; ``missing``, ``after``, ``label``):
    what every host logs and `analyze` says when one host failed."""
    if failure.get('early') is not None:  # it ended (code 0) while others waited for it
        site = failure.get('site')
        at = f' at {short_site(str(site))}' if site else ''
        return f'process {failure["early"]} ended early (exit code 0){at}'
    if failure.get('missing'):  # a checked wait timed out: whom it waited for says more
        return (
            f'process {failure.get("by")} timed out after {float(failure.get("after") or 0):g} '
            f's in {failure.get("label") or "a checked wait"} waiting for '
            f'{fmt_hosts([int(p) for p in failure["missing"]])}'
        )
    error, message = failure.get('error', 'an error'), first_line(failure.get('message', ''))
    if error == 'SystemExit':
        what = f'exited with code {message}'
    elif error == 'KeyboardInterrupt':
        what = 'was interrupted (KeyboardInterrupt: Ctrl-C or SIGINT)'
    else:
        what = f'failed: {error}({message!r})'
    return f'process {failure.get("by")} {what} at {short_site(str(failure.get("site", "?")))}'


MAX_GROUP_LINES = 12  # an error message lists at most this many groups of hosts


def grouped_lines(
    by_host: Mapping[int, str],
    *,
    max_lines: int = MAX_GROUP_LINES,
    what: str = 'distinct calls',
    attr: str = 'calls',
) -> list[str]:
    """One line per distinct text, its hosts as ranges: ``'  processes 0-998: x'``.

    Groups keep the order of their first host; with more distinct texts than
    ``max_lines``, the largest groups are kept (still in host order) and one
    last line counts the rest: ``'  ... and 7 more distinct calls (see .calls)'``.
    """
    groups: dict[str, list[int]] = {}
    for p, text in sorted(by_host.items()):
        groups.setdefault(text, []).append(p)
    items = list(groups.items())
    if len(items) > max_lines:
        keep = sorted(items, key=lambda kv: (-len(kv[1]), kv[1][0]))[: max_lines - 1]
        rest = len(items) - len(keep)
        hosts = sum(len(ps) for _, ps in items) - sum(len(ps) for _, ps in keep)
        items = sorted(keep, key=lambda kv: kv[1][0])
        tail = [f'  ... and {rest} more {what} on {hosts} processes (see .{attr})']
    else:
        tail = []
    return [f'  {fmt_hosts(ps)}: {text}' for text, ps in items] + tail


#: How to give every host the same executable when its code sits at different paths
#: (``multihost run --check-jit`` and ``analyze`` both say it).
SOURCE_PATHS_FIX = (
    'Run the script from the same path on every host, or strip the differing '
    "directories from JAX's source paths before the first jit, e.g. "
    "jax.config.update('jax_hlo_source_file_canonicalization_regex', r'^.*/')"
)


def fmt_groups(
    by: Mapping[str, list[int]], limit: int = 4, max_ranges: int = 4, what: str = 'values'
) -> str:
    """``'f32[8] on processes 0, 2-3; f32[9] on process 1'``: each text and its hosts, at most
    ``limit`` texts (``'; 2 other values on processes 4-5'`` for the rest)."""
    items = list(by.items())
    text = '; '.join(f'{t} on {fmt_hosts(ps, max_ranges)}' for t, ps in items[:limit])
    if len(items) > limit:
        rest = [p for _, ps in items[limit:] for p in ps]
        text += f'; {len(items) - limit} other {what} on {fmt_hosts(rest, max_ranges)}'
    return text


def dirs_by_host(sites: Mapping[int, str], limit: int = 3) -> str:
    """``{0: '/a/train.py:9', 1: '/b/train.py:9'}`` -> ``'/a on process 0; /b on process
    1'``: each call site's directory and its hosts, at most ``limit`` directories."""
    by: dict[str, list[int]] = {}
    for p, site in sorted(sites.items()):
        by.setdefault(site.rsplit(':', 1)[0].rsplit('/', 1)[0], []).append(p)
    return fmt_groups(by, limit, what='directories')
