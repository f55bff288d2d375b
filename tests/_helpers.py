"""Helpers the tests share: meshes, waiting until something holds, lines of source, notebooks.

Importable from test modules as ``from _helpers import ...``, in the pytest
process and in the workers of the multi-process harness (``conftest.py``
puts this folder on their ``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
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
    """The text a run notebook (an `nbformat` node) printed: every code cell's outputs, their
    ``text`` or ``text/plain``, one per line."""
    return '\n'.join(
        str(o.get('text') or o.get('data', {}).get('text/plain', ''))
        for c in nb.cells
        if c.cell_type == 'code'
        for o in c.outputs
    )


@contextlib.contextmanager
def local_session(setup: str, n: int = 4, devices: int = 2) -> Iterator[Any]:
    """A real local cluster (``mhnotebook.start_local``) with ``setup`` run on every host."""
    import mhnotebook

    s = mhnotebook.start_local(n, devices, progress=False)
    try:
        s.execute(setup, timeout=120, echo=False)
        yield s
    finally:
        s.stop()


def magic_shell(session: Any) -> tuple[Any, Any]:
    """The real IPython shell of this test process with ``%load_ext mhnotebook``, on ``session``."""
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()  # one real shell per test process
    ip.run_line_magic('load_ext', 'mhnotebook')
    magics = ip.magics_manager.registry['MultihostMagics']
    magics.session, magics.background = session, None
    return ip, magics
