"""`tests/_jobs.py`, the launcher of plain-process jobs: nothing is left running."""

from __future__ import annotations

import os
import secrets
import subprocess

import _jobs
import pytest


def _running(marker: str) -> list[str]:
    """Command lines of live processes that carry ``marker``."""
    out = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                line = f.read().replace(b'\0', b' ').decode(errors='replace')
            with open(f'/proc/{pid}/stat') as f:
                zombie = f.read().rsplit(')', 1)[1].split()[0] == 'Z'
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if marker in line and not zombie:
            out.append(line)
    return out


def test_a_process_that_cannot_start_takes_the_started_ones_with_it() -> None:
    marker = f'mh-jobs-{secrets.token_hex(4)}'

    def args(p: int) -> list[str]:
        if p == 2:
            raise RuntimeError('no arguments for process 2')
        return ['-c', 'import time; time.sleep(120)', marker]

    with pytest.raises(RuntimeError, match='process 2'):
        _jobs.start(3, [], _jobs.job_env(), args=args, stdout=subprocess.DEVNULL)
    assert _running(marker) == []


def test_finish_kills_a_process_past_the_deadline_and_keeps_what_it_wrote() -> None:
    marker = f'mh-jobs-{secrets.token_hex(4)}'
    code = 'import sys, time; print("up", flush=True); time.sleep(120 * int(sys.argv[1]))'
    with _jobs.start(2, ['-c', code], _jobs.job_env(), args=lambda p: [str(p), marker]) as job:
        results = job.finish(5.0)
    assert [(rc, out) for rc, out, _ in results] == [(0, 'up\n'), (-9, 'up\n')], results
    assert _running(marker) == []
