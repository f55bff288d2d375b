"""The stepper view (`mhnotebook.widgets.StepperView`) on hand-built `StepTable` models:
cell states per step and host, the divergence banner, buttons calling their callbacks."""

from __future__ import annotations

from html import unescape

from _html import elements, one
from _view_models import record, step_table

from mhnotebook import widgets as mw
from multihost import StepTable

# -- stepper view -----------------------------------------------------------------------


def _states(view):
    """(step, host) -> the state of the grid's cell, checked against its CSS class."""
    out = {}
    for td in elements(one(view.widget, 'mh-stepper-grid').value, 'mh-cell', 'td'):
        state = td['attrs']['data-state']
        assert f'mh-{state}' in td['classes']
        out[int(td['parent']['attrs']['data-seq']), int(td['attrs']['data-host'])] = state
    return out


def test_stepper_marks_cell_states():
    """Cells are passed, waiting (at the gate), mismatched (odd) or missing, per host and step."""
    v = mw.StepperView(step_table())
    assert _states(v) == {
        (3, 0): 'passed',
        (3, 1): 'passed',
        (3, 2): 'passed',
        (3, 3): 'passed',
        (4, 0): 'waiting',
        (4, 1): 'waiting',
        (4, 2): 'mismatched',
        (4, 3): 'missing',
    }
    released = StepTable.build(
        [record(5, 0), record(5, 1)], released=[5], num_processes=2, stepping=True, time=1.7e9
    )
    assert _states(mw.StepperView(released)) == {(5, 0): 'arrived', (5, 1): 'arrived'}
    grid = one(v.widget, 'mh-stepper-grid').value
    assert "barrier('c')" in unescape(grid) and 'train.py:20' in grid
    assert '/src/' not in grid.split('title=')[0]  # sites are shortened in cells


def test_stepper_banner_names_the_odd_host():
    """A divergent step puts a banner naming the odd host, its call and the majority's."""
    v = mw.StepperView(step_table())
    html = one(v.widget, 'mh-stepper-banner').value
    (b,) = elements(html, 'mh-divergent')
    assert 'Divergence at step #4' in b['text']
    assert [e['text'] for e in elements(html, 'mh-odd-host')] == ['process 2']
    assert "barrier('c')" in b['text'] and "barrier('b')" in b['text']
    assert 'processes 0-1' in b['text']
    status = one(v.widget, 'mh-stepper-status').value
    assert 'step #4' in status and 'processes 0-1 waiting' in status and 'process 3 not' in status


def test_stepper_no_banner_without_divergence():
    """Hosts that agree get no banner."""
    v = mw.StepperView(step_table(divergent=False))
    assert one(v.widget, 'mh-stepper-banner').value == ''
    assert 'mismatched' not in _states(v).values()


def test_stepper_buttons_call_callbacks_and_refresh():
    """Step, Continue and Stop call their callbacks, then the view refreshes from on_refresh."""
    calls = []
    fresh = step_table(divergent=False)
    v = mw.StepperView(
        step_table(),
        on_step=lambda: calls.append('step'),
        on_continue=lambda: calls.append('continue'),
        on_stop=lambda: calls.append('stop'),
        on_refresh=lambda: calls.append('refresh') or fresh,
    )
    one(v.widget, 'mh-step-button').click()
    assert calls == ['step', 'refresh'] and v.table is fresh
    assert one(v.widget, 'mh-stepper-banner').value == ''
    one(v.widget, 'mh-continue-button').click()
    one(v.widget, 'mh-stop-button').click()
    assert calls == ['step', 'refresh', 'continue', 'refresh', 'stop', 'refresh']


def test_stepper_refresh_rerenders():
    """Refresh calls on_refresh and shows the new table."""
    tables = [step_table(divergent=False)]
    v = mw.StepperView(step_table(), on_refresh=tables.pop)
    assert one(v.widget, 'mh-stepper-banner').value != ''
    one(v.widget, 'mh-refresh-button').click()
    assert tables == [] and one(v.widget, 'mh-stepper-banner').value == ''
    assert 'mismatched' not in _states(v).values()


def test_stepper_action_returning_a_table_is_shown():
    """A callback that returns a StepTable is shown without a separate refresh."""
    fresh = step_table(divergent=False)
    v = mw.StepperView(step_table(), on_step=lambda: fresh)
    one(v.widget, 'mh-step-button').click()
    assert v.table is fresh


def test_stepper_missing_callbacks_disable_buttons():
    """Buttons without a callback are disabled; the others are not."""
    v = mw.StepperView(step_table(), on_step=lambda: None)
    assert not one(v.widget, 'mh-step-button').disabled
    for cls in ('mh-continue-button', 'mh-stop-button', 'mh-refresh-button'):
        assert one(v.widget, cls).disabled
    assert one(v.widget, 'mh-step-button').tooltip == 'release step #4'


def test_stepper_callback_error_is_shown():
    """A callback that raises shows its error in the view instead of losing it."""

    def boom():
        raise RuntimeError('engine 3 is gone')

    v = mw.StepperView(step_table(), on_stop=boom, on_refresh=lambda: 'not a table')
    one(v.widget, 'mh-stop-button').click()
    msg = one(v.widget, 'mh-stepper-message').value
    assert 'Stop failed: RuntimeError: engine 3 is gone' in msg and elements(msg, 'mh-error')
    one(v.widget, 'mh-refresh-button').click()
    assert 'expected a multihost.StepTable' in one(v.widget, 'mh-stepper-message').value


def test_stepper_groups_identical_hosts_when_many():
    """With 40 hosts, hosts with identical columns share one; the odd host keeps its own."""
    records = [record(7, p, 'c' if p == 13 else 'b') for p in range(40)]
    table = StepTable.build(records, [], 40, True, waiting=[(7, p) for p in range(40)], time=1.0)
    v = mw.StepperView(table)
    html = one(v.widget, 'mh-stepper-grid').value
    heads = [th['text'] for th in elements(html, tag='th')[1:]]
    assert heads == ['processes 0-12, 14-39 (39 processes)', 'process 13']
    assert [th['text'] for th in elements(html, 'mh-odd-host', 'th')] == ['process 13']


def test_stepper_text_fallback():
    """The text/plain form is the table's own text grid."""
    table = step_table()
    v = mw.StepperView(table)
    assert v._repr_mimebundle_()['text/plain'] == table.format() == str(v)
