"""What every notebook view (`mhnotebook.widgets`) shares: the public surface, models checked
on arrival, and synced widget state that is JSON and small (a recording comm).

Each view's own tests are in its file: test_layout_view.py, test_treediff_view.py,
test_stepper_view.py, test_where_view.py, test_timeline.py, test_census_views.py,
test_nonfinite_views.py, test_replay_view.py.
"""

from __future__ import annotations

import json

import comm
import numpy as np
import pytest
from _html import one
from _layout_cases import layout_3d, on_devices, report
from _view_models import host_stacks, step_table, tree_diff
from ipywidgets.widgets.widget import _remove_buffers

from mhnotebook import widgets as mw

# -- every view --------------------------------------------------------------------------


def test_public_surface():
    """`mhnotebook.widgets` exports exactly its sorted `__all__`."""
    assert (
        mw.__all__
        == sorted(mw.__all__)
        == [
            'AuditView',
            'EnvView',
            'GridBlock',
            'LayoutGrid',
            'LayoutView',
            'MemoryView',
            'NonfiniteView',
            'ReplayView',
            'StepperView',
            'TimelineView',
            'TreeDiffView',
            'TreeLayoutView',
            'WhereView',
            'host_color',
            'layout_grid',
            'render_layout_png',
            'render_memory_png',
            'render_timeline_png',
        ]
    )
    assert all(hasattr(mw, name) for name in mw.__all__)


def test_views_reject_wrong_models():
    """Each view raises TypeError naming the model it expects and what arrived."""
    with pytest.raises(TypeError, match='multihost.Layout.*got builtins.dict'):
        mw.LayoutView({})
    with pytest.raises(TypeError, match='multihost.TreeDiff.*got builtins.str'):
        mw.TreeDiffView('x')
    with pytest.raises(TypeError, match='multihost.StepTable.*got builtins.list'):
        mw.StepperView([])
    with pytest.raises(TypeError, match='multihost.AuditReport.*got builtins.dict'):
        mw.AuditView({})
    with pytest.raises(TypeError, match='multihost.Replay.*got builtins.str'):
        mw.ReplayView('x')
    with pytest.raises(TypeError, match='multihost.HostStacks.*got builtins.int'):
        mw.WhereView({0: 1})


class _RecordingComm(comm.DummyComm):
    log: list = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        self.log.append((msg_type, data, buffers or [], self.comm_id))


@pytest.fixture
def comm_log(monkeypatch):
    """Every comm message widgets send (open and state updates), recorded."""
    log = []
    monkeypatch.setattr(_RecordingComm, 'log', log)
    monkeypatch.setattr(comm, 'create_comm', lambda *a, **k: _RecordingComm(*a, **k))
    return log


def test_widget_state_serializes_and_stays_small(comm_log):
    """Every view's synced state is JSON (binary only in buffers), small, and updates go out."""
    values = np.arange(48, dtype=np.float32).reshape(4, 6, 2)
    layout = layout_3d()
    views = [
        mw.LayoutView(layout, report(layout, on_devices(7)), values),
        mw.TreeDiffView(tree_diff()),
        mw.StepperView(step_table(), on_step=lambda: None),
        mw.WhereView(host_stacks()),
    ]
    views[0].select(((2, 4), (0, 6), (1, 2)))
    views[1].expand("['params']['w']")
    assert {m[0] for m in comm_log} <= {'comm_open', 'comm_msg', 'comm_close'}
    opened = {m[3] for m in comm_log if m[0] == 'comm_open'}
    assert all(v.widget.model_id in opened for v in views)
    text_bytes = binary_bytes = 0
    for _, data, buffers, _ in comm_log:
        text_bytes += len(json.dumps(data))  # raises on anything that is not JSON
        binary_bytes += sum(len(memoryview(b).cast('B')) for b in buffers)
    assert text_bytes < 200_000, text_bytes
    assert 0 < binary_bytes < 500_000, binary_bytes  # the PNGs travel as binary buffers
    # The selection reached the frontend: the info widget's last update shows the block.
    info = one(views[0].widget, 'mh-layout-info')
    sent = [
        m[1]['state']['value']
        for m in comm_log
        if m[3] == info.model_id and m[0] == 'comm_msg' and 'value' in m[1].get('state', {})
    ]
    assert sent and '[2:4, 0:6, 1:2]' in sent[-1]
    for v in views:
        state, _, _ = _remove_buffers(v.widget.get_state())
        json.dumps(state)


def test_refresh_errors_become_messages_in_every_refreshable_view():
    """The where, timeline and stepper views share one Refresh (`RefreshableView`): an error
    raised by ``on_refresh``, or a model the view cannot show, is a message in the view."""
    from _view_models import step_table

    import multihost
    from mhnotebook.widgets._common import RefreshableView

    def boom():
        raise IndexError('no host answered')

    views = [
        (mw.WhereView(host_stacks(), on_refresh=boom), 'mh-where-message'),
        (
            mw.TimelineView(multihost.Timeline.build([], num_processes=2), on_refresh=boom),
            'mh-timeline-message',
        ),  # fmt: skip
        (mw.StepperView(step_table(), on_refresh=boom), 'mh-stepper-message'),
    ]
    for view, cls in views:
        assert isinstance(view, RefreshableView)
        view.refresh()
        assert 'Refresh failed: IndexError: no host answered' in one(view.widget, cls).value
        view._on_refresh = lambda: 5  # a model no view shows
        view.refresh()
        said = one(view.widget, cls).value
        assert 'Refresh: on_refresh returned something this view cannot show' in said, said
