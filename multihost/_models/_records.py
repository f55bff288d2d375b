"""The collective record: one collective call as a host published it (plain, picklable data).

The key-value sequence (`multihost._exchange._sequence`) publishes and judges these; the step
table and the stack model read them. Standard library only.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    """One collective call as a host recorded it.

    Attributes:
        seq: position in this process's collective sequence (0-based).
        kind: which collective (``'barrier'``, ``'process_allgather'``, ...).
        name: barrier name, or a short description for other collectives.
        digest: hex digest of the tree structure, shapes and dtypes involved
            (empty for barriers).
        site: the caller's ``file:line`` outside `multihost`.
        time: wall-clock time (``time.time()``) when the call was entered.
        process: the process index that made the call.
        fail: why this host could not take part (`fail_turn`), else empty.
        lane: empty for the main thread's collectives; off the main thread,
            what matches them across hosts (`_threads`): ``'n:<barrier
            name>'`` or ``'t:<thread name>'``; ``seq`` is then the count in
            that lane.
        thread: the calling thread's name, off the main thread (else empty).
    """

    seq: int
    kind: str
    name: str
    digest: str
    site: str
    time: float
    process: int
    fail: str = ''
    lane: str = ''
    thread: str = ''

    def to_json(self, payload: bytes | None = None) -> str:
        """The record as published; ``payload`` rides along, base64, as a last field ``data``."""
        # Fields in declaration order, "seq" first (rounds recognise a record by
        # its prefix); no `dataclasses.asdict`, which deep-copies (hot path).
        fields: dict[str, Any] = {f: getattr(self, f) for f in _PUBLISHED_FIELDS}
        if self.lane:  # off the main thread only: main-thread records stay as they were
            fields['lane'], fields['thread'] = self.lane, self.thread
        if payload is not None:
            fields['data'] = base64.b64encode(payload).decode()
        return json.dumps(fields, separators=(',', ':'))

    @classmethod
    def from_json(cls, text: str) -> CollectiveRecord:
        raw = json.loads(text)
        return cls(**{f: raw[f] for f in _RECORD_FIELDS if f in raw})

    def describe(self) -> str:
        """A one-line human description: ``sync_global_devices('ckpt') at train.py:42``."""
        what = f'{self.kind}({self.name!r})' if self.name else self.kind
        if self.lane.startswith('n:'):  # matched by name: its count says little
            return f'{what} at {self.site} [thread {self.thread!r}]'
        if self.lane:
            return f'{what} at {self.site} [thread {self.thread!r} #{self.seq}]'
        return f'{what} at {self.site} [#{self.seq}]'


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(CollectiveRecord))
#: What every record publishes (``lane`` and ``thread`` only when set).
_PUBLISHED_FIELDS = _RECORD_FIELDS[:-2]
