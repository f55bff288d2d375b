"""What the magics print about a result the session gave them (a gathered value, a barrier's
times, a view's caveat, a trace written to disk)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from IPython.core.error import UsageError

from mhnotebook._views import host_local

if TYPE_CHECKING:
    from mhnotebook.widgets import LayoutView, TimelineView, TreeLayoutView


def _nbytes(value: Any) -> int:
    """The bytes of every leaf of ``value`` (a PRNG key leaf: its key data)."""
    import jax

    from mhnotebook._transfer._gather import KeyData

    def one(leaf: Any) -> int:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        return int(np.asarray(leaf.data if isinstance(leaf, KeyData) else leaf).nbytes)

    return sum(one(leaf) for leaf in jax.tree.leaves(value))


def describe(value: Any) -> str:
    """``float32[8, 4] (128.0 B)`` or ``pytree of 6 arrays (1.5 MiB)``."""
    import jax

    leaves = jax.tree.leaves(value)
    size = _nbytes(value)
    unit = next((u for u, s in (('GiB', 30), ('MiB', 20), ('KiB', 10)) if size >= 1 << s), 'B')
    human = f'{size / (1 << {"GiB": 30, "MiB": 20, "KiB": 10, "B": 0}[unit]):.1f} {unit}'
    if isinstance(value, np.ndarray):
        return f'{value.dtype}{list(value.shape)} ({human})'
    return f'pytree of {len(leaves)} arrays ({human})'


def print_gathered(out: str, name: str, hosts: int, value: Any) -> None:
    """The line ``%mh_allgather`` ends with: what was stored under which notebook name."""
    print(f'{out} = {name} gathered from {hosts} processes: {describe(value)}')


def print_barrier(name: str, results: dict[int, dict[str, Any]]) -> None:
    """Each host's time in barrier ``name``, or the error that names who never arrived."""
    for p, r in sorted(results.items()):
        if r['ok']:
            print(f'process {p}: passed {name!r} in {r["elapsed"] * 1e3:.1f} ms')
        elif r.get('busy'):
            print(f'process {p}: busy, its barrier call withdrawn: {r["message"]}')
        else:
            print(f'process {p}: {r["error"]}: {r["message"].splitlines()[0]}')


def note_host_local(name: str, view: LayoutView | TreeLayoutView) -> None:
    """Says so when a layout shows a host-local value: one host's, the others compared elsewhere."""
    from mhnotebook.widgets import LayoutView

    if isinstance(view, LayoutView) and host_local(view.layout):
        print(
            f"{name} is host-local (each process holds its own value): showing process 0's; "
            f'compare the processes with %mh_diff {name}'
        )


def write_chrome_trace(view: TimelineView, path: str) -> None:
    """Writes the timeline ``view`` shows as Chrome trace-event JSON to ``path``, and says so."""
    try:
        written = view.timeline.to_chrome_trace(path)
    except OSError as exc:
        raise UsageError(f'--chrome: cannot write {path!r}: {exc}') from None
    print(
        f'wrote a Chrome trace of {len(view.timeline.steps)} steps (one track per process) '
        f'to {written}: open it in https://ui.perfetto.dev'
    )
