"""Programs the toolkit did not start, launched as a scheduler launches them: plain processes.

One process per host, the coordinator address and process count in the
environment (`scheduler_env`), the process index as ``PROCESS_ID`` (or in
the arguments), ``MULTIHOST_*`` variables of this process left out. `start_job`
returns a `Job`: `Job.finish` collects every process's exit code and output
within one deadline (a process still running then is killed), and leaving a
``with`` block or calling `Job.kill` ends whatever still runs, so a failing
test or bench leaves no process behind.

Standard library only (and `multihost._net.free_port`): it imports no JAX, so
a test process that must stay single-process can launch jobs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from multihost._net import free_port

__all__ = ['Job', 'Result', 'job_env', 'scheduler_env', 'start_job']

#: The folder that holds the `multihost` package this process imported: first on
#: the jobs' path, so they run this very copy (a source tree's, say).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: What `Job.finish` gives per process: exit code, stdout, stderr (None when not piped).
Result = tuple[int, Any, Any]


def job_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``MULTIHOST_*``, `ROOT` as the path, CPU, ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('MULTIHOST_')}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS='cpu', **extra)
    return env


def scheduler_env(n: int, **extra: str) -> dict[str, str]:
    """`job_env` with a free loopback coordinator address and ``NUM_PROCESSES=n``."""
    return job_env(COORDINATOR_ADDRESS=f'127.0.0.1:{free_port()}', NUM_PROCESSES=str(n), **extra)


class Job:
    """The processes of one job (`start` makes it); ``procs[p]`` is process ``p``."""

    def __init__(self, procs: list[subprocess.Popen[Any]]) -> None:
        self.procs = procs
        #: After `finish`: per process, the `time.monotonic` at which it was seen to end
        #: (its output closed and its code collected); None for one killed at the deadline.
        self.ended: list[float | None] = []

    def finish(self, timeout: float) -> list[Result]:
        """Every process's exit code and output, all within ``timeout`` seconds; a process
        still running then is killed (its code is negative) and what it wrote is kept.

        Each process is read by a thread of its own, so `ended` says when each one ended."""
        deadline = time.monotonic() + timeout
        out: list[Result | None] = [None] * len(self.procs)
        ended: list[float | None] = [None] * len(self.procs)

        def collect(i: int, p: subprocess.Popen[Any]) -> None:
            try:
                stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                ended[i] = time.monotonic()
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate(timeout=10)
            out[i] = (p.returncode, stdout, stderr)

        threads = [
            threading.Thread(target=collect, args=(i, p), name=f'job-process-{i}', daemon=True)
            for i, p in enumerate(self.procs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 15.0)
        self.ended = ended
        missing = [i for i, r in enumerate(out) if r is None]
        if missing:
            raise RuntimeError(f'processes {missing} of the job could not be reaped')
        return [r for r in out if r is not None]

    def kill(self) -> None:
        """Kills every process still running and reaps it (idempotent)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start_job(
    n: int,
    command: Sequence[str],
    env: dict[str, str],
    *,
    args: Callable[[int], Sequence[str]] | None = None,
    process_id: bool = True,
    cwd: str | None = None,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
) -> Job:
    """Starts ``n`` processes of ``python *command *args(p)``, one per simulated host.

    Args:
        n: how many processes.
        command: the arguments after the interpreter (``['-m', 'mymodule']``, a script).
        env: every process's environment (`scheduler_env` for a JAX job).
        args: process index -> that process's extra arguments.
        process_id: put ``PROCESS_ID=p`` in process ``p``'s environment.
        cwd: the processes' working directory.
        stdout, stderr: as for `subprocess.Popen` (piped by default; text).

    Returns:
        The `Job`; use it as a context manager so nothing outlives a failing test.

    If one process cannot be started, those already running are killed before the
    error propagates."""
    job = Job([])
    try:
        for p in range(n):
            job.procs.append(
                subprocess.Popen(
                    [sys.executable, *command, *(args(p) if args else ())],
                    env={**env, 'PROCESS_ID': str(p)} if process_id else env,
                    cwd=cwd,
                    stdout=stdout,
                    stderr=stderr,
                    text=True,
                )
            )
    except BaseException:
        job.kill()
        raise
    return job
