"""The data tools' reads on a device that may be stuck: host copies of ready shards only.

A device runs its programs in order. When a launch is in flight (a step
stuck in a collective whose peer never came, on every host but the one that
failed), any program a data tool launches there queues behind it: on one TPU
v5e chip a fingerprint of a ready array (a device program) waited 13.2 s
behind a 13 s launch, while ``np.asarray`` of that array returned in 3 ms.
Copies of ready buffers to the host do not queue behind compute.

So inside `_recorder.reading_host_copies` (the tools of an attached or held
job, run by each host's debug thread, `engine.stopped`; and a `Session`'s
tools while a recorded launch is in flight on the host, `engine.calls`):

* each shard is read by one device-to-host copy, only when it is ready (`copy`);
  one not ready is named, with the launch it waits on (`NotReadyError`), never
  waited for;
* fingerprints are computed on the host from the copies, by the definition the
  mode picks (`fingerprint.digests`): the kernel's numpy implementation, the
  same bytes the device would give, or XXH3; NaN/Inf counts by numpy;
* a leaf is read one block (a shard's buffer) at a time and the copy dropped
  before the next is made: memory bounded by the largest shard, not the tree;
* exchanges go over the coordination service, whatever their size (a device
  collective, `_core._collectives`' path for large data, would queue too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from multihost import _recorder
from multihost._exchange import _kv

__all__ = ['NotReadyError', 'active', 'blocks', 'check_ready', 'copy', 'offloaded', 'unready']


class NotReadyError(RuntimeError):
    """A shard a data tool would read is not ready (or deleted); reading it would wait.

    Attributes:
        what: the value (path) or shard read.
        launch: the recorded launch it waits on, in words (empty when unknown).
    """

    def __init__(self, message: str, what: str = '', launch: str = '') -> None:
        super().__init__(message)
        self.what, self.launch = what, launch


def offloaded(x: jax.Array) -> bool:
    """Whether ``x`` lives in host memory beside its device (``memory_kind`` pinned_host or
    unpinned_host: offloaded optimizer state or activations). A device program cannot take
    it with device arrays ("memory_space of all inputs ... must be the same"): the data
    tools read it as host memory, like a host copy."""
    return getattr(x.sharding, 'memory_kind', None) in ('pinned_host', 'unpinned_host')


def active() -> bool:
    """Whether this thread reads host copies only (`_recorder.reading_host_copies`)."""
    return _recorder.host_copies_only()


def _waits_on() -> str:
    """The recorded launch(es) this host's device work waits on, in words ('' if none)."""
    try:
        flight = _recorder.in_flight(_kv.process_index())
    except Exception:
        return ''
    if not flight:
        return ''
    first, last = flight[0], flight[-1]
    where = f'{first.describe()}'
    if last is not first:
        where += f' (and {len(flight) - 1} launch{"es" if len(flight) > 2 else ""} after it)'
    return where


def _why(x: jax.Array, what: str, unfinished: Callable[[str], str] | None = None) -> str | None:
    """Why ``x`` cannot be read now without waiting (None: it can); ``unfinished`` words the
    case of a launch's output not ready yet (a stopped job says more: `engine.stopped`)."""
    try:
        if x.is_deleted():
            return (
                f'{what} was deleted (donated to a launch, e.g. donate_argnums): its buffers '
                "are gone; name the launch's output instead, or an outer frame's value"
            )
        ready = getattr(x, 'is_ready', None)  # an ArrayImpl's (jax.Array does not say)
        if ready is None or ready():
            return None
    except Exception as exc:  # a buffer JAX cannot tell about: not read
        return f'{what} cannot be read here ({type(exc).__name__}: {exc})'
    if unfinished is not None:
        return unfinished(what)
    launch = _waits_on()
    behind = f' (in flight here: {launch})' if launch else ''
    return (
        f'{what} is the output of a launch that has not finished on this host{behind}: '
        'reading it would wait for that launch; name its inputs instead'
    )


def unready(
    value: Any, name: str = '', unfinished: Callable[[str], str] | None = None
) -> str | None:
    """Why a pytree's `jax.Array` leaves cannot all be read now (the first one's reason), or
    None when every leaf is ready. Reads no data. ``unfinished``: as in `_why`."""
    flat = jax.tree_util.tree_flatten_with_path(value)[0]
    for path, leaf in flat:
        if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
            continue
        why = _why(leaf, (name or 'the value') + jax.tree_util.keystr(path), unfinished)
        if why is not None:
            return why
    return None


def check_ready(x: jax.Array, what: str = 'a leaf') -> None:
    """Raises `NotReadyError` when ``x`` (any `jax.Array`) is not ready or deleted."""
    why = _why(x, what)
    if why is not None:
        raise NotReadyError(why, what, _waits_on())


def copy(x: Any, what: str = 'a shard') -> np.ndarray:
    """A host copy of a single-device array that is ready (numpy passes through).

    Raises:
        NotReadyError: ``x`` is not ready (a launch in flight will make it) or deleted.
    """
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    check_ready(x, what)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def blocks(x: jax.Array) -> Iterator[tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]]:
    """A fully addressable array's distinct blocks (one replica each), copied to the host
    one at a time as the caller asks (memory: one block's copy, dropped before the next),
    each with its offsets in the leaf and the leaf's shape.

    Raises:
        NotReadyError: a block is not ready (before its copy is made).
    """
    shape = tuple(int(d) for d in x.shape)
    seen: set[tuple[int, ...]] = set()
    what = f'a shard of a {x.dtype}{list(shape)} array'
    for shard in x.addressable_shards:
        start = tuple(int(sl.start or 0) for sl in shard.index) if shard.index else ()
        if start in seen:
            continue
        seen.add(start)
        yield copy(shard.data, what), start or (0,) * x.ndim, shape
