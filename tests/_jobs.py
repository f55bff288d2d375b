"""The tests' name for `multihost.testing`'s plain-process job launcher (``import _jobs``).

`multihost.testing.start_job` and its helpers: programs the toolkit did not start,
launched as a scheduler launches them. ``ROOT`` is this source tree. `until` waits for such a
job (its control file, an attached job's answer).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from multihost.testing import Job, job_env, scheduler_env
from multihost.testing import start_job as start
from multihost.testing._jobs import Result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ['ROOT', 'Job', 'Result', 'job_env', 'scheduler_env', 'start', 'until']


def until(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Calls ``check()`` every 0.3 s until it returns something truthy, and returns that.

    An `mhnotebook.AttachError` (the job not answering yet, or between two states) and a
    `mhnotebook.SessionTimeoutError` (a host's debug thread slow to answer on a busy machine)
    count as "not yet".

    Raises:
        AssertionError: ``<what>: not within <timeout> s (last: <the last value>)``.
    """
    import mhnotebook  # lazily: importing _jobs stays free of the notebook side

    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            got = check()
        except mhnotebook.AttachError:
            got = last = None
        except mhnotebook.SessionTimeoutError as exc:
            got, last = None, f'not yet: {exc}'
        else:
            last = got
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f'{what}: not within {timeout:g} s (last: {last!r})')
