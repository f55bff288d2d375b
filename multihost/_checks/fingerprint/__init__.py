"""Leaf fingerprints: XXH3-128 of the bytes in host memory, an exact kernel on the device.

The package, in the order a reader meets it:

* `definition`: the kernel's definition and numpy's computation of it, with the proof of
  what it catches: the reference every other computation is tested against;
* `host`: the host definition (XXH3-128), the choice of definition per leaf
  (``MULTIHOST_FINGERPRINT``) and the entry points (`digests`, `digests_with_flags`);
* `planning`: for each leaf and block, decided once, its route (numpy, host copy, small leaf,
  device program), the program and its cache key, the read layout (`layout`);
* `execute`: carries a plan out: compiles, dispatches, copies back;
* the computations of the definition the plan chooses among, each tested against
  `definition` on raw bits: `batched` (numpy, many small leaves at once), `xla` (XLA
  programs on a device, and the packing of small leaves), `pallas` (the Pallas kernel that
  keeps a narrow float's bits on a TPU, and the DMA packing of small bfloat16 vectors),
  `words` (whole leaves on a CPU device: their 32-bit words in chunks, one program);
* `settings`: what the tests switch (`configured`) and the one cache (`CACHE`).
"""

from __future__ import annotations

from multihost._checks.fingerprint.definition import (
    LANES,
    lane_sets,
    numpy_flags,
    numpy_lanes,
    supported,
    to_bytes,
)
from multihost._checks.fingerprint.execute import (
    device_lanes,
    device_results,
    fingerprints,
)
from multihost._checks.fingerprint.host import (
    ENV,
    HOST_PREFIX,
    MODES,
    digests,
    digests_with_flags,
    dtype_names,
    host_digest,
    host_kind,
    host_view,
    in_host_memory,
    is_host_digest,
    is_kernel_digest,
    kernel_digests,
    mode,
)
from multihost._checks.fingerprint.planning import (
    SMALL,
    bits_lost_on_chip,
    on_device,
    one_device,
    plan,
)
from multihost._checks.fingerprint.settings import CACHE, CONFIG, configured

__all__ = [
    'CACHE',
    'CONFIG',
    'ENV',
    'HOST_PREFIX',
    'LANES',
    'MODES',
    'SMALL',
    'bits_lost_on_chip',
    'configured',
    'device_lanes',
    'device_results',
    'digests',
    'digests_with_flags',
    'dtype_names',
    'fingerprints',
    'host_digest',
    'host_kind',
    'host_view',
    'in_host_memory',
    'is_host_digest',
    'is_kernel_digest',
    'kernel_digests',
    'lane_sets',
    'mode',
    'numpy_flags',
    'numpy_lanes',
    'on_device',
    'one_device',
    'plan',
    'supported',
    'to_bytes',
]
