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
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest

import multihost
from multihost import _kv

MP_CLUSTER = dict(n=4, devices_per_process=2)

#: A user's (or a library's) file named like our package: imported under another name.
_LIBRARY = """\
from orbax.checkpoint import multihost as ocp_multihost


def wait_for_everyone(name, processes=None):
    ocp_multihost.sync_global_processes(name, timeout=120, processes=processes)
"""


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
            if all(kinds[p] in expected for p in (0, 1, 3)) or time.monotonic() > deadline:
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
