"""``python -m multihost run``: an unmodified program, with `multihost.install` applied first.

    python -m multihost run [--check-jit] [--timeout S] [--dump-dir DIR] [--control-file PATH]
                            [--control-address HOST] SCRIPT [ARGS...]
    python -m multihost run [OPTIONS] -m MODULE [ARGS...]

``--control-file PATH``: process 0 serves the control endpoint and writes its
connection file there (``mhnotebook.attach(PATH)``; see `_attach`).
``--dump-dir DIR``: each host writes ``DIR/process-<i>.json`` when something goes wrong.

Installs, then runs the program as ``__main__`` the way ``python SCRIPT`` /
``python -m MODULE`` would (`runpy`): the same ``sys.argv`` (the program's),
``sys.path[0]`` (the script's directory; for ``-m`` the current one), exit
code (``SystemExit``; an exception prints its traceback and exits 1) and
signals (no handler is installed; an uncaught KeyboardInterrupt ends the
process as Python's does). Installing first means that the by-name imports
of the program and of every library it imports see the checked functions,
and that every function jitted afterwards is seen.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

USAGE = (
    'usage: python -m multihost run [--check-jit] [--timeout S] [--dump-dir DIR]\n'
    '                               [--control-file PATH] [--control-address HOST]\n'
    '                               SCRIPT [ARGS...]\n'
    '       python -m multihost run [OPTIONS] -m MODULE [ARGS...]'
    '\n(--dump-dir DIR: each host writes DIR/process-<i>.json when something goes wrong;'
    ' read them with python -m multihost analyze DIR)'
)
#: Options taking a string value -> the `install` keyword they set.
_STRINGS = {
    '--dump-dir': 'dump_dir',
    '--control-file': 'control_file',
    '--control-address': 'control_address',
}


class UsageError(Exception):
    """A command line `run` cannot use (printed with `USAGE`, exit status 2)."""


def parse(argv: list[str]) -> tuple[dict[str, object], str, bool, list[str]]:
    """``(install options, target, is_module, the program's own arguments)``.

    Options end at the first argument that is not one (the script) or after
    ``-m MODULE``: everything after belongs to the program, as with python.
    """
    options: dict[str, object] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == '--check-jit':
            options['check_jit'] = True
        elif arg.split('=', 1)[0] == '--timeout':
            i, value = _value(argv, i, 'a number of seconds')
            try:
                options['timeout'] = float(value)
            except ValueError:
                raise UsageError(f'--timeout needs a number of seconds, got {value!r}') from None
            if not options['timeout'] > 0:  # type: ignore[operator]
                raise UsageError(f'--timeout needs a positive number of seconds, got {value!r}')
        elif arg.split('=', 1)[0] in _STRINGS:
            i, value = _value(argv, i, 'a value')
            if not value:
                raise UsageError(f'{arg.split("=", 1)[0]} needs a non-empty value')
            options[_STRINGS[arg.split('=', 1)[0]]] = value
        elif arg == '-m':
            if i + 1 == len(argv):
                raise UsageError('-m needs a module name')
            return options, argv[i + 1], True, argv[i + 2 :]
        elif arg in ('-h', '--help'):
            raise UsageError('')
        elif arg.startswith('-'):
            raise UsageError(f'unknown option {arg!r}')
        else:
            return options, arg, False, argv[i + 1 :]
        i += 1
    raise UsageError('no script or -m MODULE given')


def _value(argv: list[str], i: int, what: str) -> tuple[int, str]:
    """The value of the option at ``argv[i]`` (``--name VALUE`` or ``--name=VALUE``), its index."""
    name, eq, value = argv[i].partition('=')
    if eq:
        return i, value
    if i + 1 == len(argv):
        raise UsageError(f'{name} needs {what}')
    return i + 1, argv[i + 1]


def main(argv: list[str]) -> None:
    """Installs, then runs the program; returns only if the program returns (exit status 0)."""
    try:
        options, target, is_module, args = parse(argv)
    except UsageError as exc:
        print(f'{USAGE}\n{exc}' if str(exc) else USAGE, file=sys.stderr)
        raise SystemExit(2 if str(exc) else 0) from None
    from multihost._job._install import install

    install(**options)  # type: ignore[arg-type]
    if is_module:
        sys.argv = [target, *args]  # run_module sets argv[0] to the module's file
        if importlib.util.find_spec(target.split('.')[0]) is None:  # as python -m says it
            print(f'python -m multihost run: No module named {target}', file=sys.stderr)
            raise SystemExit(1)
        # python -m puts the current directory first: so does ``python -m multihost``.
        runpy.run_module(target, run_name='__main__', alter_sys=True)
        return
    if not os.path.exists(target):
        print(f"python -m multihost run: can't open file {target!r}", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = [target, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(target))  # as python does
    runpy.run_path(target, run_name='__main__')
