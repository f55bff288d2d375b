"""The tests' name for `multihost.testing`'s plain-process job launcher (``import _jobs``).

`multihost.testing.start_job` and its helpers: programs the toolkit did not start,
launched as a scheduler launches them. ``ROOT`` is this source tree.
"""

from __future__ import annotations

import os

from multihost.testing import Job, job_env, scheduler_env
from multihost.testing import start_job as start
from multihost.testing._jobs import Result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ['ROOT', 'Job', 'Result', 'job_env', 'scheduler_env', 'start']
