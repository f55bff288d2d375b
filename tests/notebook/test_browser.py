"""The quickstart notebook's widgets in a real browser: Voila renders it (real kernel, real
4-host cluster) and headless Chromium, driven by Playwright, clicks through it.

Needs Chromium (Debian: ``apt-get install chromium``; ``.ci/run`` installs it). A missing
Chromium fails the test; set ``MH_SKIP_BROWSER=1`` to skip it knowingly.
"""

from __future__ import annotations

import pytest
from _browser import (
    QUICKSTART,
    check_quickstart_views,
    chromium,
    need_chromium,
    voila,
    voila_page,
    wait_for,
)

# Release rotation; covered on every landing by widgets in Chromium:
# tests/notebook/test_layout_browser.py; the quickstart's widgets:
# tests/notebook/test_saved_notebook.py
pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.release]


@pytest.fixture(scope='module')
def quickstart(tmp_path_factory):
    need_chromium()
    with voila(QUICKSTART, tmp_path_factory.mktemp('voila')) as served:
        yield served


def test_quickstart_widgets_in_chromium(quickstart):
    """Layout picture drawn, block click shows its shard, flagged replicas, tree diff, where,
    and the stepper's Step/Continue buttons release processes paused at the gate."""
    url, log_path = quickstart
    with chromium() as browser:
        page = voila_page(browser, url, log_path, '.mh-stepper', 'stepper rendered')

        # every view's static picture hidden, the layout PNG, a block click shows its shard
        check_quickstart_views(page)
        # 3. the replicated-but-different bias is flagged
        assert page.locator('.mh-layout-block.mh-flagged').count() >= 1
        # 4. tree diff: exactly host 3's kernel cell is odd
        diff = page.locator('.mh-treediff')
        odd = diff.locator('.mh-odd-host')
        assert odd.count() >= 1 and 'kernel' in diff.inner_text()
        # 5. where: the stuck cell showed the barrier the others waited in
        assert 'after-eval' in page.locator('.mh-where').first.inner_text()

        # 6. stepper: all 4 processes paused at 'load'; Step; then at 'train'; Continue
        stepper = page.locator('.mh-stepper').last  # the one shown after the hosts started
        grid = stepper.locator('.mh-stepper-grid')
        refresh = stepper.locator('.mh-refresh-button')

        def waiting_texts():
            # one atomic read: the grid is re-rendered by every refresh
            return grid.evaluate(
                "g => [...g.querySelectorAll('td.mh-waiting')].map(td => td.innerText)"
            )

        def paused_at(name):
            return lambda: (lambda t: len(t) == 4 and all(name in x for x in t))(waiting_texts())

        wait_for(paused_at('load'), 60, 'processes paused at load', page, action=refresh.click)
        stepper.locator('.mh-step-button').click()
        wait_for(paused_at('train'), 60, 'processes paused at train', page, action=refresh.click)
        stepper.locator('.mh-continue-button').click()
        wait_for(
            lambda: not waiting_texts(),
            60,
            'every host released',
            page,
            action=refresh.click,
        )
        assert 'stepping off' in stepper.inner_text() or 'stepping on' not in (stepper.inner_text())
        page.screenshot(path=str(log_path.with_name('quickstart.png')), full_page=True)
