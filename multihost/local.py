"""`multihost.testing`'s old name: `LocalCluster`, `ClusterError`, `free_port` import from here.

Kept so that code written against ``from multihost.local import LocalCluster``
keeps working; new code imports `multihost.testing`. ``python -m multihost.local
--worker`` still runs a worker.
"""

from __future__ import annotations

import sys

from multihost._net import free_port
from multihost.testing._cluster import ClusterError, LocalCluster, _Worker
from multihost.testing._worker import (
    _harness_barrier,
    _load,
    _loaded,
    _resolve,
    _worker_main,
    main,
)

__all__ = ['ClusterError', 'LocalCluster', 'free_port']
# The private names stay importable from here as they were (the worker's pieces).
_PRIVATE = (_Worker, _harness_barrier, _load, _loaded, _resolve, _worker_main)

if __name__ == '__main__':
    main(sys.argv)
