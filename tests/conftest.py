"""Test harness: real multi-process JAX on CPU.

Two ways to use a local cluster (`multihost.local.LocalCluster`: N real
processes, D CPU devices each, `jax.distributed.initialize` on a free loopback
port, gloo collectives):

* mark a test ``@pytest.mark.multiprocess``: its body runs in *every*
  process of the module's cluster, bracketed by coordination-service barriers
  named after the test, so one process's failure fails the test for all;
* request the ``mp_cluster`` fixture and call ``mp_cluster.run(fn)`` to get
  every process's return value and check them together in the test process.

The cluster is started once per module (``MP_CLUSTER = dict(n=..., ...)`` at
module level configures it) and restarted automatically after a test that
broke it. Every call has a hard timeout that kills the whole cluster, and the
error carries each process's traceback, Python stacks and log.

Tests not marked run in this process, where JAX is single-process: they
cover the single-process fast paths.
"""

from __future__ import annotations

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402
import pytest  # noqa: E402

from multihost.local import LocalCluster  # noqa: E402

jax.config.update('jax_num_cpu_devices', 4)

DEFAULT_CLUSTER = dict(n=4, devices_per_process=2)


class ClusterHolder:
    """Starts the module's cluster lazily and restarts it after it broke."""

    def __init__(self, config: dict, log_dir: str):
        self.config = config
        self.log_dir = log_dir
        self.cluster: LocalCluster | None = None

    def get(self) -> LocalCluster:
        if self.cluster is None or not self.cluster.alive:
            if self.cluster is not None:
                self.cluster.stop()
            self.cluster = LocalCluster(log_dir=self.log_dir, **self.config).start()
        return self.cluster

    def run(self, fn, *args, **kwargs):
        return self.get().run(fn, *args, **kwargs)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


@pytest.fixture(scope='module')
def mp_cluster(request, tmp_path_factory):
    config = dict(DEFAULT_CLUSTER)
    config.update(getattr(request.module, 'MP_CLUSTER', {}))
    # Workers import a test module by its path; this folder on their path lets
    # it import the shared `_helpers`, as it does in this process.
    paths = [os.path.dirname(os.path.abspath(__file__)), os.environ.get('PYTHONPATH', '')]
    config['env'] = {**config.get('env', {}), 'PYTHONPATH': os.pathsep.join(filter(None, paths))}
    holder = ClusterHolder(config, str(tmp_path_factory.mktemp('cluster-logs')))
    yield holder
    holder.stop()


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker('multiprocess') and 'mp_cluster' not in item.fixturenames:
            item.fixturenames.append('mp_cluster')


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker('multiprocess')
    if marker is None:
        return None
    holder: ClusterHolder = pyfuncitem.funcargs['mp_cluster']
    params = dict(getattr(getattr(pyfuncitem, 'callspec', None), 'params', {}))
    options = dict(timeout=60.0)
    options.update(marker.kwargs)
    holder.run(pyfuncitem.obj, **params, **options)
    return True
