"""The layout view's static picture in a real browser (headless Debian Chromium, driven by
Playwright): synthetic layouts, no kernel, no cluster.

What a user sees must not mislead: a `P()` array is one block with a replica matrix beside it
(a cell per device, only the odd host's replicas marked), devices read
"process 1 · dev 0 (id 2048)", a 3-D array is facets (capped, the rest counted), and the mesh view
says which axes cross hosts. Screenshots go to ``/tmp/layout_*.png`` (``MH_SHOTS`` elsewhere).

Needs Chromium (``MH_CHROMIUM``, default ``/usr/bin/chromium``); ``MH_SKIP_BROWSER=1`` skips.
"""

from __future__ import annotations

import os
import pathlib

import pytest
from _browser import chromium, show_static
from _layout_cases import (
    batch_3d,
    did,
    host_by_dev,
    many_facets,
    replicated,
    report,
    rows_by_dev,
)

from mhnotebook import widgets as mw
from mhnotebook.widgets._common import CSS

pytestmark = pytest.mark.browser

SHOTS = pathlib.Path(os.environ.get('MH_SHOTS', '/tmp'))


@pytest.fixture(scope='module')
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('layout')

    def show(name, view):
        style = 'font-family:sans-serif;font-size:13px;margin:8px'
        show_static(pg, tmp / f'{name}.html', CSS + view.static_html(), style)
        pg.screenshot(path=str(SHOTS / f'layout_{name}.png'), full_page=True)
        return pg

    with chromium() as browser:
        pg = browser.new_page(viewport={'width': 1280, 'height': 800})
        yield show


def _texts(pg, selector):
    return pg.eval_on_selector_all(selector, 'els => els.map(e => e.innerText.trim())')


def _box(pg, selector):
    return pg.locator(selector).first.bounding_box()


def test_p_unspecified_is_one_block_with_a_replica_cell_per_device(page):
    """P() over 4 hosts x 2 devices, host 2's replicas odd: one block, 8 replica cells beside
    the picture, exactly host 2's two cells marked."""
    pg = page('replicated', mw.LayoutView(report(replicated())))
    assert pg.locator('.mh-layout-block').count() == 1
    assert _texts(pg, '.mh-layout-block') == ['⚠ 8 replicas: dev 0,1 of processes 0-3']
    assert pg.locator('.mh-replica-matrix').count() == 1
    assert pg.locator('.mh-replica-cell').count() == 8
    odd = pg.eval_on_selector_all(
        '.mh-replica-odd', 'els => els.map(e => e.getAttribute("title").split(":")[0])'
    )
    assert odd == [f'process 2 · dev {d} (id {did(2, d)})' for d in range(2)]
    # the odd cells look different from the others (outline), the others do not
    outlines = pg.eval_on_selector_all(
        '.mh-replica-cell', 'els => els.map(e => getComputedStyle(e).outlineStyle)'
    )
    assert outlines == ['none'] * 4 + ['solid'] * 2 + ['none'] * 2
    # beside the picture, not below it
    image, matrix = _box(pg, '.mh-layout-static img'), _box(pg, '.mh-replica-matrix')
    assert matrix['x'] >= image['x'] + image['width'] - 1
    assert matrix['y'] < image['y'] + image['height']
    # the mesh: 'host' crosses hosts, 'dev' does not
    assert [t.split()[0] for t in _texts(pg, '.mh-mesh-view tr.mh-crosses-hosts')] == ['host']
    assert [t.split()[0] for t in _texts(pg, '.mh-mesh-view tr.mh-within-host')] == ['dev']


def test_devices_read_host_dev_id_and_fit_their_blocks(page):
    """P('host', 'dev'): 8 blocks named 'host h · dev d (id n)', each label inside its block;
    the mesh view shows the same names by mesh position."""
    pg = page('host_by_dev', mw.LayoutView(host_by_dev()))
    names = [f'process {h} · dev {d} (id {did(h, d)})' for h in range(4) for d in range(2)]
    assert _texts(pg, '.mh-layout-block') == names
    overflow = pg.eval_on_selector_all(
        '.mh-layout-block', 'els => els.filter(e => e.scrollWidth > e.clientWidth + 1).length'
    )
    assert overflow == 0
    assert _texts(pg, '.mh-mesh-device') == names
    assert pg.locator('.mh-replica-matrix').count() == 0  # nothing is replicated


def test_blocks_replicated_across_hosts_each_drawn_once(page):
    """P('dev', None): 2 blocks, each on one device of every host; host 3's copies odd."""
    pg = page('rows_by_dev', mw.LayoutView(report(rows_by_dev(), lambda s: s.process_index == 3)))
    assert pg.locator('.mh-layout-block').count() == 2
    assert pg.locator('.mh-replica-matrix tr.mh-replica-row').count() == 2
    assert pg.locator('.mh-replica-cell').count() == 8
    assert pg.locator('.mh-replica-empty').count() == 8
    assert pg.locator('.mh-replica-odd.mh-host-3').count() == 2
    assert pg.locator('.mh-replica-odd').count() == 2


def test_3d_array_is_facets_over_the_leading_dimension(page):
    """float32[8, 6, 4] sharded over dims 0 and 1: 4 facets of 2 blocks, titled by dim 0."""
    pg = page('facets', mw.LayoutView(batch_3d()))
    assert _texts(pg, '.mh-layout-facet-title') == [
        '[0:2, :, :]',
        '[2:4, :, :]',
        '[4:6, :, :]',
        '[6:8, :, :]',
    ]
    assert pg.locator('.mh-layout-facet').count() == 4
    assert pg.locator('.mh-layout-facet .mh-layout-block').count() == 8
    assert pg.locator('.mh-layout-facets-more').count() == 0


def test_facets_are_capped(page):
    """40 facets: 16 drawn, the other 24 counted in words."""
    pg = page('many_facets', mw.LayoutView(many_facets()))
    assert pg.locator('.mh-layout-facet').count() == 16
    (more,) = _texts(pg, '.mh-layout-facets-more')
    assert more.startswith('+24 more facets')
    height = pg.evaluate('document.documentElement.scrollHeight')
    assert height < 1600, height  # 16 facets stay a page, not a scroll of 40
