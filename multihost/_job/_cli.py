"""The ``multihost`` command's words: its parser, every option's sentence, one-line errors.

    multihost [demo] [--hosts N] [--devices D]
    multihost run [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]
    multihost analyze DIR [DIR ...]
    multihost audit-diff [--shift K] DIR_A DIR_B

``python -m multihost`` is the same program (`multihost.__main__`); only the
name in its messages differs. This module parses and checks, and runs
nothing: `_run` runs a program, `_analyze` reads dumps, the demo lives in
`multihost.__main__`. A mistake raises `UsageError`, which the command prints
as one line and exits 2 (argparse's own parser would print its usage block
first); ``--help`` is argparse's, exit 0. ``run``'s options are `_options.OPTIONS`'.
"""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING, Any

from multihost._cmdline import Parser, UsageError, count

if TYPE_CHECKING:
    from multihost._job import _options

COMMANDS = ('demo', 'run', 'analyze', 'audit-diff')
#: Commands that read files only: their parser is built alone, without ``run``'s options
#: (stdlib and `multihost._defaults` only: no command's parse imports JAX), so a post-mortem
#: starts at once, also where JAX is not set up.
READERS = ('analyze', 'audit-diff')
__all__ = ['COMMANDS', 'Parser', 'UsageError', 'count']


def bare_options(argv: list[str]) -> list[str]:
    """``run``'s arguments with an option whose value may be left out (``--audit``) joined to
    its value (``--audit=N``) when the next word is a whole number, else to its bare word
    (``--audit=on``): the next word is the program then (argparse alone would take a script's
    name for N)."""
    _options = _run_options()
    bare = {o.flag: o.bare for o in _options.OPTIONS if o.bare is not None}
    valued = {o.flag for o in _options.OPTIONS if not o.is_flag and o.bare is None}
    out = list(argv)
    i = 0
    while i < len(out):
        token = out[i]
        if token in bare:
            if i + 1 < len(out) and out[i + 1].isdigit():
                out[i : i + 2] = [f'{token}={out[i + 1]}']
            else:
                out[i] = f'{token}={bare[token]}'
        elif token == '-m' or token == '--' or not token.startswith('-'):
            if i and out[i - 1] in valued:
                i += 1
                continue  # an option's value, not the program
            break
        i += 1
    return out


def _run_options() -> Any:
    """`multihost._job._options` (``run``'s options), imported when ``run`` needs it."""
    return importlib.import_module('multihost._job._options')


def _value(option: _options.Option) -> Any:
    """argparse's ``type`` of ``option``: its parse, a bad value said as ``needs ..., got V``."""

    def parse(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f'{exc}, got {text!r}') from None

    return parse


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (also the options of the bare command)."""
    parser.add_argument(
        '--hosts',
        type=count,
        default=4,
        metavar='N',
        help='How many simulated hosts (local JAX processes) to start (default: %(default)s).',
    )
    parser.add_argument(
        '--devices',
        type=count,
        default=2,
        metavar='D',
        help='How many CPU devices each simulated host has (default: %(default)s).',
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``run``'s options (`_options.OPTIONS`); everything after SCRIPT (or after -m MODULE) is
    the program's."""
    _options = _run_options()
    for option in _options.OPTIONS:
        if option.is_flag:
            parser.add_argument(option.flag, action='store_true', help=_options.cli_help(option))
            continue
        parser.add_argument(
            option.flag,
            type=_value(option),
            nargs='?' if option.bare is not None else None,
            metavar=option.metavar,
            help=_options.cli_help(option),
        )
    parser.add_argument(
        '-m',
        dest='module',
        nargs=argparse.REMAINDER,
        metavar='MODULE',
        help='Run a module as python -m MODULE would (with the current directory first on '
        "sys.path); the arguments after MODULE are the program's.",
    )
    parser.add_argument(
        'script',
        nargs='?',
        metavar='SCRIPT',
        help='The program to run as python SCRIPT would, unchanged, after multihost.install().',
    )
    parser.add_argument(
        'args',
        nargs=argparse.REMAINDER,
        metavar='ARGS',
        help="The program's own arguments, passed on untouched as its sys.argv[1:].",
    )


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    """``analyze``'s one argument: the dump directories."""
    parser.add_argument(
        'dirs',
        nargs='+',
        metavar='DIR',
        help='A --dump-dir of the job (give several when hosts wrote to different places); '
        'the newest dump of each process counts.',
    )


def add_audit_diff_arguments(parser: argparse.ArgumentParser) -> None:
    """``audit-diff``'s two arguments: the runs' --audit-log directories."""
    parser.add_argument('run_a', metavar='DIR_A', help="One run's --audit-log directory.")
    parser.add_argument(
        'run_b', metavar='DIR_B', help="The other run's, compared launch by launch."
    )
    parser.add_argument(
        '--shift',
        type=int,
        default=0,
        metavar='K',
        help="Run B was resumed at run A's call K of each function: B's call c is compared "
        "with A's call c+K (default 0).",
    )


RUN_USAGE = '%(prog)s [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]'


def run_parser(prog: str) -> Parser:
    """The parser of ``run`` alone (`_run.parse`)."""
    parser = Parser(prog=prog, usage=RUN_USAGE, description=RUN_DESCRIPTION)
    add_run_arguments(parser)
    return parser


RUN_DESCRIPTION = (
    'Run an unmodified JAX program with multihost.install() applied first: every '
    'jax.experimental.multihost_utils call becomes a checked one. Start it on every host the way '
    'you start the program today (srun, mpirun, a job script), with "multihost run" in front.'
)
ANALYZE_DESCRIPTION = (
    'Read the dumps a job left in its --dump-dir and say, in at most 20 lines, where every host '
    'stood, which hosts are behind or elsewhere (the culprits) and which is the straggler; '
    'then the replays --audit-replay wrote there.'
)
AUDIT_DIFF_DESCRIPTION = (
    'Compare the data of two runs of a job from their --audit-log directories, launch by '
    'launch, and name the first launch, process, argument and block where they differ '
    '(exit 0: the same, 1: they differ, 2: a directory without audit logs).'
)
DEMO_DESCRIPTION = (
    'Start simulated hosts on this machine, run the eight drop-in multihost_utils calls on all '
    'of them and print what each got back, then show a divergent barrier caught on every host.'
)


def parser(prog: str, version: str) -> Parser:
    """The whole command: ``demo``, ``run``, ``analyze`` (and the demo's options bare)."""
    return _parsers(prog, version)[0]


def _parsers(prog: str, version: str, only: str | None = None) -> tuple[Parser, dict[str, Parser]]:
    """The command's parser and each subcommand's (``only``: that one alone)."""
    top = Parser(
        prog=prog,
        description='Checked multi-host JAX collectives: a demo on simulated hosts, your own '
        'program run with the checks installed, and the verdict from the dumps it left. '
        'Without a command: the demo.',
        epilog=f'"{prog} COMMAND --help" describes the options of one command.',
    )
    top.add_argument(
        '--version',
        action='version',
        version=f'%(prog)s {version}',
        help='Show the version of multihost and exit.',
    )
    sub = top.add_subparsers(dest='command', metavar='COMMAND', parser_class=Parser)
    commands = (  # name, help, description, usage, the function that adds its arguments
        ('demo', 'The drop-in API on simulated local hosts.', DEMO_DESCRIPTION, None,
         add_demo_arguments),
        ('run', 'Run your program with the checks installed.', RUN_DESCRIPTION, RUN_USAGE,
         add_run_arguments),
        ('analyze', 'The verdict from the dumps a job left.', ANALYZE_DESCRIPTION, None,
         add_analyze_arguments),
        ('audit-diff', "Where two runs' data first differ.", AUDIT_DIFF_DESCRIPTION, None,
         add_audit_diff_arguments),
    )  # fmt: skip
    made: dict[str, Parser] = {}
    for name, help_, description, usage, add_arguments in commands:
        if only in (None, name):
            made[name] = sub.add_parser(name, help=help_, description=description, usage=usage)
            add_arguments(made[name])
    return top, made


def parse(argv: list[str], prog: str, version: str) -> argparse.Namespace:
    """The command line, with ``command`` set (``demo`` when none is given); for ``run``,
    ``target`` is `run_target`'s tuple.

    Raises:
        UsageError: the mistake, in one line.
    """
    top, commands = _parsers(prog, version, argv[0] if argv and argv[0] in READERS else None)
    if argv and not argv[0].startswith('-') and argv[0] not in COMMANDS:
        # A word where the command goes: a misspelt command, or a script without ``run``.
        hint = f' (to run it: {prog} run {argv[0]})' if argv[0].endswith('.py') else ''
        top.error(f'no command {argv[0]!r}: choose one of {", ".join(COMMANDS)}{hint}')
    if not argv or argv[0] not in (*COMMANDS, '-h', '--help', '--version'):
        argv = ['demo', *argv]  # the bare command's options are the demo's
    if argv[0] == 'run':
        argv = ['run', *bare_options(argv[1:])]
    args, extra = top.parse_known_args(argv)
    if extra:  # said by the command's own parser, with its usage
        commands[args.command].error(f'unrecognized arguments: {" ".join(extra)}')
    if args.command == 'run':
        args.target = run_target(args, commands['run'])
    return args


def run_target(
    args: argparse.Namespace, parser: Parser
) -> tuple[dict[str, object], str, bool, list[str]]:
    """``(install options, target, is_module, the program's arguments)`` of ``run``'s ``args``.

    Raises:
        UsageError: no program was named, or ``-m`` without a module.
    """
    _options = _run_options()
    options: dict[str, object] = {}  # the options given (`_options.InstallOptions.resolve`)
    for option in _options.OPTIONS:
        value = getattr(args, option.name)
        if value is not None and value is not False:
            options[option.name] = value
    if args.module is not None:
        if not args.module:
            parser.error('-m needs a module name (as in: -m package.train)')
        return options, args.module[0], True, args.module[1:]
    if args.script is None:
        parser.error('no program given: name a SCRIPT or -m MODULE')
    return options, args.script, False, list(args.args)
