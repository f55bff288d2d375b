"""One noun per feature; the old names stay, as the same objects (issue 28 item 2).

Old public names are aliases, not wrappers: ``multihost.dump_stacks is multihost.where``. Models
moved to `multihost._models` still resolve at their old module paths, for imports and for pickles
made before the move.
"""

from __future__ import annotations

import pickle

import pytest

import mhnotebook
import multihost
from mhnotebook._jobview import JobViewBase
from multihost import ControlClient


def test_core_functions_keep_their_old_names():
    """`where` and `nonfinite` are the features' names; the old ones are the same functions."""
    assert multihost.dump_stacks is multihost.where
    assert multihost.find_nonfinite is multihost.nonfinite
    assert {'where', 'nonfinite', 'dump_stacks', 'find_nonfinite'} <= set(multihost.__all__)


def test_control_client_and_job_views_keep_their_old_method_names():
    """`ControlClient.where` / `.flight_records`, and `JobView.flight_records`: old names kept."""
    assert ControlClient.stacks is ControlClient.where
    assert ControlClient.records is ControlClient.flight_records
    assert JobViewBase.records is JobViewBase.flight_records
    for view in (mhnotebook.Session, mhnotebook.AttachedJob, mhnotebook.PostMortem):
        assert view.records is view.flight_records
    job = mhnotebook.AttachedJob('/x/control.json', {'num_processes': 2}, None)  # type: ignore[arg-type]
    assert job.supports('flight_records') and job.supports('records')


def test_exceptions_users_catch_end_in_error_and_keep_their_old_names():
    """`HostDiedError` & co.; a session timeout is a `TimeoutError`; old names alias them."""
    pairs = {
        'HostDied': 'HostDiedError',
        'HostGone': 'HostGoneError',
        'SessionTimeout': 'SessionTimeoutError',
        'SessionInterrupted': 'SessionInterruptedError',
    }
    for old, new in pairs.items():
        assert getattr(mhnotebook, old) is getattr(mhnotebook, new), old
        assert {old, new} <= set(mhnotebook.__all__)
        assert issubclass(getattr(mhnotebook, new), mhnotebook.SessionError)
    exc = mhnotebook.SessionTimeoutError('late', pending=[1], finished=[0])
    assert isinstance(exc, TimeoutError) and isinstance(exc, mhnotebook.SessionTimeout)
    with pytest.raises(TimeoutError, match='late'):
        raise exc


def test_magics_keep_their_old_names():
    """``%mh_nonfinite`` and ``%mh_memory_census``; ``%mh_nan`` and ``%mh_mem`` stay."""
    from mhnotebook._magics import MultihostMagics

    line = MultihostMagics.magics['line']
    assert {'mh_nonfinite', 'mh_nan', 'mh_memory_census', 'mh_mem', 'mh_where'} <= set(line)


def test_models_resolve_at_their_old_module_paths():
    """The old modules re-export the models (the same classes), so old imports still work."""
    from multihost import _models
    from multihost._checks import _diffmodel, _layout, _nonfinite, _replicas
    from multihost._debug import _debugmodel, _timeline, _wavefront
    from multihost._exchange import _sequence

    assert (
        _debugmodel.StepTable is _models.StepTable and _debugmodel.HostStacks is _models.HostStacks
    )
    assert _diffmodel.TreeDiff is _models.TreeDiff and _layout.Layout is _models.Layout
    assert _nonfinite.NonfiniteReport is _models.NonfiniteReport
    assert _replicas.ReplicaReport is _models.ReplicaReport
    assert _timeline.Timeline is _models.Timeline and _wavefront.Wavefront is _models.Wavefront
    assert _sequence.CollectiveRecord is _models.CollectiveRecord
    public = set(_models.__all__) & set(multihost.__all__)
    assert all(getattr(multihost, n) is getattr(_models, n) for n in public), public


def test_a_pickle_made_before_the_move_still_loads():
    """A pickle naming a model by its old module (``multihost._checks._diffmodel.TreeDiff``)
    loads as the model; a new pickle names `multihost._models`."""
    rec = multihost.CollectiveRecord(3, 'barrier', 'x', '', 'a.py:1', 0.0, 0)
    data = pickle.dumps(rec, protocol=2)
    assert b'multihost._models._records' in data
    old = data.replace(b'multihost._models._records', b'multihost._exchange._sequence')
    assert pickle.loads(old) == rec
    layout = multihost.Layout.from_placements((4,), 'float32', [([(0, 2)], 0, 0), ([(2, 4)], 1, 1)])
    old = pickle.dumps(layout, protocol=2).replace(
        b'multihost._models._layout', b'multihost._checks._layout'
    )
    assert pickle.loads(old) == layout
