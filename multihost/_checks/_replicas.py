"""Whether every replica of every block of an array holds the same bytes (a collective).

`check_replicas` digests every replica of every replicated block on the host
that holds it, shares the digests through the coordination service (one
`_sequence.share` round) and returns a `ReplicaReport` naming the blocks,
devices and hosts whose replicas disagree. Replicas that differ are undefined
behaviour that JAX never reports, e.g.
``host_local_array_to_global_array(x, mesh, P())`` with a different ``x`` on
one host.

`ReplicaDigest`, `ReplicaGroup` and `ReplicaReport` are plain, picklable data
(frozen dataclasses, in `multihost._models._replicas`), like the layout model they refer to.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from multihost._checks._layout import _is_jax_array, describe_layout
from multihost._exchange import _kv, _sequence
from multihost._models._layout import Layout, format_index
from multihost._models._replicas import (  # noqa: F401  (the models live there; re-exported)
    MAX_DIGEST_DEVICES,
    MAX_TEXT_DIGESTS,
    ReplicaDigest,
    ReplicaGroup,
    ReplicaReport,
)


#: Digests named per block in the text (most common first); the rest are counted.
def _digest_bytes(data: Any) -> str:
    import jax

    if jax.dtypes.issubdtype(data.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(data)
    a = np.ascontiguousarray(np.asarray(data))
    # Compare bits, not values: replicas must be bitwise copies (NaN == NaN, -0.0 != 0.0).
    return hashlib.blake2b(a.reshape(-1).view(np.uint8).data, digest_size=8).hexdigest()


def _local_digests(arr: Any, layout: Layout) -> dict[int, str]:
    """Device id -> digest, for this host's shards of replicated blocks."""
    counts = layout.replica_counts()
    # By device, not by `shard.index`: a PRNG key array's shards report the
    # index of the underlying key data, one dimension longer than the array.
    index_of = {s.device_id: s.index for s in layout.shards}
    import jax

    from multihost._checks import fingerprint as _kernel

    out = {}
    on_device: list[tuple[int, Any]] = []
    for shard in arr.addressable_shards:
        device_id = int(shard.device.id)
        if counts[index_of[device_id]] > 1:
            data = shard.data
            if jax.dtypes.issubdtype(data.dtype, jax.dtypes.prng_key):
                data = jax.random.key_data(data)
            if _kernel.on_device(data.dtype) and data.size:
                on_device.append((device_id, data))  # fingerprinted where it lives
            else:
                out[device_id] = _digest_bytes(data)
    prints = _kernel.digests([data for _, data in on_device])
    out.update({device_id: fp for (device_id, _), fp in zip(on_device, prints)})
    return out


def _settle_kinds(
    rec: Any, layout: Layout, arr: Any, digests: dict[int, str], timeout: float
) -> dict[int, str]:
    """Blocks whose replicas were hashed by two definitions: their XXH3 ones by the kernel.

    Replicas in host memory on one host and on an accelerator on another (or
    under different ``MULTIHOST_FINGERPRINT`` modes) differ by definition
    whatever their bytes. Every host holds the same ``digests``, so all agree
    on the mixed blocks; the hosts that used XXH3 there recompute with the
    kernel and share (one round, only when some block is mixed).
    """
    from multihost._checks import fingerprint as _kernel

    redo: set[int] = set()
    for block in layout.blocks():
        got = [digests.get(s.device_id, '') for s in block.shards if s.device_id is not None]
        kinds = {_kernel.is_host_digest(d) for d in got if d}
        if len(kinds) == 2:
            redo.update(s.device_id for s in block.shards if s.device_id is not None)
    if not redo:
        return digests
    mine = {}
    for shard in arr.addressable_shards:
        device_id = int(shard.device.id)
        if device_id in redo and _kernel.is_host_digest(digests.get(device_id, '')):
            mine[device_id] = _kernel.kernel_digests([_key_data(shard.data)])[0]
    shared = _sequence.share(rec, 'kernel', json.dumps(mine), timeout=timeout)
    out = dict(digests)
    for text in shared.values():
        out.update({int(d): h for d, h in json.loads(text).items()})
    return out


def _key_data(data: Any) -> Any:
    import jax

    if jax.dtypes.issubdtype(data.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(data)
    return data


def _report(layout: Layout, digests: dict[int, str]) -> ReplicaReport:
    groups = []
    for block in layout.blocks():
        if block.replica_count < 2:
            continue
        replicas = []
        for s in block.shards:
            if s.device_id not in digests:
                raise RuntimeError(
                    f'check_replicas: no digest arrived for device {s.device_id} '
                    f'(process {s.process_index}), which holds {format_index(s.index)}'
                )
            replicas.append(
                ReplicaDigest(
                    device_id=s.device_id,
                    process_index=s.process_index,
                    replica_id=s.replica_id,
                    digest=digests[s.device_id],
                )
            )
        groups.append(ReplicaGroup(index=block.index, replicas=tuple(replicas)))
    return ReplicaReport(layout=layout, groups=tuple(groups))


def check_replicas(arr: Any, *, timeout: float | None = None) -> ReplicaReport:
    """Checks that every replica of every block of ``arr`` holds the same bytes.

    Collective for a global (non-fully-addressable) array: every host must
    call it, with the same array. Each host digests the replicas it holds
    (XXH3-128 of a replica in host memory, read in place; the exact kernel of
    `multihost._checks.fingerprint` on an accelerator; blocks held by a
    single device are skipped)
    and publishes the digests through the coordination service; every host
    then builds the same report. A host-local (fully addressable) array is
    checked locally, without communication.

    Replicas that differ are undefined behaviour that JAX never reports, e.g.
    ``host_local_array_to_global_array(x, mesh, P())`` with a different ``x``
    on some host: computations then silently read whichever copy is local.

    Args:
        arr: a `jax.Array`.
        timeout: seconds to wait for every host; default ``MULTIHOST_TIMEOUT``
            or `multihost.DEFAULT_TIMEOUT`.

    Returns:
        A `ReplicaReport`; ``.ok`` is False when some replicas differ, and
        ``.mismatches`` / ``.odd_processes`` / ``.odd_devices`` say where.

    Raises:
        TypeError: ``arr`` is not a `jax.Array`.
        CollectiveMismatchError: hosts passed arrays of different shape, dtype
            or sharding (or called a different collective).
        BarrierTimeoutError: some host did not take part within ``timeout``.
    """
    import jax

    if not _is_jax_array(arr):
        raise TypeError(
            'check_replicas expects a jax.Array, got '
            f'{type(arr).__module__}.{type(arr).__qualname__}; to compare host-local '
            'values across hosts use multihost.assert_equal'
        )
    from multihost._checks import _hostreads
    from multihost._checks import fingerprint as _kernel

    layout = describe_layout(arr)
    if jax.process_count() == 1 or arr.is_fully_addressable:
        return _report(layout, _local_digests(arr, layout))

    signature = (
        layout.shape,
        layout.dtype,
        layout.sharding,
        layout.spec,
        layout.mesh_axes,
        tuple((s.index, s.device_id) for s in layout.shards),
    )
    timeout = _sequence.default_timeout() if timeout is None else float(timeout)
    try:
        _kernel.mode()
        if _hostreads.active():  # a shard not ready is named, never waited for
            why = _hostreads.unready(arr)
            if why is not None:
                raise _hostreads.NotReadyError(why)
    except (ValueError, _hostreads.NotReadyError) as exc:  # bad MULTIHOST_FINGERPRINT, ...
        _sequence.fail_turn('check_replicas', '', str(exc), timeout=timeout)
    rec = _sequence.enter(
        'check_replicas',
        '',
        tree_digest=_sequence.digest(('check_replicas', signature)),
        timeout=timeout,
    )
    mine = _local_digests(arr, layout)
    # Every host shares its digests (one `_kv` round under the collective's keys).
    # Among many hosts each host first checks its blocks against one reference
    # replica each and the round agrees on the outcome: nobody reads every
    # host's digests unless some replica differs (`_agree_by_reference`).
    agree = None
    if _kv.process_count() > _kv.DIGEST_ABOVE:
        agree = _agree_by_reference(rec, layout, mine)
    shared = _sequence.share(rec, 'digests', json.dumps(mine), timeout=timeout, agree=agree)
    if not shared:  # every host found its replicas equal to their block's reference
        return _agreed_report(layout, mine)
    digests: dict[int, str] = {}
    for text in shared.values():
        digests.update({int(d): h for d, h in json.loads(text).items()})
    return _report(layout, _settle_kinds(rec, layout, arr, digests, timeout))


def _agree_by_reference(rec: Any, layout: Layout, mine: dict[int, str]) -> str:
    """This host's outcome of comparing its replicas with each block's reference.

    For every replicated block held by more than one process and by this one,
    the first holder to get there stores its digest as the block's reference
    (first writer wins) and every later holder reads it (one RPC of ~32
    bytes) and compares. Replicas held only on this host are compared here.
    Any two differing replicas of a block mean at least one holder differs
    from the reference, and that holder says so before it arrives at the
    round; so when every host says ``'ok'`` every replica agrees. The keys
    live under the collective's `share` stage and go with its epoch.

    Returns:
        ``'ok'``, or ``'odd:<process>'`` (unique to this host: the round then
        reads everyone's digests and every host builds the full report).
    """
    client = _kv.client()
    me = _kv.process_index()
    root = _sequence.stage_dir(rec, 'digests') + '/ref'
    ok = True
    for b, block in enumerate(layout.blocks()):
        held = [mine[s.device_id] for s in block.shards if s.device_id in mine]
        if not held or block.replica_count < 2:
            continue
        if len(set(held)) > 1:
            ok = False  # replicas on this host differ already
        if len({s.process_index for s in block.shards}) < 2:
            continue  # only on this host: compared above
        k = f'{root}/{b}'
        if not _kv.put(client, k, held[0], once=True) and _kv.get(client, k) != held[0]:
            ok = False
    return 'ok' if ok else f'odd:{me}'


def _agreed_report(layout: Layout, mine: dict[int, str]) -> ReplicaReport:
    """The report when every replica agrees and only the agreement was read.

    Every host must build the same report, so a block's digest is named only
    when every process holds a replica of it (then every host knows it,
    e.g. a fully replicated array); other blocks' replicas say ``''`` (agreed,
    digest not read).
    """
    everywhere = set(range(_kv.process_count()))
    digests: dict[Any, str] = {}  # device id -> digest
    for block in layout.blocks():
        if block.replica_count < 2:
            continue
        held = [mine[s.device_id] for s in block.shards if s.device_id in mine]
        known = bool(held) and {s.process_index for s in block.shards} >= everywhere
        digests.update({s.device_id: held[0] if known else '' for s in block.shards})
    return _report(layout, digests)
