"""Carrying out a `planning.Plan`: the device programs compiled (once per process, kept in
`CACHE`) and dispatched, the small leaves copied to the host and computed by numpy while they
run, then one batched copy of the programs' results; each leaf's fingerprint and flags."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from multihost import _recorder
from multihost._checks import _hostreads
from multihost._checks.fingerprint import pallas, planning, words, xla
from multihost._checks.fingerprint.batched import every, numpy_many
from multihost._checks.fingerprint.definition import (
    LANES,
    lane_sets,
    numpy_flags,
    numpy_lanes,
    to_bytes,
)
from multihost._checks.fingerprint.settings import CACHE
from multihost._jax_adapter import host_copy

#: A leaf's answer: (fingerprint, holds NaN/Inf, constant).
Answer = tuple[bytes, bool, bool]


def fingerprints(leaves: Sequence[Any]) -> list[bytes]:
    """Each leaf's fingerprint: 16 bytes per lane set (`definition`).

    ``jax.Array`` leaves (fully addressable) are fingerprinted on their devices,
    numpy arrays in numpy, with the same definition. A leaf of an unsupported
    dtype raises TypeError (callers keep a byte hash for those).
    """
    return [d for d, _, _ in with_flags(leaves, False)]


def with_flags(leaves: Sequence[Any], flags: bool) -> list[Answer]:
    """(fingerprint, holds NaN/Inf, constant) of each leaf (flags False unless asked for)."""
    p = planning.plan(leaves, flags, _recorder.host_copies_only())
    results = run(p, flags) if p.blocks else []
    out: list[Answer | None] = [None] * len(leaves)
    for i, (leaf, way) in enumerate(zip(leaves, p.routes)):
        if way == planning.HOST_COPY:
            out[i] = _copied_with_flags(leaf, flags)
        elif way == planning.NUMPY:
            a = np.asarray(leaf)
            out[i] = (to_bytes(numpy_lanes(a)), *(numpy_flags(a) if flags else (False, False)))
    sums: dict[int, list[Any]] = {}
    widths: dict[Any, int] = {}  # results' lanes per dtype
    with np.errstate(over='ignore'):
        for b, res in zip(p.blocks, results):
            dt = b.array.dtype
            n = widths.get(dt) or widths.setdefault(dt, lane_sets(dt) * LANES)
            bad, same = (bool(res[n]), bool(res[n + 1])) if flags else (False, False)
            prev = sums.get(b.leaf)
            if prev is None:
                sums[b.leaf] = [res[:n], bad, same]
            else:  # a leaf's blocks: lanes add up; any block bad; all constant
                prev[0] = prev[0] + res[:n]
                prev[1] = prev[1] or bad
                prev[2] = prev[2] and same
    for i, (lanes, bad, same) in sums.items():
        out[i] = (to_bytes(lanes), bad, same)
    return every(out)


def _copied_with_flags(x: jax.Array, flags: bool) -> Answer:
    """The answer without a device program: the definition over host copies of the blocks,
    one at a time (`_hostreads.blocks`; a block not ready raises there, and a device program
    would wait for it too); with ``flags``, any block holding NaN/Inf and every block
    constant."""
    if not _recorder.host_copies_only():
        jax.block_until_ready(x)
    total = np.zeros((lane_sets(x.dtype), LANES), np.uint32)
    bad, same = False, True
    with np.errstate(over='ignore'):
        for block, offsets, shape in _hostreads.blocks(x):
            if block.size:
                total += numpy_lanes(block, offsets, shape)
            if flags:
                b, c = numpy_flags(block)
                bad, same = bad or b, same and c
    return to_bytes(total), bool(flags and bad), bool(flags and same)


def device_results(
    blocks: Sequence[tuple[Any, Sequence[int], Sequence[int]]], flags: bool = False
) -> list[np.ndarray]:
    """Per block (single-device array, offsets in its leaf, the leaf's shape): uint32
    results, its lanes (sets * 4) then, with ``flags``, holds-NaN/Inf and is-constant."""
    items = [
        planning.Block(x, tuple(int(v) for v in o), tuple(int(d) for d in (s or x.shape)), i)
        for i, (x, o, s) in enumerate(blocks)
    ]
    return run(planning.plan_blocks(items, flags), flags)


def device_lanes(blocks: Sequence[tuple[Any, Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
    """Lanes (sets x 4, uint32) of single-device arrays, each a block at offsets of a shape
    (`device_results` without flags)."""
    return [r.reshape(-1, LANES) for r in device_results(blocks)]


def run(p: planning.Plan, flags: bool) -> list[np.ndarray]:
    """Each of the plan's blocks' results: everything dispatched before anything is read;
    the packs first (small, ahead of the groups on their device), each result copied to the
    host as soon as its program ends; the small leaves copied and computed while the groups
    run; then one batched copy of the groups' results."""
    out: list[np.ndarray | None] = [None] * len(p.blocks)
    for i in p.empty:
        empty = np.zeros(
            lane_sets(p.blocks[i].array.dtype) * LANES + (2 if flags else 0), np.uint32
        )
        empty[-1] = 1 if flags else 0  # constant: nothing differs
        out[i] = empty
    calls = [(c, _arguments(p, c)) for c in p.packs + p.programs]
    packs = {id(c) for c in p.packs}  # (a Call's == compares every field)
    _compile(calls)
    copies = list(p.copies)
    packed, pending, chunked = [], [], []
    for call, args in calls:
        program = CACHE.peek('programs', call.key)
        if program is False:  # a packing program that did not compile: copies
            copies += call.blocks
        elif id(call) in packs:
            packed.append((call, program(*args)))
        elif call.kind == 'words':
            arrays = [p.blocks[i].array for i in call.blocks]
            chunked.append((call, words.dispatch(program, arrays, flags)))
        else:  # a compiled program takes the blocks and offsets (the rest is static)
            pending.append((call, program(*args[:2])))
    for _, result in packed + pending:
        result.copy_to_host_async()
    # The copied leaves are ready (their launches ran): copied while the programs run (a
    # copy of a ready buffer does not queue behind compute).
    host: dict[int, np.ndarray] = dict(
        zip(copies, _host_copies([p.blocks[i].array for i in copies]))
    )
    for call, result in packed:
        _unpack(p, call, np.asarray(result), flags, out, host)
    order = list(host)
    for i, res in zip(order, numpy_many([host[i] for i in order], flags)):
        out[i] = res
    for call, chunks in chunked:
        for i, res in zip(call.blocks, words.collect(chunks)):
            out[i] = res
    got = jax.device_get([result for _, result in pending]) if pending else []
    for (call, _), res in zip(pending, got):
        for j, i in enumerate(call.blocks):
            out[i] = np.asarray(res[j])
    return every(out, 'blocks')


def _unpack(
    p: planning.Plan, call: planning.Call, flat: np.ndarray, flags: bool,
    out: list[np.ndarray | None], host: dict[int, np.ndarray],
) -> None:  # fmt: skip
    """A packing program's result: its leaves' results into ``out`` (rows' sums), or their
    host copies into ``host`` (for `numpy_many`)."""
    if call.kind == 'rows':  # the rows' sums: each leaf's results, no copy of it
        sizes = tuple(int(p.blocks[i].array.size) for i in call.blocks)
        for i, res in zip(call.blocks, xla.row_results(flat, sizes, flags)):
            out[i] = res
    elif call.kind == 'vmem':  # each leaf's raw bits, widened to int32
        for j, i in enumerate(call.blocks):
            x = p.blocks[i].array
            raw = np.uint8 if x.dtype.itemsize == 1 else np.uint16
            host[i] = flat[j].astype(raw).view(x.dtype)
    else:  # one buffer, the leaves one after another
        pos = 0
        for i in call.blocks:
            x = p.blocks[i].array
            host[i] = flat[pos : pos + x.size].reshape(x.shape)
            pos += x.size


def _program(call: planning.Call) -> Any:
    """The jitted function a call runs."""
    if call.kind == 'concat':
        return xla.pack_concat
    if call.kind == 'rows':
        return xla.pack_rows
    if call.kind == 'dma':
        return pallas.dma_pack_interpret if call.interpret else pallas.dma_pack
    if call.kind == 'vmem':
        return pallas.vmem_bits_interpret if call.interpret else pallas.vmem_bits
    if call.kind == 'words':
        return words.chunk_out
    return xla.group


def _arguments(p: planning.Plan, call: planning.Call) -> tuple[Any, ...]:
    """What a call's program is given: its blocks (for a group padded to its count by the
    first again: no copy; whole leaves on a CPU as 1-D views), their offsets."""
    if call.kind == 'words':  # compiled for a chunk's shape, given the chunks one by one
        return words.shapes(call.key[1], call.flags)
    xs = tuple(p.blocks[i].array for i in call.blocks)
    if call.kind not in ('xla', 'pallas'):
        return (xs,)
    if call.flat:
        xs = tuple(_flat_view(x) for x in xs)
    xs += (xs[0],) * (call.count - len(xs))
    offsets = None
    if not call.whole:
        arr = np.zeros((call.count, len(p.blocks[call.blocks[0]].shape)), np.uint32)
        for j, i in enumerate(call.blocks):
            arr[j] = np.asarray(p.blocks[i].offsets, np.uint64) & 0xFFFFFFFF
        offsets = jax.device_put(arr, call.key[0])
    return (xs, offsets, call.strides, call.flags, call.rows, call.interpret, call.read)


def _flat_view(x: jax.Array) -> jax.Array:
    """A whole leaf on a CPU device as a 1-D array of the same buffer (numpy's view, put back
    on the device: jax reads aligned host memory in place, no copy)."""
    return jax.device_put(np.asarray(x).reshape(-1), next(iter(x.devices())))


def _compile(calls: list[tuple[planning.Call, tuple[Any, ...]]]) -> None:
    """Compiles the programs ``calls`` need that this process has not compiled yet, several
    at once (XLA compiles outside the GIL; `bench/tpu_fingerprints.py --first` counts the
    compiles of a model state's first fingerprints and times them). A DMA packing program
    that does not compile (a TPU whose Mosaic lays 1-D buffers out in other tiles) is kept
    as False (also a VMEM one): its leaves are copied one by one."""
    missing: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for call, args in calls:
        if CACHE.peek('programs', call.key) is None and call.key not in missing:
            missing[call.key] = (call, args)

    def build(job: tuple[Any, ...]) -> Any:
        call, args = job
        try:
            return _program(call).lower(*args).compile()
        except Exception:
            if call.kind in ('dma', 'vmem'):
                return False
            raise

    if len(missing) == 1:
        ((key, job),) = missing.items()
        CACHE.put('programs', key, build(job))
    elif missing:
        from concurrent.futures import ThreadPoolExecutor

        workers = max(1, min(len(missing), os.cpu_count() or 1, 16))
        with ThreadPoolExecutor(workers, thread_name_prefix='multihost-compile') as pool:
            for key, program in zip(missing, pool.map(build, missing.values())):
                CACHE.put('programs', key, program)


def _host_copies(arrays: Sequence[Any]) -> list[np.ndarray]:
    """numpy copies of ready single-device arrays: the copies jax holds taken as they are,
    every other copy started, then each taken (jax keeps a copy on its array: the next call
    reads it again); on a CPU device, views; numpy arrays as they are."""
    kept = [host_copy(x) if isinstance(x, jax.Array) else x for x in arrays]
    for x, h in zip(arrays, kept):
        if h is None and planning.device_platform(x.sharding) != 'cpu':
            x.copy_to_host_async()
    return [np.asarray(x) if h is None else h for x, h in zip(arrays, kept)]
