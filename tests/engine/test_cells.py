"""`multihost._cells`: a notebook cell's place as IPython names it (issue 28, item 8).

A real IPython shell in this process numbers the cells it runs; a process
without one (the engine side never imports IPython) keeps file names. The
ipykernel cell files of real engines: `test_notebook_session.py`.
"""

from __future__ import annotations

import subprocess
import sys

from multihost import _cells


def test_a_cell_of_a_real_shell_reads_as_its_traceback_does():
    """Inside a cell the call site is ``Cell In[N], line L``: the words and number IPython's
    own tracebacks give that cell."""
    from _helpers import magic_shell

    ip, _ = magic_shell(None)
    code = (
        'import sys\n'
        'from multihost import _cells\n'
        'from multihost._exchange import _sequence\n'
        'def f():\n'
        '    return _cells.place(sys._getframe().f_code.co_filename, 5, "f")\n'
        'file = sys._getframe().f_code.co_filename\n'
        'here = (f(), _sequence.call_site(), get_ipython().compile.format_code_name(file), file)\n'
    )
    result = ip.run_cell(code, store_history=True)
    assert result.success, result.error_in_exec
    in_f, site, label, file = ip.user_ns['here']
    n = int(label[1][3:-1])  # IPython's own label of the cell: ('Cell', 'In[N]')
    assert label == ('Cell', f'In[{n}]') and n == ip.execution_count - 1
    assert in_f == f'Cell In[{n}], line 5 in f'
    assert site == f'Cell In[{n}], line 7'
    assert _cells.cell_count(file) == n and _cells.cell_count('/home/u/train.py') is None


def test_a_process_without_ipython_keeps_file_names():
    """The engine side imports no IPython: cell files stay ``file:line`` there, and asking
    does not import it."""
    code = (
        'import sys\n'
        'from multihost import _cells\n'
        "print(_cells.place('/tmp/ipykernel_12/345.py', 3))\n"
        "print(_cells.place('<ipython-input-7-0a1b>', 2, 'f'))\n"
        "print(_cells.place('/home/u/train.py', 9, 'step'))\n"
        "print('IPython' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == [
        '/tmp/ipykernel_12/345.py:3',
        'Cell In[7], line 2 in f',  # its name carries the count
        '/home/u/train.py:9 in step',
        'False',
    ]


def test_cell_files_by_name():
    assert _cells.is_cell('/tmp/ipykernel_1234/123456.py')
    assert _cells.is_cell('<ipython-input-4-0a1b>')
    assert not _cells.is_cell('/tmp/ipykernel_1234/notes.py')
    assert _cells.cell_number('<ipython-input-4-0a1b>') == 4
    assert _cells.cell_number('/tmp/ipykernel_1234/123456.py') is None
