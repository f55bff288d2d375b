"""`attach`: the inspection methods of a `Session` for a job the notebook did not start.

A batch job run under ``python -m multihost run --control-file PATH`` (or
``install(control_file=...)``, ``MULTIHOST_CONTROL_FILE``) has its process 0
serve the control endpoint and write ``PATH`` (`multihost._job._attach`).
`attach` reads that file and returns an `AttachedJob`: a `ControlClient` on
the endpoint, a job view (`_jobview.JobView`) like a `Session` without
engines (where, wavefront, flight_records, timeline, the step table, stepping).
Every answer comes from the hosts' debug threads, so it works while every
main thread is blocked; nothing changes in the job unless asked (stepping),
and `AttachedJob.detach` leaves it running.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from multiprocessing import AuthenticationError
from typing import TYPE_CHECKING, Any

from mhnotebook._errors import HostsError, RemoteFailure, SessionError, SessionTimeoutError
from mhnotebook._jobview import DataView, Frame
from multihost._text import fmt_hosts

if TYPE_CHECKING:
    from mhnotebook._transfer._gather import GatherState
    from multihost import ControlClient
    from multihost.engine.tools import Tool

__all__ = ['AttachError', 'AttachedJob', 'Frame', 'attach']

#: The fields a connection file must hold.
_FIELDS = ('address', 'port', 'key')


class AttachError(SessionError):
    """The job of a connection file cannot be reached (one line: which file, why, what to do)."""


def _read(path: str) -> dict[str, Any]:
    run = f'python -m multihost run --control-file {path} SCRIPT'
    try:
        with open(path) as f:
            content = json.load(f)
    except FileNotFoundError:
        raise AttachError(
            f'no connection file {path}: start the job with `{run}` (process 0 writes it '
            "once jax.distributed.initialize ran), or copy it here from the job's machine"
        ) from None
    except (OSError, ValueError) as exc:
        raise AttachError(
            f'cannot read the connection file {path} ({type(exc).__name__}: {exc}); '
            f'it is written by `{run}`: check its permissions (mode 0600: the same user)'
        ) from None
    missing = [k for k in _FIELDS if not isinstance(content, dict) or k not in content]
    if missing:
        raise AttachError(
            f'{path} is not a multihost connection file (no {", ".join(missing)}); '
            f'give the file that `{run}` writes'
        )
    return content


def attach(path: str | os.PathLike[str], *, timeout: float = 15.0) -> AttachedJob:
    """Attaches to a running job through its connection file (see `AttachedJob`).

    Args:
        path: the file given to ``--control-file`` (``MULTIHOST_CONTROL_FILE``).
        timeout: seconds to connect, and the margin on top of each call's own.

    Raises:
        AttachError: the file is missing or unreadable, the job is gone (the
            connection is refused) or does not answer, or it refused the key.
    """
    from multihost import ControlClient

    path = os.fspath(path)
    if not timeout > 0:
        raise ValueError(f'timeout must be positive seconds, got {timeout!r}')
    info = _read(path)
    address = (str(info['address']), int(info['port']))
    where = f'{address[0]}:{address[1]}'
    try:
        client = ControlClient(address, bytes.fromhex(str(info['key'])), timeout=timeout)
    except AuthenticationError:
        raise AttachError(
            f'the job at {where} refused the key of {path}: the file is from another run; '
            'attach with the file the running job wrote'
        ) from None
    except ConnectionRefusedError:
        raise AttachError(
            f'the job of {path} is gone: nothing listens at {where} (connection refused). '
            'It ended without removing its file (killed?): delete the file, start the job again'
        ) from None
    except (OSError, ValueError) as exc:
        raise AttachError(
            f'cannot reach the job of {path} at {where} ({exc}); from another machine use '
            f'--control-address on the cluster network, or `ssh -L {address[1]}:localhost:'
            f'{address[1]} HOST` and set "address" in a copy of the file to 127.0.0.1'
        ) from None
    return AttachedJob(path, info, client)


class AttachedJob(DataView):
    """A job the notebook did not start, reached through its control endpoint.

    A `JobView` (`_jobview`): the questions a `Session` answers without
    engines, through the same implementation: `where`, `wavefront`,
    `flight_records`, `timeline`, and the step gate (`step_table`, `stepping`,
    `set_stepping`, `release`, `release_all`, `moved_on`, `stop_stepping`:
    Stop lets the hosts go, never interrupts them). Hosts that died or do not
    answer are named by the answers themselves (``silent`` in the wavefront
    and the where view). The data tools and `execute` (`DataView`, over
    this class's transport hook) run in each host's stopped frame (``frame=``,
    `in_frame`, `frame`). `detach` closes the connection; the job goes on.

    Attributes:
        path: the connection file.
        num_processes: the job's process count (from the file).
        pid: process 0's OS pid.
        started: when process 0 started serving (``time.time()``).
        control: the `multihost.ControlClient`.
    """

    kind = 'attached job'
    live = True
    has_frames = True
    num_processes: int

    def __init__(self, path: str, info: dict[str, Any], client: ControlClient):
        self.path = path
        count = int(info.get('num_processes', 0))
        self.num_processes = count or int(client.info()['num_processes'])
        self.pid = info.get('pid')
        self.started = info.get('started')
        self.control: ControlClient | None = client
        self._stepping = False
        self._gathers: GatherState | None = None
        #: The frame the data tools read (0: the innermost frame of the program; see `frames`).
        self.frame: Frame = None

    def __repr__(self) -> str:
        state = 'attached' if self.control is not None else 'detached'
        return f'<AttachedJob {self.path} {self.num_processes} processes, {state}>'

    @property
    def running(self) -> bool:
        """Whether still attached (`detach` not called)."""
        return self.control is not None

    def _client(self) -> ControlClient:
        if self.control is None:
            raise AttachError(f'detached from {self.path}: mhnotebook.attach({self.path!r}) again')
        return self.control

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:  # the job view's hook
        """Turns a job that went away mid-session into one `AttachError` that says so."""
        try:
            yield
        except TimeoutError as exc:
            raise AttachError(
                f'the job of {self.path} did not answer: {exc}. Process 0 (os pid {self.pid}) '
                'may be stopped or overloaded; try again with a larger timeout'
            ) from None
        except (OSError, EOFError) as exc:  # refused, reset, or the endpoint closed on us
            self.detach()
            why = f'{type(exc).__name__}: {exc}' if str(exc) else type(exc).__name__
            raise AttachError(
                f'the job of {self.path} is gone: its control endpoint (process 0, os pid '
                f'{self.pid}) closed the connection ({why}). If it ran with --dump-dir, '
                'read what it left with mhnotebook.postmortem(DIR) or '
                '`python -m multihost analyze DIR`'
            ) from None

    # -- the job view's hooks (`_jobview.JobView`) --------------------------------------
    def _endpoint(self) -> ControlClient:
        return self._client()

    # -- the data tools, answered in each host's stopped frame (`multihost.engine.stopped`) ----
    def frames(self, *, timeout: float = 10.0) -> dict[int, dict[str, Any]]:
        """Each host's state and its program's frames, by process.

        Every value is a dict: ``stopped`` (whether the main thread waits inside a
        call of JAX, of a library or of ours: the data tools read it then),
        ``in`` (that call, or ``'its own code'``), ``at`` (the program's innermost
        line), and ``frames``: one dict per frame of the program, innermost first
        (``n``, ``site``, ``names``: its locals). A frame's number is the
        ``frame=`` of the data tools (``--frame N`` of the magics); 0 by default.
        """
        answers = self._ask('state', timeout=timeout)
        return {p: {**a['state'], 'frames': a['frames']} for p, a in sorted(answers.items())}

    def _ask(
        self, op: str, *, timeout: float, processes: list[int] | None = None, **kw: Any
    ) -> dict[int, dict[str, Any]]:
        with self._answering():
            try:
                answers = self._client().inspect(op, processes=processes, timeout=timeout, **kw)
            except RuntimeError as exc:
                if "unknown method 'inspect'" in str(exc):
                    raise AttachError(
                        f'the job of {self.path} cannot answer the data tools: its multihost '
                        'is older or not installed there (run it with `multihost run`)'
                    ) from None
                raise
        wanted = list(range(self.num_processes)) if processes is None else list(processes)
        silent = [p for p in wanted if p not in answers]
        if silent:
            raise SessionTimeoutError(
                f'{fmt_hosts(silent)} did not answer within {timeout:g} s (gone, or '
                'its debug thread is busy); job.where() shows what each host does',
                pending=silent,
                finished=sorted(answers),
            )
        return answers

    def _call_tool(
        self,
        tool: Tool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        timeout: float,
        frame: Frame,
        processes: list[int] | None,
        on_done: Callable[[int], None] | None,
    ) -> list[Any]:
        # The transport hook (`DataView`): engine tool ``tool`` on every host's debug
        # thread, in its stopped frame; the control connection adds its margin to the wait.
        del on_done  # the answers come together
        answers = self._ask(
            'call',
            timeout=timeout,
            processes=processes,
            fn=tool.name,
            args=(args, kwargs),
            frame=self.frame if frame is None else frame,
        )
        running = {p: a['running'] for p, a in answers.items() if 'running' in a}
        if running:
            said = '; '.join(
                f'process {p} at {s["at"] or "?"}' for p, s in sorted(running.items())[:4]
            )
            raise SessionError(
                f'{fmt_hosts(sorted(running))} running its own code, not stopped ({said}): '
                'stop the job first (job.set_stepping(True) or %mh_step on: the hosts pause '
                'before their next launch), then ask again'
            )
        failures = {
            p: RemoteFailure(p, *a['error'][:3]) for p, a in answers.items() if 'error' in a
        }
        if failures:
            first = next(iter(failures.values()))
            raise HostsError(
                f'{tool.name} failed on {fmt_hosts(sorted(failures))}: '
                f'{first.ename}: {first.evalue}',
                failures,
            )
        points = [a['point'] for a in answers.values() if isinstance(a.get('point'), dict)]
        if len(points) > 1 and self._depth:
            from multihost._models._points import ReadPoint  # numpy: not at `import mhnotebook`

            self._points.append([ReadPoint.from_json(x) for x in sorted(points, key=_by_process)])
        return [answers[p]['ok'] for p in sorted(answers)]

    def _gather_where(self) -> tuple[str | None, list[str]]:
        # Each host streams its blocks to this notebook over TCP, toward the control address.
        address = self._client().address
        return f'tcp://{address[0]}:{address[1]}', [
            f'attached-{p}' for p in range(self.num_processes)
        ]

    def _transport(self, transport: str, progress: bool | None) -> tuple[str, bool | None]:
        if transport not in ('auto', 'tcp'):
            raise ValueError(
                f"an attached job's hosts stream a gather over tcp: transport='auto' or "
                f"'tcp', got {transport!r} (shm and zmq need a session's engines)"
            )
        return 'tcp', False

    def _run_cell(
        self,
        code: str,
        timeout: float | None,
        outputs: dict[int, str],
        on_status: Callable[[dict[int, str], float], None] | None,
    ) -> None:
        # The cell hook (`DataView.execute`): the ``run_cell`` tool in the stopped frames,
        # only on a job started with --allow-exec (the hosts decide).
        del on_status
        if not code.strip():
            raise ValueError('execute needs the code to run (a %%mh cell), got nothing')
        try:
            super()._run_cell(code, timeout, outputs, None)
        except HostsError as exc:
            if all(f.ename == 'PermissionError' for f in exc.failures.values()):
                raise HostsError(
                    f'the job of {self.path} was started without --allow-exec: the control '
                    'key grants inspection only (the data magics); start it with multihost run '
                    '--allow-exec to run cells on its hosts',
                    exc.failures,
                ) from None
            raise

    def detach(self) -> None:
        """Closes the connection (idempotent); the job goes on, stepping as it was left."""
        if self._gathers is not None:
            self._gathers.close()
            self._gathers = None
        if self.control is not None:
            self.control.close()
            self.control = None

    def __enter__(self) -> AttachedJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _by_process(point: dict[str, Any]) -> int:
    return int(point.get('process', 0))
