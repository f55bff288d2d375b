"""Scaffolding the browser tests share: Chromium, a page wait, a Jupyter or Voila server.

Importable from test modules as ``from _browser import ...``. Chromium is
Debian's (``MH_CHROMIUM``, default ``/usr/bin/chromium``; ``.ci/run`` installs
it), driven by Playwright. A missing Chromium fails a browser test unless
``MH_SKIP_BROWSER=1``, which skips it knowingly.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from _helpers import wait_until

from multihost.testing import free_port

CHROMIUM = os.environ.get('MH_CHROMIUM', '/usr/bin/chromium')
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
#: The notebook the Voila and JupyterLab tests click through.
QUICKSTART = pathlib.Path(__file__).parent.parent / 'notebooks' / '01_quickstart.ipynb'


def need_chromium() -> None:
    """Fails the test when Chromium is missing (skips it when ``MH_SKIP_BROWSER=1``)."""
    if os.path.exists(CHROMIUM):
        return
    if os.environ.get('MH_SKIP_BROWSER') == '1':
        pytest.skip('MH_SKIP_BROWSER=1 and no Chromium')
    pytest.fail(
        f'Chromium not found at {CHROMIUM}: install it (Debian: apt-get install '
        'chromium) or point MH_CHROMIUM at it; MH_SKIP_BROWSER=1 skips knowingly.'
    )


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed on exit; `need_chromium` first."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def wait_for(predicate, timeout, what, page, period=0.5, action=None) -> Any:
    """`wait_until`, sleeping in the page; an error means the widget was re-rendered: look again."""
    return wait_until(
        predicate,
        timeout,
        what,
        period=period,
        sleep=lambda s: page.wait_for_timeout(s * 1000),
        action=action,
        retry_on=(Exception,),
    )


def jupyter_env(tmp: pathlib.Path, **extra: str) -> dict[str, str]:
    """This environment with Jupyter's config and runtime folders under ``tmp``."""
    return dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp / 'config'),
        JUPYTER_RUNTIME_DIR=str(tmp / 'runtime'),
        PYTHONUNBUFFERED='1',
        **extra,
    )


@contextlib.contextmanager
def server(
    argv: Sequence[str],
    *,
    cwd: pathlib.Path,
    env: Mapping[str, str],
    log_path: pathlib.Path,
    ready_url: str,
    timeout: float,
    what: str,
    period: float = 0.5,
    any_answer: bool = False,
) -> Iterator[subprocess.Popen]:
    """Runs ``argv`` in its own session (output to ``log_path``) until the block ends.

    Ready once ``ready_url`` answers (with ``any_answer``, an HTTP error counts
    too); a server that exits or is not ready within ``timeout`` seconds fails
    the test with its log's tail. At the end its process group gets SIGTERM
    (a notebook kernel stops its engines at exit), then SIGKILL after 30 s.
    """
    with open(log_path, 'wb') as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(ready_url, timeout=2)
                break
            except OSError as e:
                if any_answer and isinstance(e, urllib.error.HTTPError):
                    break  # an HTTP error is an answer: the server is up
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f'{what} did not start:\n{log_path.read_text()[-3000:]}')
                time.sleep(period)
        yield proc
    finally:
        # Only while not reaped: a reaped pid (the server exited and `poll` saw it) may
        # be another process group's by now.
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def voila(notebook: pathlib.Path, tmp: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """Voila serving ``notebook`` (run in its folder) on a free loopback port, until the block
    ends; yields its URL and the path of its log (in ``tmp``, with its Jupyter folders)."""
    port = free_port()
    url = f'http://127.0.0.1:{port}/'
    log_path = tmp / 'voila.log'
    argv = [
        sys.executable,
        '-m',
        'voila',
        notebook.name,
        '--no-browser',
        f'--port={port}',
        '--Voila.ip=127.0.0.1',
        '--show_tracebacks=True',
    ]
    with server(
        argv,
        cwd=notebook.parent,
        env=jupyter_env(tmp),
        log_path=log_path,
        ready_url=url + 'voila/static/',
        timeout=90,
        what='voila',
        period=0.3,
        any_answer=True,
    ):
        yield url, log_path


def voila_page(
    browser: Any, url: str, log_path: pathlib.Path, selector: str, what: str, **page: Any
) -> Any:
    """A new page (``page``: Playwright's `new_page` options) on Voila's ``url`` once
    ``selector`` is there: up to 5 min, as the notebook starts its kernel and cluster first;
    else the test fails with "no <what>" and the Voila log's tail."""
    p = browser.new_page(**page)
    p.goto(url, timeout=300_000)
    try:
        p.wait_for_selector(selector, timeout=300_000)
    except Exception:
        raise AssertionError(f'no {what}; voila log:\n{log_path.read_text()[-4000:]}') from None
    return p


def show_static(page: Any, path: pathlib.Path, body: str, style: str = '') -> Any:
    """Opens ``body`` (a view's static HTML) in ``page``, as the file ``path`` (UTF-8, the
    body's inline ``style``), the way a saved notebook shows it; returns ``page``."""
    path.write_text(
        f'<!doctype html><meta charset="utf-8"><body style="{style}">{body}</body>',
        encoding='utf-8',
    )
    page.goto(path.as_uri())
    return page


def console_errors(page: Any) -> list[str]:
    """A list that fills with the page's console errors and uncaught exceptions."""
    errors: list[str] = []
    page.on('console', lambda m: errors.append(m.text) if m.type == 'error' else None)
    page.on('pageerror', lambda e: errors.append(f'page error: {e}'))
    return errors


def check_quickstart_views(page: Any) -> Any:
    """What the quickstart shows in any front end (Voila, JupyterLab); returns the first layout.

    Every view left its static picture (for saved notebooks), which the live
    widget hides (a replaced view's, closed, shows); the layout picture is a
    real PNG; a click on a layout block (the first layout: x, 8 blocks) shows
    its shard.
    """
    statics = page.locator('.mh-static')
    assert statics.count() >= 5
    # a live view hides its picture; a view that a later run of its magic replaced was
    # closed (its widget gone), so its picture shows in its place
    live = page.locator('.mh-static-hider').count()
    visible = sum(statics.nth(i).is_visible() for i in range(statics.count()))
    assert live >= 4 and visible == statics.count() - live, (live, visible, statics.count())
    width = page.eval_on_selector('img.mh-layout-image', 'img => img.naturalWidth')
    assert width > 0
    layout = page.locator('.mh-layout').first
    assert layout.locator('.mh-layout-block').count() == 8
    layout.locator('.mh-layout-block').nth(3).click()
    wait_for(
        lambda: (
            'process' in layout.locator('.mh-layout-info').inner_text()
            and '[4:8, 6:12]' in layout.locator('.mh-layout-info').inner_text()
        ),
        30,
        'block info',
        page,
    )
    return layout
