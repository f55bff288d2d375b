"""The replay view (`mhnotebook.widgets.ReplayView`) on hand-built `Replay` models: the verdict
banner, the equations around the first that parted (agreed, fed it, parted), each with its
line, gaps of agreeing equations counted, and the page in a real browser.

A real replay's view (`%mh_replay` on a real cluster) is checked in
tests/notebook/test_notebook_session.py.
"""

from __future__ import annotations

from html import unescape

import pytest
from _browser import chromium, show_static
from _html import elements
from _view_models import tree_diff, value_leaf

from mhnotebook.widgets import ReplayView
from multihost._models._replay import Equation, Replay


def _eq(i: int, primitive: str, where: str = '/job/train.py:40 in loss_fn') -> Equation:
    return Equation(
        index=i, primitive=primitive, scope='train_step > loss_fn', inputs=('f32[8,64]',),
        outputs=('f32[8,64]',), where=where,
        library='/venv/lib/python3.11/site-packages/flax/linen/linear.py:270 in __call__',
    )  # fmt: skip


def _parted() -> Replay:
    first = _eq(431, 'pure_callback', '/job/model.py:147 in faulty_chip')
    return Replay(
        name='train_step', num_processes=4, verdict='operation', runs=2, equations=432,
        total_equations=8123, first=first, difference=value_leaf(),
        fed_by=(_eq(12, 'dot_general'), _eq(430, 'add')),
        before=tuple(_eq(i, 'mul') for i in range(419, 431)), canonical=True,
    )  # fmt: skip


def test_the_first_operation_that_parts_is_marked_below_the_ones_that_agreed():
    view = ReplayView(_parted())
    summary, details, table = (c.value for c in view.widget.children)
    assert 'the first operation whose outputs part' in summary and 'faulty_chip' in summary
    rows = elements(table, 'mh-replay-eqn', 'tr')
    # the one that fed it from far back, a gap, the 12 just before it, then it
    assert [r['attrs']['class'].split()[-1] for r in rows] == (
        ['mh-replay-fed'] + ['mh-replay-agreed'] * 11 + ['mh-replay-fed', 'mh-replay-parted']
    )
    assert len(elements(table, 'mh-replay-gap', 'tr')) == 1
    assert '406 equations, agreed' in table  # 13..418
    assert 'model.py:147 in faulty_chip' in table and 'linear.py:270 in __call__' in table
    assert '#431 pure_callback at model.py:147 in faulty_chip' in summary
    assert '432 of 8123 equations evaluated' in details
    assert view.text() == view.replay.describe()


@pytest.mark.parametrize(
    'verdict, words',
    [
        ('agree', 'the hosts agree'),
        ('inputs', 'the inputs already differ between hosts'),
        ('again', "a host's own runs of the launch differ"),
    ],
)
def test_each_verdict_has_its_banner_and_no_table_without_an_operation(verdict, words):
    replay = Replay(
        name='step', num_processes=4, verdict=verdict, inputs=tree_diff(), runs=2,
        varying={2: ('[0]',)},
    )  # fmt: skip
    view = ReplayView(replay)
    summary, details, table = (c.value for c in view.widget.children)
    assert words in summary and table == ''
    if verdict == 'inputs':
        assert tree_diff().differing_paths[0] in unescape(details)
    if verdict == 'again':
        assert 'process 2: [0]' in details


@pytest.mark.browser
def test_the_replay_view_in_chromium(tmp_path):
    """Its static picture in a real browser: the parted row stands out, the page is short."""
    view = ReplayView(_parted())
    with chromium() as browser:
        page = browser.new_page(viewport={'width': 1100, 'height': 700})
        show_static(page, tmp_path / 'replay.html', view.static_html(), 'font-family:sans-serif')
        page.screenshot(path=str(tmp_path / 'replay.png'), full_page=True)
        parted = page.locator('tr.mh-replay-parted')
        assert parted.count() == 1 and parted.is_visible()
        assert 'faulty_chip' in parted.inner_text()
        colour = parted.evaluate('e => getComputedStyle(e).backgroundColor')
        agreed = page.locator('tr.mh-replay-agreed').first
        assert colour != agreed.evaluate('e => getComputedStyle(e).backgroundColor')
        assert page.evaluate('document.body.scrollHeight') < 900
        page.close()
