"""Hold on error: the host whose program raised, and every other host, stay where they are.

With ``install(hold_on_error=True)`` (``multihost run --hold-on-error``,
``MULTIHOST_HOLD_ON_ERROR=1``) an uncaught exception on a host does not end
it at once (`_job._fate` calls `hold` from its excepthook, after printing
the traceback): the host turns stepping on for every host (`_stepgate`: the
others stop at their next checked collective, barrier or recorded launch; a
host already inside a device collective that waits for this one stays
there), tells every debug thread what failed (bus command ``held``: each
logs one line), and its main thread waits, the traceback kept, until
stepping is turned off (``job.release_all()``, ``%mh_step continue``) or
``hold_for`` seconds passed. Then the error goes on as without the flag
(`_job._fate`: the others are ended, exit codes as always). Meanwhile an
attached notebook reads the stopped frames (`multihost.engine.stopped`: on this
host, the frames of the traceback, innermost first).

JAX's heartbeats come from its client's own threads, so a stopped job is not
declared dead by the coordination service.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from types import FrameType, TracebackType
from typing import Any

from multihost._debug import _stepgate
from multihost._defaults import DEFAULT_HOLD_S, HoldConfig  # noqa: F401  (re-exported)
from multihost._exchange import _bus, _kv

log = logging.getLogger('multihost')

#: Seconds between looks at the stepping flag while held (also how soon a release lands).
_SLICE_S = 0.5


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.config = HoldConfig()
        self.error: dict[str, Any] | None = None  # this host's held error
        self.tb: TracebackType | None = None
        self.peer: dict[str, Any] | None = None  # another host's, as it told us
        self.said: set[str] = set()  # errors this host's lines named in full already


_state = _State()


def configure(config: HoldConfig) -> None:
    """Turns holding on (or off) for this process (`_job._fate.patch`)."""
    with _state.lock:
        _state.config = config
    _bus.register('held', _on_held)


def enabled() -> bool:
    """Whether an uncaught exception holds the job (`configure`)."""
    return _state.config.enabled


def held_error() -> dict[str, Any] | None:
    """The error this host is held at (``process``, ``error``, ``site``, ``since``,
    ``until``), else the one another host told it about, else None."""
    return _state.error or _state.peer


def held_here() -> dict[str, Any] | None:
    """The error this host's main thread is held at (None: not held on an error)."""
    return _state.error if _state.tb is not None else None


def traceback_frames() -> list[FrameType]:
    """The frames of the traceback this host is held at, innermost first (empty if none)."""
    tb, frames = _state.tb, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def describe(error: dict[str, Any]) -> str:
    """``process 2 raised ValueError('bad batch') at train.py:72``."""
    return f'process {error["process"]} raised {error["error"]} at {error["site"]}'


def _said(error: dict[str, Any]) -> str:
    """`describe`, once per error on this host's lines: the next host raising the same error
    (every host raises an `AuditError` of ``--audit-raise``) is ``process 1 raised it too``."""
    with _state.lock:
        if error['error'] in _state.said:
            return f'process {error["process"]} raised it too, at {error["site"]}'
        _state.said.add(error['error'])
    return describe(error)


def _attach_hint() -> str:
    """How to reach the stopped job from a notebook (`InstallOptions` refuses holding without a
    control file, so there is one)."""
    path = _state.config.control_file or 'CONTROL_FILE'
    return f"%load_ext mhnotebook, then %mh_attach {path} (or mhnotebook.attach('{path}'))"


def hold(error: str, site: str, tb: TracebackType | None) -> None:
    """This host's program raised ``error`` at ``site``: hold every host; returns when the hold
    ends (stepping turned off by a release, or ``hold_for`` seconds), the error to go on."""
    config = _state.config  # one reading: a later configure does not change this hold
    now = time.time()
    info = {
        'process': _kv.process_index(),
        'error': error,
        'site': site,
        'since': now,
        'until': now + config.hold_for,
    }
    _state.error, _state.tb = info, tb
    try:
        _stepgate.set_stepping(True)
        client = _bus.distributed()
        if client is not None:
            _bus.command(client, 'held', 10.0, error=json.dumps(info))
    except Exception as exc:  # the service is gone: nothing to hold for
        log.warning('multihost: cannot hold the job (%s: %s)', type(exc).__name__, exc)
        _state.error, _state.tb = None, None
        return
    log.warning(
        'multihost: %s; holding every host for at most %.0f s (--hold-for). To inspect it: %s; '
        'job.release_all() (%%mh_step continue) then lets the error go on',
        _said(info),
        config.hold_for,
        _attach_hint(),
    )
    deadline = time.monotonic() + config.hold_for
    try:
        while time.monotonic() < deadline and _stepgate.stepping_enabled():
            time.sleep(_SLICE_S)
    finally:
        if _stepgate.stepping_enabled():
            why = f'the hold ended after {config.hold_for:.0f} s (--hold-for)'
        else:
            why = 'released'
        log.warning('multihost: %s; the error of process %d goes on', why, info['process'])
        _state.tb = None  # the frames go with the error


def _on_held(client: Any, order: dict[str, Any]) -> str:
    """Another host holds the job on its error: remember it and say so (the debug thread)."""
    del client
    try:
        info = json.loads(order.get('error', '{}'))
    except ValueError:
        return json.dumps({'ok': False})
    if info.get('process') != _kv.process_index():
        _state.peer = info
        log.warning(
            'multihost: %s; this host (process %d) holds at its next collective, barrier or '
            'launch until released (at most %.0f s)',
            _said(info),
            _kv.process_index(),
            max(0.0, float(info.get('until', 0)) - time.time()),
        )
    return json.dumps({'ok': True})
