"""The cross-process collectives of one compiled program, in its order (pure: no jax).

`multihost._debug._colltable.collective_table` reads them from an executable's optimized HLO;
this module is what it makes, what the flight records and dumps carry (``to_json``) and what
a post-mortem reads back (``from_json``) and words (`CollectiveOp.words`).

What the HLO text tells and what it does not: the order is the scheduled order of the entry
computation (called and fused computations in place of the instruction that calls them, a
loop's body once); an async pair (``all-reduce-start`` / ``-done``) is one collective, at its
start. The device ids of a group are the program's logical ids mapped through its device
assignment; where XLA splits a multi-slice program per slice (TPU multislice), a group of
logical ids is that group in every slice, and the transfers between slices (DCN) are rows of
their own with no replica groups in the text. Whether a collective has started on a device,
or which peer it waits for, is never in the program: only which processes it needs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from multihost._models._hardware import DeviceInfo
from multihost._models._stacks import display_site
from multihost._text import fmt_hosts

#: Device ids kept per collective (all groups together); above it only their processes.
MAX_IDS = 2048
#: Rows kept per program (the rest counted in `CollectiveTable.dropped`).
MAX_OPS = 512
#: Frames kept per row (innermost first).
MAX_FRAMES = 6


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """One collective of a compiled program.

    Attributes:
        index: its position among the program's collectives (0-based).
        kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
            ``collective-permute``, ...; across slices on TPU multislice: the transfer's kind
            (``all-reduce``, ``all-gather``, ...) with ``dcn`` True.
        name: the HLO instruction's name (``all-reduce.4``).
        shape: result type(s) without layouts: ``f32[64]``, ``(f32[8], f32[8,64])``.
        groups: device ids of each replica group (for collective-permute: each source/target
            pair); empty when unknown or above `MAX_IDS` (``groups_text`` keeps the HLO's).
        groups_text: the HLO's own ``replica_groups=`` / ``source_target_pairs=`` text (cut).
        process_groups: the distinct sets of processes the groups span (sorted).
        axes: the mesh axes that vary inside a group (mesh order); empty when no mesh is known
            or none varies.
        crosses_slices: a group holds devices of two slices; None when the program's devices
            are on one slice or say none.
        dcn: a transfer between slices that XLA lowered to host transfers (send/recv).
        computation: the HLO computation it sits in (the entry's name or a called one).
        op_name: the op's name from its metadata (``jit(step)/reduce_sum``).
        frames: ``file:line in function``, innermost first (the stack-frame table, or the
            metadata's source_file/source_line alone).
        site: the innermost frame in the job's own files ('' when none).
        library_site: the innermost frame in a library (jax, flax, optax, ...), '' if none.
    """

    index: int
    kind: str
    name: str
    shape: str
    groups: tuple[tuple[int, ...], ...] = ()
    groups_text: str = ''
    process_groups: tuple[tuple[int, ...], ...] = ()
    axes: tuple[str, ...] = ()
    crosses_slices: bool | None = None
    dcn: bool = False
    computation: str = ''
    op_name: str = ''
    frames: tuple[str, ...] = ()
    site: str = ''
    library_site: str = ''

    @property
    def processes(self) -> tuple[int, ...]:
        """Every process some group of it holds."""
        return tuple(sorted({p for g in self.process_groups for p in g}))

    @property
    def cross_process(self) -> bool:
        """Some group spans two processes (or it crosses slices)."""
        return self.dcn or any(len(g) > 1 for g in self.process_groups)

    def group_of(self, process: int) -> tuple[int, ...]:
        """The processes that meet ``process`` here (every group holding it, joined)."""
        return tuple(sorted({p for g in self.process_groups if process in g for p in g}))

    def words(self, process: int | None = None) -> str:
        """``all-reduce of f32[64] over mesh axis 'data' (processes 0-3), from train.py:88 in
        train_step <- optax/transform.py:120 in update``: the row in a sentence; with
        ``process``, the processes of the groups that hold it."""
        over = ''
        if self.axes:
            word = 'axis' if len(self.axes) == 1 else 'axes'
            over = f' over mesh {word} ' + ', '.join(repr(a) for a in self.axes)
        where = ''
        if self.crosses_slices or self.dcn:
            where = ' across slices' + (' (DCN)' if self.dcn else '')
        elif self.crosses_slices is False:
            where = ' inside a slice'
        who = ''
        if process is not None and self.group_of(process):
            who = f' ({fmt_hosts(self.group_of(process))})'
        elif self.process_groups and not self.cross_process:
            who = ' (inside each process)'
        elif len(self.process_groups) == 1:
            who = f' ({fmt_hosts(self.process_groups[0])})'
        elif self.process_groups:
            shown = '; '.join(fmt_hosts(g) for g in self.process_groups[:3])
            more = '; ...' if len(self.process_groups) > 3 else ''
            who = f' ({len(self.process_groups)} groups: {shown}{more})'
        site, lib = display_site(self.site), display_site(self.library_site)
        line = f'{site} <- {lib}' if site and lib else site or lib
        frm = f', from {line}' if line else ', from no recorded line'
        return f'{self.kind} of {short_shape(self.shape)}{over}{where}{who}{frm}'

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectiveOp:
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for k in ('groups', 'process_groups'):
            kw[k] = tuple(tuple(int(i) for i in g) for g in kw.get(k, ()))
        for k in ('axes', 'frames'):
            kw[k] = tuple(str(x) for x in kw.get(k, ()))
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class CollectiveTable:
    """The collectives of one compiled program, in its order.

    Attributes:
        program: the HLO module's name (``jit_train_step``).
        ops: every collective, in program order (at most `MAX_OPS`).
        num_devices: devices the program runs on.
        processes: the processes those devices belong to.
        mesh_axes: (name, size) of the mesh the groups were named by; empty when none known.
        slices: how many slices the devices span (0 when the devices say none).
        dropped: collectives past `MAX_OPS`, counted only.
        notes: what could not be read (an unparsed group form, no device assignment).
        devices: the program's devices where they have chip coordinates (TPU: the pod
            picture of a collective's groups, `multihost._models._chipgrid.collective_grid`),
            at most `MAX_IDS`; empty elsewhere (CPU).
    """

    program: str
    ops: tuple[CollectiveOp, ...] = ()
    num_devices: int = 0
    processes: tuple[int, ...] = ()
    mesh_axes: tuple[tuple[str, int], ...] = ()
    slices: int = 0
    dropped: int = 0
    notes: tuple[str, ...] = ()
    devices: tuple[DeviceInfo, ...] = ()

    def cross_process(self) -> tuple[CollectiveOp, ...]:
        """The collectives some group of which spans two processes."""
        return tuple(op for op in self.ops if op.cross_process)

    def first_holding(self, processes: Iterable[int]) -> CollectiveOp | None:
        """The first cross-process collective whose groups hold any of ``processes`` (for
        hosts waiting on a peer that never launched: where they wait at the latest)."""
        want = set(processes)
        for op in self.cross_process():
            if want & set(op.processes):
                return op
        return None

    def first_difference(
        self, other: CollectiveTable, *, every: bool = False
    ) -> tuple[int, _Row, _Row] | None:
        """(position, this side's row, the other's) where the two sequences of cross-process
        collectives part (kind, shape, groups), or None when they agree; every collective
        when a table knows no processes (read from HLO text alone) or with ``every`` (those
        inside each process too)."""
        a, b = (self.ops, other.ops) if every else (self._compared(), other._compared())
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else None
            y = b[i] if i < len(b) else None
            if x is None or y is None or _key(x) != _key(y):
                return i, x, y
        return None

    def _compared(self) -> tuple[CollectiveOp, ...]:
        return self.cross_process() if self.processes else self.ops

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(',', ':'))

    @classmethod
    def from_json(cls, text: str) -> CollectiveTable:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectiveTable:
        return cls(
            program=str(d.get('program', '')),
            ops=tuple(CollectiveOp.from_dict(o) for o in d.get('ops', ())),
            num_devices=int(d.get('num_devices', 0)),
            processes=tuple(int(p) for p in d.get('processes', ())),
            mesh_axes=tuple((str(n), int(s)) for n, s in d.get('mesh_axes', ())),
            slices=int(d.get('slices', 0)),
            dropped=int(d.get('dropped', 0)),
            notes=tuple(str(n) for n in d.get('notes', ())),
            devices=tuple(
                DeviceInfo(**{**x, 'coords': tuple(x.get('coords', ()))})
                for x in d.get('devices', ())
            ),  # fmt: skip
        )

    def lines(self) -> list[str]:
        """One line per collective (``#3 all-gather of bf16[64,16] over mesh axis 'model'
        inside a slice (processes 0-3), from train.py:12 in f``), then the notes."""
        out = [f'#{op.index} {op.words()}' for op in self.ops]
        if self.dropped:
            out.append(f'... {self.dropped} more collectives')
        return out + [f'note: {n}' for n in self.notes]

    def __str__(self) -> str:
        head = f'{self.program}: {len(self.ops) + self.dropped} collectives'
        if self.processes:
            head += f' on {self.num_devices} devices of {fmt_hosts(self.processes)}'
        return '\n'.join([head] + ['  ' + line for line in self.lines()])


_Row = CollectiveOp | None
#: A tuple's element shapes shown in words (the rest counted).
MAX_SHAPES = 3
_INDEX_COMMENT = re.compile(r'/\*index=\d+\*/')


def short_shape(shape: str) -> str:
    """``f32[64]`` as it is; a tuple (XLA combined several collectives into one) as ``21
    arrays (f32[32], f32[32], f32[64], ...)``."""
    if not shape.startswith('('):
        return shape
    parts = [p.strip() for p in _INDEX_COMMENT.sub('', shape[1:-1]).split(',') if p.strip()]
    merged: list[str] = []  # 'f32[4', '8]' -> 'f32[4,8]'
    for p in parts:
        if merged and merged[-1].count('[') > merged[-1].count(']'):
            merged[-1] += ',' + p
        else:
            merged.append(p)
    if len(merged) <= MAX_SHAPES:
        return '(' + ', '.join(merged) + ')'
    return f'{len(merged)} arrays (' + ', '.join(merged[:MAX_SHAPES]) + ', ...)'


def _key(op: CollectiveOp) -> tuple[Any, ...]:
    return (op.kind, op.shape, op.groups or op.groups_text, op.dcn)


def user_and_library(
    frames: Sequence[tuple[str, int, str]], is_library: Any
) -> tuple[tuple[str, ...], str, str]:
    """(frames as text, innermost own frame, innermost library frame inside it) of frames
    given innermost first as (file, line, function); ``is_library(file)`` tells a library's
    file. A library frame outside the own one (the harness that called the job) is not named."""
    text = tuple(f'{f}:{n} in {fn}' if fn else f'{f}:{n}' for f, n, fn in frames)
    own = next((i for i, (f, _, _) in enumerate(frames) if not is_library(f)), len(frames))
    site = text[own] if own < len(text) else ''
    lib = text[0] if own > 0 and text else ''  # the library's frame the own one called into
    return text[:MAX_FRAMES], site, lib


def waiting_in(table: CollectiveTable | None, missing: Sequence[int]) -> str:
    """Where hosts inside a launch wait when ``missing`` never launched it, after "wait":
    ``in its first cross-host collective that needs process 3 (#0 of 12): all-reduce of
    f32[64] over mesh axis 'data' (processes 0-3), from train.py:88 in train_step``; '' without
    a table. The device's own position is not seen from the host: the collectives before it
    need only hosts that launched, so this is where they wait at the latest."""
    if table is None or not missing:
        return ''
    if not table.ops:
        why = table.notes[0] if table.notes else 'the program has no collectives recorded'
        return f'inside it; which collective is not known: {why}'
    op = table.first_holding(missing)
    if op is None:
        return (
            f'inside it, whose program has no cross-host collective that needs '
            f'{fmt_hosts(missing)}: on something else (a host callback, the device)'
        )
    return (
        f'in its first cross-host collective that needs {fmt_hosts(missing)} '
        f'(#{op.index} of {len(table.ops) + table.dropped}): {op.words(min(missing))}'
    )


#: Collectives `all_inside_words` names (the rest counted).
MAX_NAMED = 3


def all_inside_words(table: CollectiveTable, label: str) -> str:
    """When every host is inside launch ``label``: its cross-host collectives (every one when
    the table knows no processes), each in words with its line (at most `MAX_NAMED`, the rest
    counted), and that which one each host is in is not seen from the host (the device's
    position is in neither the program nor the dump)."""
    if not table.ops:
        why = table.notes[0] if table.notes else 'the program has no collectives recorded'
        return f'{label}: which collectives the hosts are in is not known: {why}'
    ops = table._compared()
    if not ops:
        return (
            f'{label} has no cross-host collective: the hosts wait on something else (a host '
            'callback, the device)'
        )
    what = 'cross-host collectives' if table.processes else 'collectives'
    named = '; '.join(f'#{op.index} {op.words()}' for op in ops[:MAX_NAMED])
    more = f'; ... {len(ops) - MAX_NAMED} more' if len(ops) > MAX_NAMED else ''
    return f"{label}'s {what} (which one each host is in is not seen from the host): {named}{more}"


def stuck_words(
    table: CollectiveTable | None, label: str, waiting: Sequence[int], missing: Sequence[int]
) -> str:
    """Where hosts inside launch ``label`` wait when ``missing`` never launched it: ``processes
    0-2 wait in train_step call #5's first cross-host collective that needs process 3 (#0 of
    1): all-reduce of f32[64] over mesh axis 'data' (processes 0-3), from train.py:88 in
    train_step; process 3 never launched call #5`` (`waiting_in`). '' without a table."""
    words = waiting_in(table, missing)
    if not words or table is None:
        return ''
    who, gone = fmt_hosts(waiting), fmt_hosts(missing)
    call = label.rpartition(' ')[2] if ' call #' in label else label
    if not table.ops:
        return f'{who} wait inside {label}; ' + words.partition('; ')[2]
    if table.first_holding(missing) is None:
        return f'{who} wait inside {label}, ' + words.partition(', ')[2].replace(
            ': on ', ': they wait on ', 1
        )
    return (
        f"{who} wait in {label}'s "
        + words.removeprefix('in its ')
        + f'; {gone} never launched call {call}'
    )


def by_program(
    tables: Mapping[int, CollectiveTable],
) -> list[tuple[tuple[int, ...], CollectiveTable]]:
    """The hosts' tables of one launch grouped by their sequence of cross-host collectives
    (kind, shape, groups), the most hosts first; tables without rows (not known) left out."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for p, t in sorted(tables.items()):
        if t.ops:
            groups.setdefault(tuple(_key(op) for op in t.ops), []).append(p)
    ordered = sorted(groups.values(), key=lambda ps: (-len(ps), ps[0]))
    return [(tuple(ps), tables[ps[0]]) for ps in ordered]


def parting_lines(tables: Mapping[int, CollectiveTable], label: str) -> tuple[str, ...]:
    """Where the hosts' programs of launch ``label`` part, when their tables differ: ``train_step
    call #1 is not one program on every host: the cross-host collectives of processes 0-2 and
    process 3 part at #3:`` and one line per side, each collective in words
    (`CollectiveOp.words`) with its line. When the cross-host ones agree and only those inside
    each process differ, those are named (the hosts then meet in every collective: the
    difference is in what each computes). () when every known table agrees (programs may
    still differ in what is not a collective). The most hosts' program is compared with each
    other one (at most 3)."""
    groups = by_program(tables)
    if len(groups) < 2:
        return ()
    (ref_ps, ref), out = groups[0], []
    for ps, other in groups[1:4]:
        part, what = ref.first_difference(other), 'cross-host collectives'
        if part is None:
            part = ref.first_difference(other, every=True)
            what = 'collectives (the cross-host ones agree; these are inside each process)'
        if part is None:  # grouped apart by key: cannot happen
            continue
        i, x, y = part
        out.append(
            f'{label} is not one program on every host: the {what} of {fmt_hosts(ref_ps)} '
            f'and {fmt_hosts(ps)} part at #{i}:'
        )
        for who, op in ((ref_ps, x), (ps, y)):
            said = f'#{op.index} {op.words()}' if op else 'no further collective'
            out.append(f'  {fmt_hosts(who)}: {said}')
    if len(groups) > 4:
        out.append(f'  ... {len(groups) - 4} more programs')
    return tuple(out)
