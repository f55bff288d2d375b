"""``python -m multihost analyze`` on 1,000 synthetic dumps: bounded, and names the right hosts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

import _dump_cases
import pytest

from multihost._models import _analyze, _dumpfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_1000_dumps_verdict_fits_20_lines_and_names_the_hosts_behind() -> None:
    dumps = [_dumpfile.parse(d) for d in _dump_cases.job_dumps(1000)]
    verdict = _analyze.analyze(dumps)
    lines = verdict.lines()
    text = '\n'.join(lines)
    assert len(lines) <= _analyze.MAX_LINES, text
    assert verdict.missing == (7,) and 'no dump from process 7' in text
    # the hosts that dumped at their timeout are healthy: only the ones behind are culprits
    assert verdict.culprits == (7, 500, 501), text
    assert 'culprit: processes 7, 500-501' in text
    assert "wait in barrier('ckpt') #412" in text
    assert 'data.py:88 in load' in text
    assert verdict.straggler == 7  # no dump at all: furthest behind as far as anyone knows


def test_cli_reads_several_dirs_and_refuses_bad_files(tmp_path: Any) -> None:
    a, b = tmp_path / 'a', tmp_path / 'b'
    docs = _dump_cases.job_dumps(8)
    for d in docs:
        _dumpfile.write(str(a if d['process'] < 4 else b), d)
    run = [sys.executable, '-m', 'multihost', 'analyze']
    env = {**os.environ, 'PYTHONPATH': ROOT}
    ok = subprocess.run([*run, str(a), str(b)], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and 'no dump from process 7' in ok.stdout, ok
    (a / 'process-9.json').write_text(json.dumps({'format': 'multihost-dump', 'version': 2}))
    bad = subprocess.run([*run, str(a)], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad
    assert 'version 2' in bad.stderr
    none = subprocess.run(
        [*run, str(tmp_path / 'x')], env=env, capture_output=True, text=True, timeout=60
    )
    assert none.returncode == 2 and 'no such directory' in none.stderr


def test_the_readers_import_no_jax(tmp_path: Any) -> None:
    """analyze and audit-diff read files: a post-mortem starts at once (no JAX import, seconds
    on a busy machine), also where JAX is not set up."""
    for d in _dump_cases.job_dumps(4):
        _dumpfile.write(str(tmp_path / 'dumps'), d)
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    code = (
        'import sys; from multihost.__main__ import main; '
        'rcs = [main(["analyze", sys.argv[1]]), main(["audit-diff", sys.argv[2], sys.argv[3]])]; '
        'print("RCS", rcs, "jax" in sys.modules)'
    )
    dirs = [str(tmp_path / n) for n in ('dumps', 'a', 'b')]
    env = {**os.environ, 'PYTHONPATH': ROOT}
    out = subprocess.run(
        [sys.executable, '-c', code, *dirs], env=env, capture_output=True, text=True, timeout=60
    )
    assert 'RCS [0, 2] False' in out.stdout, out  # audit-diff: no audit logs there (exit 2)


@pytest.mark.parametrize('size', [60_000])
def test_a_dump_too_big_is_trimmed_oldest_records_first(size: int) -> None:
    doc = _dump_cases.doc(3, 8)
    doc['records'] = doc['records'] * 40
    text = _dumpfile.encode(doc, size)
    assert len(text.encode()) <= size
    got = json.loads(text)
    assert got['trimmed']['records'] > 0 and got['records'][-1] == doc['records'][-1]


def test_a_mismatch_names_each_sides_call_and_the_minority_as_culprit() -> None:
    docs = _dump_cases.job_dumps(8)

    def call(p: int) -> str:
        name, line = ('eval', 41) if p == 5 else ('ckpt', 40)
        return f"barrier('{name}') #412 at train.py:{line}"

    calls = {str(p): {'describe': call(p)} for p in range(8)}
    for d in docs:
        d['trigger'] = {
            'what': 'mismatch',
            'time': d['written'],
            'details': {'seq': 412, 'calls': calls},
        }
    verdict = _analyze.analyze([_dumpfile.parse(d) for d in docs])
    text = str(verdict)
    assert 5 in verdict.culprits and "process 5: barrier('eval') #412 at train.py:41" in text, text
    assert "processes 0-4, 6-7: barrier('ckpt') #412 at train.py:40" in text, text
    assert len(text.splitlines()) <= _analyze.MAX_LINES


def test_hosts_that_dumped_at_their_timeout_wait_in_the_barrier_in_every_view() -> None:
    """The wavefront and the where view of a post-mortem say what analyze says: hosts that
    dumped at their timeout wait in the barrier that failed (not "running user code": their
    dump was written after the wait ended, while the error was built)."""
    from mhnotebook._postmortem import PostMortem
    from mhnotebook.widgets._where import where_text
    from multihost import Wavefront

    dumps = [_dumpfile.parse(_dump_cases.at_timeout(p, 4)) for p in range(3)]
    text = str(_analyze.analyze(dumps))
    assert "processes 0-2 wait in barrier('ckpt') #412" in text and 'culprit: process 3' in text
    raw = Wavefront(hosts=tuple(d.front for d in dumps)).verdict  # the dumps' own fronts
    assert 'running user code' in raw, raw
    pm = PostMortem(('dumps',), tuple(dumps), 4)
    front = pm.wavefront()
    assert "processes 0-2 are waiting at barrier('ckpt') #412 for 88 s" in front.verdict, (
        front.verdict
    )
    assert 'running user code' not in front.verdict
    assert [h.waiting.name for h in front.hosts[:3]] == ['ckpt'] * 3
    where = where_text(pm.where(), dumps=4)
    assert "processes 0-2 (3 processes): waiting at barrier('ckpt') #412" in where, where
    assert 'running' not in where
    asked = _dumpfile.parse(_dump_cases.doc(1, 4))  # asked while waiting: its front says so
    assert _analyze.at_dump(asked) == (asked.front, asked.stacks)


def test_a_later_dump_keeps_the_one_written_at_another_hosts_request(tmp_path: Any) -> None:
    """Asked while it slept, then ended by a trigger of its own: the file keeps both moments."""
    from multihost._job import _dump

    _dump.configure(str(tmp_path))
    try:
        _dump.dump('request', {'by': 0, 'why': 'process 0: timeout in ckpt'})
        first = _dumpfile.read_dirs([str(tmp_path)])[0]
        assert first.trigger == 'request' and first.asked is None
        _dump.dump('peer', {'by': 0, 'where': 'in user code at train.py:9'})
        got = _dumpfile.read_dirs([str(tmp_path)])[0]
        assert got.trigger == 'peer' and got.asked is not None
        assert got.asked.trigger == 'request' and got.asked.details['by'] == 0
        assert got.asked.trigger_time == first.trigger_time
        assert len(got.asked.stacks.threads) == 1  # the main thread's stack only
        assert any('test_analyze.py' in f[0] for f in got.asked.stacks.threads[0].frames)
        what, _ = _analyze.position(got)
        assert 'when missed at' in what and 'never arrived: ended at' in what, what
        assert what.endswith('process 0 failed'), what
        _dump.dump('exception', {'error': 'ValueError', 'message': 'x'})  # still kept
        assert _dumpfile.read_dirs([str(tmp_path)])[0].asked is not None
    finally:
        _dump.configure(None)
        _dump._state.last_doc, _dump._state.last_written = None, 0.0


def test_a_host_the_others_timed_out_on_is_placed_when_missed_and_when_it_arrived() -> None:
    """Processes 0-2 timed out in ``barrier('ckpt') #412`` waiting for process 3 (their
    request found it in ``data.py:88``); it arrived 40 s later and its own wait timed out
    there: analyze says where it was when missed and when it arrived, not that it waited."""
    docs = [_dump_cases.at_timeout(p, 4) for p in range(3)]
    late = _dump_cases.at_timeout(3, 4)
    late['records'][-1][8] = _dump_cases.T0 + 540  # `time`: its own entry, 40 s after
    when = _dump_cases.doc(500, 4)  # a host in user code (data.py:88), as process 3 was
    when['front'].update(process=3)
    late['asked'] = {
        'trigger': {'what': 'request', 'time': _dump_cases.T0 + 500, 'details': {'by': 0}},
        'front': when['front'],
        'stacks': when['stacks'],
    }
    verdict = _analyze.analyze([_dumpfile.parse(d) for d in [*docs, late]])
    text = str(verdict)
    assert "processes 0-2 wait in barrier('ckpt') #412" in text, text
    assert verdict.culprits == (3,) and verdict.straggler == 3, text
    (line,) = [ln for ln in text.splitlines() if ln.startswith('never arrived there: process 3')]
    missed, arrived = _analyze._clock(_dump_cases.T0 + 500), _analyze._clock(_dump_cases.T0 + 540)
    assert f'when missed at {missed}: in user code at data.py:88 in load' in line, line
    assert line.endswith(f'arrived at {arrived} (40 s later)'), line
    # Without the request's snapshot: it still did not wait with the others.
    del late['asked']
    text = str(_analyze.analyze([_dumpfile.parse(d) for d in [*docs, late]]))
    assert f'process 3: arrived at {arrived}, after the others had given up' in text, text


def test_a_timeout_that_ended_the_job_is_said_as_whom_it_waited_for() -> None:
    """The fate order of a checked wait's timeout (``missing``, ``timeout``, ``label``): the
    ended host's dump leads analyze with whom the first host waited for, and its own line
    says the others timed out waiting for it; the failing host's dump is there."""
    from multihost._text import failure_phrase

    order = {'by': 1, 'error': 'BarrierTimeoutError', 'message': 'timed out after 10 s in ...',
             'site': '/job/train.py:192', 'missing': [3], 'after': 10.0,
             'label': "barrier('ckpt') #412"}  # fmt: skip
    phrase = failure_phrase(order)
    assert phrase == "process 1 timed out after 10 s in barrier('ckpt') #412 waiting for process 3"
    docs = [_dump_cases.at_timeout(p, 4) for p in range(3)]
    ended = _dump_cases.doc(500, 4)
    ended.update(process=3)
    where = 'in user code at data.py:88 in load'
    ended['trigger'] = {'what': 'peer', 'time': _dump_cases.T0 + 501,
                        'details': {**order, 'where': where}}  # fmt: skip
    text = str(_analyze.analyze([_dumpfile.parse(d) for d in [*docs, ended]]))
    assert text.splitlines()[0] == phrase, text  # the failing host dumped: nothing missing
    assert 'in time.sleep; then ended: process 1 timed out waiting for it' in text, text


def test_faulthandler_stacks_parse_and_a_signal_with_no_json_after_says_the_gil_was_held() -> None:
    """`_native.parse` on faulthandler's own text; `native_lines` says what it means, bounded."""
    import faulthandler
    import tempfile
    import threading

    from multihost._models import _native

    main = threading.main_thread().ident or 0
    with tempfile.TemporaryFile('w+') as f:
        f.write(f'{_native.HEADER}: process 3 of 8, pid 42, main thread 0x{main:016x}, hang 60 s\n')
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)  # the signal's block
        f.seek(0)
        text = f.read()
    got = _native.parse(text, '/d/process-3.stacks.txt', written=1000.0)
    assert got is not None and got.process == 3 and got.pid == 42 and not got.by_watchdog
    assert (
        got.frames[0][2]
        == 'test_faulthandler_stacks_parse_and_a_signal_with_no_json_after_says_the_gil_was_held'
    )
    assert _native.parse('not a stacks file\n') is None
    assert _native.parse(text.splitlines()[0] + '\n') is None  # the header alone: nothing written
    lines = _analyze.native_lines([got], [])
    assert len(lines) == 1 and lines[0].startswith('process 3 held the GIL (signalled) at ')
    assert lines[0].endswith('process-3.stacks.txt; no JSON dump followed'), lines
    many = [dataclasses.replace(got, process=p) for p in range(10)]
    lines = _analyze.native_lines(many, [])
    assert len(lines) == _analyze.MAX_NATIVE_LINES and lines[-1].startswith('7 more lines in the')


def test_pulse_words_and_its_round_trip_through_a_dump() -> None:
    """`Pulse`: the documented words, the state, and JSON through `HostFront` / `HostStacks`."""
    from multihost._models._pulse import Pulse
    from multihost._models._stacks import HostStacks
    from multihost._models._wavefront import HostFront

    wedged = Pulse(window=5.2, cpu=0.4, main_cpu=0.0, moved=False, samples=6)
    busy = Pulse(window=5.0, cpu=97.0, main_cpu=3.0, moved=False, samples=6)
    moving = Pulse(window=5.0, cpu=1.0, main_cpu=1.0, moved=True, samples=6)
    assert wedged.words == '0% CPU over the last 5 s, stack unchanged: wedged'
    assert wedged.brief == 'wedged (no CPU, stack unchanged)'
    assert busy.words == '97% CPU over the last 5 s (main thread 3%), stack unchanged: progressing'
    assert busy.brief == 'progressing (busy CPU)' and moving.brief == 'progressing (stack moving)'
    front = HostFront(process=2, answered=True, where='train.py:60 in f', pulse=wedged)
    assert HostFront.from_json(front.to_json()) == front
    assert HostFront.from_json(HostFront(process=1, answered=True).to_json()).pulse is None
    stacks = HostStacks(process=2, answered=True, pulse=busy)
    assert HostStacks.from_json(stacks.to_json()) == stacks
    assert stacks.format().splitlines()[0].endswith('; ' + busy.words)


def test_fatal_blocks_name_the_lost_coordination_service_only_when_process_0_left_nothing() -> None:
    from multihost._models import _native

    def ended(p: int, fatal: str = 'Aborted') -> Any:
        frames = (('/x/multihost/_exchange/_kv.py', 9, 'wait'), ('/job/train.py', 71, 'step'))
        return _native.NativeStacks(
            f'/d/process-{p}.stacks.txt', p, 100 + p, 1000.0, frames, False, 60.0, fatal, 4
        )

    lines = _analyze.native_lines([ended(1), ended(2), ended(3)], [])
    assert lines[0].startswith('process 0 (the coordination service) was lost at about ')
    assert 'JAX aborted processes 1-3 then' in lines[0]
    assert lines[1].startswith('processes 1-3 were ended by a fatal error (Aborted) at ')
    assert 'main thread at train.py:71 in step' in lines[1], lines  # the program's frame
    # Process 0 left a file: not called lost; a segfault is not JAX's abort.
    lines = _analyze.native_lines([ended(0, 'Segmentation fault'), ended(1)], [])
    assert not any('coordination service' in ln for ln in lines), lines
    assert any(
        ln.startswith('process 0 was ended by a fatal error (Segmentation fault)') for ln in lines
    )
    verdict = _analyze.analyze([], [ended(1), ended(2)])
    assert verdict.num_processes == 4 and verdict.missing == (0, 1, 2, 3)
    assert str(verdict).splitlines()[2:4] == [
        '0 dumps of 4 processes',
        'no dump from processes 0-3',
    ]


def test_device_memory_words_group_hosts_with_the_same_figures() -> None:
    """`memory_words` on dumps of hosts whose allocators report (a TPU's figures): hosts with
    the same figures together, a host without figures said, the CPU's none said plainly."""
    gib = 2**30
    docs = _dump_cases.job_dumps(4)
    rows = {
        0: [[0, 12 * gib, 13 * gib, 16 * gib], [1, int(12.04 * gib), 13 * gib, 16 * gib]],
        1: [[2, 12 * gib, 13 * gib, 16 * gib], [3, 12 * gib, 13 * gib, 16 * gib]],
        2: [[4, 15 * gib, int(15.5 * gib), 16 * gib], [5, 3 * gib, 4 * gib, 16 * gib]],
        3: [],
    }
    for d in docs:
        d['memory'] = rows[d['process']]
        d['platform'] = 'tpu'
    dumps = [_dumpfile.parse(d) for d in docs]
    assert dumps[2].memory == (
        (4, 15 * gib, int(15.5 * gib), 16 * gib),
        (5, 3 * gib, 4 * gib, 16 * gib),
    )
    assert _analyze.memory_words(dumps) == (
        "device memory per chip, from each host's allocator: "
        'processes 0-1: 12.0 of 16.0 GiB in use (peak 13.0 GiB; 2 chips each); '
        'process 2: 3.0-15.0 of 16.0 GiB in use (peak 15.5 GiB; 2 chips each); '
        'process 3: not reported'
    )
    for d in docs:
        d['memory'], d['platform'] = [], 'cpu'
    cpu = [_dumpfile.parse(d) for d in docs]
    assert _analyze.memory_words(cpu) == 'device memory: not reported by the cpu backend'
    old = dict(docs[0])
    del old['memory']  # a dump written before the field: read as none
    assert _dumpfile.parse(old).memory == ()
