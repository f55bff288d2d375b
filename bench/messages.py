"""Key-value message sizes of every cross-host exchange at 4, 64 and 1,000 hosts.

Usage::

    python bench/messages.py [--hosts 4,64,1000] [--leaves 10000] [--markdown]

Method
------
Nothing here is extrapolated from timings: the sizes of what one host
publishes are measured on a real 2-process `LocalCluster` (a collective
record, a watched launch's record, `HostStacks` / `HostFront` replies, 200
flight records, the environment and memory-census rows), or built with the
code's own encoders (`_rowdiff.dumps` / `_rowdiff.delta` of 10,000 realistic
tree-diff rows). Each exchange is then laid out at N hosts with `_kv`'s own
rules (`_kv.dir_cap`: a host's share of a directory read, 786 bytes at 1,000
hosts; `_kv.layout`: larger values become a header plus chunks of at most
`_kv.MAX_BYTES`, one RPC each) and `_rowdiff`'s choice of path (every
distinct list up to 64 hosts, the reference list plus deltas above).

Per operation and N, for the host that reads the most: the bytes it reads
in total, its largest single read (a directory listing or one chunk: always
<= 1 MiB), and its key-value RPCs. A worker's stacks in a notebook engine
hold more threads than a `LocalCluster` worker's (ipykernel's): read those
rows as a lower bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import _common
import numpy as np

from multihost._checks import _rowdiff, _treediff
from multihost._exchange import _bus, _kv

KEY = 24  # bytes of a key in a directory listing, e.g. 'mh/e/15/1000/delta/d/999'
HEADER = 40  # a chunked value's header under its key


def _measure() -> dict[str, int]:
    """In a worker: the size of what one host publishes in each exchange (bytes)."""
    import jax
    import jax.numpy as jnp

    import multihost
    from multihost import _recorder
    from multihost._checks import _census
    from multihost._debug import _stacks, _wavefront
    from multihost._exchange import _sequence

    step = multihost.watch(jax.jit(lambda x: x * 2.0), name='train_step')
    x = jnp.ones(8)
    for _ in range(250):
        step(x)
    multihost.process_allgather(np.arange(4))
    multihost.barrier('checkpoint/step_000250')
    pid = jax.process_index()
    records = _recorder.snapshot(pid, 200)
    env = sorted(_census.environment().items())
    summary, kinds = _census._host_memory(None)
    launch = next(r for r in reversed(_sequence.history()) if r.kind == 'launch')
    return {
        'record': len(_sequence.current().to_json()),  # type: ignore[union-attr]
        'launch record': len(launch.to_json()) + len(',"data":""'),
        'stacks reply': len(_stacks.capture().to_json()),
        'front reply': len(_wavefront.front().to_json()),
        'records reply (200)': len(
            json.dumps([dataclasses.astuple(r) for r in records], separators=(',', ':'))
        ),
        'env rows': len(_rowdiff.dumps([(k, _census._value_digest(v)) for k, v in env])),
        'env keys': len(env),
        'memory summary': len(json.dumps(summary)),
        'memory kinds rows': len(
            _rowdiff.dumps([(k, _census._value_digest(v)) for k, v in kinds.items()])
        ),
        'daemon info': 130,
    }


def _tree_rows(leaves: int) -> list[list[str]]:
    """Realistic tree-diff rows: transformer-like paths, bf16 matrices."""
    names = ('attention/query/kernel', 'attention/key/kernel', 'attention/value/kernel')
    names += ('attention/out/kernel', 'mlp/up/kernel', 'mlp/down/kernel', 'norm/scale')
    rows = []
    for i in range(leaves):
        path = f"['params']['layer_{i // len(names):04d}']['{names[i % len(names)]}']"
        digest = f'{(i * 2654435761) % (1 << 64):016x}'
        sig = _treediff._Print((1024, 1024), 'bfloat16', digest, 2 << 20, True)
        rows.append([path, _treediff._row_value(sig)])
    return rows


@dataclasses.dataclass
class Cost:
    """What one host reads: bytes in total, the largest single read, RPCs."""

    total: int = 0
    largest: int = 0
    rpcs: int = 0

    def read(self, nbytes: int, rpcs: int = 1) -> None:
        self.total += nbytes
        self.largest = max(self.largest, nbytes)
        self.rpcs += rpcs

    def value(self, size: int) -> None:
        """One value read on its own (a key, or a chunked value's chunks)."""
        if size <= _kv.MAX_BYTES:
            self.read(size)
        else:
            for start in range(0, size, _kv.MAX_BYTES):
                self.read(min(_kv.MAX_BYTES, size - start))

    def round_(self, n: int, sizes: list[int], publish: int = 2) -> None:
        """A `_kv` round: publish + barrier, one directory read, then each chunked value."""
        cap = _kv.dir_cap(n)
        self.rpcs += publish
        listing = sum(KEY + (s if s <= cap else HEADER) for s in sizes)
        self.read(listing)
        for s in sizes:
            if s > cap:
                self.value(s)

    def agreed(self, n: int, sizes: list[int], publish: int = 2) -> None:
        """A round that agrees (`_kv.round_`'s ``agree``): above `_kv.DIGEST_ABOVE` hosts
        one more create (the digest key) and one listing of the agreement directory, which
        holds one key (`mh/e/<epoch>/<k>/g/<20 hex digits>`); else `round_`."""
        if n <= _kv.DIGEST_ABOVE:
            self.round_(n, sizes, publish)
            return
        self.rpcs += publish + 1
        self.read(len(f'mh/e/{n // 64}/{n}/g/') + 20)

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.total + other.total, max(self.largest, other.largest), self.rpcs + other.rpcs
        )


def _costs(n: int, m: dict[str, int], leaves: int) -> dict[str, Cost]:
    rows = _tree_rows(leaves)
    odd = [
        *rows[:4242],
        [rows[4242][0], rows[4242][1][:-26] + 'f' * 16 + '|2097152|1'],
        *rows[4243:],
    ]
    tree_list = len(_rowdiff.dumps(rows))
    tree_delta = len(json.dumps(_rowdiff.delta(rows, odd), separators=(',', ':')))
    out: dict[str, Cost] = {}

    def new() -> Cost:
        return Cost()

    c = out['barrier / sequence check'] = new()
    c.agreed(n, [m['record']] * n)
    c = out['watched call (signature seen)'] = new()
    c.agreed(n, [m['launch record']] * n)
    c = out[f'assert_equal, equal trees ({leaves:,} leaves)'] = new()
    c.agreed(n, [m['record']] * n)
    c.agreed(n, [32] * n)  # the fingerprint heads (`share(same=True)`)

    label = f'tree_diff, 1 host differs in 1 leaf ({leaves:,} leaves)'
    c = out[label] = new()
    c.agreed(n, [m['record']] * n)
    c.agreed(n, [32] * n)
    if n > _kv.DIGEST_ABOVE:
        c.round_(n, [32] * n, publish=0)  # the heads differ: every host's is read
    if n <= _rowdiff.REFERENCE_ABOVE:
        c.round_(n, [tree_list, tree_list] + [0] * (n - 2))
    else:
        c.round_(n, [0] * n)  # 'ref': the reference's list is there
        c.value(tree_list)  # the odd host reads it (the others do not)
        c.round_(n, [tree_delta] + [0] * (n - 1))
    c.round_(n, [120] + [20] * (n - 1))  # 'sum': the odd host's summary
    c = out[label + ', before'] = new()
    c.round_(n, [m['record']] * n)
    c.round_(n, [32] * n)
    c.round_(n, [tree_list] * n)
    c.round_(n, [120] + [20] * (n - 1))

    c = out['check_replicas, P() (8 devices per host)'] = new()
    c.agreed(n, [m['record']] * n)
    if n > _kv.DIGEST_ABOVE:
        c.rpcs += 1  # the block's reference: a create (first writer) ...
        c.read(32)  # ... or, for every other holder, one get of the reference digest
    c.agreed(n, [8 * 26] * n)

    env_delta = 4 * 60  # the host name's row (and a few per-host keys) against the reference
    c = out['env_diff (host names differ)'] = new()
    c.agreed(n, [m['record']] * n)
    c.round_(n, [32] * n)
    if n <= _rowdiff.REFERENCE_ABOVE:
        c.round_(n, [m['env rows']] * n)
    else:
        c.round_(n, [0] * n)
        c.value(m['env rows'])  # every host is a representative: reads the reference's rows
        c.round_(n, [env_delta] * n)
    c.round_(n, [40] * n)  # 'vals': each host's name
    c = out['memory_census (all hosts alike)'] = new()
    c.agreed(n, [m['record']] * n)
    c.round_(n, [m['memory summary']] * n)
    c.round_(n, [32] * n)

    for label, reply in (
        ('where (the issuer)', m['stacks reply']),
        ('wavefront (the issuer)', m['front reply']),
        ('flight_records(200) (the issuer)', m['records reply (200)']),
    ):
        c = out[label] = new()
        c.rpcs += 4  # counter, command, the wait for mh/rep/<g>/all, the delete
        c.read(sum(KEY + min(m['daemon info'], _kv.MAX_BYTES) for _ in range(n)))  # mh/dmn/
        # Batches of mh/rep/<g>/ as `_bus._reply` places them (offset // `_batch_bytes()`).
        inline = reply if reply <= _bus._inline() else _bus._HEADER
        batches: dict[int, int] = {}
        offset = 0
        for _ in range(n):
            batches[offset // _bus._batch_bytes()] = batches.get(offset // _bus._batch_bytes(), 0)
            batches[offset // _bus._batch_bytes()] += KEY + inline
            offset += inline + _bus._KEY_BYTES
        for nbytes in batches.values():  # one read per batch, then chunked replies
            c.read(nbytes)
        for _ in range(n if reply > _bus._inline() else 0):
            c.value(reply)
    c = out['step_table'] = new()
    for _ in range(8):  # the ring's slots
        c.read(n * (KEY + min(m['record'], _kv.dir_cap(n))))
    c.read(KEY * 8)
    return out


def _fmt(nbytes: float) -> str:
    for unit, scale in (('MB', 1e6), ('KB', 1e3)):
        if nbytes >= scale:
            return f'{nbytes / scale:.3g} {unit}'
    return f'{int(nbytes)} B'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', default='4,64,1000')
    parser.add_argument('--leaves', type=int, default=10_000)
    parser.add_argument('--markdown', action='store_true', help='print a Markdown table')
    args = parser.parse_args(argv)
    ns = [int(x) for x in args.hosts.split(',')]
    with _common.local_cluster(2, 1) as cluster:
        measured = cluster.run(_measure, timeout=300)[1]
    print('measured per host (bytes):', json.dumps(measured))
    rows = _tree_rows(args.leaves)
    print(
        f'tree-diff list of {args.leaves:,} leaves: {_fmt(len(_rowdiff.dumps(rows)))}; '
        f"a host's share of a directory read: "
        + ', '.join(f'{_kv.dir_cap(n)} B at N={n}' for n in ns)
    )
    table = {n: _costs(n, measured, args.leaves) for n in ns}
    ops = list(table[ns[0]])
    if args.markdown:
        print('\n| operation | ' + ' | '.join(f'N = {n:,}' for n in ns) + ' |')
        print('|---|' + '---|' * len(ns))
    else:
        print('\nper operation: total read / largest read / RPCs of the busiest host')
    for op in ops:
        cells = [
            f'{_fmt(table[n][op].total)} / {_fmt(table[n][op].largest)} / {table[n][op].rpcs}'
            for n in ns
        ]
        if args.markdown:
            print(f'| {op} | ' + ' | '.join(cells) + ' |')
        else:
            print(f'  {op:<58}' + ''.join(f'{cell:>30}' for cell in cells))
    worst = max(table[n][op].largest for n in ns for op in ops if not op.endswith('before'))
    print(f'\nlargest single read anywhere (new exchanges): {_fmt(worst)}')
    assert worst <= _kv.MAX_BYTES
    print(f'1 MiB = {_kv.MAX_BYTES:,} bytes; ceil(x / 1 MiB) chunk reads per larger value')
    return 0


if __name__ == '__main__':
    sys.exit(main())
