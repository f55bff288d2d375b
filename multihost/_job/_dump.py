"""Writing this host's dump (`_dumpfile` format) when something went wrong, and asking the others.

`configure` sets the directory (``install(dump_dir=...)``, ``--dump-dir``,
``MULTIHOST_DUMP_DIR``); without one nothing is ever written. `dump` builds
the document from this host's own state only (flight records, every
thread's stack, the wavefront position): it never waits on another host and
never raises (a dump that cannot be written prints one line to stderr).
`request_all` asks every other host's debug thread (`_bus`, command
``dump``) to write its own, from a background thread, bounded by a timeout:
the processes that do not answer are written into this host's dump as gone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from multihost import _recorder
from multihost._debug import _stacks, _wavefront
from multihost._exchange import _bus, _kv
from multihost._models import _dumpfile

#: A host asked to dump by another that wrote its own less than this long ago keeps it.
QUIET_S = 20.0
#: How long the dump request waits for the other hosts' answers.
REQUEST_TIMEOUT_S = 10.0


class _State:
    def __init__(self) -> None:
        self.lock = (
            threading.RLock()
        )  # re-entrant: the dump signal's handler may write on the main thread mid-write
        self.directory: str | None = None
        self.last_written = 0.0
        self.last_doc: dict[str, Any] | None = None
        # When this host last asked the others to dump (None: not yet): once per episode,
        # again only after its main thread got through a call since (`request_all`).
        self.requested_at: float | None = None
        self.writes = 0
        self.errors: set[int] = set()  # ids of errors already dumped (not again at exit)
        # A Ctrl-C found the main thread blocked and its ``interrupt`` dump was written then
        # (`_interrupt`): a KeyboardInterrupt raised later, once the wait failed, says less.
        self.interrupted_blocked = False


_state = _State()


def already_dumped(exc: BaseException) -> bool:
    """Whether ``exc`` was dumped where it was raised (the excepthook does not dump it again)."""
    return id(exc) in _state.errors


def interrupted_blocked() -> bool:
    """Whether this host's ``interrupt`` dump was written while its main thread was blocked."""
    return _state.interrupted_blocked


def interrupted_while_blocked(details: Mapping[str, Any]) -> None:
    """The ``interrupt`` dump of a Ctrl-C that found the main thread blocked (`_interrupt`),
    kept over a later KeyboardInterrupt's (`interrupted_blocked`)."""
    if dump('interrupt', {**details, 'blocked': True}):
        _state.interrupted_blocked = True


def configure(directory: str | None) -> None:
    """Dumps go to ``directory`` from now on (None: no dumps)."""
    _state.directory = os.path.abspath(directory) if directory else None


def directory() -> str | None:
    return _state.directory


def _process() -> tuple[int, int]:
    try:
        return _kv.process_index(), _kv.process_count()
    except Exception:
        return 0, 1


def _jax_version() -> str:
    jax = sys.modules.get('jax')
    return str(getattr(jax, '__version__', '')) if jax is not None else ''


def _platform() -> str:
    """``jax.default_backend()`` once this process's backends have started, else '' (a dump
    never starts them: a cold backend start waits for every other host's)."""
    if 'jax' not in sys.modules:
        return ''
    try:
        from multihost import _jax_adapter

        if not _jax_adapter.backends_started():
            return ''
        import jax

        return str(jax.default_backend())
    except Exception:
        return ''


def _memory() -> list[list[Any]]:
    """``[[device id, bytes in use, peak, limit], ...]`` of this host's devices, read from
    the allocator on the host (`Device.memory_stats`: it waits on no device, so a device stuck
    in a collective still answers); [] before the backends started (a dump never starts them)
    and where the backend reports none (CPU)."""
    if not _platform():
        return []
    try:
        import jax

        out = []
        for d in jax.local_devices():
            stats = d.memory_stats()
            if stats:
                out.append(
                    [
                        int(d.id),
                        stats.get('bytes_in_use'),
                        stats.get('peak_bytes_in_use'),
                        stats.get('bytes_limit'),
                    ]
                )
        return out
    except Exception:
        return []


def document(what: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This host's dump document (`_dumpfile` format, without ``format`` / ``version``)."""
    pid, n = _process()
    now = time.time()
    records = _recorder.snapshot(pid)
    main = _raised_from(what, details)
    front = _wavefront.front(pid, main)
    stacks = _stacks.capture(pid, main)
    doc = {
        'process': pid,
        'num_processes': n,
        'pid': os.getpid(),
        'hostname': socket.gethostname(),
        'jax_version': _jax_version(),
        'platform': _platform(),
        'memory': _memory(),
        'python': sys.version.split()[0],
        'written': now,
        'trigger': {'what': what, 'time': now, 'details': dict(details or {})},
        'front': json.loads(front.to_json()),
        'stacks': json.loads(stacks.to_json()),
        'record_fields': list(_dumpfile.RECORD_FIELDS),
        'records': [list(dataclasses.astuple(r)) for r in records],
        'gone': {},
    }
    from multihost._job import _audit, _launchtable

    # the pending launch's collectives; not while its call compiles it (it would compile
    # twice), nor in a dump written on the way out (a peer failed, an exception): lowering
    # the launch again there delayed the exit past JAX's own fate-sharing under load
    busy = front.jit_phase or what in ('peer', 'exception')
    tables = {} if busy else _launchtable.for_dump(front.pending)
    if tables:
        doc['collectives'] = tables
    if _audit.enabled() or _audit.report().findings:
        doc['audit'] = _audit.report().to_json()
    return doc


def _raised_from(what: str, details: Mapping[str, Any] | None) -> list[tuple[Any, ...]] | None:
    """The main thread's frames where its uncaught error was raised (an ``exception`` or
    ``interrupt`` dump is written from the hook, where its stack says nothing), else None."""
    if what not in ('exception', 'interrupt') or not details:
        return None
    if details.get('thread') != 'MainThread' or not details.get('traceback'):
        return None
    return [tuple(f) for f in details['traceback']]


def dump(what: str, details: Mapping[str, Any] | None = None) -> str | None:
    """Writes this host's dump (``what``: one of `_dumpfile.TRIGGERS`); its path, or None."""
    d = _state.directory
    if d is None:
        return None
    before = mark = _state.last_written
    if what != 'request':
        _state.last_written = mark = time.time()  # a request arriving meanwhile keeps this one
    writes = _state.writes
    try:
        doc = document(what, details)
        with _state.lock:
            if (
                what == 'request'
                and _state.last_doc is not None
                and _state.last_doc['trigger']['what'] != 'request'
                and (_state.writes != writes or _current())
            ):
                # This host's own trigger wrote meanwhile (while this document was taken: a
                # host that held the GIL writes its signal dump when the GIL comes back,
                # then may go on before this thread runs again): keep it.
                return None
            asked = _asked(_state.last_doc) if what != 'request' else None
            if asked is not None:
                doc['asked'] = asked
            path = _dumpfile.write(d, doc)
            _state.last_written, _state.last_doc = time.time(), doc
            _state.writes += 1
        return path
    except Exception as exc:  # a dump must never take the program down
        if _state.last_written == mark != before:
            _state.last_written = before  # nothing written: a request must not be kept by it
        print(f'multihost: could not write the dump to {d}: {exc}', file=sys.stderr)
        return None


def _asked(last: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a later dump keeps of the one written at another host's request: the moment
    the others missed this host (its position and main stack then), which a later
    trigger (``peer``, ``exception``...) must not overwrite."""
    if last is None:
        return None
    asked = last.get('asked') or (last if last['trigger']['what'] == 'request' else None)
    if asked is None or _recorder.moved_on_since(asked['trigger']['time']):
        return None  # not asked, or it went on since (a slow host that came): that is history
    if last.get('asked'):
        return dict(last['asked'])
    stacks = dict(last['stacks'])
    stacks['threads'] = list(stacks.get('threads') or ())[:1]  # the main thread's only
    return {'trigger': last['trigger'], 'front': last['front'], 'stacks': stacks}


def _mark_gone(gone: Mapping[int, str]) -> None:
    """Rewrites this host's last dump with the processes that did not answer."""
    d, doc = _state.directory, _state.last_doc
    if d is None or doc is None or not gone:
        return
    doc = {**doc, 'gone': {str(p): w for p, w in gone.items()}}
    try:
        with _state.lock:
            _dumpfile.write(d, doc)
            _state.last_doc = doc
    except Exception as exc:
        print(f'multihost: could not rewrite the dump in {d}: {exc}', file=sys.stderr)


def request_all(why: str, *, wait: bool = False) -> threading.Thread | None:
    """Asks every other host to write its dump (in a background thread): once per episode,
    so again only when this host's main thread got through a recorded call since it last
    asked, or the hang it asked for went on (`episode_over`)."""
    if _state.directory is None:
        return None
    if _state.requested_at is not None and not _recorder.moved_on_since(_state.requested_at):
        return None
    client = _kv.client()
    if client is None:
        return None
    _state.requested_at = time.time()

    def ask() -> None:
        try:
            me, n = _process()
            asked = time.time()
            replies, _ = _bus.command(client, 'dump', REQUEST_TIMEOUT_S, why=why, at=asked)
            silent = [p for p in range(n) if p not in replies and p != me]
            gone = {
                p: 'did not answer the dump request (dead, or its debug thread was not running)'
                for p in silent
                if not _accounted_for(client, p, asked)
            }
            _mark_gone(gone)
        except Exception as exc:
            print(f'multihost: could not ask the other hosts to dump: {exc}', file=sys.stderr)

    t = threading.Thread(target=ask, name='multihost-dump-request', daemon=True)
    t.start()
    if wait:
        t.join(REQUEST_TIMEOUT_S + 10)
    return t


def episode_over() -> None:
    """The wait this host asked the others about went on: the next one asks again."""
    _state.requested_at = None


def went_on(label: str, lasted: float, at: float, next_limit: float) -> bool:
    """This host's hang dump (for ``label``) was a slow wait, not a hang: the wait went on at
    ``at`` after ``lasted`` s. Rewrites the dump with ``went_on``, ``lasted`` and
    ``next_limit`` in its details (when it is still the last one written); whether it did."""
    d = _state.directory
    with _state.lock:
        doc = _state.last_doc
        if d is None or doc is None or doc['trigger']['what'] != 'hang':
            return False
        details = doc['trigger']['details']
        if details.get('record') != label or details.get('went_on'):
            return False
        more = {'went_on': at, 'lasted': round(lasted, 3), 'next_limit': next_limit}
        doc = {**doc, 'trigger': {**doc['trigger'], 'details': {**details, **more}}}
        try:
            _dumpfile.write(d, doc)
        except Exception as exc:
            print(f'multihost: could not rewrite the dump in {d}: {exc}', file=sys.stderr)
            return False
        _state.last_doc = doc
    return True


def _accounted_for(client: Any, p: int, since: float) -> bool:
    """Host ``p`` did not answer the dump request, yet is not gone: it had ended cleanly
    (its liveness key says ``done``), or its own dump is in this host's directory, written
    since ``since`` minus `QUIET_S` (it dumped for its own reason, then ended)."""
    try:
        if _kv.stamp_says_done(_kv.get(client, _kv.key('alive', p))):
            return True
    except Exception:
        pass
    d = _state.directory
    if d is None:
        return False
    try:
        return os.path.getmtime(os.path.join(d, _dumpfile.file_name(p))) >= since - QUIET_S
    except OSError:
        return False


def _current() -> bool:
    """This host's last dump still shows where it is: written less than `QUIET_S` ago, and
    its main thread has got through no call since."""
    last = _state.last_written
    return time.time() - last < QUIET_S and not _recorder.moved_on_since(last)


def _answered(asked: Any) -> bool:
    """This host wrote a dump of its own after the request was made (a host that held the
    GIL reads a request late: the dump its signal wrote when the GIL came back answers it,
    also when its main thread went on since)."""
    last = _state.last_doc
    return (
        isinstance(asked, (int, float))
        and last is not None
        and last['trigger']['what'] != 'request'
        and _state.last_written >= asked
    )


def _on_request(client: Any, order: dict[str, Any]) -> str:
    """The ``dump`` command: write this host's dump, unless it wrote one just now."""
    if _state.directory is None:
        return json.dumps({'path': None})
    if order.get('by') == _process()[0] or _current() or _answered(order.get('at')):
        return json.dumps({'path': 'kept'})
    details = {'by': order.get('by'), 'why': order.get('why', '')}
    return json.dumps({'path': dump('request', details)})


def wire() -> None:
    """The debug thread answers 'dump' (`multihost._job._wiring`)."""
    _bus.register('dump', _on_request)


def error_details(exc: BaseException) -> tuple[str, dict[str, Any]]:
    """(trigger, details) of a raised timeout or mismatch error."""
    from multihost._errors import BarrierTimeoutError, CollectiveMismatchError

    details: dict[str, Any] = {'error': type(exc).__name__, 'message': str(exc)[:4000]}
    if isinstance(exc, BarrierTimeoutError):
        details.update(
            name=exc.name,
            timeout=exc.timeout,
            missing=list(exc.missing),
            positions={str(p): _describe(r) for p, r in exc.positions.items()},
        )
        return 'timeout', details
    if isinstance(exc, CollectiveMismatchError):
        details.update(seq=exc.seq, calls={str(p): _describe(r) for p, r in exc.calls.items()})
        return 'mismatch', details
    return 'exception', details


def _describe(rec: Any) -> dict[str, Any]:
    out = {'describe': rec.describe() if hasattr(rec, 'describe') else str(rec)}
    for f in ('kind', 'name', 'seq', 'site'):
        if hasattr(rec, f):
            out[f] = getattr(rec, f)
    return out


def on_error(exc: Exception) -> None:
    """`_sequence.ERROR_HOOKS`: a checked collective timed out or mismatched."""
    if _state.directory is None:
        return
    what, details = error_details(exc)
    _state.errors.add(id(exc))
    dump(what, details)
    request_all(f'process {_process()[0]}: {what} in {details.get("name", "a collective")}')
