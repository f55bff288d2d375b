"""A patcher of `install`: once JAX is initialized, check that the hosts are numbered one way.

``jax.process_index()`` names a host in every multihost message, dump and picture; the devices
carry their own ``process_index``, and a TPU launcher gives each worker ``TPU_WORKER_ID``
(within its slice; ``MEGASCALE_NUM_SLICES`` slices). When a launcher numbers the hosts
differently from JAX (a hand-written ``process_id=`` that does not follow the workers, a
scheduler's rank), process 2 of a message is not worker 2 of the pod, and every diagnosis
points at the wrong host. `check_numbering` says so at once, with the numbers.

Wraps ``jax.distributed.initialize`` (install runs before it) and checks after it returns;
when JAX is initialized already, checks at install.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from multihost import _jax_adapter
from multihost._job._options import InstallOptions


class HostNumberingError(RuntimeError):
    """JAX's process index disagrees with the devices' or the launcher's (``TPU_WORKER_ID``)."""


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.original: Any = None
        self.patched: Any = None


_state = _State()


def check_numbering(environ: Any = None) -> None:
    """Raises `HostNumberingError` when ``jax.process_index()`` disagrees with this host's
    devices' ``process_index`` or with ``TPU_WORKER_ID`` (modulo the hosts per slice when
    ``MEGASCALE_NUM_SLICES`` says there are several slices). Local: no communication."""
    import jax

    env = os.environ if environ is None else environ
    pid, count = jax.process_index(), jax.process_count()
    odd = [d for d in jax.local_devices() if d.process_index != pid]
    if odd:
        raise HostNumberingError(
            f'jax.process_index() is {pid} but this host drives devices of process '
            f'{odd[0].process_index} ({odd[0]}); the distributed client and the runtime '
            'number hosts differently: pass the same process_id to '
            'jax.distributed.initialize as the runtime uses (or let JAX detect it)'
        )
    worker = str(env.get('TPU_WORKER_ID', '')).strip()
    if not worker.isdigit():
        return
    slices_text = str(env.get('MEGASCALE_NUM_SLICES', '1')).strip()
    slices = int(slices_text) if slices_text.isdigit() and int(slices_text) > 0 else 1
    per_slice = max(count // slices, 1)
    if int(worker) != pid % per_slice:
        where = f' within its slice ({per_slice} hosts per slice)' if slices > 1 else ''
        raise HostNumberingError(
            f'TPU_WORKER_ID={worker} but jax.process_index() is {pid}{where}: the launcher '
            'numbered this host differently from JAX, so "process N" in every message and '
            f'picture would not be worker N. Pass process_id={int(worker)} (plus slice '
            'offset) to jax.distributed.initialize, or unset a stale TPU_WORKER_ID'
        )


def patch(options: InstallOptions) -> None:
    """Checks after ``jax.distributed.initialize`` returns, or now when it already has."""
    import jax.distributed

    with _state.lock:
        if _state.original is None:
            original = _state.original = jax.distributed.initialize

            @functools.wraps(original)
            def initialize(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                check_numbering()
                return out

            _state.patched = jax.distributed.initialize = initialize
    if _jax_adapter.client() is not None:
        check_numbering()


def unpatch() -> None:
    """Puts JAX's initialize back."""
    import jax.distributed

    with _state.lock:
        if _state.original is not None and jax.distributed.initialize is _state.patched:
            jax.distributed.initialize = _state.original
        _state.original = _state.patched = None
