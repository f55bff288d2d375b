"""The host definition of a leaf's fingerprint (XXH3-128), and the choice of definition per leaf.

Leaf fingerprints: XXH3-128 of the bytes in host memory, an exact kernel on the device.

Two definitions; each leaf uses one, and its digest says which (`digests`):

* **host** (``'x'`` + 32 hex digits): XXH3-128 (the ``xxhash`` package) of a
  header (dtype name, shape) and the leaf's bytes in C order, little-endian.
  For data in host memory: numpy leaves, and `jax.Array` shards on CPU
  devices, read through zero-copy views (``np.asarray(shard.data)``), at
  memory speed. No construction proof: a collision of unrelated data is about
  2^-128; not for adversarial input.
* **kernel** (32 hex digits per lane set): the exact construction below,
  computed by XLA on the device for data on an accelerator (only the lanes
  leave it) and by numpy on the host, the two giving the same bytes.

``MULTIHOST_FINGERPRINT=auto|device|host`` (`mode`) picks: ``auto`` (the
default) as above; ``device`` the kernel everywhere (numpy leaves by its
numpy implementation: the kernel's tests run on CPU); ``host`` XXH3
everywhere (accelerator data copied to the host). Hosts exchange digests,
so a leaf held in different kinds on two hosts (numpy here, a GPU array
there) would differ for where it lives: the callers (`_treediff`,
`_replicas`) then recompute the host-kind side with the kernel, the
definition every host can compute (`kernel_digests`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import xxhash

from multihost import _recorder
from multihost._checks import _hostreads
from multihost._checks.fingerprint.batched import every
from multihost._checks.fingerprint.definition import numpy_flags
from multihost._checks.fingerprint.execute import fingerprints, with_flags
from multihost._checks.fingerprint.planning import parts as blocks_of
from multihost._checks.fingerprint.settings import CACHE

ENV = 'MULTIHOST_FINGERPRINT'
MODES = ('auto', 'device', 'host')
HOST_PREFIX = 'x'  # a host-definition digest: 'x' + 32 hex digits (a kernel one: hex only)


def mode(value: str | None = None) -> str:
    """``auto``, ``device`` or ``host``: ``value``, else ``MULTIHOST_FINGERPRINT`` (default auto).

    Raises:
        ValueError: another value (one line, naming it and the choices).
    """
    raw = os.environ.get(ENV, '') if value is None else value
    got = raw.strip().lower() or 'auto'
    if got not in MODES:
        raise ValueError(
            f'{ENV}={raw!r} is not one of auto, device, host: '
            'unset it (auto: XXH3 for host memory, the kernel on accelerators) or set one of them'
        )
    return got


def is_host_digest(digest: str) -> bool:
    """Whether a hex digest is of the host definition (XXH3), not the kernel's."""
    return digest.startswith(HOST_PREFIX)


def is_kernel_digest(digest: str) -> bool:
    """Whether a hex digest is of the kernel's definition (16 bytes per lane set)."""
    return bool(digest) and len(digest) % 32 == 0 and not is_host_digest(digest)


def _all_cpu(x: jax.Array) -> bool:
    return all(d.platform == 'cpu' for d in x.devices())


def in_host_memory(x: jax.Array) -> bool:
    """Whether every device of ``x`` is a CPU (its shards are read in place)."""
    return bool(CACHE.get('host_memory', x.sharding, _all_cpu, x))


def host_kind(leaf: Any, how: str) -> bool:
    """Whether ``leaf`` (numpy or a fully addressable `jax.Array`) takes the host definition."""
    if how == 'host' or (how == 'auto' and type(leaf) is np.ndarray):
        return True
    if how == 'device':
        return False
    return not isinstance(leaf, jax.Array) or in_host_memory(leaf)


def host_view(x: jax.Array) -> np.ndarray | None:
    """A zero-copy numpy view of a single-device array in host memory; else None.

    On a CPU device ``np.asarray`` shares the device buffer (no copy; checked
    in tests/engine/test_fingerprint.py by the buffer address).
    """
    if len(x.addressable_shards) != 1 or not in_host_memory(x):
        return None
    a = np.asarray(x)
    return a if a.flags.c_contiguous else None


def dtype_names(dt: np.dtype) -> tuple[str, str]:
    """``(dt.name, str(dt))``, remembered: numpy builds both anew at each use (slow, ~40 us).

    Remembered for numeric and ml_dtypes dtypes only (their type number, byte
    order and size say which dtype it is); others are built each time.
    """
    key = (dt.num, dt.byteorder, dt.itemsize)
    got = CACHE.peek('dtype_names', key)
    if got is None:
        got = (dt.name, str(dt))
        simple = dt.fields is None and dt.subdtype is None
        if simple and (dt.kind in 'biufc' or (dt.kind == 'V' and dt.num >= 256)):
            CACHE.put('dtype_names', key, got)
    return got


def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    return (dtype_names(dtype)[0] + repr(tuple(int(d) for d in shape))).encode()


def _update(h: Any, a: np.ndarray) -> None:
    """Hashes ``a``'s bytes in C order, little-endian: in place when they are already so."""
    if a.dtype.byteorder == '>':
        a = a.astype(a.dtype.newbyteorder('<'))
    try:
        h.update(a)  # the array's own buffer (any dtype; C-contiguous only): no copy
    except (BufferError, ValueError):  # not C-contiguous: one copy, in C order
        h.update(np.ascontiguousarray(a))


def _host_parts(x: jax.Array) -> list[np.ndarray]:
    """A host-memory array's bytes in C order as zero-copy pieces (a copy if it must).

    One device, or blocks cut along the first axis only (each a run of the
    leaf's C order), are read in place; other layouts are assembled by
    ``np.asarray`` (one copy). Accelerator data is copied to the host.
    """
    view = host_view(x)
    if view is not None:
        return [view]
    if in_host_memory(x) and x.ndim:
        blocks = blocks_of(x)
        rest = tuple(int(d) for d in x.shape[1:])
        if all(not any(o[1:]) and tuple(b.shape[1:]) == rest for b, o, _ in blocks):
            views = [np.asarray(b) for b, _, _ in blocks]
            if all(v.flags.c_contiguous for v in views):
                return views
    return [np.asarray(x)]


def host_digest(leaf: Any) -> bytes:
    """The host definition of a leaf (numpy, or a fully addressable `jax.Array`): 16 bytes.

    XXH3-128 of the header (dtype name, shape) and the bytes in C order,
    little-endian: the same for a numpy leaf and a jax.Array of the same values.
    """
    parts = [leaf] if type(leaf) is np.ndarray else None
    if parts is None:
        parts = _host_parts(leaf) if isinstance(leaf, jax.Array) else [np.asarray(leaf)]
    h = xxhash.xxh3_128(_header(parts[0].dtype, getattr(leaf, 'shape', None) or np.shape(leaf)))
    for p in parts:
        _update(h, p)
    return h.digest()


def kernel_digests(leaves: Sequence[Any]) -> list[str]:
    """Hex digests of the kernel definition (`fingerprints`), whatever the mode."""
    return [b.hex() for b in fingerprints(leaves)]


def digests(leaves: Sequence[Any], how: str | None = None) -> list[str]:
    """Each leaf's hex digest by the definition its kind takes (see the module docstring).

    Args:
        leaves: numpy arrays or fully addressable `jax.Array` s of `supported`
            dtypes (PRNG keys as their key data).
        how: ``auto``, ``device`` or ``host``; default `mode` (the environment).

    Returns:
        ``'x' + hex`` (XXH3-128) for a leaf in host memory under ``auto``
        (every leaf under ``host``), else the kernel's hex (every leaf under
        ``device``).
    """
    how = mode(how)
    out: list[Any] = [None] * len(leaves)
    kernel: list[int] = []
    copies = _recorder.host_copies_only()
    for i, leaf in enumerate(leaves):
        if copies and isinstance(leaf, jax.Array):
            _hostreads.check_ready(leaf)  # named, never waited for
        if host_kind(leaf, how):
            out[i] = HOST_PREFIX + host_digest(leaf).hex()
        else:
            kernel.append(i)
    for i, d in zip(kernel, kernel_digests([leaves[i] for i in kernel])):
        out[i] = d
    return every(out)


def digests_with_flags(
    leaves: Sequence[Any], how: str | None = None, constant: Sequence[bool] | None = None
) -> list[tuple[str, bool, bool]]:
    """`digests` with, per leaf, whether it holds NaN or Inf and whether it is constant.

    Read in the same pass: for kernel-kind leaves on a device the one program per group
    that computes the lanes (`device_results`); for host-kind leaves (XXH3) and numpy
    leaves numpy (`numpy_flags`). Constant: every raw word of the leaf the same (a
    leaf in several blocks: every block constant). ``constant``: per leaf, whether that
    flag is wanted (numpy skips the pass where not; on a device it is fused anyway).
    """
    how = mode(how)
    out: list[Any] = [None] * len(leaves)
    kernel: list[int] = []
    for i, leaf in enumerate(leaves):
        if host_kind(leaf, how):
            a = leaf if isinstance(leaf, np.ndarray) else None
            if a is None and isinstance(leaf, jax.Array):
                parts = _host_parts(leaf)
                a = parts[0] if len(parts) == 1 else np.asarray(leaf)
            a = np.asarray(leaf) if a is None else a
            flags = numpy_flags(a, constant is None or constant[i])
            out[i] = (HOST_PREFIX + host_digest(leaf).hex(), *flags)
        else:
            kernel.append(i)
    got = with_flags([leaves[i] for i in kernel], True) if kernel else []
    for i, (d, bad, same) in zip(kernel, got):
        out[i] = (d.hex(), bad, same)
    return every(out)
