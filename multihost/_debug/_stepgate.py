"""The step gate: with stepping on, every host pauses before each collective until released.

The gate runs in `_sequence`'s enter hook around the host's arrival at step k
(the record it publishes) and before it counts as arrived: while stepping is on
(a process-local flag: zero RPCs when off), the host marks itself waiting,
publishes its arrival, and waits until ``mh/step/go/<k>`` appears or stepping
is switched off. Its local wait runs in 0.5 s slices, so Ctrl-C gets through.

Keys (``mh/`` prefix)::

    mh/step/on          "1" while stepping is on (read at start and on "stepping")
    mh/step/go/<k>      step k is released
    mh/step/wait/<k>/<pid>  pid waits at step k's gate (written before its arrival)
    mh/seq/<k>/<pid>    (from `_sequence`) what pid called at step k: its arrival
    mh/step/launch/<pid>    pid waits before its n-th recorded launch (JSON: n, name, site)
    mh/step/lgo/<pid>/<n>   that launch is released

Under `multihost.install` the gate also pauses recorded jitted launches
(`launch_gate`, called by `_job._jit`): a host-local gate, outside the
collective sequence (a launch recorded, not checked, is not a step every
host takes in the same order), released by the same `release` and
`release_all`, and shown in `StepTable.launches`.

Switching stepping on or off goes to every host's debug thread through the
command bus (`_bus`, command ``stepping``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from multihost._errors import StepTimeoutError
from multihost._exchange import _bus, _kv, _sequence
from multihost._models._steps import PausedLaunch, StepTable

#: Default timeout (seconds) of the step gate, unless ``MULTIHOST_STEP_TIMEOUT``
#: says otherwise: how long a host waits for a step to be released.
DEFAULT_STEP_TIMEOUT = 3600.0

# The release waiter's long-poll slice (a helper thread; the main thread waits
# locally in 0.5 s slices).
_SLICE_S = 10.0


def _key(*parts: object) -> str:
    return _kv.key(*parts)


def step_timeout() -> float:
    """The step gate's timeout: ``MULTIHOST_STEP_TIMEOUT`` or `DEFAULT_STEP_TIMEOUT`."""
    raw = os.environ.get('MULTIHOST_STEP_TIMEOUT', '')
    if raw == '':
        return DEFAULT_STEP_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f'MULTIHOST_STEP_TIMEOUT must be a number of seconds, got {raw!r}.'
        ) from None
    if value <= 0:
        raise ValueError(f'MULTIHOST_STEP_TIMEOUT must be positive, got {raw!r}.')
    return value


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stepping = False  # read by the gate without a lock: a bool is atomic
        self.gate: tuple[int, threading.Event] | None = None
        self.launch: threading.Event | None = None  # the launch gate's, while paused
        self.launches = 0  # launches gated so far (numbers their release keys)


_state = _State()


def paused_at() -> int | None:
    """The step this process waits at in the gate, or None."""
    gate = _state.gate
    return gate[0] if gate is not None else None


def _read_flag(client: Any) -> None:
    _state.stepping = _kv.get(client, _key('step', 'on')) == '1'


def _on_stepping_command(client: Any, order: dict[str, Any]) -> str:
    _apply_stepping(_kv.get(client, _key('step', 'on')) == '1')
    return json.dumps({'stepping': _state.stepping})


def _apply_stepping(on: bool) -> None:
    with _state.lock:
        _state.stepping = on
        if not on and _state.gate is not None:
            _state.gate[1].set()  # stepping off releases this host's gate
        if not on and _state.launch is not None:
            _state.launch.set()


def stepping_enabled() -> bool:
    """Whether this process pauses before each collective (as its debug thread last heard)."""
    return _state.stepping


def set_stepping(on: bool, *, timeout: float = 10.0) -> tuple[int, ...]:
    """Switches barrier stepping on or off on every host.

    With stepping on, each host publishes its arrival at every barrier or
    collective and waits there until that step is released (`release`,
    `release_all`); `step_table` shows who arrived where. Switching it off
    releases every host waiting at a step. Callable from any process and any
    thread; the setting is kept in the coordination service, so a process
    whose debug thread starts later picks it up.

    Args:
        on: the new setting.
        timeout: seconds to wait for every host's confirmation.

    Returns:
        The processes whose debug thread confirmed the change in time. In a
        single process there is nothing to pause; returns ``(0,)``.
    """
    client = _bus.distributed()
    if client is None:
        _apply_stepping(bool(on))
        return (_kv.process_index(),)
    if on:
        # A fresh session: forget releases made ahead during an earlier one.
        _kv.delete(client, _key('step', 'go') + '/')
    _kv.put(client, _key('step', 'on'), '1' if on else '0')
    replies, _ = _bus.command(client, 'stepping', timeout)
    confirmed = []
    for p, reply in replies.items():
        try:
            if json.loads(reply).get('stepping') == bool(on):
                confirmed.append(p)
        except (ValueError, AttributeError):
            pass
    return tuple(sorted(confirmed))


def step_table() -> StepTable:
    """The host x step table of the collectives in flight (see `StepTable`).

    Callable from any process and thread, while the hosts wait at a step.
    """
    client = _bus.distributed()
    if client is None:
        cur = _sequence.current()
        return StepTable(
            num_processes=1,
            stepping=_state.stepping,
            steps=(),
            positions=(cur.seq if cur else None,),
            time=time.time(),
        )
    records = _sequence.all_records(client)
    released = list(_kv.read_dir(client, _key('step', 'go')))
    waiting = sorted(_kv.read_nested_dir(client, _key('step', 'wait')))
    on = _kv.get(client, _key('step', 'on')) == '1'
    return StepTable.build(
        records, released, _kv.process_count(), on, waiting, launches=_paused_launches(client)
    )


def _paused_launches(client: Any) -> list[PausedLaunch]:
    out = []
    for p, raw in _kv.read_dir(client, _key('step', 'launch')).items():
        try:
            d = json.loads(raw)
            out.append(PausedLaunch(p, int(d['n']), str(d['name']), str(d['site']), d['time']))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _release_launches(client: Any, paused: Iterable[PausedLaunch]) -> None:
    for h in paused:
        _kv.put(client, _key('step', 'lgo', h.process, h.n), '1')


def release(steps: int = 1) -> tuple[int, ...]:
    """Releases the next ``steps`` steps (`StepTable.next_release` onwards).

    Hosts waiting at a released step go on into its barrier; a step released
    before the hosts arrive lets them through without pausing. Hosts paused
    before a recorded launch (`StepTable.launches`) go first: letting them
    all through counts as one of the ``steps``.

    Returns:
        The step numbers released (empty in a single process, or when only
        paused launches were let through).
    """
    if steps < 1:
        raise ValueError(f'steps must be >= 1, got {steps!r}')
    client = _bus.distributed()
    if client is None:
        return ()
    table = step_table()
    if table.launches:
        _release_launches(client, table.launches)
        steps -= 1
        if steps == 0:
            return ()
    first = table.next_release
    released = tuple(range(first, first + steps))
    for k in released:
        _kv.put(client, _key('step', 'go', k), '1')
    return released


def release_all(*, timeout: float = 10.0) -> tuple[int, ...]:
    """Switches stepping off and releases every step a host is waiting at.

    Returns:
        The step numbers that were paused and are now released.
    """
    client = _bus.distributed()
    if client is None:
        _apply_stepping(False)
        return ()
    table = step_table()
    paused = tuple(s.seq for s in table.steps if s.status == 'paused')
    set_stepping(False, timeout=timeout)
    _release_launches(client, table.launches)
    # Hosts whose debug thread did not confirm are released through the keys.
    for k in paused:
        _kv.put(client, _key('step', 'go', k), '1')
    return paused


def before_arrival(client: Any, rec: _sequence.CollectiveRecord) -> bool:
    """First half of the step gate, before the host publishes its arrival at ``rec.seq``.

    With stepping on, marks this host as waiting at the step's gate, so that
    whoever sees the arrival also sees that the host waits for a release.
    Zero RPCs when stepping is off.

    Returns:
        Whether the host is to wait at the gate (pass it to `gate`).
    """
    if not _state.stepping:
        return False
    _kv.put(client, _key('step', 'wait', rec.seq, rec.process), '1')
    return True


def gate(client: Any, rec: _sequence.CollectiveRecord, gated: bool) -> bool:
    """The step gate: waits until step ``rec.seq`` is released (or stepping goes off).

    Called by `_sequence.enter` after the record (the arrival) was published
    and before the barrier, with the result of `before_arrival`.

    Returns:
        Whether the host waited at the gate.

    Raises:
        StepTimeoutError: the step was not released within
            ``MULTIHOST_STEP_TIMEOUT`` seconds.
    """
    if not gated:
        return False
    released = threading.Event()
    with _state.lock:
        on = _state.stepping
        if on:
            _state.gate = (rec.seq, released)
    if not on:
        _clear_wait(client, rec)
        return False
    timeout = step_timeout()
    try:
        if rec.process == 0 and rec.seq > 0:
            # Everyone passed barrier seq-1 (we are here), so nobody waits on
            # its release key any more.
            _kv.delete(client, _key('step', 'go', rec.seq - 1))
        threading.Thread(
            target=_wait_release,
            args=(client, _key('step', 'go', rec.seq), released),
            name=f'multihost-gate-{rec.seq}',
            daemon=True,
        ).start()
        deadline = time.monotonic() + timeout
        # A local wait (no RPC), in short slices so Ctrl-C gets through.
        while not released.wait(0.5):
            if time.monotonic() > deadline:
                raise StepTimeoutError(
                    f'step gate: step #{rec.seq} ({rec.describe()}) was not released '
                    f'within {timeout:g} s. Stepping is on: release it with '
                    'multihost.release() or multihost.release_all() (or a '
                    'ControlClient), or raise MULTIHOST_STEP_TIMEOUT.',
                    seq=rec.seq,
                    timeout=timeout,
                )
    finally:
        with _state.lock:
            _state.gate = None
        released.set()  # stops the waiter thread after its current slice
        _clear_wait(client, rec)
    return True


def _clear_wait(client: Any, rec: _sequence.CollectiveRecord) -> None:
    _kv.delete(client, _key('step', 'wait', rec.seq, rec.process))  # only informative


def _wait_release(client: Any, key: str, released: threading.Event) -> None:
    while not released.is_set():
        try:
            got = _kv.poll(client, key, _SLICE_S)
        except Exception:
            if _kv.client() is not client:
                return
            released.wait(1.0)
            continue
        if got is not None:
            released.set()
            return


def launch_gate(name: str, site: str) -> bool:
    """The step gate before a recorded launch: with stepping on, waits until it is released.

    Called by `_job._jit` (under `multihost.install`) before each recorded
    launch while `stepping_enabled` (a flag read, no RPC, when off). The host
    publishes ``mh/step/launch/<pid>`` and waits, in 0.5 s local slices, for
    ``mh/step/lgo/<pid>/<n>`` or stepping off.

    Returns:
        Whether the host waited.

    Raises:
        StepTimeoutError: not released within ``MULTIHOST_STEP_TIMEOUT`` seconds.
    """
    client = _bus.distributed()
    if client is None or not _state.stepping:
        return False
    pid = _kv.process_index()
    released = threading.Event()
    with _state.lock:
        if not _state.stepping or _state.launch is not None:
            return False  # off meanwhile, or another thread of this host holds the gate
        _state.launches += 1
        n = _state.launches
        _state.launch = released
    paused = _key('step', 'launch', pid)
    timeout = step_timeout()
    try:
        _kv.put(
            client, paused, json.dumps({'n': n, 'name': name, 'site': site, 'time': time.time()})
        )
        go = _key('step', 'lgo', pid, n)
        threading.Thread(
            target=_wait_release,
            args=(client, go, released),
            name='multihost-gate-launch',
            daemon=True,
        ).start()
        deadline = time.monotonic() + timeout
        while not released.wait(0.5):
            if time.monotonic() > deadline:
                raise StepTimeoutError(
                    f'step gate: the launch of {name!r} ({site}) was not released within '
                    f'{timeout:g} s. Stepping is on: release it with multihost.release() '
                    'or multihost.release_all() (or a ControlClient), or raise '
                    'MULTIHOST_STEP_TIMEOUT.',
                    seq=-1,
                    timeout=timeout,
                )
    finally:
        with _state.lock:
            _state.launch = None
        released.set()
        _kv.delete(client, paused)
        _kv.delete(client, _key('step', 'lgo', pid, n))
    return True


def _on_enter(client: Any, rec: _sequence.CollectiveRecord) -> Callable[[], None] | None:
    """`_sequence`'s enter hook: start the debug thread; with stepping on, the gate."""
    _bus.ensure_started(client)
    if not before_arrival(client, rec):
        return None

    def wait_at_gate() -> None:
        gate(client, rec, True)

    return wait_at_gate


def wire() -> None:
    """The debug thread answers 'stepping'; every collective passes the gate first
    (`multihost._job._wiring`)."""
    _bus.register('stepping', _on_stepping_command, on_start=_read_flag)
    _sequence.set_enter_hook(_on_enter)
