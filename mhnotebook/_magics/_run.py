"""Running a ``%%mh`` cell on the hosts and collecting its output (``%mh_wait``).

The magics keep what stays in the background (`Keeper.background`: the
cell's pending results, which ``%mh_wait`` collects later; None once nothing
runs). A timeout, an interrupt or a dead host while the output is awaited is
told here (the cell may still run on the hosts); an interrupt while the cell
is handed over is the entry point's (`_entry.delegate`).
"""

from __future__ import annotations

from typing import Any, Protocol

from IPython.core.error import UsageError

from mhnotebook._errors import (
    HostDiedError,
    HostsError,
    SessionError,
    SessionInterruptedError,
    SessionTimeoutError,
)
from mhnotebook._jobview import echo_outputs
from mhnotebook._magics._entry import delegate, print_errors, show_interrupt
from mhnotebook._session import Session, _quiet
from mhnotebook._views import where_view
from multihost._text import fmt_hosts

Pending = dict[int, Any]  # process -> its AsyncResult


class _LiveStatus:
    """A one-line per-host status that updates in place while a cell runs."""

    SYMBOL = {'running': '…', 'done': '✓', 'error': '✗', 'died': '† died'}

    def __init__(self) -> None:
        from IPython.display import display

        self.handle = display({'text/plain': 'starting …'}, raw=True, display_id=True)

    def __call__(self, state: dict[int, str], elapsed: float) -> None:
        text = '  '.join(f'process {p} {self.SYMBOL[s]}' for p, s in sorted(state.items()))
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


class Keeper(Protocol):
    """What keeps the background cell between magics (the `MultihostMagics` instance)."""

    background: Pending | None


def still_running(keeper: Keeper, session: Session) -> list[int]:
    """The living processes still running the background cell (empty: none runs)."""
    if keeper.background is None:
        return []
    dead = set(session.dead)
    return sorted(p for p, ar in keeper.background.items() if p not in dead and not ar.ready())


def before_another(keeper: Keeper, session: Session, what: str) -> None:
    """Called before anything else runs on the hosts (``what``: the magic, e.g. ``%%mh``).

    A background cell still running refuses it in one line (the engines would queue it
    behind that cell, silently); one that has finished is collected first, so its output
    is shown, never lost.
    """
    running = still_running(keeper, session)
    if running:
        done = sorted(set(keeper.background or ()) - set(running))
        finished = f' (finished on {fmt_hosts(done)})' if done else ''
        raise UsageError(
            f'{what}: a %%mh cell is still running in the background on '
            f'{fmt_hosts(running)}{finished}; %mh_wait collects its output, %mh_where shows '
            f'where they are (nothing was run: run {what} again once it is done).'
        )
    if keeper.background is not None:
        pending, keeper.background = keeper.background, None
        _show_finished(session, pending)


def _show_finished(session: Session, pending: Pending) -> None:
    """A finished background cell's output and errors (an interrupt, such as the stepper's
    Stop, in one line: it was asked for); nothing when it printed nothing and raised nothing."""
    dead = set(session.dead)
    for p, ar in pending.items():
        if p not in dead:
            try:
                ar.wait_for_output(2.0)  # the reply can come before the last output message
            except Exception:
                pass
    outputs = {p: _quiet(''.join(getattr(ar, 'stdout', '') or '')) for p, ar in pending.items()}
    failures = {}
    try:
        session.wait_outputs(pending, timeout=10.0, echo=False)
    except HostsError as exc:
        failures = dict(exc.failures)
    except SessionError as exc:  # a host died meanwhile
        print(f'%%mh: the background cell: {exc}')
    interrupted = sorted(p for p, f in failures.items() if f.ename == 'KeyboardInterrupt')
    errors = {p: f for p, f in failures.items() if p not in interrupted}
    if any(outputs.values()) or errors:
        print('%%mh: the background cell had finished; its output:')
        echo_outputs(outputs)
        print_errors(errors)
    if interrupted:
        print(f'%%mh: the background cell was interrupted on {fmt_hosts(interrupted)}.')


def run_cell(
    keeper: Keeper, session: Session, cell: str, *, timeout: float | None, bg: bool
) -> None:
    """Runs ``cell`` on every living host and prints its output, unless it runs in the
    background (``bg``, or stepping: the kernel must stay free for the stepper's buttons)."""
    before_another(keeper, session, '%%mh')
    background = bg or session.stepping  # the hosts' own setting
    pending = delegate(lambda: session.execute_async(cell))
    dead = session.dead
    if dead:  # a recoverable session: the cell runs on the survivors
        print(f'%%mh: {fmt_hosts(sorted(dead))} gone; running on {fmt_hosts(sorted(pending))}.')
    if background:
        keeper.background = pending
        print(background_note(stepping=session.stepping))
        return
    keeper.background = None
    try:
        session.wait_outputs(pending, timeout=timeout, on_status=_LiveStatus())
    except SessionTimeoutError as exc:
        keeper.background = pending  # %mh_wait collects it later
        print(
            f'%%mh: {fmt_hosts(exc.pending)} still running after {timeout:g} s '
            f'(finished: {fmt_hosts(exc.finished)}); %mh_wait collects the output. '
            'Where they are:'
        )
        _show_where(session)
    except SessionInterruptedError as exc:
        keeper.background = pending if exc.report.running else None
        show_interrupt(exc.report)
    except HostDiedError as exc:
        keeper.background = pending if exc.pending else None
        print(f'%%mh: {exc}')
        print_errors(exc.failures)
    except HostsError as exc:
        print_errors(exc.failures)


def wait(keeper: Keeper, session: Session, *, timeout: float | None) -> None:
    """Prints the output of the background cell once it is done (``timeout``: give up sooner)."""
    if keeper.background is None:
        raise UsageError('no %%mh cell is running in the background.')
    try:
        session.wait_outputs(keeper.background, timeout=timeout)
    except SessionTimeoutError as exc:
        print(f'%mh_wait: {fmt_hosts(exc.pending)} still running; see %mh_where or the stepper.')
        return
    except SessionInterruptedError as exc:
        show_interrupt(exc.report)
        if exc.report.running:
            return
    except HostDiedError as exc:
        print(f'%mh_wait: {exc}')
        if exc.pending:
            return
    except HostsError as exc:
        print_errors(exc.failures)
    keeper.background = None


def _show_where(session: Session) -> None:
    """Where every unfinished host is (its collective and stack), or why that is unknown."""
    from IPython.display import display

    try:
        display(where_view(session))
    except (SessionError, OSError, RuntimeError) as exc:
        print(f'(could not collect stacks: {exc})')
