"""``multihost run``: an unmodified program, with `multihost.install` applied first.

    multihost run [OPTIONS] SCRIPT [ARGS...]
    multihost run [OPTIONS] -m MODULE [ARGS...]

(``python -m multihost run`` is the same; the options are `_options.OPTIONS`, the parser
`_cli`.)

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
from typing import Any

from multihost._job import _cli

#: The name in messages when run as ``python -m multihost run`` (``multihost run`` passes its own).
PROG = 'python -m multihost run'
UsageError = _cli.UsageError  # the parse error (its message is one line; the command exits 2)


def parse(argv: list[str], prog: str = PROG) -> tuple[dict[str, object], str, bool, list[str]]:
    """``(install options given, target, is_module, the program's own arguments)``.

    Options end at the first argument that is not one (the script) or after
    ``-m MODULE``: everything after belongs to the program, as with python.

    Raises:
        UsageError: the mistake, in one line (``--help`` prints the help and exits 0).
    """
    parser = _cli.run_parser(prog)
    return _cli.run_target(parser.parse_args(_cli.bare_options(argv)), parser)


def main(argv: list[str], prog: str = PROG) -> None:
    """Parses ``argv`` (a mistake: one line, exit status 2), then `run`."""
    try:
        options, target, is_module, args = parse(argv, prog)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    run(options, target, is_module, args, prog)


def run(
    options: dict[str, object], target: str, is_module: bool, args: list[str], prog: str = PROG
) -> None:
    """Installs (``options``: `_cli.run_target`'s, the options given), then runs the program;
    returns only if the program returns (exit status 0)."""
    from multihost._job import _install
    from multihost._job._options import InstallOptions

    try:
        _install.apply(InstallOptions.resolve(options))
    except ValueError as exc:  # an option's or a MULTIHOST_* variable's value: one line
        print(f'{prog}: error: {exc}', file=sys.stderr)
        raise SystemExit(2) from None
    _own_lines()
    if is_module:
        sys.argv = [target, *args]  # run_module sets argv[0] to the module's file
        # python -m puts the current directory first: so do ``python -m multihost`` and the
        # ``multihost`` script (whose sys.path[0] would be the script's bin directory).
        sys.path[0] = os.getcwd()
        if importlib.util.find_spec(target.split('.')[0]) is None:  # as python -m says it
            print(f'{prog}: No module named {target}', file=sys.stderr)
            raise SystemExit(1)
        _program(runpy.run_module, target, run_name='__main__', alter_sys=True)
        return
    if not os.path.exists(target):
        print(f"{prog}: can't open file {target!r}", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = [target, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(target))  # as python does
    _program(runpy.run_path, target, run_name='__main__')


def _own_lines() -> None:
    """The ``multihost`` logger's lines go to stderr as they are written (``multihost: ...``),
    whatever the program or its libraries do to logging: a root handler set up later (absl,
    ``logging.basicConfig``) would otherwise print half of them ``WARNING:multihost:multihost:``."""
    import logging

    log = logging.getLogger('multihost')
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter('%(message)s'))
        log.addHandler(handler)
        log.propagate = False


def _program(runner: Any, target: str, **kwargs: Any) -> None:
    """Runs the program; a ``SystemExit`` with a non-zero code tells the other hosts first
    (`_fate.failed_exit`: an uncaught exception reaches them through the excepthook)."""
    try:
        runner(target, **kwargs)
    except SystemExit as exc:
        from multihost._job import _fate

        _fate.failed_exit(exc.code, exc.__traceback__)
        raise
