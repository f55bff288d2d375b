"""One host's error ends the job in seconds, every host saying why (fate-sharing with a verdict).

A patcher of `multihost.install` (`_install.patchers`): it arms once
``jax.distributed.initialize`` has returned (or at once if it has), in every
process of a job run under install (``multihost run``, ``MULTIHOST_INSTALL``).
``MULTIHOST_FATE=0`` leaves it off, and so does a recoverable job
(``jax_enable_recoverability``: a host that leaves is expected, the others go on).

- **This host fails**: an uncaught exception (``sys.excepthook``; under
  ``multihost run`` also ``SystemExit`` with a non-zero code, `failed_exit`).
  Before anything else it tells every other host, through their debug threads
  (`_bus` command ``fate``, answered whatever their main threads do: inside a
  launch, a device wait, a barrier, user code); then Python prints the
  traceback (and writes the dump) as usual; then, still in the hook, it waits
  at most `ANNOUNCE_S` for the others to have heard and ends with its own code
  (1 for an exception, as Python's; the ``SystemExit`` code), before the
  interpreter's teardown (the program's threads joined, the exit handlers of
  its libraries, JAX's shutdown barrier), which would wait for hosts that will
  not come.
- **Another host failed**: the debug thread logs one line to stderr (who
  failed, with what, where; where this host was), writes this host's dump
  (trigger ``peer``) when a dump directory is set, answers, and ends the
  process with `EXIT_PEER_FAILED`. A host that fails itself within `GRACE_S`
  keeps its own verdict and code.

- **A host vanishes** (SIGKILL, the out-of-memory killer, a lost machine): it tells
  nobody. Every host's watcher thread (``multihost-fate-watch``) stamps its key
  ``mh/alive/<p>`` every `watch_period` seconds (one RPC: a counter and its main
  thread's last flight record); process 0's watcher reads them all (one directory
  read) and, when a host's stamp has not changed for `lost_after` seconds (a quarter
  of ``heartbeat_timeout_seconds``: before JAX's own missed-heartbeat verdict, which
  comes half to all of it after the host went silent and aborts every survivor with
  SIGABRT before it can say anything), issues the ``fate``
  command with ``lost`` set: every survivor logs one line naming the lost host and
  where it was last, dumps (trigger ``lost``), and ends with `EXIT_PEER_FAILED`.
  A host that ends normally writes ``done`` there first (never called lost).
- **A host ends early** (its program ended, exit code 0, e.g. ``sys.exit(0)`` mid-run)
  while others wait for it: not a failure, but they would wait for ever. Each stamp
  also says how long the host's main thread has been waiting across processes (a
  checked collective or barrier, or a launch spanning processes not done on device,
  `_cross_wait`); when a host has ended and, `EARLY_S` later, another is still in such
  a wait (for `EARLY_S` or more), process 0 issues ``fate`` with ``early`` set: the
  waiting hosts log one line naming the host that ended, dump (``peer``) and end with
  `EXIT_PEER_FAILED`; the hosts that had ended leave with 0, saying so, not in JAX's
  shutdown barrier (which would wait for the others).

A job where nothing fails is untouched: the exit is JAX's (the only keys written are
the liveness stamps, ``mh/alive/``).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
import types
from typing import Any, NoReturn

from multihost import _jax_adapter
from multihost._debug import _hold
from multihost._exchange import _bus, _kv
from multihost._job._options import InstallOptions
from multihost._text import failure_phrase, fmt_hosts, short_site

#: The exit code of a host ended because another host failed (``EX_TEMPFAIL``: the
#: job may be retried; the failing host exits with its own code).
EXIT_PEER_FAILED = 75
#: How long a failing host waits, at exit, for the other hosts to have heard it.
ANNOUNCE_S = 10.0
#: A host told of another's failure first waits this long: one that fails too keeps its own.
GRACE_S = 1.0
#: A host has ended with code 0 and, this long after, another still waits across processes
#: (for at least this long): the job cannot end by itself; every host is ended.
EARLY_S = 10.0

_PY_EXIT = sys.exit  # Python's, whatever is patched later
_LIB_MARKERS = ('/site-packages/', '/dist-packages/', '/lib/python', '<frozen ')


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.original: Any = None  # JAX's jax.distributed.initialize, while patched
        self.patched: Any = None
        self.armed = False
        self.prev_hook: Any = None
        self.failed: int | None = None  # this host's exit code once it failed
        self.failed_now = threading.Event()  # set with `failed`: wakes a `fate` answer's grace
        # `fate` answers of this host's debug thread not yet written (a failing host waits
        # for them before it leaves: the asker would wait ANNOUNCE_S for a host gone).
        self.answering = 0
        self.answered = threading.Condition()
        self.ending = False  # another host's failure is ending this one (exit 75)
        self.announcing: threading.Thread | None = None
        self.heard: dict[int, str] = {}  # replies to this host's announcement
        self.heartbeat_s = 100.0  # the job's heartbeat_timeout_seconds (JAX's default)
        self.timeout = math.inf  # an installed collective's wait (`InstallOptions.wait`)
        self.lost: int | None = None  # a host found lost: the others out but this one
        self.watching = False
        self.exit_call: tuple[Any, Any] | None = None  # (code, frame) of a sys.exit call
        self.end_site = ''  # where this host's program ended (SystemExit 0), when known
        self.done = False  # its liveness key says done: the watcher stamps no more
        # Held while writing this host's liveness key: a stamp built before `_done` must not
        # land after its ``done`` (the host would look silent, then lost).
        self.stamp_lock = threading.Lock()
        self.leaving = False  # an ended host is leaving (`_leave_ended`)
        self.sys_exit: Any = None  # Python's sys.exit, while patched


_state = _State()


def enabled() -> bool:
    """``MULTIHOST_FATE`` is not ``0`` (default on)."""
    return os.environ.get('MULTIHOST_FATE', '1').strip() not in ('0', 'false', 'no', 'off')


def patch(options: InstallOptions) -> None:
    """Arms once ``jax.distributed.initialize`` has returned (now, if it has)."""
    if not enabled():
        return
    _state.timeout = options.wait
    _hold.configure(options.hold)  # --hold-on-error: a failing host holds the job first
    import jax.distributed

    with _state.lock:
        if _state.original is None:
            original = _state.original = jax.distributed.initialize

            @functools.wraps(original)
            def initialize(*args: Any, **kwargs: Any) -> Any:
                _state.heartbeat_s = _heartbeat_of(original, args, kwargs)
                out = original(*args, **kwargs)
                _arm()
                # The process index is known now: the dumps' faulthandler file (when dumps
                # are on) is opened before the program's next line.
                from multihost._job import _triggers

                try:
                    _triggers.after_initialize()
                except Exception as exc:  # must never break initialize
                    print(f'multihost: after initialize: {exc}', file=sys.stderr)
                return out

            _state.patched = jax.distributed.initialize = initialize
    if _jax_adapter.client() is not None:
        _arm()


def unpatch() -> None:
    """Puts JAX's initialize back and the previous excepthook (the exit handler stays inert)."""
    import jax.distributed

    with _state.lock:
        if _state.original is not None and jax.distributed.initialize is _state.patched:
            jax.distributed.initialize = _state.original
        _state.original = _state.patched = None
        if _state.armed and sys.excepthook is _excepthook:
            sys.excepthook = _state.prev_hook
        if _state.sys_exit is not None and sys.exit is _sys_exit:
            sys.exit = _state.sys_exit
        _state.sys_exit = None
        _state.armed = False
    _hold.configure(_hold.HoldConfig())


def _heartbeat_of(initialize: Any, args: Any, kwargs: Any) -> float:
    """The ``heartbeat_timeout_seconds`` an ``initialize`` call gives (100 s: JAX's default)."""
    import inspect

    try:
        value = (
            inspect.signature(initialize)
            .bind(*args, **kwargs)
            .arguments.get('heartbeat_timeout_seconds')
        )
        return float(value) if value else 100.0
    except (TypeError, ValueError):
        return 100.0


def lost_after() -> float:
    """Seconds without a new stamp after which a host is lost: ``MULTIHOST_LOST_S``, else a
    quarter of the heartbeat timeout (JAX's service declares a silent host dead between half
    and all of it after its last heartbeat, then aborts every survivor); 0: no watcher."""
    raw = os.environ.get('MULTIHOST_LOST_S', '').strip()
    try:
        return max(0.0, float(raw)) if raw else max(2.0, _state.heartbeat_s / 4)
    except ValueError:
        return max(2.0, _state.heartbeat_s / 4)


def watch_period() -> float:
    """How often each host stamps (and process 0 reads) the liveness keys: a fifth of
    `lost_after`, and at most a quarter of the collectives' timeout (so that a timeout's
    message quotes a fresh stamp of a host that did not arrive), between 0.5 s and 5 s."""
    return min(5.0, max(0.5, min(lost_after() / 5, _state.timeout / 4)))


def _last_record() -> str:
    """The main thread's newest flight record, ``train_step call #5 at train.py:120``."""
    from multihost import _recorder

    for r in reversed(_recorder.snapshot(_kv.process_index(), 8)):
        if not r.thread:
            return f'{r.label} at {short_site(r.site)}' if r.site else r.label
    return ''


def _cross_wait() -> tuple[str, float]:
    """What this host's main thread waits in across processes (a checked collective or
    barrier, or a launch spanning processes not done on device) and for how long (s);
    ``('', 0.0)`` when it waits in none."""
    from multihost import _recorder

    records = _recorder.snapshot(_kv.process_index(), 16)
    now = time.time()
    _, waiting, _ = _recorder.in_progress(records)
    if waiting is not None:
        return waiting.label, now - waiting.time
    pending = None
    for r in reversed(records):  # the oldest launch after the newest known done
        if not r.is_launch or r.thread:
            continue
        if r.state in (_recorder.DONE, _recorder.FAILED):
            break
        if r.state == _recorder.LAUNCHED:
            pending = r
    if pending is not None and pending.spans:
        # Its age from when its device could start it: queued behind a launch still
        # running, it is not stuck yet (it has not started; that one is the wait).
        started = pending.started
        return pending.label, 0.0 if started is None else now - started
    return '', 0.0


def _doing() -> str:
    """What this host's main thread is doing, with its CPU share (a liveness stamp's
    ``doing``, which a timeout's message quotes for a host that did not arrive)."""
    from multihost._debug import _pulse

    try:
        words = position()
    except Exception:
        return ''
    p = _pulse.pulse()
    return f'{words}, {p.words}' if p is not None else words


def _stamp(client: Any, me: int, n: int) -> None:
    stamp: dict[str, Any] = {'n': n, 'last': _last_record(), 'doing': _doing(),
                             't': round(time.time(), 1)}  # fmt: skip
    label, waited = _cross_wait()
    if label:
        stamp['wait'], stamp['in'] = round(waited, 1), label
    with _state.stamp_lock:
        if not _state.done:  # `_done` came meanwhile: its key stays
            _kv.put(client, _kv.key('alive', me), json.dumps(stamp))


def _done_info(raw: str) -> dict[str, Any]:
    """``{'code': 0, 'site': 'train.py:77'}`` of a ``done`` stamp (``{}``: not known)."""
    try:
        info = json.loads(raw[len('done') :] or '{}')
        return info if isinstance(info, dict) else {}
    except ValueError:
        return {}


def _watch(client: Any) -> None:
    """Each host stamps its liveness key; process 0 also reads them all and says who is lost,
    or that a host ended while others still wait for it (`_early`)."""
    me, count = _kv.process_index(), _kv.process_count()
    period, limit = watch_period(), lost_after()
    seen: dict[int, tuple[str, float]] = {}  # process -> (its last stamp, when it changed)
    ended: dict[int, tuple[dict[str, Any], float]] = {}  # ended with 0 -> (its info, seen at)
    n = 0
    while _kv.client() is client and _state.failed is None and not _state.ending:
        n += 1
        try:
            if not _state.done:  # ended: its key says done
                _stamp(client, me, n)
            elif me != 0:  # its program ended: told here if others wait for it (`_early`)
                raw = _kv.get(client, _kv.key('fate', 'early'))
                if raw:
                    _leave_ended(json.loads(raw), me)
            if me == 0:
                now = time.monotonic()
                stamps = _kv.read_dir(client, _kv.key('alive'))
                for p, raw in stamps.items():
                    if _kv.stamp_says_done(raw):
                        seen[p] = (raw, float('inf'))
                        info = _done_info(raw)
                        if p not in ended and info.get('code', 0) == 0 and not info.get('fate'):
                            ended[p] = (info, now)
                    elif seen.get(p, ('', 0.0))[0] != raw:
                        seen[p] = (raw, now)
                silent = [p for p, (_, t) in seen.items() if p != 0 and now - t > limit]
                if silent and count > 1:  # the one silent longest went first
                    p = min(silent, key=lambda q: (seen[q][1], q))
                    _lost(client, p, now - seen[p][1], seen[p][0])
                    return
                if ended and now - min(t for _, t in ended.values()) >= EARLY_S:
                    stuck = _stuck(stamps, set(ended))
                    if stuck:
                        _early(client, {p: info for p, (info, _) in ended.items()}, stuck)
                        return
        except Exception:  # the service is going away (a normal end, or process 0 gone)
            pass
        time.sleep(min(period, 1.0) if _state.done else period)


def _stuck(stamps: dict[int, str], ended: set[int]) -> dict[int, str]:
    """The hosts (not ended) whose stamps say they wait across processes, for `EARLY_S`
    or more: process -> ``'train_step call #2 (for 12 s)'``."""
    out = {}
    for p, raw in stamps.items():
        if p in ended or _kv.stamp_says_done(raw):
            continue
        try:
            stamp = json.loads(raw)
        except ValueError:
            continue
        if isinstance(stamp, dict) and float(stamp.get('wait') or 0.0) >= EARLY_S:
            out[p] = f'{stamp.get("in", "?")} for {round(float(stamp["wait"]))} s'
    return out


def _early(client: Any, ended: dict[int, dict[str, Any]], stuck: dict[int, str]) -> None:
    """Process 0: hosts ``ended`` (code 0) while ``stuck`` ones wait for them: tells every
    host (``fate`` with ``early``); it ends itself last (0 if it had ended, else 75)."""
    first = min(ended, key=lambda p: (float(ended[p].get('at') or 0.0), p))
    order = {
        'early': first,
        'ended': sorted(ended),
        'site': str(ended[first].get('site') or ''),
        'code': 0,
        'waiting': sorted(stuck),
        'stuck': {str(p): what for p, what in sorted(stuck.items())[:8]},
    }
    _state.ending = True
    # The hosts that ended may be in JAX's shutdown, their debug threads stopped: their
    # watchers read this key. The others hear it on their debug threads.
    _kv.put(client, _kv.key('fate', 'early'), json.dumps({**order, 'by': 0}))
    threading.Thread(
        target=_bus.command,
        args=(client, 'fate', ANNOUNCE_S),
        kwargs=order,
        name='multihost-fate',
        daemon=True,
    ).start()
    if 0 in ended:
        _leave_ended({**order, 'by': 0}, 0)
    _ending({**order, 'by': 0}, 0)
    _leave(EXIT_PEER_FAILED)


def _leave_ended(order: dict[str, Any], me: int) -> None:
    """A host that had ended (code 0) while others waited for it: says so and leaves with 0
    (once, from its watcher or its debug thread, whichever hears first)."""
    with _state.lock:
        if _state.leaving:
            return
        _state.leaving = True
    _ended_line(order, me)
    client = _kv.client()
    if client is not None and me != 0:
        # The waiting hosts leave first: this host's end would fail their device
        # collectives (an error of their own, not the verdict), process 0 last.
        ended = {int(p) for p in order.get('ended') or ()}
        others = _kv.process_count() - 1 - len(ended - {0})
        deadline = time.monotonic() + ANNOUNCE_S + 5.0
        try:
            while time.monotonic() < deadline:
                if _kv.increment(client, _kv.key('fate', 'out'), 0) >= others:
                    break
                time.sleep(0.1)
        except Exception:  # the service is gone: nothing to wait for
            pass
    _leave(0)


def _ended_line(order: dict[str, Any], me: int) -> None:
    """A host that had ended (code 0) while others waited for it says so, once, and dumps."""
    site = _at_site(order.get('site') if order.get('early') == me else '')
    line = (
        f'multihost: this host (process {me}) ended (exit code 0){site} while '
        f'{stuck_phrase(order)}; they are ending (exit code {EXIT_PEER_FAILED}), this one '
        'with 0'
    )
    print(line, file=sys.stderr, flush=True)
    try:
        now = position()
    except Exception as exc:
        now = f'somewhere unknown ({exc})'
    from multihost._job import _dump

    details = {k: order.get(k) for k in ('by', 'early', 'site', 'code', 'waiting')}
    _dump.dump('peer', {**details, 'where': f'ended (exit code 0){site}; now {now}',
                        'line': line})  # fmt: skip


def stuck_phrase(order: dict[str, Any]) -> str:
    """``processes 0-2 still waited across processes (process 0 in train_step call #2
    for 12 s, ...)`` from an ``early`` order (at most three named)."""
    stuck = order.get('stuck') or {}
    named = [f'process {p} in {what}' for p, what in list(stuck.items())[:3]]
    waiting = order.get('waiting') or [int(p) for p in stuck]
    more = f', {len(waiting) - len(named)} more' if len(waiting) > len(named) else ''
    hosts = fmt_hosts(waiting)
    return f'{hosts} still waited across processes ({", ".join(named)}{more})'


def _at_site(site: Any) -> str:
    return f' at {short_site(str(site))}' if site else ''


def _lost(client: Any, p: int, silent: float, raw: str) -> None:
    """Process 0: host ``p`` is lost; tells every other host (``fate`` with ``lost``), says
    it itself, dumps, and ends last."""
    try:
        last = json.loads(raw).get('last', '')
    except (ValueError, AttributeError):
        last = ''
    order = {'lost': p, 'silent': round(silent), 'lost_at': time.time() - silent, 'last': last}
    _state.ending, _state.lost = True, p
    threading.Thread(
        target=_bus.command,
        args=(client, 'fate', ANNOUNCE_S),
        kwargs={'skip': [p], **order},
        name='multihost-fate',
        daemon=True,
    ).start()
    _ending({**order, 'by': 0}, 0)
    _leave(EXIT_PEER_FAILED)


def lost_phrase(order: dict[str, Any]) -> str:
    """``process 2 lost at 07:02:11 (its last heartbeat; none for 10 s since); it was last at
    ...``: the time is the last heartbeat's, when it was last heard of."""
    at = time.strftime('%H:%M:%S', time.localtime(float(order.get('lost_at') or time.time())))
    last = f'; it was last at {order["last"]}' if order.get('last') else ''
    silent = order.get('silent')
    return (
        f'process {order.get("lost")} lost at {at} (its last heartbeat; none for {silent} s '
        f'since){last}'
    )


def _ending(order: dict[str, Any], me: int) -> str:
    """Logs this host's one line and writes its dump (``peer``, or ``lost``); the line."""
    try:
        where = position()
    except Exception as exc:
        where = f'somewhere unknown ({exc})'
    lost = order.get('lost') is not None
    what = lost_phrase(order) if lost else failure_phrase(order)
    if lost and order.get('lost') == me:  # alive, but its stamps did not reach process 0
        what = what.replace(f'process {me} lost', f'this host (process {me}) was taken for lost', 1)
    line = (
        f'multihost: {what}; this host (process {me}) was {where}; '
        f'ending (exit code {EXIT_PEER_FAILED})'
    )
    print(line, file=sys.stderr, flush=True)
    from multihost._job import _dump

    keys = ('lost', 'silent', 'lost_at', 'last') if lost else (
        'by', 'error', 'message', 'site', 'function', 'code', 'early', 'waiting', 'missing',
        'after', 'label')  # fmt: skip
    details = {k: order.get(k) for k in keys}
    _dump.dump('lost' if lost else 'peer', {**details, 'where': where, 'line': line})
    return where


def recoverable() -> bool:
    """``jax_enable_recoverability`` is on: a host that leaves is expected and the others
    go on (`multihost.live_devices`), so nothing here ends them."""
    import jax

    try:
        return bool(jax.config.jax_enable_recoverability)  # type: ignore[attr-defined]
    except AttributeError:  # a jax without the flag
        return False


def _arm() -> None:
    """The debug thread (so the others reach this host), the excepthook, the exit handler
    (not in a recoverable job: `recoverable`)."""
    if recoverable():
        _bus.start_debug_daemon()
        return
    with _state.lock:
        if _state.armed or _kv.client() is None:
            return
        _state.armed = True
        _state.prev_hook, sys.excepthook = sys.excepthook, _excepthook
        # Registered after multihost's and JAX's own exit handlers: runs before them.
        atexit.register(_at_exit)
        # A plain run (``MULTIHOST_INSTALL=1 python train.py``): nothing catches SystemExit;
        # sys.exit notes its code, and this runs after the program unwound, before the
        # interpreter's teardown (threads joined, exit handlers, JAX's shutdown barrier).
        if _state.sys_exit is None:
            _state.sys_exit, sys.exit = sys.exit, _sys_exit
            try:
                threading._register_atexit(_before_teardown)  # type: ignore[attr-defined]
            except (AttributeError, RuntimeError):
                pass
        client = _kv.client()
        if lost_after() > 0 and not _state.watching:
            _state.watching = True
            threading.Thread(
                target=_watch, args=(client,), name='multihost-fate-watch', daemon=True
            ).start()
    _bus.start_debug_daemon()


def _script_site(tb: Any) -> tuple[str, str]:
    """(``file:line``, function) of the innermost frame of the program itself (not of a
    library or of Python), else the innermost frame."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    if not frames:
        return '?', '?'
    own = [f for f in frames if not any(m in f.filename for m in _LIB_MARKERS)]
    own = [f for f in own if '/multihost/' not in f.filename and 'runpy' not in f.filename]
    f = (own or frames)[-1]
    return f'{f.filename}:{f.lineno}', f.name


def _ours(filename: str) -> bool:
    """A frame of this package or of runpy (``multihost run`` runs the program through both)."""
    return filename.startswith(_OUR_DIR) or 'runpy' in filename


_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _shown(tb: Any) -> Any:
    """The traceback as printed: without the frames of this package and runpy (``multihost
    run``'s frames above the program, the installed jit's around a launch), as JAX leaves
    its own out; all of them when nothing else is left."""
    kept, at = [], tb
    while at is not None:
        if not _ours(at.tb_frame.f_code.co_filename):
            kept.append(at)
        at = at.tb_next
    if not kept:
        return tb
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _print(tp: Any, value: Any, tb: Any) -> None:
    """The previous excepthook, given the traceback as `_shown` (Python's own prints the
    exception's ``__traceback__``, whatever it is passed: set for the call, then put back)."""
    shown = _shown(tb)
    own = getattr(value, '__traceback__', None) if isinstance(value, BaseException) else None
    try:
        if isinstance(value, BaseException):
            value.__traceback__ = shown
        (_state.prev_hook or sys.__excepthook__)(tp, value, shown)
    finally:
        if isinstance(value, BaseException):
            value.__traceback__ = own


def _excepthook(tp: Any, value: Any, tb: Any) -> None:
    announced = printed = False
    try:
        # Not while another's failure ends this host: its main thread's wait may fail as the
        # others leave, and that is not a failure of its own.
        if _state.failed is None and not _state.ending and not issubclass(tp, SystemExit):
            site, function = _script_site(tb)
            code = 130 if issubclass(tp, KeyboardInterrupt) else 1
            if _hold.enabled() and code == 1:
                # The traceback first (the log shows the error while held), then the hold.
                _print(tp, value, tb)
                printed = True
                name = getattr(tp, '__name__', str(tp))
                _hold.hold(f'{name}({str(value)!r})', site.rsplit('/', 1)[-1], tb)
            announced = _announce(code, getattr(tp, '__name__', str(tp)), str(value), site,
                                  function, _timed_out(value))  # fmt: skip
    finally:
        if not printed:
            _print(tp, value, tb)
    if announced:
        # Ends here, not at exit: the interpreter's teardown joins the program's own threads
        # and runs the exit handlers registered after ours (orbax's), which may wait for the
        # hosts being ended.
        _finish()


def interrupted(site: str, function: str) -> NoReturn:
    """Ctrl-C where Python cannot raise KeyboardInterrupt (the main thread blocked in native
    code, `_interrupt`): the others told as for an uncaught one, then this process ends (130)."""
    if _state.failed is None and not _state.ending:
        if _announce(130, 'KeyboardInterrupt', '', site, function):
            _finish()
    _end(130)


def leaving() -> bool:
    """Whether this host is ending: it failed, or another host's failure ends it."""
    return _state.failed is not None or _state.ending


def _sys_exit(code: Any = None) -> NoReturn:
    """``sys.exit``, noting its code and caller for `_before_teardown` (then Python's)."""
    frame = sys._getframe(1)
    _state.exit_call = (code, frame)
    if code in (None, 0) and '/multihost/' not in frame.f_code.co_filename:
        _state.end_site = f'{frame.f_code.co_filename}:{frame.f_lineno}'
    _PY_EXIT(code)


def _before_teardown() -> None:
    """The main module ended: after a ``sys.exit(N != 0)`` (not caught by ``multihost
    run``), tell the others and end with N, as `failed_exit` does."""
    call, _state.exit_call = _state.exit_call, None
    if call is None or call[0] in (None, 0):
        if _state.armed and _state.failed is None and not _state.ending:
            _done(0)  # its program ended: a host still waiting for it is seen (`_early`)
        return
    if _state.failed is not None or _state.ending:
        return
    code, frame = call
    if not _state.armed:
        return
    site = f'{frame.f_code.co_filename}:{frame.f_lineno}' if frame is not None else '?'
    exit_code = code if isinstance(code, int) else 1
    if not _announce(exit_code, 'SystemExit', str(code), site, frame.f_code.co_name):
        return
    from multihost._job import _dump

    tb = {'error': 'SystemExit', 'message': str(code), 'thread': 'MainThread'}
    _dump.dump('exception', {**tb, 'traceback': [[site.rsplit(':', 1)[0], frame.f_lineno,
                                                   frame.f_code.co_name, '']]})  # fmt: skip
    _finish()


def failed_exit(code: Any, tb: Any) -> None:
    """``multihost run``: the program raised ``SystemExit(code)``; a non-zero code is a failure
    (code 0: where it ended is noted for `_done`)."""
    if code in (None, 0) and tb is not None:
        site, _ = _script_site(tb)
        if site != '?' and '/multihost/' not in site:
            _state.end_site = site
    if not _state.armed or _state.failed is not None or _state.ending or code in (None, 0):
        return
    exit_code = code if isinstance(code, int) else 1
    site, function = _script_site(tb)
    if not _announce(exit_code, 'SystemExit', str(code), site, function):
        return
    from multihost._job import _dump, _triggers

    _dump.dump('exception', _triggers.exception_details(SystemExit, code, tb, 'MainThread'))
    _finish()


def _timed_out(exc: Any) -> dict[str, Any]:
    """A checked wait's timeout, in fields (``missing``, ``after``: its seconds, ``label``): the
    others then say whom it waited for, not just the error (`failure_phrase`)."""
    from multihost._errors import BarrierTimeoutError

    if not isinstance(exc, BarrierTimeoutError) or not exc.missing:
        return {}
    return {'missing': list(exc.missing), 'after': exc.timeout, 'label': exc.label or exc.name}


def _announce(
    code: int, error: str, message: str, site: str, function: str, extra: Any = None
) -> bool:
    """Tells every other host (on a thread of its own; `_finish` waits for it; at the
    interpreter's teardown, where Python 3.12 starts no thread, on this one); whether
    it did (armed, and the coordination service is there). ``extra``: more fields of
    the failure (`_timed_out`)."""
    if not _state.armed:
        return False
    client = _kv.client()
    if client is None:
        return False
    _state.failed = code
    _state.failed_now.set()
    details: dict[str, Any] = {
        'error': error,
        'message': message[:500],
        'site': site,
        'function': function,
        'code': code,
        'failed_at': time.time(),
        **(extra or {}),
    }

    def tell() -> None:
        try:
            replies, _ = _bus.command(
                client, 'fate', ANNOUNCE_S, skip=_ended(client), gone=lambda: _ended(client),
                **details,
            )  # fmt: skip
            _state.heard = replies
        except Exception as exc:  # the service is gone: JAX's own fate-sharing takes over
            print(f'multihost: could not tell the other hosts of this failure: {exc}',
                  file=sys.stderr)  # fmt: skip

    thread = threading.Thread(target=tell, name='multihost-fate', daemon=True)
    try:
        thread.start()
    except RuntimeError:  # at teardown, Python >= 3.12 starts no thread: told from here
        _state.announcing = None
        tell()  # bounded: ANNOUNCE_S
    else:
        _state.announcing = thread
    return True


def _ended(client: Any) -> set[int]:
    """The hosts whose liveness key says they ended (not waited for: they cannot answer)."""
    try:
        stamps = _kv.read_dir(client, _kv.key('alive'))
    except Exception:
        return set()
    return {p for p, raw in stamps.items() if _kv.stamp_says_done(raw)}


def _answers_written(timeout: float) -> None:
    """Waits (bounded) until this host's debug thread wrote its `fate` answers."""
    with _state.answered:
        _state.answered.wait_for(lambda: _state.answering == 0, timeout)


def _answer_written() -> None:
    with _state.answered:
        _state.answering -= 1
        _state.answered.notify_all()


def _at_exit() -> None:
    """A failing host ends with its own code once the others heard (bounded), not in JAX's
    shutdown barrier. Nothing happens in a job where this host did not fail."""
    _done(0 if _state.failed is None else _state.failed)
    if _state.ending:  # the debug thread ends this host (75) once the others are out
        _leave(EXIT_PEER_FAILED)
    if _state.failed is not None:
        _finish()


def _done(code: int = 0, fate: bool = False) -> None:
    """This host ends (normally or not): its liveness key says so (``done`` and the code,
    where its program ended, whether fate-sharing ends it), it is never called lost."""
    client = _kv.client()
    if client is None or not _state.watching:
        return
    info: dict[str, Any] = {'code': code, 'at': time.time()}
    if _state.end_site:
        info['site'] = _state.end_site
    if fate or _state.failed is not None or _state.ending:
        info['fate'] = True
    with _state.stamp_lock:
        _state.done = True
        try:
            _kv.put(client, _kv.key('alive', _kv.process_index()), 'done' + json.dumps(info))
        except Exception:
            pass


def _finish() -> None:
    """The failing host: once the others heard (bounded), ends with its own code."""
    t = _state.announcing
    if t is not None:
        t.join(ANNOUNCE_S + 5.0)
    _answers_written(2.0)  # its own answers to hosts that failed at the same moment
    _leave(_state.failed if _state.failed is not None else 1)


def _leave(code: int) -> None:
    """Ends this host, process 0 last: it runs JAX's coordination service, whose end makes
    JAX abort every process still connected to it (before it has said why). The others
    count themselves out first (key ``mh/fate/out``); process 0 waits for that, bounded."""
    try:
        client, me, n = _kv.client(), _kv.process_index(), _kv.process_count()
        if client is not None and me != 0:
            _done(code, fate=True)
            _kv.increment(client, _kv.key('fate', 'out'), 1)
        elif client is not None:
            deadline = time.monotonic() + ANNOUNCE_S
            others = n - 1 - (_state.lost is not None)
            while time.monotonic() < deadline:
                if _kv.increment(client, _kv.key('fate', 'out'), 0) >= others:
                    time.sleep(1.0)  # their os._exit, after the count
                    break
                time.sleep(0.05)
    except Exception:  # the service is gone already: nothing to wait for
        pass
    _end(code)


def _end(code: int) -> NoReturn:
    """Flushes what the program wrote and ends the process now (no interpreter teardown)."""
    try:
        logging.shutdown()
    except Exception:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    from multihost._models import _native

    _native.disarm()  # its faulthandler file goes when nothing was written there
    os._exit(code)


def position() -> str:
    """Where this host's main thread is, in words (its own records and stack only)."""
    from multihost._debug import _wavefront

    f = _wavefront.front(_kv.process_index())
    if f.waiting is not None:
        return f'waiting in {f.waiting.label} at {short_site(f.waiting.site)}'
    if f.pending is not None and f.jit_phase:  # its call has not launched it yet
        return f'{f.jit_phase} {f.pending.label} at {f.where or "?"}'
    if f.pending is not None:
        return f'inside {f.pending.label} (not done on device), waiting for it'
    if f.activity:
        return f.activity
    return f'in user code at {f.where or "?"}'


def _on_fate(client: Any, order: dict[str, Any]) -> Any:
    """The ``fate`` command, on another host's debug thread: log, dump, answer, end."""
    me = _kv.process_index()
    if order.get('by') == me or not _state.armed:
        return json.dumps({'self' if order.get('by') == me else 'off': True})
    if order.get('early') is not None and me in (order.get('ended') or ()):
        # this host had ended (code 0): it leaves with 0
        return json.dumps({'ended': 0}), functools.partial(_leave_ended, order, me)
    with _state.answered:
        _state.answering += 1
    if order.get('lost') is None and _state.failed is None:
        _state.failed_now.wait(GRACE_S)  # the grace: woken at once if this host fails too
    failed = _state.failed
    if failed is not None:  # this host failed too: it keeps its own verdict
        # (`_finish` waits until this answer is written: the asker waits for it)
        return json.dumps({'failed_too': failed}), _answer_written
    _answer_written()
    _state.ending = True
    if order.get('lost') is not None:
        _state.lost = int(order['lost'])
    where = _ending(order, me)
    return json.dumps({'ending': EXIT_PEER_FAILED, 'where': where}), functools.partial(
        _leave, EXIT_PEER_FAILED
    )


def wire() -> None:
    """The debug thread answers 'fate' (`multihost._job._wiring`)."""
    _bus.register('fate', _on_fate)
