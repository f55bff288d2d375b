"""Pooled buffers gathers are written into: shared-memory files and anonymous memory.

Files live in ``/dev/shm``, are named after this process (``_cleanup.shm_prefix``:
swept once the owner is gone) and have mode 0600.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
from typing import TYPE_CHECKING, Any

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

    def __len__(self) -> int:
        return self.size


class _Pool:
    """Buffers reused once the result they hold is dropped (the usual debugging loop
    gathers the same variable again). Free buffers above ``keep_bytes`` are
    dropped; `close` drops the free ones and any released later."""

    def __init__(self, keep_bytes: int = 1 << 30):
        self.keep_bytes = keep_bytes
        self.free: list[Any] = []
        self.closed = False
        self._lock = threading.Lock()

    def _new(self, size: int) -> Any:
        raise NotImplementedError

    def _drop(self, buf: Any) -> None:
        """Lets a buffer go (nothing to do for memory unmapped once unreferenced)."""

    def acquire(self, size: int) -> Any:
        """A free buffer of ``size`` to twice that many bytes, else a new one."""
        with self._lock:
            fits = [b for b in self.free if size <= len(b) <= 2 * size]
            if fits:
                buf = min(fits, key=len)
                self.free = [b for b in self.free if b is not buf]
                return buf
        return self._new(size)

    def release(self, buf: Any) -> None:
        with self._lock:
            if not self.closed:
                self.free.append(buf)
                while sum(len(b) for b in self.free) > self.keep_bytes:
                    self._drop(self.free.pop(0))
                return
        self._drop(buf)

    def clear(self) -> None:
        """Drops the free buffers (the next gather starts from new ones); stays open."""
        with self._lock:
            free, self.free = self.free, []
        for buf in free:
            self._drop(buf)

    def close(self) -> None:
        """Drops the free buffers; buffers released later are dropped at once."""
        with self._lock:
            self.closed = True
        self.clear()


class ShmPool(_Pool):
    """Shared-memory files the engines write gathers into (`Buffer`).

    A fresh file costs first-touch page faults on every page, in the engines
    and here; a reused one costs none. Dropping a file unlinks it; results
    still held stay valid (unlinked files live while mapped).
    """

    def _new(self, size: int) -> Buffer:
        # Named after this process (swept once it is gone, see _cleanup), mode 0600.
        fd, path = tempfile.mkstemp(prefix=shm_prefix(), dir=SHM_DIR)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return Buffer(path, size)

    def _drop(self, buf: Buffer) -> None:
        _unlink(buf)


class HeapPool(_Pool):
    """Result memory of network gathers: anonymous `mmap.mmap` objects.

    A new buffer is asked for huge pages and populated in one call
    (``MADV_POPULATE_WRITE``, Linux 5.14+) before the hosts send: page faults
    taken one by one inside ``recv_into`` made a first gather 1.5-4x slower,
    and unpredictably so. A reused buffer is already in place.
    """

    def _new(self, size: int) -> mmap.mmap:
        mm = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for advice in ('MADV_HUGEPAGE', 'MADV_POPULATE_WRITE'):
            # MADV_POPULATE_WRITE is 23 on Linux; Python < 3.13 has no name for it.
            code = getattr(mmap, advice, 23 if advice == 'MADV_POPULATE_WRITE' else None)
            try:
                if code is not None:
                    mm.madvise(code)
            except OSError:  # an older kernel: pages come as they are touched
                pass
        return mm


def _unlink(buf: Buffer) -> None:
    try:
        os.unlink(buf.path)
    except FileNotFoundError:
        pass
