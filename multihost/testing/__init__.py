"""Test multi-host JAX code on one machine, the way this project tests its own.

Two harnesses, jax + numpy + the standard library only:

* `LocalCluster`: N real JAX processes ("simulated hosts") with D CPU devices
  each, joined by `jax.distributed.initialize` on a free loopback port (gloo
  collectives). ``run(fn, *args)`` runs a module-level function in every process
  at once, optionally between coordination-service barriers named after the call,
  and returns one result per process. Every wait has a timeout; when a process
  fails, dies or hangs, the `ClusterError` carries each process's traceback,
  Python stacks and log, and the cluster is killed, so nothing is left running::

      from multihost.testing import LocalCluster

      def body():                      # module-level: every process imports its file
          import jax, multihost
          return multihost.process_allgather(jax.process_index())

      with LocalCluster(n=4, devices_per_process=2) as cluster:
          print(cluster.run(body))     # one result per process

* `start_job`: a program launched as a scheduler launches it, ``n`` plain
  processes with the coordinator address, process count and index in the
  environment (`scheduler_env`, ``PROCESS_ID``), for code that calls
  ``jax.distributed.initialize`` itself. `Job.finish` collects every process's
  exit code and output within one deadline; leaving its ``with`` block kills
  whatever still runs::

      from multihost.testing import scheduler_env, start_job

      with start_job(4, ['train.py', '--steps', '3'], scheduler_env(4)) as job:
          for code, out, err in job.finish(timeout=300):
              assert code == 0, err

The worker that `LocalCluster` starts is ``python -m multihost.testing --worker``
(`_worker`).
"""

from __future__ import annotations

from multihost._net import free_port
from multihost.testing._cluster import ClusterError, LocalCluster
from multihost.testing._jobs import Job, job_env, scheduler_env, start_job

__all__ = [
    'ClusterError',
    'Job',
    'LocalCluster',
    'free_port',
    'job_env',
    'scheduler_env',
    'start_job',
]
