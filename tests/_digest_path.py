"""Shared by the digest-path re-runs of the reliability tests (`test_digest_path_*`).

Their modules import the error-path tests of the reliability modules and run
them again with ``MULTIHOST_DIGEST_ABOVE=0`` (in the shared cluster's workers:
`use_the_digest_path`): at 4 hosts every round agrees
through its digest directory (`_kv.Round.agree_dir`) instead of reading every
record, and the verdicts (which hosts, which calls, the messages) must be the
ones those tests assert on the read-all path.

Only the cases in which some host reads the digest directory after a failure
are re-run: a mismatch or a failing host (more than one digest), a host late
at a barrier that is still open, an interrupt seen by a late host (``g/!``).
Each fails with the digest path's error handling broken (`Round.give_up`
writing nothing, or `Round.one_digest` taking any listing for agreement).
Not re-run, because no host reads the directory there whatever the knob:
hosts that never arrive or die (no barrier completes), a barrier the service
dropped, rounds that carry a payload (a skipper's next gather, watched
launches: ``read``), lanes whose threads time out. (Their modules, whole,
passed with ``MULTIHOST_DIGEST_ABOVE=0`` too, run by hand.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import multihost
from multihost._exchange import _kv

KNOB = 'MULTIHOST_DIGEST_ABOVE'


def use_the_digest_path() -> None:
    """In a worker (the module's ``MP_CLUSTER_ENTER``): what ``MULTIHOST_DIGEST_ABOVE=0`` sets.

    The knob is read once, at import (`_kv.DIGEST_ABOVE`), and the shared cluster's
    workers imported `_kv` long ago: set what it set, so these modules share the
    cluster of their shape instead of starting one with the variable."""
    _kv.DIGEST_ABOVE = _kv.digest_above('0')


def use_the_default_path() -> None:
    """In a worker (``MP_CLUSTER_LEAVE``): the knob as the worker's environment gives it."""
    _kv.DIGEST_ABOVE = _kv.digest_above(os.environ.get(KNOB))


@pytest.fixture(autouse=True, scope='module')
def digest_path_everywhere() -> Iterator[None]:
    """The knob for the processes the tests start themselves too (they inherit os.environ)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KNOB, '0')
        yield


def on_the_digest_path() -> dict:
    """In a worker: the knob took, and an agreeing barrier writes its digest and reads only it."""
    multihost.barrier('digest path: warm-up', timeout=30)
    before = _kv.COUNTERS.snapshot()
    multihost.barrier('digest path', timeout=30)
    used = _kv.COUNTERS.since(before)
    return dict(above=_kv.DIGEST_ABOVE, written=used.values_written, read=used.bytes_read)


def check_on_the_digest_path(results: list[dict]) -> None:
    """Every host wrote its record and its digest and read ~a digest, not 4 records (~600 B)."""
    for pid, r in enumerate(results):
        assert r['above'] == 0, (pid, r)
        # the record and `g/<digest>`; the last to arrive at the round's barrier
        # also writes its one-byte completion key (`_kv.arrive`)
        assert r['written'] in (2, 3), (pid, r)
        assert r['read'] <= 128, (pid, r)
    assert sorted(r['written'] for r in results) == [2] * (len(results) - 1) + [3], results
