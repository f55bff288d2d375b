"""``python -m multihost run``: an unmodified program runs as ``python`` would run it, installed.

And ``MULTIHOST_INSTALL=1`` through the shipped ``multihost-install.pth``; the
bare ``python -m multihost`` stays the demo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent(
    """
    import json, sys
    from jax.experimental.multihost_utils import sync_global_devices
    import multihost
    from multihost._job import _install
    print(json.dumps({
        'name': __name__,
        'argv': sys.argv,
        'path0': sys.path[0],
        'installed': _install.installed(),
        'by_name': sync_global_devices.__module__,
    }))
    code = sys.argv[1] if len(sys.argv) > 1 else '0'
    if code == 'raise':
        raise ValueError('boom from the program')
    if code == 'interrupt':
        raise KeyboardInterrupt
    sys.exit(int(code))
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu', **extra}
    for name in ('MULTIHOST_INSTALL', 'MULTIHOST_CHECK_JIT', 'MULTIHOST_TIMEOUT'):
        if name not in extra:
            env.pop(name, None)
    return env


def _run(args: list[str], cwd: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def program(tmp_path):
    (tmp_path / 'prog').mkdir()
    path = tmp_path / 'prog' / 'train.py'
    path.write_text(PROGRAM)
    return path


def _report(out: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_script_runs_as_main_with_its_argv_path_and_exit_code(program, tmp_path):
    out = _run(['-m', 'multihost', 'run', str(program), '3', '--lr', '0.1'], cwd=str(tmp_path))
    assert out.returncode == 3, out.stderr
    report = _report(out)
    assert report['name'] == '__main__'
    assert report['argv'] == [str(program), '3', '--lr', '0.1']
    assert report['path0'] == str(program.parent)  # the script's directory, as python does
    assert report['installed']['check_jit'] is False
    assert report['installed']['timeout'] is None
    # The program's own by-name import took ours: it came after install.
    assert report['by_name'] == 'multihost._core._collectives'


def test_options_before_the_script_are_ours_after_it_the_programs(program, tmp_path):
    out = _run(
        ['-m', 'multihost', 'run', '--check-jit', '--timeout', '5', str(program), '0', '--timeout'],
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    report = _report(out)
    assert report['installed']['check_jit'] is True and report['installed']['timeout'] == 5.0
    assert report['argv'][1:] == ['0', '--timeout']


def test_an_exception_prints_its_traceback_and_exits_1(program, tmp_path):
    out = _run(['-m', 'multihost', 'run', str(program), 'raise'], cwd=str(tmp_path))
    assert out.returncode == 1
    assert 'Traceback' in out.stderr and 'ValueError: boom from the program' in out.stderr
    assert f'{program}' in out.stderr


def test_keyboard_interrupt_ends_the_process_as_python_does(program, tmp_path):
    out = _run(['-m', 'multihost', 'run', str(program), 'interrupt'], cwd=str(tmp_path))
    # Python ends by SIGINT after an uncaught KeyboardInterrupt (the shell shows 130).
    assert out.returncode == -signal.SIGINT, out.stderr
    assert 'KeyboardInterrupt' in out.stderr


def test_a_module_runs_as_main_with_its_argv(program, tmp_path):
    package = tmp_path / 'mypkg'
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'train.py').write_text(PROGRAM)
    out = _run(
        ['-m', 'multihost', 'run', '-m', 'mypkg.train', '4', 'x'],
        cwd=str(tmp_path),
        MULTIHOST_CHECK_JIT='1',
    )
    assert out.returncode == 4, out.stderr
    report = _report(out)
    assert report['name'] == '__main__'
    assert report['argv'] == [str(package / 'train.py'), '4', 'x']
    assert report['path0'] == str(tmp_path)  # -m: the current directory first
    assert report['installed']['check_jit'] is True  # MULTIHOST_CHECK_JIT=1


def test_usage_errors_and_the_demo_stays(tmp_path):
    from multihost._job import _run as run

    for args in (
        [],
        ['--bogus', 'x.py'],
        ['--timeout', 'soon', 'x.py'],
        ['--timeout=-3', 'x.py'],
        ['--timeout', '0', 'x.py'],
        ['-m'],
    ):
        with pytest.raises(run.UsageError):
            run.parse(args)
    assert run.parse(['--timeout=2', '-m', 'pkg.mod', '-m', 'x']) == (
        {'timeout': 2.0},
        'pkg.mod',
        True,
        ['-m', 'x'],
    )
    out = _run(['-m', 'multihost', 'run', '--bogus', 'x.py'], cwd=str(tmp_path))
    assert out.returncode == 2 and 'usage: python -m multihost run' in out.stderr
    out = _run(['-m', 'multihost', 'run', '-m', 'no_such_module_here'], cwd=str(tmp_path))
    assert out.returncode == 1, out.stderr  # as python -m says it: one line, no traceback
    assert out.stderr.strip() == 'python -m multihost run: No module named no_such_module_here'
    out = _run(['-m', 'multihost', 'demo', '--help'], cwd=str(tmp_path))
    assert out.returncode == 0 and '--hosts' in out.stdout, out.stderr
    # A dump directory that could never be written is said at start, not when a dump is due.
    (tmp_path / 'a_file').write_text('')
    bad = str(tmp_path / 'a_file' / 'dumps')
    out = _run(['-m', 'multihost', 'run', '--dump-dir', bad, 'x.py'], cwd=str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip() == (
        f'python -m multihost run: error: dump_dir={bad!r} cannot be created: '
        f'{str(tmp_path / "a_file")!r} is a file (give a directory, --dump-dir or '
        'MULTIHOST_DUMP_DIR)'
    ), out.stderr
    assert not (tmp_path / 'x.py').exists()
    # Root passes os.access there, yet nothing can be made in /proc: a file is tried.
    out = _run(['-m', 'multihost', 'run', '--dump-dir', '/proc/dumps', 'x.py'], cwd=str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip().startswith(
        "python -m multihost run: error: dump_dir='/proc/dumps': no file can be made in '/proc' ("
    ), out.stderr
    assert [p for p in os.listdir(tmp_path) if 'probe' in p] == []


def _site_dir(tmp_path) -> str:
    """A site directory holding the shipped hook, as site-packages does after pip install."""
    site_dir = tmp_path / 'site'
    site_dir.mkdir()
    with open(os.path.join(ROOT, 'multihost-install.pth')) as f:
        (site_dir / 'multihost-install.pth').write_text(f.read())
    return str(site_dir)


CHECK = textwrap.dedent(
    """
    import site, sys
    site.addsitedir(sys.argv[1])  # processes its .pth files, as start-up does
    imported = 'multihost' in sys.modules, 'jax' in sys.modules
    installed = imported[0] and sys.modules['multihost._job._install'].installed()
    print(imported[0], imported[1], bool(installed))
    """
)


def test_multihost_install_1_installs_through_the_pth_hook(tmp_path):
    site_dir = _site_dir(tmp_path)
    out = _run(['-c', CHECK, site_dir], cwd=str(tmp_path), MULTIHOST_INSTALL='1')
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['True', 'True', 'True']
    # Unset (or 0): the line reads os.environ and imports nothing.
    for env in ({}, {'MULTIHOST_INSTALL': '0'}):
        out = _run(['-c', CHECK, site_dir], cwd=str(tmp_path), **env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ['False', 'False', 'False']


def test_the_pth_hook_is_one_import_line_that_reads_only_the_environment():
    with open(os.path.join(ROOT, 'multihost-install.pth')) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith('import os;')
    # Before the environment says so, nothing but os (imported by site already) is used.
    head, _, tail = lines[0].partition(' and ')
    assert '__import__' not in head and tail == "__import__('multihost').install()"
