"""What the tests switch (`Config`, through `configured`) and the package's one cache (`Cache`).

Production code reads `CONFIG` and never changes it; its cache keys carry no switch:
`configured` empties `CACHE` when it changes the configuration and when it restores it,
so nothing planned or compiled under one configuration is used under another.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

#: Dtypes whose small leaves a device that is not a CPU packs into one buffer per call, one
#: copy to the host (a TPU copies each buffer apart, at a cost per copy): XLA keeps these dtypes'
#: bits in a concatenation. Not bfloat16 (a concatenation may rewrite its bits on a TPU and
#: on XLA:CPU: `bench/tpu_fingerprints.py`'s exactness section checks): its 1-D leaves of
#: whole DMA tiles are packed by DMA on a TPU (`pallas.dma_pack`).
PACK_DTYPES = frozenset({'float32', 'int32', 'uint32', 'int8', 'uint8', 'bool'})


@dataclasses.dataclass
class Config:
    """What the plan may be told besides the leaves (the defaults are production's)."""

    #: Plan as if every device were of this platform ('' : each device's own). The tests
    #: force ``'tpu'`` on CPU devices: the routes a TPU takes (Pallas kernels, run in Pallas'
    #: interpret mode off a TPU; small leaves packed) checked against the definition.
    platform: str = ''
    #: Each array's stored order of axes (None: `layout.stored_order`, the device's layout):
    #: the tests give a TPU's orders to CPU arrays.
    stored_order: Callable[[Any], tuple[int, ...]] | None = None
    #: Blocks of one shape and dtype in one program, at most (their count rounded up to a
    #: power of two: few programs).
    max_group: int = 16
    #: Small leaves per packing program, at most (its compile grows faster than its leaves:
    #: `bench/tpu_fingerprints.py`'s 1,000-leaf row measures the first call).
    max_pack: int = 64
    #: 32-bit words per chunk of `words.chunk_out` (whole leaves of 2- and 4-byte dtypes on a
    #: CPU device; a multiple of `definition.ROW_WORDS`): one program for every leaf size.
    cpu_chunk_words: int = 1 << 17
    #: See `PACK_DTYPES`.
    pack_dtypes: frozenset[str] = PACK_DTYPES


#: The configuration in force.
CONFIG = Config()


_MISSING = object()


class Cache:
    """The package's answers that are the same at every call, by section (what a block is
    routed to by dtype, shape and sharding; compiled programs by what they were compiled
    for; the numpy terms of a tree's small leaves), each section bounded: past its limit the
    oldest entry goes (a process that keeps making new shardings or shapes stays bounded)."""

    #: Entries per section, at most (`DEFAULT_LIMIT` for sections not named).
    LIMITS = {'programs': 512, 'plans': 16, 'word_terms': 8, 'row_layout': 64}
    DEFAULT_LIMIT = 4096

    def __init__(self) -> None:
        self._sections: dict[str, dict[Any, Any]] = {}

    def get(self, section: str, key: Any, compute: Callable[..., Any], *args: Any) -> Any:
        """The answer kept for ``key`` in ``section``, else ``compute(*args)``, kept; not kept
        where ``key`` cannot be one (a sharding that is not hashable)."""
        kept = self._sections.get(section)
        try:
            got = _MISSING if kept is None else kept.get(key, _MISSING)
        except TypeError:
            return compute(*args)
        return self.put(section, key, compute(*args)) if got is _MISSING else got

    def put(self, section: str, key: Any, value: Any) -> Any:
        kept = self._sections.setdefault(section, {})
        kept[key] = value
        limit = self.LIMITS.get(section, self.DEFAULT_LIMIT)
        while len(kept) > limit:
            del kept[next(iter(kept))]
        return value

    def peek(self, section: str, key: Any) -> Any:
        """The answer kept for ``key`` in ``section``, or None."""
        kept = self._sections.get(section)
        return None if kept is None else kept.get(key)

    def clear(self) -> None:
        """Forgets everything (compiled programs included)."""
        self._sections.clear()

    def __len__(self) -> int:
        return sum(len(s) for s in self._sections.values())


#: The cache of this process.
CACHE = Cache()


@contextlib.contextmanager
def configured(**changes: Any) -> Iterator[Config]:
    """`CONFIG` with ``changes`` inside the block (the tests' switch), `CACHE` emptied on the
    way in and out."""
    old = dataclasses.replace(CONFIG)
    for name, value in changes.items():
        if not hasattr(CONFIG, name):
            raise AttributeError(f'no fingerprint setting {name!r}')
        setattr(CONFIG, name, value)
    CACHE.clear()
    try:
        yield CONFIG
    finally:
        for field in dataclasses.fields(Config):
            setattr(CONFIG, field.name, getattr(old, field.name))
        CACHE.clear()
