"""An interrupt while a magic waits on the hosts: every magic shows it the same way and
returns None (the entry points catch it: no magic can forget to check).

A session whose every call is interrupted stands in for the hosts (no cluster is
started); the real interrupt is tested in ``test_notebook_faults.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import magic_shell
from IPython.utils.capture import capture_output

from mhnotebook import InterruptReport, SessionInterruptedError

REPORT = InterruptReport(
    stopped=(0, 1), running=(), where=None, position=None, seconds=0.5, waited=5.0
)


class InterruptedSession:
    """Running, not stepping, two hosts; any call to it is interrupted."""

    running, stepping, dead, num_processes, shape = True, False, (), 2, (2, 1)

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise SessionInterruptedError(REPORT)

        return call


LINES = [
    '%mh_cluster start -n 2 -d 1',  # reuses the running session
    '%mh_cluster status',
    '%mh_cluster restart',
    '%mh_allgather x',
    '%mh_barrier ckpt',
    '%mh_layout x',
    '%mh_diff params',
    '%mh_nonfinite grads',
    '%mh_replay step(params, batch)',
    '%mh_step on',
    '%mh_step',
    '%mh_env',
    '%mh_memory_census',
    '%mh_where',
    '%mh_audit',
    '%mh_timeline --chrome /nonexistent/dir/trace.json',
    '%mh_wait',  # for a cell in the background
    '%%mh\nprint(1)',
]


def test_every_magic_that_waits_on_the_hosts_is_tried_here():
    """A new magic is added to LINES.

    Exempt: %mh_help asks the hosts nothing; %mh_postmortem reads files; %mh_attach /
    %mh_detach talk to a job's control endpoint, not through the session's wait loop (each
    call bounded by its timeout: tests/jobs/test_attach.py).
    """
    ip, _ = magic_shell(None)
    table = ip.magics_manager.registry['MultihostMagics'].magics
    registered = {f'%{name}' for name in table['line']} | {f'%%{name}' for name in table['cell']}
    tried = {line.split()[0] for line in LINES}
    exempt = {'%mh_help', '%mh_postmortem', '%mh_attach', '%mh_detach'}
    assert registered - tried == exempt, registered - tried


@pytest.mark.parametrize('line', LINES)
def test_an_interrupted_magic_says_so_and_returns_nothing(line):
    ip, magics = magic_shell(InterruptedSession())
    ip.user_ns.pop('x', None)
    if line == '%mh_wait':
        magics.background = {0: 'the AsyncResult of host 0'}
    try:
        with capture_output() as cap:
            if line.startswith('%%'):
                head, cell = line[2:].split('\n', 1)
                result = ip.run_cell_magic(*head.partition(' ')[::2], cell)
            else:
                result = ip.run_line_magic(*line[1:].partition(' ')[::2])
        assert result is None
        assert cap.stdout == f'%mh: {REPORT.message}\n', cap.stdout
        assert 'x' not in ip.user_ns and magics.background is None
    finally:
        magics.session = None
