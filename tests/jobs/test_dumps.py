"""Dumps and ``python -m multihost analyze`` on real processes (issue 20, items 2-4).

`_dump_job.py` (plain JAX, nothing of multihost) is launched the way a
scheduler does: plain processes under ``python -m multihost run --dump-dir
DIR``, the coordinator address and process index in the environment. Every
wait is bounded; every process is killed at the end whatever happened.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import _jobs
import pytest

from multihost._models import _analyze, _dumpfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, '_dump_job.py')
N = 4
TIMEOUT = 90.0

pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)


def _analyze_cli(directory: str) -> subprocess.CompletedProcess[str]:
    """``python -m multihost analyze DIR`` as a user runs it (bounded)."""
    return subprocess.run(
        [sys.executable, '-m', 'multihost', 'analyze', directory],
        env={**os.environ, 'PYTHONPATH': ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )


class Job:
    def __init__(self, tmp: str, n: int, *run_args: str, **env: str) -> None:
        self.dir = os.path.join(tmp, 'dumps')
        command = ['-m', 'multihost', 'run', '--dump-dir', self.dir, *run_args, JOB]
        self.job = _jobs.start(n, command, _jobs.scheduler_env(n, **env), cwd=tmp)
        self.procs = self.job.procs

    def wait_started(self) -> None:
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()  # bounded by the test's kill in `finish`
            assert line.strip() == 'started', (line, self.finish())

    def dumps(self, count: int, timeout: float = 45.0) -> list[_dumpfile.Dump]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(glob.glob(os.path.join(self.dir, 'process-*.json'))) >= count:
                time.sleep(0.5)  # a rewrite (gone processes) may follow the first write
                return _dumpfile.read_dirs([self.dir])
            time.sleep(0.2)
        raise AssertionError(f'fewer than {count} dumps in {timeout} s: {os.listdir(self.dir)}')

    def until(self, ok: Callable[[list[_dumpfile.Dump]], bool], timeout: float) -> list[Any]:
        """The dumps once ``ok(dumps)`` (read every 0.2 s); an AssertionError naming each
        process's trigger and details after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            dumps = _dumpfile.read_dirs([self.dir]) if os.path.isdir(self.dir) else []
            if ok(dumps):
                return dumps
            assert time.monotonic() < deadline, [(d.process, d.trigger, d.details) for d in dumps]
            time.sleep(0.2)

    def finish(self, timeout: float = TIMEOUT) -> list[tuple[int, str, str]]:
        return self.job.finish(timeout)

    def kill_all(self) -> None:
        self.job.kill()


def _hung(dumps: list[Any]) -> list[int]:
    """The processes whose dump is a hang dump, in order."""
    return sorted(d.process for d in dumps if d.trigger == 'hang')


@pytest.fixture
def job(tmp_path: Any) -> Iterator[Any]:
    made: list[Job] = []

    def start(n: int, *run_args: str, **env: str) -> Job:
        made.append(Job(str(tmp_path), n, *run_args, **env))
        return made[-1]

    yield start
    for j in made:
        j.kill_all()


def test_a_clean_run_writes_nothing(job: Any) -> None:
    j = job(2, MODE='clean')
    results = j.finish()
    assert [rc for rc, _, _ in results] == [0, 0], results
    assert not os.path.exists(j.dir) or os.listdir(j.dir) == []


def test_an_uncaught_exception_dumps_and_still_prints_its_traceback(job: Any) -> None:
    j = job(2, MODE='raise')
    results = j.finish()
    assert [rc for rc, _, _ in results] == [1, 1], results
    assert all('ValueError: bad batch on process' in err for _, _, err in results)
    dumps = _dumpfile.read_dirs([j.dir])
    assert [(d.process, d.trigger) for d in dumps] == [(0, 'exception'), (1, 'exception')]
    assert dumps[1].details['message'] == 'bad batch on process 1'
    assert dumps[1].details['traceback'][-1][0] == JOB


def test_the_dump_signal_makes_every_process_dump_while_the_job_goes_on(job: Any) -> None:
    j = job(N, MODE='loop', STEPS='50')
    j.wait_started()
    time.sleep(1.0)
    for p in j.procs:
        p.send_signal(signal.SIGUSR1)
    dumps = j.dumps(N)
    assert [p.poll() for p in j.procs] == [None] * N, 'the job must go on after dumping'
    assert [d.process for d in dumps] == list(range(N))
    for d in dumps:
        assert d.trigger == 'signal' and d.details == {'signal': 'SIGUSR1'}
        assert d.num_processes == N and d.pid == j.procs[d.process].pid
        assert any(r.kind == 'barrier' and r.name.startswith('step ') for r in d.records)
        assert d.stacks.threads[0].main  # user frames first: the main thread leads
        assert d.jax_version
    results = j.finish()
    assert [rc for rc, _, _ in results] == [0] * N, [e[-2000:] for _, _, e in results]


def test_a_barrier_timeout_dumps_and_analyze_names_process_2(job: Any) -> None:
    j = job(N, '--timeout', '4', MODE='late', LATE='2', SLEEP='10')
    j.wait_started()
    dumps = j.dumps(N)
    deadline = time.monotonic() + 20  # a host asked first rewrites its dump at its own timeout
    while time.monotonic() < deadline and [d.trigger for d in dumps].count('timeout') < 3:
        time.sleep(0.3)
        dumps = _dumpfile.read_dirs([j.dir])
    # The others' timeouts end the job (issue 34): each exits 1, process 2 is ended (75).
    results = j.finish()
    codes = [rc for rc, _, _ in results]
    assert codes == [1, 1, 75, 1], codes
    # The error names what the missing host was doing when missed (its liveness stamp,
    # refreshed every quarter of the timeout: 1 s here), with its CPU share.
    for p in (0, 1, 3):
        (said,) = [ln for ln in results[p][2].splitlines() if ln.startswith('  process 2: ')]
        assert "last reached barrier('before')" in said and '; when missed' in said, said
        assert 'in time.sleep' in said and '% CPU over the last' in said, said
    dumps = _dumpfile.read_dirs([j.dir])
    by = {d.process: d for d in dumps}
    assert {by[p].trigger for p in (0, 1, 3)} == {'timeout'}, [d.trigger for d in dumps]
    assert by[0].details['missing'] == [2]
    # No host is called gone: each answered, or had dumped for its own reason and ended.
    assert all(not d.gone for d in dumps), {d.process: d.gone for d in dumps}
    # Asked by the others while it slept, then ended by their failure (issue 34): its dump
    # says so, and where it was.
    assert by[2].trigger == 'peer' and by[2].details['by'] in (0, 1, 3), by[2].details
    assert 'in time.sleep' in by[2].details['where'], by[2].details
    # When the dump request reached it before the others' failure did, its later dump
    # keeps the one written then (the moment it was missed; issue 30 item 1).
    asked = by[2].asked
    if asked is not None:
        assert asked.trigger == 'request' and asked.trigger_time <= by[2].trigger_time
        assert 'time.sleep' in _analyze.position(asked)[0], asked
    verdict = _analyze.analyze(dumps)
    assert verdict.culprits == (2,) and verdict.straggler == 2
    text = str(verdict)
    behind = next(ln for ln in text.splitlines() if ln.startswith('never arrived there'))
    assert 'process 2' in behind and 'time.sleep' in behind, text
    assert ('when missed at' in behind) == (asked is not None), text
    assert 'culprit: process 2' in text and "barrier('ckpt')" in text, text
    assert len(text.splitlines()) <= _analyze.MAX_LINES
    cli = _analyze_cli(j.dir)
    assert cli.returncode == 0 and 'culprit: process 2' in cli.stdout, cli


@pytest.mark.release
def test_busy_told_from_wedged_in_the_dumps_and_analyze(job: Any) -> None:
    """Process 1 spins the CPU, process 2 sleeps, process 0 waits in ``ckpt`` (issue 30, 2).

    Process 0's hang watchdog asks the others for their dumps: each carries its CPU share
    and whether its stack moved, and analyze says who is progressing and who is wedged.
    """
    j = job(3, '--timeout', '60', MODE='busy', SPIN='1', LATE='2', SLEEP='16',
            MULTIHOST_HANG_DUMP_S='6')  # fmt: skip
    j.wait_started()
    dumps = j.dumps(3, timeout=30)
    results = j.finish()
    assert [rc for rc, _, _ in results] == [0, 0, 0], [e[-2000:] for _, _, e in results]
    by = {d.process: d for d in dumps}
    assert by[0].trigger == 'hang' and {by[1].trigger, by[2].trigger} == {'request'}, dumps
    spin, late = by[1].front.pulse, by[2].front.pulse
    assert spin is not None and late is not None, (by[1].front, by[2].front)
    # A share of a core (two test workers may share the machine's two, so its size varies
    # with load): busy by the model's own threshold, and far above the sleeper's.
    assert spin.brief == 'progressing (busy CPU)' and spin.window >= 3, spin
    assert late.cpu < 5 and late.moved is False and late.state == 'wedged', late
    assert spin.cpu > 3 * late.cpu, (spin, late)
    assert re.fullmatch(r'\d+% CPU over the last [56] s, stack unchanged: wedged', late.words)
    text = str(_analyze.analyze(dumps))
    behind = {ln.split(':')[1].strip(): ln for ln in text.splitlines() if 'never arrived' in ln}
    assert 'progressing (busy CPU)' in behind['process 1'], text
    assert (
        'in time.sleep' in behind['process 2']
        and 'wedged (no CPU, stack unchanged)' in behind['process 2']
    ), text
    # Each host's own line has the figures (the where text of its dump).
    assert '% CPU over the last' in by[2].stacks.format().splitlines()[0], by[2].stacks.format()


def _line_of(text: str, mode: str) -> int:
    """The line of ``_dump_job.py`` that holds ``text`` in ``mode``'s branch (1-based)."""
    with open(JOB) as f:
        lines = list(enumerate(f, 1))
    start = next(i for i, ln in lines if f"mode == '{mode}'" in ln)
    return next(i for i, ln in lines if i > start and text in ln)


@pytest.mark.release
def test_a_slow_host_is_not_a_hang_and_the_next_hang_is_dumped_again(job: Any) -> None:
    """Hang truth, a slow host: process 2 is 7 s late at ``first`` (the others' hang dumps
    fire at 3 s), then stuck before ``ckpt``. The slow wait's dumps say it went on and was
    not a hang; the stuck one is dumped again (the watchdog and the dump request fired once
    per process before), and process 2 is placed where it was at *that* moment, not the
    first (it kept the first request's position for ever)."""
    j = job(3, '--timeout', '20', MODE='slow_then_stuck', LATE='2', SLEEP='7', SLEEP2='60',
            MULTIHOST_HANG_DUMP_S='3')  # fmt: skip
    j.wait_started()
    out0 = j.procs[0].stdout
    assert out0 is not None and out0.readline().strip() == 'past the slow wait'

    def went_on(dumps: list[Any]) -> bool:  # the watchdog notes the end within its period
        hangs = [d for d in dumps if d.trigger == 'hang']
        return len(dumps) == 3 and len(hangs) == 2 and all('went_on' in d.details for d in hangs)

    dumps = j.until(went_on, 20)
    hangs = [d for d in dumps if d.trigger == 'hang']
    lines = str(_analyze.analyze(dumps)).splitlines()
    assert re.fullmatch(
        r"not a hang: barrier\('first'\) #2 went on at \d\d:\d\d:\d\d, after \d s "
        r'\(processes 0-1 dumped for a hang after [34] s\); the dumps show that moment',
        lines[0],
    ), lines
    assert 'slow: process 2' in lines and not any('culprit' in ln for ln in lines), lines
    slow = _line_of("float(os.environ['SLEEP'])", 'slow_then_stuck')
    assert any(
        ln.startswith('never arrived there: process 2') and f'_dump_job.py:{slow} ' in ln
        for ln in lines
    ), lines
    for d in hangs:  # the next hang dump needs twice the slow wait
        lasted, limit = d.details['lasted'], d.details['next_limit']
        assert lasted >= 6 and abs(limit - 2 * lasted) < 0.2, d.details

    results = j.finish()
    assert [rc for rc, _, _ in results] == [1, 1, 75], [e[-2000:] for _, _, e in results]
    for _, _, err in results[:2]:
        assert re.search(
            r"multihost: barrier\('first'\) #2 went on after \d s: a slow host, not a hang "
            r'\(hang dump written after [34] s\); the next hang dump waits 1\d s',
            err,
        ), err[-2000:]
    dumps = _dumpfile.read_dirs([j.dir])
    late = next(d for d in dumps if d.process == 2)
    assert late.trigger == 'peer' and late.asked is not None, late
    # Asked again for the stuck wait (by the second hang dump, or the timeout's request).
    assert "barrier('ckpt')" in str(late.asked.details.get('why')), late.asked.details
    stuck = _line_of("float(os.environ['SLEEP2'])", 'slow_then_stuck')
    text = str(_analyze.analyze(dumps))
    (behind,) = [ln for ln in text.splitlines() if ln.startswith('never arrived there')]
    assert 'when missed at ' in behind and f'_dump_job.py:{stuck} ' in behind, text
    assert 'not a hang' not in text and 'culprit: process 2' in text, text


# Release rotation; covered on every landing by a hang's dump: the tests above and below
@pytest.mark.release
def test_a_host_compiling_holds_the_hang_dump_and_a_later_hang_is_dumped(job: Any) -> None:
    """Hang truth, a slow compile: process 2 compiles a big jitted function (seconds) while
    the others wait at ``first`` past their hang limit (3 s). They write no hang dump while
    it compiles (it said so in the coordination service), each says why in one line, and the
    hang that follows (process 2 stuck before ``ckpt``) is dumped as usual."""
    j = job(3, MODE='compile_then_stuck', LATE='2', COMPILE_N='300', COMPILE_S='6',
            SLEEP2='60', MULTIHOST_HANG_DUMP_S='3')  # fmt: skip
    j.wait_started()
    late = j.procs[2].stdout
    assert late is not None
    compiled = late.readline().strip()
    took = float(re.fullmatch(r'compiled in ([\d.]+) s', compiled).group(1))  # type: ignore[union-attr]
    assert took >= 6, f'the jit call took {took} s: its tracing alone lasts 6 s'
    for p in j.procs:
        assert p.stdout is not None and p.stdout.readline().strip() == 'past the slow wait'
    # Nothing was dumped for the slow compile ...
    assert _dumpfile.read_dirs([j.dir]) == [], [(d.process, d.details) for d in
                                                  _dumpfile.read_dirs([j.dir])]  # fmt: skip
    # ... and the stuck host that follows is (by both waiting hosts: the first to dump asks
    # the other, whose own hang dump follows within a watchdog period).
    dumps = j.until(lambda ds: len(ds) == 3 and _hung(ds) == [0, 1], 45)
    hangs = [d for d in dumps if d.trigger == 'hang']
    assert all("barrier('ckpt')" in d.details['record'] for d in hangs), hangs
    lines = str(_analyze.analyze(dumps)).splitlines()
    assert 'culprit: process 2' in lines and not any('not a hang' in ln for ln in lines), lines
    j.kill_all()
    results = j.finish()
    for _, _, err in results[:2]:
        assert re.search(
            r"multihost: barrier\('first'\) #2 has waited \d+ s while process 2 is "
            r'(tracing|compiling) a jitted function at _dump_job\.py:\d+ in (<module>|big) '
            r'\(for \d+ s\): no hang dump while a host compiles \(up to 30 s\)',
            err,
        ), err[-2000:]
        assert 'went on' not in err, err[-2000:]


def test_hosts_blocked_inside_a_launch_call_dump_for_a_hang(job: Any) -> None:
    """Process 2 sleeps before a jitted all-reduce; processes 0-1 are inside that launch.
    With one CPU device per process XLA:CPU runs it inside its call (measured on jax 0.10.2
    and 0.12.1), so their call never returns: the watchdog counts that as a wait (their
    main threads neither trace nor compile), dumps for the hang and asks process 2."""
    j = job(3, MODE='late_launch', LATE='2', SLEEP='60', MULTIHOST_HANG_DUMP_S='3')
    j.wait_started()
    dumps = j.until(lambda ds: len(ds) == 3 and _hung(ds) == [0, 1], 45)
    j.kill_all()
    j.finish()
    by = {d.process: d for d in dumps}
    assert by[2].trigger == 'request', by[2].trigger
    assert all(by[p].details['record'] == 'late_step call #0' for p in (0, 1)), by[0].details
    assert all(3 <= by[p].details['waited'] < 20 for p in (0, 1)), by[0].details
    lines = str(_analyze.analyze(dumps)).splitlines()
    assert any(
        re.fullmatch(
            r'processes 0-1 are inside late_step call #0 at \S+/_dump_job\.py:\d+ '
            r'\(not done on device\) \(for \d+ s\)',
            ln,
        )
        for ln in lines
    ), lines
    assert 'culprit: process 2' in lines, lines
    assert any(ln.startswith('never launched it: process 2') for ln in lines), lines
    # the launch's collective table, made when the dump was written: the all-reduce the
    # hosts inside wait in, over the mesh axis, needing process 2, from the job's own line
    tables = [by[p].collectives['late_step call #0'] for p in (0, 1)]
    assert tables[0] == tables[1] and tables[0].processes == (0, 1, 2), tables[0]
    line = _job_line('return jnp.sum(a) * a')
    assert (
        "processes 0-1 wait in late_step call #0's first cross-host collective that needs "
        "process 2 (#0 of 1): all-reduce of f32[] over mesh axis 'i' (processes 0-2), from "
        f'_dump_job.py:{line} in late_step; process 2 never launched call #0'
    ) in lines, lines
    assert by[2].collectives == {}  # it never launched: no pending launch, no table


def test_every_host_inside_one_launch_is_said_with_its_collectives_and_memory(job: Any) -> None:
    """Every process is inside the same launch (a device callback sleeps before its
    all-reduce): no host is behind, so analyze names the launch's cross-host collectives, says
    which one each host is in is not seen from the host, and gives each host's device memory
    as its allocator reports it (CPU reports none: said so)."""
    j = job(3, MODE='stuck_launch', SLEEP='60', MULTIHOST_HANG_DUMP_S='3')
    j.wait_started()
    dumps = j.until(lambda ds: len(ds) == 3 and len(_hung(ds)) >= 1, 45)
    j.kill_all()
    j.finish()
    verdict = _analyze.analyze(dumps)
    lines = str(verdict).splitlines()
    assert verdict.in_launch and not verdict.behind, lines
    assert any(
        re.fullmatch(
            r'processes 0-2 are inside stuck_step call #0 at \S+/_dump_job\.py:\d+ '
            r'\(not done on device\) \(for \d+ s\)',
            ln,
        )
        for ln in lines
    ), lines
    line = _job_line('return jnp.sum(slow(a)) * a')
    assert (
        "stuck_step call #0's cross-host collectives (which one each host is in is not seen "
        "from the host): #0 all-reduce of f32[] over mesh axis 'i' (processes 0-2), from "
        f'_dump_job.py:{line} in stuck_step'
    ) in lines, lines
    assert 'device memory: not reported by the cpu backend' in lines, lines
    assert all(d.platform == 'cpu' and d.memory == () for d in dumps)


def _job_line(text: str) -> int:
    """The line of ``_dump_job.py`` that is ``text`` (stripped): exactly one."""
    with open(JOB) as f:
        hits = [i for i, ln in enumerate(f, 1) if ln.strip() == text]
    assert len(hits) == 1, hits
    return hits[0]


# Release rotation; covered on every landing by analyze's verdicts: the tests above and
# tests/engine/test_analyze.py
@pytest.mark.release
def test_a_script_staged_per_host_hangs_in_its_first_all_reduce_and_analyze_says_why(
    job: Any, tmp_path: Any
) -> None:
    """One script staged in a directory per host, run without ``--check-jit``: with CPU
    devices jax 0.12.1 hangs in the first all-reduce (the source paths make each host's
    executable different, and collectives meet only within one). The hang dumps say where
    each host is, and analyze names the cause and the fix. On jax 0.10.2 the same job runs
    to its end, and nothing is dumped."""
    import jax

    stage = os.path.join(str(tmp_path), 'stage')
    j = job(3, MODE='staged', STAGE=stage, MULTIHOST_HANG_DUMP_S='4')
    j.wait_started()
    if not _analyze.collectives_keyed_by_program(jax.__version__, 'cpu'):
        results = j.finish()
        assert [rc for rc, _, _ in results] == [0] * 3, [e[-2000:] for _, _, e in results]
        assert _dumpfile.read_dirs([j.dir]) == []
        return
    dumps = j.dumps(3, timeout=60)
    j.kill_all()
    j.finish()
    assert all(d.platform == 'cpu' and d.front.pending is not None for d in dumps), dumps
    lines = str(_analyze.analyze(dumps)).splitlines()
    assert lines[0].startswith(
        'processes 0-2 called staged_step call #0 from train.py:5 at different paths '
        f'({stage}0 on process 0; {stage}1 on process 1; {stage}2 on process 2). '
        f'On jax {jax.__version__} with CPU devices the source paths make'
    ), lines
    assert "jax_hlo_source_file_canonicalization_regex', r'^.*/')" in lines[0], lines
    # every host hangs at once: whose watchdog fires first, and who dumps on its request,
    # is a race (each is 'hang' or 'request'); the cause above is the same either way
    assert lines[1].startswith('3 dumps of 3 processes (written for hang: process'), lines
    assert lines[2].startswith(f'processes 0-2 are inside staged_step call #0 at {stage}0/'), lines
    shown = _analyze_cli(j.dir)
    assert shown.returncode == 0 and shown.stdout.splitlines()[0] == lines[0], shown


# Release rotation; covered on every landing by Ctrl-C on a hung job: the test below (and
# this one by an eighth of the landings' Python 3.12 runs)
@pytest.mark.release
def test_ctrl_c_twice_ends_hosts_blocked_inside_a_launch_call(job: Any) -> None:
    """Processes 0-1 are inside a jitted all-reduce whose call never returns (XLA:CPU runs it
    there with one device per process; process 2 sleeps before it), where Python cannot
    raise KeyboardInterrupt: before, Ctrl-C did nothing at all. Now the first Ctrl-C says
    where each main thread is blocked and writes its dump; the second ends them (130), and
    fate-sharing ends process 2 (75). analyze places them inside the launch."""
    j = job(3, MODE='late_launch', LATE='2', SLEEP='120', MULTIHOST_HANG_DUMP_S='2')
    j.wait_started()
    # Processes 0-1 inside late_step's call (not compiling it, which a Ctrl-C would
    # interrupt at once): their hang dumps say so.
    j.until(lambda ds: _hung(ds) == [0, 1], 60)
    for p in j.procs[:2]:
        p.send_signal(signal.SIGINT)
    j.until(lambda ds: sorted(d.process for d in ds if d.details.get('blocked')) == [0, 1], 30)
    assert all(p.poll() is None for p in j.procs), 'the first Ctrl-C ends nothing'
    for p in j.procs[:2]:
        p.send_signal(signal.SIGINT)
    results = j.finish(40.0)
    assert [rc for rc, _, _ in results] == [130, 130, 75], [e[-1500:] for _, _, e in results]
    for _, _, err in results[:2]:
        assert re.search(
            r'multihost: Ctrl-C \(SIGINT\) not handled for 2 s: the main thread is blocked in '
            r'native code, inside late_step call #0 \(not done on device\), waiting for it, '
            r'and Python raises KeyboardInterrupt only once it returns\. Press Ctrl-C again',
            err,
        ), err[-1500:]
        assert 'Ctrl-C again while the main thread is still blocked: ending this process' in err
    assert re.search(r'multihost: process [01] was interrupted \(KeyboardInterrupt', results[2][2])
    lines = str(_analyze.analyze(_dumpfile.read_dirs([j.dir]))).splitlines()
    assert lines[0].startswith('processes 0-1 were interrupted (KeyboardInterrupt'), lines
    assert any(ln.startswith('processes 0-1 are inside late_step call #0 at ') for ln in lines)
    assert any(ln.startswith('never launched it: process 2') for ln in lines), lines


def test_a_program_s_own_sigint_handler_is_left_alone() -> None:
    """`_interrupt` takes SIGINT only while it is Python's default: a program's own handler
    (set before ``install``) keeps it."""
    from multihost._job import _interrupt

    def own(signum: int, frame: Any) -> None:
        pass

    before = signal.signal(signal.SIGINT, own)
    try:
        _interrupt.patch(None)  # type: ignore[arg-type]
        assert signal.getsignal(signal.SIGINT) is own
        _interrupt.unpatch()
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_on_a_hung_job_dumps_where_each_host_was_and_ends_it_at_once(job: Any) -> None:
    """Ctrl-C on a hung job (SIGINT to every process, as a terminal or ``srun`` sends it):
    each host dumps where it was (trigger ``interrupt``; it wrote nothing before), analyze
    gives the hang's verdict from those dumps, and the job ends. (Usually within about a
    second: the hosts interrupted inside the barrier waited 10 s for the answer of one
    already gone; now a host that failed too answers at once and the asker stops waiting
    for hosts that ended. Still 10 s in 2 of 11 runs here: bounded below by the hang limit
    of the answer's wait, not by the typical time.)"""
    j = job(3, MODE='late', LATE='2', SLEEP='60')
    j.wait_started()
    time.sleep(3.0)  # everyone past 'before': process 2 sleeps, the others wait in 'ckpt'
    t0 = time.monotonic()
    for p in j.procs:
        p.send_signal(signal.SIGINT)
    for p in j.procs:
        p.wait(timeout=30)
    took = time.monotonic() - t0
    results = j.finish()
    assert [rc for rc, _, _ in results] == [130, 130, 130], [e[-2000:] for _, _, e in results]
    assert took < 20.0, f'the interrupted job took {took:.1f} s to end'
    dumps = _dumpfile.read_dirs([j.dir])
    assert [(d.process, d.trigger) for d in dumps] == [(p, 'interrupt') for p in range(3)]
    lines = str(_analyze.analyze(dumps)).splitlines()
    assert re.fullmatch(
        r'processes 0-2 were interrupted \(KeyboardInterrupt: Ctrl-C or SIGINT\) at '
        r'\d\d:\d\d:\d\d; where each host was then:',
        lines[0],
    ), lines
    assert 'culprit: process 2' in lines, lines
    assert any(ln.startswith("processes 0-1 wait in barrier('ckpt') #2 at ") for ln in lines)
    sleep = _line_of("float(os.environ['SLEEP'])", 'late')
    assert (
        "never arrived there: process 2: last at barrier('before') #1, then interrupted at "
        f"_dump_job.py:{sleep} in <module>: time.sleep(float(os.environ['SLEEP']))"
    ) in lines, lines
    # The dumps' stacks and fronts show where each host was, not the exception hook.
    late = dumps[2]
    assert late.stacks is not None and f'_dump_job.py:{sleep}' in late.stacks.where, late.stacks
    assert f'_dump_job.py:{sleep}' in (late.front.where or ''), late.front


# Release rotation; covered on every landing by the sync point:
# tests/engine/test_core_multiprocess.py; a dump per process: the dump signal test
@pytest.mark.release
def test_a_preemption_notice_dumps_and_the_sync_point_still_works(job: Any) -> None:
    j = job(2, MODE='preempt')
    j.wait_started()
    time.sleep(1.0)
    j.procs[1].send_signal(signal.SIGTERM)  # JAX's preemption notifier's: chained, not replaced
    results = j.finish()
    assert [rc for rc, _, _ in results] == [0, 0], [e[-2000:] for _, _, e in results]
    points = {out.strip().splitlines()[-2] for _, out, _ in results}
    assert len(points) == 1 and next(iter(points)).startswith('sync point at '), results
    points_at = next(iter(points)).rsplit(' ', 1)[1]
    dumps = _dumpfile.read_dirs([j.dir])
    assert [(d.process, d.trigger) for d in dumps] == [(0, 'preemption'), (1, 'preemption')]
    assert {d.details['sync_point'] for d in dumps} == {int(points_at)}


@pytest.mark.release
def test_kill_9_of_process_3_the_others_say_it_is_gone(job: Any) -> None:
    j = job(N, MODE='late', LATE='3', SLEEP='60', RECOVERABLE='1', MULTIHOST_HANG_DUMP_S='4')
    j.wait_started()
    time.sleep(1.5)  # everyone past 'before': process 3 sleeps, the others wait in 'ckpt'
    j.procs[3].send_signal(signal.SIGKILL)
    j.procs[3].wait(timeout=10)
    dumps = j.dumps(N - 1, timeout=60)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not all(
        3 in d.gone for d in dumps if d.trigger == 'hang'
    ):
        time.sleep(0.5)
        dumps = _dumpfile.read_dirs([j.dir])
    assert [d.process for d in dumps] == [0, 1, 2]
    hang = [d for d in dumps if d.trigger == 'hang']
    assert hang and all(3 in d.gone for d in hang), [(d.trigger, d.gone) for d in dumps]
    text = str(_analyze.analyze(dumps))
    assert 'no dump from process 3' in text, text
    assert 'culprit: process 3' in text or 'never arrived' in text, text


def test_dump_file_format_round_trip_and_trim(tmp_path: Any) -> None:
    from multihost import _recorder
    from multihost._job import _dump

    _recorder.reset()
    for i in range(_recorder.CAPACITY):
        e = _recorder.note('barrier', f'step {i}', seq=i, digest='d' * 16, site=f'{__file__}:{i}')
        _recorder.finished(e, wait=0.01)
    doc = _dump.document('signal', {'signal': 'SIGUSR1'})
    text = _dumpfile.encode({'format': _dumpfile.FORMAT, 'version': _dumpfile.VERSION, **doc})
    size = len(text.encode())
    print(f'dump size at {_recorder.CAPACITY} records: {size} bytes')
    assert size < _dumpfile.MAX_BYTES
    d = _dumpfile.parse(json.loads(text))
    assert (
        len(d.records) == _recorder.CAPACITY
        and d.records[-1].name == f'step {_recorder.CAPACITY - 1}'
    )
    small = json.loads(_dumpfile.encode(doc | {'format': 'multihost-dump', 'version': 1}, 60_000))
    assert small['trimmed']['records'] > 0 and len(small['records']) < _recorder.CAPACITY
    assert small['records'][-1][2] == f'step {_recorder.CAPACITY - 1}'  # the newest kept
    with pytest.raises(_dumpfile.DumpFormatError, match='version 99'):
        _dumpfile.parse({**json.loads(text), 'version': 99}, 'x.json')
    _recorder.reset()


def test_a_request_dump_never_overwrites_the_hosts_own_dump_written_meanwhile(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A host that held the GIL: the others' dump request is being answered when the GIL
    comes back, its signal dump is written meanwhile and its main thread goes on before the
    request's thread runs again. The signal dump stays (analyze reads its trigger)."""
    from multihost._job import _dump

    written: list[dict[str, Any]] = []

    def document(what: str, details: Any) -> dict[str, Any]:
        if what == 'request':  # the GIL came back while this document was taken
            assert _dump.dump('signal', {'signal': 'SIGUSR1'})
        return {'trigger': {'what': what, 'time': time.time(), 'details': dict(details or {})}}

    def write(directory: str, doc: dict[str, Any]) -> str:
        written.append(doc)
        return os.path.join(directory, 'process-1.json')

    monkeypatch.setattr(_dump, 'document', document)
    monkeypatch.setattr(_dump._dumpfile, 'write', write)
    monkeypatch.setattr(_dump._recorder, 'moved_on_since', lambda t: True)  # it went on
    monkeypatch.setattr(_dump, '_state', _dump._State())
    _dump._state.directory = str(tmp_path)
    assert _dump.dump('request', {'by': 0, 'why': 'hang'}) is None
    assert [d['trigger']['what'] for d in written] == ['signal']
    assert _dump._state.last_doc is written[-1]


def test_a_dump_that_failed_does_not_answer_a_request(tmp_path: Any, monkeypatch: Any) -> None:
    """This host's own dump could not be written: the others' request that comes next
    writes one (a host with no dump at all would read as "no dump" in analyze)."""
    from multihost._job import _dump

    written: list[str] = []

    def document(what: str, details: Any) -> dict[str, Any]:
        if what == 'signal':
            raise OSError(28, 'No space left on device')
        return {'trigger': {'what': what, 'time': time.time(), 'details': dict(details or {})}}

    def write(directory: str, doc: dict[str, Any]) -> str:
        written.append(doc['trigger']['what'])
        return os.path.join(directory, 'process-1.json')

    monkeypatch.setattr(_dump, 'document', document)
    monkeypatch.setattr(_dump._dumpfile, 'write', write)
    monkeypatch.setattr(_dump._recorder, 'moved_on_since', lambda t: False)  # still there
    monkeypatch.setattr(_dump, '_state', _dump._State())
    _dump._state.directory = str(tmp_path)
    assert _dump.dump('signal', {'signal': 'SIGUSR1'}) is None
    assert not _dump._current()
    assert _dump._on_request(None, {'by': 1, 'why': 'hang', 'at': time.time()}) != (
        '{"path": "kept"}'
    )
    assert written == ['request']
