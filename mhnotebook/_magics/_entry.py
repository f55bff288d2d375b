"""What every magic stands on: the magics' session, delegating to it, the entry points.

`delegate` runs a `Session` call for a magic: errors become a one-line
`UsageError` that says what to do; an interrupt (Ctrl-C while it waited) raises
`_Interrupted`. The entry points of this room (`line_magic`, `cell_magic`:
IPython's, wrapped) are the one place that catches it: they show what happened
on the hosts and return None, so no magic can forget to check for an interrupt.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

from IPython.core import magic
from IPython.core.error import UsageError

from mhnotebook._errors import (
    HostsError,
    InterruptReport,
    RemoteFailure,
    SessionError,
    SessionInterruptedError,
)
from mhnotebook._session import Session
from mhnotebook._views import stacks_view
from multihost._text import fmt_hosts

NO_SESSION = (
    'no cluster yet: start one with  %mh_cluster start -n 4 -d 2  (simulated local '
    'hosts) or  %mh_cluster connect --profile NAME  (an existing ipyparallel cluster).'
)

#: When the magics' cluster was stopped (``%mh_cluster stop``, ``Session.stop()``).
STOPPED = (
    'no cluster: the last one was stopped. Start a new one with  %mh_cluster start -n 4 -d 2  '
    'or  %mh_cluster connect --profile NAME.'
)

_current: list[Session | None] = [None]  # the magics' session (one per kernel)


def _none_running(session: Session | None) -> str:
    return NO_SESSION if session is None else STOPPED


P = ParamSpec('P')
R = TypeVar('R')


def in_use() -> Session | None:
    """The magics' session (None before the first ``%mh_cluster start`` or ``connect``)."""
    return _current[0]


def use(session: Session | None) -> None:
    """Makes ``session`` the magics' (and `current_session`'s)."""
    _current[0] = session


def current_session() -> Session:
    """The session the ``%mh_*`` magics use (started by ``%mh_cluster``), for Python code."""
    session = in_use()
    if session is None or not session.running:
        raise SessionError(_none_running(session))
    return session


def running(session: Session | None) -> Session:
    """``session`` if it runs; else the `UsageError` that says how to start one."""
    if session is None or not session.running:
        raise UsageError(_none_running(session))
    return session


class _Interrupted(Exception):
    """An interrupt came while `delegate` waited: the entry point shows ``report``, returns None."""

    def __init__(self, report: InterruptReport):
        super().__init__(report.message)
        self.report = report


def delegate(fn: Callable[[], R]) -> R:
    """Runs a `Session` call for a magic.

    An interrupt raises `_Interrupted` (the magic's entry point shows it);
    errors become a one-line `UsageError` that says what to do.
    """
    try:
        return fn()
    except SessionInterruptedError as exc:
        raise _Interrupted(exc.report) from None
    except HostsError as exc:
        raise UsageError(first_error(exc)) from None
    except (SessionError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _answers_interrupts(fn: Callable[P, R]) -> Callable[P, R | None]:
    """``fn``, an interrupt in it shown and answered with None (the one catch of `_Interrupted`)."""

    @functools.wraps(fn)
    def entry(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return fn(*args, **kwargs)
        except _Interrupted as exc:
            show_interrupt(exc.report)
            return None

    return entry


def line_magic(fn: Callable[P, R]) -> Callable[P, R | None]:
    """IPython's ``@line_magic``; an interrupt while the magic waited is shown, not raised."""
    return cast(Callable[P, 'R | None'], magic.line_magic(_answers_interrupts(fn)))


def cell_magic(fn: Callable[P, R]) -> Callable[P, R | None]:
    """IPython's ``@cell_magic``; an interrupt while the magic waited is shown, not raised."""
    return cast(Callable[P, 'R | None'], magic.cell_magic(_answers_interrupts(fn)))


def show_interrupt(report: InterruptReport) -> None:
    """The interrupt's one line, then where each host was when it came."""
    print(f'%mh: {report.message}')
    if report.where:
        from IPython.display import display

        print('Where each process was:')
        display(stacks_view(report.where))


def first_error(exc: HostsError) -> str:
    """The lowest failing host's ``ename: evalue`` (the same error is usually on every host)."""
    if not exc.failures:
        return str(exc)
    return exc.failures[min(exc.failures)].summary


def print_errors(failures: dict[int, RemoteFailure]) -> None:
    """Each distinct traceback once, under the processes that raised it (``--- processes
    0-7 ---``: a mistake every host made is one traceback, not one per host)."""
    by_text: dict[str, list[int]] = {}
    for p, failure in sorted(failures.items()):
        by_text.setdefault(failure.text, []).append(p)
    for text, processes in by_text.items():
        print(f'--- {fmt_hosts(processes)} ---\n{text}')
