"""A plain JAX job for the dump tests (imports nothing of multihost: run it under
``python -m multihost run --dump-dir DIR``). What it does is set by ``MODE``:

- ``loop``: ``STEPS`` barriers, 0.1 s apart (the dump signal test);
- ``preempt``: steps until `reached_preemption_sync_point` is True (after a SIGTERM);
- ``raise``: an uncaught ValueError after a barrier (on process ``RAISE`` only, if set; the
  others wait in the next barrier);
- ``exit``: process ``RAISE`` calls ``sys.exit(3)`` after a barrier, the others wait;
- ``clean``: a few barriers, exits 0;
- ``late``: process ``LATE`` sleeps ``SLEEP`` s before the barrier ``ckpt``, the others
  wait there (a timeout, or a kill of that process, is the test's to make);
- ``slow_then_stuck``: process ``LATE`` sleeps ``SLEEP`` s before the barrier ``first``
  (a slow host), then ``SLEEP2`` s before the barrier ``ckpt`` (a stuck one);
- ``compile_then_stuck``: process ``LATE`` jit-compiles a function of ``COMPILE_N`` ops
  (its tracing made to last at least ``COMPILE_S`` s) before the barrier ``first`` (the
  others wait there: a slow compile, not a hang), then sleeps ``SLEEP2`` s before the
  barrier ``ckpt`` (a stuck host);
- ``busy``: before the barrier ``ckpt``, process ``SPIN`` spins the CPU in Python and
  process ``LATE`` sleeps, ``SLEEP`` s each; the others wait there.
- ``late_launch``: process ``LATE`` sleeps ``SLEEP`` s before a jitted step whose sum is an
  all-reduce across the processes; the others are inside that launch meanwhile (with one
  CPU device per process, inside its call: XLA:CPU runs it there).
- ``stuck_launch``: every process launches a jitted step whose device callback (in a
  shard_map, on every device) sleeps ``SLEEP`` s before the step's all-reduce: every host
  is inside that launch, none behind.
- ``staged``: one training script staged in a directory per host (``STAGE<p>/train.py``,
  its code compiled under that name as a scheduler's per-host copy is) jits and runs a
  step whose sum is an all-reduce across the processes.
"""

import os
import sys
import time

import jax

jax.config.update('jax_platforms', 'cpu')
if os.environ.get('RECOVERABLE'):
    jax.config.update('jax_enable_recoverability', True)
jax.distributed.initialize(
    coordinator_address=os.environ['COORDINATOR_ADDRESS'],
    num_processes=int(os.environ['NUM_PROCESSES']),
    process_id=int(os.environ['PROCESS_ID']),
)
from jax.experimental import multihost_utils  # noqa: E402

pid = jax.process_index()
mode = os.environ['MODE']
multihost_utils.sync_global_devices('start')
print('started', flush=True)
if mode == 'loop':
    for i in range(int(os.environ.get('STEPS', '100'))):
        multihost_utils.sync_global_devices(f'step {i}')
        time.sleep(0.1)
elif mode == 'preempt':  # until JAX's preemption sync point says so (a SIGTERM somewhere)
    for step in range(600):
        if multihost_utils.reached_preemption_sync_point(step):
            print(f'sync point at {step}', flush=True)
            break
        time.sleep(0.05)
elif mode == 'raise':
    multihost_utils.sync_global_devices('before')
    if os.environ.get('RAISE', str(pid)) == str(pid):
        raise ValueError(f'bad batch on process {pid}')
    multihost_utils.sync_global_devices('after')
elif mode == 'exit':
    multihost_utils.sync_global_devices('before')
    if os.environ['RAISE'] == str(pid):
        sys.exit(3)
    multihost_utils.sync_global_devices('after')
elif mode == 'clean':
    for i in range(3):
        multihost_utils.sync_global_devices(f'step {i}')
elif mode == 'late':
    multihost_utils.sync_global_devices('before')
    if pid == int(os.environ['LATE']):
        time.sleep(float(os.environ['SLEEP']))
    multihost_utils.sync_global_devices('ckpt')
elif mode == 'slow_then_stuck':  # process LATE is slow once (SLEEP s), later stuck (SLEEP2 s)
    multihost_utils.sync_global_devices('before')
    if pid == int(os.environ['LATE']):
        time.sleep(float(os.environ['SLEEP']))
    multihost_utils.sync_global_devices('first')
    for i in range(3):
        multihost_utils.sync_global_devices(f'step {i}')
    print('past the slow wait', flush=True)
    if pid == int(os.environ['LATE']):
        time.sleep(float(os.environ['SLEEP2']))
    multihost_utils.sync_global_devices('ckpt')
elif mode == 'compile_then_stuck':
    import jax.numpy as jnp

    multihost_utils.sync_global_devices('before')
    if pid == int(os.environ['LATE']):
        n, at_least = int(os.environ['COMPILE_N']), float(os.environ.get('COMPILE_S', '0'))

        def big(x):
            for i in range(n):
                x = jnp.sin(x) * 1.0001 + i
                # Slow tracing (as a big model's Python is): at least COMPILE_S s in jit in
                # all, however fast this machine compiles. The watchdog sees one jit call.
                time.sleep(at_least / n)
            return x

        began = time.time()
        jax.jit(big)(jnp.ones(8)).block_until_ready()
        print(f'compiled in {time.time() - began:.1f} s', flush=True)
    multihost_utils.sync_global_devices('first')
    print('past the slow wait', flush=True)
    if pid == int(os.environ['LATE']):
        time.sleep(float(os.environ['SLEEP2']))
    multihost_utils.sync_global_devices('ckpt')
elif mode == 'busy':
    multihost_utils.sync_global_devices('before')
    end = time.time() + float(os.environ['SLEEP'])
    if pid == int(os.environ['SPIN']):
        n = 0
        while time.time() < end:
            n += 1
    elif pid == int(os.environ['LATE']):
        time.sleep(float(os.environ['SLEEP']))
    multihost_utils.sync_global_devices('ckpt')
elif mode in ('late_launch', 'staged', 'stuck_launch'):
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ('i',))
    local = np.ones(2 * jax.local_device_count(), np.float32)
    x = multihost_utils.host_local_array_to_global_array(local, mesh, PartitionSpec('i'))
    if mode == 'late_launch':

        def late_step(a):
            return jnp.sum(a) * a

        if pid == int(os.environ['LATE']):
            time.sleep(float(os.environ['SLEEP']))
        jax.jit(late_step)(x).block_until_ready()
    elif mode == 'stuck_launch':
        seconds = float(os.environ['SLEEP'])

        def on_device(a):
            shape = jax.ShapeDtypeStruct(a.shape, a.dtype)
            return jax.pure_callback(lambda v: (time.sleep(seconds), v)[1], shape, a)

        slow = jax.shard_map(
            on_device,
            mesh=mesh,
            in_specs=PartitionSpec('i'),
            out_specs=PartitionSpec('i'),
            check_vma=False,
        )

        def stuck_step(a):
            return jnp.sum(slow(a)) * a

        jax.jit(stuck_step)(x).block_until_ready()
    else:
        staged = (
            'import jax\n'
            'import jax.numpy as jnp\n'
            'def staged_step(a):\n'
            '    return jnp.sum(a) * a\n'
            'out = jax.jit(staged_step)(x)\n'
            'out.block_until_ready()\n'
        )
        exec(compile(staged, f'{os.environ["STAGE"]}{pid}/train.py', 'exec'), {'x': x})
print('done', flush=True)
sys.stdout.flush()
