"""Every option of `install` and ``multihost run`` declared once (`_options.OPTIONS`).

The table drives the command line, `install`'s keywords, the environment and the docs: each
test takes the table and asks one reader whether it agrees, so an option added to the table
is checked everywhere without a line here, and a reader written by hand beside it fails.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

import multihost
from multihost._debug import _hold
from multihost._job import _cli, _install, _options, _run
from multihost._job._options import OPTIONS, InstallOptions

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
API = ROOT / 'docs' / 'API.md'


@pytest.fixture
def clean(monkeypatch: Any):
    """No option's variable set, nothing installed before or after."""
    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    multihost.uninstall()
    yield
    multihost.uninstall()


def _good(option: _options.Option, tmp_path: pathlib.Path) -> tuple[str, Any]:
    """A value of ``option`` as text, and what it resolves to."""
    folder = tmp_path / option.name
    folder.mkdir(exist_ok=True)
    return {
        'S': ('5', 5.0),
        'N': ('7', 7),
        'PATH': (str(folder / 'c.json'), str(folder / 'c.json')),
        'HOST': ('0.0.0.0', '0.0.0.0'),
        'DIR': (str(folder), str(folder)),
    }[option.metavar]


#: A bad value of each kind, as text, and the words the error says it needs.
_BAD = {
    'S': ('soon', 'needs a number of seconds'),
    'N': ('often', 'needs N, a whole number'),
    'PATH': (3, 'needs a string'),
    'HOST': (3, 'needs a string'),
    'DIR': (3, 'needs a string'),
}
VALUED = [o for o in OPTIONS if not o.is_flag]
FLAGS = [o for o in OPTIONS if o.is_flag]


def _resolved(options: InstallOptions, name: str) -> Any:
    """An option's value in the resolved options (hold-on-error's in its own part)."""
    if name == 'hold_on_error':
        return options.hold.enabled
    if name == 'hold_for':
        return options.hold.hold_for
    return getattr(options, name)


def test_the_docs_reference_is_the_tables():
    """docs/API.md holds `reference_markdown` between its markers, so the docs cannot drift."""
    text = API.read_text()
    start = text.index(_options.REFERENCE_BEGIN)
    end = text.index(_options.REFERENCE_END) + len(_options.REFERENCE_END)
    assert text[start:end] == _options.reference_markdown(), (
        'docs/API.md: the option table is not the one OPTIONS writes; rewrite it with '
        'python -c "from multihost._job import _options; _options.write_reference(\'docs/API.md\')"'
    )
    for option in OPTIONS:
        row = next(line for line in text[start:end].splitlines() if f'`{option.written}`' in line)
        assert f'`{option.env}=' in row and f'`{option.name}=' in row, row


def test_every_option_is_in_run_help_with_its_flag_variable_and_default():
    text = ' '.join(_cli.run_parser('multihost run').format_help().split())
    for option in OPTIONS:
        assert f' {option.written} ' in text, option.name
        assert _options.cli_help(option) in text, option.name
        assert option.env in _options.cli_help(option)
        assert option.default_words() in _options.cli_help(option)


def test_install_takes_exactly_the_tables_keywords_and_documents_each():
    """Keyword-only, in the table's order; a flag defaults to False, a value to None (not
    given: the variable, else the table's default)."""
    params = inspect.signature(multihost.install).parameters
    assert list(params) == [o.name for o in OPTIONS]
    for option in OPTIONS:
        param = params[option.name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY
        assert param.default is (False if option.is_flag else None), option.name
    doc = ' '.join((multihost.install.__doc__ or '').split())
    for option in OPTIONS:
        assert f'{option.name}: ' in doc and f'``{option.written}``' in doc, option.name
        assert f'``{option.env}=' in doc, option.name


def test_the_resolved_defaults_are_the_tables(clean):
    """Given nowhere, each option has the table's default; the dataclass's own defaults agree."""
    resolved = InstallOptions.resolve({})
    plain = InstallOptions()
    for option in OPTIONS:
        expected = False if option.is_flag else option.default
        assert _resolved(resolved, option.name) == expected, option.name
        assert _resolved(plain, option.name) == expected, option.name
    assert resolved.hold == _hold.HoldConfig() and resolved.wait == float('inf')


@pytest.mark.parametrize('option', OPTIONS, ids=lambda o: o.name)
def test_each_variable_sets_its_option_and_a_keyword_wins(clean, monkeypatch, tmp_path, option):
    if option.is_flag:
        for word, on in (('1', True), ('yes', True), ('0', False), ('off', False)):
            monkeypatch.setenv(option.env, word)
            given = {'control_file': str(tmp_path / 'c.json')}  # hold_on_error needs it
            assert _resolved(InstallOptions.resolve(given), option.name) is on, word
        monkeypatch.setenv(option.env, '0')
        assert _resolved(InstallOptions.resolve({**given, option.name: True}), option.name)
        return
    text, value = _good(option, tmp_path)
    monkeypatch.setenv(option.env, text)
    assert _resolved(InstallOptions.resolve({}), option.name) == value
    other = tmp_path / 'other'
    other.mkdir()
    keyword, expected = {'S': (9, 9.0), 'N': (3, 3), 'HOST': ('10.0.0.1', '10.0.0.1')}.get(
        option.metavar
    ) or _good(option, other)
    assert _resolved(InstallOptions.resolve({option.name: keyword}), option.name) == expected


@pytest.mark.parametrize('option', VALUED, ids=lambda o: o.name)
def test_a_bad_value_names_the_option_and_what_it_needs(clean, monkeypatch, option):
    """The keyword (``install``), the variable (the environment) or the flag (argparse)."""
    bad, needs = _BAD[option.metavar]
    with pytest.raises(ValueError) as info:
        InstallOptions.resolve({option.name: bad})
    assert str(info.value).startswith(f'{option.name}={bad!r}: {needs}'), str(info.value)
    if option.from_env is None:  # MULTIHOST_TIMEOUT: `_sequence`'s own message
        text = 'often' if option.metavar == 'N' else ('soon' if option.metavar == 'S' else None)
        if text is not None:
            monkeypatch.setenv(option.env, text)
            with pytest.raises(ValueError) as info:
                InstallOptions.resolve({})
            said = str(info.value)
            assert said.startswith(f'{option.env}={text!r}: {needs}') and 'unset it' in said
    cli_bad = '' if option.metavar in ('PATH', 'HOST', 'DIR') else str(bad)
    with pytest.raises(_cli.UsageError) as usage:
        _run.parse([f'{option.flag}={cli_bad}', 'train.py'], 'multihost run')
    assert f'argument {option.flag}: ' in str(usage.value), str(usage.value)


@pytest.mark.parametrize('option', [o for o in OPTIONS if o.is_flag], ids=lambda o: o.name)
def test_a_flag_variable_takes_on_and_off_words_and_refuses_others(
    clean, monkeypatch, tmp_path, option
):
    """``MULTIHOST_CHECK_JIT=maybe`` was silently off: a word that is neither on nor off is
    refused, naming the variable and the words it takes."""
    monkeypatch.setenv('MULTIHOST_CONTROL_FILE', str(tmp_path / 'control.json'))
    for word, on in (('1', True), ('Yes', True), ('off', False), ('0', False), (' ', False)):
        monkeypatch.setenv(option.env, word)
        assert _resolved(InstallOptions.resolve({}), option.name) is on, word
    monkeypatch.setenv(option.env, 'maybe')
    with pytest.raises(ValueError) as info:
        InstallOptions.resolve({})
    assert str(info.value).startswith(f"{option.env}='maybe': needs 1, true, on or yes (on)")
    assert 'unset it' in str(info.value)


def test_a_bad_timeout_variable_says_its_own_message(clean, monkeypatch):
    """``MULTIHOST_TIMEOUT`` is read in one place (`_defaults.timeout_from_env`), for the
    explicit calls' default and for install's timeout alike."""
    monkeypatch.setenv('MULTIHOST_TIMEOUT', 'soon')
    with pytest.raises(
        ValueError, match="MULTIHOST_TIMEOUT must be a number of seconds, got 'soon'"
    ):
        InstallOptions.resolve({})
    monkeypatch.setenv('MULTIHOST_TIMEOUT', '7')
    assert InstallOptions.resolve({}).wait == 7.0
    assert InstallOptions.resolve({'timeout': 2}).wait == 2.0  # a keyword wins


def test_the_command_line_resolves_as_the_same_keywords_do(clean, tmp_path):
    """``multihost run`` with every option equals ``install`` with every keyword."""
    argv, keywords = [], {}
    for option in OPTIONS:
        if option.is_flag:
            argv.append(option.flag)
            keywords[option.name] = True
        else:
            text, value = _good(option, tmp_path)
            argv += [option.flag, text]
            keywords[option.name] = value
    given, target, _, _ = _run.parse([*argv, 'train.py'], 'multihost run')
    assert target == 'train.py' and given == keywords
    assert InstallOptions.resolve(given) == InstallOptions.resolve(keywords)


def test_unknown_names_are_refused(clean):
    with pytest.raises(TypeError, match='no option hold_four: the options are check_jit, '):
        InstallOptions.resolve({'hold_four': 5})
    with pytest.raises(TypeError):
        multihost.install(hold_four=5)  # type: ignore[call-arg]


def test_hold_on_error_reaches_the_hold_as_its_own_part(clean, tmp_path):
    """install -> `InstallOptions.hold` -> `_fate.patch` -> `_hold.configure`, typed; uninstall
    turns it off."""
    control = tmp_path / 'c.json'
    multihost.install(hold_on_error=True, hold_for=5, control_file=str(control))
    try:
        assert _hold._state.config == _hold.HoldConfig(True, 5.0, str(control))
        assert _hold.enabled()
    finally:
        multihost.uninstall()
    assert _hold._state.config == _hold.HoldConfig() and not _hold.enabled()
    with pytest.raises(ValueError, match='--hold-on-error needs --control-file PATH'):
        multihost.install(hold_on_error=True)


def test_each_default_and_each_variable_is_written_once():
    """The hold's 1800 s in `_defaults.DEFAULT_HOLD_S` only; no module reads an option's
    variable but the table (``MULTIHOST_TIMEOUT``: `_defaults.timeout_from_env`)."""
    sources = {p: p.read_text() for p in (ROOT / 'multihost').rglob('*.py')}
    assert [p.name for p, text in sources.items() if '1800' in text] == ['_defaults.py']
    reads = re.compile(r"environ(?:\.get\(|\[)\s*'(MULTIHOST_\w+)'")
    envs = {o.env for o in OPTIONS}
    found = sorted(
        (p.name, name)
        for p, text in sources.items()
        for name in reads.findall(text)
        if name in envs
    )
    assert found == [('_defaults.py', 'MULTIHOST_TIMEOUT')], found


def test_a_bad_variable_under_multihost_run_is_one_line_and_exit_2(clean, tmp_path):
    script = tmp_path / 'hi.py'
    script.write_text("print('ran')\n")
    env = {**os.environ, 'MULTIHOST_HOLD_FOR': 'soon', 'JAX_PLATFORMS': 'cpu'}
    out = subprocess.run(
        [sys.executable, '-m', 'multihost', 'run', str(script)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 2 and 'ran' not in out.stdout, out.stderr
    assert out.stderr.strip() == (
        "python -m multihost run: error: MULTIHOST_HOLD_FOR='soon': needs a number of seconds, "
        'or unset it (default: 1800)'
    )


def test_install_options_is_frozen_and_typed():
    assert dataclasses.is_dataclass(InstallOptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        InstallOptions().check_jit = True  # type: ignore[misc]
    assert [p.__name__ for p in _install.patchers()][-1] == 'multihost.engine.stopped'


def test_each_path_is_checked_at_install_naming_its_option(clean, tmp_path):
    """A path that cannot serve is refused at start (not when first needed), in one line."""
    a_file = tmp_path / 'a-file'
    a_file.write_text('')
    cases = {
        'control_file': (str(tmp_path / 'nowhere' / 'c.json'), 'the folder'),
        'dump_dir': (str(a_file / 'dumps'), 'is a file'),
        'audit_log': (str(tmp_path / 'nowhere'), 'is not a directory: create it first'),
    }
    assert {o.name for o in OPTIONS if o.check is not None} == set(cases)
    for name, (path, says) in cases.items():
        with pytest.raises(ValueError) as info:
            multihost.install(**{name: path})
        text = str(info.value)
        assert name in text and says in text and '\n' not in text, text
    assert InstallOptions.resolve({'dump_dir': 'd'}).dump_dir == os.path.abspath('d')
