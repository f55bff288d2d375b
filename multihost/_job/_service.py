"""Records the barriers and key waits libraries make on the coordination-service client itself.

orbax (`sync_global_processes` with a process subset or its distributed-barrier
flag, its futures), marin's `barrier_sync` and others keep their own reference
to the client object and call its methods directly, past every function
`multihost` wraps. So the methods are replaced on the client's *class*
(`_jax_adapter.client_class`, a nanobind class that accepts it on jax 0.10
and 0.12): every client object, however it was reached, calls through them.

Each call of `wait_at_barrier` (kind `'service_barrier'`) and of
`blocking_key_value_get` / `blocking_key_value_get_bytes` (`'service_wait'`)
is noted in the flight recorder before it starts (state ``'waiting'``: an
in-progress call shows in the wavefront and the where view) and finished when
it returns or raises, with the barrier id or key as name, the timeout, the
call site (the first frame outside multihost, jax and jaxlib; the standard
library's frames skipped too when a frame outside it exists) and the thread.
The original method is called with the same arguments; its result and its
exceptions come back unchanged. Calls whose caller is inside the `multihost`
package (`_exchange._kv`, the only module that calls these methods, and the
test harness `local`) are passed straight through, unrecorded: the toolkit's
own traffic is not the user's. Not seen: a bound method taken before `patch`
and kept (``f = client.wait_at_barrier``; orbax takes it at each call), and
calls the client makes from C++ (JAX's own shutdown barrier).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from multihost import _cells, _jax_adapter, _recorder
from multihost._debug import _stacks
from multihost._job._options import InstallOptions

#: Client method -> the flight-record kind of its calls.
METHODS = {
    'wait_at_barrier': _recorder.SERVICE_BARRIER,
    'blocking_key_value_get': _recorder.SERVICE_WAIT,
    'blocking_key_value_get_bytes': _recorder.SERVICE_WAIT,
}
#: The first two parameters of each method (its id or key, its timeout) and the subset.
_ID_NAMES = ('barrier_id', 'key')
_PROCESSES = 'process_ids'

_MISSING = object()
#: (the patched class, method name -> what its ``__dict__`` held before), while patched.
_patched: tuple[type, dict[str, Any]] | None = None
_lock = threading.Lock()


def patch(options: InstallOptions) -> None:
    """Replaces the client class's barrier and blocking-get methods by recording ones.

    ``options`` (`InstallOptions`) changes nothing here: the library's own
    timeouts and semantics stay. Does nothing when already patched, or when
    JAX's client class is not found (nothing is then seen).
    """
    global _patched
    with _lock:
        if _patched is not None:
            return
        cls = _jax_adapter.client_class()
        if cls is None:
            return
        saved: dict[str, Any] = {}
        for name, kind in METHODS.items():
            original = getattr(cls, name, None)
            if original is None:
                continue
            saved[name] = cls.__dict__.get(name, _MISSING)
            setattr(cls, name, _recording(kind, original))
        _patched = (cls, saved)


def unpatch() -> None:
    """Puts the class's original methods back (client objects made meanwhile use them too)."""
    global _patched
    with _lock:
        if _patched is None:
            return
        cls, saved = _patched
        for name, before in saved.items():
            if before is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, before)
        _patched = None


def patched() -> bool:
    """Whether the client class's methods are the recording ones now."""
    return _patched is not None


def _recording(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (an unbound client method), recording each call made outside multihost."""

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        if _is_ours(caller.f_code.co_filename):
            return original(self, *args, **kwargs)
        entry = _recorder.note(
            kind,
            _ident(args, kwargs),
            seq=None,
            digest=_subset(args, kwargs),
            site=_site(caller),
            timeout=_timeout(args, kwargs),
            thread=_thread(),
        )
        start = time.monotonic()
        try:
            out = original(self, *args, **kwargs)
        except BaseException:
            _recorder.finished(entry, wait=time.monotonic() - start, failed=True)
            raise
        _recorder.finished(entry, wait=time.monotonic() - start)
        return out

    method.__multihost_original__ = original  # type: ignore[attr-defined]
    return method


def _ident(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if args:
        return str(args[0])
    return str(next((kwargs[k] for k in _ID_NAMES if k in kwargs), ''))


def _timeout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
    ms = args[1] if len(args) > 1 else kwargs.get('timeout_in_ms')
    try:
        return None if ms is None else float(ms) / 1000.0
    except (TypeError, ValueError):
        return None


def _subset(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``'0,2'`` for a barrier of a process subset; empty for every process (or a key wait)."""
    ids = args[2] if len(args) > 2 else kwargs.get(_PROCESSES)
    if not ids:
        return ''
    try:
        return ','.join(str(int(p)) for p in sorted(ids))
    except (TypeError, ValueError):
        return ''


def _thread() -> str:
    t = threading.current_thread()
    return '' if t is threading.main_thread() else t.name


#: File name -> whether it is inside the multihost package.
_OURS: dict[str, bool] = {}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _is_ours(filename: str) -> bool:
    inside = _OURS.get(filename)
    if inside is None:
        inside = _OURS[filename] = os.path.abspath(filename).startswith(_PACKAGE)
    return inside


#: Folders under the standard library's that hold installed packages, not the library.
_INSTALLED = ('site-packages', 'dist-packages')


@functools.cache
def _skipped() -> tuple[tuple[str, ...], str]:
    return _stacks.internal_dirs()


def _site(frame: Any) -> str:
    """``file:line`` of the call: the first frame outside multihost, jax and jaxlib, preferring
    one outside the standard library (``asyncio.to_thread``, ``threading``: their caller)."""
    packages, stdlib = _skipped()
    first = ''
    f = frame
    while f is not None:
        filename = f.f_code.co_filename
        path = os.path.abspath(filename)
        if not filename.startswith('<frozen') and not path.startswith(packages):
            here = _cells.place(filename, f.f_lineno)  # a cell: Cell In[4], line 3
            if not path.startswith(stdlib) or any(d in path for d in _INSTALLED):
                return here
            first = first or here
        f = f.f_back
    return first or '<unknown>'
