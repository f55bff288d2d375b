"""The commands' shared command-line pieces: argparse that raises instead of exiting, counts.

Stdlib only (floor 0): the ``multihost`` command (`multihost._job._cli`) and the
``mhnotebook`` command (`mhnotebook._demo`) both parse with these, so a mistake reads
alike in either: one line naming it, exit status 2.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

__all__ = ['Parser', 'UsageError', 'count']


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


def count(value: str) -> int:
    """A count of hosts or devices: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'needs a whole number, got {value!r}') from None
    if number < 1:
        raise argparse.ArgumentTypeError(f'needs at least 1, got {value!r}')
    return number
