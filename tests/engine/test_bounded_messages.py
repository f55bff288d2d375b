"""Error messages at 1,000 hosts: at most 20 lines, every distinct call named, details kept.

The exceptions are built from verdicts made directly (what the judge and the
timeout path write), with 1,000 hosts, several distinct calls, and dead and
late hosts; no cluster is started.
"""

from __future__ import annotations

from multihost import (
    BarrierMismatchError,
    BarrierTimeoutError,
    CollectiveMismatchError,
    HostFailedError,
)
from multihost._exchange import _kv, _sequence, _threads, _verdicts
from multihost._exchange._sequence import CollectiveRecord
from multihost._text import grouped_lines

N = 1000
SEQ = 412


def _rec(
    p: int,
    kind: str = 'process_allgather',
    name: str = 'x',
    site: str = 'train.py:42',
    seq: int = SEQ,
    **kw: str,
) -> CollectiveRecord:
    return CollectiveRecord(seq, kind, name, 'ab12cd34', site, 1.0e9, p, **kw)


def _kind_of(p: int) -> tuple[str, str, str]:
    """Five distinct calls: most hosts gather, a few barrier or gather elsewhere."""
    if p in (17, 503):
        return 'barrier', 'ckpt', 'save.py:9'
    if 600 <= p < 640:
        return 'process_allgather', 'y', 'eval.py:7'
    if p == 999:
        return 'broadcast_one_to_all', 'z', 'train.py:50'
    if p % 100 == 55:
        return 'process_allgather', 'x', 'train.py:44'
    return 'process_allgather', 'x', 'train.py:42'


def _lines(exc: BaseException) -> list[str]:
    return str(exc).split('\n')


def test_collective_mismatch_at_1000_hosts_is_bounded_and_names_every_call() -> None:
    calls = {p: _rec(p, *_kind_of(p)) for p in range(N)}
    verdict = _kv.Verdict.parse(
        _kv.Verdict.failure('mismatch', records=_verdicts.records_json(calls))
    )
    exc = _sequence._error(verdict, calls[0], None)
    assert isinstance(exc, CollectiveMismatchError)
    lines = _lines(exc)
    assert len(lines) <= 20, '\n'.join(lines)
    text = str(exc)
    for c in {c.describe() for c in calls.values()}:  # every distinct call, with its site
        assert c in text, (c, text)
    assert "  processes 17, 503: barrier('ckpt') at save.py:9 [#412]" in lines, text
    assert "  processes 600-639: process_allgather('y') at eval.py:7 [#412]" in lines, text
    assert "  process 999: broadcast_one_to_all('z') at train.py:50 [#412]" in lines, text
    assert exc.seq == SEQ and exc.calls == calls  # every host's record kept


def test_mismatch_with_more_distinct_calls_than_fit_keeps_the_largest_and_counts_the_rest() -> None:
    # 1,000 hosts; 900 at one site, then 100 hosts each at its own line: 101 distinct calls.
    calls = {p: _rec(p, site='train.py:42' if p < 900 else f'odd.py:{p}') for p in range(N)}
    verdict = _kv.Verdict.parse(
        _kv.Verdict.failure('mismatch', records=_verdicts.records_json(calls))
    )
    exc = _sequence._error(verdict, calls[0], None)
    lines = _lines(exc)
    assert len(lines) <= 20, '\n'.join(lines)
    assert "  processes 0-899: process_allgather('x') at train.py:42 [#412]" in lines
    assert '  ... and 90 more distinct calls on 90 processes (see .calls)' in lines, lines
    assert len(exc.calls) == N and exc.calls[950].site == 'odd.py:950'


def test_barrier_name_mismatch_at_1000_hosts() -> None:
    calls = {p: _rec(p, 'barrier', 'ckpt' if p != 7 else 'eval') for p in range(N)}
    verdict = _kv.Verdict.parse(
        _kv.Verdict.failure('mismatch', records=_verdicts.records_json(calls))
    )
    exc = _sequence._error(verdict, calls[0], None)
    assert isinstance(exc, BarrierMismatchError)
    lines = _lines(exc)
    assert len(lines) == 3, lines
    assert lines[1:] == [
        "  processes 0-6, 8-999: barrier('ckpt') at train.py:42 [#412]",
        "  process 7: barrier('eval') at train.py:42 [#412]",
    ]
    assert len(exc.names) == N and exc.names[7] == 'eval'


def test_host_failed_at_1000_hosts() -> None:
    calls = {p: _rec(p, fail='x' if p % 3 == 0 else '') for p in range(N)}
    reasons = {p: f"name 'w{p % 30}' is not defined" for p in range(0, N, 3)}
    verdict = _kv.Verdict.parse(
        _kv.Verdict.failure('failed', records=_verdicts.records_json(calls), reasons=reasons)
    )
    exc = _sequence._error(verdict, calls[1], None)
    assert isinstance(exc, HostFailedError)
    lines = _lines(exc)
    assert len(lines) <= 20, '\n'.join(lines)
    # 10 distinct reasons (p % 30 for p = 0, 3, ..., 27), each with its hosts
    for r in set(reasons.values()):
        assert r in str(exc), r
    assert exc.reasons == reasons and len(exc.reasons) == 334


def test_barrier_timeout_at_1000_hosts_with_dead_and_late_hosts() -> None:
    missing = list(range(100, 400)) + [998, 999]
    positions = {p: _rec(p, seq=SEQ - 1 - p % 7).to_json() for p in range(100, 300)}
    positions.update({p: _rec(p, 'launch', 'train_step').to_json() for p in range(300, 400)})
    # 998 and 999 are dead: no position
    data = {
        'missing': missing,
        'arrived': [p for p in range(N) if p not in missing and p != 5],  # process 5 is late
        'positions': positions,
        'timeout': 30.0,
        'by': 0,
        'what': "barrier('ckpt') [#412]",
        'name': 'ckpt',
        'stage': True,
    }
    exc = _sequence._error(_kv.Verdict(False, 'timeout', data), _rec(5, 'barrier', 'ckpt'), None)
    assert isinstance(exc, BarrierTimeoutError)
    lines = _lines(exc)
    assert len(lines) <= 20, '\n'.join(lines)
    text = str(exc)
    assert 'processes 100-399, 998-999 did not arrive' in lines[0], lines[0]
    assert '  processes 998-999: last reached no collective yet' in lines, text
    assert "  processes 300-399: still inside launch('train_step') at train.py:42 [#412]" in text
    for k in range(7):  # every distinct position of the hosts left behind
        assert f'[#{SEQ - 1 - k}]' in text, (k, text)
    assert 'This host (process 5) arrived after the others had given up.' in text
    assert exc.missing == missing and len(exc.positions) == 300


def test_off_main_timeout_at_1000_hosts() -> None:
    rec = _rec(3, 'barrier', 'loader', lane='n:loader', thread='loader-1')
    missing = list(range(10, 1000))
    data = {
        'missing': missing,
        'arrived': list(range(10)),
        'positions': {p: _rec(p, seq=SEQ - p % 3).to_json() for p in missing[:256]},
        'threads': {
            p: [_rec(p, 'barrier', 'loader', lane='n:loader', thread='loader-2').to_json()]
            for p in missing[:50]
        },
        'timeout': 5.0,
        'by': 0,
    }
    exc = _threads._timeout_error(data, rec)
    lines = _lines(exc)
    assert len(lines) <= 20, '\n'.join(lines)
    assert 'processes 10-999 did not arrive' in lines[0]
    assert "thread 'loader-2' last reached barrier('loader')" in str(exc)
    assert '  processes 266-999: position not carried (only 256 missing processes are)' in str(exc)
    assert exc.missing == missing and len(exc.positions) == 256


def test_grouped_lines_keeps_host_order_and_is_exact_when_it_fits() -> None:
    assert grouped_lines({0: 'a', 1: 'b', 2: 'a', 3: 'a'}) == [
        '  processes 0, 2-3: a',
        '  process 1: b',
    ]
    got = grouped_lines({p: str(p % 5) for p in range(N)}, max_lines=3, what='x', attr='y')
    assert got[-1] == '  ... and 3 more x on 600 processes (see .y)' and len(got) == 3
