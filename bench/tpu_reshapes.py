"""Which reshapes of a narrow float XLA makes a bitcast on a TPU, compiled here (no chip).

A TPU rewrites bfloat16 NaN payloads and subnormals when a program moves the values
through its vector units (measured on a v5e: `bench/tpu_bits.py`, docs/SCALE.md); a reshape
that keeps the tiles in memory is a ``bitcast`` (nothing moves), one that does not is a
``reshape`` kernel (a relayout). This compiles each reshape `layout.read_layout` asks for, and a
few probes measured on the chip, for a TPU v5e target with libtpu on this CPU machine
(``JAX_PLATFORMS=cpu``; the test extra installs libtpu on Python 3.11) and says which op XLA
emitted. Usage: ``JAX_PLATFORMS=cpu python bench/tpu_reshapes.py [--json PATH]``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

#: (leaf shape, target shape, what it is). The probes' bits on a TPU v5e (docs/SCALE.md,
#: "What the chip does to raw bits"): (512, 128) -> 1-D and (16, 128) -> 1-D kept every bit;
#: (32, 768) -> 1-D and (8, 96) -> 1-D changed 309 and 131 elements.
CASES = [
    ((512, 128), (65536,), 'probe: kept every bit on the chip'),
    ((16, 128), (2048,), 'probe: kept every bit on the chip'),
    ((32, 768), (24576,), 'probe: changed 309 of 24,576 on the chip'),
    ((8, 96), (768,), 'probe: changed 131 of 768 on the chip'),
]


#: An HLO instruction line: ``[ROOT] %name = type op(...``.
_OP = re.compile(r'\s*(?:ROOT\s+)?%\S+\s*=\s*\S+\s+([a-z][\w-]*)\(')


def _plan_cases() -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
    import ml_dtypes

    from multihost._checks.fingerprint import layout

    out = []
    for shape in [(768, 8, 96), (64, 32, 256), (8, 96, 768), (512, 8, 64), (768, 3), (4096, 64)]:
        got = layout.read_layout(ml_dtypes.bfloat16, shape, True)  # in C order (the stored order's
        if got is not None and got.shape != shape:  # reads: tests/engine/test_tpu_reshapes.py)
            out.append((shape, got.shape, 'layout.read_layout in C order (a whole leaf)'))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--json', default='')
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu')
    except Exception as exc:  # no libtpu here
        print(f'needs libtpu (pip install "libtpu==0.0.42.*" with jax 0.10.2): {exc}')
        return 1
    sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
    rows: list[dict[str, Any]] = []
    for shape, target, what in CASES + _plan_cases():
        spec = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharding)
        compiled = (
            jax.jit(lambda v, t=target: v.reshape(t))
            .trace(spec)
            .lower(lowering_platforms=('tpu',))
            .compile()
        )
        ops = [m.group(1) for m in map(_OP.match, compiled.as_text().splitlines())
               if m and m.group(1) != 'parameter']  # fmt: skip
        kind = 'relayout' if 'reshape' in ops else 'bitcast' if 'bitcast' in ops else ' '.join(ops)
        rows.append({'shape': shape, 'to': target, 'xla': kind, 'ops': ops, 'what': what})
        print(f'{str(shape):>16} -> {str(target):<14} {kind:<9} ({what})', flush=True)
    import _results

    got = {'compiled_on': jax.devices()[0].platform, 'rows': rows}
    kind = topo.devices[0].device_kind  # what it compiles for (libtpu, no chip)
    print('written to', _results.save('tpu_reshapes', got, kind, args.json))
    return 0


if __name__ == '__main__':
    sys.exit(main())
