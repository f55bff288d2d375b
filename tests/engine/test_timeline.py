"""The timeline (docs/API.md §4.5): flight records aligned into steps, who arrives last.

Pure model tests on synthetic records (no cluster), the view (PNG, static
HTML, text), and the view's static picture in headless Chromium. The run on
real processes (an injected straggler named) is in
`tests/engine/test_timeline_multiprocess.py`.
"""

from __future__ import annotations

import json
import os

import pytest
from _browser import chromium, show_static

from multihost import FlightRecord, Timeline


def rec(p, n, *, kind='launch', name='train_step', call=-1, seq=None, t=0.0, wait=None,
        state='passed'):  # fmt: skip
    return FlightRecord(n, kind, name, call, seq, 'dig', '', 'train.py:7', t, wait, state, p)


def straggler_records(num=4, steps=20, slow=3, late=0.05, unchecked=False, skewed_clock=None):
    """``steps`` watched launches on ``num`` hosts where ``slow`` arrives ``late`` s after the rest.

    Checked launches get the waits a real check gives: every host released
    at the same moment, so a host's wait is (last arrival - its arrival).
    ``skewed_clock``: (process, seconds) added to that host's wall clock.
    """
    out = {}
    for p in range(num):
        rs = []
        for k in range(steps):
            arrive = 100.0 + 0.2 * k + (late if p == slow else 0.001 * p)
            last = 100.0 + 0.2 * k + late
            clock = arrive + (skewed_clock[1] if skewed_clock and skewed_clock[0] == p else 0)
            if unchecked:
                rs.append(rec(p, k, call=k, t=clock, state='done'))
            else:
                rs.append(rec(p, k, call=k, seq=10 + k, t=clock, wait=last - arrive + 0.0002))
        out[p] = rs
    return out


# -- alignment --------------------------------------------------------------------------


def test_checked_steps_align_by_seq_and_lateness_comes_from_waits():
    """Checked entries align by seq; lateness = max wait - own wait; no clock is compared."""
    # Host 1's clock is 30 s ahead: irrelevant for checked steps.
    tl = Timeline.build(straggler_records(skewed_clock=(1, 30.0)), 4)
    assert len(tl.steps) == 20 and tl.hosts == (0, 1, 2, 3) and tl.silent == ()
    s = tl.steps[0]
    assert s.seq == 10 and s.label == 'train_step call #0' and not s.clock_compared
    assert s.complete and s.last_host == 3 and s.first_host == 0
    assert s.skew == pytest.approx(0.05)
    assert s.lateness[0] == pytest.approx(0.0)
    assert s.lateness[1] == pytest.approx(0.001)
    assert s.lateness[3] == pytest.approx(0.05)
    assert [s.seq for s in tl.steps] == list(range(10, 30))


def test_unchecked_launches_align_by_name_and_call_comparing_clocks():
    """check=False launches align by (name, call); lateness compares wall clocks (flagged)."""
    tl = Timeline.build(straggler_records(unchecked=True), 4)
    assert len(tl.steps) == 20 and tl.clock_compared
    s = tl.steps[5]
    assert s.seq is None and s.call == 5 and s.clock_compared and s.last_host == 3
    assert s.lateness[3] == pytest.approx(0.05)
    # A skewed clock shows up in wall-clock lateness (what docs/guides/your-job.md warns about).
    tl = Timeline.build(straggler_records(unchecked=True, skewed_clock=(1, 0.5)), 4)
    assert tl.steps[0].last_host == 1 and tl.steps[0].skew == pytest.approx(0.5 + 0.001)


def test_mixed_steps_and_window_edges():
    """Collectives and launches of different names interleave by time; steps that some host
    no longer holds (its window starts later) are left out; a host not there yet is missing."""
    records = {}
    for p in range(2):
        rs = [
            rec(p, 0, kind='barrier', name='ckpt', seq=4, t=10.0, wait=0.01 if p else 0.02),
            rec(p, 1, name='f', call=0, t=10.1 + 0.01 * p, state='done'),
            rec(p, 2, name='g', call=0, seq=5, t=10.2, wait=0.0 if p else 0.03),
        ]
        records[p] = rs
    # Host 1 is one step further, and its window no longer holds seq 4.
    records[1] = records[1][1:] + [rec(1, 3, kind='barrier', name='end', seq=6, t=10.5)]
    records[1][-1] = dataclass_replace(records[1][-1], state='waiting')
    tl = Timeline.build(records, 2)
    labels = [s.label for s in tl.steps]
    assert labels == [
        'f call #0',
        'g call #0',
        "barrier('end') #6",
    ]  # seq 4 dropped: outside host 1's window
    f, g, end = tl.steps
    assert f.clock_compared and f.last_host == 1 and f.lateness[1] == pytest.approx(0.01)
    assert not g.clock_compared and g.last_host == 1 and g.skew == pytest.approx(0.03)
    assert end.waiting == (1,) and end.missing == (0,) and not end.complete
    assert (
        end.describe()
        == "barrier('end') #6: process 1 waiting at its check; process 0 not there yet"
    )


def dataclass_replace(r, **kw):
    import dataclasses

    return dataclasses.replace(r, **kw)


def test_silent_hosts_and_single_host():
    """Hosts absent from the records are silent; one host alone has no skew or straggler."""
    tl = Timeline.build({0: [rec(0, 0, kind='barrier', name='b', seq=0, t=1.0, wait=0.0)]}, 4)
    assert tl.silent == (1, 2, 3)
    assert tl.steps[0].last_host is None and tl.steps[0].skew == 0.0 and not tl.steps[0].complete
    st = tl.stragglers()
    assert st.steps == 0 and st.host is None
    assert 'no step with two or more processes' in str(st)
    assert 'no records from processes 1-3' in tl.format()
    empty = Timeline.build({}, 0)
    assert empty.steps == () and 'no steps recorded' in empty.format()


# -- stragglers ------------------------------------------------------------------------------


def test_straggler_summary_names_the_host_and_its_median():
    """'process 3 arrived last in 85% of the last 20 steps (17 of 20), median +50 ms ...'."""
    records = straggler_records()
    # Three steps where host 1 is the last one instead (by 120 ms).
    for k in (2, 9, 15):
        for p in range(4):
            r = records[p][k]
            wait = 0.0002 if p == 1 else 0.1202 - (0.05 if p == 3 else 0.001 * p)
            records[p][k] = dataclass_replace(r, wait=wait)
    tl = Timeline.build(records, 4)
    st = tl.stragglers()
    assert st.host == 3 and st.steps == 20 and st.counts == {1: 3, 3: 17}
    assert st.share == pytest.approx(0.85)
    assert st.median_behind == pytest.approx(0.05)
    assert str(st) == (
        'process 3 arrived last in 85% of the last 20 steps (17 of 20), median +50 ms after '
        'the first process'
    )
    text = tl.format(last=5)
    lines = text.splitlines()
    assert lines[0] == str(st)
    assert 'the newest 5 of 20 steps:' in text
    assert lines[-2].startswith('train_step call #19') and 'process 3' in lines[-2]
    assert lines[-1] == '(per process: ms after the first process to arrive)'
    assert str(tl) == tl.format()


def test_no_consistent_straggler_is_not_named():
    """When the last host varies (and with two hosts, near chance), nobody is named."""
    records = {p: [] for p in range(4)}
    for k in range(8):
        slow = k % 4
        for p in range(4):
            records[p].append(rec(p, k, call=k, seq=k, t=k, wait=0.0 if p == slow else 0.01))
    st = Timeline.build(records, 4).stragglers()
    assert st.host is None and st.share == pytest.approx(0.25)
    assert str(st).startswith('no consistent straggler over the last 8 steps')
    two = {p: [] for p in range(2)}
    for k in range(10):
        slow = 1 if k < 6 else 0  # 60%: chance is 50%
        for p in range(2):
            two[p].append(rec(p, k, call=k, seq=k, t=k, wait=0.0 if p == slow else 0.01))
    assert Timeline.build(two, 2).stragglers().host is None


def test_clock_compared_steps_are_said_in_the_summary_and_table():
    tl = Timeline.build(straggler_records(unchecked=True, steps=6), 4)
    assert 'wall clocks compared in 6 of 6 steps' in str(tl.stragglers())
    text = tl.format()
    assert '+50 ms*' in text and 'clock skew between machines applies' in text


# -- Chrome trace ----------------------------------------------------------------------------


def test_chrome_trace_has_one_track_per_host_and_the_steps(tmp_path):
    """{"traceEvents": [...]}: metadata naming 'process N' per pid/tid, 'X' events in µs."""
    records = straggler_records(steps=3)
    records[0].append(rec(0, 3, name='log', call=0, t=101.0, state='done'))
    records[1].append(rec(1, 3, name='log', call=0, t=101.002, state='done'))
    records[2].append(rec(2, 3, name='log', call=0, t=101.001, state='done'))
    records[3].append(rec(3, 3, name='log', call=0, t=101.003, state='done'))
    tl = Timeline.build(records, 4)
    path = tl.to_chrome_trace(tmp_path / 'trace.json')
    data = json.loads(open(path).read())
    events = data['traceEvents']
    names = {
        e['pid']: e['args']['name']
        for e in events
        if e['ph'] == 'M' and e['name'] == 'process_name'
    }
    assert names == {p: f'process {p}' for p in range(4)}
    threads = {
        (e['pid'], e['tid']) for e in events if e['ph'] == 'M' and e['name'] == 'thread_name'
    }
    assert threads == {(p, p) for p in range(4)}
    xs = [e for e in events if e['ph'] == 'X']
    assert len(xs) == 4 * 4
    assert all(e['pid'] == e['tid'] and {'ts', 'dur', 'name', 'args'} <= set(e) for e in xs)
    first = [e for e in xs if e['name'] == 'train_step call #0']
    by_pid = {e['pid']: e for e in first}
    # Drawn from arrival to release: duration = the host's wait, in microseconds.
    assert by_pid[0]['dur'] == pytest.approx((0.05 + 0.0002) * 1e6)
    assert by_pid[3]['dur'] == pytest.approx(0.0002 * 1e6)
    assert by_pid[0]['ts'] == 0.0 and by_pid[3]['ts'] == pytest.approx(0.05 * 1e6)
    assert by_pid[3]['args']['arrived_last'] and not by_pid[0]['args']['arrived_last']
    assert by_pid[3]['args']['seq'] == 10 and by_pid[3]['args']['after_first_ms'] == 50.0
    logs = [e for e in xs if e['name'] == 'log #0']
    assert all(e['dur'] == 0 and e['args']['clock_compared'] for e in logs)
    assert data['otherData']['origin_unix_time'] == pytest.approx(100.0)
    assert 'process 3 arrived last' in data['otherData']['stragglers']
    assert tl.chrome_trace() == data


# -- the view ---------------------------------------------------------------------------------


def test_timeline_view_renders_chart_summary_and_table():
    """PNG chart, the straggler sentence above it, the table; stable classes; text fallback."""
    from mhnotebook.widgets import TimelineView

    tl = Timeline.build(straggler_records(), 4)
    calls = []

    def refresh():
        calls.append(1)
        return Timeline.build(straggler_records(slow=2), 4)

    view = TimelineView(tl, on_refresh=refresh)
    assert view.widget._dom_classes == ('mh-timeline',)
    html = view.static_html()
    for cls in (
        'mh-timeline',
        'mh-timeline-summary',
        'mh-timeline-chart',
        'mh-timeline-table',
        'mh-timeline-step',
        'mh-odd-host',
    ):
        assert cls in html, cls
    assert 'process 3 arrived last in 100% of the last 20 steps' in html
    assert 'data:image/png;base64,' in html
    bundle = view.static_bundle()
    assert bundle['image/png']
    png = view._chart.value
    assert bytes(png[:8]) == b'\x89PNG\r\n\x1a\n'
    assert 'mh-timeline-chart' in view._chart._dom_classes
    assert view.text() == tl.format() == view._repr_mimebundle_()['text/plain']
    assert view.text().startswith('process 3 arrived last')
    view.refresh()
    assert calls and view.timeline.stragglers().host == 2
    with pytest.raises(TypeError, match='multihost.Timeline.*got builtins.dict'):
        TimelineView({})


def test_chart_caps_rows_and_keeps_the_stragglers():
    """With more hosts than rows, the hosts most often last are drawn, and the title says so."""
    from mhnotebook.widgets._timeline import chart_hosts, render_timeline_png

    tl = Timeline.build(straggler_records(num=40, slow=37, steps=4), 40)
    hosts, capped = chart_hosts(tl, 32)
    assert capped and len(hosts) == 32 and 37 in hosts and hosts == sorted(hosts)
    assert chart_hosts(Timeline.build(straggler_records(), 4), 32) == ([0, 1, 2, 3], False)
    assert render_timeline_png(tl)[:4] == b'\x89PNG'
    assert render_timeline_png(Timeline.build({}, 0))[:4] == b'\x89PNG'  # empty: a picture too


@pytest.fixture
def show(tmp_path):
    """Shows a view's static picture in headless Chromium (1000 x 900), as a saved notebook
    does; after the test, a screenshot (``MH_TIMELINE_SCREENSHOT`` names a copy to look at)."""
    with chromium() as browser:
        page = browser.new_page(viewport={'width': 1000, 'height': 900})
        path = tmp_path / 'timeline.html'
        yield lambda view: show_static(page, path, view.static_bundle()['text/html'])
        page.screenshot(path=str(tmp_path / 'timeline.png'), full_page=True)
        shot = os.environ.get('MH_TIMELINE_SCREENSHOT')
        if shot:
            page.screenshot(path=shot, full_page=True)


@pytest.mark.browser
def test_timeline_static_picture_in_chromium(show):
    """The view's static HTML in headless Chromium: summary, chart image and table visible."""
    from mhnotebook.widgets import TimelineView

    records = straggler_records()
    for p in range(4):  # and unchecked launches, where wall clocks are compared
        records[p] += [
            rec(p, 100 + k, name='log', call=k, t=100.1 + 0.2 * k + 0.003 * p, state='done')
            for k in range(20)
        ]
    page = show(TimelineView(Timeline.build(records, 4)))
    summary = page.locator('.mh-timeline-summary')
    assert summary.is_visible()
    assert 'process 3 arrived last in' in summary.inner_text()
    assert 'clock skew between machines' in summary.inner_text()
    img = page.locator('img.mh-timeline-chart')
    assert img.is_visible()
    size = img.evaluate('i => [i.naturalWidth, i.naturalHeight, i.complete]')
    assert size[0] > 500 and size[1] > 300 and size[2], size
    rows = page.locator('.mh-timeline-step')
    assert rows.count() == 20 and rows.first.is_visible()
    assert 'process 3' in rows.first.inner_text()


def _with_magics(user_steps: int, magic_steps: int) -> dict:
    """Checked steps of the user's (host 3 late) and of the notebook's magics (host 1 late)."""
    out: dict = {p: [] for p in range(4)}
    seq = 0
    for k in range(max(user_steps, magic_steps)):
        for kind, slow, site, on in (
            ('launch', 3, 'train.py:7', k < user_steps),
            ('tree_diff', 1, 'notebook: %mh_diff params', k < magic_steps),
        ):
            if not on:
                continue
            t = 100.0 + seq * 0.1
            for p in range(4):
                arrive = t + (0.05 if p == slow else 0.001 * p)
                out[p].append(
                    FlightRecord(
                        len(out[p]), kind, 'train_step' if kind == 'launch' else 'params',
                        k if kind == 'launch' else -1, seq, 'd', '', site, arrive,
                        t + 0.05 - arrive + 0.0002, 'passed', p,
                    )
                )  # fmt: skip
            seq += 1
    return out


def test_the_notebooks_own_collectives_are_left_out_of_the_straggler_verdict():
    tl = Timeline.build(_with_magics(user_steps=6, magic_steps=8), 4)
    magic = [s for s in tl.steps if s.notebook]
    assert len(magic) == 8 and {s.magic for s in magic} == {'%mh_diff'}
    assert all(s.last_host == 1 for s in magic)  # counted, host 1 would be named (8 of 14)
    st = tl.stragglers()
    assert (st.host, st.steps, st.notebook) == (3, 6, 8)
    assert str(st).endswith("; 8 steps of the notebook's magics (%mh_diff...) left out"), str(st)
    text = tl.format()
    assert "tree_diff('params') #1 [%mh_diff]" in text and '[%mh_...]: a collective' in text
    trace = tl.chrome_trace()
    cats = {e['cat'] for e in trace['traceEvents'] if e['ph'] == 'X'}
    assert cats == {'launch', 'notebook'}
    # Only the magics' steps: no straggler, and the verdict says why.
    only = Timeline.build(_with_magics(user_steps=0, magic_steps=6), 4).stragglers()
    assert only.host is None and only.steps == 0 and only.notebook == 6
    assert str(only).startswith('no step of the program with two or more processes'), str(only)


def test_timeline_view_marks_the_notebooks_steps():
    from mhnotebook.widgets import TimelineView

    view = TimelineView(Timeline.build(_with_magics(user_steps=6, magic_steps=8), 4))
    html = view.static_html()
    assert html.count('mh-timeline-notebook') == 8 and '(not counted: %mh_diff)' in html
    assert 'process 3 arrived last in 100% of the last 6 steps' in html


@pytest.mark.browser
def test_the_notebooks_steps_marked_in_chromium(show):
    """The marked rows and the summary, as a browser shows the static picture."""
    from mhnotebook.widgets import TimelineView

    page = show(TimelineView(Timeline.build(_with_magics(user_steps=6, magic_steps=8), 4)))
    summary = page.locator('.mh-timeline-summary').inner_text()
    assert summary.startswith('process 3 arrived last in 100% of the last 6 steps'), summary
    assert "8 steps of the notebook's magics" in summary, summary
    marked = page.locator('tr.mh-timeline-notebook')
    assert marked.count() == 8 and marked.first.is_visible()
    assert '[%mh_diff]' in marked.first.inner_text()
    assert 'not counted: %mh_diff' in marked.first.inner_text()


def test_an_exact_tie_names_nobody_last():
    """Hosts sharing the latest arrival exactly: no host was last (process 0 was, before)."""

    def tied(num, steps, early=()):
        # Every host released at the same moment; ``early`` hosts waited 50 ms longer.
        return {
            p: [
                rec(p, k, call=k, seq=10 + k, t=100.0 + k, wait=0.06 if p in early else 0.01)
                for k in range(steps)
            ]
            for p in range(num)
        }

    tl = Timeline.build(tied(3, 4), 3)
    s = tl.steps[0]
    assert s.complete and s.tied == (0, 1, 2) and s.last_host is None
    assert s.tie == 'tied: all arrived together'
    assert s.describe() == 'train_step call #0: tied: all arrived together, +0.00 ms'
    straggle = tl.stragglers()
    assert straggle.steps == 4 and straggle.counts == {} and straggle.host is None
    assert 'process 0' not in tl.format() and 'tied' in tl.format()
    assert not any(
        e['args'].get('arrived_last') for e in tl.chrome_trace()['traceEvents'] if 'args' in e
    )

    tl = Timeline.build(tied(3, 4, early=(0,)), 3)
    s = tl.steps[0]
    assert s.tied == (1, 2) and s.last_host is None and s.first_host == 0
    assert s.tie == 'tied: processes 1-2' and '+50 ms' in s.describe()

    from mhnotebook.widgets import TimelineView

    view = TimelineView(tl)  # the chart colours a tie as nobody's
    table = view._table.value
    assert 'tied: processes 1-2' in table and 'mh-odd-host">' not in table
    assert view.text() == tl.format()


def _steps_at(sites: list[str], slow: int = 2, num: int = 4) -> dict:
    """One checked barrier per site (host ``slow`` late to each), every host at that site."""
    out: dict = {p: [] for p in range(num)}
    for k, site in enumerate(sites):
        t = 100.0 + k * 0.1
        for p in range(num):
            arrive = t + (0.05 if p == slow else 0.001 * p)
            out[p].append(
                FlightRecord(k, 'barrier', f'b{k}', -1, k, 'd', '', site, arrive,
                             t + 0.05 - arrive + 0.0002, 'passed', p)
            )  # fmt: skip
    return out


def test_too_few_steps_name_no_straggler_and_say_how_many_it_needs():
    """Issue 32 item 8: one step is not a straggler (it was 'last in 100% of the last 1')."""
    from multihost._debug._timeline import MIN_STEPS

    for n in range(1, MIN_STEPS):
        st = Timeline.build(_steps_at(['train.py:7'] * n), 4).stragglers()
        assert st.host is None and st.steps == n, st
        assert str(st) == (
            f'too few steps to name a straggler: {n} of the {MIN_STEPS} it needs '
            f'(process 2 arrived last in {n} of {n})'
        ), str(st)
    st = Timeline.build(_steps_at(['train.py:7'] * MIN_STEPS), 4).stragglers()
    assert st.host == 2 and str(st).startswith('process 2 arrived last in 100% of the last 5')


def test_a_users_mh_barrier_is_a_step_and_jax_made_collectives_say_where_from():
    """Issue 32 item 8: ``%mh_barrier`` counts (the user asked for it, as the program's own
    barrier would); a collective JAX made itself is marked with the function it was made in."""
    sites = ['notebook: %mh_barrier ckpt'] * 4 + ['Cell In[3], line 1 (inside jax.device_put)']
    tl = Timeline.build(_steps_at(sites), 4)
    assert not any(s.notebook for s in tl.steps)
    st = tl.stragglers()
    assert (st.host, st.steps, st.notebook) == (2, 5, 0), str(st)
    assert tl.steps[-1].inside == 'jax.device_put' and tl.steps[0].inside == ''
    assert "barrier('b4') #4 [inside jax.device_put]" in tl.format(), tl.format()
    # the other magics' collectives stay left out
    tl = Timeline.build(_steps_at(['notebook: %mh_diff params'] * 5), 4)
    assert tl.stragglers().steps == 0 and tl.stragglers().notebook == 5
