"""The quickstart in a real JupyterLab, in headless Chromium driven by Playwright.

The test starts JupyterLab on a loopback port with a token (its own config,
runtime, settings and workspace folders; news and update checks off; every
cell kept in the DOM), opens the quickstart, waits for the kernel, runs all
cells, and checks what a user sees: every widget renders (and hides its
static picture), a click on a layout block shows its shard, Step and
Continue release the processes paused at the step gate while the stepper refreshes
itself, and the browser console has no error from mhnotebook or the widget
manager.

Needs Chromium (Debian's package; ``.ci/run`` installs it); a missing Chromium
fails the test unless ``MH_SKIP_BROWSER=1``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys

import pytest
from _browser import (
    QUICKSTART,
    check_quickstart_views,
    chromium,
    console_errors,
    jupyter_env,
    need_chromium,
    server,
    wait_for,
)

from multihost.testing import free_port

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the tests skip without it (need_chromium)
    PlaywrightTimeout = TimeoutError  # type: ignore[assignment,misc]

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.release]

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
    need_chromium()
    tmp = tmp_path_factory.mktemp('lab')
    work = tmp / 'work'
    work.mkdir()
    shutil.copy(QUICKSTART, work / QUICKSTART.name)
    settings = tmp / 'settings'
    _settings(settings)
    env = jupyter_env(
        tmp,
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / 'workspaces'),
    )
    token = secrets.token_hex(16)
    port = free_port()
    base = f'http://127.0.0.1:{port}'
    log_path = tmp / 'lab.log'
    argv = [
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
    ]
    with server(
        argv,
        cwd=work,
        env=env,
        log_path=log_path,
        ready_url=f'{base}/api/status?token={token}',
        timeout=120,
        what='jupyter lab',
    ):
        yield f'{base}/lab/tree/{QUICKSTART.name}?token={token}', log_path


def _ours(text: str) -> bool:
    return not any(noise.lower() in text.lower() for noise in _NOT_OURS)


def _dismiss_dialogs(page, seen: list[str]) -> None:
    """Closes every JupyterLab dialog showing (a kernel choice, a build notice, ...): its
    default button, else Escape; a dialog can open after the page looked settled, and one
    left open swallows every click."""
    for _ in range(5):
        shown = page.locator('.jp-Dialog')
        if shown.count() == 0:
            return
        dialog = shown.first
        try:
            seen.append(' '.join(dialog.inner_text(timeout=2_000).split())[:200])
            accept = dialog.locator('.jp-mod-accept')
            if accept.count():
                accept.first.click(timeout=5_000)  # e.g. "Select Kernel": take the default
            else:
                page.keyboard.press('Escape')
        except PlaywrightTimeout:
            page.keyboard.press('Escape')
        page.wait_for_timeout(500)


#: Server log lines that tell a kernel's life (its start, death, restarts, connections).
_KERNEL_LINES = re.compile(
    r'Kernel (started|shutdown|restarted)|KernelRestarter|restart|died|dead|alive|'
    r'Traceback|Error|Exception|Killed|MemoryError|No space',
    re.IGNORECASE,
)


def _what_happened(page, log_path) -> str:
    """For a failure: each cell's prompt and the end of its output as the page shows them,
    the server log's kernel lines (the whole log's, not only its tail), the kernel
    processes running, memory and disk: enough to tell a stuck cell from a dead kernel."""
    parts = []
    try:
        cells = page.locator('.jp-CodeCell')
        for i in range(cells.count()):
            cell = cells.nth(i)
            prompt = ' '.join(
                cell.locator('.jp-InputPrompt').first.inner_text(timeout=2_000).split()
            )
            source = ' '.join(
                cell.locator('.jp-InputArea-editor').first.inner_text(timeout=2_000).split()
            )
            output = ' '.join(
                cell.locator('.jp-OutputArea').first.inner_text(timeout=2_000).split()
            )
            parts.append(f'cell {i} {prompt} {source[:60]!r}: {output[-300:]!r}')
        status = page.locator('.jp-Notebook-ExecutionIndicator')
        if status.count():
            parts.append(f'kernel indicator: {status.first.get_attribute("data-status")}')
    except Exception as exc:  # the page may be gone: the rest still helps
        parts.append(f'(the page could not be read: {exc!r})')
    lines = [
        ln for ln in log_path.read_text(errors='replace').splitlines() if _KERNEL_LINES.search(ln)
    ]
    parts.append('server log, kernel lines:\n' + '\n'.join(ln[:300] for ln in lines[-60:]))
    kernels = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                cmd = f.read().replace(b'\0', b' ').decode(errors='replace')
        except OSError:
            continue
        if 'ipykernel' in cmd or 'ipyparallel' in cmd:
            kernels.append(f'{pid}: {cmd[:160]}')
    parts.append('kernel and engine processes:\n' + '\n'.join(kernels))
    with open('/proc/meminfo') as f:
        parts.append(
            ' '.join(ln.strip() for ln in f if ln.startswith(('MemAvailable', 'MemTotal')))
        )
    disk = shutil.disk_usage(log_path.parent)
    parts.append(f'disk free where the test writes: {disk.free / 2**30:.1f} GiB')
    return '\n'.join(parts)


def test_quickstart_in_jupyterlab(jupyterlab):
    """Run All in JupyterLab: widgets render, block click, Step/Continue, no console errors."""
    url, log_path = jupyterlab
    with chromium() as browser:
        page = browser.new_page(viewport={'width': 1400, 'height': 1000})
        errors = console_errors(page)
        page.goto(url, timeout=120_000)
        page.wait_for_selector('.jp-Notebook', timeout=120_000)
        # Wait for the kernel before "Run All" (else a kernel dialog swallows it).
        page.wait_for_selector(
            '.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=120_000
        )
        # "Run All" until the first cell has started: a click that lands while the
        # kernel is still settling (or under a dialog) can be lost.
        started = page.locator('.jp-CodeCell .jp-InputPrompt', has_text=re.compile(r'\[(\*|\d+)\]'))
        dialogs: list[str] = []  # the text of every dialog met on the way (in the error)
        for attempt in range(4):
            _dismiss_dialogs(page, dialogs)
            try:
                page.locator('.lm-MenuBar-item', has_text='Run').first.click(timeout=10_000)
                page.locator('.lm-Menu-item', has_text='Run All Cells').first.click(timeout=10_000)
                wait_for(lambda: started.count() > 0, 30, 'the first cell to start', page)
                break
            except (AssertionError, PlaywrightTimeout) as exc:
                page.keyboard.press('Escape')  # close a menu left open
                if attempt == 3:
                    page.screenshot(path=str(log_path.with_name('lab-not-started.png')))
                    raise AssertionError(f'Run All did not start; dialogs met: {dialogs}') from exc
        try:
            page.wait_for_selector('.mh-stepper', timeout=400_000)
        except Exception:
            page.screenshot(path=str(log_path.with_name('lab-timeout.png')), full_page=True)
            raise AssertionError(
                f'no stepper rendered; dialogs met: {dialogs}\n{_what_happened(page, log_path)}'
            ) from None

        # Every view rendered live, and hides the static picture it left behind.
        for cls in ('.mh-layout', '.mh-treediff', '.mh-where', '.mh-stepper'):
            assert page.locator(cls).count() >= 1, f'{cls} not rendered'
        # Their static pictures hidden, the layout PNG, a block click shows its shard.
        check_quickstart_views(page)
        assert 'kernel' in page.locator('.mh-treediff').first.inner_text()
        assert 'after-eval' in page.locator('.mh-where').first.inner_text()

        # The stepper: processes paused at 'load'; Step (the view refreshes itself) ...
        stepper = page.locator('.mh-stepper').last
        grid = stepper.locator('.mh-stepper-grid')

        def waiting_texts() -> list[str]:
            return grid.evaluate(
                "g => [...g.querySelectorAll('td.mh-waiting')].map(td => td.innerText)"
            )

        def paused_at(name: str):
            return lambda: (lambda t: len(t) == 4 and all(name in x for x in t))(waiting_texts())

        refresh = stepper.locator('.mh-refresh-button')
        wait_for(paused_at('load'), 90, 'processes paused at load', page, action=refresh.click)
        stepper.locator('.mh-step-button').click()
        wait_for(paused_at('train'), 60, 'the stepper showing processes at train', page)
        # ... Continue releases them all.
        stepper.locator('.mh-continue-button').click()
        wait_for(lambda: not waiting_texts(), 60, 'every host released', page)
        page.screenshot(path=str(log_path.with_name('jupyterlab.png')), full_page=True)
    log_path.with_name('console-errors.txt').write_text('\n'.join(errors))
    ours = [e for e in errors if _ours(e)]
    assert not ours, f'console errors: {ours}'
