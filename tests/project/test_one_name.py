"""One name per feature, before the first release (issue 45 item 4).

Each feature has one name in every layer; the names it had before are gone, not aliases
(nothing was released under them). A pickled model names `multihost._models`, its one home.
"""

from __future__ import annotations

import importlib
import pickle

import pytest

import mhnotebook
import multihost
from mhnotebook._jobview import JobView
from multihost import ControlClient

#: Names a feature had before it got its one name: (where, old name, the one name).
GONE = (
    (multihost, 'dump_stacks', 'where'),
    (multihost, 'find_nonfinite', 'nonfinite'),
    (ControlClient, 'stacks', 'where'),
    (ControlClient, 'records', 'flight_records'),
    (JobView, 'records', 'flight_records'),
    (mhnotebook.Session, 'records', 'flight_records'),
    (mhnotebook.AttachedJob, 'records', 'flight_records'),
    (mhnotebook.PostMortem, 'records', 'flight_records'),
    (mhnotebook, 'HostDied', 'HostDiedError'),
    (mhnotebook, 'HostGone', 'HostGoneError'),
    (mhnotebook, 'SessionTimeout', 'SessionTimeoutError'),
    (mhnotebook, 'SessionInterrupted', 'SessionInterruptedError'),
)


@pytest.mark.parametrize(('owner', 'old', 'new'), GONE, ids=[f'{o}->{n}' for _, o, n in GONE])
def test_the_old_names_are_gone_and_the_one_name_stays(owner, old, new):
    """`multihost.where`, not `dump_stacks`; `HostDiedError`, not `HostDied`; ..."""
    assert hasattr(owner, new)
    assert not hasattr(owner, old), f'{owner.__name__}.{old} is an old name of {new}'
    if isinstance(owner, type(multihost)):
        assert new in owner.__all__ and old not in owner.__all__


def test_a_feature_keeps_one_name_and_the_old_one_is_an_error():
    """`JobView.supports` knows ``'flight_records'``; ``'records'`` is an unknown feature."""
    job = mhnotebook.AttachedJob('/x/control.json', {'num_processes': 2}, None)  # type: ignore[arg-type]
    assert job.supports('flight_records')
    with pytest.raises(ValueError, match="unknown feature 'records'"):
        job.supports('records')


def test_session_timeout_is_still_a_timeout_error():
    """The one name keeps what the old one promised: ``except TimeoutError`` catches it."""
    exc = mhnotebook.SessionTimeoutError('late', pending=[1], finished=[0])
    assert isinstance(exc, TimeoutError) and isinstance(exc, mhnotebook.SessionError)
    for name in ('HostDiedError', 'HostGoneError', 'SessionInterruptedError'):
        assert issubclass(getattr(mhnotebook, name), mhnotebook.SessionError), name


def test_the_magics_have_one_name_each():
    """``%mh_nonfinite`` and ``%mh_memory_census``; ``%mh_nan`` and ``%mh_mem`` are gone."""
    from mhnotebook._magics import MultihostMagics

    line = MultihostMagics.magics['line']
    assert {'mh_nonfinite', 'mh_memory_census', 'mh_where'} <= set(line)
    assert not {'mh_nan', 'mh_mem'} & set(line)


@pytest.mark.parametrize(
    'module', ['multihost.local', 'multihost._debug._debugmodel', 'multihost._checks._diffmodel']
)
def test_the_old_modules_are_gone(module):
    """`multihost.testing`, not `multihost.local`; the models live in `multihost._models` only."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_a_model_is_pickled_under_its_one_home():
    """A pickle names the model's module in `multihost._models` and loads back equal; the
    public surface serves the same classes."""
    from multihost import _models

    rec = multihost.CollectiveRecord(3, 'barrier', 'x', '', 'a.py:1', 0.0, 0)
    data = pickle.dumps(rec, protocol=2)
    assert b'multihost._models._records' in data and pickle.loads(data) == rec
    layout = multihost.Layout.from_placements((4,), 'float32', [([(0, 2)], 0, 0), ([(2, 4)], 1, 1)])
    data = pickle.dumps(layout, protocol=2)
    assert b'multihost._models._layout' in data and pickle.loads(data) == layout
    public = set(_models.__all__) & set(multihost.__all__)
    assert all(getattr(multihost, n) is getattr(_models, n) for n in public), public
