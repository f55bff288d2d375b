"""Hang truth on a real program (issue 30): what ``multihost analyze`` says, line by line.

`_flax_job.py` (flax + optax + orbax, nothing of `multihost` imported) in 3 plain
processes under ``python -m multihost run --dump-dir``, launched as a scheduler launches
them, one case each:

- a host late for a checkpoint save while the others' checked barrier times out
  (``MULTIHOST_TIMEOUT=10``): placed where it was when they missed it, and ended;
- a host holding the GIL in a C call: its stacks written from C by its GIL watchdog and
  at once on the dump signal, the others' dump request unanswered, its JSON dump after;
- process 0 (the coordination service) killed while the others wait for a late host:
  JAX aborts them at once, their stacks are written from C, analyze says process 0 was
  lost.

(Busy told from wedged, on the same job: `test_fate.py`'s hang case attaches and reads a
spinning host's and a sleeping host's CPU share; `test_attach.py` the sleeping one's.)
Every wait is bounded; every process is killed when a test fails.
"""

from __future__ import annotations

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

from multihost._job._fate import EXIT_PEER_FAILED
from multihost._models import _analyze, _dumpfile, _native

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers
JOB = os.path.join(HERE, '_flax_job.py')
N = 3
BARRIER = "barrier('CheckpointManager:save_start') #2"

pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)


class Run:
    """One job of `N` processes: its folder, dumps, stall file and processes."""

    def __init__(self, tmp: str, **env: str) -> None:
        self.tmp = tmp
        self.dumps = os.path.join(tmp, 'dumps')
        self.go = os.path.join(tmp, 'go')
        environ = _jobs.scheduler_env(N, CKPT_DIR=os.path.join(tmp, 'ckpt'), STEPS='2',
                                      LOCAL_DEVICES='1', STALL_UNTIL=self.go, **env)  # fmt: skip
        command = ['-m', 'multihost', 'run', '--dump-dir', self.dumps, JOB]
        self.job = _jobs.start(N, command, environ, cwd=tmp)

    def until(self, what: str, check: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            assert all(p.poll() is None for p in self.job.procs), f'{what}: a process ended'
            time.sleep(0.2)
        raise AssertionError(f'{what}: not within {timeout:g} s')

    def stalled(self, p: int) -> None:
        self.until(f'process {p} stalled', lambda: os.path.exists(f'{self.go}.stalled-{p}'), 120)

    def analyze(self) -> list[str]:
        cli = subprocess.run([sys.executable, '-m', 'multihost', 'analyze', self.dumps],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert cli.returncode == 0, cli
        lines = cli.stdout.splitlines()
        assert 0 < len(lines) <= _analyze.MAX_LINES, cli.stdout
        return lines


@pytest.fixture
def run(tmp_path: Any) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def start(**env: str) -> Run:
        made.append(Run(str(tmp_path), **env))
        return made[-1]

    yield start
    for r in made:
        r.job.kill()


CLOCK = r'\d\d:\d\d:\d\d'


@pytest.mark.release
def test_a_late_host_is_placed_where_it_was_when_the_others_timed_out(run: Any) -> None:
    """Process 2 sleeps before its first save; the others' checked barrier times out after
    10 s (their error names what process 2 was doing then); their uncaught timeout ends the
    job: process 2 says whom they waited for, and analyze places it at that moment."""
    r = run(STALL_HOST='2', MULTIHOST_TIMEOUT='10')
    results = r.job.finish(150.0)
    codes = [rc for rc, _, _ in results]
    assert codes == [1, 1, EXIT_PEER_FAILED], [e[-1500:] for _, _, e in results]
    for _, _, err in results[:2]:  # each waiting host's own error: what process 2 was doing
        (missed,) = [ln for ln in err.splitlines() if ln.startswith('  process 2: last reached')]
        assert 'when missed' in missed and 'in stall, in time.sleep' in missed, missed
    (line,) = [ln for ln in results[2][2].splitlines() if ln.startswith('multihost: ')]
    assert re.fullmatch(
        rf'multihost: process [01] timed out after 10 s in {re.escape(BARRIER)} waiting for '
        r'process 2; this host \(process 2\) was in user code at _flax_job\.py:\d+ in stall, '
        r'in time\.sleep; ending \(exit code 75\)',
        line,
    ), line
    lines = r.analyze()
    assert re.fullmatch(
        rf'process [01] timed out after 10 s in {re.escape(BARRIER)} waiting for process 2',
        lines[0],
    ), lines
    assert (
        lines[1] == '3 dumps of 3 processes (written for peer: process 2; timeout: processes 0-1)'
    )
    assert lines[2] == 'culprit: process 2', lines
    assert lines[3].startswith(f'processes 0-1 wait in {BARRIER} at ') and lines[3].endswith(
        '(for 10 s)'
    ), lines
    # Where it was when the others' dump request reached it (or, when their order to end
    # came first, at that moment), and that it never arrived.
    stall = (r'in user code at _flax_job\.py:\d+ in stall, in time\.sleep, (wedged|progressing) '
             r'\([^)]*\)')  # fmt: skip
    assert re.fullmatch(
        r'never arrived there: process 2: last at train_step call #0'
        rf'(; when missed at {CLOCK}: {stall}; never arrived: ended at {CLOCK}, '
        rf'|, now {stall}; then ended: )'
        r'process [01] timed out waiting for it \(for \d+ s\)',
        lines[4],
    ), lines[4]
    assert lines[5].startswith('straggler: process 2 (furthest behind'), lines
    assert len(lines) == 6, lines


@pytest.mark.release
def test_a_host_holding_the_gil_writes_its_stacks_from_c(run: Any) -> None:
    """Process 1 sleeps in a C call that keeps the GIL before its first save; its GIL
    watchdog writes every stack from C after the hang limit; process 0's hang watchdog
    asks it for its dump (no answer); the dump signal writes its stacks at once (and ends
    the sleep: libc's sleep returns on a signal), its JSON dump follows, the job ends."""
    # JAX's heartbeat timeout at 400 s: the others take a host whose liveness stamps stop
    # for a quarter of it (100 s) for lost, and process 1 sleeps 150 s unless signalled:
    # room for what comes before the signal (~15 s in; 40 s and more on a loaded machine,
    # where the others reach the save's barrier late and their dump request waits 10 s).
    r = run(GIL_HOST='1', GIL_S='150', MULTIHOST_HANG_DUMP_S='4', HEARTBEAT_S='400')
    r.stalled(1)
    stacks = os.path.join(r.dumps, 'process-1.stacks.txt')

    def block() -> Any:
        return next((s for s in _native.read_dirs([r.dumps]) if s.process == 1), None)

    def in_stall() -> Any:  # a block from a compile that kept the GIL as long may come first
        b = block()
        return b is not None and b.by_watchdog and b.frames[0][::2] == (JOB, 'stall') and b

    r.until('its GIL watchdog, in the stall', in_stall, 30)

    def unanswered() -> bool:
        path = os.path.join(r.dumps, 'process-0.json')
        return os.path.exists(path) and 1 in _dumpfile.read(path).gone

    r.until("process 0's dump request unanswered", unanswered, 80)
    assert not os.path.exists(os.path.join(r.dumps, 'process-1.json'))  # no Python ran
    written = os.path.getmtime(stacks)
    time.sleep(0.05)
    r.job.procs[1].send_signal(signal.SIGUSR1)
    r.until('written from C at once', lambda: os.path.getmtime(stacks) > written, 3)
    results = r.job.finish(240.0)
    assert [rc for rc, _, _ in results] == [0] * N, [e[-1500:] for _, _, e in results]
    lines = r.analyze()
    assert re.fullmatch(
        r'process 1 held the GIL \(no Python ran for 4 s\) at _flax_job\.py:\d+ in stall, '
        rf'stacks at {CLOCK} in process-1\.stacks\.txt; its JSON dump followed( \d+ s later)?',
        lines[0],
    ), lines
    assert re.fullmatch(
        # Process 1's JSON dump: for the signal, or for the others' request it read once the
        # GIL came back (whichever of its threads ran first); either follows its C stacks.
        r'3 dumps of 3 processes \(written for hang: (processes 0, 2|process 0; request: '
        r'process 2); (signal|request): process 1\)',
        lines[1],
    ), lines
    assert 'gone, say the others: process 1: did not answer the dump request: it held the GIL' in (
        lines
    ), lines
    # Its JSON dump is written once the GIL came back: it was still in its stall (not in
    # the dump signal's own handler), on its way to the barrier (in orbax's save, before
    # it), already in the barrier with the others, or past it.
    (waits,) = [ln for ln in lines if ' wait in ' in ln]
    if waits.startswith(f'processes 0, 2 wait in {BARRIER} at '):
        (behind,) = [ln for ln in lines if ln.startswith('never arrived there: process 1')]
        assert 'in stall' in behind or '(via save), called from _flax_job.py' in behind, behind
        assert not re.search(r'(^|[ /])multihost/_', behind), behind  # no toolkit frame
    elif waits.startswith('process 1 wait in '):
        # Or past it: the barrier done (the others' dumps were written in it), its JSON dump
        # came from a later barrier of orbax's save (under load).
        assert BARRIER not in waits, lines
        # the others, where their dumps were written: 'never arrived there: processes 0, 2:
        # last reached barrier(...) #2, now ... in multihost (wait)'
        there = [ln for ln in lines if BARRIER in ln]
        for names in (('processes 0, 2: ', 'process 0: '), ('processes 0, 2: ', 'process 2: ')):
            assert any(n in ln for ln in there for n in names), '\n'.join(lines)
    else:
        assert waits.startswith(f'processes 0-2 wait in {BARRIER} at '), lines
    import mhnotebook

    assert lines[0] in repr(mhnotebook.postmortem(r.dumps))


@pytest.mark.release
def test_when_process_0_dies_the_others_stacks_are_written_from_c(run: Any) -> None:
    """Process 2 is late for the first save; process 0 is killed (SIGKILL) while it and
    process 1 wait for it: JAX aborts processes 1-2 at once, before any Python can run."""
    r = run(STALL_HOST='2')
    r.stalled(2)
    time.sleep(2.0)  # the others wait in the save's barrier
    r.job.procs[0].kill()
    t0 = time.monotonic()
    results = r.job.finish(60.0)
    assert time.monotonic() - t0 < 30
    assert [rc for rc, _, _ in results] == [-9, -6, -6], [e[-1500:] for _, _, e in results]
    # No Python ran on process 2 (in time.sleep); process 1's checked barrier may have
    # raised (the service unreachable) and dumped in the moment before JAX's abort.
    dumped = [(d.process, d.trigger) for d in _dumpfile.read_dirs([r.dumps])]
    assert dumped in ([], [(1, 'exception')]), dumped
    lines = r.analyze()
    assert re.fullmatch(
        rf'process 0 \(the coordination service\) was lost at about {CLOCK} \(no dump\): JAX '
        r'aborted processes 1-2 then \(a lost service ends every host at once\)',
        lines[0],
    ), lines
    ended = sorted(lines[1:3])
    assert re.fullmatch(
        rf'process 1 was ended by a fatal error \(Aborted\) at {CLOCK}, main thread at '
        r'(_flax_job\.py:\d+ in train|threading\.py:\d+ in _wait_for_tstate_lock) '
        r'\(\*\.stacks\.txt\)',
        ended[0],
    ), lines  # in the save's barrier, or leaving after its error
    assert re.fullmatch(
        rf'process 2 was ended by a fatal error \(Aborted\) at {CLOCK}, main thread at '
        r'_flax_job\.py:\d+ in stall \(\*\.stacks\.txt\)',
        ended[1],
    ), lines
    if not dumped:
        assert lines[3:] == ['0 dumps of 3 processes', 'no dump from processes 0-2'], lines
    else:
        assert lines[3:5] == [
            '1 dumps of 3 processes (written for exception: process 1)',
            'no dump from processes 0, 2',
        ], lines
        assert lines[5].startswith('process 1: raised CoordinatorUnreachableError('), lines
    import mhnotebook

    assert lines[0] in repr(mhnotebook.postmortem(r.dumps))
