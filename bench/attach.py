"""Attach latency while every main thread is blocked (issue 20, item 1).

A job of `--hosts` plain processes under ``python -m multihost run
--control-file``: the last process sleeps in ``time.sleep`` (user code), the
others wait for it in ``sync_global_devices`` (a checked barrier). From this
process (not a JAX process): `mhnotebook.attach`, then `--calls` calls each of
``wavefront()`` and ``where()``; prints the median and max of each, and the
time of `attach` itself, as one JSON line. Then the sleeper is let go and the
job ends.

    python bench/attach.py [--hosts 4] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import textwrap
import time

JOB = textwrap.dedent(
    """
    import os, sys, time
    import jax
    jax.config.update('jax_num_cpu_devices', 1)
    pid, n, port, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(f'127.0.0.1:{port}', n, pid)
    from jax.experimental import multihost_utils
    if pid == n - 1:
        deadline = time.monotonic() + 300
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.1)
    multihost_utils.sync_global_devices('blocked')
    """
)


def _timed(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', type=int, default=4)
    parser.add_argument('--calls', type=int, default=20)
    args = parser.parse_args()

    import mhnotebook
    from multihost.testing import free_port, job_env, start_job

    tmp = tempfile.mkdtemp(prefix='mh-attach-bench-')
    script, control, go = (os.path.join(tmp, f) for f in ('job.py', 'control.json', 'go'))
    with open(script, 'w') as f:
        f.write(JOB)
    command = ['-m', 'multihost', 'run', '--control-file', control, script]
    port = str(free_port())
    procs = start_job(
        args.hosts,
        command,
        job_env(),
        args=lambda p: [str(p), str(args.hosts), port, go],
        process_id=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # every main thread blocked: the others inside the barrier
            if time.monotonic() > deadline:
                raise SystemExit('the job did not block within 120 s')
            if os.path.exists(control):
                with mhnotebook.attach(control) as job:
                    verdict = job.wavefront().verdict or ''
                if 'waiting at barrier' in verdict:
                    break
            time.sleep(0.2)
        t0 = time.perf_counter()
        job = mhnotebook.attach(control)
        attach_ms = (time.perf_counter() - t0) * 1e3
        front = _timed(job.wavefront, args.calls)
        where = _timed(job.where, args.calls)
        job.detach()
        print(
            json.dumps(
                {
                    'hosts': args.hosts,
                    'calls': args.calls,
                    'attach_ms': round(attach_ms, 2),
                    'wavefront_median_ms': round(statistics.median(front), 2),
                    'wavefront_max_ms': round(max(front), 2),
                    'where_median_ms': round(statistics.median(where), 2),
                    'where_max_ms': round(max(where), 2),
                    'verdict': verdict,
                }
            )
        )
    finally:
        open(go, 'w').close()
        procs.finish(60.0)


if __name__ == '__main__':
    main()
