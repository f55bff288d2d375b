"""Where the NaNs and Infs are: per shard, on every host, without moving the data.

`nonfinite` screens every addressable shard where it lives (one ``sum(x * 0)`` per shard on
device, all dispatched before any is read; numpy values with numpy), looks closer only at the
shards that fail, and shares their counts in one `_sequence.exchange`: every host gets the same
`NonfiniteReport` (plain, picklable data: `multihost._models._nonfinite`). See
docs/ARCHITECTURE.md, "The census and non-finite values".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from multihost._checks import _hostreads
from multihost._checks._layout import describe_layout
from multihost._checks._paths import leaf_paths
from multihost._exchange import _kv, _sequence
from multihost._models._layout import Index, Layout
from multihost._models._nonfinite import (  # noqa: F401  (the models live there; re-exported)
    MAX_RECORDS,
    MAX_TEXT_SHARDS,
    NonfiniteLeaf,
    NonfiniteReport,
    NonfiniteShard,
)

#: Offending shards described over all hosts: with more than 64 hosts, each
#: describes ``MAX_TOTAL_RECORDS // num_processes`` (at least one), so what a
#: host reads stays bounded at any host count.
MAX_TOTAL_RECORDS = 4096
#: Offending host-local values per host whose layout travels (for a picture),
#: and over all hosts.
MAX_LOCAL_LAYOUTS = 8
MAX_TOTAL_LOCAL_LAYOUTS = 64
#: Offending leaves whose layout a report keeps.
MAX_LAYOUTS = 16

_CHUNK = 1 << 30  # elements per detail pass: counts and positions fit int32
_SMALL_SHARD = 1 << 20  # elements: smaller offending shards get the full detail pass at once
_ROW_WIDTHS = (1024, 2048, 4096, 512, 256)  # row widths tried for the row pass
_PACK = 1 << 16  # elements: device shards up to this size are screened together, per device
_PACK_LEAVES = 4096  # shards per packed screen program
_NUMPY_CHUNK = 1 << 20  # elements per numpy pass (bounds temporaries)
_MAX_PATH = 300  # characters of a leaf path that travel


@jax.jit
def _screen(x: jax.Array) -> jax.Array:
    """``0`` when every element of ``x`` is finite, NaN otherwise (one pass, no compare)."""
    return jnp.sum(x * jnp.zeros((), x.dtype))


@jax.jit
def _screen_many(xs: tuple[jax.Array, ...]) -> jax.Array:
    """`_screen` of each of ``xs`` (on one device), as float32: one program per tree of shapes.

    The screen is exactly 0 or NaN, so the cast to float32 (and real + imaginary
    part for complex values) keeps the verdict.
    """
    out = []
    for x in xs:
        s = jnp.sum(x * jnp.zeros((), x.dtype))
        if jnp.iscomplexobj(s):
            s = jnp.real(s) + jnp.imag(s)
        out.append(s.astype(jnp.float32))
    return jnp.stack(out)


def _dispatch_screens(pieces: list[_Piece]) -> None:
    """Every device shard's screen, dispatched: small shards packed per device.

    Shards of at most `_PACK` elements on one device share one `_screen_many`
    program (compiled once per tree of shapes, not once per shape); larger
    ones get their own `_screen` (one program per shape and dtype).
    """
    groups: dict[int, list[_Piece]] = {}
    for p in pieces:
        if isinstance(p.data, np.ndarray) or not p.data.size:
            continue
        if p.data.size <= _PACK:
            groups.setdefault(p.device if p.device is not None else -1, []).append(p)
        else:
            p.screen = _screen(p.data)
    for group in groups.values():
        for lo in range(0, len(group), _PACK_LEAVES):
            part = group[lo : lo + _PACK_LEAVES]
            screens = _screen_many(tuple(p.data for p in part))
            for k, p in enumerate(part):
                p.screen = (screens, k)


def _details_impl(x: jax.Array, lo: int, hi: int) -> jax.Array:
    """NaN count, Inf count and first non-finite position of ``x.reshape(-1)[lo:hi]``."""
    flat = x.reshape(-1)[lo:hi]
    nan = jnp.sum(jnp.isnan(flat), dtype=jnp.int32)
    inf = jnp.sum(jnp.isinf(flat), dtype=jnp.int32)
    first = jnp.argmax(~jnp.isfinite(flat)).astype(jnp.int32)
    return jnp.stack([nan, inf, first])


_details = jax.jit(_details_impl, static_argnums=(1, 2))


def _row_screen_impl(x: jax.Array, width: int) -> jax.Array:
    """Per row of ``x`` seen as ``(-1, width)``: 0, or NaN where the row holds a non-finite."""
    return jnp.sum(x.reshape(-1, width) * jnp.zeros((), x.dtype), axis=1)


_row_screen = jax.jit(_row_screen_impl, static_argnums=1)


def _row_details_impl(x: jax.Array, width: int, rows: jax.Array) -> jax.Array:
    """NaN count, Inf count and first non-finite column of the given rows (ascending, -1: pad)."""
    valid = (rows >= 0)[:, None]
    sub = x.reshape(-1, width)[jnp.maximum(rows, 0)]
    nan = jnp.sum(jnp.isnan(sub) & valid, dtype=jnp.int32)
    inf = jnp.sum(jnp.isinf(sub) & valid, dtype=jnp.int32)
    first = jnp.argmax(~jnp.isfinite(sub[0])).astype(jnp.int32)
    return jnp.stack([nan, inf, first])


_row_details = jax.jit(_row_details_impl, static_argnums=1)


def _row_width(size: int) -> int | None:
    """A row width dividing ``size`` for the row pass (None: the shard is small or odd-sized)."""
    if size <= _SMALL_SHARD:
        return None
    return next((w for w in _ROW_WIDTHS if size % w == 0), None)


def _bucket(n: int) -> int:
    """``n`` rounded up to a power of two (at least 8): few shapes, few compilations."""
    return max(8, 1 << (n - 1).bit_length())


def _chunks(size: int) -> list[tuple[int, int]]:
    return [(lo, min(size, lo + _CHUNK)) for lo in range(0, max(size, 1), _CHUNK)] if size else []


def _combine(parts: list[tuple[int, ...]]) -> tuple[int, int, int | None]:
    """(lo, nan, inf, first) per chunk -> (nan, inf, first flat position or None)."""
    nan = inf = 0
    first = None
    for lo, n, i, f in parts:
        if first is None and n + i:
            first = lo + f
        nan, inf = nan + n, inf + i
    return nan, inf, first


def _numpy_stats(a: np.ndarray) -> tuple[int, int, int | None]:
    """(NaN count, Inf count, first non-finite flat position) of a host value, in chunks."""
    flat = a.reshape(-1)
    nan = inf = 0
    first = None
    for lo in range(0, flat.size, _NUMPY_CHUNK):
        chunk = flat[lo : lo + _NUMPY_CHUNK]
        with np.errstate(invalid='ignore'):  # ml_dtypes before 0.7 warns on a NaN's payload
            bad = ~np.isfinite(chunk)
            if not bad.any():
                continue
            nan += int(np.count_nonzero(np.isnan(chunk)))
            inf += int(np.count_nonzero(np.isinf(chunk)))
        if first is None:
            first = lo + int(np.argmax(bad))
    return nan, inf, first


# -- local classification -------------------------------------------------------------


@dataclasses.dataclass
class _Piece:
    """One unit checked on this host: a shard of a jax array, or a whole numpy value."""

    leaf: int
    data: Any  # a single-device jax.Array, or a numpy array
    device: int | None
    local_device: int | None
    index: Index
    replica: int
    screen: Any = None


@dataclasses.dataclass
class _Leaf:
    path: str
    host_local: bool
    shape: tuple[int, ...]
    dtype: str
    value: Any


def _is_float(dtype: Any) -> bool:
    try:
        return bool(jax.dtypes.issubdtype(dtype, np.inexact))
    except TypeError:
        return False


def _index(slices: tuple[slice, ...], shape: tuple[int, ...]) -> Index:
    return tuple((sl.start or 0, n if sl.stop is None else sl.stop) for sl, n in zip(slices, shape))


def _spans_hosts(x: jax.Array, cache: dict[Any, bool]) -> bool:
    """Whether a non-fully-addressable array's devices belong to more than one process."""
    key = id(x.sharding)
    if key not in cache:
        devices: Any = x.sharding.device_set
        cache[key] = len({d.process_index for d in devices}) > 1
    return cache[key]


def _classify(
    in_tree: Any, multi: bool
) -> tuple[list[_Leaf], list[_Piece], list[tuple[str, Any, str, str]], int]:
    """This host's float leaves, the pieces to check, the global leaves' signature, skipped."""
    flat = jax.tree_util.tree_flatten_with_path(in_tree)[0]
    paths = leaf_paths(flat)
    local_ids = {d.id: i for i, d in enumerate(jax.local_devices())}
    leaves: list[_Leaf] = []
    pieces: list[_Piece] = []
    signature: list[tuple[str, Any, str, str]] = []
    skipped = 0
    spans: dict[Any, bool] = {}
    for path, (_, x) in zip(paths, flat):
        if isinstance(x, jax.Array):
            if isinstance(x, jax.core.Tracer):
                raise TypeError(
                    f'leaf {path or "<value>"} is a tracer: nonfinite looks at concrete '
                    'arrays; call it outside jit (or use jax.debug_nans inside)'
                )
            if not _is_float(x.dtype):
                skipped += 1
                continue
            shape = tuple(x.shape)
            is_global = multi and not x.is_fully_addressable and _spans_hosts(x, spans)
            if is_global:
                signature.append((path, shape, str(x.dtype), repr(x.sharding)))
            i = len(leaves)
            leaves.append(_Leaf(path, multi and not is_global, shape, str(x.dtype), x))
            host = _hostreads.offloaded(x)  # in host memory: read there, as numpy
            for s in x.addressable_shards:
                pieces.append(
                    _Piece(
                        leaf=i,
                        data=np.asarray(s.data) if host else s.data,
                        device=int(s.device.id),
                        local_device=local_ids.get(s.device.id),
                        index=_index(s.index, shape),
                        replica=int(s.replica_id),
                    )
                )
            continue
        try:
            a = np.asarray(x)
        except Exception:  # not array-like: nothing to check
            skipped += 1
            continue
        if a.dtype.hasobject or not _is_float(a.dtype):
            skipped += 1
            continue
        i = len(leaves)
        leaves.append(_Leaf(path, multi, tuple(a.shape), str(a.dtype), a))
        pieces.append(
            _Piece(
                leaf=i,
                data=a,
                device=None,
                local_device=None,
                index=tuple((0, n) for n in a.shape),
                replica=0,
            )
        )
    return leaves, pieces, signature, skipped


def _check(pieces: list[_Piece]) -> list[tuple[_Piece, int, int, int | None]]:
    """(piece, NaN count, Inf count, first flat position) of every offending piece.

    Device shards: the screen first (every shard dispatched, then read, so the
    devices work at the same time). A large shard that fails it is screened
    again per row (rows of `_ROW_WIDTHS` elements: one more fast pass, one
    number per row to this host) and, when few rows hold non-finite values,
    only those rows are counted; otherwise (or for small or odd-sized shards)
    the whole shard is, in chunks of `_CHUNK` elements.
    """
    if _hostreads.active():
        return _check_copies(pieces)
    _dispatch_screens(pieces)
    out: list[tuple[_Piece, int, int, int | None]] = []
    suspects = []
    read: dict[int, np.ndarray] = {}  # id of a packed screen -> its values on the host
    for p in pieces:
        if isinstance(p.data, np.ndarray):
            nan, inf, first = _numpy_stats(p.data)
            if nan + inf:
                out.append((p, nan, inf, first))
        elif p.screen is not None and not _screen_ok(p.screen, read):
            suspects.append(p)
        p.screen = None
    # Rows of the large suspects (dispatched together), then which rows to count.
    widths = {id(p): _row_width(int(p.data.size)) for p in suspects}
    row_flags = {id(p): _row_screen(p.data, w) for p in suspects if (w := widths[id(p)])}
    pending: list[tuple[_Piece, Any]] = []
    for p in suspects:
        width = widths[id(p)]
        if width is not None:
            bad = np.flatnonzero(~np.isfinite(np.asarray(row_flags.pop(id(p)))))
            if 0 < len(bad) <= max(8, p.data.size // width // 8) and len(bad) * width < _CHUNK:
                rows = np.full(_bucket(len(bad)), -1, np.int32)
                rows[: len(bad)] = bad
                pending.append((p, (int(bad[0]) * width, _row_details(p.data, width, rows))))
                continue
        pending.append((p, [(lo, _details(p.data, lo, hi)) for lo, hi in _chunks(p.data.size)]))
    for p, parts in pending:
        stats: tuple[int, int, int | None]
        if isinstance(parts, tuple):  # the row pass: first = first bad row's start + column
            row_start, result = parts
            n_nan, n_inf, col = (int(v) for v in np.asarray(result))
            stats = (n_nan, n_inf, row_start + col if n_nan + n_inf else None)
        else:
            stats = _combine([(lo, *(int(v) for v in np.asarray(r))) for lo, r in parts])
        if stats[0] + stats[1]:
            out.append((p, *stats))
    out.sort(key=lambda t: (t[0].leaf, -1 if t[0].device is None else t[0].device))
    return out


def _check_copies(pieces: list[_Piece]) -> list[tuple[_Piece, int, int, int | None]]:
    """`_check` without device work (`_hostreads`: a launch in flight may hold the device's
    stream): each shard copied to the host when ready (one at a time), counted by numpy; a
    shard not ready raises `_hostreads.NotReadyError`, naming the launch it waits on."""
    out: list[tuple[_Piece, int, int, int | None]] = []
    for p in pieces:
        a = p.data if isinstance(p.data, np.ndarray) else _hostreads.copy(p.data)
        nan, inf, first = _numpy_stats(a)
        del a
        if nan + inf:
            out.append((p, nan, inf, first))
    out.sort(key=lambda t: (t[0].leaf, -1 if t[0].device is None else t[0].device))
    return out


def _screen_ok(screen: Any, read: dict[int, np.ndarray]) -> bool:
    """Whether a shard's screen (its own, or (packed screens, position)) says finite."""
    if isinstance(screen, tuple):
        packed, k = screen
        if id(packed) not in read:
            read[id(packed)] = np.asarray(packed)
        return bool(np.isfinite(read[id(packed)][k]))
    return bool(np.isfinite(np.asarray(screen)))


def _global_first(piece: _Piece, flat: int | None) -> tuple[int, ...] | None:
    if flat is None:
        return None
    shape = tuple(b - a for a, b in piece.index)
    local = np.unravel_index(flat, shape) if shape else ()
    return tuple(int(a) + int(i) for (a, _), i in zip(piece.index, local))


# -- the exchange ---------------------------------------------------------------------


def _layout_json(layout: Layout) -> dict[str, Any]:
    return {
        'shape': list(layout.shape),
        'dtype': layout.dtype,
        'itemsize': layout.itemsize,
        'sharding': layout.sharding,
        'spec': layout.spec,
        'mesh_axes': [list(a) for a in layout.mesh_axes],
        'platform': layout.platform,
        'shards': [
            [[list(p) for p in s.index], s.device_id, s.process_index] for s in layout.shards
        ],
    }


def _layout_from(data: Mapping[str, Any], num_processes: int) -> Layout:
    return Layout.from_placements(
        tuple(data['shape']),
        data['dtype'],
        [([tuple(p) for p in idx], d, p) for idx, d, p in data['shards']],
        itemsize=data['itemsize'],
        sharding=data['sharding'],
        spec=data['spec'],
        mesh_axes=tuple(tuple(a) for a in data['mesh_axes']),
        platform=data['platform'],
        num_processes=num_processes,
    )


def records_per_host(num_processes: int) -> int:
    """How many offending shards each host describes (`MAX_RECORDS`, fewer beyond 64 hosts)."""
    return max(1, min(MAX_RECORDS, MAX_TOTAL_RECORDS // max(num_processes, 1)))


def _payload(
    leaves: list[_Leaf],
    pieces: list[_Piece],
    found: list[tuple[_Piece, int, int, int | None]],
    skipped: int,
    num_processes: int,
) -> dict[str, Any]:
    """What this host tells the others: counts, offending records, host-local layouts.

    A clean host sends only its counts (``{"c": [...]}``, a few dozen bytes).
    """
    checked = [len(leaves), len(pieces), sum(int(np.size(p.data)) for p in pieces), skipped]
    if not found:
        return {'c': checked}
    budget = records_per_host(num_processes)
    records = []
    for p, nan, inf, first in found[:budget]:
        records.append(
            [
                p.leaf,
                p.device,
                p.local_device,
                p.replica,
                [list(ab) for ab in p.index],
                nan,
                inf,
                None if first is None else list(_global_first(p, first) or ()),
            ]
        )
    shown = sorted({p.leaf for p, *_ in found[:budget]})
    n_layouts = max(1, min(MAX_LOCAL_LAYOUTS, MAX_TOTAL_LOCAL_LAYOUTS // max(num_processes, 1)))
    layouts = {}
    for i in [i for i in shown if leaves[i].host_local][:n_layouts]:
        layouts[str(i)] = _layout_json(describe_layout(leaves[i].value))
    return {
        'c': checked,
        'leaves': {
            str(i): [
                leaves[i].path[:_MAX_PATH],
                leaves[i].host_local,
                list(leaves[i].shape),
                leaves[i].dtype,
            ]
            for i in shown
        },
        'records': records,
        'more': max(0, len(found) - budget),
        'layouts': layouts,
    }


def _assemble(
    payloads: Mapping[int, Mapping[str, Any]],
    leaves: list[_Leaf],
    num_processes: int,
    max_records: int,
) -> NonfiniteReport:
    """Every host's payload into the one report (the same on every host)."""
    checked = {'leaves': 0, 'shards': 0, 'elements': 0, 'skipped': 0}
    rows: list[tuple[tuple[int, int, int], NonfiniteShard, list[Any]]] = []
    local_layouts: dict[tuple[str, int], Layout] = {}
    for proc in sorted(payloads):
        data = payloads[proc]
        for what, n in zip(('leaves', 'shards', 'elements', 'skipped'), data['c']):
            per_host = what in ('leaves', 'skipped')  # a tree's leaves: the most of any host
            checked[what] = max(checked[what], int(n)) if per_host else checked[what] + int(n)
        info = data.get('leaves', {})  # leaf number -> [path, host_local, shape, dtype]
        for leaf, device, local, replica, index, nan, inf, first in data.get('records', ()):
            path, host_local, _, _ = info[str(leaf)]
            shard = NonfiniteShard(
                path=path,
                process=proc,
                device=device,
                local_device=local,
                index=tuple((int(a), int(b)) for a, b in index),
                nan=int(nan),
                inf=int(inf),
                first=None if first is None else tuple(int(v) for v in first),
                host_local=bool(host_local),
                replica=int(replica),
            )
            rows.append(
                ((int(leaf), proc, -1 if device is None else device), shard, info[str(leaf)])
            )
        for i, lay in data.get('layouts', {}).items():
            local_layouts[(info[i][0], proc)] = _layout_from(lay, num_processes)
    rows.sort(key=lambda t: t[0])
    truncated = {p: int(d['more']) for p, d in sorted(payloads.items()) if d.get('more')}

    # One leaf per global path; one per (path, host) for host-local values.
    groups: dict[tuple[str, bool, int], list[NonfiniteShard]] = {}
    meta: dict[tuple[str, bool, int], list[Any]] = {}
    for _, s, info in rows:
        key = (s.path, s.host_local, s.process if s.host_local else -1)
        groups.setdefault(key, []).append(s)
        meta.setdefault(key, info)
    own = {leaf.path: leaf for leaf in leaves if not leaf.host_local}
    out = []
    for n_leaf, (key, group) in enumerate(groups.items()):
        path, host_local, proc = key
        layout = None
        if n_leaf < MAX_LAYOUTS:
            if host_local:
                layout = local_layouts.get((path, proc))
            elif path in own:  # a global array: every host describes it alike
                layout = describe_layout(own[path].value)
        firsts = [s.first for s in group if s.first is not None]
        out.append(
            NonfiniteLeaf(
                path=path,
                host_local=host_local,
                processes=tuple(sorted({s.process for s in group})),
                shape=tuple(int(n) for n in meta[key][2]),
                dtype=str(meta[key][3]),
                nan=sum(s.nan for s in group),
                inf=sum(s.inf for s in group),
                shards=len(group),
                first=min(firsts) if firsts else None,
                layout=layout,
            )
        )
    return NonfiniteReport(
        shards=tuple(s for _, s, _ in rows),
        leaves=tuple(out),
        checked=checked,
        num_processes=num_processes,
        truncated=truncated,
        max_records=max_records,
    )


# -- the collective -------------------------------------------------------------------


def nonfinite(in_tree: Any, *, timeout: float | None = None) -> NonfiniteReport:
    """Finds every shard holding NaN or Inf, on every host, naming its host, device and index.

    A collective: every host calls it with its tree and gets the same
    `NonfiniteReport`. Counts are computed where the data is, per addressable
    shard (one jitted reduction per shard on its own device; numpy values in
    host memory), and only a few numbers per *offending* shard travel (at
    most `MAX_RECORDS` shard records per host, `MAX_TOTAL_RECORDS` over all
    hosts); the data never leaves its
    device. With one process no communication happens. Inside
    `_recorder.reading_host_copies` (a held job's tools; a session's while a launch is in
    flight) nothing runs on a device: each ready shard is copied to the host and counted
    by numpy, one at a time; one not ready raises, naming its launch (`_hostreads`).

    Args:
        in_tree: a pytree. Global `jax.Array` leaves are checked over every
            addressable shard on every host, replicas included; host-local
            values (numpy arrays, Python scalars, fully addressable
            `jax.Array`s) each host checks in its own copy (their shards are
            marked ``host_local``). Leaves that are not floating point are
            skipped and counted (``checked['skipped']``).
        timeout: seconds to wait for every host; default ``MULTIHOST_TIMEOUT``
            or `multihost.DEFAULT_TIMEOUT`.

    Returns:
        A `NonfiniteReport`: ``.ok`` when nothing is NaN or Inf, else
        ``.shards`` (`NonfiniteShard`: ``path``, ``process``, ``device``,
        ``index``, ``nan``, ``inf``, ``first``) and ``.leaves``; ``str()``
        names each offending block with its host and device.

    Raises:
        CollectiveMismatchError: hosts passed different global arrays (path,
            shape, dtype or sharding), or called another collective.
        HostFailedError: some host could not check its tree (e.g. a tracer
            leaf); every host raises it, naming the host and the reason.
        BarrierTimeoutError: some host did not arrive within ``timeout``.
    """
    n = _kv.process_count()
    try:
        leaves, pieces, signature, skipped = _classify(in_tree, n > 1)
        found = _check(pieces)
        payload = _payload(leaves, pieces, found, skipped, n)
    except Exception as exc:
        if n == 1:
            raise
        _sequence.fail_turn('nonfinite', '', f'{type(exc).__name__}: {exc}'[:300], timeout=timeout)
    digest = _sequence.digest(('nonfinite', signature))
    if n == 1:
        _sequence.enter('nonfinite', '', tree_digest=digest, timeout=timeout)
        return _assemble({_kv.process_index(): payload}, leaves, 1, records_per_host(1))
    raw = _sequence.exchange(
        'nonfinite',
        '',
        json.dumps(payload, separators=(',', ':')).encode(),
        tree_digest=digest,
        timeout=timeout,
    )
    payloads = {p: json.loads(b) for p, b in raw.items()}
    return _assemble(payloads, leaves, n, records_per_host(n))
