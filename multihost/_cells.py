"""Notebook cells as IPython names them: ``Cell In[4], line 3``, never the kernel's file.

ipykernel compiles each cell under a file of its own, ``<tmp>/ipykernel_<pid>/
<hash of the code>.py`` (``ipykernel.compiler.get_file_name``; older
IPython: ``<ipython-input-<n>-<hash>>``), and its compiler
(`IPython.core.compilerop.CachingCompiler`) remembers which execution count
each file had: ``format_code_name(file)`` is ``('Cell', 'In[4]')``, the
words IPython's own tracebacks use. An ipyparallel engine runs such a shell,
so on every host the count is the one that host's IPython gave the cell (the
engine's ``In[n]``, which the tracebacks of a failed ``%%mh`` cell show too).

Looked up where the place is taken, on the host that ran the cell: the
engine side imports no IPython, so only a shell already running in this
process is asked (``sys.modules``), and a process without one keeps its
file names. The same code run again gets the same file and a new count:
the count is read each time, never cached.
"""

from __future__ import annotations

import functools
import re
import sys

__all__ = ['cell_count', 'cell_number', 'is_cell', 'place']

# ipykernel: <tmp>/ipykernel_<pid>/<murmur hash>.py; older IPython: <ipython-input-<n>-<hash>>.
_CELL_FILE = re.compile(r'[/\\]ipykernel_\d+[/\\]\d+\.py$')
_INPUT_CELL = re.compile(r'^<ipython-input-(\d+)-[0-9a-f]+>$')
_COUNT = re.compile(r'^In\[(\d+)\]$')


def is_cell(filename: str) -> bool:
    """Whether a frame's file is a notebook (IPython) cell, by its name alone."""
    return bool(_CELL_FILE.search(filename) or _INPUT_CELL.match(filename))


def cell_number(filename: str) -> int | None:
    """The execution count in a cell's file name, if it carries one (``<ipython-input-4-...>``).

    ipykernel's names (``/tmp/ipykernel_12/345.py``) carry a hash of the
    code instead: `cell_count` asks this process's IPython.
    """
    m = _INPUT_CELL.match(filename)
    return int(m.group(1)) if m else None


def cell_count(filename: str) -> int | None:
    """The execution count this process's IPython gave the cell compiled as ``filename``.

    None when no IPython shell runs here, or it did not compile that file.
    Safe from any thread (the debug thread asks while the shell may be
    adding a cell).
    """
    ipython = sys.modules.get('IPython')  # never imported here: only a shell already running
    if ipython is None:
        return cell_number(filename)
    try:
        shell = ipython.get_ipython()
        name = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # an IPython without format_code_name, or a shell shutting down
        name = None
    if isinstance(name, tuple) and len(name) == 2:
        m = _COUNT.match(str(name[1]))
        if m:
            return int(m.group(1))
    return cell_number(filename)


@functools.lru_cache(maxsize=4096)  # called for every collective's call site
def _maybe_cell(filename: str) -> bool:
    """Whether IPython may have numbered ``filename``: a cell's file, or exec'd code (``<...>``)."""
    return is_cell(filename) or filename.startswith('<')


def place(filename: str, lineno: int, func: str = '') -> str:
    """A place in code as the user reads it: ``Cell In[4], line 3`` (``... in f`` inside a
    function) for a cell this process's IPython numbered, else ``file:line`` (``... in f``).
    """
    inside = f' in {func}' if func and func != '<module>' else ''
    n = cell_count(filename) if _maybe_cell(filename) else None
    if n is not None:
        return f'Cell In[{n}], line {lineno}{inside}'
    return f'{filename}:{lineno}' + (f' in {func}' if func else '')
