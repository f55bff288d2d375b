"""Pooled shared-memory files that gathers are written into (one pool per `Session`).

Files live in ``/dev/shm``, are named after this process (``_cleanup.shm_prefix``:
swept once the owner is gone) and have mode 0600.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import TYPE_CHECKING

from mhnotebook._cleanup import shm_prefix

if TYPE_CHECKING:  # numpy is imported when the first buffer is made
    import numpy as np

SHM_DIR = '/dev/shm'


class Buffer:
    """One shared-memory file, mapped here (``mm``)."""

    def __init__(self, path: str, size: int):
        import numpy as np

        self.path, self.size = path, size
        self.fresh = True  # no page written yet: the engines fill it with pwrite
        self.mm: np.memmap = np.memmap(path, dtype=np.uint8, mode='r+', shape=(size,))


class ShmPool:
    """Shared-memory files the engines write gathers into, reused once a result is dropped.

    A fresh buffer costs first-touch page faults on every page, in the engines
    and here; a reused one costs none, so gathering the same variable again
    (the usual debugging loop) runs at memory speed. Free buffers above
    ``keep_bytes`` are unlinked. `close` unlinks everything; results still
    held stay valid (unlinked files live while mapped).
    """

    def __init__(self, keep_bytes: int = 1 << 30):
        self.keep_bytes = keep_bytes
        self.free: list[Buffer] = []
        self.closed = False
        self._lock = threading.Lock()

    def acquire(self, size: int) -> Buffer:
        with self._lock:
            fits = [b for b in self.free if size <= b.size <= 2 * size]
            if fits:
                buf = min(fits, key=lambda b: b.size)
                self.free.remove(buf)
                return buf
        # Named after this process (swept once it is gone, see _cleanup), mode 0600.
        fd, path = tempfile.mkstemp(prefix=shm_prefix(), dir=SHM_DIR)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return Buffer(path, size)

    def release(self, buf: Buffer) -> None:
        with self._lock:
            if not self.closed:
                self.free.append(buf)
                while sum(b.size for b in self.free) > self.keep_bytes:
                    _unlink(self.free.pop(0))
                return
        _unlink(buf)

    def clear(self) -> None:
        """Unlinks the free buffers (the next gather starts from fresh files); stays open."""
        with self._lock:
            free, self.free = self.free, []
        for buf in free:
            _unlink(buf)

    def close(self) -> None:
        """Unlinks the free buffers; buffers released later are unlinked at once."""
        with self._lock:
            self.closed = True
        self.clear()


def _unlink(buf: Buffer) -> None:
    try:
        os.unlink(buf.path)
    except FileNotFoundError:
        pass
