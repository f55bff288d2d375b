"""The wavefront verdict on a real program with nothing watched: what every host's stack shows.

Four real `jax.distributed` processes. Hosts 0, 1 and 3 wait inside orbax's
barrier (`orbax.checkpoint.multihost.sync_global_processes`: with every
process named, the coordination service's ``wait_at_barrier``; by default
jax's ``sync_global_devices``, a device collective), called from a user's
library file named ``multihost.py`` in a temporary folder; host 2 is in
``time.sleep`` in user code. A thread on host 2 asks `multihost.wavefront`
while they are there: the verdict groups hosts 0-1, 3 as waiting in the
coordination-service barrier (or a JAX collective) and host 2 in user code
in time.sleep, with the library file's folder shown.

The timeline in a notebook (`%mh_timeline`): the collectives the magics
run for the notebook (``%mh_diff``, ``%mh_env``) are not the user's steps;
the straggler verdict leaves them out and the table marks them. These
tests come first: the 4-process cluster of the wavefront tests starts
later, so the two clusters never share the machine.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest
from _helpers import local_session, magic_shell

import multihost
from multihost._exchange import _kv

MP_CLUSTER = dict(n=4, devices_per_process=2)

# -- %mh_timeline: the magics' own collectives are not the user's steps ------------------

SETUP = """\
import time, numpy as np, jax, jax.numpy as jnp, multihost
from multihost._exchange import _sequence
small = np.arange(8.0) + jax.process_index()
"""

#: On host 1, every collective a magic runs for the notebook starts 60 ms late (as an
#: engine slow to pick up the notebook's request would): the magics' late host is 1.
SLOW_MAGICS = """\
if jax.process_index() == 1:
    _hook = _sequence._enter_hook
    def _slow_for_magics(client, rec):
        if rec.site.startswith('notebook:'):
            time.sleep(0.06)
        return _hook(client, rec) if _hook is not None else None
    _sequence.set_enter_hook(_slow_for_magics)
"""

#: The user's watched (checked) step, host 3 late to it by 60 ms.
USER_STEP = """\
if jax.process_index() == 3:
    time.sleep(0.06)
user_y = user_step(user_y)
user_y.block_until_ready()
"""


@pytest.fixture(scope='module')
def notebook():
    with local_session(SETUP) as s:
        s.execute(SLOW_MAGICS, timeout=60, echo=False)
        ip, magics = magic_shell(s)
        yield s, ip
        magics.session = None


def _magics(ip, rounds: int) -> None:
    from IPython.utils.capture import capture_output

    with capture_output():
        for _ in range(rounds):
            ip.run_line_magic('mh_diff', 'small')
            ip.run_line_magic('mh_env', '')
            ip.run_line_magic('mh_allgather', 'small')


# Release rotation; covered on every landing by the where view on the real program: the orbax test;
# stragglers: test_timeline_multiprocess
@pytest.mark.release
@pytest.mark.cluster
def test_only_the_magics_own_collectives_name_no_straggler(notebook):
    """Host 1 is last at every %mh_diff / %mh_env: no straggler verdict; the steps are marked."""
    session, ip = notebook
    _magics(ip, 6)
    view = ip.run_line_magic('mh_timeline', '--last 200')
    tl = view.timeline
    magic_steps = [s for s in tl.steps if s.notebook]
    assert len(magic_steps) >= 12 and {s.magic for s in magic_steps} >= {'%mh_diff', '%mh_env'}
    # The magics' steps do have a late host (1): a verdict over them would name it.
    assert sum(s.last_host == 1 for s in magic_steps if s.complete) >= 10, view.text()
    st = tl.stragglers()
    assert st.host is None and st.steps == 0 and st.notebook >= 12, view.text()
    text = view.text()
    print(f'\n[only magics] {str(st)}')
    assert text.startswith('no step of the program with two or more processes recorded yet'), text
    assert "of the notebook's magics (%mh_diff...) left out" in text, text
    assert '[%mh_diff]' in tl.format() and '[%mh_env]' in tl.format()
    html = view.static_html()
    assert 'mh-timeline-notebook' in html and '(not counted: %mh_diff)' in html, html


@pytest.mark.cluster
def test_the_users_late_host_is_named_from_the_users_steps_only(notebook, tmp_path):
    """The user's watched step (host 3 late) interleaved with magics (host 1 late): host 3."""
    session, ip = notebook
    session.execute(
        'user_step = multihost.watch(jax.jit(lambda a: a * 0.5 + 1.0), name="user_step")\n'
        'user_y = user_step(jnp.ones(4))\n'
        'user_y.block_until_ready()\n',
        timeout=120,
        echo=False,
    )
    for _ in range(8):
        session.execute(USER_STEP, timeout=60, echo=False)
        _magics(ip, 1)
    view = ip.run_line_magic('mh_timeline', '--last 200')
    tl = view.timeline
    user = [s for s in tl.steps if s.name == 'user_step' and s.complete]
    magic = [s for s in tl.steps if s.notebook and s.complete]
    assert len(user) >= 8 and len(magic) > len(user), tl.format()
    assert not any(s.notebook for s in user)
    # Counted together, the magics' late host (1) would win: 2 magic steps per user step.
    assert sum(s.last_host == 1 for s in magic) > len(user), tl.format()
    st = tl.stragglers()
    print(f'\n[user steps] {str(st)}')
    assert st.host == 3 and st.steps == len(user) and st.share >= 0.8, tl.format()
    assert str(st).startswith('process 3 arrived last in '), str(st)
    assert f'{st.notebook} steps of the notebook' in str(st)
    from mhnotebook.widgets._timeline import render_timeline_png

    path = os.environ.get('MH_SAVE_CHART') or str(tmp_path / 'chart.png')
    with open(path, 'wb') as f:
        f.write(render_timeline_png(tl))
    print(f'[chart] {path}')


#: A user's (or a library's) file named like our package: imported under another name.
_LIBRARY = """\
from orbax.checkpoint import multihost as ocp_multihost


def wait_for_everyone(name, processes=None):
    ocp_multihost.sync_global_processes(name, timeout=120, processes=processes)
"""


@pytest.mark.cluster
def test_bg_cell_with_stepping_off_does_not_mention_the_stepper(notebook):
    """%%mh --bg with stepping off: no stepper to release anything; %mh_wait collects it."""
    from IPython.utils.capture import capture_output

    session, ip = notebook
    assert not session.stepping
    with capture_output() as cap:
        ip.run_cell_magic('mh', '--bg', 'print("bg done", jax.process_index())')
    assert 'running in the background (--bg)' in cap.stdout, cap.stdout
    assert 'stepper' not in cap.stdout and '%mh_wait collects the output' in cap.stdout, cap.stdout
    with capture_output() as cap:
        ip.run_line_magic('mh_wait', '--timeout 60')
    assert 'bg done 3' in cap.stdout, cap.stdout


# -- the wavefront: hosts in orbax's barrier, one host asleep in user code ----------------


def _library(folder: str):
    path = os.path.join(folder, 'multihost.py')
    spec = importlib.util.spec_from_file_location('userlib_multihost', path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_data(done: threading.Event) -> None:
    deadline = time.monotonic() + 90
    while not done.is_set() and time.monotonic() < deadline:
        time.sleep(0.2)  # the user's slow data loading


def _ask_until(expected: set[str], done: threading.Event, out: dict) -> None:
    """Host 2's second thread: the wavefront, until hosts 0, 1, 3 show ``expected`` kinds."""
    try:
        deadline = time.monotonic() + 60
        while True:
            wf = multihost.wavefront(timeout=10)
            kinds = {h.process: h.activity_kind for h in wf.hosts}
            there = all(kinds[p] in expected for p in (0, 1, 3))
            if (there and not any(h.waiting for h in wf.hosts)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out.update(verdict=wf.verdict, text=wf.format(), kinds=kinds)
    except Exception as exc:  # reported in the result, not lost in a thread
        out['error'] = repr(exc)
    finally:
        done.set()


def _one_host_sleeps(folder: str, processes: list[int] | None, expected: list[str]) -> dict:
    lib = _library(folder)
    pid = _kv.process_index()
    multihost.barrier('every debug thread runs', timeout=60)
    name = f'orbax-wait-{processes is not None}'
    out: dict = {}
    if pid == 2:
        done = threading.Event()
        asker = threading.Thread(target=_ask_until, args=(set(expected), done, out))
        asker.start()
        _load_data(done)
        asker.join(30)
    lib.wait_for_everyone(name, None if processes is None else set(processes))
    multihost.barrier('asked', timeout=60)
    return out


def _check(r: dict, barrier_words: str) -> str:
    assert 'error' not in r, r
    verdict = r['verdict']
    print(f'\n[verdict] {verdict}')
    assert 'no launch is pending' not in verdict, verdict
    groups = verdict.split('; ')
    waiting = next(g for g in groups if g.startswith('processes 0-1, 3 are '))
    assert barrier_words in waiting, verdict
    # The library's file is shown with its folder, so it is not taken for ours.
    assert f'{os.path.basename(r["folder"])}/multihost.py:5 in wait_for_everyone' in waiting, (
        verdict
    )
    sleeping = next(g for g in groups if g.startswith('process 2 is '))
    assert 'in user code at test_real_program_where.py:' in sleeping, verdict
    assert sleeping.endswith('in _load_data, in time.sleep'), verdict
    # One numbering: the bare '#' is the sequence number; no call count in sight.
    assert 'call #' not in verdict and '[#' not in verdict, verdict
    return verdict


@pytest.mark.parametrize(
    'processes, kinds, words',
    [
        # Every process named: orbax waits in the coordination service's barrier.
        ([0, 1, 2, 3], ['coordination'], 'waiting in a coordination-service barrier at orbax/'),
        # The default: jax's sync_global_devices, a device collective (an allgather).
        (None, ['device'], 'inside a JAX collective or device wait at orbax/'),
    ],
    ids=['wait_at_barrier', 'sync_global_devices'],
)
def test_hosts_in_orbax_barrier_and_a_sleeping_host(mp_cluster, tmp_path, processes, kinds, words):
    folder = tmp_path / 'userlib'
    folder.mkdir()
    (folder / 'multihost.py').write_text(_LIBRARY)
    results = mp_cluster.run(
        _one_host_sleeps, str(folder), processes, kinds, timeout=240, bracket=False
    )
    r = dict(results[2], folder=str(folder))
    assert r['kinds'][2] == 'sleep', r['text']
    assert all(r['kinds'][p] in kinds for p in (0, 1, 3)), r['text']
    verdict = _check(r, words)
    if processes is None:
        assert '(via sync_global_devices)' in verdict, verdict
    else:
        assert '(via sync_global_processes)' in verdict, verdict


def _save_while_one_host_sleeps(directory: str) -> dict:
    """Hosts 0, 1, 3 save a flax TrainState with a real orbax CheckpointManager; host 2 is
    still loading data (time.sleep) and joins the save later."""
    from _flax_program import checkpoint_manager, create_state, make_mesh, save

    pid = _kv.process_index()
    state = create_state(make_mesh())
    manager = checkpoint_manager(directory, save_every=1)
    multihost.barrier('state built', timeout=120)
    out: dict = {}
    if pid == 2:
        done = threading.Event()
        asker = threading.Thread(target=_ask_until, args=({'coordination', 'device'}, done, out))
        asker.start()
        _load_data(done)
        asker.join(30)
    save(manager, 0, state)
    manager.wait_until_finished()
    manager.close()
    multihost.barrier('saved', timeout=120)
    return out


# Release rotation; covered on every landing by hosts inside orbax's barrier:
# test_hosts_in_orbax_barrier_and_a_sleeping_host
@pytest.mark.release
def test_hosts_inside_a_real_orbax_checkpoint_save(mp_cluster, tmp_path):
    """orbax CheckpointManager.save on hosts 0, 1, 3 while host 2 sleeps: they are named
    inside orbax's barrier, with orbax's file and the user's save line."""
    results = mp_cluster.run(
        _save_while_one_host_sleeps, str(tmp_path / 'ckpt'), timeout=300, bracket=False
    )
    r = results[2]
    assert 'error' not in r, r
    print(f'\n[save verdict] {r["verdict"]}')
    assert r['kinds'][2] == 'sleep', r['text']
    assert all(r['kinds'][p] in ('coordination', 'device') for p in (0, 1, 3)), r['text']
    groups = r['verdict'].split('; ')
    waiting = next(g for g in groups if g.startswith('processes 0-1, 3 are '))
    assert ' at orbax/checkpoint/' in waiting, r['verdict']
    assert 'called from _flax_program.py:' in waiting and waiting.endswith(' in save'), r['verdict']
    sleeping = next(g for g in groups if g.startswith('process 2 is '))
    assert sleeping.endswith('in _load_data, in time.sleep'), r['verdict']
