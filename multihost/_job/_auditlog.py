"""The audit's log of fresh inputs (``--audit-log DIR``) and ``multihost audit-diff A B``.

With ``--audit-log DIR`` each host writes ``DIR/audit-<process>.jsonl``: for every audited
launch, the fingerprints of the blocks it held of the launch's *fresh* inputs (its data:
batches, not state), one JSON line, appended and flushed by the audit's sharing thread (never
the main thread), at most `MAX_BYTES` per host. Format::

    {"format": "multihost-audit-log", "version": 1, "process": 1, "num_processes": 4,
     "started": 1796410000.5}
    {"f": "train_step", "c": 0, "l": {"batch['tokens']": [["[4:8, 0:8]", "x3f..."]], ...}}
    ...
    {"truncated": true}          # only when MAX_BYTES was reached

`diff` compares two runs' logs launch by launch (a function's name and its call number) and
names the first launch, process, argument and block where their data differ: a resume that did
not restore the data iterator, hosts that drifted into different epochs. Runs are aligned by
call number (``--shift K``: run B was resumed at run A's call K); audit every launch
(``--audit=1``) to find the very first step that differs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from multihost._text import fmt_hosts

FORMAT = 'multihost-audit-log'
VERSION = 1
#: Bytes per host's log at most (then one ``truncated`` line, and no more).
MAX_BYTES = 64 * 1024 * 1024
#: Arguments named in one line.
_MAX_NAMED = 3


class AuditLogError(ValueError):
    """A directory without audit logs, or a file that is not one (the message says which)."""


def file_name(process: int) -> str:
    return f'audit-{process}.jsonl'


class Writer:
    """One host's log, opened at the first line (``DIR`` must exist)."""

    def __init__(self, directory: str, process: int, num_processes: int) -> None:
        self.path = os.path.join(directory, file_name(process))
        self.process, self.num_processes = process, num_processes
        self.lock = threading.Lock()
        self.file: IO[str] | None = None
        self.size = 0
        self.full = False

    def append(self, name: str, call: int, paths: Sequence[str], table: Sequence[Any]) -> None:
        """One audited launch: the fresh inputs' ``[block, digest]`` pairs (`_audit._read`'s
        table)."""
        leaves = {}
        for path, (fresh, blocks) in zip(paths, table):
            if fresh and not path.startswith('result'):
                leaves[path] = [[key, digests[0]] for key, digests, _, _ in blocks if digests]
        line = json.dumps({'f': name, 'c': call, 'l': leaves}, separators=(',', ':')) + '\n'
        with self.lock:
            if self.full:
                return
            if self.file is None:
                self.file = open(self.path, 'w')  # noqa: SIM115  (kept open: appended to)
                head = {'format': FORMAT, 'version': VERSION, 'process': self.process,
                        'num_processes': self.num_processes, 'started': time.time()}  # fmt: skip
                self._write(json.dumps(head) + '\n')
            if self.size + len(line) > MAX_BYTES:
                self._write('{"truncated": true}\n')
                self.full = True
                return
            self._write(line)

    def _write(self, text: str) -> None:
        assert self.file is not None
        self.file.write(text)
        self.file.flush()
        self.size += len(text)


def read(directory: str) -> dict[int, list[dict[str, Any]]]:
    """Process -> its audited launches, in order, from ``directory``'s logs.

    Raises:
        AuditLogError: no log there, or a file that is not one (naming it).
    """
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith('audit-'))
    except OSError as exc:
        raise AuditLogError(f'{directory}: cannot read it ({exc.strerror})') from None
    out: dict[int, list[dict[str, Any]]] = {}
    for name in names:
        if not name.endswith('.jsonl'):
            continue
        path = os.path.join(directory, name)
        with open(path) as f:
            lines = f.read().splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except ValueError:
            head = {}
        if head.get('format') != FORMAT:
            raise AuditLogError(f'{path}: not a multihost audit log')
        entries = []
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                break  # a last line cut by a crash
            if 'f' in entry:
                entries.append(entry)
        out[int(head['process'])] = entries
    if not out:
        raise AuditLogError(
            f'{directory}: no audit log (audit-<process>.jsonl) there: run the job with '
            'multihost run --audit-log DIR'
        )
    return out


def _first_difference(
    a: list[dict[str, Any]], b: list[dict[str, Any]], shift: int = 0
) -> tuple[Any, ...] | None:
    """(position in a, launch name, call, the differing paths, one block) of the first
    launch both logged whose fresh inputs differ (b's call ``c`` against a's ``c + shift``);
    None when none does."""
    theirs = {(e['f'], e['c'] + shift): e['l'] for e in b}
    for i, entry in enumerate(a):
        other = theirs.get((entry['f'], entry['c']))
        if other is None:
            continue
        paths = []
        block = ''
        for path in sorted(set(entry['l']) | set(other)):
            mine, them = (
                dict(map(tuple, entry['l'].get(path, []))),
                dict(map(tuple, other.get(path, []))),
            )
            if mine != them:
                paths.append(path)
                if not block:
                    keys = sorted(k for k in set(mine) | set(them) if mine.get(k) != them.get(k))
                    block = keys[0] if keys else ''
        if paths:
            return i, entry['f'], entry['c'], paths, block
    return None


def diff(dir_a: str, dir_b: str, shift: int = 0) -> tuple[bool, list[str]]:
    """(whether the runs' data differ, the lines saying where first). ``shift``: run B
    began at run A's call ``shift`` (a resume): B's call ``c`` is A's ``c + shift``; the
    calls named are A's."""
    if shift < 0:
        raise AuditLogError(
            f"--shift must be 0 or more (run B began at run A's call K), got {shift}"
        )
    logs_a, logs_b = read(dir_a), read(dir_b)
    both = sorted(set(logs_a) & set(logs_b))
    firsts: dict[int, tuple[Any, ...]] = {}
    compared = 0
    for p in both:
        keys_b = {(e['f'], e['c'] + shift) for e in logs_b[p]}
        compared = max(compared, sum((e['f'], e['c']) in keys_b for e in logs_a[p]))
        hit = _first_difference(logs_a[p], logs_b[p], shift)
        if hit is not None:
            firsts[p] = hit
    lines = []
    only = sorted(set(logs_a) ^ set(logs_b))
    if not firsts:
        lines.append(
            f'the data of {fmt_hosts(both)} are the same in both runs '
            f'({compared} audited launches compared)'
        )
    else:
        first = min(firsts.values(), key=lambda h: (h[0], h[2]))
        at = f'{first[1]} call #{first[2]}'
        ps = sorted(p for p, h in firsts.items() if (h[1], h[2]) == (first[1], first[2]))
        named = ', '.join(first[3][:_MAX_NAMED]) + (' ...' if len(first[3]) > _MAX_NAMED else '')
        lines.append(
            f"the runs' data differ first at {at}: {fmt_hosts(ps)}, {named}"
            + (f' (block {first[4]})' if first[4] else '')
        )
        later = sorted(set(firsts) - set(ps))
        for p in later[:_MAX_NAMED]:
            h = firsts[p]
            lines.append(f'  process {p}: first at {h[1]} call #{h[2]}, {", ".join(h[3][:2])}')
        same = sorted(set(both) - set(firsts))
        if same:
            lines.append(f'  {fmt_hosts(same)}: the same in both runs')
    if only:
        lines.append(f'  {fmt_hosts(only)}: logged in one run only')
    return bool(firsts), lines


def report(dir_a: str, dir_b: str, prog: str = 'multihost audit-diff', shift: int = 0) -> int:
    """``multihost audit-diff A B``: prints `diff`'s lines; 0 same, 1 different, 2 unreadable."""
    import sys

    try:
        differ, lines = diff(dir_a, dir_b, shift)
    except AuditLogError as exc:
        print(f'{prog}: {exc}', file=sys.stderr)
        return 2
    print('\n'.join(lines))
    return 1 if differ else 0
