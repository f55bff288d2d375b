"""After any verdict every host lines up again (4 real processes x 2 devices).

A host that skipped a collective the others gave up on (a timeout verdict)
takes its turn at the collective the others are at now; a host that arrives
late at the collective that failed raises its verdict; in both cases the next
collective lines up. Also: a skipped barrier in a loop (it looks late), the
per-step barrier names that tell the two apart, a mismatch verdict, and a
flax training loop whose hosts go on to the next step while the
skipper catches up.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import multihost
from multihost._exchange import _kv, _sequence

pytestmark = pytest.mark.release  # checked on the release rotation (CONTRIBUTING.md)

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess
TIMEOUT = 3.0


def _timed_out(exc: multihost.BarrierTimeoutError, t0: float) -> dict:
    return dict(
        error='timeout',
        missing=exc.missing,
        head=str(exc).splitlines()[0],
        late='arrived after the others had given up' in str(exc),
        elapsed=time.monotonic() - t0,
    )


def _save_barrier(name: str = 'save') -> dict:
    t0 = time.monotonic()
    try:
        multihost.barrier(name, timeout=TIMEOUT)
    except multihost.BarrierTimeoutError as exc:
        return _timed_out(exc, t0)
    except multihost.CollectiveMismatchError as exc:
        return dict(error=type(exc).__name__, elapsed=time.monotonic() - t0)
    return dict(error=None, elapsed=time.monotonic() - t0)


def _line_up_afterwards(pid: int) -> dict:
    """The collectives after the verdict: small and device gathers, barriers; all must agree."""
    t0 = time.monotonic()
    small = multihost.process_allgather(np.arange(3) + 10 * pid)
    first = time.monotonic() - t0
    multihost.barrier('after', timeout=30)
    big = multihost.process_allgather(np.full((300, 300), pid, np.float32))  # > 512 KiB: devices
    later = [multihost.process_allgather(np.int32(pid * i)).tolist() for i in range(3)]
    multihost.sync_global_devices('end')
    return dict(
        small=small.tolist(),
        first=first,
        big=[float(big[p].mean()) for p in range(4)],
        later=later,
        position=_sequence.position(),
    )


def _check_lined_up(results: list[dict]) -> None:
    assert len({r['position'] for r in results}) == 1, [r['position'] for r in results]
    for r in results:
        assert r['small'] == [[0, 1, 2], [10, 11, 12], [20, 21, 22], [30, 31, 32]], r
        assert r['big'] == [0.0, 1.0, 2.0, 3.0], r
        assert r['later'] == [[0, 0, 0, 0], [0, 1, 2, 3], [0, 2, 4, 6]], r


# -- (a) a host that skipped the barrier joins the next collective --------------------


def _skipper_body(busy: float) -> dict:
    pid = _kv.process_index()
    multihost.barrier('warm-up', timeout=30)
    out: dict = {}
    if pid == 2:
        time.sleep(busy)  # busy elsewhere: never calls barrier('save')
    else:
        out['save'] = _save_barrier()
    return {**out, **_line_up_afterwards(pid)}


@pytest.mark.parametrize(
    'busy',
    [TIMEOUT + 1.5, TIMEOUT + 8.0],
    ids=['while-the-others-barrier-is-open', 'after-the-service-dropped-it'],
)
def test_a_host_that_skipped_a_barrier_joins_the_next_collective(mp_cluster, busy):
    """Host 2 skips barrier('save'): the others time out naming it; then every collective agrees."""
    results = mp_cluster.run(_skipper_body, busy, timeout=120, bracket=False)
    heads = set()
    for pid, r in enumerate(results):
        if pid == 2:
            assert 'save' not in r
            # It found the verdict at once and joined the others' next collective.
            assert r['first'] < 2.0, r['first']
            continue
        assert r['save']['error'] == 'timeout', r
        assert r['save']['missing'] == [2], r
        assert not r['save']['late']
        assert TIMEOUT - 0.5 <= r['save']['elapsed'] <= TIMEOUT + 1.5, r
        heads.add(r['save']['head'])
        # They waited for host 2 at the gather, not a timeout.
        assert r['first'] < busy - TIMEOUT + 3.0, r['first']
    assert len(heads) == 1, heads
    assert "barrier('save')" in heads.pop()
    _check_lined_up(results)


# -- (b) a host late at the same barrier raises its verdict, then lines up ------------


def _late_body(busy: float) -> dict:
    pid = _kv.process_index()
    multihost.barrier('warm-up', timeout=30)
    if pid == 2:
        time.sleep(busy)  # busy writing the checkpoint: arrives late at the same barrier
    out = {'save': _save_barrier()}
    return {**out, **_line_up_afterwards(pid)}


@pytest.mark.parametrize('busy', [TIMEOUT + 1.5, TIMEOUT + 8.0], ids=['open', 'dropped'])
def test_a_host_late_at_the_same_barrier_raises_the_verdict_then_lines_up(mp_cluster, busy):
    """Host 2 arrives at barrier('save') after the verdict: it raises the same timeout at once."""
    results = mp_cluster.run(_late_body, busy, timeout=120, bracket=False)
    assert len({r['save']['head'] for r in results}) == 1, results
    for pid, r in enumerate(results):
        assert r['save']['error'] == 'timeout', r
        assert r['save']['missing'] == [2], r
        assert r['save']['late'] == (pid == 2), r
        if pid == 2:
            assert r['save']['elapsed'] < 1.5, r  # the verdict was waiting for it
    _check_lined_up(results)


# -- (c) the loop: a skipped barrier('save') followed by barrier('save') looks late ---


def _loop_body(names: str) -> dict:
    """Three iterations of 'save'; host 2 is busy during the first and does not call it."""
    pid = _kv.process_index()
    multihost.barrier('warm-up', timeout=30)
    saves = []
    iterations = 4 if (names == 'same' and pid == 2) else 3
    for step in range(iterations):
        if pid == 2 and step == 0:
            time.sleep(TIMEOUT + 1.5)
            saves.append(None)
            continue
        saves.append(_save_barrier('save' if names == 'same' else f'save-{step}'))
    return {'saves': saves, **_line_up_afterwards(pid)}


def test_a_skipped_barrier_called_again_next_looks_late(mp_cluster):
    """Host 2 skips iteration 0's barrier('save') and calls iteration 1's: it raises the timeout.

    Its call cannot be told from a late arrival at the barrier that failed:
    it raises that verdict at once, and its next barrier('save') meets the
    others' second one (as documented: one more iteration lines it up).
    """
    results = mp_cluster.run(_loop_body, 'same', timeout=120, bracket=False)
    for pid, r in enumerate(results):
        first = r['saves'][0] if pid != 2 else r['saves'][1]
        assert first['error'] == 'timeout' and first['missing'] == [2], r
        assert first['late'] == (pid == 2), r
        rest = r['saves'][1:] if pid != 2 else r['saves'][2:]
        assert [s['error'] for s in rest] == [None, None], r
    _check_lined_up(results)


def test_per_step_barrier_names_tell_a_skip_from_a_late_arrival(mp_cluster):
    """With barrier(f'save-{step}'), host 2's save-1 is not save-0: it joins the others' save-1."""
    results = mp_cluster.run(_loop_body, 'per-step', timeout=120, bracket=False)
    for pid, r in enumerate(results):
        if pid == 2:
            assert r['saves'][0] is None
            assert [s['error'] for s in r['saves'][1:]] == [None, None], r
            continue
        assert r['saves'][0]['error'] == 'timeout' and r['saves'][0]['missing'] == [2], r
        assert [s['error'] for s in r['saves'][1:]] == [None, None], r
    _check_lined_up(results)


# -- several hosts skipping, several verdicts in a row -----------------------------


def _several_body() -> dict:
    """Hosts 2 and 3 skip two failed barriers; hosts 0 and 1 time out twice."""
    pid = _kv.process_index()
    multihost.barrier('warm-up', timeout=30)
    out: dict = {}
    if pid in (2, 3):
        time.sleep(2 * TIMEOUT + 2.0 + pid)  # host 3 comes later than host 2
    else:
        out['saves'] = [_save_barrier('save'), _save_barrier('save-opt')]
    return {**out, **_line_up_afterwards(pid)}


def test_several_skippers_after_several_verdicts_line_up(mp_cluster):
    """Two hosts skip two collectives that timed out: both join the others' next one."""
    results = mp_cluster.run(_several_body, timeout=120, bracket=False)
    for pid in (0, 1):
        saves = results[pid]['saves']
        assert [s['missing'] for s in saves] == [[2, 3], [2, 3]], saves
    _check_lined_up(results)


def _skip_then_late_body() -> dict:
    """Host 2 skips barrier('save'), then is late at barrier('eval'), which failed too."""
    pid = _kv.process_index()
    multihost.barrier('warm-up', timeout=30)
    if pid == 2:
        time.sleep(2 * TIMEOUT + 2.0)
        return {'eval': _save_barrier('eval'), **_line_up_afterwards(pid)}
    saves = [_save_barrier('save'), _save_barrier('eval')]
    return {'saves': saves, **_line_up_afterwards(pid)}


def test_a_skipper_late_at_a_later_failed_collective_raises_that_one(mp_cluster):
    """Skipped 'save', late at 'eval': host 2 raises eval's verdict (not save's), then lines up."""
    results = mp_cluster.run(_skip_then_late_body, timeout=120, bracket=False)
    late = results[2]['eval']
    assert late['error'] == 'timeout' and late['late'] and late['elapsed'] < 2.0, late
    assert "barrier('eval')" in late['head'], late
    for pid in (0, 1, 3):
        saves = results[pid]['saves']
        assert [s['missing'] for s in saves] == [[2], [2]], saves
        assert saves[1]['head'] == late['head']
    _check_lined_up(results)


# -- (d) a mismatch verdict, then lining up ----------------------------------------


def _mismatch_body() -> dict:
    pid = _kv.process_index()
    multihost.barrier('warm-up', timeout=30)
    try:
        if pid == 2:
            multihost.process_allgather(np.zeros(2))  # a different collective
        else:
            multihost.barrier('save', timeout=TIMEOUT)
        out: dict = {'error': None}
    except multihost.CollectiveMismatchError as exc:
        out = {'error': type(exc).__name__, 'seq': exc.seq}
    return {**out, **_line_up_afterwards(pid)}


def test_a_mismatch_is_followed_by_lining_up(mp_cluster):
    """Host 2 calls process_allgather where the others call barrier('save'): all raise, then agree.

    A mismatch is judged from every host's record, so every host raises it
    and moves on by one: the next collective lines up as it is.
    """
    results = mp_cluster.run(_mismatch_body, timeout=120, bracket=False)
    assert {r['error'] for r in results} == {'CollectiveMismatchError'}, results
    assert len({r['seq'] for r in results}) == 1
    _check_lined_up(results)


# -- a flax training loop: the others go on training while the skipper catches up ---


def _train_body(ckpt_dir: str) -> dict:
    from _flax_program import create_state, global_batch, make_mesh, train_step

    pid = _kv.process_index()
    mesh = make_mesh()
    state = create_state(mesh)
    losses, saves, agreed = [], [], []
    for step in range(4):
        state, loss = train_step(state, global_batch(mesh, step))
        losses.append(float(loss))
        # A checked collective per step: every host's loss (the same global value).
        agreed.append(len(set(multihost.process_allgather(np.float32(loss)).tolist())) == 1)
        if step == 1:
            if pid == 2:
                time.sleep(TIMEOUT + 2.0)  # busy with its own checkpoint write; skips the barrier
            else:
                saves.append(_save_barrier('checkpoint'))
    return dict(
        losses=losses,
        saves=saves,
        steps=int(state.step),
        agreed=agreed,
        gathered=multihost.process_allgather(np.float32(losses[-1])).tolist(),
        position=_sequence.position(),
    )


def test_training_goes_on_while_the_skipper_catches_up(mp_cluster, tmp_path):
    """Hosts that timed out at the checkpoint barrier train on; host 2 joins their next check."""
    results = mp_cluster.run(_train_body, str(tmp_path), timeout=300, bracket=False)
    assert len({r['position'] for r in results}) == 1, results
    assert len({tuple(r['losses']) for r in results}) == 1, results  # one global computation
    for pid, r in enumerate(results):
        assert r['steps'] == 4 and r['agreed'] == [True] * 4, r
        assert r['gathered'] == [r['losses'][-1]] * 4, r
        if pid == 2:
            assert r['saves'] == []
        else:
            assert r['saves'][0]['error'] == 'timeout' and r['saves'][0]['missing'] == [2], r
