"""Helpers the tests share: meshes, waiting until something holds, lines of source, notebooks.

Importable from test modules as ``from _helpers import ...``, in the pytest
process and in the workers of the multi-process harness (``conftest.py``
puts this folder on their ``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

_COMPILES = [0]


def _count_compiles(event: str, duration: float, **kwargs: object) -> None:
    if event == '/jax/core/compile/backend_compile_duration':
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def compiles() -> int:
    """How many XLA compilations this process has made since it imported this module."""
    return _COMPILES[0]


def host_mesh(axes: tuple[str, str] = ('host', 'dev')) -> Mesh:
    """A 2-D mesh whose row p holds process p's devices (checked), one column per local device."""
    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    for p, row in enumerate(devices):
        assert {d.process_index for d in row} == {p}, 'jax.devices() is not in process order'
    return Mesh(devices, axes)


def flat_mesh(axis: str = 'x') -> Mesh:
    """Every device on one axis, in `jax.devices()` order."""
    return Mesh(np.array(jax.devices()), (axis,))


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    *,
    period: float = 0.05,
    sleep: Callable[[float], Any] = time.sleep,
    action: Callable[[], Any] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """Calls ``predicate()`` until it returns something truthy, and returns that.

    Between two calls: ``action()`` (when given), then ``sleep(period)``. An
    exception of a type in ``retry_on`` counts as "not yet".

    Raises:
        AssertionError: ``timed out after <timeout> s waiting for <what>``
            (``what`` may be a callable, asked only then, to describe the state).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except retry_on:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f'timed out after {timeout:g} s waiting for {text}')
        if action is not None:
            action()
        sleep(period)


def source_line(fn: Callable[..., Any], marker: str) -> int:
    """The line number, in ``fn``'s file, of the one line of ``fn`` that starts with ``marker``.

    For tests that check line numbers (call sites, frames): found by searching
    the source, so editing the code above does not break them.
    """
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if line.strip().startswith(marker)]
    assert len(hits) == 1, f'{len(hits)} lines of {fn.__qualname__} start with {marker!r}'
    return hits[0]


def notebook_text(nb: Any) -> str:
    """The text a run notebook (an `nbformat` node) printed: per code cell, its stdout as one
    text (a kernel may flush one ``print`` in pieces, stderr between them), then its other
    outputs' ``text`` or ``text/plain``, one per line."""
    out: list[str] = []
    for c in nb.cells:
        if c.cell_type != 'code':
            continue
        stdout = [
            o for o in c.outputs if o.get('output_type') == 'stream' and o.get('name') == 'stdout'
        ]
        if stdout:
            out.append(''.join(str(o.get('text', '')) for o in stdout))
        out.extend(
            str(o.get('text') or o.get('data', {}).get('text/plain', ''))
            for o in c.outputs
            if not any(o is s for s in stdout)
        )
    return '\n'.join(out)


@contextlib.contextmanager
def env_var(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name] = value`` (None: unset) inside the block, restored after it."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def local_session(setup: str, n: int = 4, devices: int = 2) -> Iterator[Any]:
    """A real local cluster (``mhnotebook.start_local``) with ``setup`` run on every host.

    Shared across the test session by shape, as the multi-process harness shares
    its clusters: a module gets the running session of its shape when every host
    is alive and idle, none is held at a step, and each engine looks as it did
    right after it started (`_cluster_state`, run on the engines: environment,
    signal handlers, threads, patched module attributes; the hosts' collective
    counts agree); its variables are then removed and its flight records
    forgotten. Otherwise a fresh session is started. `stop_shared_sessions`
    (conftest, at the end of the session) stops them."""
    s = _SHARED.pop((n, devices), None)
    if s is not None and not _clean(s):
        s.stop()
        s = None
    if s is None:
        import mhnotebook

        # Engines as in a notebook: ipykernel captures what C code writes to fd 1/2 (XLA's
        # own lines) only where PYTEST_CURRENT_TEST is not in their environment.
        with env_var('PYTEST_CURRENT_TEST', None):
            s = mhnotebook.start_local(n, devices, progress=False)
        try:
            _FRESH[id(s)] = _engine_state(s)
        except BaseException:
            s.stop()
            raise
        SESSION_STARTS[0] += 1
    else:
        SESSION_STARTS[1] += 1
    try:
        s.execute(setup, timeout=120, echo=False)
        yield s
    except BaseException:
        s.stop()
        raise
    _SHARED[(n, devices)] = s


#: Running sessions by shape, between the modules that use them (`local_session`).
_SHARED: dict[tuple[int, int], Any] = {}
#: id(session) -> per engine: its pid, user names and `_cluster_state.state()` when fresh.
_FRESH: dict[int, list[dict[str, Any]]] = {}
#: [sessions started, sessions handed on to the next module] (reported at the end).
SESSION_STARTS = [0, 0]
#: Why a shared session was not reused, one line each.
SESSION_RESTARTS: list[str] = []
_STATE_FILE = __file__.replace('_helpers.py', '_cluster_state.py')
_STATE_CODE = f"""
import importlib.util as _mh_u
_mh_spec = _mh_u.spec_from_file_location('_mh_cluster_state', {_STATE_FILE!r})
_mh_m = _mh_u.module_from_spec(_mh_spec)
_mh_spec.loader.exec_module(_mh_m)
_mh_probe = dict(
    names=sorted(n for n in globals() if not n.startswith('_mh_')),
    state=_mh_m.state(),
    seq=_mh_m.sequence(),
)
del _mh_u, _mh_spec
"""
#: On an engine: removes every user variable not in ``_mh_keep`` (pushed first).
_FORGET_CODE = """
for _mh_n in [n for n in globals() if n not in _mh_keep]:
    globals().pop(_mh_n, None)
globals().pop('_mh_n', None)
"""


def _engine_state(s: Any) -> list[dict[str, Any]]:
    """Per host (process order): engine pid, user names, `_cluster_state` state, sequence."""
    view = s.client[s.engine_ids]
    view.execute(_STATE_CODE, block=True)
    probes = view.pull('_mh_probe', block=True)
    view.execute('_mh_m.forget()\ndel _mh_m, _mh_probe', block=True)
    return [dict(pid=h.pid, **p) for h, p in zip(s.processes, probes)]


def _clean(s: Any) -> bool:
    """Whether a running session may serve the next module (then: its variables removed)."""
    import _cluster_state

    why: list[str] = []
    fresh = _FRESH.get(id(s))
    try:
        if fresh is None or s._stopped or s.dead or s._unaligned:
            why.append('stopped, a host gone or hosts unaligned')
        elif any(st['busy'] for st in s.status().values()) or s.stepping:
            why.append('a host busy, or stepping on')
        else:
            now = _engine_state(s)
            if [e['pid'] for e in now] != [e['pid'] for e in fresh]:
                why.append('engines restarted')
            for p, (before, after) in enumerate(zip(fresh, now)):
                why += [
                    f'host {p}: {d}'
                    for d in _cluster_state.differences(before['state'], after['state'])
                ]
            if len({e['seq'] for e in now}) != 1:
                why.append(f"the hosts' collective counts differ: {[e['seq'] for e in now]}")
    except Exception as exc:  # any failure: start afresh
        why.append(f'the check failed: {str(exc).splitlines()[0] if str(exc) else exc!r}')
    if why:
        SESSION_RESTARTS.append('; '.join(why[:3]))
        return False
    assert fresh is not None
    for h, e in zip(s.processes, fresh):  # the module's variables go; the fresh ones stay
        engine = s.client[h.engine_id]
        engine.push({'_mh_keep': set(e['names'])}, block=True)
        engine.execute(_FORGET_CODE, block=True)
    return True


def stop_shared_sessions() -> None:
    """Stops every shared session (conftest, at the end of the test session)."""
    while _SHARED:
        _SHARED.popitem()[1].stop()


def magic_shell(session: Any) -> tuple[Any, Any]:
    """The real IPython shell of this test process with ``%load_ext mhnotebook``, on ``session``."""
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()  # one real shell per test process
    ip.run_line_magic('load_ext', 'mhnotebook')
    magics = ip.magics_manager.registry['MultihostMagics']
    magics.session, magics.background = session, None
    return ip, magics


#: libtpu (TPU topologies compiled on CPU): the tests that need it skip without it, saying
#: why, unless ``MH_REQUIRE_LIBTPU=1`` (`.ci/run`) makes a missing libtpu an error.
HAVE_LIBTPU = importlib.util.find_spec('libtpu') is not None
_NO_LIBTPU = (
    'libtpu is not installed: the test extra installs libtpu==0.0.42.* only with Python '
    "3.11's jax 0.10.2 (jax 0.12 needs another libtpu); pip install 'libtpu==0.0.42.*'"
)


def libtpu_mark() -> Any:
    """The skip mark of a test module that needs libtpu (called where such a module is
    collected: other modules import this file on Pythons without libtpu)."""
    if not HAVE_LIBTPU and os.environ.get('MH_REQUIRE_LIBTPU') == '1':
        raise RuntimeError(f'MH_REQUIRE_LIBTPU=1 but {_NO_LIBTPU}')
    return pytest.mark.skipif(not HAVE_LIBTPU, reason=_NO_LIBTPU)


def rotating(values: list[Any], every_landing: list[Any]) -> list[Any]:
    """``values`` for ``pytest.mark.parametrize``, those not in ``every_landing`` marked
    ``release``: CI runs the cases that stand for the sweep on every landing and the rest on
    the release rotation (``--release K/N``: the whole sweep once in N landings)."""
    missing = [v for v in every_landing if v not in values]
    if missing:
        raise ValueError(f'rotating: {missing!r} are not among the values {values!r}')
    return [v if v in every_landing else pytest.param(v, marks=pytest.mark.release) for v in values]
