"""Small text helpers shared by the models' messages and the notebook's views."""

from __future__ import annotations

from collections.abc import Iterable

MAX_RANGES = 8  # host lists are cut after this many ranges


def fmt_hosts(hosts: Iterable[int], max_ranges: int = MAX_RANGES) -> str:
    """``[0, 1, 2, 5]`` -> ``'processes 0-2, 5'``; ``[3]`` -> ``'process 3'`` (bounded)."""
    hosts = sorted(set(hosts))
    if not hosts:
        return 'no process'
    ranges: list[str] = []
    i = 0
    while i < len(hosts):
        j = i
        while j + 1 < len(hosts) and hosts[j + 1] == hosts[j] + 1:
            j += 1
        ranges.append(str(hosts[i]) if i == j else f'{hosts[i]}-{hosts[j]}')
        i = j + 1
    text = ', '.join(ranges[:max_ranges])
    if len(ranges) > max_ranges:
        text += f', ... ({len(hosts)} in all)'
    return ('process ' if len(hosts) == 1 else 'processes ') + text
