"""`_jobview.moved_on`: the one wait after Step / Continue that every job view that steps shares.

Pure: the step tables are built by `StepTable.build` from records, as the hosts'
debug threads build them; ``read`` hands out the tables a job would show in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mhnotebook._jobview import moved_on
from multihost import StepTable
from multihost._exchange._sequence import CollectiveRecord
from multihost._models._steps import PausedLaunch

N = 2


def _table(
    seq: int | None = None, *, arrived: int = N, launches: tuple[int, ...] = ()
) -> StepTable:
    """Hosts ``0..arrived-1`` held at step ``seq``; each host in ``launches`` held before
    its launch number ``n`` (the tuple's items are ``n`` for hosts 0, 1, ...)."""
    records = [
        CollectiveRecord(
            seq=seq, kind='barrier', name='b', digest='', site='t.py:1', time=0.0, process=p
        )
        for p in range(arrived if seq is not None else 0)
    ]
    waiting = [(seq, p) for p in range(arrived)] if seq is not None else []
    paused = [
        PausedLaunch(process=p, n=n, name='step', site='t.py:9') for p, n in enumerate(launches)
    ]
    return StepTable.build(records, (), N, True, waiting=waiting, launches=paused)


def _reader(*tables: StepTable) -> tuple[Callable[[], StepTable], list[int]]:
    """``read`` handing out ``tables`` in turn (the last one again and again), and its calls."""
    calls = [0]

    def read() -> StepTable:
        calls[0] += 1
        return tables[min(calls[0], len(tables)) - 1]

    return read, calls


def test_every_host_at_a_later_gate_ends_the_wait() -> None:
    before = _table(4)
    later = _table(5)
    read, calls = _reader(_table(5, arrived=1), later)
    t0 = time.monotonic()
    assert moved_on(read, before, 30.0) is later
    assert calls[0] == 2 and time.monotonic() - t0 < 5.0


def test_hosts_past_the_launches_they_were_held_before_end_the_wait() -> None:
    # What only `AttachedJob.moved_on` saw before: a `Session` waited out its timeout.
    before = _table(launches=(1, 1))
    same = _table(launches=(1, 1))
    later = _table(launches=(2, 2))
    read, calls = _reader(same, later)
    t0 = time.monotonic()
    assert moved_on(read, before, 30.0) is later
    assert calls[0] == 2 and time.monotonic() - t0 < 5.0


def test_idle_hosts_end_the_wait_and_otherwise_the_timeout_does() -> None:
    before = _table(4)
    read, _ = _reader(before)
    t0 = time.monotonic()
    assert moved_on(read, before, 30.0, idle=lambda: True) is before
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    assert moved_on(read, before, 0.5, idle=lambda: False) is before
    assert 0.5 <= time.monotonic() - t0 < 5.0
