"""``%%mh`` on an attached job: `run_cell`, the engine tool that runs a notebook's cell in a
stopped frame, and whether this host allows it (``--allow-exec``: `_Exec`, set by
`multihost.engine.stopped.patch`).
"""

from __future__ import annotations

from typing import Any

from multihost import _names

__all__ = ['run_cell']


class _Exec:
    allowed = False  # install(allow_exec=True) / --allow-exec on this host


def run_cell(namespace: dict[str, Any], code: str) -> str:
    """``%%mh`` on an attached job: runs ``code`` over the stopped frame's names (its module's
    globals, its locals over them: a copy, so what the cell assigns stays in the cell) on
    this thread; what it printed. Only with ``--allow-exec``."""
    import contextlib
    import io

    if not _Exec.allowed:
        raise PermissionError(
            'this job was started without --allow-exec: the control key grants inspection '
            'only (the data magics); restart it with multihost run --allow-exec to run cells'
        )
    namespace.pop(_names.HELD_PLACE, None)
    namespace.pop(_names.HELD_HINT, None)
    out = io.StringIO()
    # Every thread's prints go to the cell while it runs: the main thread is stopped.
    with contextlib.redirect_stdout(out):
        exec(compile(code, '<%%mh cell>', 'exec'), namespace)  # noqa: S102 (opted in)
    return out.getvalue()
