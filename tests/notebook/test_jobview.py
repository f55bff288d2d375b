"""`JobView`: one protocol for a `Session`, an `AttachedJob` and a `PostMortem` (issue 28, item 1).

Pure: the classes themselves, an attached job already detached (no endpoint
needed to show what it says then) and the wait after a release. The three
views on real jobs: `test_attach.py`, `test_postmortem.py`, `test_session*.py`.
"""

from __future__ import annotations

import pytest

import mhnotebook
from mhnotebook import AttachedJob, AttachError, JobView, PostMortem, Session, UnsupportedError
from mhnotebook._jobview import FEATURES, DataView

#: The protocol's questions; each is written once, in `JobView`.
QUESTIONS = (
    'where',
    'wavefront',
    'flight_records',
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
    """No view repeats a question's method: each comes from `JobView` (the hooks differ)."""
    for cls in (Session, AttachedJob, PostMortem):
        assert issubclass(cls, JobView), cls
        for name in QUESTIONS:
            assert name not in vars(cls), f'{cls.__name__}.{name} repeats JobView.{name}'
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


#: The data tools, each written once, in `DataView`, over the views' transport hook.
DATA_TOOLS = (
    'allgather',
    'layout',
    'diff',
    'nonfinite',
    'env_diff',
    'memory_census',
    'execute',
    'call_tool',
    'in_frame',
)


def test_the_data_tools_are_written_once_over_one_transport_hook():
    """A session and an attached job repeat no data tool (issue 45, item 1): each gives the
    hook (`_call_tool`) and `DataView` does the rest; a post-mortem has none."""
    for cls in (Session, AttachedJob):
        assert issubclass(cls, DataView), cls
        assert '_call_tool' in vars(cls), f'{cls.__name__} gives no transport hook'
        for name in DATA_TOOLS:
            assert name not in vars(cls), f'{cls.__name__}.{name} repeats DataView.{name}'
    assert not issubclass(PostMortem, DataView)


def test_one_registry_and_one_timeout_policy_for_the_data_tools():
    """Tools are named in one registry; None is its default; bad input is one clear line."""
    from multihost.engine.tools import TOOLS

    assert TOOLS['layout'].timeout == TOOLS['diff'].timeout == 120.0
    assert TOOLS['gather_meta'].timeout == 600.0 and TOOLS['run_cell'].timeout == 60.0
    assert not TOOLS['gather_write'].on_stopped and TOOLS['gather_send'].on_stopped
    assert TOOLS['layout'].namespace and not TOOLS['env_diff'].namespace
    job = AttachedJob('/x/control.json', {'num_processes': 3}, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"no engine tool 'layuot'; known: diff, env_diff"):
        job.call_tool('layuot', 'x')
    with pytest.raises(ValueError, match='timeout must be > 0 seconds, got -1'):
        job.layout('x', timeout=-1)
    with pytest.raises(ValueError, match=r"an attached job's hosts stream a gather over tcp"):
        job.allgather('x', transport='shm')
    with pytest.raises(ValueError, match='frame must be a frame number >= 0 or a function'):
        job.layout('x', frame=-1)
    with pytest.raises(AttachError, match=r'^detached from /x/control.json'):
        job.layout('x', frame='train')  # a valid frame: then the transport says it is detached


def test_a_detached_job_is_a_job_view_that_says_so():
    """The protocol holds for an `AttachedJob` with no endpoint: every question is one line."""
    job = AttachedJob('/x/control.json', {'num_processes': 3}, None)  # type: ignore[arg-type]
    assert isinstance(job, JobView) and not job.running and job.num_processes == 3
    assert job.stepping is False  # not asked: nothing to ask
    for ask in (job.where, job.wavefront, job.flight_records, job.timeline, job.step_table):
        with pytest.raises(AttachError, match=r'^detached from /x/control.json: mhnotebook\.'):
            ask()
    with pytest.raises(ValueError, match='timeout must be > 0 seconds, got 0'):
        job.where(timeout=0)
    with pytest.raises(ValueError, match='last must be a count of records >= 0, got -1'):
        job.flight_records(last=-1)


def test_public_names():
    """The protocol and its error are public."""
    assert {'JobView', 'UnsupportedError', 'AttachedJob', 'PostMortem', 'Session'} <= set(
        mhnotebook.__all__
    )
    assert issubclass(UnsupportedError, mhnotebook.SessionError)
