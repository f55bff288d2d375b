"""The docs site's own Sphinx extension: pages made from the code, checks of what was built.

At ``builder-inited`` it writes, into the source tree (git-ignored, rewritten
only where they changed):

* ``tutorials/``: every ``notebooks/*.ipynb`` as ``tests/notebook/test_notebooks.py``
  executed it (``build/executed/<name>``): the site renders those copies and
  never executes a notebook. A missing or stale copy stops the build and says
  to run the tests first; with ``-D mhdocs_unexecuted=source`` (what CI passes
  when its suite executed a share of the tutorials) a missing copy gives way to
  the committed notebook, inputs only. Live widget outputs are left out: without
  a kernel they cannot render, and each is followed by its static picture (the
  ``mh-static`` output every view leaves), which the page shows.
* ``magics/``: one page per registered ``%mh_*`` magic, from its docstring and
  its argument parser, so a new magic gets its page.
* ``reference/``: one page per public module, every name of its ``__all__``
  through autodoc; each name multihost shares with
  ``jax.experimental.multihost_utils`` is followed by the items of
  ``docs/API.md`` §3 (the differences) that name it.

At ``build-finished`` it reads the built HTML: every public name has its
entry, every magic its page, every tutorial page shows its widget pictures.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pathlib
import re
import textwrap
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

DOCS = pathlib.Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
NOTEBOOKS = ROOT / 'notebooks'
EXECUTED = ROOT / 'build' / 'executed'  # written by tests/notebook/test_notebooks.py
logger = logging.getLogger(__name__)
MODULES = ('multihost', 'multihost.testing', 'mhnotebook', 'mhnotebook.widgets')
WIDGET = 'application/vnd.jupyter.widget-view+json'
STATIC = 'class="mh-static '
RUN_TESTS = (
    'The site renders the tutorials as the tests executed them: run '
    '`pytest tests/notebook/test_notebooks.py` (or the whole suite) first, then build again.'
)


def _write(path: pathlib.Path, text: str) -> None:
    """Writes ``text`` unless the file already holds it (Sphinx re-reads changed files only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _prune(folder: pathlib.Path, keep: set[str]) -> None:
    """Removes generated pages whose source is gone (a renamed notebook or magic)."""
    for path in folder.glob('*'):
        if path.is_file() and path.name not in keep:
            path.unlink()


# -- tutorials -------------------------------------------------------------------------------


def _cells(nb: dict[str, Any]) -> list[tuple[str, str]]:
    def source(c: dict[str, Any]) -> str:
        s = c.get('source', '')
        return ''.join(s) if isinstance(s, list) else s

    return [(c['cell_type'], source(c)) for c in nb['cells']]


def _without_live_widgets(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outputs a page can show: a live widget gives way to the static picture after it.

    A widget with no picture after it (none of ours) keeps its text/plain form.
    """
    kept = []
    for i, out in enumerate(outputs):
        data = out.get('data', {})
        if WIDGET in data:
            after = outputs[i + 1].get('data', {}) if i + 1 < len(outputs) else {}
            if STATIC in str(after.get('text/html', '')):
                continue
            out = {**out, 'data': {'text/plain': data.get('text/plain', '')}}
        kept.append(out)
    return kept


def write_tutorials(unexecuted: str = 'fail') -> list[str]:
    """Copies each tutorial's executed notebook to ``tutorials/``; returns their names.

    ``unexecuted``: ``'fail'`` (a tutorial without an executed copy stops the build) or
    ``'source'`` (its committed notebook, without outputs, takes the copy's place).
    """
    if unexecuted not in ('fail', 'source'):
        raise ExtensionError(f"mhdocs_unexecuted={unexecuted!r}: give 'fail' or 'source'")
    names = []
    problems = []
    from_source = []
    for path in sorted(NOTEBOOKS.glob('*.ipynb')):
        executed = EXECUTED / path.name
        if not executed.exists() and unexecuted == 'source':
            executed = path
            from_source.append(path.name)
        if not executed.exists():
            problems.append(f'notebooks/{path.name} has no executed copy in build/executed/')
            continue
        nb = json.loads(executed.read_text())
        if _cells(nb) != _cells(json.loads(path.read_text())):
            problems.append(
                f'build/executed/{path.name} is stale: notebooks/{path.name} changed since '
                'the tests executed it'
            )
            continue
        for cell in nb['cells']:
            if cell['cell_type'] == 'code':
                cell['outputs'] = _without_live_widgets(cell.get('outputs', []))
        nb['metadata'].pop('widgets', None)  # no widget state: the page loads no widget JS
        # What a kernel would have said (a source notebook has none): IPython's lexer, for
        # the `!command` lines.
        nb['metadata'].setdefault('language_info', {'name': 'python', 'pygments_lexer': 'ipython3'})
        _write(DOCS / 'tutorials' / path.name, json.dumps(nb, indent=1) + '\n')
        names.append(path.name)
    if problems:
        raise ExtensionError('; '.join(problems) + '. ' + RUN_TESTS)
    if not names:
        raise ExtensionError('no tutorials in notebooks/')
    _prune(DOCS / 'tutorials', set(names))
    if from_source:
        logger.info(
            'mhdocs: rendered without outputs (no executed copy in build/executed/): '
            + ', '.join(from_source)
        )
    return names


# -- magics ----------------------------------------------------------------------------------


def _magics() -> list[tuple[str, list[str], Any]]:
    """(function name, its forms ``['%name', ...]``, method) of every magic, in source order."""
    from mhnotebook._magics import MultihostMagics

    forms: dict[str, list[str]] = {}
    for kind, prefix in (('line', '%'), ('cell', '%%')):
        for magic, fname in MultihostMagics.magics[kind].items():
            forms.setdefault(fname, []).append(prefix + magic)
    # vars() of a class keeps the order of its body.
    return [(f, forms[f], getattr(MultihostMagics, f)) for f in vars(MultihostMagics) if f in forms]


def _magic_page(forms: list[str], method: Any) -> tuple[str, str]:
    """The page of one magic (MyST), and its one-line summary."""
    parser = getattr(method, 'parser', None)  # IPython's magic_arguments, if it takes any
    doc = inspect.cleandoc(parser.description if parser is not None else method.__doc__ or '')
    if not doc:
        raise ExtensionError(f'{forms[0]} has no docstring: its page would be empty')
    summary = doc.split('\n\n', 1)[0].replace('\n', ' ').replace('|', '\\|')  # a table cell
    title = ' / '.join(f'`{f}`' for f in forms)
    lines = [f'# {title}', '']
    if parser is not None:
        usage = textwrap.dedent(parser.format_usage().replace('::', '', 1)).strip()
        usages = [re.sub(r'^%\S+', f, usage) for f in forms]
    else:
        usages = forms
    lines += ['```text', *usages, '```', '', '```{eval-rst}', doc, '```', '']
    if parser is not None and parser._actions:
        fmt = parser._get_formatter()
        lines += ['| argument | meaning | default |', '|---|---|---|']
        for action in parser._actions:
            meaning = fmt._expand_help(action) if action.help else ''
            default = '' if action.default in (None, False) else f'`{action.default}`'
            cell = fmt._format_action_invocation(action)
            meaning = meaning.replace('|', '\\|')  # a table cell
            # Options named in the help as code (Sphinx's smart quotes would make -- a dash).
            meaning = re.sub(r'(?<![\w`-])(--?[a-z][\w-]*)', r'`\1`', meaning)
            lines.append(f'| `{cell}` | {meaning} | {default} |')
        lines.append('')
    return '\n'.join(lines) + '\n', summary


def write_magics() -> list[str]:
    """One page per magic in ``magics/`` plus their index; returns the magic function names."""
    rows, names = [], []
    for fname, forms, method in _magics():
        page, summary = _magic_page(forms, method)
        _write(DOCS / 'magics' / f'{fname}.md', page)
        names.append(fname)
        rows.append(f'| [{" / ".join(f"`{f}`" for f in forms)}]({fname}.md) | {summary} |')
    index = [
        '# Magics',
        '',
        '`%load_ext mhnotebook` registers them. Each parses its arguments and calls a',
        '`Session` method (or builds a view from its models), so everything works from',
        'Python too. Generated from the magics themselves (`mhnotebook/_magics/`).',
        '',
        '| magic | what it does |',
        '|---|---|',
        *rows,
        '',
        '```{toctree}',
        ':hidden:',
        '',
        *names,
        '```',
        '',
    ]
    _write(DOCS / 'magics' / 'index.md', '\n'.join(index))
    _prune(DOCS / 'magics', {f'{n}.md' for n in names} | {'index.md'})
    return names


# -- API reference ---------------------------------------------------------------------------

JAX_MODULE = 'jax.experimental.multihost_utils'
DIFFERENCES = '../API.md#3-differences-from-jaxexperimentalmultihost_utils'
SECTIONS = {  # kind -> (title, autodoc directive, its options)
    'drop-in': (f'The drop-in for `{JAX_MODULE}`', '', ()),
    'function': ('Functions', 'autofunction', ()),
    'class': ('Classes and models', 'autoclass', (':members:',)),
    'exception': ('Errors', 'autoexception', (':members:', ':show-inheritance:')),
    'data': ('Constants', 'autodata', ()),
}


def differences() -> dict[int, str]:
    """The numbered items of docs/API.md §3 (the differences from JAX's module), by number."""
    text = (DOCS / 'API.md').read_text()
    section = re.search(r'^## 3\..*?$(.*?)^## 4\.', text, re.S | re.M)
    if section is None:
        raise ExtensionError('docs/API.md lost its sections 3 (the differences from JAX) or 4')
    items: dict[int, list[str]] = {}
    current = None
    for line in section.group(1).splitlines():
        start = re.match(r'(\d+)\. ', line)
        if start:
            current = int(start.group(1))
            items[current] = [line]
        elif current is not None and (line.startswith(' ') or not line.strip()):
            items[current].append(line)
        else:
            current = None  # a group title (**Errors**) or prose ends the item
    # Bullets keep §3's numbers (a numbered list would renumber the items it picks).
    return {
        n: re.sub(r'^\d+\. ', f'- (§3.{n}) ', '\n'.join(lines).strip())
        for n, lines in items.items()
    }


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return 'exception' if issubclass(obj, BaseException) else 'class'
    return 'function' if callable(obj) else 'data'


def _entry(module: str, name: str, kind: str) -> str:
    _, directive, options = SECTIONS[kind]
    lines = ['```{eval-rst}', f'.. {directive}:: {module}.{name}']
    return '\n'.join([*lines, *(f'   {o}' for o in options), '```', ''])


def reference_page(module: str) -> str:
    """The reference page of one public module (MyST): its docstring, then its ``__all__``."""
    mod = importlib.import_module(module)
    shared: set[str] = set()
    items: dict[int, str] = {}
    if module == 'multihost':
        shared = {n for n in dir(importlib.import_module(JAX_MODULE)) if not n.startswith('_')}
        items = differences()
    groups: dict[str, list[str]] = {kind: [] for kind in SECTIONS}
    for name in mod.__all__:
        kind = _kind(getattr(mod, name))
        groups['drop-in' if name in shared else kind].append(name)
    lines = [f'# `{module}`', '', '```{eval-rst}', f'.. automodule:: {module}', '```', '']
    for kind, names in groups.items():
        if not names:
            continue
        lines += [f'## {SECTIONS[kind][0]}', '']
        if kind == 'drop-in':
            lines += [
                f'`import multihost as multihost_utils` works wherever `{JAX_MODULE}` is used:',
                "these are its names. Each behaves as JAX's except where",
                f'[the API contract, §3]({DIFFERENCES}) says otherwise; the items of §3 that',
                'name it follow it. §3 also lists what holds for every collective: sequence',
                'checks, bounded waits, and behaviour under `jax.jit`, `vmap` and `grad`.',
                '',
            ]
        for name in names:
            real = _kind(getattr(mod, name)) if kind == 'drop-in' else kind
            lines.append(_entry(module, name, real))
            named = [t for t in items.values() if re.search(rf'`{re.escape(name)}[`(]', t)]
            if kind == 'drop-in':
                lines += [
                    # A colon fence: a backtick fence's info string cannot hold backticks.
                    f':::{{admonition}} Differences from `{JAX_MODULE}.{name}`',
                    *(named or [f'None of its own: see [§3]({DIFFERENCES}) for every collective.']),
                    ':::',
                    '',
                ]
    return '\n'.join(lines)


def write_reference() -> None:
    """``reference/<module>.md`` for each public module."""
    for module in MODULES:
        _write(DOCS / 'reference' / f'{module}.md', reference_page(module))
    _prune(DOCS / 'reference', {f'{m}.md' for m in MODULES})


# -- the index -------------------------------------------------------------------------------

OTHER_PAGES = 'OTHER-PAGES'  # the line of index.md's last toctree that stands for them


def add_other_pages(app: Sphinx, docname: str, source: list[str]) -> None:
    """Puts every top-level page index.md does not name into its last toctree.

    A new page in docs/ is never left out of the site (Sphinx would only warn).
    """
    if docname == 'index':
        named = set(re.sub(r'\W', ' ', source[0]).split())
        others = sorted(
            d for d in app.env.found_docs if '/' not in d and d not in named | {docname}
        )
        source[0] = source[0].replace(OTHER_PAGES, '\n'.join(others))


def index_outdated(
    app: Sphinx, env: Any, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """A page added or removed changes the index's toctree: read it again."""
    return ['index'] if added or removed else []


# -- the extension ---------------------------------------------------------------------------

_made: dict[str, list[str]] = {}  # what builder-inited wrote, for the checks at the end


def generate(app: Sphinx) -> None:
    _made['tutorials'] = write_tutorials(app.config.mhdocs_unexecuted)
    _made['magics'] = write_magics()
    write_reference()


def check_site(app: Sphinx, exception: BaseException | None) -> None:
    """Reads the built HTML: every public name, magic and widget picture is on its page."""
    if exception is not None or app.builder.format != 'html':
        return
    out = pathlib.Path(app.outdir)
    problems = []
    for module in MODULES:
        page = (out / 'reference' / f'{module}.html').read_text()
        problems += [
            f'{module}.{name} has no entry in reference/{module}.html'
            for name in importlib.import_module(module).__all__
            if f'id="{module}.{name}"' not in page
        ]
    for fname, forms, _ in _magics():
        page = out / 'magics' / f'{fname}.html'
        if not page.exists() or forms[0] not in page.read_text():
            problems.append(f'{forms[0]} has no page (magics/{fname}.html)')
    for name in _made['tutorials']:
        nb = json.loads((DOCS / 'tutorials' / name).read_text())
        pictures = sum(
            STATIC in str(o.get('data', {}).get('text/html', ''))
            for c in nb['cells']
            if c['cell_type'] == 'code'
            for o in c['outputs']
        )
        page = (out / 'tutorials' / name.replace('.ipynb', '.html')).read_text()
        if page.count(STATIC) != pictures:
            problems.append(
                f'tutorials/{name}: {page.count(STATIC)} widget pictures on the page, '
                f'{pictures} in the executed notebook'
            )
    if problems:
        raise ExtensionError('the built site is incomplete: ' + '; '.join(problems))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value('mhdocs_unexecuted', 'fail', 'env', str)
    app.connect('builder-inited', generate)
    app.connect('source-read', add_other_pages)
    app.connect('env-get-outdated', index_outdated)
    app.connect('build-finished', check_site)
    return {'parallel_read_safe': True, 'parallel_write_safe': True}
