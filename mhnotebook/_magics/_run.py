"""Running a ``%%mh`` cell on the hosts and collecting its output (``%mh_wait``).

The magics hold what stays in the background (`Holder.background`: the
cell's pending results, which ``%mh_wait`` collects later; None once nothing
runs). A timeout, an interrupt or a dead host while the output is awaited is
told here (the cell may still run on the hosts); an interrupt while the cell
is handed over is the entry point's (`_entry.delegate`).
"""

from __future__ import annotations

from typing import Any, Protocol

from IPython.core.error import UsageError

from mhnotebook._errors import (
    HostDied,
    HostsError,
    SessionError,
    SessionInterrupted,
    SessionTimeout,
    hosts_phrase,
)
from mhnotebook._magics._entry import delegate, print_errors, show_interrupt
from mhnotebook._session import Session
from mhnotebook._views import where_view

Pending = dict[int, Any]  # process -> its AsyncResult


class _LiveStatus:
    """A one-line per-host status that updates in place while a cell runs."""

    SYMBOL = {'running': '…', 'done': '✓', 'error': '✗', 'died': '† died'}

    def __init__(self) -> None:
        from IPython.display import display

        self.handle = display({'text/plain': 'starting …'}, raw=True, display_id=True)

    def __call__(self, state: dict[int, str], elapsed: float) -> None:
        text = '  '.join(f'host {p} {self.SYMBOL[s]}' for p, s in sorted(state.items()))
        if self.handle is not None:
            self.handle.update({'text/plain': f'[{elapsed:5.1f} s]  {text}'}, raw=True)


def background_note(*, stepping: bool) -> str:
    """What ``%%mh`` says when a cell runs in the background: the stepper only when stepping
    is on (the hosts pause at each collective until it releases them)."""
    if stepping:
        return (
            '%%mh: running in the background (stepping is on); release steps with the '
            'stepper (%mh_step), then collect the output with %mh_wait.'
        )
    return (
        '%%mh: running in the background (--bg); %mh_wait collects the output '
        '(%mh_where shows where the hosts are meanwhile).'
    )


class Holder(Protocol):
    """What keeps the background cell between magics (the `MultihostMagics` instance)."""

    background: Pending | None


def run_cell(
    holder: Holder, session: Session, cell: str, *, timeout: float | None, bg: bool
) -> None:
    """Runs ``cell`` on every living host and prints its output, unless it runs in the
    background (``bg``, or stepping: the kernel must stay free for the stepper's buttons)."""
    background = bg or session.stepping  # the hosts' own setting
    pending = delegate(lambda: session.execute_async(cell))
    dead = session.dead
    if dead:  # a recoverable session: the cell runs on the survivors
        print(
            f'%%mh: {hosts_phrase(sorted(dead))} gone; running on {hosts_phrase(sorted(pending))}.'
        )
    if background:
        holder.background = pending
        print(background_note(stepping=session.stepping))
        return
    holder.background = None
    try:
        session.wait_outputs(pending, timeout=timeout, on_status=_LiveStatus())
    except SessionTimeout as exc:
        holder.background = pending  # %mh_wait collects it later
        print(
            f'%%mh: hosts {exc.pending} still running after {timeout:g} s '
            f'(finished: {exc.finished}); %mh_wait collects the output. Where they are:'
        )
        _show_where(session)
    except SessionInterrupted as exc:
        holder.background = pending if exc.report.running else None
        show_interrupt(exc.report)
    except HostDied as exc:
        holder.background = pending if exc.pending else None
        print(f'%%mh: {exc}')
        print_errors(exc.failures)
    except HostsError as exc:
        print_errors(exc.failures)


def wait(holder: Holder, session: Session, *, timeout: float | None) -> None:
    """Prints the output of the background cell once it is done (``timeout``: give up sooner)."""
    if holder.background is None:
        raise UsageError('no %%mh cell is running in the background.')
    try:
        session.wait_outputs(holder.background, timeout=timeout)
    except SessionTimeout as exc:
        print(f'%mh_wait: hosts {exc.pending} still running; see %mh_where or the stepper.')
        return
    except SessionInterrupted as exc:
        show_interrupt(exc.report)
        if exc.report.running:
            return
    except HostDied as exc:
        print(f'%mh_wait: {exc}')
        if exc.pending:
            return
    except HostsError as exc:
        print_errors(exc.failures)
    holder.background = None


def _show_where(session: Session) -> None:
    """Where every unfinished host is (its collective and stack), or why that is unknown."""
    from IPython.display import display

    try:
        display(where_view(session))
    except (SessionError, OSError, RuntimeError) as exc:
        print(f'(could not collect stacks: {exc})')
