"""The liveness stamps of `multihost._job._fate`, on the shared cluster's real processes.

A host whose program ended writes ``done`` to its liveness key (`_fate._done`); its
watcher thread stamps the same key every few seconds (`_fate._stamp`). A stamp the
watcher built just before ``done`` must not land after it: the key would then never
change again and process 0 would take the ended host for lost (a host that called
``sys.exit(0)`` reported lost 25 s later, and every host ended with 75).
"""

from __future__ import annotations

import threading

import jax
import pytest

from multihost._exchange import _kv
from multihost._job import _fate

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


@multiprocess(timeout=60)
def test_a_stamp_built_before_done_never_lands_after_it():
    client, me = _kv.client(), jax.process_index()
    assert client is not None
    building, go = threading.Event(), threading.Event()
    real_cross_wait = _fate._cross_wait

    def slow_cross_wait():  # the watcher is building its stamp: hold it there
        building.set()
        go.wait(20)
        return real_cross_wait()

    saved = (_fate._state.done, _fate._state.watching)
    _fate._cross_wait = slow_cross_wait
    _fate._state.watching = True
    try:
        watcher = threading.Thread(target=_fate._stamp, args=(client, me, 1), daemon=True)
        watcher.start()
        assert building.wait(20)
        _fate._done(0)  # the program ends while the watcher builds its stamp
        go.set()
        watcher.join(20)
        assert not watcher.is_alive()
        raw = _kv.get(client, _kv.key('alive', me))
        assert _kv.stamp_says_done(raw), raw  # not the stamp built before it
        # and the watcher's next stamp is not written either
        _fate._stamp(client, me, 2)
        assert _kv.stamp_says_done(_kv.get(client, _kv.key('alive', me)))
    finally:
        go.set()
        _fate._cross_wait = real_cross_wait
        _fate._state.done, _fate._state.watching = saved
        _kv.delete(client, _kv.key('alive', me))
