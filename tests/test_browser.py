"""The quickstart notebook's widgets in a real browser: Voila renders it (real kernel, real
4-host cluster) and headless Chromium, driven by Playwright, clicks through it.

Needs Chromium (Debian: ``apt-get install chromium``; ``.ci/run`` installs it). A missing
Chromium fails the test; set ``MH_SKIP_BROWSER=1`` to skip it knowingly.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from _helpers import wait_until

from multihost.local import free_port

pytestmark = [pytest.mark.browser, pytest.mark.cluster]

CHROMIUM = os.environ.get('MH_CHROMIUM', '/usr/bin/chromium')
NOTEBOOK = pathlib.Path(__file__).parent.parent / 'notebooks' / '01_quickstart.ipynb'
CHROMIUM_ARGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--disable-dev-shm-usage',
]


@pytest.fixture(scope='module')
def voila(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        if os.environ.get('MH_SKIP_BROWSER') == '1':
            pytest.skip('MH_SKIP_BROWSER=1 and no Chromium')
        pytest.fail(
            f'Chromium not found at {CHROMIUM}: install it (Debian: apt-get install '
            'chromium) or point MH_CHROMIUM at it; MH_SKIP_BROWSER=1 skips knowingly.'
        )
    tmp = tmp_path_factory.mktemp('voila')
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp / 'config'),
        JUPYTER_RUNTIME_DIR=str(tmp / 'runtime'),
        PYTHONUNBUFFERED='1',
    )
    port = free_port()
    log_path = tmp / 'voila.log'
    with open(log_path, 'wb') as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'voila',
                NOTEBOOK.name,
                '--no-browser',
                f'--port={port}',
                '--Voila.ip=127.0.0.1',
                '--show_tracebacks=True',
            ],
            cwd=NOTEBOOK.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f'http://127.0.0.1:{port}/'
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(url + 'voila/static/', timeout=2)
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer: the server is up
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f'voila did not start:\n{log_path.read_text()[-3000:]}')
                time.sleep(0.3)
        yield url, log_path
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # its kernel stops the engines at exit
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_for(predicate, timeout, what, page, period=0.5, action=None):
    """`wait_until`, sleeping in the page; an error means the widget was re-rendered: look again."""
    wait_until(
        predicate,
        timeout,
        what,
        period=period,
        sleep=lambda s: page.wait_for_timeout(s * 1000),
        action=action,
        retry_on=(Exception,),
    )


def test_quickstart_widgets_in_chromium(voila):
    """Layout picture drawn, block click shows its shard, flagged replicas, tree diff, where,
    and the stepper's Step/Continue buttons release hosts held at the gate."""
    from playwright.sync_api import sync_playwright

    url, log_path = voila
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(url, timeout=300_000)
            try:
                page.wait_for_selector('.mh-stepper', timeout=300_000)
            except Exception:
                raise AssertionError(
                    f'no stepper rendered; voila log:\n{log_path.read_text()[-4000:]}'
                ) from None

            # every view also left its static picture (for saved notebooks), which the live
            # widget hides: each shown once
            statics = page.locator('.mh-static')
            assert statics.count() >= 5
            assert not any(statics.nth(i).is_visible() for i in range(statics.count()))

            # 2. the layout picture is a real PNG
            width = page.eval_on_selector('img.mh-layout-image', 'img => img.naturalWidth')
            assert width > 0
            # clicking a block shows its shard (first layout: x, 8 blocks)
            layout = page.locator('.mh-layout').first
            assert layout.locator('.mh-layout-block').count() == 8
            layout.locator('.mh-layout-block').nth(3).click()
            _wait_for(
                lambda: (
                    'process' in layout.locator('.mh-layout-info').inner_text()
                    and '[4:8, 6:12]' in layout.locator('.mh-layout-info').inner_text()
                ),
                30,
                'block info',
                page,
            )
            # 3. the replicated-but-different bias is flagged
            assert page.locator('.mh-layout-block.mh-flagged').count() >= 1
            # 4. tree diff: exactly host 3's kernel cell is odd
            diff = page.locator('.mh-treediff')
            odd = diff.locator('.mh-odd-host')
            assert odd.count() >= 1 and 'kernel' in diff.inner_text()
            # 5. where: the stuck cell showed the barrier the others waited in
            assert 'after-eval' in page.locator('.mh-where').first.inner_text()

            # 6. stepper: all 4 hosts held at 'load'; Step; then at 'train'; Continue
            stepper = page.locator('.mh-stepper').last  # the one shown after the hosts started
            grid = stepper.locator('.mh-stepper-grid')
            refresh = stepper.locator('.mh-refresh-button')

            def waiting_texts():
                # one atomic read: the grid is re-rendered by every refresh
                return grid.evaluate(
                    "g => [...g.querySelectorAll('td.mh-waiting')].map(td => td.innerText)"
                )

            def held_at(name):
                return lambda: (lambda t: len(t) == 4 and all(name in x for x in t))(
                    waiting_texts()
                )

            _wait_for(held_at('load'), 60, 'hosts held at load', page, action=refresh.click)
            stepper.locator('.mh-step-button').click()
            _wait_for(held_at('train'), 60, 'hosts held at train', page, action=refresh.click)
            stepper.locator('.mh-continue-button').click()
            _wait_for(
                lambda: not waiting_texts(),
                60,
                'every host released',
                page,
                action=refresh.click,
            )
            assert 'stepping off' in stepper.inner_text() or 'stepping on' not in (
                stepper.inner_text()
            )
            page.screenshot(path=str(log_path.with_name('quickstart.png')), full_page=True)
        finally:
            browser.close()
