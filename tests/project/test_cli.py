"""The ``multihost`` and ``mhnotebook`` commands: help that describes everything, one-line errors.

``python -m multihost`` / ``python -m mhnotebook`` are the same programs as the installed
console scripts; only the name in their messages differs. The behaviour of ``run`` and
``analyze`` themselves is pinned by ``test_run.py``, ``test_dumps.py`` and ``test_analyze.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

import pytest

from mhnotebook import _demo
from multihost import __main__ as multihost_main
from multihost import __version__
from multihost._job import _cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

COMMANDS = {
    'demo': 'The drop-in API on simulated local hosts.',
    'run': 'Run your program with the checks installed.',
    'analyze': 'The verdict from the dumps a job left.',
    'audit-diff': "Where two runs' data first differ.",
}
RUN_OPTIONS = (
    '-h, --help',
    '--check-jit',
    '--timeout S',
    '--control-file PATH',
    '--control-address HOST',
    '--dump-dir DIR',
    '--hold-on-error',
    '--hold-for S',
    '--allow-exec',
    '--audit [N]',
    '--audit-log DIR',
    '--audit-raise',
    '--audit-replay',
    '-m MODULE ...',
    'SCRIPT',
    'ARGS',
)


def _script(name: str) -> str:
    """The console script pip installed next to this Python (a fresh ``pip install -e .``)."""
    path = os.path.join(BIN, name)
    assert os.path.exists(path), f'no {path}: install the project (pip install -e .) first'
    return path


def _command(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _flat(text: str) -> str:
    return ' '.join(text.split())


def _helps(parser: argparse.ArgumentParser) -> list[str]:
    return [a.help for a in parser._actions if a.help and a.help != argparse.SUPPRESS]


def _every_action(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    actions = []
    for action in parser._actions:  # the parser's own record of what it accepts
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                actions += _every_action(sub)
            actions += action._choices_actions
        else:
            actions.append(action)
    return actions


@pytest.mark.parametrize(
    'parser',
    [_cli.parser('multihost', __version__), _cli.run_parser('multihost run')],
    ids=['multihost', 'run'],
)
def test_every_option_and_command_is_described_in_a_sentence(parser):
    """No option or command without help, and each help is one sentence, capitalised, with
    a full stop (argparse's own lower-case "show this help message" included)."""
    for action in _every_action(parser):
        text = action.help or ''
        assert text[:1].isupper() and text.endswith('.'), (action.option_strings, text)
        assert text.count('. ') == 0, (action.option_strings, text)  # one sentence


def test_multihost_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        multihost_main.main(['--help'], prog='multihost')
    assert exit_.value.code == 0
    out = _flat(capsys.readouterr().out)
    assert out.startswith('usage: multihost [-h] [--version] COMMAND ...')
    for command, text in COMMANDS.items():
        assert f'{command} {text}' in out, (command, out)
    assert 'Without a command: the demo.' in out
    assert '"multihost COMMAND --help" describes the options of one command.' in out


def test_multihost_run_help_describes_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        multihost_main.main(['run', '--help'], prog='multihost')
    assert exit_.value.code == 0
    out = _flat(capsys.readouterr().out)
    assert out.startswith('usage: multihost run [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]')
    run = _cli.run_parser('multihost run')
    for option in RUN_OPTIONS:
        assert f' {option} ' in out, (option, out)
    for text in _helps(run):
        assert _flat(text) in out, text
    assert len(_helps(run)) == len(RUN_OPTIONS)  # nothing undocumented beyond this list


@pytest.mark.parametrize('command', ['demo', 'analyze'])
def test_the_other_commands_describe_their_options(capsys, command):
    with pytest.raises(SystemExit):
        multihost_main.main([command, '--help'], prog='multihost')
    out = _flat(capsys.readouterr().out)
    expected = {'demo': ['--hosts N', '--devices D'], 'analyze': ['DIR']}[command]
    for option in expected:
        assert f' {option} ' in out, (option, out)
    assert 'Show this help and exit.' in out


BAD = [
    (['run', '--bogus', 'x.py'], 'unrecognized arguments: --bogus'),
    (['run', '--timeout', 'soon', 'x.py'], "--timeout: needs a number of seconds, got 'soon'"),
    (['run', '--timeout=-3', 'x.py'], "needs a positive number of seconds, got '-3'"),
    (['run', '--dump-dir=', 'x.py'], 'argument --dump-dir: needs a non-empty value'),
    (['run'], 'no program given: name a SCRIPT or -m MODULE'),
    (['run', '-m'], '-m needs a module name'),
    (['analyze'], 'the following arguments are required: DIR'),
    (['--hosts', '0'], "argument --hosts: needs at least 1, got '0'"),
    (['demo', '--devices', 'two'], "argument --devices: needs a whole number, got 'two'"),
    (['frob'], "no command 'frob': choose one of demo, run, analyze, audit-diff"),
]


@pytest.mark.parametrize(('argv', 'says'), BAD, ids=[' '.join(a) for a, _ in BAD])
def test_a_bad_command_line_is_one_line_and_exit_status_2(capsys, argv, says):
    """Named by the command it came to, with the fix: the usage and where the help is."""
    assert multihost_main.main(argv, prog='multihost') == 2
    captured = capsys.readouterr()
    assert captured.out == ''
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    if argv[0] in COMMANDS or argv[0].startswith('-'):
        command = ' ' + (argv[0] if argv[0] in COMMANDS else 'demo')
    else:  # not a command: said by the command itself
        command = ''
    assert lines[0].startswith(f'multihost{command}: error: '), lines[0]
    assert says in lines[0] and f'usage: multihost{command} ' in lines[0], lines[0]
    assert '--help describes each option' in lines[0]


def test_the_run_parse_keeps_the_programs_arguments_for_the_program():
    """Everything after SCRIPT or after -m MODULE is the program's, options included."""
    parse = _cli.run_parser('multihost run')
    cases = {
        ('prog.py', '3', '--lr', '0.1'): ({}, 'prog.py', False, ['3', '--lr', '0.1']),
        ('--check-jit', 'prog.py', '--timeout', '-h'): (
            {'check_jit': True},
            'prog.py',
            False,
            ['--timeout', '-h'],
        ),
        ('--dump-dir', 'd', '-m', 'pkg.train', '-m', 'x'): (
            {'dump_dir': 'd'},
            'pkg.train',
            True,
            ['-m', 'x'],
        ),
        ('prog.py', '-m', 'x'): ({}, 'prog.py', False, ['-m', 'x']),
    }
    for argv, expected in cases.items():
        assert _cli.run_target(parse.parse_args(list(argv)), parse) == expected, argv


def test_mhnotebook_help_and_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        _demo.main(['--help'])
    assert exit_.value.code == 0
    out = _flat(capsys.readouterr().out)
    assert 'demo The toolkit end to end on simulated local hosts, written to a folder.' in out
    with pytest.raises(SystemExit):
        _demo.main(['demo', '--help'])
    out = _flat(capsys.readouterr().out)
    for option in ('--out DIR', '--hosts N', '--devices D', '-h, --help'):
        assert f' {option} ' in out, option
    for argv, says in (
        ([], 'name a command: demo'),
        (['demo', '--hosts', 'x'], "needs a whole number, got 'x'"),
        (['demo', '--bogus'], 'unrecognized arguments: --bogus'),
    ):
        assert _demo.main(argv) == 2
        captured = capsys.readouterr()
        assert len(captured.err.splitlines()) == 1 and says in captured.err, captured.err


@pytest.mark.release
def test_the_installed_scripts_and_python_m_are_one_program(tmp_path):
    """The console scripts print what ``python -m`` prints, under their own name."""
    for name in ('multihost', 'mhnotebook'):
        for args in (['--help'], ['demo', '--help']):
            script = _command(_script(name), *args)
            module = _command(sys.executable, '-m', name, *args)
            assert script.returncode == module.returncode == 0, (script.stderr, module.stderr)
            assert script.stdout == module.stdout.replace(f'python -m {name}', name)
    script = _command(_script('multihost'), '--version')
    assert script.stdout.strip() == f'multihost {__version__}'
    bad = _command(_script('multihost'), 'run', '--bogus', 'x.py')
    assert bad.returncode == 2 and bad.stderr.startswith('multihost run: error: unrecognized')
    missing = _command(_script('multihost'), 'analyze', str(tmp_path / 'nowhere'))
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f'multihost analyze: {tmp_path / "nowhere"}: no such directory '
        '(give the --dump-dir of the job)'
    )
    one = tmp_path / 'process-0.json'
    one.write_text('{}')
    a_file = _command(_script('multihost'), 'analyze', str(one))
    assert a_file.returncode == 2 and a_file.stderr.strip() == (
        f'multihost analyze: {one}: a file; give the directory that holds the dumps '
        f'({tmp_path}, the --dump-dir of the job)'
    )
    # A script without ``run``, a misspelt command: named, not taken for the demo's options.
    for word, hint in (('train.py', ' (to run it: multihost run train.py)'), ('analyse', '')):
        wrong = _command(_script('multihost'), word)
        assert wrong.returncode == 2 and wrong.stderr.startswith(
            f"multihost: error: no command '{word}': choose one of demo, run, analyze, "
            f'audit-diff{hint} (usage: '
        ), wrong.stderr


PROGRAM = textwrap.dedent(
    """
    import json, sys
    from multihost._job import _install
    installed = bool(_install.installed())
    print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'installed': installed}))
    """
)


def test_multihost_run_module_from_the_script_puts_the_current_directory_first(tmp_path):
    """As ``python -m`` does: the console script's own directory is not where -m looks."""
    package = tmp_path / 'mypkg'
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'train.py').write_text(PROGRAM)
    out = _command(_script('multihost'), 'run', '-m', 'mypkg.train', '7', cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {
        'argv': [str(package / 'train.py'), '7'],
        'path0': str(tmp_path),
        'installed': True,
    }
    nowhere = _command(_script('multihost'), 'run', '-m', 'no_such_module_here', cwd=str(tmp_path))
    assert nowhere.returncode == 1
    assert nowhere.stderr.strip() == 'multihost run: No module named no_such_module_here'
