"""A dump's device memory on this machine's devices, and the words `multihost analyze` gives it.

One process: 64 MiB put on the first device, then this host's dump document
(`multihost._job._dump.document`, as a hang dump writes it) read back like a dump file:
``memory`` is each device's `Device.memory_stats` (bytes in use, peak, limit), read from the
host's allocator; the words are `multihost._models._analyze.memory_words` (the line of a
verdict whose hosts are all inside one launch). A CPU reports none: the words say so.

Usage: ``python bench/dump_memory.py [--json PATH]``; the result goes to
``bench/results/<device kind>/dump_memory.json`` (`_results`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--json', default='')
    args = parser.parse_args(argv)
    import _results
    import jax
    import jax.numpy as jnp

    from multihost._job import _dump
    from multihost._models import _analyze, _dumpfile

    x = jnp.ones((4096, 4096), jnp.float32)  # 64 MiB in use
    x.block_until_ready()
    t0 = time.perf_counter()
    doc = _dump.document('request')
    took = time.perf_counter() - t0
    doc.update(format=_dumpfile.FORMAT, version=_dumpfile.VERSION)
    dump = _dumpfile.parse(json.loads(json.dumps(doc, default=str)))
    dev = jax.devices()[0]
    got = {
        'platform': doc['platform'],
        'memory': doc['memory'],
        'words': _analyze.memory_words([dump]),
        'document_s': took,
    }
    print(json.dumps(got))
    print('written to', _results.save('dump_memory', got, dev.device_kind, args.json))
    return 0


if __name__ == '__main__':
    sys.exit(main())
