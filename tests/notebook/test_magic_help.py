"""Magic help: ``%mh_NAME?`` of every registered magic shows a usage line and an example that
parses; ``%mh_help`` lists them all.

Walks the magics registered in a real IPython shell (``%load_ext mhnotebook``), so a
new magic without a usage block or an example fails here. No cluster is started.
"""

from __future__ import annotations

import html
import inspect
import re
from typing import Any

import pytest
from _helpers import magic_shell
from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.utils.capture import capture_output


def _mh_magics(ip: Any) -> list[tuple[str, Any]]:
    """``('%mh_x' or '%%mh', method)`` of every registered magic whose name starts with mh."""
    table = ip.magics_manager.magics
    return [
        (prefix + name, method)
        for kind, prefix in (('line', '%'), ('cell', '%%'))
        for name, method in table[kind].items()
        if name.startswith('mh')
    ]


def _question(ip: Any, form: str) -> str:
    """What ``%mh_x?`` shows, through IPython's own inspector."""
    with capture_output() as cap:
        ip.run_line_magic('pinfo', form)
    return cap.stdout


def _purpose(method: Any) -> str:
    """The first line of a magic's own docstring (magic_arguments keeps it as the description)."""
    parser = getattr(method, 'parser', None)
    doc = inspect.cleandoc(parser.description if parser else method.__doc__ or '')
    return doc.splitlines()[0] if doc else ''


def _check(ip: Any, form: str, method: Any) -> tuple[list[str], list[str]]:
    """(what is wrong with ``form?``, its example lines)."""
    shown = _question(ip, form)
    problems = []
    # magic_arguments writes the usage block as '::', a blank line, '  %name [options] ...'.
    usage = re.search(r'^::\n\n  (%\S+)', shown, re.M)
    if usage is None or usage.group(1) != form:
        problems.append(f'{form}? shows no usage block (decorate it with magic_arguments)')
    block = re.search(r'^Examples?::\n\n((?:    .*\n|\n)+)', shown, re.M)
    lines = block.group(1).splitlines() if block else []
    examples = [ln.strip() for ln in lines if ln.strip().startswith('%')]
    if not examples:
        problems.append(f'{form}? shows no "Example::" block with a line starting with {form}')
    for example in examples:
        name, _, args = example.partition(' ')
        if name != form:
            problems.append(f'{form}? example {example!r} is not a {form} line')
        elif getattr(method, 'parser', None) is not None:
            try:
                magic_arguments.parse_argstring(method, args)
            except UsageError as exc:
                problems.append(f'{form}? example {example!r} does not parse: {exc}')
    return problems, examples


def test_every_magic_shows_usage_and_an_example_that_parses():
    ip, _ = magic_shell(None)
    magics = _mh_magics(ip)
    names = {form for form, _ in magics}
    assert {'%mh_cluster', '%%mh', '%mh_layout', '%mh_where', '%mh_help'} <= names, names
    problems = []
    for form, method in magics:
        problems += _check(ip, form, method)[0]
        first = _purpose(method)
        if not (first.endswith(('.', '?')) and len(first) <= 80):
            problems.append(
                f'{form}: the purpose line (first line) {first!r} is not one short line'
            )
    assert not problems, '\n'.join(problems)


def test_mh_help_lists_every_magic_with_its_purpose_and_shortest_example():
    ip, _ = magic_shell(None)
    with capture_output() as cap:
        assert ip.run_line_magic('mh_help', '') is None
    (shown,) = cap.outputs
    text, page = shown.data['text/plain'], shown.data['text/html']
    assert text.splitlines()[0].split() == ['magic', 'what', 'it', 'answers', 'example']
    rows = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.startswith('%')}
    magics = _mh_magics(ip)
    assert sorted(rows) == sorted(form for form, _ in magics)
    assert list(rows)[:2] == ['%mh_cluster', '%%mh'] and list(rows)[-1] == '%mh_help'
    for form, method in magics:
        purpose = _purpose(method).replace('``', '')
        shortest = min(_check(ip, form, method)[1], key=len)
        assert re.fullmatch(
            rf'{re.escape(form)} +{re.escape(purpose)} +{re.escape(shortest)}', rows[form]
        ), rows[form]
        assert f'<code>{html.escape(form)}</code>' in page and html.escape(purpose) in page
    assert rows['%mh_layout'].endswith('  %mh_layout x')
    assert text.endswith('\n\nOne magic in full (usage, options, examples): %mh_layout?')
    with pytest.raises(UsageError, match='takes no arguments'):
        ip.run_line_magic('mh_help', 'layout')


def test_a_magic_without_usage_or_a_parsing_example_is_caught():
    """The walk above would catch a new magic that lacks a usage block or whose example rots."""

    @magics_class
    class Careless(Magics):
        @line_magic
        def mh_bare(self, line: str) -> None:
            """Does something, says no more."""

        @magic_arguments.magic_arguments()
        @magic_arguments.argument('name')
        @line_magic
        def mh_rotten(self, line: str) -> None:
            """Shows something.

            Example::

                %mh_rotten x --axes 0,1
            """

    ip, _ = magic_shell(None)
    ip.register_magics(Careless)
    try:
        found = dict(_mh_magics(ip))
        bare, _ = _check(ip, '%mh_bare', found['%mh_bare'])
        assert [p.split(' shows ')[1][:8] for p in bare] == ['no usage', 'no "Exam']
        rotten, examples = _check(ip, '%mh_rotten', found['%mh_rotten'])
        assert examples == ['%mh_rotten x --axes 0,1']
        assert len(rotten) == 1 and 'does not parse' in rotten[0] and '--axes' in rotten[0]
    finally:
        for name in ('mh_bare', 'mh_rotten'):
            ip.magics_manager.magics['line'].pop(name, None)
        ip.magics_manager.registry.pop('Careless', None)
