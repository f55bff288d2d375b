"""The quickstart in a real JupyterLab, in headless Chromium driven by Playwright.

The test starts JupyterLab on a loopback port with a token (its own config,
runtime, settings and workspace folders; news and update checks off; every
cell kept in the DOM), opens the quickstart, waits for the kernel, runs all
cells, and checks what a user sees: every widget renders (and hides its
static picture), a click on a layout block shows its shard, Step and
Continue release the hosts held at the step gate while the stepper refreshes
itself, and the browser console has no error from mhnotebook or the widget
manager.

Needs Chromium (Debian's package; ``.ci/run`` installs it); a missing Chromium
fails the test unless ``MH_SKIP_BROWSER=1``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from test_browser import CHROMIUM, CHROMIUM_ARGS, NOTEBOOK, _wait_for

from multihost.local import free_port

pytestmark = [pytest.mark.browser, pytest.mark.cluster]

#: Console messages that are JupyterLab's own, not ours (its news feed and extension
#: manager, both switched off here, and missing icons); any other message at level
#: "error" fails the test. (With the settings above, a run here logged none at all.)
_NOT_OURS = (
    'favicon',
    'fetchNews',
    'jupyterlab news',
    'extension manager',
    'Failed to load resource: the server responded with a status of 404',
)


def _settings(root) -> None:
    """JupyterLab user settings: no news or update checks, every cell in the DOM."""
    overrides = {
        '@jupyterlab/apputils-extension/notification.jupyterlab-settings': {
            'fetchNews': 'false',
            'checkForUpdates': False,
        },
        '@jupyterlab/notebook-extension/tracker.jupyterlab-settings': {
            'windowingMode': 'none',
        },
    }
    for rel, value in overrides.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@pytest.fixture(scope='module')
def jupyterlab(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        if os.environ.get('MH_SKIP_BROWSER') == '1':
            pytest.skip('MH_SKIP_BROWSER=1 and no Chromium')
        pytest.fail(
            f'Chromium not found at {CHROMIUM}: install it (Debian: apt-get install '
            'chromium) or point MH_CHROMIUM at it; MH_SKIP_BROWSER=1 skips knowingly.'
        )
    tmp = tmp_path_factory.mktemp('lab')
    work = tmp / 'work'
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    settings = tmp / 'settings'
    _settings(settings)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp / 'config'),
        JUPYTER_RUNTIME_DIR=str(tmp / 'runtime'),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / 'workspaces'),
        PYTHONUNBUFFERED='1',
    )
    token = secrets.token_hex(16)
    port = free_port()
    log_path = tmp / 'lab.log'
    with open(log_path, 'wb') as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'jupyterlab',
                '--no-browser',
                '--allow-root',
                f'--port={port}',
                '--ServerApp.ip=127.0.0.1',
                f'--IdentityProvider.token={token}',
                f'--ServerApp.root_dir={work}',
                '--LabApp.news_url=',
                '--ServerApp.disable_check_xsrf=False',
            ],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f'http://127.0.0.1:{port}'
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f'{base}/api/status?token={token}', timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f'jupyter lab did not start:\n{log_path.read_text()[-3000:]}')
                time.sleep(0.5)
        yield f'{base}/lab/tree/{NOTEBOOK.name}?token={token}', log_path
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the kernel stops its engines at exit
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def _ours(text: str) -> bool:
    return not any(noise.lower() in text.lower() for noise in _NOT_OURS)


def test_quickstart_in_jupyterlab(jupyterlab):
    """Run All in JupyterLab: widgets render, block click, Step/Continue, no console errors."""
    from playwright.sync_api import sync_playwright

    url, log_path = jupyterlab
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={'width': 1400, 'height': 1000})
            page.on('console', lambda m: errors.append(m.text) if m.type == 'error' else None)
            page.on('pageerror', lambda e: errors.append(f'page error: {e}'))
            page.goto(url, timeout=120_000)
            page.wait_for_selector('.jp-Notebook', timeout=120_000)
            # Wait for the kernel before "Run All" (else a kernel dialog swallows it).
            page.wait_for_selector(
                '.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=120_000
            )
            page.locator('.lm-MenuBar-item', has_text='Run').first.click()
            page.locator('.lm-Menu-item', has_text='Run All Cells').first.click()
            try:
                page.wait_for_selector('.mh-stepper', timeout=400_000)
            except Exception:
                page.screenshot(path=str(log_path.with_name('lab-timeout.png')), full_page=True)
                raise AssertionError(
                    f'no stepper rendered; lab log:\n{log_path.read_text()[-4000:]}'
                ) from None

            # Every view rendered live, and hides the static picture it left behind.
            for cls in ('.mh-layout', '.mh-treediff', '.mh-where', '.mh-stepper'):
                assert page.locator(cls).count() >= 1, f'{cls} not rendered'
            statics = page.locator('.mh-static')
            assert statics.count() >= 5
            assert not any(statics.nth(i).is_visible() for i in range(statics.count()))
            width = page.eval_on_selector('img.mh-layout-image', 'img => img.naturalWidth')
            assert width > 0

            # A click on a layout block shows its shard.
            layout = page.locator('.mh-layout').first
            assert layout.locator('.mh-layout-block').count() == 8
            layout.locator('.mh-layout-block').nth(3).click()
            _wait_for(
                lambda: '[4:8, 6:12]' in layout.locator('.mh-layout-info').inner_text(),
                30,
                'block info',
                page,
            )
            assert 'kernel' in page.locator('.mh-treediff').first.inner_text()
            assert 'after-eval' in page.locator('.mh-where').first.inner_text()

            # The stepper: hosts held at 'load'; Step (the view refreshes itself) ...
            stepper = page.locator('.mh-stepper').last
            grid = stepper.locator('.mh-stepper-grid')

            def waiting_texts() -> list[str]:
                return grid.evaluate(
                    "g => [...g.querySelectorAll('td.mh-waiting')].map(td => td.innerText)"
                )

            def held_at(name: str):
                return lambda: (lambda t: len(t) == 4 and all(name in x for x in t))(
                    waiting_texts()
                )

            refresh = stepper.locator('.mh-refresh-button')
            _wait_for(held_at('load'), 90, 'hosts held at load', page, action=refresh.click)
            stepper.locator('.mh-step-button').click()
            _wait_for(held_at('train'), 60, 'the stepper showing hosts at train', page)
            # ... Continue releases them all.
            stepper.locator('.mh-continue-button').click()
            _wait_for(lambda: not waiting_texts(), 60, 'every host released', page)
            page.screenshot(path=str(log_path.with_name('jupyterlab.png')), full_page=True)
        finally:
            browser.close()
    log_path.with_name('console-errors.txt').write_text('\n'.join(errors))
    ours = [e for e in errors if _ours(e)]
    assert not ours, f'console errors: {ours}'
