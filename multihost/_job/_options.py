"""Every option of `multihost.install` and ``multihost run``, declared once: `OPTIONS`.

One `Option` per option: its ``install`` keyword (``name``), from which its flag
(``--hold-for``) and environment variable (``MULTIHOST_HOLD_FOR``) follow, how its value is
parsed (the same from a flag, a keyword and the environment), its default, one sentence of
help and its check. From that table come:

* ``multihost run``'s arguments and the options of its parse (`_cli.add_run_arguments`,
  `_cli.run_target`);
* `install`'s keyword handling, the environment's reading and every check
  (`InstallOptions.resolve`), and the ``Args:`` of its docstring (`install_args`);
* the option reference of docs/API.md §4.8 (`reference_markdown`; tests/engine/test_options.py
  keeps it true, and says how to rewrite it: `write_reference`).

A keyword or flag given wins; else its environment variable; else its default. A bad value
is a one-line `ValueError` naming the keyword, the flag (argparse's ``argument --timeout:``)
or the variable (``MULTIHOST_HOLD_FOR='x':``) and what it needs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from multihost._defaults import (
    AUDIT_EVERY,
    AUDIT_FIRST,
    DEFAULT_HOLD_S,
    DEFAULT_TIMEOUT,
    HoldConfig,
    audit_every,
    timeout_from_env,
)

#: An environment variable that turns a flag on says one of these (any other value: off).
_ON = ('1', 'true', 'on', 'yes')
_OFF = ('', '0', 'false', 'off', 'no')


# -- how values are read ---------------------------------------------------------------------


def _seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError('needs a number of seconds') from None
    if not seconds > 0:
        raise ValueError('needs a positive number of seconds')
    return seconds


def _text(value: Any) -> str:
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ValueError('needs a string')
    if not text:
        raise ValueError('needs a non-empty value')
    return text


def _every(value: Any) -> int:
    try:
        return audit_every(value)
    except ValueError:
        raise ValueError(
            f'needs N, a whole number (after the first {AUDIT_FIRST} launches of each '
            f'function, every N-th is audited; on = {AUDIT_EVERY}; 0 = off)'
        ) from None


# -- the checks of a resolved value ----------------------------------------------------------


def _control_file(path: str) -> str:
    path = os.path.abspath(path)
    folder = os.path.dirname(path) or '.'
    if not os.path.isdir(folder):
        raise ValueError(
            f'control_file {path!r}: the folder {folder!r} does not exist; '
            'create it or give a path in an existing folder'
        )
    return path


def _audit_log(path: str) -> str:
    if not os.path.isdir(path):
        raise ValueError(
            f'audit_log={path!r} is not a directory: create it first (each host '
            'writes audit-<process>.jsonl there)'
        )
    return os.path.abspath(path)


def _dump_dir(path: str) -> str:
    """Raises ValueError (one line) when the dumps could not be written to ``path``: found at
    start, not when a dump is needed (days later). Creates nothing: a job where nothing goes
    wrong writes nothing."""
    path = os.path.abspath(path)
    at = path
    while not os.path.exists(at):
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    if not os.path.isdir(at):
        raise ValueError(
            f'dump_dir={path!r} cannot be created: {at!r} is a file (give a directory, '
            '--dump-dir or MULTIHOST_DUMP_DIR)'
        )
    # A file made and removed at once, not os.access: root passes os.access almost
    # everywhere (/proc, a directory of mode 0555), and neither it nor the mode bits know
    # a read-only mount or a full quota's refusal.
    try:
        with tempfile.TemporaryFile(dir=at, prefix='.multihost-probe-'):
            pass
    except OSError as exc:
        raise ValueError(
            f'dump_dir={path!r}: no file can be made in {at!r} ({exc.strerror or exc}); give '
            'a directory this user can write (--dump-dir or MULTIHOST_DUMP_DIR)'
        ) from None
    return path


# -- the table -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of `install` and ``multihost run``.

    Attributes:
        name: the keyword of `install` and the field of `InstallOptions`; the flag is
            ``--`` and the name with dashes (`flag`), the variable ``MULTIHOST_`` and the name
            in capitals (`env`).
        help: what it does, one sentence without its full stop; ``{other}`` stands for the
            option ``other`` (its flag on the command line, its keyword in Python).
        metavar: the value's name in the help (``S``, ``DIR``); empty: a flag, on or off.
        parse: a value from the command line, the environment or a keyword -> the option's
            value; raises ValueError saying what it needs (a flag's is not used: on when
            given, or when its variable says 1, true, on or yes).
        default: its value when given nowhere.
        shown: the default in words, where the value does not say it.
        check: the parsed value -> the value kept (a path made absolute); raises ValueError.
        bare: the word a flag written without its value stands for (``--audit``: ``on``).
        from_env: reads its variable itself (None when unset; ``MULTIHOST_TIMEOUT`` is
            `_sequence`'s too).
    """

    name: str
    help: str
    metavar: str = ''
    parse: Callable[[Any], Any] = bool
    default: Any = None
    shown: str = ''
    check: Callable[[Any], Any] | None = None
    bare: str | None = None
    from_env: Callable[[], Any] | None = None

    @property
    def flag(self) -> str:
        """``--hold-for``."""
        return '--' + self.name.replace('_', '-')

    @property
    def env(self) -> str:
        """``MULTIHOST_HOLD_FOR``."""
        return 'MULTIHOST_' + self.name.upper()

    @property
    def written(self) -> str:
        """The flag as ``--help`` shows it: ``--check-jit``, ``--timeout S``, ``--audit [N]``."""
        if self.is_flag:
            return self.flag
        return f'{self.flag} [{self.metavar}]' if self.bare else f'{self.flag} {self.metavar}'

    @property
    def is_flag(self) -> bool:
        """On or off, without a value (``--check-jit``; ``MULTIHOST_CHECK_JIT=1``)."""
        return not self.metavar

    def default_words(self) -> str:
        """The default as the help says it ('' for a flag off by default)."""
        if self.shown:
            return self.shown
        if isinstance(self.default, float):
            return f'{self.default:g}'
        return '' if self.default in (None, False) else str(self.default)

    def value(self, given: Any) -> Any:
        """The option's value: ``given`` (a keyword; None, or False for a flag: not given),
        else its environment variable, else the default; parsed and checked.

        Raises:
            ValueError: a bad value, naming the keyword or the variable and what it needs.
        """
        if self.is_flag:
            if given:
                return True
            raw = os.environ.get(self.env, '').strip()
            if raw.lower() not in _ON + _OFF:
                raise ValueError(
                    f'{self.env}={raw!r}: needs 1, true, on or yes (on) or 0, false, off or no '
                    '(off), or unset it (default: off)'
                )
            return raw.lower() in _ON
        if given is not None and given != '':
            return self._checked(given, f'{self.name}={given!r}: ', '')
        if self.from_env is not None:  # its own messages
            found = self.from_env()
            return self.default if found is None else self._checked(found, '', '')
        raw = os.environ.get(self.env, '').strip()
        if raw:
            default = self.default_words()
            unset = f', or unset it (default: {default})' if default else ', or unset it'
            return self._checked(raw, f'{self.env}={raw!r}: ', unset)
        return self.default

    def _checked(self, value: Any, where: str, unset: str) -> Any:
        try:
            parsed = self.parse(value)
        except ValueError as exc:
            raise ValueError(f'{where}{exc}{unset}') from None
        return parsed if self.check is None else self.check(parsed)


OPTIONS: tuple[Option, ...] = (
    Option(
        'check_jit',
        'Before each jitted launch that spans devices of more than one process, check that '
        'every host launches the same computation',
    ),
    Option(
        'timeout',
        'Seconds after which a collective that some host never reaches raises '
        'BarrierTimeoutError naming the missing hosts',
        metavar='S',
        parse=_seconds,
        shown=f"wait as long as JAX's would, logging who is missing every {DEFAULT_TIMEOUT:g} s",
        from_env=timeout_from_env,
    ),
    Option(
        'control_file',
        'Process 0 serves a control endpoint and writes its connection file here (mode 0600, '
        'removed at a clean exit), for mhnotebook.attach from a notebook',
        metavar='PATH',
        parse=_text,
        shown='no endpoint',
        check=_control_file,
    ),
    Option(
        'control_address',
        'The interface the control endpoint listens on; one on the cluster network lets a '
        'notebook on another machine attach',
        metavar='HOST',
        parse=_text,
        default='127.0.0.1',
        shown='127.0.0.1, this machine only',
    ),
    Option(
        'dump_dir',
        'Each host writes its dump (process-<i>.json) here when something goes wrong (a '
        'timeout, a mismatch, an uncaught exception, a hang, a preemption notice, or SIGUSR1 '
        "sent to it), for 'multihost analyze DIR'",
        metavar='DIR',
        parse=_text,
        shown='no dumps',
        check=_dump_dir,
    ),
    Option(
        'hold_on_error',
        'When the program raises on a host, hold every host where it is (the failing one at its '
        'error, the others at their next collective, barrier or launch) for at most {hold_for} '
        'seconds, so a notebook can attach (needs {control_file}) and inspect the values; '
        'job.release_all() in the notebook ends the hold and the error goes on; with '
        '{check_jit} too, every host holds before its launch, so state a step donates stays '
        'readable',
    ),
    Option(
        'hold_for',
        'With {hold_on_error}: the longest hold, in seconds; then the error goes on as without '
        'the hold',
        metavar='S',
        parse=_seconds,
        default=DEFAULT_HOLD_S,
    ),
    Option(
        'allow_exec',
        'Let a notebook attached with the control key run code cells on the hosts, in their '
        'held frames: whoever holds the key then runs code as the job',
        shown='off, the key grants inspection only',
    ),
    Option(
        'audit',
        'Audit the launches that span processes while the job runs: the first '
        f'{AUDIT_FIRST} of each jitted function, then every N-th (N left out or on: '
        f'{AUDIT_EVERY}), compared across hosts off the main thread: replica drift, '
        'duplicate data, the first NaN or Inf, each reported once on every host',
        metavar='N',
        parse=_every,
        default=0,
        shown='off',
        bare='on',
    ),
    Option(
        'audit_log',
        "An existing directory where each host writes the fingerprints of the audited launches' "
        'fresh inputs (audit-<process>.jsonl), for "multihost audit-diff" between two runs; '
        'turns the audit on',
        metavar='DIR',
        parse=_text,
        shown='no log',
        check=_audit_log,
    ),
    Option(
        'audit_raise',
        "The audit's first finding raises AuditError on every host at its next jitted launch, "
        'so the job ends there, or is held there with {hold_on_error}; turns the audit on',
    ),
    Option(
        'audit_replay',
        "At the audit's first drift or NaN finding, the next launch of that function is held "
        'on every host and replayed first (multihost.replay, every replica given process '
        "0's host-local values): every host prints where the hosts part, written to "
        '{dump_dir} too (multihost analyze reads it); the audited launches wait for their '
        'verdict; turns the audit on',
    ),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


# -- what the table says, for each reader -----------------------------------------------------


def _sentence(option: Option, ref: Callable[[Option], str]) -> str:
    return option.help.format_map({o.name: ref(o) for o in OPTIONS})


def cli_help(option: Option) -> str:
    """The option's help in ``multihost run --help``: one sentence."""
    said = _sentence(option, lambda o: o.flag)
    env = f'{option.env}=1' if option.is_flag else option.env
    default = option.default_words()
    return f'{said} ({"default: " + default + "; " if default else ""}{env} too).'


def install_args(indent: str = '      ') -> str:
    """The ``Args:`` of `install`'s docstring."""
    out = []
    for option in OPTIONS:
        said = _sentence(option, lambda o: f'``{o.name}``')
        default = option.default_words()
        value = '1' if option.is_flag else option.metavar
        where = f'``{option.written}``, ``{option.env}={value}``'
        if default:
            where += f'; default: {default}'
        text = f'{option.name}: {said} ({where}).'
        out.append(textwrap.fill(text, 88, initial_indent=indent, subsequent_indent=indent + '  ',
                                 break_on_hyphens=False, break_long_words=False))  # fmt: skip
    return '\n'.join(out)


#: The lines around the generated reference in docs/API.md.
REFERENCE_BEGIN = '<!-- the options of install and multihost run: written by _options.py -->'
REFERENCE_END = '<!-- end of the options -->'


def reference_markdown() -> str:
    """The option reference of docs/API.md: one row per option (between the two markers)."""
    rows = [
        '| `install(...)` | `multihost run` | environment | default | what it does |',
        '| --- | --- | --- | --- | --- |',
    ]
    for option in OPTIONS:
        said = _sentence(option, lambda o: f'`{o.flag}`').replace('<', '&lt;')  # not HTML
        value = 'True' if option.is_flag else option.metavar
        env = f'{option.env}={"1" if option.is_flag else option.metavar}'
        default = option.default_words() or 'off'
        rows.append(
            f'| `{option.name}={value}` | `{option.written}` | `{env}` | {default} | {said}. |'
        )
    return '\n'.join([REFERENCE_BEGIN, *rows, REFERENCE_END])


def write_reference(path: str) -> bool:
    """Puts `reference_markdown` between the markers of ``path``; True when it changed."""
    with open(path) as f:
        text = f.read()
    start, end = text.index(REFERENCE_BEGIN), text.index(REFERENCE_END) + len(REFERENCE_END)
    new = text[:start] + reference_markdown() + text[end:]
    if new != text:
        with open(path, 'w') as f:
            f.write(new)
    return new != text


# -- the resolved options --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InstallOptions:
    """The options of one `multihost.install`, resolved (`resolve`), handed to every patcher
    (`_install.patchers`). Each field is the option of `OPTIONS` of that name (its help says
    what it does), except hold-on-error's, which are its own part.

    Attributes:
        timeout: given, else ``MULTIHOST_TIMEOUT``, else None (`wait`).
        hold: ``hold_on_error``, ``hold_for`` and the control file, for `_debug._hold`.
        audit: N (0: off; turned on by ``audit_log``, ``audit_raise`` and ``audit_replay``
            too).
    """

    check_jit: bool = False
    timeout: float | None = None
    control_file: str | None = None
    control_address: str = BY_NAME['control_address'].default
    dump_dir: str | None = None
    hold: HoldConfig = HoldConfig()
    allow_exec: bool = False
    audit: int = 0
    audit_log: str | None = None
    audit_raise: bool = False
    audit_replay: bool = False

    @property
    def wait(self) -> float:
        """An installed call's wait: the timeout, else forever (`math.inf`: the round logs who
        is missing each period, and waits on)."""
        return math.inf if self.timeout is None else self.timeout

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> InstallOptions:
        """The options ``given`` (keyword -> value, None: not given) with the environment's
        and the defaults, parsed and checked.

        Raises:
            ValueError: a bad value, or options that do not go together (one line each).
            TypeError: a name that is no option.
        """
        unknown = sorted(set(given) - set(BY_NAME))
        if unknown:
            raise TypeError(f'no option {", ".join(unknown)}: the options are {", ".join(BY_NAME)}')
        v = {option.name: option.value(given.get(option.name)) for option in OPTIONS}
        if v['hold_on_error'] and not v['control_file']:
            raise ValueError(
                '--hold-on-error needs --control-file PATH (MULTIHOST_CONTROL_FILE): without it '
                'no notebook can attach to the held job; add it, or drop --hold-on-error'
            )
        audit = v['audit']
        if v['audit_log'] is not None or v['audit_raise'] or v['audit_replay']:
            audit = audit or AUDIT_EVERY
        return cls(
            check_jit=v['check_jit'],
            timeout=v['timeout'],
            control_file=v['control_file'],
            control_address=v['control_address'],
            dump_dir=v['dump_dir'],
            hold=HoldConfig(v['hold_on_error'], v['hold_for'], v['control_file']),
            allow_exec=v['allow_exec'],
            audit=audit,
            audit_log=v['audit_log'],
            audit_raise=v['audit_raise'],
            audit_replay=v['audit_replay'],
        )
