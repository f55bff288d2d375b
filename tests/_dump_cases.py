"""Synthetic dumps (`_dumpfile` format) of a large job, for the analyze test and bench/analyze.py.

`job_dumps(n)`: ``n`` processes; every host waits in ``barrier('ckpt') #412``
(half dumped at their timeout, the rest when asked) except processes 500-501,
still in user code after ``barrier('data') #411``; process 7 wrote no dump and
the others say it is gone. Each dump carries `RECORDS` flight records.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from multihost._debug._wavefront import HostFront
from multihost._models import _dumpfile
from multihost._models._stacks import HostStacks, ThreadStack
from multihost._recorder import FlightRecord

RECORDS = 50
BEHIND = (500, 501)
MISSING = 7
T0 = 1_764_600_000.0


def _rec(p: int, i: int, name: str, state: str = 'passed') -> FlightRecord:
    return FlightRecord(
        n=i, kind='barrier', name=name, call=-1, seq=i, digest='ab' * 8, fingerprint='',
        site='/job/train.py:40', time=T0 + i, wait=0.01, state=state, process=p,
    )  # fmt: skip


def doc(p: int, n: int) -> dict[str, Any]:
    """The dump of process ``p`` in a job of ``n``."""
    behind = p in BEHIND
    last_seq = 411 if behind else 412
    records = [_rec(p, i, 'data') for i in range(last_seq - RECORDS + 1, last_seq)]
    waiting = None if behind else _rec(p, 412, 'ckpt', 'waiting')
    records.append(_rec(p, 411, 'data') if behind else waiting)  # type: ignore[arg-type]
    frames = (('/job/train.py', 10, '<module>', 'main()'), ('/job/data.py', 88, 'load', 'sleep(9)'))
    front = HostFront(
        process=p, answered=True, hostname=f'node-{p}', last=records[-1],
        last_collective=records[-1], waiting=waiting, waiting_for=30.0 if waiting else 0.0,
        idle=30.0, where='data.py:88 in load' if behind else 'train.py:40 in save',
        activity='in user code at data.py:88 in load, in time.sleep' if behind else '',
        time=T0 + 500,
    )  # fmt: skip
    stacks = HostStacks(
        process=p, answered=True, hostname=f'node-{p}', os_pid=1000 + p,
        threads=(ThreadStack(name='MainThread', ident=1, main=True, daemon=False, frames=frames),),
        time=T0 + 500, waiting=waiting,
    )  # fmt: skip
    what = 'timeout' if (p % 2 == 0 and not behind) else 'request'
    details: dict[str, Any] = {'by': 0, 'why': 'timeout'}
    if what == 'timeout':
        details = {'error': 'BarrierTimeoutError', 'name': 'ckpt', 'missing': [*BEHIND, MISSING]}
    return {
        'format': _dumpfile.FORMAT,
        'version': _dumpfile.VERSION,
        'process': p,
        'num_processes': n,
        'pid': 1000 + p,
        'hostname': f'node-{p}',
        'jax_version': '0.10.2',
        'written': T0 + 500,
        'trigger': {'what': what, 'time': T0 + 500, 'details': details},
        'front': json.loads(front.to_json()),
        'stacks': json.loads(stacks.to_json()),
        'record_fields': list(_dumpfile.RECORD_FIELDS),
        'records': [list(dataclasses.astuple(r)) for r in records],
        'gone': {str(MISSING): 'did not answer the dump request'},
    }


def job_dumps(n: int = 1000) -> list[dict[str, Any]]:
    return [doc(p, n) for p in range(n) if p != MISSING]


def at_timeout(p: int, n: int) -> dict[str, Any]:
    """Process ``p``'s dump as a host writes it at its own timeout in ``barrier('ckpt') #412``:
    written while the error is built, so its wait is over (the entry ``failed``, nothing
    ``waiting``) and its front and stacks show the main thread running."""
    d = doc(p, n)
    failed = _rec(p, 412, 'ckpt', 'failed')
    d['records'][-1] = list(dataclasses.astuple(failed))
    d['front'].update(waiting=None, waiting_for=0.0, activity='', last=d['records'][-1])
    d['front']['last_collective'] = d['records'][-1]
    d['stacks'].update(waiting=None)
    d['trigger'] = {
        'what': 'timeout',
        'time': T0 + 500,
        'details': {'error': 'BarrierTimeoutError', 'name': 'ckpt', 'missing': [n - 1]},
    }
    return d
