"""`JobView`: one protocol for a `Session`, an `AttachedJob` and a `PostMortem` (issue 28, item 1).

Pure: the classes themselves, an attached job already detached (no endpoint
needed to show what it says then) and the wait after a release. The three
views on real jobs: `test_attach.py`, `test_postmortem.py`, `test_session*.py`.
"""

from __future__ import annotations

import pytest

import mhnotebook
from mhnotebook import AttachedJob, AttachError, JobView, PostMortem, Session, UnsupportedError
from mhnotebook._jobview import FEATURES, DataView, JobViewBase

#: The protocol's questions; each is written once, in `JobViewBase`.
QUESTIONS = (
    'where',
    'wavefront',
    'flight_records',
    'records',
    'timeline',
    'step_table',
    'set_stepping',
    'release',
    'release_all',
    'moved_on',
    'stop_stepping',
    'supports',
    'stepping',
)


def test_the_three_views_share_one_implementation():
    """No view repeats a question's method: each comes from `JobViewBase` (the hooks differ)."""
    for cls in (Session, AttachedJob, PostMortem):
        assert issubclass(cls, JobViewBase), cls
        for name in QUESTIONS:
            assert name not in vars(cls), f'{cls.__name__}.{name} repeats JobViewBase.{name}'
    assert [c.kind for c in (Session, AttachedJob, PostMortem)] == [
        'session',
        'attached job',
        'post-mortem',
    ]
    assert Session.live and AttachedJob.live and not PostMortem.live


def test_features_say_what_each_view_can_do():
    """Live views step; a post-mortem reads only; an unknown feature is named."""
    assert Session.features == AttachedJob.features == frozenset(FEATURES)
    assert PostMortem.features == frozenset(FEATURES) - {'step', 'data'}
    job = AttachedJob('/x/control.json', {'num_processes': 3}, None)  # type: ignore[arg-type]
    assert job.supports('step') and job.supports('where') and job.supports('data')
    assert isinstance(job, DataView) and not hasattr(PostMortem, 'allgather')
    with pytest.raises(ValueError, match="unknown feature 'steps'; one of where, wavefront"):
        job.supports('steps')


def test_a_detached_job_is_a_job_view_that_says_so():
    """The protocol holds for an `AttachedJob` with no endpoint: every question is one line."""
    job = AttachedJob('/x/control.json', {'num_processes': 3}, None)  # type: ignore[arg-type]
    assert isinstance(job, JobView) and not job.running and job.num_processes == 3
    assert job.stepping is False  # not asked: nothing to ask
    for ask in (job.where, job.wavefront, job.records, job.timeline, job.step_table):
        with pytest.raises(AttachError, match=r'^detached from /x/control.json: mhnotebook\.'):
            ask()
    with pytest.raises(ValueError, match='timeout must be > 0 seconds, got 0'):
        job.where(timeout=0)
    with pytest.raises(ValueError, match='last must be a count of records >= 0, got -1'):
        job.records(last=-1)


def test_public_names():
    """The protocol and its error are public; the old names stay where they were."""
    assert {'JobView', 'UnsupportedError', 'AttachedJob', 'PostMortem', 'Session'} <= set(
        mhnotebook.__all__
    )
    assert issubclass(UnsupportedError, mhnotebook.SessionError)
