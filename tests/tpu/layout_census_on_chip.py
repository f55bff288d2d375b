"""On a real TPU (one process): what describe_layout, the chip grid and the memory census say.

Not a pytest test (CI has no TPU): run by hand on a TPU machine,
``python tests/tpu/layout_census_on_chip.py OUT_DIR``; it prints the layout and census text and
writes the chip grid's PNG and the texts to OUT_DIR. The figures it printed on a TPU v5e chip
are quoted in docs/guides (the layout section).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import multihost


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    devices = jax.devices()
    print('jax', jax.__version__, 'devices', devices, flush=True)
    n = len(devices)
    mesh = Mesh(np.array(devices).reshape(n, 1), ('data', 'model'))
    sharding = NamedSharding(mesh, P('data', 'model'))
    x = jax.device_put(jnp.ones((1024 * n, 1000), jnp.bfloat16), sharding)
    # fragmentation: many buffers, every other one freed
    keep = [jnp.full((257, 1023), i, jnp.float32) for i in range(64)]
    del keep[::2]
    layout = multihost.describe_layout(x)
    grid = layout.chip_grid()
    texts = [str(layout), str(grid), multihost.memory_census().format()]
    try:  # the notebook side (matplotlib) where it is installed
        from mhnotebook.widgets.layout.chips import render_chip_grid_png
    except ImportError as exc:
        print('no PNG:', exc)
    else:
        if grid is not None:
            with open(os.path.join(out, 'chip_grid.png'), 'wb') as f:
                f.write(render_chip_grid_png(grid, layout.headline()))
    print('memory_stats keys', sorted((devices[0].memory_stats() or {}).keys()))
    text = '\n\n'.join(texts)
    print(text, flush=True)
    with open(os.path.join(out, 'layout_census.txt'), 'w') as f:
        f.write(text + '\n')
    del keep


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else '.')
