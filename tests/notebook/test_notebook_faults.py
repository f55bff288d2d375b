"""The notebook side when things go wrong, on real ipyparallel clusters and a real IPython shell.

Interrupts (the kernel's SIGINT, `Session.interrupt`), a host that ignores
them, the collective count realigned after an interrupt, the stepper's Stop
seen by the magics, bad input, oversized and sliced gathers, a second
``%mh_cluster start``, and dead hosts (default fate-sharing and
``--recoverable``). Hosts that die get clusters of their own.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import numpy as np
import pytest
from _helpers import env_var, local_session, wait_until
from _helpers import magic_shell as _shell
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import mhnotebook
from mhnotebook import SessionError
from mhnotebook._magics import _run

pytestmark = pytest.mark.cluster

SETUP = """
import os, signal, time, jax, numpy as np, multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
g = jax.make_array_from_callback(
    (64, 40), NamedSharding(mesh, P('x', 'y')),
    lambda i: np.arange(64 * 40, dtype=np.float32).reshape(64, 40)[i])
g3 = jax.make_array_from_callback(
    (8, 6, 4), NamedSharding(mesh, P('x', None, 'y')),
    lambda i: np.arange(192, dtype=np.float32).reshape(8, 6, 4)[i])
local_np = np.arange(10.0) + 100 * jax.process_index()
local_jax = jax.numpy.arange(10.0) * (jax.process_index() + 1)
"""


@pytest.fixture(scope='module')
def session():
    with local_session(SETUP) as s:
        yield s


def _interrupt_kernel_after(seconds: float) -> threading.Timer:
    """What Jupyter's stop button does: SIGINT to the kernel process (this one)."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


# -- 6. interrupts ------------------------------------------------------------------


def test_kernel_interrupt_stops_every_host_and_the_next_cell_runs(session, capsys):
    """SIGINT to the kernel during a %%mh sleep(60) (process 3 done at once): the hosts
    still in it stop, the one done is said to be, the next cell prints."""
    ip, magics = _shell(session)
    timer = _interrupt_kernel_after(2.0)
    t0 = time.monotonic()
    with capture_output() as cap:
        ip.run_cell_magic(
            'mh', '', 'print("start", flush=True)\ntime.sleep(60 if jax.process_index() < 3 else 0)'
        )
    interrupted = time.monotonic() - t0
    timer.join()
    assert interrupted < 2.0 + 7.0, f'the interrupt took {interrupted - 2:.1f} s'
    assert re.search(
        r'interrupted: processes 0-2 stopped in \d+\.\d s \(process 3 had already finished\)\.',
        cap.stdout,
    ), cap.stdout
    assert 'Where each process was' in cap.stdout
    where = [o for o in cap.outputs if 'text/plain' in o.data and 'host' in o.data['text/plain']]
    assert where, 'no where view displayed'
    assert magics.background is None
    t1 = time.monotonic()
    with capture_output() as cap:
        ip.run_cell_magic('mh', '', 'print("next", jax.process_index())')
    next_cell = time.monotonic() - t1
    assert next_cell < 5.0, f'the next cell took {next_cell:.1f} s'
    assert '[process 3] next 3' in cap.stdout, cap.stdout
    assert 'TaskAborted' not in cap.stdout + cap.stderr
    with capsys.disabled():
        print(
            f'\n[timing] kernel interrupt -> magic returned: {interrupted - 2.0:.2f} s; '
            f'next %%mh cell: {next_cell:.2f} s'
        )


def test_session_interrupt_leaves_no_aborted_task(session):
    """Session.interrupt() stops a running cell; the cells right after it run (no TaskAborted)."""
    for _ in range(3):
        session.execute_async('time.sleep(60)')
        time.sleep(0.5)
        t0 = time.monotonic()
        report = session.interrupt()
        assert report.stopped == (0, 1, 2, 3) and report.running == ()
        assert time.monotonic() - t0 < 5.0
        out = session.execute('print("after", jax.process_index())', timeout=30, echo=False)
        assert out[2].strip() == 'after 2'


def test_interrupt_names_the_host_that_does_not_stop(session):
    """A host that cannot be interrupted is named, with restart offered; the rest stop."""
    pending = session.execute_async(
        'if jax.process_index() == 1:\n'
        '    signal.signal(signal.SIGINT, signal.SIG_IGN)  # like a native collective\n'
        'time.sleep(6)\n'
        'print("finished")'
    )
    time.sleep(0.5)
    report = session.interrupt(timeout=2.0)
    assert report.running == (1,) and report.stopped == (0, 2, 3)
    assert 'process 1 did not stop within 2 s' in report.message
    assert '%mh_cluster restart' in report.message
    assert report.position is None  # not realigned while a host is busy
    with pytest.raises(mhnotebook.HostsError) as info:
        session.wait_outputs(pending, timeout=30, echo=False)
    assert sorted(info.value.errors) == [0, 2, 3]
    assert 'KeyboardInterrupt' in info.value.errors[0]
    assert pending[1].successful() and 'finished' in pending[1].stdout
    # Realigned at the next call, once every host is idle.
    assert session._unaligned
    session.execute('pass', timeout=30, echo=False)
    assert not session._unaligned


def test_interrupt_realigns_the_collective_sequence(session):
    """Hosts interrupted at different collective counts line up again for the next barrier."""
    session.set_stepping(True)
    try:
        pending = session.execute_async(
            'if jax.process_index() == 3:\n    time.sleep(60)\nmultihost.barrier("realign-1")'
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            step = session.step_table().pending
            if step is not None and sorted(step.arrived) == [0, 1, 2]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f'hosts 0-2 never waited at the gate: {session.step_table()}')
        before = step.seq + 1  # hosts 0-2 entered collective step.seq; host 3 did not
        report = session.interrupt(pending=pending)
    finally:
        session.set_stepping(False)
    assert report.running == (), {p: h.format() for p, h in report.where.items()}
    positions = session.call('multihost.engine.sequence_position')
    assert positions == [before] * 4 and report.position == before
    out = session.execute(
        'multihost.barrier("realign-2", timeout=20)\nprint("lined up")', timeout=60, echo=False
    )
    assert all(text.strip() == 'lined up' for text in out.values())


def test_kernel_interrupt_inside_a_barrier_then_the_next_barrier_lines_up(session):
    """Hosts waiting in a multihost barrier stop on an interrupt; the next barrier works."""
    ip, magics = _shell(session)
    timer = _interrupt_kernel_after(2.0)
    with capture_output() as cap:
        ip.run_cell_magic(
            'mh',
            '',
            'if jax.process_index() == 3:\n'
            '    time.sleep(60)\n'
            'multihost.barrier("never-complete", timeout=120)',
        )
    timer.join()
    assert 'interrupted: processes 0-3 stopped in' in cap.stdout, cap.stdout
    assert len(set(session.call('multihost.engine.sequence_position'))) == 1
    t0 = time.monotonic()
    with capture_output() as cap:
        ip.run_cell_magic('mh', '', 'multihost.barrier("after", timeout=20)\nprint("passed")')
    assert cap.stdout.count('] passed') == 4, cap.stdout
    assert time.monotonic() - t0 < 10


# -- after a barrier timeout, the next magic lines up ------------------------------

_PARAMS = 'params = {"w": np.ones(3) * (1 + (jax.process_index() == 1)), "b": np.zeros(2)}'


def _diff_at_once(ip) -> float:
    """%mh_diff params: host 1 is the odd one; returns how long it took."""
    t0 = time.monotonic()
    view = ip.run_line_magic('mh_diff', 'params')
    took = time.monotonic() - t0
    assert [leaf.path for leaf in view.diff.leaves] == ["['w']"]
    assert view.diff.leaves[0].odd_processes == (1,)
    return took


def test_a_magic_while_a_background_cell_runs_is_refused_and_its_output_kept(session):
    """Issue 32 item 1: with a ``%%mh --bg`` cell still running on process 2, a new cell or
    magic is refused in one line (it would queue silently behind it); once the background
    cell is done, the next cell shows its output first: nothing is lost."""
    ip, magics = _shell(session)
    with capture_output():
        ip.run_cell_magic(
            'mh',
            '--bg',
            'print("bg start", jax.process_index())\n'
            'if jax.process_index() == 2:\n'
            '    time.sleep(4)\n'
            'print("bg end", jax.process_index())',
        )
    wait_until(lambda: _run.still_running(magics, session) == [2], 20, 'the others finished')
    t0 = time.monotonic()
    for magic, refused in (
        (lambda: ip.run_cell_magic('mh', '', 'print("fg", jax.process_index())'), '%%mh'),
        (lambda: ip.run_line_magic('mh_barrier', 'save --timeout 3'), '%mh_barrier'),
        (lambda: ip.run_line_magic('mh_diff', 'params'), '%mh_diff'),
    ):
        with pytest.raises(UsageError) as info:
            magic()
        assert str(info.value) == (
            f'{refused}: a %%mh cell is still running in the background on process 2 '
            '(finished on processes 0-1, 3); %mh_wait collects its output, %mh_where shows '
            f'where they are (nothing was run: run {refused} again once it is done).'
        ), str(info.value)
    assert time.monotonic() - t0 < 2, 'refused at once'
    wait_until(lambda: not _run.still_running(magics, session), 30, 'the bg cell ended')
    with capture_output() as cap:
        ip.run_cell_magic('mh', '', 'print("fg", jax.process_index())')
    out = cap.stdout
    assert out.index('the background cell had finished; its output:') < out.index('] fg 0'), out
    assert all(f'[process {p}] bg end {p}' in out for p in range(4)), out
    assert out.count('] fg ') == 4 and magics.background is None, out
    magics.session = None


def test_barrier_a_busy_host_returns_at_its_timeout_and_withdraws_the_call(session):
    """Issue 32 item 2: ``%mh_barrier --timeout 3`` while process 2's engine is busy with a
    cell the magics did not start returns at its timeout (not when process 2 is done):
    the others say who was missing, process 2 is named busy with where it is, and its
    barrier call is withdrawn, so it never runs late; then %mh_diff lines up at once."""
    ip, magics = _shell(session)
    session.execute(_PARAMS, echo=False)
    busy = session.execute_async('if jax.process_index() == 2:\n    time.sleep(12)')
    time.sleep(0.5)
    t0 = time.monotonic()
    with capture_output() as cap:
        ip.run_line_magic('mh_barrier', 'save --timeout 3')
    took = time.monotonic() - t0
    assert took < 3 + 2 + 2, (took, cap.stdout)  # the timeout and the grace, not 12 s
    lines = [line for line in cap.stdout.splitlines() if line.startswith('process ')]
    assert len(lines) == 4, cap.stdout
    for p in (0, 1, 3):
        assert lines[p].startswith(f'process {p}: BarrierTimeoutError: timed out after 3 s')
        assert 'process 2 did not arrive' in lines[p], lines
    assert lines[2].startswith('process 2: busy, its barrier call withdrawn: '), lines[2]
    assert 'process 2 is busy in Cell In[' in lines[2], lines[2]
    session.wait_outputs(busy, timeout=30, echo=False)
    # Withdrawn: process 2 never entered barrier('save') after its cell ended.
    wait_until(lambda: all(ar.ready() for ar in busy.values()), 10, 'the busy cell ended')
    time.sleep(0.5)
    records = session.flight_records(last=50)
    assert not [r for r in records[2] if r.name == 'save'], records[2]
    assert [r for r in records[0] if r.name == 'save'], records[0]
    assert _diff_at_once(ip) < 10
    assert len(set(session.call('multihost.engine.sequence_position'))) == 1
    magics.session = None


def test_barrier_a_host_skipped_then_diff_lines_up(session):
    """Host 2 skips barrier('save') in a cell; the others time out; %mh_diff works at once."""
    ip, magics = _shell(session)
    session.execute(_PARAMS, echo=False)
    with capture_output() as cap:
        ip.run_cell_magic(
            'mh',
            '',
            'if jax.process_index() != 2:\n'
            '    try:\n'
            '        multihost.barrier("save", timeout=3)\n'
            '    except multihost.BarrierTimeoutError as exc:\n'
            '        print("timed out, missing", exc.missing)\n',
        )
    assert cap.stdout.count('timed out, missing [2]') == 3, cap.stdout
    assert _diff_at_once(ip) < 10  # before: host 2 raised the old timeout, the rest waited 120 s
    assert len(set(session.call('multihost.engine.sequence_position'))) == 1
    magics.session = None


# -- 7. the stepper and the magics share one stepping setting ------------------------


def test_stepper_refreshes_itself_and_its_stop_reaches_the_magics(session):
    """Step shows the next step without Refresh; after Stop, %%mh runs in the foreground."""
    ip, magics = _shell(session)
    ip.run_line_magic('mh_step', 'on')
    assert magics.stepping and session.stepping
    with capture_output() as cap:
        ip.run_cell_magic(
            'mh', '', 'multihost.barrier("st-1")\ntime.sleep(0.5)\nmultihost.barrier("st-2")'
        )
    assert 'running in the background' in cap.stdout

    def arrived_at(name):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            step = session.step_table().pending
            if step is not None and step.complete and step.majority.name == name:
                return step
            time.sleep(0.1)
        raise AssertionError(f'hosts never all arrived at {name}: {session.step_table()}')

    first = arrived_at('st-1')
    view = ip.run_line_magic('mh_step', '')
    assert view.table.pending.seq == first.seq
    view._step_button.click()  # what the browser's click runs
    step = view.table.pending  # no Refresh
    assert step is not None and step.seq == first.seq + 1 and step.complete, view.text()
    assert step.majority.name == 'st-2'
    view._stop_button.click()
    assert 'failed' not in view._message.value, view._message.value
    assert not view.table.stepping
    assert not magics.stepping and not session.stepping
    with capture_output() as cap:
        ip.run_cell_magic('mh', '', 'print("foreground", jax.process_index())')
    # the stepper's Stop interrupted the background cell: said in one line, no tracebacks
    assert (
        cap.stdout.startswith('%%mh: the background cell was interrupted on processes 0-3.\n')
        and '[process 2] foreground 2' in cap.stdout
    ), cap.stdout
    assert 'Traceback' not in cap.stdout, cap.stdout
    # Stepping switched on by code on the hosts is what the magic sees too.
    ip.run_cell_magic('mh', '', 'multihost.set_stepping(True) if jax.process_index() == 0 else 0')
    assert magics.stepping
    with capture_output() as cap:
        ip.run_cell_magic('mh', '', 'print("bg")')
    assert 'running in the background (stepping is on)' in cap.stdout
    view = ip.run_line_magic('mh_step', 'continue')
    assert not view.table.stepping and not magics.stepping
    with capture_output() as cap:
        ip.run_line_magic('mh_wait', '--timeout 30')
    assert cap.stdout.count('] bg') == 4
    magics.background = None


# -- 9. bad input --------------------------------------------------------------------


def test_bad_timeouts_and_axes_are_one_line_usage_errors(session):
    """Non-positive timeouts and axes that do not fit say what to do instead of a traceback."""
    ip, magics = _shell(session)
    for line in ['--timeout -5', '--timeout 0']:
        with pytest.raises(UsageError, match=r'--timeout must be > 0 seconds'):
            ip.run_cell_magic('mh', line, 'print(1)')
    with pytest.raises(UsageError, match=r'--timeout must be > 0 seconds'):
        ip.run_line_magic('mh_barrier', 'b --timeout -1')
    with pytest.raises(ValueError, match='timeout must be > 0'):
        session.execute('pass', timeout=0)
    with pytest.raises(ValueError, match='timeout must be > 0'):
        session.barrier('b', timeout=-1)
    with pytest.raises(UsageError, match=r'^--axes 0,5 do not fit g3, an array of shape') as info:
        ip.run_line_magic('mh_layout', 'g3 --axes 0,5')
    assert '\n' not in str(info.value) and 'e.g. 0,2' in str(info.value)
    with pytest.raises(UsageError, match='--axes 1,1 do not fit'):
        ip.run_line_magic('mh_layout', 'g3 --axes 1,1')
    view = ip.run_line_magic('mh_layout', 'g3 --axes 0,2')
    assert view.grid.axes == (0, 2)


def test_layout_of_host_local_values_works(session):
    """%mh_layout of a numpy array or a single-device jax.Array shows process 0's copy."""
    ip, magics = _shell(session)
    for name, want in [('local_np', np.arange(10.0)), ('local_jax', np.arange(10.0))]:
        with capture_output() as cap:
            view = ip.run_line_magic('mh_layout', name)
        assert view.layout.shape == (10,)
        np.testing.assert_array_equal(view._values, want)
        assert f'{name} is host-local' in cap.stdout and f'%mh_diff {name}' in cap.stdout


def _mem_available() -> int:
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('MemAvailable:'):
                return int(line.split()[1]) * 1024
    raise AssertionError('no MemAvailable in /proc/meminfo')


@pytest.mark.parametrize('transport', ['shm', 'zmq'])
def test_oversized_gather_is_refused_and_a_slice_travels(session, transport):
    """A gather over half the available memory is refused up front; x[::k] is cut on the hosts."""
    ip, magics = _shell(session)
    # A host-local value that claims more than the machine has, without taking any memory.
    per_host = _mem_available() // 4 // 8 + 1
    session.execute(f'huge = np.broadcast_to(np.float64(1.5), ({per_host},))', echo=False)
    t0 = time.monotonic()
    with pytest.raises(UsageError) as info:
        ip.run_line_magic('mh_allgather', f'huge --transport {transport}')
    assert time.monotonic() - t0 < 10
    text = str(info.value)
    assert 'GiB' in text and 'half of the' in text and 'nothing was allocated' in text
    assert '--max-bytes' in text and 'huge[::' in text and '\n' not in text
    assert 'huge' not in ip.user_ns
    step = -(-per_host // 1000)
    with capture_output() as cap:
        ip.run_line_magic('mh_allgather', f'huge[::{step}] -o small --transport {transport}')
    small = ip.user_ns.pop('small')
    assert small.shape == (4, len(range(0, per_host, step))) and (small == 1.5).all()
    assert 'small = huge[::' in cap.stdout
    # --max-bytes: the same refusal for a global array, and a slice of it (on the hosts).
    with pytest.raises(UsageError, match=r'the limit of .* \(max_bytes\)'):
        ip.run_line_magic('mh_allgather', f'g --max-bytes 1000 --transport {transport}')
    full = np.arange(64 * 40, dtype=np.float32).reshape(64, 40)
    ip.run_line_magic('mh_allgather', f'g[::8, :16] -o gs --max-bytes 1000 --transport {transport}')
    np.testing.assert_array_equal(ip.user_ns.pop('gs'), full[::8, :16])
    session.execute('del huge', echo=False)


def test_slices_are_exact_and_only_the_slice_travels(session):
    """Every kind of int/slice subscript of a global array gathers exactly; hosts send only it."""
    full = np.arange(64 * 40, dtype=np.float32).reshape(64, 40)
    s_ = np.s_
    cases = {
        '[::4, :128]': s_[::4, :128],
        '[3]': s_[3],
        '[-1, 5:37:3]': s_[-1, 5:37:3],
        '[10:50:7, -3]': s_[10:50:7, -3],
        '[:, 39]': s_[:, 39],
        '[60:]': s_[60:],
    }
    for sub, index in cases.items():
        want = full[index]  # the reference, on a local array
        for transport in ('shm', 'zmq'):
            got = session.allgather('g' + sub, transport=transport)
            assert got.shape == want.shape, sub
            np.testing.assert_array_equal(got, want, err_msg=sub)
    metas = session.call(
        'multihost.engine.gather_meta',
        'g',
        0,
        index=(slice(None, None, 8), slice(None, 16)),
        namespace=True,
    )
    sent = sum(
        int(np.prod([b - a for a, b in blk])) for m in metas for blk in m['leaves'][0]['blocks']
    )
    assert sent == 8 * 16  # not 64 * 40
    with pytest.raises(ValueError, match='is not a name of an engine value'):
        session.allgather('g[__import__("os").getpid()]')
    with pytest.raises(SessionError, match='out of range for axis 0'):
        session.allgather('g[64]')
    with pytest.raises(SessionError, match='positive steps only'):
        session.allgather('g[::-1]')


# -- 11. a second %mh_cluster start -------------------------------------------------------


def test_second_start_reuses_a_cluster_of_the_same_shape(session):
    """Run All twice: the same shape is reused (and says so); another shape says stop/restart."""
    ip, magics = _shell(session)
    with capture_output() as cap:
        ip.run_line_magic('mh_cluster', 'start -n 4 -d 2')
    assert magics.session is session and session.running
    assert 'reusing the running cluster of 4 processes x 2 devices' in cap.stdout
    with pytest.raises(UsageError, match=r'is running, not 2 x 2: %mh_cluster stop') as info:
        ip.run_line_magic('mh_cluster', 'start -n 2 -d 2')
    assert '%mh_cluster restart' in str(info.value)
    with pytest.raises(UsageError, match='not 4 x 2 recoverable'):
        ip.run_line_magic('mh_cluster', 'start -n 4 -d 2 --recoverable')
    assert magics.session is session and session.running
    magics.session = None


# -- 5. dead hosts (clusters of their own) ------------------------------------------------


@pytest.mark.release
def test_dead_host_is_reported_and_restart_recovers():
    """os._exit(1) on host 2: the cell says so; status shows it; other magics say restart."""
    s = mhnotebook.start_local(3, 1, progress=False)
    try:
        ip, magics = _shell(s)
        s.execute('import jax, multihost\nx = 1', echo=False)
        old_pids = [h.pid for h in s.processes]
        t0 = time.monotonic()
        with capture_output() as cap:
            ip.run_cell_magic(
                'mh',
                '',
                'import os\nif jax.process_index() == 2:\n    os._exit(1)\nprint("alive")',
            )
        assert time.monotonic() - t0 < 15
        lines = [ln for ln in cap.stdout.splitlines() if 'died' in ln]
        assert len(lines) == 1, cap.stdout
        assert lines[0].startswith('%%mh: process 2 died (exit code 1) while running this cell.')
        assert "JAX's default fate-sharing" in lines[0] and '--recoverable' in lines[0]
        assert '[process 0] alive' in cap.stdout
        with capture_output() as cap:
            ip.run_line_magic('mh_cluster', 'status')
        assert 'process 2: engine' in cap.stdout and 'dead (exit code 1)' in cap.stdout
        assert 'process 0: engine' in cap.stdout and 'idle' in cap.stdout
        assert 'process 2 is gone: %mh_cluster restart' in cap.stdout, cap.stdout
        gone = r'^process 2 is gone \(exit code 1\): %mh_cluster restart'
        for magic, line in [
            ('mh_barrier', 'b'),
            ('mh_allgather', 'x'),
            ('mh_diff', 'x'),
            ('mh_layout', 'x'),
            ('mh_where', ''),
            ('mh_step', 'on'),
            ('mh_cluster', 'start -n 3 -d 1'),
        ]:
            with pytest.raises(UsageError, match=gone):
                ip.run_line_magic(magic, line)
                raise AssertionError(f'%{magic} {line} did not say host 2 is gone')
        with pytest.raises(UsageError, match=gone):
            ip.run_cell_magic('mh', '', 'print(1)')
        with capture_output() as cap:
            ip.run_line_magic('mh_cluster', 'restart --timeout 120')
        assert s.dead == {} and set(h.pid for h in s.processes).isdisjoint(old_pids)
        assert 'run your %%mh setup cells again' in cap.stdout, cap.stdout
        with capture_output() as cap:
            ip.run_cell_magic('mh', '', 'import jax\nprint("back", jax.process_index())')
        assert '[process 2] back 2' in cap.stdout
        magics.session = None
    finally:
        s.stop()


@pytest.mark.release
def test_recoverable_cluster_keeps_survivors_inspectable():
    """--recoverable: SIGKILL on host 2 leaves 0 and 1 running; live_devices names them.

    The stacks, the wavefront, the timeline and %mh_where name host 2 as gone
    at once (the session passes its dead hosts down: not waited for).
    """
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()
    ip.run_line_magic('load_ext', 'mhnotebook')
    magics = ip.magics_manager.registry['MultihostMagics']
    magics.session = None
    # A lost host ends the others within MULTIHOST_LOST_S under install, but not in a
    # recoverable job: the survivors must outlive it (they did not, before: ended with 75).
    with env_var('MULTIHOST_LOST_S', '2'):
        ip.run_line_magic('mh_cluster', 'start -n 3 -d 1 --recoverable --timeout 120')
    s = magics.session
    try:
        assert s.recoverable
        with capture_output() as cap:
            ip.run_cell_magic(
                'mh',
                '',
                'import os, signal, jax, multihost\n'
                'if jax.process_index() == 2:\n'
                '    os.kill(os.getpid(), signal.SIGKILL)\n'
                'print("alive")',
            )
        died = [ln for ln in cap.stdout.splitlines() if 'died' in ln]
        assert len(died) == 1, cap.stdout
        assert died[0].startswith('%%mh: process 2 died (signal 9) while running this cell.')
        assert 'keep running (recoverable)' in died[0]
        time.sleep(4.0)  # past MULTIHOST_LOST_S: a watcher would have ended the survivors
        t0 = time.monotonic()
        with capture_output() as cap:
            ip.run_cell_magic(
                'mh',
                '--timeout 60',
                'with multihost.live_devices(jax.devices()) as devices:\n'
                '    print("live", sorted({d.process_index for d in devices}))',
            )
        assert 'process 2 gone; running on processes 0-1' in cap.stdout
        assert '[process 0] live [0, 1]' in cap.stdout and '[process 1] live [0, 1]' in cap.stdout
        assert time.monotonic() - t0 < 30
        with pytest.raises(
            UsageError, match=r'^process 2 is gone \(signal 9\): %mh_cluster restart'
        ):
            ip.run_line_magic('mh_barrier', 'b')
        # The session knows host 2 died: nobody waits for it, and it is named as gone.
        t0 = time.monotonic()
        where = s.where(timeout=5)
        front = s.wavefront(timeout=5)
        timeline = s.timeline(timeout=5)
        took = time.monotonic() - t0
        assert where[0].answered and where[1].answered and not where[2].answered
        assert where[2].error == 'gone (signal 9)', where[2]
        assert front.silent == (2,) and front.hosts[2].doing == 'gone (signal 9)', front.format()
        assert 'process 2 is silent' in front.verdict, front.verdict
        assert timeline.silent == (2,) and timeline.hosts == (0, 1), timeline.format()
        assert took < 3.0, f'where + wavefront + timeline took {took:.1f} s'
        t0 = time.monotonic()
        with capture_output():
            view = ip.run_line_magic('mh_where', '')
        where_took = time.monotonic() - t0
        assert where_took < 3.0, f'%mh_where took {where_took:.1f} s'
        assert 'process 2 is silent' in (view.verdict or ''), view.text()
        assert 'gone (signal 9)' in view.text(), view.text()
        print(f'\n[timing] dead host: 3 calls {took:.2f} s, %mh_where {where_took:.2f} s')
    finally:
        magics.session = None
        s.stop()


# Release rotation; covered on every landing by an interrupt naming the host that does not stop:
# test_interrupt_names_the_host_that_does_not_stop (above)
@pytest.mark.release
def test_interrupt_names_a_host_blocked_in_a_real_device_collective():
    """Host 0 blocked in a gloo all-gather (host 1 never joins): named; restart recovers."""
    s = mhnotebook.start_local(2, 1, progress=False)
    try:
        s.execute(
            "import os, time, jax, numpy as np, multihost\nos.environ['MULTIHOST_CHECK'] = '0'",
            echo=False,
        )
        s.execute_async(
            'if jax.process_index() == 0:\n'
            '    multihost.process_allgather(np.ones(1 << 20, np.float32))  # waits for host 1\n'
            'else:\n'
            '    time.sleep(30)'
        )
        time.sleep(3)
        report = s.interrupt(timeout=3.0)
        assert report.running == (0,) and report.stopped == (1,), report
        assert 'process 0 did not stop within 3 s' in report.message
        assert 'device collective' in report.message and '%mh_cluster restart' in report.message
        s.restart(timeout=180)
        s.execute('import jax, multihost\nmultihost.barrier("after restart")', echo=False)
    finally:
        s.stop()
