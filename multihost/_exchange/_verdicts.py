"""What a failed round says: the exception every host raises, built from the shared verdict.

A round of the collective sequence (`_sequence`) that fails ends in one verdict for all hosts
(`_kv.Verdict`: a timeout, an interrupt, a host that could not take part, a mismatch); these
build the same error from it on every host, bounded at any host count: the missing hosts'
positions grouped (`missing_lines`), at most `MAX_POSITIONS` of them carried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multihost._errors import (
    BarrierMismatchError,
    BarrierTimeoutError,
    CollectiveInterruptedError,
    CollectiveMismatchError,
    CoordinatorUnreachableError,
    HostFailedError,
)
from multihost._exchange import _kv
from multihost._models._records import CollectiveRecord
from multihost._text import fmt_hosts, grouped_lines

#: A timeout verdict carries where this many missing hosts were, at most.
MAX_POSITIONS = 1024
#: A timeout's message says what at most this many missing hosts were doing (their stamps).
MAX_DOING = 8


def unreachable_error(
    exc: CoordinatorUnreachableError, rec: CollectiveRecord
) -> CoordinatorUnreachableError:
    """The one-line error, with the last positions this host knows (its own, at least)."""
    known = {rec.process: rec}
    return CoordinatorUnreachableError(
        f'{exc} This host (process {rec.process}) was at {rec.describe()}.',
        during=exc.during,
        positions=known,
    )


def records_json(calls: dict[int, CollectiveRecord]) -> dict[int, str]:
    return {p: c.to_json() for p, c in sorted(calls.items())}


def records_of(raw: dict[str, str]) -> dict[int, CollectiveRecord]:
    return {int(p): CollectiveRecord.from_json(v) for p, v in sorted(raw.items(), key=_by_int)}


def _by_int(item: tuple[str, Any]) -> int:
    return int(item[0])


def error_of(verdict: _kv.Verdict, rec: CollectiveRecord, mismatch_prefix: str | None) -> Exception:
    """The exception every host raises for a failed round (built from the shared verdict)."""
    data = verdict.data
    if verdict.kind == 'timeout':
        return timeout_error(data, rec)
    if verdict.kind == 'interrupted':
        by = int(data['by'])
        return CollectiveInterruptedError(
            f'{rec.describe()} was interrupted on process {by} (SIGINT / Ctrl-C / the '
            "notebook's stop button), so every host left it. Run the next step on every host.",
            seq=rec.seq,
            by=by,
        )
    calls = records_of(data['records'])
    if verdict.kind == 'failed':
        reasons = {int(p): r for p, r in data['reasons'].items()}
        what = next(iter(calls.values())).kind if calls else rec.kind
        lines = grouped_lines(reasons, what='distinct reasons', attr='reasons')
        return HostFailedError(
            f'{what} [{seq_label(rec)}] could not run on {fmt_hosts(reasons)}:\n'
            + '\n'.join(lines)
            + '\nEvery host left this collective; the next one lines up as usual.',
            seq=rec.seq,
            reasons=reasons,
        )
    return mismatch_error(rec, calls, mismatch_prefix)


def seq_label(rec: CollectiveRecord) -> str:
    """``#57``, or off the main thread ``#3 of thread 'saver'`` (a count in its own lane)."""
    return f'#{rec.seq} of thread {rec.thread!r}' if rec.lane else f'#{rec.seq}'


def missing_lines(data: Mapping[str, Any], rec: CollectiveRecord) -> list[str]:
    """Where the missing hosts of a timeout were, hosts in the same place grouped
    (``  processes 2-9: last reached ...``), at most `MAX_GROUP_LINES` lines."""
    where = {int(p): CollectiveRecord.from_json(v) for p, v in data.get('positions', {}).items()}
    doing = {int(p): str(v) for p, v in (data.get('doing') or {}).items()}
    state: dict[int, str] = {}
    for p in (int(p) for p in data['missing']):
        last = where.get(p)
        if last is None and len(where) >= MAX_POSITIONS:
            state[p] = f'position not carried (only {MAX_POSITIONS} missing processes are)'
        elif last is None:
            state[p] = 'last reached no collective yet'
        elif data.get('stage') and last.seq == rec.seq:  # e.g. still compiling a new signature
            state[p] = f'still inside {last.describe()}, busy before this stage'
        else:
            state[p] = f'last reached {last.describe()}'
        if p in doing:  # its liveness stamp, a few seconds old at most
            state[p] += f'; when missed{doing[p]}'
    return grouped_lines(state, what='distinct positions', attr='positions')


def timeout_error(data: Mapping[str, Any], rec: CollectiveRecord) -> BarrierTimeoutError:
    missing = [int(p) for p in data['missing']]
    where = {int(p): CollectiveRecord.from_json(v) for p, v in data.get('positions', {}).items()}
    lines = missing_lines(data, rec)
    late = rec.process not in data['arrived']
    timeout = float(data['timeout'])
    return BarrierTimeoutError(
        f'timed out after {timeout:g} s in {data.get("what", rec.describe())}: '
        f'{fmt_hosts(missing)} did not arrive (seen by process {data["by"]}).\n'
        + '\n'.join(lines)
        + (
            f'\nThis host (process {rec.process}) arrived after the others had given up.'
            if late
            else ''
        )
        + '\nA host that skips or reorders a collective, or is stuck in other work, leaves '
        'the others waiting; look at its stack (multihost.where) or raise the timeout '
        '(timeout=..., or MULTIHOST_TIMEOUT).',
        name=str(data.get('name', rec.name)),
        timeout=timeout,
        missing=missing,
        positions=where,
        label=_label(rec),
    )


def _label(rec: CollectiveRecord) -> str:
    """``barrier('ckpt') #2``: the wait in words, as a flight record's label says it."""
    what = f'{rec.kind}({rec.name!r})' if rec.name else rec.kind
    return what if rec.lane.startswith('n:') else f'{what} #{rec.seq}'


def mismatch_error(
    rec: CollectiveRecord, calls: dict[int, CollectiveRecord], mismatch_prefix: str | None
) -> CollectiveMismatchError:
    lines = grouped_lines({p: c.describe() for p, c in calls.items()})
    if all(c.kind == 'barrier' for c in calls.values()):
        names = {p: c.name for p, c in calls.items()}
        head = mismatch_prefix or f'barrier name mismatch ({rec.name!r})'
        return BarrierMismatchError(
            f'{head}: processes passed different barrier names at collective '
            f'{seq_label(rec)}:\n' + '\n'.join(lines),
            seq=rec.seq,
            calls=calls,
            names=names,
        )
    kinds = {c.kind for c in calls.values()}
    if len(kinds) > 1 or len({c.name for c in calls.values()}) > 1:
        why = 'processes called different collectives'
    else:
        why = f'processes called {rec.kind} on data of different structure, shapes or dtypes'
    head = f'collective sequence mismatch at {seq_label(rec)}: {why}'
    if mismatch_prefix and rec.kind == 'barrier':
        head = f'{mismatch_prefix}: {head}'
    return CollectiveMismatchError(
        head
        + ':\n'
        + '\n'.join(lines)
        + ('\nEvery host must call the same collectives, in the same order, with the same shapes.'),
        seq=rec.seq,
        calls=calls,
    )
