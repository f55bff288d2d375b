"""The ``multihost`` command's words: its parser, every option's sentence, one-line errors.

    multihost [demo] [--hosts N] [--devices D]
    multihost run [--check-jit] [--timeout S] [--control-file PATH]
                  [--control-address HOST] [--dump-dir DIR] [--hold-on-error]
                  [--hold-for S] [--allow-exec] [--audit [N]] [--audit-log DIR]
                  [--audit-raise]
                  (SCRIPT | -m MODULE) [ARGS ...]
    multihost analyze DIR [DIR ...]
    multihost audit-diff [--shift K] DIR_A DIR_B

``python -m multihost`` is the same program (`multihost.__main__`); only the
name in its messages differs. This module parses and checks, and runs
nothing: `_run` runs a program, `_analyze` reads dumps, the demo lives in
`multihost.__main__`. A mistake raises `UsageError`, which the command prints
as one line and exits 2 (argparse's own parser would print its usage block
first); ``--help`` is argparse's, exit 0.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

COMMANDS = ('demo', 'run', 'analyze', 'audit-diff')


class UsageError(Exception):
    """A command line the command cannot use; the message names the mistake (exit status 2)."""


class _Help(argparse.HelpFormatter):
    """argparse's help, naming ``-m``'s value: argparse shows an option that takes the rest of
    the line as ``-m ...`` whatever its metavar (``_format_args`` is the one place it does)."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.option_strings and action.nargs == argparse.REMAINDER:
            return f'{action.metavar} ...'
        return super()._format_args(action, default_metavar)


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that a mistake raises `UsageError` instead of exiting, and
    that ``-h`` is described as every other option is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(add_help=False, formatter_class=_Help)
        super().__init__(*args, **kwargs)
        self.add_argument('-h', '--help', action='help', help='Show this help and exit.')

    def error(self, message: str) -> NoReturn:
        usage = ' '.join(self.format_usage().split())  # one line, however argparse wrapped it
        raise UsageError(f'{self.prog}: error: {message} ({usage}; --help describes each option)')


def _seconds(value: str) -> float:
    """``--timeout``'s value: a positive number of seconds."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'needs a number of seconds, got {value!r}') from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f'needs a positive number of seconds, got {value!r}')
    return seconds


def _audit_every(value: str) -> int:
    """``--audit``'s N: a whole number (``on``: the default)."""
    from multihost._job import _audit

    try:
        return _audit.every_from(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bare_options(argv: list[str]) -> list[str]:
    """``run``'s arguments with ``--audit N`` (before the program) as ``--audit=N`` when N is a
    whole number, and a bare ``--audit`` as ``--audit=on``: the next word is the program then
    (argparse alone would take a script's name for N)."""
    out = list(argv)
    i = 0
    while i < len(out):
        token = out[i]
        if token == '--audit':
            if i + 1 < len(out) and out[i + 1].isdigit():
                out[i : i + 2] = [f'--audit={out[i + 1]}']
            else:
                out[i] = '--audit=on'
        elif token == '-m' or token == '--' or not token.startswith('-'):
            if i and out[i - 1] in _VALUED:
                i += 1
                continue  # an option's value, not the program
            break
        i += 1
    return out


#: ``run``'s options that take a separate value.
_VALUED = (
    '--timeout',
    '--control-file',
    '--control-address',
    '--dump-dir',
    '--hold-for',
    '--audit-log',
)


def _text(value: str) -> str:
    """A string option's value: not empty."""
    if not value:
        raise argparse.ArgumentTypeError('needs a non-empty value')
    return value


def count(value: str) -> int:
    """A count of hosts or devices: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'needs a whole number, got {value!r}') from None
    if number < 1:
        raise argparse.ArgumentTypeError(f'needs at least 1, got {value!r}')
    return number


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
    """``run``'s options; everything after SCRIPT (or after -m MODULE) is the program's."""
    parser.add_argument(
        '--check-jit',
        action='store_true',
        help='Before each jitted launch that spans devices of more than one process, check that '
        'every host launches the same computation (MULTIHOST_CHECK_JIT=1 does the same).',
    )
    parser.add_argument(
        '--timeout',
        type=_seconds,
        metavar='S',
        help='Seconds after which a collective that some host never reaches raises '
        "BarrierTimeoutError naming the missing hosts (default: wait as long as JAX's would, "
        'logging who is missing).',
    )
    parser.add_argument(
        '--control-file',
        type=_text,
        metavar='PATH',
        help='Process 0 serves a control endpoint and writes its connection file here, for '
        'mhnotebook.attach(PATH) from a notebook (MULTIHOST_CONTROL_FILE too).',
    )
    parser.add_argument(
        '--control-address',
        type=_text,
        metavar='HOST',
        help='The interface the control endpoint listens on (default: loopback; '
        'MULTIHOST_CONTROL_ADDRESS too).',
    )
    parser.add_argument(
        '--dump-dir',
        type=_text,
        metavar='DIR',
        help='Each host writes DIR/process-<i>.json when something goes wrong (a timeout, a '
        'mismatch, an uncaught exception, a hang, a preemption notice, or SIGUSR1 sent to it); '
        "read them with 'analyze DIR' (MULTIHOST_DUMP_DIR too).",
    )
    parser.add_argument(
        '--hold-on-error',
        action='store_true',
        help='When the program raises on a host, hold every host where it is (the failing one '
        'at its error, the others at their next collective, barrier or launch) so a notebook '
        'can attach (needs --control-file) and inspect the values; job.release_all() in the '
        'notebook ends the hold and the error goes on; with --check-jit too, every host holds '
        'before its launch, so state a step donates stays readable '
        '(MULTIHOST_HOLD_ON_ERROR=1 too).',
    )
    parser.add_argument(
        '--hold-for',
        type=_seconds,
        metavar='S',
        help='With --hold-on-error: the longest hold, in seconds; then the error goes on as '
        'without the flag (default: 1800; MULTIHOST_HOLD_FOR too).',
    )
    parser.add_argument(
        '--allow-exec',
        action='store_true',
        help='Let a notebook attached with the control key run code cells on the hosts, in '
        'their held frames: whoever holds the key then runs code as the job (off by default, '
        'the key grants inspection only; MULTIHOST_ALLOW_EXEC=1 too).',
    )
    parser.add_argument(
        '--audit',
        type=_audit_every,
        nargs='?',
        metavar='N',
        help='Audit the launches that span processes while the job runs: the first 10 of each '
        'jitted function, then every N-th (--audit N or --audit=N; alone, --audit: N = 50), '
        'compared across hosts off the main thread: replica drift, duplicate data, the first '
        'NaN or Inf, each reported once on every host (MULTIHOST_AUDIT=N too).',
    )
    parser.add_argument(
        '--audit-log',
        type=_text,
        metavar='DIR',
        help='With the audit (turned on by this option), each host writes the fingerprints of '
        'the audited launches\' fresh inputs to DIR/audit-<process>.jsonl, for "multihost '
        'audit-diff" between two runs (MULTIHOST_AUDIT_LOG too).',
    )
    parser.add_argument(
        '--audit-raise',
        action='store_true',
        help='With the audit (turned on by this option), its first finding raises AuditError '
        'on every host at its next jitted launch, so the job ends there, or is held there '
        'when it holds on errors (MULTIHOST_AUDIT_RAISE=1 too).',
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


def analyze_parser(prog: str) -> Parser:
    """The parser of ``analyze`` alone (`_analyze.main`)."""
    parser = Parser(prog=prog, description=ANALYZE_DESCRIPTION)
    add_analyze_arguments(parser)
    return parser


RUN_DESCRIPTION = (
    'Run an unmodified JAX program with multihost.install() applied first: every '
    'jax.experimental.multihost_utils call becomes a checked one. Start it on every host the way '
    'you start the program today (srun, mpirun, a job script), with "multihost run" in front.'
)
ANALYZE_DESCRIPTION = (
    'Read the dumps a job left in its --dump-dir and say, in at most 20 lines, where every host '
    'stood, which hosts are behind or elsewhere (the culprits) and which is the straggler.'
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


def _parsers(prog: str, version: str) -> tuple[Parser, dict[str, Parser]]:
    """The command's parser and each subcommand's."""
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
    demo = sub.add_parser(
        'demo', help='The drop-in API on simulated local hosts.', description=DEMO_DESCRIPTION
    )
    add_demo_arguments(demo)
    run = sub.add_parser(
        'run',
        help='Run your program with the checks installed.',
        description=RUN_DESCRIPTION,
        usage=RUN_USAGE,
    )
    add_run_arguments(run)
    analyze = sub.add_parser(
        'analyze',
        help='The verdict from the dumps a job left.',
        description=ANALYZE_DESCRIPTION,
    )
    add_analyze_arguments(analyze)
    audit_diff = sub.add_parser(
        'audit-diff',
        help="Where two runs' data first differ.",
        description=AUDIT_DIFF_DESCRIPTION,
    )
    add_audit_diff_arguments(audit_diff)
    return top, {'demo': demo, 'run': run, 'analyze': analyze, 'audit-diff': audit_diff}


def parse(argv: list[str], prog: str, version: str) -> argparse.Namespace:
    """The command line, with ``command`` set (``demo`` when none is given); for ``run``,
    ``target`` is `run_target`'s tuple.

    Raises:
        UsageError: the mistake, in one line.
    """
    top, commands = _parsers(prog, version)
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
    options: dict[str, object] = {}
    if args.check_jit:
        options['check_jit'] = True
    if args.hold_on_error:
        options['hold_on_error'] = True
    if args.allow_exec:
        options['allow_exec'] = True
    if args.audit_raise:
        options['audit_raise'] = True
    names = ('timeout', 'control_file', 'control_address', 'dump_dir', 'hold_for', 'audit',
             'audit_log')  # fmt: skip
    for name in names:
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.module is not None:
        if not args.module:
            parser.error('-m needs a module name (as in: -m package.train)')
        return options, args.module[0], True, args.module[1:]
    if args.script is None:
        parser.error('no program given: name a SCRIPT or -m MODULE')
    return options, args.script, False, list(args.args)
