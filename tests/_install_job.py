"""A job nobody edited, launched like a scheduler does (env vars, initialize in the script).

Run by tests/engine/test_install.py in every process: ``MH_PID``, ``MH_N``, ``MH_COORD``.
A library-style module takes JAX's functions by name *before* `multihost.install`,
which is called before `jax.distributed.initialize`. Prints one JSON line of
findings per scenario (``RESULT {...}``) to stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax

jax.config.update('jax_num_cpu_devices', 1)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.experimental.multihost_utils import sync_global_devices  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import multihost  # noqa: E402
from multihost import _recorder  # noqa: E402
from multihost._exchange import _sequence  # noqa: E402
from multihost._job import _install  # noqa: E402

# Held in a dict, not as a global: install swaps module globals that are JAX's function.
JAX = {'sync': sync_global_devices}
PID, N = int(os.environ['MH_PID']), int(os.environ['MH_N'])


def result(name: str, **data: object) -> None:
    print('RESULT', json.dumps({'scenario': name, **data}), flush=True)


def records() -> list[_recorder.FlightRecord]:
    return _recorder.snapshot(PID)


# Installed before JAX's distributed runtime (or its backend) exists.
multihost.install()
result(
    'before_init',
    backend_untouched=not jax._src.xla_bridge.backends_are_initialized(),
    by_name=sync_global_devices is not JAX['sync'],
    module=multihost_utils.sync_global_devices is not JAX['sync'],
)
jax.distributed.initialize(os.environ['MH_COORD'], N, PID, initialization_timeout=60)

# A library-style call (the by-name reference): one barrier record, by name.
before = len(records())
sync_global_devices('lib')
new = records()[before:]
result('library_call', kinds=[r.kind for r in new], names=[r.name for r in new])

# A traced conversion under jit, through JAX's module: works, no recursion, and records
# as many entries as our function does uninstalled (none for a tracer).
mesh = Mesh(np.array(jax.devices()), ('x',))


@jax.jit
def to_global(x):
    return multihost_utils.host_local_array_to_global_array(x * 2, mesh, P())


before = len(records())
out = to_global(np.arange(2.0) + PID)
new = records()[before:]  # the jitted launch (installed: jax.jit records), no collective
result(
    'traced',
    shape=list(out.shape),
    records=sum(not r.is_launch for r in new),
    launches=[r.name for r in new if r.is_launch],
)

# Patient: the late host arrives after several periods; nobody raises, the others log.
_sequence.DEFAULT_TIMEOUT = 1.0
if PID == N - 1:
    time.sleep(3.5)
t0 = time.monotonic()
sync_global_devices('late')
result('patient', waited=time.monotonic() - t0)

# Uninstalled: every reference is JAX's again (the by-name one too).
multihost.uninstall()
result(
    'uninstalled',
    by_name=sync_global_devices is JAX['sync'],
    module=multihost_utils.sync_global_devices is JAX['sync'],
    installed=_install.installed(),
)


@jax.jit
def to_global_again(x):  # a new function: traced again, now uninstalled
    return multihost_utils.host_local_array_to_global_array(x * 2, mesh, P())


before = len(records())
again = to_global_again(np.arange(2.0) + PID)
new = records()[before:]
result(
    'traced_uninstalled',
    records=sum(not r.is_launch for r in new),
    launches=[r.name for r in new if r.is_launch],
    same=bool((again == out).all()),
)
sys.stdout.flush()

# Installed with a timeout: the late host makes everyone raise BarrierTimeoutError.
multihost.install(timeout=1.0)
if PID == N - 1:
    time.sleep(3.0)
try:
    multihost_utils.sync_global_devices('timed')
    result('timed', raised=None)
except multihost.BarrierTimeoutError as exc:
    result('timed', raised=type(exc).__name__, missing=exc.missing)
multihost.uninstall()

# Both leave together (the next collective lines up after the timeout).
multihost.sync_global_devices('end', timeout=60)
result('end')
# Process 0 hosts the coordination service: it leaves last, and nobody runs JAX's
# exit-time shutdown (whose teardown at times aborts the other plain processes
# with "terminate called", installed or not), as LocalCluster's workers do.
sys.stdout.flush()
sys.stderr.flush()
if PID == 0:
    time.sleep(1.0)
os._exit(0)
