"""The plan: for each leaf and each of its blocks, decided once, how it is fingerprinted.

`plan` looks at the leaves' dtypes, shapes, shardings and layouts only (it runs nothing on a
device and reads no data) and returns a `Plan`: each leaf's route, the items read (a small
whole leaf, or a block of a large one at its offsets), the device programs that read them
with each program's cache key and read layout, the packing programs of small leaves, and the
items copied to the host. `execute.run` carries it out. The routes:

* `NUMPY`: a numpy leaf, by the definition (`definition.numpy_lanes`);
* `HOST_COPY`: a device leaf whose bits a device program would not keep (a narrow float on a
  TPU that the Pallas kernel does not read), or in host memory beside its device: its blocks
  copied to the host one at a time, then the definition;
* `SMALL`: a small whole leaf (up to `SMALL` elements): to the host (packed on its device
  first where a packing program takes its dtype and shape: `packer`), then with the others
  (`batched`);
* `DEVICE`: its blocks read where they live by XLA programs (`xla.group`), on a TPU a
  narrow float's (and 32-bit words' in the shapes it reads fast) by the Pallas kernel inside
  them (`pallas`), in the layout `layout.read_layout` gives; a whole leaf of a 2- or 4-byte
  dtype on a CPU device by one program for every size (`words`).

`CONFIG.platform` plans for another platform than the devices' (the tests: a TPU's routes on
CPU devices, the Pallas kernels then run in interpret mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from multihost._checks import _hostreads
from multihost._checks.fingerprint import layout, pallas, words, xla
from multihost._checks.fingerprint.definition import supported
from multihost._checks.fingerprint.settings import CACHE, CONFIG
from multihost._jax_adapter import has_host_copy

NUMPY, HOST_COPY, SMALL_LEAF, DEVICE = 'numpy', 'host copy', 'small', 'device'
#: Whole leaves up to this many elements go to the host (one batched copy per call).
SMALL = 1 << 16
#: Bytes of one program's blocks, at most.
MAX_GROUP_BYTES = 1 << 30
#: Sub-byte dtypes: numpy keeps a byte per element, a device fewer bits; their (small) data is
#: fingerprinted on the host, by the definition.
SUB_BYTE = frozenset({'int2', 'uint2', 'int4', 'uint4', 'float4_e2m1fn'})


@dataclasses.dataclass
class Block:
    """What one result is computed from: an array on one device (or numpy), at ``offsets``
    in its leaf of ``shape``, the result going to leaf ``leaf``."""

    array: Any
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    leaf: int


@dataclasses.dataclass
class Call:
    """One device program: ``kind`` (``'xla'`` or ``'pallas'``: a `xla.group` of blocks;
    ``'words'``: `words.chunk_out` over whole leaves on a CPU, chunk by chunk;
    ``'concat'``, ``'rows'``, ``'dma'``, ``'vmem'``: a packing program of small leaves), its key in
    `CACHE` (what it is compiled for), the blocks it reads (positions in `Plan.blocks`), and
    for groups what the program is given besides them."""

    kind: str
    key: tuple[Any, ...]
    blocks: list[int]
    count: int = 0  # blocks the program reads (a group's count padded to a power of two)
    strides: tuple[int, ...] = ()
    whole: bool = True
    flags: bool = False
    rows: bool = False
    interpret: bool = False
    read: layout.Read | None = None
    flat: bool = False  # whole leaves on a CPU read as 1-D views (one program per size)


@dataclasses.dataclass
class Plan:
    """Every leaf's route and every block's way (see the module docstring)."""

    routes: list[str]
    blocks: list[Block] = dataclasses.field(default_factory=list)
    programs: list[Call] = dataclasses.field(default_factory=list)
    packs: list[Call] = dataclasses.field(default_factory=list)
    copies: list[int] = dataclasses.field(default_factory=list)  # blocks copied one by one
    empty: list[int] = dataclasses.field(default_factory=list)  # blocks of no elements


def on_device(dtype: Any) -> bool:
    """Whether leaves of ``dtype`` are fingerprinted on their device (else on the host)."""
    return bool(CACHE.get('on_device', dtype, _on_device, dtype))


def _on_device(dtype: Any) -> bool:
    dt = np.dtype(dtype)
    return supported(dt) and dt.name not in SUB_BYTE


def _one_device_class(sharding: Any) -> bool:
    return isinstance(sharding, jax.sharding.SingleDeviceSharding)


#: Whether a sharding is a `SingleDeviceSharding`: jax 0.12 says it by a function and
#: deprecates naming the class (named only where that function is missing); jax 0.10 has
#: only the class.
one_device = getattr(jax.sharding, 'is_single_device_sharding', None) or _one_device_class


def device_platform(sharding: Any) -> str:
    """The platform of a sharding's (first) device."""
    return str(CACHE.get('platform', sharding, _first_platform, sharding))


def _first_platform(sharding: Any) -> str:
    device: Any = next(iter(sharding.device_set))
    return str(device.platform)


def planned_platform(sharding: Any) -> str:
    """The platform the plan takes a sharding's devices for (`CONFIG.platform` if set)."""
    return CONFIG.platform or device_platform(sharding)


def stored_order(x: Any) -> tuple[int, ...]:
    return (CONFIG.stored_order or layout.stored_order)(x)


def parts(x: jax.Array) -> list[tuple[jax.Array, tuple[int, ...], tuple[int, ...]]]:
    """A fully addressable array's distinct blocks (one replica each) with their offsets."""
    shape = tuple(int(d) for d in x.shape)
    if one_device(x.sharding):  # no Shard objects built
        return [(x, (0,) * x.ndim, shape)]
    shards = x.addressable_shards
    if len(shards) == 1:
        return [(shards[0].data, (0,) * x.ndim, shape)]
    seen: dict[tuple[int, ...], Any] = {}
    for shard in shards:
        start = tuple(int(sl.start or 0) for sl in shard.index) if shard.index else ()
        if start not in seen:
            seen[start] = shard.data
    return [(data, start, shape) for start, data in sorted(seen.items())]


def bits_lost_on_chip(x: Any) -> bool:
    """Whether ``x``'s devices would not keep its raw bits in a program and the Pallas kernel
    does not read its blocks either: a float narrower than 32 bits on a TPU that is float16
    (or another narrow float than bfloat16 and float8 e4m3fn / e5m2), or whose blocks the
    kernel does not read in their stored order (`layout.read_layout`: a small last axis
    there, or a block of a vector). `bench/tpu_bits.py` shows which operations rewrite which
    bits on the chip; ``np.asarray`` keeps every byte. Such leaves are read from host copies
    there (exact, slower: docs/API.md §4.2). Small whole leaves are copied anyway: False."""
    dt = np.dtype(x.dtype)
    if dt.itemsize >= 4 or dt.kind not in 'fV' or not jax.numpy.issubdtype(dt, jax.numpy.floating):
        return False
    try:
        key = ('lost', dt, tuple(x.shape), x.sharding)
        hash(key)
    except Exception:  # no sharding to ask: not on a chip we know of
        return False
    return bool(CACHE.get('route', key, _bits_lost, dt, x))


def _bits_lost(dt: np.dtype, x: Any) -> bool:
    try:
        on_tpu = (CONFIG.platform or '') == 'tpu' or (
            not CONFIG.platform
            and any(getattr(d, 'platform', '') == 'tpu' for d in x.sharding.device_set)
        )
        block = tuple(int(d) for d in x.sharding.shard_shape(x.shape))
    except Exception:  # no sharding to ask: not on a chip we know of
        return False
    whole = block == tuple(x.shape)
    if not on_tpu or (x.size <= SMALL and whole):  # a small whole leaf: one host copy
        return False
    return layout.read_layout(dt, block, whole, stored_order(x)) is None


def route(leaf: Any, host_copies_only: bool = False) -> str:
    """A leaf's route (see the module docstring)."""
    if not isinstance(leaf, jax.Array):
        a = np.asarray(leaf)
        return SMALL_LEAF if a.size <= SMALL and on_device(a.dtype) else NUMPY
    if host_copies_only:
        return HOST_COPY
    key = (leaf.dtype, leaf.shape, leaf.sharding)
    return str(CACHE.get('route', key, _choose_route, leaf))


def _choose_route(x: jax.Array) -> str:
    if not on_device(x.dtype):
        return NUMPY
    if bits_lost_on_chip(x) or _hostreads.offloaded(x):
        return HOST_COPY
    if one_device(x.sharding) and 0 < x.size <= SMALL:
        return SMALL_LEAF
    return DEVICE


def plan(leaves: Sequence[Any], flags: bool = False, host_copies_only: bool = False) -> Plan:
    """How each of ``leaves`` is fingerprinted (with ``flags``: also the NaN/Inf and constant
    flags); ``host_copies_only``: no device program (`_hostreads`: a thread that only reads
    host copies). A tree of device arrays planned before (the same dtypes, shapes, shardings
    and host copies held) gets that plan again, its blocks bound to these arrays
    (`_Template`): a model state's 587 leaves are planned in 4 ms on a TPU host's CPU."""
    key = _signature(leaves, flags, host_copies_only)
    try:
        kept = CACHE.peek('plans', key)
    except TypeError:  # a sharding that cannot be a key: planned each time
        return _plan(leaves, flags, host_copies_only)
    if kept is not None:
        return kept.bind(leaves)
    p = _plan(leaves, flags, host_copies_only)
    CACHE.put('plans', key, _Template(p, leaves))
    return p


def _signature(leaves: Sequence[Any], flags: bool, host_copies_only: bool) -> Any:
    """What a plan of ``leaves`` depends on: each `jax.Array`'s dtype, shape, sharding (its
    devices, memory kind, blocks) and whether jax holds a host copy of it (`packer`); each
    other leaf's numpy dtype and shape."""
    return (
        flags,
        host_copies_only,
        tuple(
            (x.dtype, x.shape, x.sharding, has_host_copy(x))
            if isinstance(x, jax.Array)
            else _host_signature(x)
            for x in leaves
        ),
    )


def _host_signature(x: Any) -> tuple[Any, ...]:
    a = np.asarray(x)
    return ('host', a.dtype, a.shape)


class _Template:
    """A plan without its arrays (a kept plan holds no device memory): where each block's
    array comes from (its leaf, and which of the leaf's `parts`), the rest as planned."""

    def __init__(self, p: Plan, leaves: Sequence[Any]) -> None:
        self.routes = p.routes
        self.programs, self.packs, self.copies, self.empty = p.programs, p.packs, p.copies, p.empty
        self.sources: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
        part: dict[int, int] = {}
        for b in p.blocks:
            k = part.get(b.leaf, 0)
            part[b.leaf] = k + 1
            self.sources.append((b.leaf, k, b.offsets, b.shape))
        device = {i for i in part if isinstance(leaves[i], jax.Array)}
        self.split = [i for i in device if not one_device(leaves[i].sharding)]
        self.host = [i for i in part if i not in device]

    def bind(self, leaves: Sequence[Any]) -> Plan:
        """This plan for ``leaves`` (the same signature as the planned ones)."""
        split: dict[int, list[Any]] = {i: [a for a, _, _ in parts(leaves[i])] for i in self.split}
        split.update({i: [np.asarray(leaves[i])] for i in self.host})
        blocks = [
            Block(split[i][k] if i in split else leaves[i], offsets, shape, i)
            for i, k, offsets, shape in self.sources
        ]
        return Plan(self.routes, blocks, self.programs, self.packs, self.copies, self.empty)


def _plan(leaves: Sequence[Any], flags: bool, host_copies_only: bool) -> Plan:
    routes = [route(leaf, host_copies_only) for leaf in leaves]
    blocks: list[Block] = []
    for i, (leaf, way) in enumerate(zip(leaves, routes)):
        if way == SMALL_LEAF:
            a = leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)
            blocks.append(Block(a, (0,) * a.ndim, tuple(a.shape), i))
        elif way == DEVICE:
            blocks += [Block(x, tuple(o), tuple(s), i) for x, o, s in parts(leaf)]
    return plan_blocks(blocks, flags, routes)


def plan_blocks(blocks: Sequence[Block], flags: bool, routes: list[str] | None = None) -> Plan:
    """The programs, packs and copies that read ``blocks`` (single-device arrays or numpy
    arrays at offsets in their leaves): blocks of one shape, dtype and device share a program;
    small whole leaves go to the host, packed on their device first where they can be."""
    p = Plan(routes if routes is not None else [DEVICE] * len(blocks), list(blocks))
    small: list[int] = []
    groups: dict[tuple[Any, ...], list[int]] = {}
    chunked: dict[Any, list[int]] = {}
    for i, b in enumerate(p.blocks):
        x = b.array
        whole = not any(b.offsets) and b.shape == tuple(x.shape)
        if x.size == 0:
            p.empty.append(i)
        elif not isinstance(x, jax.Array) or (whole and x.size <= SMALL):
            small.append(i)
        elif whole and words.takes(x.dtype) and _flat_on_cpu(x):
            chunked.setdefault(next(iter(x.devices())), []).append(i)
        else:
            device = next(iter(x.devices()))
            kind = getattr(x.sharding, 'memory_kind', None)  # a program is compiled for it
            flat = whole and x.ndim != 1 and _flat_on_cpu(x)
            shape = (int(x.size),) if flat else tuple(x.shape)
            full = None if whole else b.shape
            groups.setdefault((device, shape, np.dtype(x.dtype), full, kind, flat), []).append(i)
    for (device, shape, dtype, full, kind, flat), idx in groups.items():
        p.programs += _group_calls(p.blocks, idx, device, shape, dtype, full, kind, flat, flags)
    for device, idx in chunked.items():
        p.programs.append(Call('words', ('words', device, flags), idx, flags=flags))
    _plan_packs(p, small)
    return p


def _flat_on_cpu(x: jax.Array) -> bool:
    """Whether ``x`` is in a CPU device's memory (and planned as such), where a 1-D view of
    it costs nothing: whole leaves there take the row formulation, which reads them flat, so a
    program per size and dtype serves every shape of that size (fewer compiles)."""
    kind = getattr(x.sharding, 'memory_kind', None)
    return planned_platform(x.sharding) == 'cpu' and kind in (None, 'device')


def _pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _group_calls(
    blocks: list[Block], idx: list[int], device: Any, shape: tuple[int, ...], dtype: np.dtype,
    full: tuple[int, ...] | None, kind: Any, flat: bool, flags: bool,
) -> list[Call]:  # fmt: skip
    """The programs of one group: K blocks of one shape, dtype and device each."""
    first = blocks[idx[0]].array
    nbytes = max(1, int(first.nbytes))
    most = max(1, min(CONFIG.max_group, MAX_GROUP_BYTES // nbytes))
    strides = xla.c_strides(full if full is not None else shape)
    platform = planned_platform(first.sharding)
    rows = platform == 'cpu'  # XLA:CPU: the row formulation is faster there
    read = None
    if platform == 'tpu':  # one layout per group's shape, in its stored order
        read = layout.read_layout(dtype, shape, full is None, stored_order(first))
    interpret = device.platform != 'tpu'
    calls = []
    for lo in range(0, len(idx), most):
        part = idx[lo : lo + most]
        k = _pow2(len(part)) if _pow2(len(part)) <= most else len(part)
        key = (device, kind, shape, dtype, k, full is None, strides, flags, rows, interpret, read)
        calls.append(
            Call('pallas' if read else 'xla', key, part, k, strides, full is None, flags, rows,
                 interpret, read, flat)
        )  # fmt: skip
    return calls


def packer(x: Any) -> str:
    """The packing program that takes small leaf ``x`` with others of its dtype and device:
    ``'rows'`` (`xla.pack_rows`), ``'concat'`` (`xla.pack_concat`), ``'dma'``
    (`pallas.dma_pack`: bfloat16's 1-D leaves of whole tiles on a TPU), ``'vmem'``
    (`pallas.vmem_bits`: on a TPU, narrow floats the kernel reads, of two axes or more,
    stored in C order; one program per shape), or '' (copied to the host alone: numpy, on a
    CPU, a host copy jax already holds)."""
    if not isinstance(x, jax.Array) or has_host_copy(x):
        return ''
    return str(CACHE.get('packer', (x.dtype, x.shape, x.sharding), _choose_packer, x))


def _choose_packer(x: jax.Array) -> str:
    if getattr(x.sharding, 'memory_kind', None) not in (None, 'device'):
        return ''  # offloaded: no device program takes it with device arrays
    platform = planned_platform(x.sharding)
    name = np.dtype(x.dtype).name
    if platform == 'cpu':
        return ''
    if name in CONFIG.pack_dtypes:
        return 'rows' if name in xla.ROW_DTYPES else 'concat'
    if platform == 'tpu' and pallas.dma_packable(x.dtype, tuple(x.shape)):
        return 'dma'
    if (
        platform == 'tpu'
        and name in layout.KERNEL_FLOATS
        and x.ndim >= 2
        and stored_order(x) == tuple(range(x.ndim))  # else XLA relays it out for the kernel
    ):
        return 'vmem'
    return ''


def _plan_packs(p: Plan, small: list[int]) -> None:
    """Packing programs for the small blocks that have one, two or more alike (by program,
    sharding and dtype, up to `CONFIG.max_pack`); the others are copied one by one."""
    packs: dict[tuple[Any, ...], list[int]] = {}
    for i in small:
        x = p.blocks[i].array
        how = packer(x)
        if how:
            shape = tuple(x.shape) if how == 'vmem' else ()  # its output: one shape
            packs.setdefault((how, x.sharding, x.dtype, shape), []).append(i)
        else:
            p.copies.append(i)
    for (how, sharding, dtype, shape), idx in packs.items():
        most = CONFIG.max_pack
        if how == 'vmem':  # the leaves and their output in VMEM at once
            most = max(1, min(most, pallas.VMEM_BITS_BYTES // pallas.vmem_bytes(dtype, shape)))
        for lo in range(0, len(idx), most):
            part = idx[lo : lo + most]
            if len(part) < 2:
                p.copies += part
                continue
            interpret = device_platform(sharding) != 'tpu'
            shapes = tuple(tuple(p.blocks[i].array.shape) for i in part)
            p.packs.append(Call(how, (how, interpret, sharding, dtype, shapes), part,
                                interpret=interpret))  # fmt: skip
