"""The dump file format: ``DIR/process-<i>.json``, what one host left (write, read, validate).

One JSON object per host, written atomically (a temporary file in ``DIR``,
then `os.replace`), at most `MAX_BYTES`. Format ``multihost-dump`` version
`VERSION` (docs/API.md, "Dump files")::

    {"format": "multihost-dump", "version": 1,
     "process": 2, "num_processes": 4, "pid": 4711, "hostname": "node-2",
     "jax_version": "0.10.2", "platform": "cpu", "python": "3.11.9",
     "written": 1764620000.5,
     "trigger": {"what": "timeout", "time": ..., "details": {...}},
     "front": {...},            # `HostFront.to_json` (the wavefront position)
     "stacks": {...},           # `HostStacks.to_json` (every thread, main first)
     "record_fields": [...],    # the `FlightRecord` field names, in order
     "records": [[...], ...],   # flight records oldest first, `dataclasses.astuple`
     "gone": {"3": "no answer to the dump request"},
     "asked": {"trigger": {...}, "front": {...}, "stacks": {...}},  # optional
     "audit": {...},            # optional: `AuditReport.to_json` (--audit)
     "collectives": {"step call #5": {...}},  # optional: the pending launch's
                                # `CollectiveTable` (its collectives, groups, lines)
     "trimmed": {"records": 0, "frames": 0}}

``trigger.what`` is one of `TRIGGERS`. ``asked`` (optional) is what a host wrote
when another asked for its dump (trigger ``request``, the position and main
thread then), kept when a later trigger of its own rewrote the file: the moment
the others missed it. ``trimmed`` says what was cut to stay
under `MAX_BYTES`: the oldest records first, then the deepest frames of
each thread (the outermost ones; the innermost are kept).

Pure functions on files and dicts: `encode` (trims), `write` (atomic),
`read` / `read_dirs` (validate; a bad file is a one-line `DumpFormatError`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from multihost._models._audit import AuditReport
from multihost._models._colltable import CollectiveTable
from multihost._models._stacks import HostStacks
from multihost._models._wavefront import HostFront
from multihost._recorder import FlightRecord

FORMAT = 'multihost-dump'
VERSION = 1
MAX_BYTES = 4 * 1024 * 1024
#: What can make a host write its dump.
TRIGGERS = (
    'timeout',
    'mismatch',
    'preemption',
    'signal',
    'exception',
    'interrupt',
    'hang',
    'request',
    'peer',
    'lost',
)
RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(FlightRecord))
_REQUIRED = ('process', 'num_processes', 'trigger', 'front', 'stacks', 'records')


class DumpFormatError(ValueError):
    """A file that is not a dump this version can read (the message names the file and why)."""


def file_name(process: int) -> str:
    return f'process-{process}.json'


@dataclasses.dataclass(frozen=True)
class Dump:
    """One host's dump, read back (`read`). ``raw`` is the file's object as decoded."""

    path: str
    process: int
    num_processes: int
    hostname: str
    pid: int
    jax_version: str
    written: float
    trigger: str
    trigger_time: float
    details: Mapping[str, Any]
    front: HostFront
    stacks: HostStacks
    records: tuple[FlightRecord, ...]
    gone: Mapping[int, str]
    trimmed: Mapping[str, int]
    #: The dump this host wrote when another asked (``request``), kept by a later one.
    asked: Dump | None = None
    #: The host's audit (``--audit``) when the dump was written.
    audit: AuditReport | None = None
    #: ``jax.default_backend()`` when the dump was written ('' before its backends started,
    #: and in dumps written before this field was).
    platform: str = ''
    #: The collective table of the launch pending at the dump, by its label (``late_step call
    #: #0``); empty when none was made (no installed jit launched it, dumps older than it).
    collectives: Mapping[str, CollectiveTable] = dataclasses.field(default_factory=dict)
    #: Its devices' memory from the host's allocator: ``(device id, bytes in use, peak,
    #: limit)`` each (None where not reported); empty where the backend reports none (CPU).
    memory: tuple[tuple[int, int | None, int | None, int | None], ...] = ()


def encode(doc: dict[str, Any], max_bytes: int = MAX_BYTES) -> str:
    """``doc`` as JSON of at most ``max_bytes``: oldest records, then deep frames, cut first."""
    doc = dict(doc)
    trimmed = {'records': 0, 'frames': 0}
    doc['trimmed'] = trimmed
    text = json.dumps(doc, separators=(',', ':'), default=str)
    records = list(doc.get('records', ()))
    while len(text.encode()) > max_bytes and records:
        over = len(text.encode()) - max_bytes
        per = max(1, len(text.encode()) // max(1, len(records) + 50))
        drop = min(len(records), max(1, over // per + 1))
        records = records[drop:]
        trimmed['records'] += drop
        doc['records'] = records
        text = json.dumps(doc, separators=(',', ':'), default=str)
    depth = 64
    while len(text.encode()) > max_bytes and depth >= 1:
        stacks = dict(doc['stacks'])
        threads = []
        for t in stacks.get('threads', ()):
            t = dict(t)
            frames = list(t.get('frames', ()))
            if len(frames) > depth:
                trimmed['frames'] += len(frames) - depth
                t['frames'] = frames[-depth:]
            threads.append(t)
        stacks['threads'] = threads
        doc['stacks'] = stacks
        text = json.dumps(doc, separators=(',', ':'), default=str)
        depth //= 2
    if len(text.encode()) > max_bytes:
        raise ValueError(f'a dump cannot be made smaller than {max_bytes} bytes')
    return text


def write(directory: str, doc: dict[str, Any], max_bytes: int = MAX_BYTES) -> str:
    """Writes ``doc`` as ``directory/process-<i>.json`` atomically; returns the path."""
    os.makedirs(directory, exist_ok=True)
    text = encode({'format': FORMAT, 'version': VERSION, **doc}, max_bytes)
    path = os.path.join(directory, file_name(int(doc['process'])))
    write_atomic(path, text)
    return path


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` whole or not at all, readable by this user only (0600).

    A temporary file in the same folder (`tempfile.mkstemp` creates it 0600),
    flushed to disk, then `os.replace`: a reader sees the old file or the new
    one, never a part. The dumps and the control endpoint's connection file.
    """
    folder = os.path.dirname(path) or '.'
    fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '-', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _record(fields: list[str], row: list[Any]) -> FlightRecord:
    d = dict(zip(fields, row, strict=False))
    return FlightRecord(**{k: v for k, v in d.items() if k in RECORD_FIELDS})


def parse(doc: Any, path: str = '<dump>') -> Dump:
    """A decoded dump object -> `Dump`; `DumpFormatError` says what is wrong with it."""
    if not isinstance(doc, dict) or doc.get('format') != FORMAT:
        raise DumpFormatError(f'{path}: not a multihost dump (no "format": "{FORMAT}")')
    if doc.get('version') != VERSION:
        raise DumpFormatError(
            f'{path}: dump format version {doc.get("version")!r}, this multihost reads '
            f'version {VERSION}: analyze it with the multihost that wrote it'
        )
    absent = [k for k in _REQUIRED if k not in doc]
    if absent:
        raise DumpFormatError(f'{path}: dump lacks {", ".join(absent)}')
    try:
        fields = list(doc.get('record_fields') or RECORD_FIELDS)
        trigger = doc['trigger']
        dump = Dump(
            path=path,
            process=int(doc['process']),
            num_processes=int(doc['num_processes']),
            hostname=str(doc.get('hostname', '')),
            pid=int(doc.get('pid', 0)),
            jax_version=str(doc.get('jax_version', '')),
            written=float(doc.get('written', 0.0)),
            trigger=str(trigger['what']),
            trigger_time=float(trigger.get('time', 0.0)),
            details=dict(trigger.get('details') or {}),
            front=HostFront.from_json(json.dumps(doc['front'])),
            stacks=HostStacks.from_json(json.dumps(doc['stacks'])),
            records=tuple(_record(fields, r) for r in doc['records']),
            gone={int(p): str(w) for p, w in (doc.get('gone') or {}).items()},
            trimmed=dict(doc.get('trimmed') or {}),
            audit=AuditReport.from_json(doc['audit']) if doc.get('audit') else None,
            platform=str(doc.get('platform', '')),
            collectives={
                str(k): CollectiveTable.from_dict(v)
                for k, v in (doc.get('collectives') or {}).items()
            },
            memory=tuple(
                (int(r[0]), *(None if v is None else int(v) for v in r[1:4]))  # type: ignore[misc]
                for r in doc.get('memory') or ()
            ),
        )
        asked = doc.get('asked')
        if isinstance(asked, dict) and asked:
            when = float(asked['trigger'].get('time', 0.0))
            dump = dataclasses.replace(
                dump,
                asked=dataclasses.replace(
                    dump,
                    trigger=str(asked['trigger']['what']),
                    trigger_time=when,
                    written=when,
                    details=dict(asked['trigger'].get('details') or {}),
                    front=HostFront.from_json(json.dumps(asked['front'])),
                    stacks=HostStacks.from_json(json.dumps(asked['stacks'])),
                    records=tuple(r for r in dump.records if r.time <= when),
                    gone={},
                ),
            )
        return dump
    except (KeyError, TypeError, ValueError) as exc:
        raise DumpFormatError(f'{path}: malformed dump ({type(exc).__name__}: {exc})') from None


def read(path: str) -> Dump:
    """Reads and validates one dump file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as exc:
        raise DumpFormatError(
            f'{path}: not JSON ({exc}); a dump is written whole or not at all'
        ) from None
    return parse(doc, path)


def read_dirs(directories: Iterable[str]) -> list[Dump]:
    """Every ``process-*.json`` in ``directories`` (one per process: the newest kept)."""
    by_process: dict[int, Dump] = {}
    for d in directories:
        if os.path.isfile(d):
            raise DumpFormatError(
                f'{d}: a file; give the directory that holds the dumps '
                f'({os.path.dirname(os.path.abspath(d))}, the --dump-dir of the job)'
            )
        if not os.path.isdir(d):
            raise DumpFormatError(f'{d}: no such directory (give the --dump-dir of the job)')
        for path in sorted(glob.glob(os.path.join(d, 'process-*.json'))):
            dump = read(path)
            old = by_process.get(dump.process)
            if old is None or dump.written > old.written:
                by_process[dump.process] = dump
    return [by_process[p] for p in sorted(by_process)]
