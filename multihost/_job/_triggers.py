"""What makes a host write its dump (`_dump`): errors, a signal, an uncaught exception, a hang.

`enable` (from `multihost.install` given a dump directory) wires:

- a checked collective or barrier that times out or mismatches
  (`_sequence.ERROR_HOOKS`, called where the error is raised);
- the dump signal, `SIGNALS` in order, the first whose handler is still the
  default (``LocalCluster`` workers give SIGUSR1 to faulthandler: then
  SIGUSR2; none free: no signal trigger, `signal_used` says None). Python
  runs a signal handler only when the main thread returns to bytecode, so the
  signal is also seen on `_wakeup`'s watcher thread, which dumps while the
  main thread is still blocked in native code. A wakeup fd someone else set
  (asyncio) is kept: then the Python handler alone dumps, when the main
  thread gets back;
- an uncaught exception (chains `sys.excepthook` and `threading.excepthook`); an uncaught
  KeyboardInterrupt (Ctrl-C or SIGINT on a hung job) dumps as ``interrupt``, from its traceback;
- the hang watchdog: a host whose main thread has waited longer than
  ``MULTIHOST_HANG_DUMP_S`` (default `HANG_DEFAULT_S`, below JAX's 100 s
  heartbeat timeout) in one collective, barrier or launch (also a recorded
  launch not done on device, or one whose call has not returned while the main
  thread neither traces nor compiles it: XLA:CPU runs a launch inside its call
  when a process has one device; with nothing new recorded meanwhile) dumps once
  for that wait and asks every other host to dump (`_dump.request_all`). When
  the wait then goes on (a slow host, not a hang), its dump and stderr say so
  and the next hang dump needs twice that wait (`_went_on`). While another host
  traces or compiles a jitted function (its compile beat moves: `_publish_compiling`),
  the dump waits, up to `COMPILE_GRACE` times the limit (`_compiling`).

- the GIL held in a C call (no Python runs: neither of the above can write): the dump
  signal also goes to `faulthandler`, and a `faulthandler` watchdog re-armed by the
  hang watchdog fires when this thread cannot run for the hang limit; both write every
  thread's stack to ``DIR/process-<i>.stacks.txt`` at the C level (`_native`).
- a preemption notice: SIGTERM stays JAX's preemption sync manager's (never
  replaced, so ``reached_preemption_sync_point`` and orbax's preemption saves
  work as before); the watchdog reads the notice the manager publishes in the
  coordination service (`PREEMPTION_KEY`), one non-blocking read every
  `PREEMPTION_POLL_S` per host (100 reads/s at 1,000 hosts), and every host
  dumps; sooner when the installed ``reached_preemption_sync_point`` says True
  (`preempted`, before the program's own preemption save).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from multihost import _jax_adapter, _recorder
from multihost._debug import _pulse, _stacks
from multihost._exchange import _kv, _sequence
from multihost._job import _dump, _wakeup
from multihost._models import _native
from multihost._models._stacks import frame_words, is_user_frame, jit_phase

HANG_DEFAULT_S = 60.0
#: The key JAX's preemption sync manager sets when a task gets SIGTERM (its time).
PREEMPTION_KEY = 'RECEIVED_PREEMPTION_NOTICE'
PREEMPTION_POLL_S = 10.0
SIGNALS = ('SIGUSR1', 'SIGUSR2')


class _Wired:
    def __init__(self) -> None:
        self.enabled = False
        self.signum: int | None = None
        self.watcher_reads = False  # a watcher thread reads the wakeup fd
        self.signal_lock = threading.RLock()  # taken in a signal handler on the main thread
        # Dump signals each side (the main thread's handler, the watcher thread) wrote the
        # dump for and the other side has not seen yet (`_signal_dump`).
        self.covered = {'handler': 0, 'watcher': 0}
        self.prev_excepthook: Any = None
        self.prev_thread_hook: Any = None
        self.hang = HANG_DEFAULT_S
        self.limit = HANG_DEFAULT_S  # the next hang dump's wait (longer after a slow wait)
        self.fired: _recorder.FlightRecord | None = None  # the wait the last hang dump was for
        self.fired_at = 0.0
        self.lock = threading.Lock()
        self.preempted = False
        self.exiting = False
        self.exit_hooked = False  # `_at_exit` registered after JAX's own exit hook
        self.stop = threading.Event()
        self.compiling_since: float | None = None  # this host's main thread in jit's compile
        self.compile_published = ''  # ... and the phase it said (`_publish_compiling`)
        self.compile_noted: tuple[int, int] | None = None  # the wait whose delay was logged
        self.beat_seen: int | None = None  # the others' compile beat, last read
        self.beat_moved = -math.inf  # when it last moved (monotonic)
        # The launch whose call the main thread was first seen running in (not tracing or
        # compiling it), and when: (entry number, time.time()) (`_stuck_in_call`).
        self.in_call: tuple[int, float] | None = None


_w = _Wired()
#: A hang dump waits while a host is tracing or compiling a jitted function (it will come),
#: at most this many times the hang limit.
COMPILE_GRACE = 10.0


def hang_seconds() -> float:
    """``MULTIHOST_HANG_DUMP_S`` (seconds; 0 turns the watchdog off)."""
    raw = os.environ.get('MULTIHOST_HANG_DUMP_S', '').strip()
    if not raw:
        return HANG_DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f'MULTIHOST_HANG_DUMP_S must be seconds (0: no hang watchdog), got {raw!r}'
        ) from None
    if value < 0:
        raise ValueError(f'MULTIHOST_HANG_DUMP_S must be >= 0 seconds, got {raw!r}')
    return value


def signal_used() -> int | None:
    """The dump signal's number, or None (none free, or not enabled)."""
    return _w.signum


def enable(directory: str) -> None:
    """Dumps go to ``directory``; wires every trigger (idempotent)."""
    hang = hang_seconds()
    _dump.configure(directory)
    if _w.enabled:
        return
    _w.enabled = True
    if _dump.on_error not in _sequence.ERROR_HOOKS:
        _sequence.ERROR_HOOKS.append(_dump.on_error)
    _w.prev_excepthook, sys.excepthook = sys.excepthook, _excepthook
    _w.prev_thread_hook, threading.excepthook = threading.excepthook, _thread_hook
    if threading.current_thread() is threading.main_thread():
        _wire_signal()
    _w.hang = _w.limit = hang
    atexit.register(_went_on)  # a program that ends right after its slow wait says so too
    threading.Thread(
        target=_watchdog, args=(hang,), name='multihost-hang-watchdog', daemon=True
    ).start()


def disable() -> None:
    """Unwires what `enable` wired (the signal keeps our handler's no-op if not main thread)."""
    if not _w.enabled:
        return
    _w.enabled = False
    _w.stop.set()
    _native.disarm()
    _dump.configure(None)
    if _dump.on_error in _sequence.ERROR_HOOKS:
        _sequence.ERROR_HOOKS.remove(_dump.on_error)
    if sys.excepthook is _excepthook:
        sys.excepthook = _w.prev_excepthook
    if threading.excepthook is _thread_hook:
        threading.excepthook = _w.prev_thread_hook
    _w.stop = threading.Event()


def _excepthook(tp: Any, value: Any, tb: Any) -> None:
    if issubclass(tp, KeyboardInterrupt):  # Ctrl-C on a hung job: where this host was then
        if not _dump.interrupted_blocked():  # else that dump, written while blocked, stays
            _dump.dump('interrupt', exception_details(tp, value, tb, 'MainThread'))
    elif not issubclass(tp, SystemExit) and not _dump.already_dumped(value):
        _dump.dump('exception', exception_details(tp, value, tb, 'MainThread'))
    (_w.prev_excepthook or sys.__excepthook__)(tp, value, tb)


def _thread_hook(args: Any) -> None:
    if args.exc_type is not SystemExit and not _dump.already_dumped(args.exc_value):
        name = args.thread.name if args.thread is not None else ''
        _dump.dump(
            'exception', exception_details(args.exc_type, args.exc_value, args.exc_traceback, name)
        )
    (_w.prev_thread_hook or threading.__excepthook__)(args)


def exception_details(tp: Any, value: Any, tb: Any, thread: str) -> dict[str, Any]:
    frames = traceback.extract_tb(tb)[-30:] if tb is not None else []
    return {
        'error': getattr(tp, '__name__', str(tp)),
        'message': str(value)[:4000],
        'thread': thread,
        'traceback': [[f.filename, f.lineno or 0, f.name, f.line or ''] for f in frames],
    }


def _wire_signal() -> None:
    for name in SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None or signal.getsignal(signum) is not signal.SIG_DFL:
            continue  # taken (faulthandler's C handler reads as None), or no such signal
        signal.signal(signum, _on_signal)
        _w.signum = signum
        break
    if _w.signum is not None:
        _w.watcher_reads = _wakeup.subscribe(_w.signum, _on_wakeup)


def _on_signal(signum: int, frame: Any) -> None:
    if not _w.watcher_reads:
        _dump.dump('signal', {'signal': signal.Signals(signum).name})
    else:
        _signal_dump('handler', 1)


def _signal_dump(side: str, count: int) -> None:
    """One dump per dump signal, written by whichever side sees it first: the watcher thread
    (the main thread is blocked in C with the GIL released: the dump is written at once) or
    the main thread's Python handler (a C call that kept the GIL returned: the handler runs
    before the main thread's next line, so the dump says where it was, not where it went
    on to while the watcher waited for the GIL). The other side skips that signal."""
    other = 'watcher' if side == 'handler' else 'handler'
    with _w.signal_lock:
        seen = min(count, _w.covered[other])
        _w.covered[other] -= seen
        due = count - seen
        _w.covered[side] += due
    if due and _w.signum is not None and _dump.directory() is not None:
        _dump.dump('signal', {'signal': signal.Signals(_w.signum).name})


# A stack taken while this handler runs on the main thread shows the frame below it.
_pulse.SIGNAL_HANDLERS.add(_on_signal.__code__)


def _on_wakeup(count: int) -> None:
    _signal_dump('watcher', count)


def _stuck() -> _recorder.FlightRecord | None:
    """The main thread's open record: waiting at a check, or inside a launch that has not
    returned."""
    records = _recorder.snapshot(0, _recorder.RECENT)
    main = next((r for r in reversed(records) if not r.thread), None)
    if main is None:
        return None
    return main if main.state == _recorder.WAITING else None


def _stuck_on_device(hang: float) -> tuple[_recorder.FlightRecord | None, float]:
    """A recorded launch not done on device for ``hang`` seconds while the host recorded
    nothing new (its main thread waits for it: a device collective whose peer never came),
    and how long; else (None, 0)."""
    rec = _recorder.awaited_launch(_kv.process_index())
    now = time.time()
    # Counted from when its device could start it (`FlightRecord.started`), not its
    # dispatch: a launch queued behind a long one is not stuck while that one runs.
    started = None if rec is None else rec.started
    if started is None or now - started < hang or now - _recorder.last_advanced() < hang:
        return None, 0.0
    return rec, now - started


def _stuck_in_call(hang: float) -> tuple[_recorder.FlightRecord | None, float]:
    """A launch whose call has not returned, its main thread neither tracing nor compiling
    it (so running it: XLA:CPU runs a launch inside its call when a process has one device,
    measured on jax 0.10.2 and 0.12.1, and a device collective whose peer never came blocks
    there), for ``hang`` seconds counted from when this
    watchdog first saw it running (a long compile before it is not counted), while the host
    recorded nothing new; and how long. Else (None, 0)."""
    rec = _recorder.inside_call(_kv.process_index())
    if rec is None or _compiling_now()[0]:
        _w.in_call = None
        return None, 0.0
    now = time.time()
    if _w.in_call is None or _w.in_call[0] != rec.n:
        _w.in_call = (rec.n, now)
    waited = now - _w.in_call[1]
    if waited < hang or now - _recorder.last_advanced() < hang:
        return None, 0.0
    return rec, waited


def _preempted(next_poll: float) -> float:
    """Reads JAX's preemption notice when due (dumps once); returns the next poll time."""
    now = time.monotonic()
    if _w.preempted or now < next_poll or _w.exiting:
        return next_poll
    if _jax_adapter.preemption_sync_manager() is None:
        return now + PREEMPTION_POLL_S
    client = _jax_adapter.client()
    if client is None:
        return now + PREEMPTION_POLL_S
    if not _w.exit_hooked:  # after JAX's initialize: our hook runs before its shutdown
        _w.exit_hooked = True
        atexit.register(_at_exit)
    try:
        notice = _kv.get(client, PREEMPTION_KEY)
    except Exception:  # the service is going away
        return now + PREEMPTION_POLL_S
    if notice is None:
        return now + PREEMPTION_POLL_S
    _w.preempted = True
    _dump.dump('preemption', {'notice': str(notice)})
    return now + PREEMPTION_POLL_S


def preempted(step: int) -> None:
    """``reached_preemption_sync_point(step)`` said True: dump (once), before the program saves."""
    if _w.preempted or _dump.directory() is None:
        return
    _w.preempted = True
    _dump.dump('preemption', {'sync_point': step})


def _compiling_now() -> tuple[str, str]:
    """(`jit_phase` of this host's main thread, its innermost user frame): its frames walked,
    no source read (once per watchdog period)."""
    frames = _pulse.main_frames()
    phase = jit_phase(frames)
    if not phase:
        return '', ''
    ours = _stacks.our_dirs()
    user = next((f for f in frames if is_user_frame(f, ours)), None)
    return phase, frame_words(user, ours) if user is not None else ''


def _publish_compiling() -> None:
    """While this host's main thread traces or compiles a jitted function for longer than one
    watchdog period, it beats ``mh/compiling/beat`` (a counter, each period) and says what and
    where in ``mh/compiling/<process>``: a host waiting for it holds its hang dump while the
    beat moves (`_compiling`). A host that stops beating (its compile done, or no Python runs:
    a held GIL, a crash) is not waited for. Short compiles write nothing."""
    client = _kv.client()
    if client is None:
        return
    phase, where = _compiling_now()
    try:
        if phase and _w.compiling_since is None:
            _w.compiling_since = time.time()
        elif phase:
            if _w.compile_published != phase:  # tracing, then compiling: said again
                info = {'phase': phase, 'where': where, 'since': _w.compiling_since}
                _kv.put(client, _kv.key('compiling', _kv.process_index()), json.dumps(info))
                _w.compile_published = phase
            _kv.increment(client, _kv.key('compiling', 'beat'), 1)
        else:
            _w.compiling_since = None
            if _w.compile_published:
                _w.compile_published = ''
                _kv.delete(client, _kv.key('compiling', _kv.process_index()))
    except Exception:  # the service is gone: nothing waits on this any more
        pass


def _compile_beat(period: float) -> bool | None:
    """Whether some host's compile beat moved within the last two watchdog periods (one
    counter read); None when not known yet (the first look)."""
    client = _kv.client()
    if client is None:
        return False
    try:
        beat = _kv.increment(client, _kv.key('compiling', 'beat'), 0)
    except Exception:
        return False
    now, first = time.monotonic(), _w.beat_seen is None
    if beat != _w.beat_seen:
        _w.beat_seen = beat
        _w.beat_moved = -math.inf if first else now
    if first:
        return None
    return now - _w.beat_moved < 2 * period


def _compiling(rec: _recorder.FlightRecord, waited: float, limit: float, period: float) -> bool:
    """Whether a host is tracing or compiling a jitted function right now (`_compile_beat`):
    the hang dump for ``rec`` then waits, at most `COMPILE_GRACE` x ``limit``. The first time
    for a wait, names those hosts on stderr."""
    if waited >= COMPILE_GRACE * limit:
        return False
    fresh = _compile_beat(period)
    if fresh is None:
        return True  # one period more, to see whether the beat moves
    if not fresh:
        return False
    if _w.compile_noted == (rec.process, rec.n):
        return True
    try:  # once per wait: who (this host's own compile beat, just done, does not count)
        entries = _kv.read_dir(_kv.client(), _kv.key('compiling'), skip=(_kv.process_index(),))
    except Exception:
        entries = {}
    if not entries:
        return False
    _w.compile_noted = (rec.process, rec.n)
    now, hosts = time.time(), []
    for p, raw in sorted(entries.items()):
        try:
            info = json.loads(raw)
            at = f' at {info["where"]}' if info.get('where') else ''
            hosts.append(f'process {p} is {info["phase"]} a jitted function{at} '
                         f'(for {now - float(info["since"]):.0f} s)')  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
    who = '; '.join(hosts) or 'a host is compiling'
    print(
        f'multihost: {rec.label} has waited {waited:.0f} s while {who}: no hang dump while '
        f'a host compiles (up to {COMPILE_GRACE * limit:.0f} s)',
        file=sys.stderr,
    )
    return True


def _went_on() -> None:
    """Once the wait the last hang dump was for is over: when it went on (a slow host came,
    not a hang), says so on stderr and in this host's dump, and the next hang dump needs twice
    that wait (a job slow by nature is not dumped at every step); when it failed, the error's
    own dump tells the rest. Either way, the next hang is dumped (and asked about) again."""
    with _w.lock:  # the watchdog thread, or the exit
        fired = _w.fired
        if fired is None:
            return
        now = _recorder.record_of(fired.n, fired.process)
        if now is not None and now.state in (_recorder.WAITING, _recorder.LAUNCHED):
            return  # still in it
        _w.fired = None
    _dump.episode_over()
    if now is not None and now.state == _recorder.FAILED:
        return
    end = time.time()
    lasted = now.wait if now is not None and now.wait is not None else end - fired.time
    _w.limit = round(max(_w.hang, 2 * lasted), 1)
    if _dump.went_on(fired.label, lasted, end, _w.limit):
        print(
            f'multihost: {fired.label} went on after {lasted:.0f} s: a slow host, not a hang '
            f'(hang dump written after {_w.fired_at:.0f} s); the next hang dump waits '
            f'{_w.limit:.0f} s',
            file=sys.stderr,
        )


def _at_exit() -> None:
    _went_on()
    _w.exiting = True
    _w.stop.set()
    _native.disarm()


def after_initialize() -> None:
    """``jax.distributed.initialize`` returned (`_fate`'s wrapper): the faulthandler file."""
    if _w.enabled:
        _arm_native(_w.hang)


def _arm_native(hang: float) -> None:
    """Once the process index is known: the faulthandler file and signal (`_native.arm`); then
    the GIL watchdog pushed back by ``hang`` (it fires only if this thread cannot run)."""
    directory = _dump.directory()
    if directory is None or _w.exiting:
        return
    if _kv.client() is not None:
        _native.arm(directory, _kv.process_index(), _kv.process_count(), _w.signum, hang)
        _native.rearm()


def _watchdog(hang: float) -> None:
    period = min(5.0, max(0.2, hang / 4)) if hang > 0 else 5.0
    stop = _w.stop
    next_poll = 0.0
    # Until JAX is initialized, looks often (the faulthandler file needs the process index;
    # `after_initialize` arms it at once, this is for MULTIHOST_FATE=0).
    fast_until = time.monotonic() + 120
    while _kv.client() is None and time.monotonic() < fast_until and not stop.wait(0.05):
        pass
    while not stop.wait(period):
        if _dump.directory() is None:
            continue
        _arm_native(hang)
        next_poll = _preempted(next_poll)
        if hang <= 0:
            continue
        _publish_compiling()
        _went_on()
        if _w.fired is not None:
            continue  # dumped for this wait already
        limit = _w.limit
        rec = _stuck()
        waited = time.time() - rec.time if rec is not None else 0.0
        if rec is None:
            rec, waited = _stuck_on_device(limit)
        if rec is None:
            rec, waited = _stuck_in_call(limit)
        if rec is not None and limit / 2 <= waited < limit:
            _compile_beat(period)  # known by the time the limit comes
        if rec is None or waited < limit or _compiling(rec, waited, limit, period):
            continue
        _w.fired, _w.fired_at = rec, waited
        details = {'record': rec.label, 'site': rec.site, 'waited': waited, 'limit': limit}
        _dump.dump('hang', details)
        _dump.request_all(f'hang: waited {waited:.0f} s in {rec.label}')
