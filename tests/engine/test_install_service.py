"""A library's own barriers and key waits on the coordination client, seen (`_job._service`).

orbax, marin and others call the client's `wait_at_barrier` and
`blocking_key_value_get` through a client object they keep. Once patched,
each call is a flight record (``service_barrier`` / ``service_wait``: id,
timeout, call site, thread) shown while in progress by the wavefront and
after by the timeline; the toolkit's own traffic stays unrecorded. On 4 real
JAX processes x 2 CPU devices; every wait is bounded.
"""

from __future__ import annotations

import dataclasses
import sys
import threading

import jax
import pytest
from _helpers import source_line, wait_until

import multihost
from multihost import _jax_adapter, _recorder
from multihost._debug import _stacks, _wavefront
from multihost._debug._timeline import Timeline
from multihost._job import _service

MP_CLUSTER = dict(n=4, devices_per_process=2)
#: Read at call time: set in the shared cluster's workers while this module runs.
MP_CLUSTER_ENV = {'MULTIHOST_TIMEOUT': '30'}
multiprocess = pytest.mark.multiprocess
METHODS = tuple(_service.METHODS)


@dataclasses.dataclass(frozen=True)
class Options:
    """Stands in for `multihost._job._options.InstallOptions` (the install helper's)."""

    check_jit: bool = False
    timeout: float | None = None


def _service_records(name: str | None = None) -> list[_recorder.FlightRecord]:
    recs = _recorder.snapshot(jax.process_index())
    return [r for r in recs if r.is_service and (name is None or r.name == name)]


def _library_barrier(client, name: str, ms: int) -> None:
    client.wait_at_barrier(name, ms)  # the library's line


def _library_wait(client, key: str) -> str:
    return client.blocking_key_value_get(key, 30000)  # the library's line


def _ask_while_waiting(out: dict) -> None:
    """Host 0's thread: once hosts 0-2 wait in 'lib_barrier', reads the wavefront, frees host 3."""
    client = _jax_adapter.client()
    try:

        def all_waiting():
            wf = _wavefront.wavefront(timeout=10)
            at = [h.waiting.name if h.waiting is not None else None for h in wf.hosts]
            return wf if at == ['lib_barrier'] * 3 + ['test/svc/go'] else None

        out['front'] = wait_until(all_waiting, 30, 'hosts 0-2 in lib_barrier, 3 at its key')
        out['stacks'] = multihost.where(timeout=10)
    except BaseException as exc:
        out['error'] = exc
    finally:
        client.key_value_set('test/svc/go', 'go', allow_overwrite=True)


@multiprocess(timeout=60)
def test_a_library_barrier_with_one_host_late_is_seen_while_waiting_and_after():
    """Hosts 0-2 wait in a library's barrier for host 3, which waits for a key host 0 sets."""
    pid = jax.process_index()
    client = _jax_adapter.client()
    multihost.barrier('svc-warm')  # every host's debug thread runs
    before = len(_service_records())
    _service.patch(Options())
    try:
        multihost.barrier('svc-own')  # the toolkit's own traffic: not recorded as a service call
        multihost.process_allgather(pid)
        out: dict = {}
        asker = None
        if pid == 0:
            asker = threading.Thread(target=_ask_while_waiting, args=(out,), daemon=True)
            asker.start()
        if pid == 3:
            assert _library_wait(client, 'test/svc/go') == 'go'
        _library_barrier(client, 'lib_barrier', 30000)
        if asker is not None:
            asker.join(30)
        multihost.barrier('svc-after')
    finally:
        _service.unpatch()
    here = __file__
    barrier_site = f'{here}:{source_line(_library_barrier, "client.wait_at_barrier(")}'
    wait_site = f'{here}:{source_line(_library_wait, "return client.blocking_key_value_get(")}'
    recs = _service_records()[before:]
    expected = [('service_wait', 'test/svc/go')] if pid == 3 else []
    expected.append(('service_barrier', 'lib_barrier'))
    assert [(r.kind, r.name) for r in recs] == expected, recs  # nothing of the toolkit's
    barrier = recs[-1]
    assert (barrier.timeout, barrier.site, barrier.state, barrier.thread) == (
        30.0,
        barrier_site,
        'passed',
        '',
    )
    assert barrier.wait is not None and barrier.call == 0 and barrier.digest == ''
    if pid == 3:
        assert (recs[0].timeout, recs[0].site, recs[0].state) == (30.0, wait_site, 'passed')
    if pid != 0:
        return
    assert 'error' not in out, out.get('error')
    wf = out['front']
    verdict = wf.verdict
    assert "processes 0-2 are waiting in service barrier 'lib_barrier' at " in verdict, verdict
    short = f'test_install_service.py:{barrier_site.rsplit(":", 1)[1]}'
    assert f"'lib_barrier' at {short} for " in verdict, verdict
    assert "process 3 is waiting for service key 'test/svc/go' at test_install_service.py:" in (
        verdict
    )
    for h in wf.hosts[:3]:
        assert h.doing.startswith(f"waiting in service barrier 'lib_barrier' at {short} for "), (
            h.doing
        )
    stacks = out['stacks']
    for p in (1, 2):
        assert stacks[p].doing.startswith(f"waiting in service barrier 'lib_barrier' at {short}")
    # After: the timeline aligns the four hosts' records; host 3 arrived last.
    step = next(s for s in multihost.timeline().steps if s.label == "service barrier 'lib_barrier'")
    assert step.complete and step.hosts == (0, 1, 2, 3), step
    assert step.last_host == 3 and not step.clock_compared, step.describe()


@multiprocess(timeout=60)
def test_a_service_barrier_timeout_raises_what_the_client_raises():
    """Host 3 never comes: the patched call raises the client's own error; the record failed."""
    pid = jax.process_index()
    client = _jax_adapter.client()
    errors = []
    for patched in (True, False):
        if patched:
            _service.patch(Options())
        try:
            if pid != 3:
                try:
                    _library_barrier(client, f'lib_timeout_{patched}', 300)
                except Exception as exc:
                    errors.append(exc)
                else:
                    raise AssertionError('the barrier did not time out')
        finally:
            _service.unpatch()
        multihost.barrier(f'svc-timeout-{patched}')
    if pid == 3:
        assert not _service_records('lib_timeout_True')
        return
    (rec,) = _service_records('lib_timeout_True')
    assert rec.state == 'failed' and rec.timeout == 0.3 and rec.wait is not None
    assert not _service_records('lib_timeout_False')  # unpatched: not recorded
    seen, raw = errors  # the same error, unchanged, with or without the patch
    assert type(seen) is type(raw)
    assert 'lib_timeout_True' in str(seen) and 'lib_timeout_False' in str(raw)
    assert str(seen).split(':', 1)[0] == str(raw).split(':', 1)[0] == 'DEADLINE_EXCEEDED'
    assert seen.__cause__ is None and seen.__context__ is None


def _saver(client) -> threading.Thread:
    t = threading.Thread(target=_library_barrier, args=(client, 'bg_barrier', 30000), name='saver')
    t.start()
    return t


@multiprocess(timeout=60)
def test_a_service_barrier_of_another_thread_is_not_the_main_threads_wait():
    """A thread ('saver', like orbax's async save) of processes 0-2 waits in a service barrier
    while the main threads run: each host says so beside what its main thread does."""
    pid = jax.process_index()
    client = _jax_adapter.client()
    multihost.barrier('bg-warm')
    _service.patch(Options())
    try:
        saver = _saver(client) if pid != 3 else None
        if pid == 0:

            def all_in():
                wf = _wavefront.wavefront(timeout=10)
                names = [[(r.name, r.thread) for r in h.background] for h in wf.hosts]
                return wf if names == [[('bg_barrier', 'saver')]] * 3 + [[]] else None

            wf = wait_until(all_in, 30, "hosts 0-2's saver threads in bg_barrier")
            stacks = multihost.where(timeout=10)
        multihost.barrier('bg-seen')  # hosts 1-3 wait here for host 0
        if pid == 3:
            saver = _saver(client)
        assert saver is not None
        saver.join(30)
        multihost.barrier('bg-done')
    finally:
        _service.unpatch()
    (rec,) = _service_records('bg_barrier')
    assert (rec.thread, rec.state) == ('saver', 'passed')
    if pid != 0:
        return
    line = source_line(_library_barrier, 'client.wait_at_barrier(')
    site = f'test_install_service.py:{line}'
    also = f"waiting in service barrier 'bg_barrier' at {site} (thread 'saver')"
    assert wf.hosts[0].waiting is None  # the main thread asked: not waiting
    for h in wf.hosts[:3]:
        assert f'; also {also} for ' in h.doing, h.doing
    assert f', and {also}' in wf.verdict, wf.verdict
    for p in (1, 2):
        doing = stacks[p].doing
        assert doing.startswith("waiting at barrier('bg-seen')") and f'; also {also} for ' in doing
    assert 'also' not in stacks[3].doing, stacks[3].doing


def test_patch_replaces_the_class_methods_and_unpatch_restores_them():
    """The client's class (also before any client exists) gets recording methods, then its own."""
    cls = _jax_adapter.client_class()
    assert cls is not None
    before = {m: cls.__dict__[m] for m in METHODS}
    _service.patch(Options())
    try:
        _service.patch(Options(timeout=5.0))  # already patched: nothing changes
        for m in METHODS:
            now = cls.__dict__[m]
            assert now is not before[m]
            assert now.__multihost_original__ is before[m]
        assert _service.patched()
    finally:
        _service.unpatch()
    assert {m: cls.__dict__[m] for m in METHODS} == before
    assert not _service.patched()
    _service.unpatch()  # twice: nothing to do


class _CalledBack:
    """Asks `_service._site` from inside the standard library (`copy.deepcopy` calls it back)."""

    def __deepcopy__(self, memo):
        self.site = _service._site(sys._getframe(1))  # frame 1: copy.deepcopy
        return self


def test_the_call_site_skips_the_standard_library_for_its_caller():
    """A call made through the standard library names the line outside it that made it."""
    import copy

    called = copy.deepcopy(_CalledBack())
    line = source_line(test_the_call_site_skips_the_standard_library_for_its_caller, 'called =')
    assert called.site == f'{__file__}:{line}'
    packages, stdlib = _stacks.internal_dirs()
    assert copy.__file__.startswith(stdlib)
    assert any(p.rstrip('/').endswith('jax') for p in packages)


def _orbax_calls():
    """orbax's own paths to the client: a subset barrier, the distributed-barrier flag, a
    future's wait for a signal another host sets."""
    from absl import flags
    from orbax.checkpoint import multihost as ocp_multihost
    from orbax.checkpoint._src.futures import future, synchronization

    pid = jax.process_index()
    multihost.barrier('svc-orbax-warm')
    flag = flags.FLAGS['experimental_orbax_use_distributed_barrier']
    signal = synchronization.HandlerAwaitableSignal.STEP_DIRECTORY_CREATION
    before = len(_service_records())  # the cluster ran the tests above
    _service.patch(Options())
    try:
        if pid in (0, 1):
            ocp_multihost.sync_global_processes('ckpt_subset', timeout=30, processes={0, 1})
        if not flags.FLAGS.is_parsed():  # orbax reads it at each call, if absl parsed flags
            flags.FLAGS.mark_as_parsed()
        flag.value = True
        try:
            ocp_multihost.sync_global_processes('ckpt_flag', timeout=30)
        finally:
            flag.value = False
        if pid == 0:
            future.set_signals([signal], operation_id='svc_op')
        else:
            future.wait_for_signals([signal], timeout_secs=30, operation_id='svc_op')
        multihost.barrier('svc-orbax-done')
    finally:
        _service.unpatch()
    return [dataclasses.astuple(r) for r in _service_records()[before:]]


def test_orbax_barriers_and_signal_waits_are_recorded_at_orbax_lines(mp_cluster):
    """orbax's subset barrier, flagged barrier and future's signal wait (its own client
    reference) are records naming orbax's lines; the timeline aligns them."""
    pytest.importorskip('orbax.checkpoint')
    got = mp_cluster.run(_orbax_calls, timeout=60)
    records = {p: [_recorder.FlightRecord(*r) for r in got[p]] for p in range(4)}
    for p, recs in records.items():
        want = [('service_barrier', 'ckpt_subset')] if p < 2 else []
        want.append(('service_barrier', 'ckpt_flag'))
        if p:
            want.append(('service_wait', 'svc_op'))
        assert [(r.kind, r.name.split('/')[0].split('_contract_')[-1]) for r in recs] == want
        for r in recs:
            path, line = r.site.rsplit(':', 1)
            assert path.split('orbax/checkpoint/')[-1] in (
                '_src/multihost/multihost.py',
                '_src/futures/signaling_client.py',  # orbax's own client wrapper
            ), r.site
            assert line.isdigit() and r.state == 'passed' and r.timeout == 30.0, r
        assert [r.digest for r in recs if r.name == 'ckpt_subset'] == (['0,1'] if p < 2 else [])
    steps = {s.label: s for s in Timeline.build(records, 4).steps}
    assert steps["service barrier 'ckpt_subset'"].complete  # hosts 2-3 are not in it
    assert steps["service barrier 'ckpt_subset'"].missing == ()
    assert steps["service barrier 'ckpt_flag'"].hosts == (0, 1, 2, 3)


# -- the views, from records in hand (pure) --------------------------------------------

ORBAX = '/venv/lib/python3.11/site-packages/orbax/checkpoint/_src/multihost/multihost.py'
NOW = 1_000_000.0


def _svc_record(p, kind, name, *, state='waiting', wait=None, at=NOW - 40, subset='', thread=''):
    return _recorder.FlightRecord(
        n=0,
        kind=kind,
        name=name,
        call=0,
        seq=None,
        digest=subset,
        fingerprint='',
        site=f'{ORBAX}:318',
        time=at,
        wait=wait,
        state=state,
        process=p,
        timeout=300.0,
        thread=thread,
    )


def _stacks_of(p, *, waiting=None, background=()):
    from multihost._models._stacks import HostStacks, ThreadStack

    frames = (('/home/u/train.py', 12, 'save', 'mngr.save(step)'),)
    return HostStacks(
        process=p,
        answered=True,
        time=NOW,
        threads=(ThreadStack('MainThread', 1, True, False, frames),),
        waiting=waiting,
        waiting_for=40.0 if waiting is not None else 0.0,
        background=background,
    )


def test_the_where_view_says_which_service_barrier_at_which_library_line():
    """%mh_where's text groups the hosts inside one service barrier, naming orbax's line."""
    from mhnotebook.widgets._where import where_text

    stacks = {
        p: _stacks_of(p, waiting=_svc_record(p, 'service_barrier', 'ckpt_3')) for p in (0, 1, 2)
    }
    saver = _svc_record(3, 'service_wait', 'ckpt/done', thread='saver', at=NOW - 5)
    stacks[3] = _stacks_of(3, background=(saver,))
    text = where_text(stacks)
    site = 'orbax/checkpoint/_src/multihost/multihost.py:318'
    assert (
        f"processes 0-2 (3 processes): waiting in service barrier 'ckpt_3' at {site} for 40 s"
        in (text)
    ), text
    assert f"also waiting for service key 'ckpt/done' at {site} (thread 'saver') for 5 s" in text
    back = type(stacks[3]).from_json(stacks[3].to_json())
    assert back == stacks[3] and back.doing == stacks[3].doing


def test_the_timeline_aligns_service_barriers_by_id_and_expects_only_their_processes():
    """A subset barrier expects its processes; a key wait only its waiters; neither is a
    straggler vote except the barrier (lateness from the waits, as at a check)."""
    b = 'service_barrier'
    records = {
        0: [_svc_record(0, b, 'sub', state='passed', wait=2.0, subset='0,1')],
        1: [_svc_record(1, b, 'sub', state='passed', wait=0.1, subset='0,1')],
        2: [_svc_record(2, 'service_wait', 'k', state='passed', wait=1.0)],
        3: [_svc_record(3, b, 'all', state='waiting')],
    }
    tl = Timeline.build(records, 4)
    steps = {s.label: s for s in tl.steps}
    sub = steps["service barrier 'sub'"]
    assert sub.complete and sub.missing == () and sub.last_host == 1 and not sub.clock_compared
    assert round(sub.lateness[1], 6) == 1.9
    wait = steps["service wait for key 'k'"]
    assert wait.missing == () and wait.hosts == (2,)
    every = steps["service barrier 'all'"]
    assert every.waiting == (3,) and every.missing == (0, 1, 2)
    assert tl.stragglers().steps == 1
    trace = tl.chrome_trace()['traceEvents']
    (bar,) = [e for e in trace if e.get('name') == "service barrier 'sub'" and e['pid'] == 0]
    assert bar['dur'] == 2e6 and bar['args']['timeout_s'] == 300.0
