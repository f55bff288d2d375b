"""The gather export: each host sends replica 0 of each distinct block it owns, once.

Never a collective: round 1 (`gather_meta`) describes this host's blocks,
round 2 writes them into the notebook's shared-memory file (`gather_write`),
streams them over TCP (`gather_send`), or returns them (`gather_local`).
"""

from __future__ import annotations

import math
import os
import socket
import threading
from typing import Any

import numpy as np

from multihost import _names
from multihost.engine.portable import portable

__all__ = [
    'GatherError',
    'gather_local',
    'gather_meta',
    'gather_send',
    'gather_write',
    'lookup',
    'meta_digest',
]


class GatherError(ValueError):
    """A value cannot be gathered into the notebook (the message says why and what to do)."""


def lookup(namespace: dict[str, Any], name: str, *, cuts: bool = False) -> Any:
    """The engine value ``name`` names: ``x``, ``state.params.embed``, ``state.params['embed']``,
    ``state.opt_state[0]`` (`multihost._names.resolve`: parsed, never evaluated).

    With ``cuts``, returns ``(value, cut)``: a trailing array cut (``x[::4, :128]``) is
    returned as a tuple of ints and slices (None without one) rather than refused.

    Raises:
        GatherError: the name does not parse or a step fails (which one, what was there).
    """
    try:
        value, cut = _names.resolve(namespace, name, cuts=cuts)
    except _names.BadName as exc:
        raise GatherError(str(exc)) from None
    return (value, cut) if cuts else value


# A selection on the hosts (``%mh_allgather x[::4, :128]``): per axis of a
# global array, ('int', i) or ('slice', start, stop, step) with step > 0.
Selection = tuple[tuple[Any, ...], ...]


def _selection(name: str, index: tuple[Any, ...], shape: tuple[int, ...]) -> Selection:
    """Normalizes ``index`` (ints and slices only) against ``shape``."""
    where = name + _names.format_index(index)
    if len(index) > len(shape):
        raise GatherError(f'{where}: {len(index)} indices for an array of rank {len(shape)}.')
    out: list[tuple[str, int] | tuple[str, int, int, int]] = []
    for axis, n in enumerate(shape):
        i = index[axis] if axis < len(index) else slice(None)
        if isinstance(i, slice):
            if i.step is not None and i.step <= 0:
                raise GatherError(
                    f'{where}: a global array is sliced on the hosts with '
                    'positive steps only; reverse the result in the notebook.'
                )
            out.append(('slice', *i.indices(n)))
        elif isinstance(i, int | np.integer) and not isinstance(i, bool):
            j = int(i) + n if i < 0 else int(i)
            if not 0 <= j < n:
                raise GatherError(
                    f'{where}: index {int(i)} is out of range for axis {axis} (size {n}).'
                )
            out.append(('int', j))
        else:
            raise GatherError(f'{name}: index {i!r} is not an int or a slice.')
    return tuple(out)


def _gather_target(
    namespace: dict[str, Any], name: str, index: Any = None
) -> tuple[Any, Selection | None]:
    """The value to gather and, for a global array sliced on the hosts, its selection.

    A host-local value is sliced here with numpy (a view); a global array is
    not sliced at all: each host takes the selected part of the blocks it
    sends (`_global_blocks`), so no device computation and no collective runs.
    """
    import jax

    value, cut = lookup(namespace, name, cuts=True)
    if cut is not None and index is None:  # the name ended with it (x[3] on an array)
        head, steps = _names.parse(name, cuts=True)
        name, index = _names.format_steps(head, steps[:-1]), cut
    elif cut is not None:
        raise GatherError(
            f'{name}: cut twice ({_names.format_index(cut)} and {_names.format_index(index)}).'
        )
    if index is None:
        return value, None
    index = tuple(index) if isinstance(index, tuple | list) else (index,)
    if not isinstance(value, jax.Array | np.ndarray | np.generic):
        raise GatherError(
            f'{name}{_names.format_index(index)} slices an array, but {name} is a '
            f'{type(value).__name__}; slice one array (a variable or an attribute).'
        )
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return value, _selection(name, index, tuple(value.shape))
    try:
        if isinstance(value, jax.Array) and _key_impl(value) is not None:
            return value[index], None  # a host-local key array: cut here, still keys
        return np.asarray(value)[index], None
    except (IndexError, TypeError, ValueError) as exc:
        raise GatherError(f'{name}{_names.format_index(index)}: {exc}') from None


def _key_impl(x: Any) -> tuple[str, tuple[int, ...]] | None:
    """``(impl name, key data's trailing shape)`` of a PRNG key array, else None."""
    import jax

    dtype = getattr(x, 'dtype', None)
    if not isinstance(x, jax.Array) or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    data = jax.eval_shape(jax.random.key_data, x)  # abstract: nothing runs
    return str(jax.random.key_impl(x)), tuple(data.shape[x.ndim :])


def _key_selection(x: Any, sel: Selection | None) -> Selection | None:
    """A selection of a key array, extended over its key data's trailing axes (kept whole)."""
    key = _key_impl(x)
    if sel is None or key is None:
        return sel
    return sel + tuple(('slice', 0, n, 1) for n in key[1])


def _as_data(x: Any) -> Any:
    """A PRNG key array's key data (`jax.random.key_data`); anything else as it is."""
    import jax

    dtype = getattr(x, 'dtype', None)
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    return x


def _global_blocks(x: Any, sel: Selection | None) -> list[tuple[tuple[tuple[int, int], ...], Any]]:
    """This host's replica-0 blocks of global array ``x``: (place in the result, data).

    With a selection, the place is in the selected result's coordinates and
    the data is the selected part of the block (a numpy view); blocks that
    hold none of the selection are left out. A PRNG key array's blocks are
    its key data (each shard's `jax.random.key_data`, on its own device:
    nothing global runs), one or more axes longer.
    """
    key = _key_impl(x)
    extra = [(0, n) for n in key[1]] if key else []
    sel = _key_selection(x, sel)
    out = []
    for s in x.addressable_shards:
        if s.replica_id != 0:
            continue
        # a key array's shards may report the index of its key data (longer): cut to its rank
        bounds = [
            (sl.start or 0, x.shape[d] if sl.stop is None else sl.stop)
            for d, sl in enumerate(s.index[: x.ndim])
        ] + extra
        if sel is None:
            out.append((tuple(bounds), s))
            continue
        place, local = [], []
        for (a, b), axis in zip(bounds, sel):
            if axis[0] == 'int':
                if not a <= axis[1] < b:
                    break
                local.append(axis[1] - a)
                continue
            start, stop, step = axis[1:]
            count = len(range(start, stop, step))
            lo = max(0, -(-(a - start) // step))  # first selected position >= a
            hi = min(count, -(-(b - start) // step))
            if lo >= hi:
                break
            first = start + lo * step - a
            local.append(slice(first, first + (hi - lo - 1) * step + 1, step))
            place.append((lo, hi))
        else:
            out.append((tuple(place), (s, tuple(local))))
    return out


def _read(x: Any) -> np.ndarray:
    """``np.asarray(x)``: reading host copies (`_checks._hostreads`: a tool of a held job,
    or while a launch is in flight) a shard not ready is named, never waited for."""
    from multihost._checks import _hostreads

    if _hostreads.active():
        return _hostreads.copy(x)
    return np.asarray(x)


def _block_array(block: Any) -> np.ndarray:
    """The numpy data of a `_global_blocks` entry."""
    if isinstance(block, tuple):
        shard, local = block
        return _read(_as_data(shard.data))[local]
    return _read(_as_data(block.data))


def _selected_shape(sel: Selection) -> tuple[int, ...]:
    return tuple(len(range(*axis[1:])) for axis in sel if axis[0] == 'slice')


def _leaf_meta(path: str, x: Any, sel: Selection | None = None) -> dict[str, Any]:
    """Shape/dtype and this host's replica-0 blocks of one leaf."""
    import jax

    key = _key_impl(x)
    extra: dict[str, Any] = {} if key is None else {'key_impl': key[0]}
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if key is not None:
            full = tuple(x.shape) + key[1]
            shape = full if sel is None else _selected_shape(_key_selection(x, sel) or ())
        else:
            shape = tuple(x.shape) if sel is None else _selected_shape(sel)
        blocks = [place for place, _ in _global_blocks(x, sel)]
        data = x if key is None else jax.eval_shape(jax.random.key_data, x)
        dtype = str(np.dtype(data.dtype))
        return dict(kind='global', shape=shape, dtype=dtype, blocks=blocks, **extra)
    arr = _as_data(x)
    try:
        a = _read(arr)
    except Exception as exc:
        if type(exc).__name__ == 'NotReadyError':  # `_hostreads`: its words say it all
            raise GatherError(str(exc)) from None
        raise GatherError(
            f'leaf {path} of type {type(x).__name__} cannot be converted to a numpy array ({exc}).'
        ) from None
    if a.dtype == object:
        raise GatherError(
            f'leaf {path} of type {type(x).__name__} is not numeric data; '
            'only arrays, scalars and pytrees of them can be gathered.'
        )
    return dict(kind='local', shape=tuple(a.shape), dtype=str(a.dtype), **extra)


def _flatten(value: Any) -> tuple[list[Any], Any, list[str]]:
    import jax

    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(value)
    paths = [jax.tree_util.keystr(p) or '<root>' for p, _ in paths_leaves]
    leaves = [leaf for _, leaf in paths_leaves]
    skeleton = portable(jax.tree.unflatten(treedef, list(range(len(leaves)))))
    return leaves, skeleton, paths


def _host_meta(value: Any, sel: Selection | None) -> dict[str, Any]:
    """This host's description of a value: structure, per-leaf shape/dtype and its blocks."""
    import jax

    leaves, skeleton, paths = _flatten(value)
    return dict(
        process=jax.process_index(),
        process_count=jax.process_count(),
        skeleton=skeleton,
        paths=paths,
        leaves=[_leaf_meta(p, x, sel) for p, x in zip(paths, leaves)],
    )


def meta_digest(meta: dict[str, Any]) -> str:
    """A digest of a `_host_meta` (structure, shapes, dtypes, blocks): equal means same plan."""
    import hashlib

    import jax

    text = repr((meta['paths'], meta['leaves'], meta['process_count']))
    text += str(jax.tree.structure(meta['skeleton']))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def gather_meta(
    namespace: dict[str, Any], name: str, inline_limit: int = 0, *, index: Any = None
) -> dict[str, Any]:
    """Round 1 of a gather: the structure and this host's blocks.

    When this host's blocks total at most ``inline_limit`` bytes, their data
    rides along (``'data'``: per leaf a list of flat arrays) so a small gather
    takes one round trip. ``index`` (ints and slices) selects part of an
    array on the hosts: only that part is described and sent. ``'digest'``
    is `meta_digest` of the rest, so a later `gather_write` can be sent
    without this round when nothing changed.
    """
    value, sel = _gather_target(namespace, name, index)
    out = _host_meta(value, sel)
    out['digest'] = meta_digest(out)
    if inline_limit > 0:
        total = 0
        for meta in out['leaves']:
            if meta['kind'] == 'global':
                total += sum(math.prod(b - a for a, b in idx) for idx in meta['blocks']) * (
                    np.dtype(meta['dtype']).itemsize
                )
            else:
                total += math.prod(meta['shape']) * np.dtype(meta['dtype']).itemsize
        if total <= inline_limit:
            leaves, _, _ = _flatten(value)
            out['data'] = _export_blocks(leaves, sel)
    return out


def _leaf_blocks(x: Any, sel: Selection | None) -> list[tuple[Any, np.ndarray]]:
    """The blocks of one leaf this host sends, in `_leaf_meta` order: (place, data).

    A global array: replica 0 of each block this host owns, ``place`` its
    ``((start, stop), ...)`` in the result. Anything else: the host's whole
    value, ``place`` None (it becomes this process's row).
    """
    import jax

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return [(idx, _block_array(b)) for idx, b in _global_blocks(x, sel)]
    return [(None, _read(_as_data(x)))]


def _export_blocks(leaves: list[Any], sel: Selection | None = None) -> list[list[np.ndarray]]:
    # 1-D contiguous buffers travel as zero-copy zmq frames; the notebook reshapes.
    return [[np.ascontiguousarray(b).reshape(-1) for _, b in _leaf_blocks(x, sel)] for x in leaves]


def _stale(value: Any, sel: Selection | None, expect: dict[int, str] | None) -> dict | None:
    """`gather_meta`'s answer when ``expect`` (a repeated gather's plan) no longer fits here."""
    import jax

    if expect is None:
        return None
    meta = _host_meta(value, sel)
    meta['digest'] = meta_digest(meta)
    return None if expect.get(jax.process_index()) == meta['digest'] else meta


# One write into a gather file: (`_byte_span`, leaf offset, leaf shape, dtype, place, data).
_Write = tuple[tuple[int, int], int, tuple[int, ...], np.dtype, tuple[slice, ...], np.ndarray]


def _writes(
    value: Any, sel: Selection | None, layout: list[tuple[int, tuple[int, ...], str]]
) -> list[_Write]:
    """This host's writes into a gather file (`_Write`), empty blocks left out."""
    import jax

    leaves, _, _ = _flatten(value)
    pid = jax.process_index()
    out: list[_Write] = []
    for x, (offset, shape, dtype) in zip(leaves, layout):
        dt = np.dtype(dtype)
        for idx, data in _leaf_blocks(x, sel):
            place: tuple[slice, ...]
            if idx is None:  # a host-local value: this process's row
                place, data = (slice(pid, pid + 1),), data[None]
            else:
                place = tuple(slice(a, b) for a, b in idx)
            span = _byte_span(offset, tuple(shape), dt, place)
            if span is not None:
                out.append((span, offset, tuple(shape), dt, place, data))
    return out


_PWRITE_CHUNK = 16 << 20


def gather_write(
    namespace: dict[str, Any],
    name: str,
    path: str,
    layout: list[tuple[int, tuple[int, ...], str]],
    *,
    index: Any = None,
    fresh: bool = False,
    expect: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Round 2 of a shared-memory gather: write this host's blocks into the notebook's file.

    Args:
        namespace: the engine's user namespace.
        name: the variable to gather.
        path: the shared-memory file the notebook created (same machine).
        layout: per leaf ``(byte offset, result shape, dtype)`` in the file.
        index: the selection given to `gather_meta`.
        fresh: the file was just created. Its pages are then written with
            ``pwrite`` where a block's place is one span: the kernel fills
            new pages without zeroing them first and without a page fault
            per page (a mapping is used for the rest).
        expect: process index -> `meta_digest` the notebook planned with,
            when it skipped `gather_meta` (a repeated gather). If this host's
            value no longer matches, nothing is written.

    Returns:
        ``{'written': bytes}``, or ``{'meta': ...}`` (`gather_meta`'s answer)
        when ``expect`` no longer matches this host's value.
    """

    value, sel = _gather_target(namespace, name, index)
    stale = _stale(value, sel, expect)
    if stale is not None:
        return {'meta': stale}
    writes = _writes(value, sel, layout)
    if not writes:
        return {'written': 0}
    lo, hi = min(w[0][0] for w in writes), max(w[0][1] for w in writes)
    written, rest = 0, writes
    if fresh:
        rest = []  # the writes pwrite cannot do
        fd = os.open(path, os.O_WRONLY)
        try:
            for w in writes:
                (a, b), dt, data = w[0], w[3], w[5]
                if b - a != data.size * dt.itemsize:  # its place is not one span
                    rest.append(w)
                    continue
                view = np.ascontiguousarray(data, dtype=dt).reshape(-1).view(np.uint8).data
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done : done + _PWRITE_CHUNK], a + done)
                written += len(view)
        finally:
            os.close(fd)
        if not rest:
            # Map this host's part in the background, so the next gather into
            # this file (the debugging loop) only copies.
            threading.Thread(target=_premap, args=(path, lo, hi), daemon=True).start()
            return {'written': written}
    # Only the bytes this host writes are mapped (each host its own part).
    start, mm = _mapping(path, lo, hi)
    try:
        for _, offset, shape, dt, place, data in rest:
            strides = [dt.itemsize * math.prod(shape[i + 1 :]) for i in range(len(shape))]
            first = sum(s.start * st for s, st in zip(place, strides))
            dims = [s.stop - s.start for s in place] + list(shape[len(place) :])
            out = np.ndarray(
                dims, dtype=dt, buffer=mm, offset=offset + first - start, strides=strides
            )
            out[...] = data.reshape(dims)
            written += data.nbytes
    finally:
        del mm
    return {'written': written}


def _byte_span(
    offset: int, shape: tuple[int, ...], dt: np.dtype, place: tuple[slice, ...]
) -> tuple[int, int] | None:
    """The bytes from ``place``'s first element to its last, in a leaf at ``offset``."""
    starts = [s.start for s in place] + [0] * (len(shape) - len(place))
    stops = [s.stop for s in place] + list(shape[len(place) :])
    if any(b <= a for a, b in zip(starts, stops)):
        return None
    first = np.ravel_multi_index(starts, shape) if shape else 0
    last = np.ravel_multi_index([b - 1 for b in stops], shape) if shape else 0
    return offset + int(first) * dt.itemsize, offset + (int(last) + 1) * dt.itemsize


def gather_send(
    namespace: dict[str, Any],
    name: str,
    address: tuple[str, int],
    token: bytes,
    *,
    index: Any = None,
    expect: dict[int, str] | None = None,
    connect_timeout: float = 5.0,
    send_timeout: float = 600.0,
) -> dict[str, Any]:
    """Round 2 of a gather over the network: stream this host's blocks to the notebook.

    One TCP connection to the notebook's ``address``: ``token`` (16 bytes,
    given through the authenticated ipyparallel channel) and this process
    index (4 bytes, big-endian), then the raw bytes of every block in
    `gather_meta` order. Nothing else travels on it (no pickles): the
    notebook already knows every block's place and reads each straight into
    it. Blocks leave from the arrays' own memory (no copy here).

    Returns:
        ``{'sent': bytes}``; ``{'meta': ...}`` when ``expect`` (see
        `gather_write`) no longer matches this host's value, nothing sent;
        ``{'unreachable': why}`` when the notebook's address cannot be
        reached from here (the notebook then gathers through ipyparallel).
    """
    import jax

    value, sel = _gather_target(namespace, name, index)
    stale = _stale(value, sel, expect)
    if stale is not None:
        return {'meta': stale}
    leaves, _, _ = _flatten(value)
    blocks = [b for leaf in _export_blocks(leaves, sel) for b in leaf]  # in gather_meta order
    host, port = address
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except OSError as exc:
        return {'unreachable': f'{host}:{port}: {exc.strerror or exc}'}
    sent = 0
    with sock:
        sock.settimeout(send_timeout)
        sock.sendall(bytes(token) + jax.process_index().to_bytes(4, 'big'))
        for block in blocks:
            if block.nbytes:
                sock.sendall(block.view(np.uint8).data)
                sent += block.nbytes
    return {'sent': sent}


# The notebook reuses its shared-memory buffers across gathers (see
# mhnotebook/_transfer/_gather.py), so keeping this host's part of them mapped spares
# every later gather the cost of mapping it again.
_MAPPINGS: dict[str, tuple[int, int, np.ndarray]] = {}  # path -> (start, end, bytes)
_MAX_MAPPINGS = 8
_MAPPINGS_LOCK = threading.Lock()  # gather_write and its background mapping


def _premap(path: str, start: int, end: int) -> None:
    try:
        _mapping(path, start, end)
    except OSError:  # the notebook dropped the file meanwhile
        pass


def _mapping(path: str, start: int, end: int) -> tuple[int, np.ndarray]:
    """(where it starts, the mapped bytes) of a mapping of ``path`` covering [start, end)."""
    with _MAPPINGS_LOCK:
        return _mapping_locked(path, start, end)


def _mapping_locked(path: str, start: int, end: int) -> tuple[int, np.ndarray]:
    import mmap

    for old in [p for p in _MAPPINGS if p != path and not os.path.exists(p)]:
        del _MAPPINGS[old]  # the notebook unlinked it: let the memory go
    cached = _MAPPINGS.pop(path, None)
    if cached is None or not (cached[0] <= start and end <= cached[1]):
        lo = start - start % mmap.ALLOCATIONGRANULARITY
        fd = os.open(path, os.O_RDWR)
        try:
            # MAP_POPULATE maps every page in one call rather than one fault per page.
            flags = mmap.MAP_SHARED | getattr(mmap, 'MAP_POPULATE', 0)
            mm = mmap.mmap(fd, end - lo, flags=flags, offset=lo)
        finally:
            os.close(fd)
        cached = (lo, end, np.frombuffer(mm, dtype=np.uint8))
    _MAPPINGS[path] = cached  # most recently used last
    while len(_MAPPINGS) > _MAX_MAPPINGS:
        del _MAPPINGS[next(iter(_MAPPINGS))]
    return cached[0], cached[2]


def gather_local(namespace: dict[str, Any], name: str, *, index: Any = None) -> dict[str, Any]:
    """One-round gather for remote engines: the structure plus this host's blocks as arrays."""
    import jax

    value, sel = _gather_target(namespace, name, index)
    leaves, skeleton, paths = _flatten(value)
    metas = [_leaf_meta(p, x, sel) for p, x in zip(paths, leaves)]
    return dict(
        process=jax.process_index(),
        process_count=jax.process_count(),
        skeleton=skeleton,
        paths=paths,
        leaves=metas,
        data=_export_blocks(leaves, sel),
    )
