"""Small hand-built models the view tests share: a tree diff, a step table, hosts' stacks.

Importable from test modules as ``from _view_models import ...``. Pure
models (no device, no cluster), built with the model constructors as an
engine would send them; the synthetic layouts are in `_layout_cases`.
"""

from __future__ import annotations

import numpy as np

from multihost import CollectiveRecord, HostStacks, LeafDiff, StepTable, ThreadStack, TreeDiff


def value_leaf(odd: int = 2, hosts: int = 4) -> LeafDiff:
    """``['params']['w']``, float32[2, 2]: one element differs (by 0.5) on host ``odd``."""
    ref = np.array([[1, 2], [3, 4]], np.float32)
    values = {h: ref.copy() for h in range(hosts)}
    values[odd] = np.array([[1, 2], [3, 4.5]], np.float32)
    return LeafDiff(
        path="['params']['w']",
        kind='value',
        odd_processes=(odd,),
        majority_processes=tuple(h for h in range(hosts) if h != odd),
        shapes=dict.fromkeys(range(hosts), (2, 2)),
        dtypes=dict.fromkeys(range(hosts), 'float32'),
        digests={h: 'bbbb' if h == odd else 'aaaa' for h in range(hosts)},
        num_different={odd: 1},
        max_abs_diff={odd: 0.5},
        first_index={odd: (1, 1)},
        values=values,
    )


def shape_leaf() -> LeafDiff:
    """``['b']``: float32[3] on hosts 0, 2, 3, float32[4] on host 1."""
    return LeafDiff(
        path="['b']",
        kind='shape',
        odd_processes=(1,),
        majority_processes=(0, 2, 3),
        shapes={0: (3,), 1: (4,), 2: (3,), 3: (3,)},
        dtypes=dict.fromkeys(range(4), 'float32'),
        digests={0: 'x', 1: 'y', 2: 'x', 3: 'x'},
    )


def tree_diff() -> TreeDiff:
    """Four hosts, 7 leaves, two of them differ: `value_leaf` (host 2), `shape_leaf` (host 1)."""
    return TreeDiff(leaves=(value_leaf(), shape_leaf()), num_processes=4, num_leaves=7)


def record(
    seq: int, p: int, name: str = 'a', site: str = '/src/train.py:10', kind: str = 'barrier'
) -> CollectiveRecord:
    """Process ``p``'s collective number ``seq``."""
    return CollectiveRecord(
        seq=seq, kind=kind, name=name, digest='', site=site, time=0.0, process=p
    )


def step_table(divergent: bool = True) -> StepTable:
    """Step 3 passed; step 4: hosts 0, 1 wait at the gate, 2 odd (if divergent), 3 missing."""
    records = [record(3, p) for p in range(4)] + [record(4, 0, 'b'), record(4, 1, 'b')]
    records.append(record(4, 2, 'c', '/src/train.py:20') if divergent else record(4, 2, 'b'))
    return StepTable.build(
        records, released=[3], num_processes=4, stepping=True, waiting=[(4, 0), (4, 1)], time=1.7e9
    )


def _main_thread(line: int, name: str) -> ThreadStack:
    """A main thread in ``train()`` at ``/src/train.py:<line>``, in barrier ``name``."""
    frames = (
        ('/src/train.py', 30, 'main', 'train()'),
        ('/src/train.py', line, 'train', f"sync_global_devices('{name}')"),
    )
    return ThreadStack('MainThread', 1, True, False, frames)


def host_stacks() -> dict[int, HostStacks]:
    """Hosts 0-2 in barrier #4 at the gate (host 2 elsewhere in the code), host 3 no answer."""
    helper = ThreadStack('loader', 2, False, True, (('/src/data.py', 5, 'load', 'q.get()'),))
    out = {}
    for p in range(3):
        line, name = (20, 'c') if p == 2 else (10, 'b')
        out[p] = HostStacks(
            process=p,
            answered=True,
            hostname=f'node{p}',
            os_pid=100 + p,
            current=record(4, p, name, f'/src/train.py:{line}'),
            gate=4,
            stepping=True,
            where='train.py:10 in train',
            threads=(_main_thread(line, name), helper),
            time=1.7e9,
        )
    out[3] = HostStacks(process=3, answered=False, current=record(3, 3), error='no answer in 5 s')
    return out
