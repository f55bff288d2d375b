"""Sphinx configuration of the documentation site.

Build it (after the tests, which execute the tutorials once and save them to
``build/executed/``)::

    python -m sphinx -W --keep-going -b html docs build/docs

Pages generated from the code (tutorials, magics, reference) are written by
``_ext/mhdocs.py`` at the start of every build.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / '_ext'))

import multihost  # noqa: E402  (after the path: the site documents the installed packages)

project = 'mhnotebook'
author = 'mhnotebook contributors'
copyright = 'mhnotebook contributors'  # noqa: A001 - Sphinx's name
release = version = multihost.__version__

extensions = [
    'myst_nb',  # MyST Markdown pages and notebooks (myst_parser included)
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',  # Google-style docstrings (Args: / Returns: / Raises:)
    'mhdocs',
]
exclude_patterns = ['_build', '_ext', 'Thumbs.db', '.DS_Store']

# Notebooks: rendered exactly as the tests executed them, never executed here.
nb_execution_mode = 'off'
nb_merge_streams = True  # one block per stream, as in JupyterLab
myst_heading_anchors = 3  # links to sections of API.md and ARCHITECTURE.md
myst_enable_extensions = ['colon_fence']

# Docstrings.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
add_module_names = False
default_role = 'py:obj'  # `Session` in a docstring links to it when it can

html_theme = 'furo'
html_title = f'mhnotebook {release}'
