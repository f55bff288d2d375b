"""The collective table of a compiled program: its optimized HLO read once (jax + numpy only).

`collective_table(compiled)` walks the HLO text from the entry computation in its scheduled
order, stepping into the computations an instruction calls (fusions, calls, loop bodies,
branches) where it stands, and makes one `CollectiveTable` row per collective: kind, result
type, replica groups as device ids (explicit ``{{0,1},{2,3}}``, iota ``[2,2]<=[4]``, mesh
``mesh['axis_0'=4,'axis_1'=4] {'axis_0'}``; collective-permute's source/target pairs), the
processes and slices of those devices, the mesh axes that vary inside a group, and its lines
from the program's stack-frame tables (or the metadata's source_file/source_line). Made once
per executable and cached by it (`table_for`): never on a launch's path.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from multihost import _jax_adapter
from multihost._models._colltable import (
    MAX_IDS,
    MAX_OPS,
    CollectiveOp,
    CollectiveTable,
    user_and_library,
)
from multihost._models._hardware import device_infos_from
from multihost._models._stacks import frame_package

KINDS = (
    'all-reduce',
    'all-gather',
    'reduce-scatter',
    'all-to-all',
    'ragged-all-to-all',
    'collective-permute',
    'collective-broadcast',
)
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$')
_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$')
_CALLED = re.compile(
    r'\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)'
    r'|\b(?:branch_computations|called_computations)=\{([^}]*)\}'
)
_LAYOUT = re.compile(r'(?<=\])\{[^{}]*\}')
_META = re.compile(r'metadata=\{([^}]*)\}')
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s,}]+)')
_OPERANDS = re.compile(r'%([\w.\-]+)')
_IOTA = re.compile(r'\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?')
_MESH = re.compile(r'mesh\[([^\]]*)\]\s*\{([^}]*)\}')
_AXIS = re.compile(r"'([^']*)'\s*(?:=\s*(\d+)|:\((\d+)\)(\d+))?")
_TABLES = ('FileNames', 'FunctionNames', 'FileLocations', 'StackFrames')
_GROUPS_TEXT = 240  # characters of the HLO's own group text kept per row

_cache: weakref.WeakKeyDictionary[Any, CollectiveTable] = weakref.WeakKeyDictionary()


def table_for(compiled: Any, mesh: Any = None) -> CollectiveTable:
    """`collective_table` of ``compiled``, made once per executable (cached while it lives)."""
    key = _jax_adapter.executable_of(compiled)
    try:
        hit = _cache.get(key)
    except TypeError:  # not weakly referable: made each time
        return collective_table(compiled, mesh=mesh)
    if hit is None:
        hit = _cache[key] = collective_table(compiled, mesh=mesh)
    return hit


def collective_table(
    compiled: Any, *, devices: Sequence[Any] | None = None, mesh: Any = None
) -> CollectiveTable:
    """The cross-process collectives of a compiled program, in its order.

    Args:
        compiled: a `jax.stages.Compiled`, or its HLO text (``compiled.as_text()``).
        devices: the program's device assignment, in its order (default: the compiled
            program's, read from its shardings); logical id ``i`` is ``devices[i]``.
        mesh: a `jax.sharding.Mesh` naming the axes (default: the first `NamedSharding`'s
            mesh among the program's inputs and outputs).
    """
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    notes: list[str] = []
    if not isinstance(compiled, str):
        shardings = _shardings(compiled)
        if devices is None and shardings:
            devices = _jax_adapter.device_assignment(shardings[0])
        if mesh is None:
            mesh = next((s.mesh for s in shardings if hasattr(s, 'spec')), None)
    hlo = _Hlo(text)
    infos = device_infos_from(list(devices or ()))
    chips = infos if infos and all(i.coords for i in infos) and len(infos) <= MAX_IDS else ()
    devices = [_Dev(int(d.id), int(d.process_index), getattr(d, 'slice_index', None))
               for d in devices or ()]  # fmt: skip
    if not devices:
        notes.append('no device assignment: groups are logical ids, processes unknown')
    rows = hlo.collectives()
    where = {int(d.id): idx for idx, d in np.ndenumerate(mesh.devices)} if mesh is not None else {}
    names = tuple(str(a) for a in mesh.axis_names) if mesh is not None else ()
    ops = [_row(i, r, hlo, devices, (where, names), notes) for i, r in enumerate(rows[:MAX_OPS])]
    slices = {getattr(d, 'slice_index', None) for d in devices} - {None}
    axes = tuple(zip(mesh.axis_names, mesh.devices.shape)) if mesh is not None else ()
    return CollectiveTable(
        program=hlo.module,
        ops=tuple(ops),
        num_devices=len(devices),
        processes=tuple(sorted({int(d.process_index) for d in devices})),
        mesh_axes=tuple((str(n), int(s)) for n, s in axes),
        slices=len(slices),
        dropped=max(len(rows) - MAX_OPS, 0),
        notes=tuple(dict.fromkeys(notes)),
        devices=tuple(chips),
    )


def _shardings(compiled: Any) -> list[Any]:
    out = []
    for attr in ('input_shardings', 'output_shardings'):
        try:
            tree = getattr(compiled, attr)
        except Exception:  # no shardings known (a program without inputs, a backend)
            continue
        import jax

        out += [s for s in jax.tree.leaves(tree) if hasattr(s, 'device_set')]
    return out


class _Dev(NamedTuple):
    """What the table needs of a device (read once: a TPU device's attributes are calls)."""

    id: int
    process_index: int
    slice_index: int | None


class _Hlo:
    """An HLO module's text: its computations, source tables and partition count."""

    def __init__(self, text: str) -> None:
        self.comps: dict[str, list[str]] = {}
        self._cache: dict[str, tuple[dict[str, str], list[tuple[str, Any, list[str]]]]] = {}
        self._holds: dict[str, bool] = {}
        self.entry = ''
        self.module = ''
        self.partitions = 0
        tables: dict[str, dict[int, str]] = {t: {} for t in _TABLES}
        table = ''
        current: list[str] | None = None
        for line in text.splitlines():
            s = line.strip()
            if line.startswith('HloModule '):
                self.module = s.split()[1].rstrip(',')
                m = re.search(r'num_partitions=(\d+)', line)
                self.partitions = int(m.group(1)) if m else 0
                continue
            if s in _TABLES:
                table = s
                continue
            if table:
                if not s:
                    table = ''
                else:
                    k, _, v = s.partition(' ')
                    tables[table][int(k)] = v
                continue
            m = _HEADER.match(line)
            if m:
                current = self.comps.setdefault(m.group(2), [])
                if m.group(1):
                    self.entry = m.group(2)
            elif s == '}':
                current = None
            elif current is not None:
                current.append(line)
        self.files = {k: v.strip('"') for k, v in tables['FileNames'].items()}
        self.funcs = {k: v.strip('"') for k, v in tables['FunctionNames'].items()}
        self.locs = {k: dict(_FIELD.findall(v)) for k, v in tables['FileLocations'].items()}
        self.frames = {k: dict(_FIELD.findall(v)) for k, v in tables['StackFrames'].items()}
        # jax 0.10.2's text prints a frame's parent one above its id (the root names itself);
        # where no frame names itself, the ids are as printed (0: no parent)
        self.shift = int(any(int(f.get('parent_frame_id', 0)) == k for k, f in self.frames.items()))

    def collectives(self) -> list[tuple[str, str, str, dict[str, str]]]:
        """(computation, kind, line, instruction lines by name) per collective, in order."""
        out: list[tuple[str, str, str, dict[str, str]]] = []
        seen_dcn: set[str] = set()

        def walk(comp: str, stack: tuple[str, ...]) -> None:
            by_name, parsed = self._parsed(comp)
            for line, m, called in parsed:
                op = m.group(3)
                base = _base(op)
                if base in KINDS:
                    out.append((comp, base, line, by_name))
                elif op == 'send' and '_xla_megascale_transfer_type' in line:
                    key = re.search(r'_xla_host_transfer_rendezvous="([^"]*)"', line)
                    rk = key.group(1) if key else m.group(1)
                    if rk not in seen_dcn:
                        seen_dcn.add(rk)
                        out.append((comp, 'dcn', line, by_name))
                for n in called:
                    if n not in stack and self._has(n, stack + (n,)):
                        walk(n, stack + (n,))

        if self.entry:
            walk(self.entry, (self.entry,))
        return out

    def _parsed(self, comp: str) -> tuple[dict[str, str], list[tuple[str, Any, list[str]]]]:
        """(instruction lines by name, [(line, match, computations it calls)]), read once."""
        hit = self._cache.get(comp)
        if hit is None:
            by_name: dict[str, str] = {}
            parsed = []
            for line in self.comps.get(comp, ()):
                m = _INSTR.match(line)
                if m is None:
                    continue
                by_name[m.group(1)] = line
                called = []
                if '=%' in line or '={' in line:
                    for c in _CALLED.finditer(line):
                        names = [c.group(1)] if c.group(1) else _OPERANDS.findall(c.group(2) or '')
                        called += [n for n in names if n in self.comps]
                parsed.append((line, m, called))
            hit = self._cache[comp] = (by_name, parsed)
        return hit

    def _has(self, comp: str, stack: tuple[str, ...]) -> bool:
        """Whether ``comp`` or a computation it calls holds a collective (memoized)."""
        if comp not in self._holds:
            _, parsed = self._parsed(comp)
            self._holds[comp] = any(
                _base(m.group(3)) in KINDS
                or (m.group(3) == 'send' and '_xla_megascale_transfer_type' in line)
                or any(n not in stack and self._has(n, stack + (n,)) for n in called)
                for line, m, called in parsed
            )
        return self._holds[comp]

    def source(self, line: str, by_name: dict[str, str]) -> tuple[list[tuple[str, int, str]], str]:
        """(frames innermost first, op_name) of an instruction; when it has no metadata, its
        input's (up to 4 steps up), the site marked as such."""
        for hop in range(5):
            meta = _META.search(line)
            fields = dict(_FIELD.findall(meta.group(1))) if meta else {}
            frames = self._frames(fields)
            if frames:
                if hop:
                    f, n, fn = frames[0]
                    frames[0] = (f, n, f"{fn + ' ' if fn else ''}(its input's line)".strip())
                return frames, fields.get('op_name', '').strip('"')
            m = _INSTR.match(line)
            operands = _OPERANDS.findall(m.group(4)) if m else []
            nxt = next((by_name[o] for o in operands if o in by_name), None)
            if nxt is None:
                break
            line = nxt
        return [], ''

    def _frames(self, fields: dict[str, str]) -> list[tuple[str, int, str]]:
        out: list[tuple[str, int, str]] = []
        fid = int(fields.get('stack_frame_id', 0) or 0)
        seen = set()
        while fid and fid in self.frames and fid not in seen:
            seen.add(fid)
            frame = self.frames[fid]
            loc = self.locs.get(int(frame.get('file_location_id', 0)), {})
            file = self.files.get(int(loc.get('file_name_id', 0)), '')
            func = self.funcs.get(int(loc.get('function_name_id', 0)), '')
            out.append((file, int(loc.get('line', 0)), func))
            fid = int(frame.get('parent_frame_id', 0)) - self.shift
        if not out and 'source_file' in fields:
            out.append((fields['source_file'].strip('"'), int(fields.get('source_line', 0)), ''))
        return out


def _base(op: str) -> str:
    return op[: -len('-start')] if op.endswith('-start') else op


def _row(
    index: int,
    found: tuple[str, str, str, dict[str, str]],
    hlo: _Hlo,
    devices: list[Any],
    mesh: tuple[dict[int, Any], tuple[str, ...]],
    notes: list[str],
) -> CollectiveOp:
    comp, kind, line, by_name = found
    m = _INSTR.match(line)
    assert m is not None
    name, rtype, op = m.group(1), m.group(2), m.group(3)
    dcn = kind == 'dcn'
    if dcn:
        t = re.search(r'_xla_megascale_transfer_type="([^"]*)"', line)
        kind = (t.group(1) if t else 'transfer').lower().replace('_', '-')
        operands = _OPERANDS.findall(m.group(4))
        rtype = _types(rtype)[0] if rtype.startswith('(') else rtype
        gtext = re.search(r'_xla_megascale_target="([^"]*)"', line)
        groups_text = f'megascale target {gtext.group(1)}' if gtext else ''
        del operands
        logical = None
    else:
        logical, groups_text = _logical_groups(line, op, hlo, notes)
    shape = _LAYOUT.sub('', rtype)
    if op.endswith('-start') and kind in ('all-gather', 'collective-permute', 'all-to-all'):
        parts = _types(shape)
        shape = parts[1] if len(parts) > 1 else shape
    groups = _device_groups(logical, hlo, devices, dcn)
    frames, op_name = hlo.source(line, by_name)
    text, site, lib = user_and_library(frames, lambda f: frame_package(f) is not None)
    ids = sum(len(g) for g in groups)
    procs = _process_groups(groups, devices)
    slices = [{getattr(devices[i], 'slice_index', None) for i in g} for g in groups if devices]
    crosses = None
    if len({getattr(d, 'slice_index', None) for d in devices} - {None}) > 1:
        crosses = dcn or any(len(s) > 1 for s in slices)
    return CollectiveOp(
        index=index,
        kind=kind,
        name=name,
        shape=shape,
        groups=tuple(tuple(int(getattr(devices[i], 'id', i)) for i in g) for g in groups)
        if ids <= MAX_IDS and devices
        else (),
        groups_text=groups_text[:_GROUPS_TEXT],
        process_groups=procs,
        axes=_axes(groups, devices, mesh),
        crosses_slices=crosses,
        dcn=dcn,
        computation=comp,
        op_name=op_name,
        frames=text,
        site=site,
        library_site=lib,
    )


def _types(t: str) -> list[str]:
    """``(f32[8], (u32[], s32[]))`` -> its top-level element types."""
    t = t.strip()
    if not t.startswith('('):
        return [t]
    out, depth, cur = [], 0, ''
    for ch in t[1:-1]:
        if ch == ',' and depth == 0:
            out.append(cur.strip())
            cur = ''
            continue
        depth += ch in '([{'
        depth -= ch in ')]}'
        cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def _logical_groups(
    line: str, op: str, hlo: _Hlo, notes: list[str]
) -> tuple[list[list[int]] | None, str]:
    """The groups of logical ids (None: every id in one group), and the HLO's text of them."""
    key = 'source_target_pairs=' if 'source_target_pairs=' in line else 'replica_groups='
    at = line.find(key)
    if at < 0:
        return None, ''
    rest = line[at + len(key) :]
    if rest.startswith('{'):
        depth, end = 0, len(rest)
        for j, ch in enumerate(rest):
            depth += (ch == '{') - (ch == '}')
            if depth == 0:
                end = j + 1
                break
        text = rest[:end]
        groups = [
            [int(x) for x in g.split(',') if x.strip()]
            for g in re.findall(r'\{([\d,\s]*)\}', text[1:-1])
        ]
        return (groups or None), text
    m = _MESH.match(rest)
    if m:
        return _mesh_groups(m.group(1), m.group(2), notes), m.group(0)
    m = _IOTA.match(rest)
    if m:
        shape = [int(x) for x in m.group(1).split(',')]
        dims = [int(x) for x in m.group(2).split(',')]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(',')])
        return ids.reshape(shape[0], -1).tolist(), m.group(0)
    text = rest.split(', ')[0]
    notes.append(f'replica groups not read: {text[:80]}')
    return [], text


def _mesh_groups(mesh_text: str, axes_text: str, notes: list[str]) -> list[list[int]] | None:
    """``mesh['a'=4,'b'=4] {'a'}`` -> groups of iota ids varying along ``a``."""
    sizes = [(n, int(s)) for n, s, _, _ in _AXIS.findall(mesh_text) if s]
    grouped = [(n, pre) for n, _, pre, _ in _AXIS.findall(axes_text)]
    if not sizes or any(pre for _, pre in grouped) or re.search(r'device_ids|<=', mesh_text):
        notes.append(f'replica groups not read: mesh[{mesh_text[:60]}] {{{axes_text[:40]}}}')
        return []
    names = [n for n, _ in sizes]
    shape = [s for _, s in sizes]
    keep = [names.index(n) for n, _ in grouped if n in names]
    rest = [i for i in range(len(names)) if i not in keep]
    ids = np.arange(math.prod(shape)).reshape(shape).transpose(rest + keep)
    return ids.reshape(-1, math.prod(shape[i] for i in keep)).tolist()


def _device_groups(
    logical: list[list[int]] | None, hlo: _Hlo, devices: list[Any], dcn: bool
) -> list[list[int]]:
    """Groups as indices into ``devices``. A program XLA split per slice (fewer partitions
    than devices) holds each group once per slice; a DCN transfer pairs each position across
    the slices; no groups: all devices."""
    n = len(devices)
    if not n:
        return [list(g) for g in logical or []]
    per = hlo.partitions if 0 < hlo.partitions < n and n % hlo.partitions == 0 else n
    parts = [list(range(k, k + per)) for k in range(0, n, per)]
    by_slice: dict[Any, list[int]] = {}
    for i, d in enumerate(devices):
        by_slice.setdefault(getattr(d, 'slice_index', None), []).append(i)
    if per < n and len(by_slice) == n // per and all(len(v) == per for v in by_slice.values()):
        parts = list(by_slice.values())  # logical id i of slice s: slice s's i-th device
    if dcn:
        return [[part[i] for part in parts] for i in range(per)]
    if logical is None:
        return parts
    return [[part[i] for i in g if i < per] for part in parts for g in logical]


def _process_groups(groups: list[list[int]], devices: list[Any]) -> tuple[tuple[int, ...], ...]:
    if not devices:
        return ()
    seen = {tuple(sorted({int(devices[i].process_index) for i in g})) for g in groups if g}
    return tuple(sorted(seen))


def _axes(
    groups: list[list[int]], devices: list[Any], mesh: tuple[dict[int, Any], tuple[str, ...]]
) -> tuple[str, ...]:
    """The mesh axes along which the devices of some group differ (in the mesh's order);
    ``mesh``: (device id -> its mesh index, the axis names)."""
    where, names = mesh
    if not where or not devices:
        return ()
    varying: set[int] = set()
    for g in groups:
        coords = [where.get(devices[i].id) for i in g]
        if any(c is None for c in coords) or len(coords) < 2:
            continue
        arr = np.array(coords)
        varying |= {a for a in range(arr.shape[1]) if len(set(arr[:, a].tolist())) > 1}
    return tuple(names[a] for a in sorted(varying))
