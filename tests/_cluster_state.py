"""What a worker of a shared test cluster looks like, so a module can tell it is fresh enough.

`conftest.py` shares one `LocalCluster` per shape across the test modules. Before
it hands a running cluster to the next module it compares `state()` of every
worker with the state the same worker reported right after it started: any
difference (an environment variable, a signal handler or a thread a module left
behind, a module attribute a test patched and did not restore, `multihost.install`
still in place, a cold backend that started, hosts whose collective counts no
longer agree) and the cluster is restarted, as a broken one is. `forget()` resets
what a fresh process would not have yet and that tests read back: the flight
records.

Runs in the workers (they import this file by its path): stdlib, jax and
multihost only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from typing import Any

#: Module attributes of these kinds are compared by value, the rest by identity
#: (a function or a class patched in place); mutable containers are not compared.
_BY_VALUE = (bool, int, float, complex, str, bytes, type(None))
_WATCHED_PREFIXES = ('multihost', 'jax.experimental.multihost_utils', 'jax.distributed')
#: multihost's own thread that a fresh process starts at its first collective and keeps:
#: the debug thread (`_bus`); one is no difference. The barrier waiters (`_kv._Waiter`)
#: are not listed while idle (a fresh process starts one, an abandoned barrier another
#: that is reused once the service ends it); a busy one is a difference.
SERVICE_THREADS = ('multihost-debug', 'multihost-pulse')


def _attributes(mod: types.ModuleType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in sorted(vars(mod).items()):
        if name.startswith('__'):
            continue
        if isinstance(value, _BY_VALUE):
            out[name] = value
        elif isinstance(value, tuple) and all(isinstance(v, _BY_VALUE) for v in value):
            out[name] = value
        elif callable(value) or isinstance(value, types.ModuleType):
            out[name] = ('id', id(value))
    return out


def state() -> dict[str, Any]:
    """This worker's environment, signal handlers, threads, watched module attributes, ..."""
    import jax

    from multihost import _jax_adapter
    from multihost._exchange import _kv

    with _kv._Waiter._lock:
        idle = list(_kv._Waiter._idle)
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        handlers[int(sig)] = handler if isinstance(handler, int) else ('id', id(handler))
    modules = {
        name: _attributes(mod)
        for name, mod in sorted(sys.modules.items())
        if name.startswith(_WATCHED_PREFIXES) and isinstance(mod, types.ModuleType)
    }
    config = {}
    for name, value in sorted(jax.config.values.items()):
        config[name] = value if isinstance(value, _BY_VALUE) else repr(value)
    return dict(
        environ=dict(os.environ),
        signals=handlers,
        threads=sorted(t.name for t in threading.enumerate() if t not in idle),
        modules=modules,
        jax_config=config,
        jax_jit=id(jax.jit),
        backend_started=_jax_adapter.backends_started(),
    )


def sequence() -> int:
    """The next collective's number on this host (the main thread's sequence)."""
    from multihost._exchange import _sequence

    return _sequence._state.next_seq


def differences(fresh: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed from ``fresh`` to ``now``, one short line each (empty: nothing).

    A module first imported after ``fresh`` is not a difference; a changed
    attribute of a module both know is."""
    out = []
    for key in fresh:
        if key == 'modules':
            for mod, attrs in now[key].items():
                before = fresh[key].get(mod)
                if before is None:
                    continue
                for name in sorted(set(before) | set(attrs)):
                    if name in before and before.get(name) != attrs.get(name):
                        out.append(f'{mod}.{name}: {before.get(name)!r} -> {attrs.get(name)!r}')
        elif key == 'threads':
            out += _thread_differences(fresh[key], now[key])
        elif key in ('environ', 'signals', 'jax_config'):
            for name in sorted(set(fresh[key]) | set(now[key]), key=str):
                if fresh[key].get(name) != now[key].get(name):
                    out.append(
                        f'{key}[{name!r}]: {fresh[key].get(name)!r} -> {now[key].get(name)!r}'
                    )
        elif fresh[key] != now[key]:
            out.append(f'{key}: {fresh[key]!r} -> {now[key]!r}')
    return out


def _thread_differences(fresh: list[str], now: list[str]) -> list[str]:
    extra = list(now)
    out = []
    for name in fresh:
        if name in extra:
            extra.remove(name)
        else:
            out.append(f'thread {name!r} ended')
    for name in sorted(set(extra)):
        if name not in SERVICE_THREADS or extra.count(name) > 1:
            out.append(f'thread {name!r} left running ({extra.count(name)})')
    return out


#: What `push_environ` replaced, for `pop_environ` (in the worker).
_saved_environ: list[dict[str, str | None]] = []


def push_environ(values: dict[str, str]) -> None:
    """Sets environment variables a module's workers read at call time (``MP_CLUSTER_ENV``)."""
    _saved_environ.append({name: os.environ.get(name) for name in values})
    os.environ.update(values)


def pop_environ() -> None:
    """Restores what the last `push_environ` replaced."""
    for name, value in _saved_environ.pop().items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def forget() -> None:
    """Forgets the flight records (a fresh process has none yet)."""
    from multihost import _recorder

    _recorder.reset()
