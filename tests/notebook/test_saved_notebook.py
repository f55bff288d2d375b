"""Saved notebooks keep every view's picture: executed in a real kernel (nbclient), written to
disk and read back, each widget output is followed by a static HTML (and PNG) picture of it,
which nbconvert (what nbviewer and GitHub-like renderers use) shows when the notebook has no
widget state, and which the live widget hides while it is alive."""

from __future__ import annotations

import base64
import re

import pytest

WIDGET = 'application/vnd.jupyter.widget-view+json'

SETUP = """\
import os
os.environ['JAX_PLATFORMS'] = 'cpu'
import jax
jax.config.update('jax_num_cpu_devices', 4)
import numpy as np
import multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from IPython.display import display
from mhnotebook.widgets import LayoutView, StepperView, TreeDiffView, WhereView
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ('a', 'b'))
x = jax.device_put(np.arange(24.0).reshape(4, 6), NamedSharding(mesh, P('a', None)))
"""

# Each view as a magic leaves it (the last expression of a cell) and through display().
CELLS = {
    'layout': 'LayoutView(multihost.describe_layout(x), multihost.check_replicas(x))',
    'treediff': "TreeDiffView(multihost.tree_diff({'w': np.ones(3), 'b': np.zeros(2)}))",
    'stepper': 'StepperView(multihost.step_table())',
    'where': 'display(WhereView(multihost.where()))',
}
EXPECT = {
    'layout': 'float32[4, 6]',
    'treediff': 'agree',
    'stepper': 'stepping off',
    'where': 'MainThread',
}


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    import nbformat  # here, not at the top: collecting the suite does not pay its import
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP)] + [
        nbformat.v4.new_code_cell(code) for code in CELLS.values()
    ]
    NotebookClient(nb, timeout=180, kernel_name='python3').execute()
    path = tmp_path_factory.mktemp('saved') / 'views.ipynb'
    nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)


def _pairs(cell):
    """(widget output, the output after it) for every widget output of the cell."""
    outs = cell.outputs
    return [
        (o, outs[i + 1] if i + 1 < len(outs) else None)
        for i, o in enumerate(outs)
        if WIDGET in o.get('data', {})
    ]


@pytest.mark.parametrize('name', list(CELLS))
def test_every_widget_output_carries_its_static_picture(saved, name):
    cell = saved.cells[1 + list(CELLS).index(name)]
    pairs = _pairs(cell)
    assert len(pairs) == 1, f'{name}: {len(pairs)} widget outputs: {cell.outputs}'
    widget, static = pairs[0]
    assert static is not None and static.output_type == 'display_data'
    html = static.data['text/html']
    assert re.search(r'class="mh-static mh-static-[0-9a-f]{12}"', html)
    assert EXPECT[name] in html
    assert widget.data['text/plain'].strip()  # the model's text, for plain-text readers
    if name == 'layout':
        png = base64.b64decode(static.data['image/png'])
        assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 1000
        assert 'src="data:image/png;base64,' in html


def test_live_widget_hides_exactly_its_own_picture(saved):
    """The widget state saved by nbclient holds, inside each displayed widget, the style
    that hides that view's picture (so a live notebook shows the picture once)."""
    state = saved.metadata['widgets']['application/vnd.jupyter.widget-state+json']['state']
    styles = [
        m['state'].get('value', '')
        for m in state.values()
        if m['model_name'] == 'HTMLModel' and '<style>.mh-static-' in m['state'].get('value', '')
    ]
    for name in CELLS:
        cell = saved.cells[1 + list(CELLS).index(name)]
        widget, static = _pairs(cell)[0]
        token = re.search(r'mh-static-([0-9a-f]{12})', static.data['text/html']).group(1)
        assert widget.data[WIDGET]['model_id'] in state
        assert sum(f'.mh-static-{token}{{display:none}}' in s for s in styles) == 1, name


def test_nbconvert_without_widget_state_shows_the_pictures(saved):
    """nbviewer's path: no widget state saved (JupyterLab's default) -> the pictures render."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.from_dict(saved)
    nb.metadata.pop('widgets', None)
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert len(re.findall(r'class="mh-static mh-static-', body)) == len(CELLS)
    for text in EXPECT.values():
        assert text in body
