"""Fingerprints on 4 real JAX processes x 2 CPU devices: both definitions, and mixed kinds.

Each ``multiprocess`` body runs in every process. ``MULTIHOST_FINGERPRINT``
is set per process inside a body: ``device`` on some hosts stands for data on
an accelerator (the kernel, computed by XLA), ``auto`` for numpy leaves and
CPU-device data (XXH3-128, read in place). Hosts holding the same values in
different kinds must not differ; real differences are still found, with the
first differing index, under either definition.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _helpers import env_var, host_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import multihost
from multihost._checks import _treediff
from multihost._checks import fingerprint as F

MP_CLUSTER = dict(n=4, devices_per_process=2)
multiprocess = pytest.mark.multiprocess


def _mode(how: str | None) -> contextlib.AbstractContextManager[None]:
    return env_var(F.ENV, how)


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {
        'f32': rng.standard_normal((300, 301)).astype(np.float32),
        'bf16': rng.standard_normal(1001).astype(ml_dtypes.bfloat16),
        'i8': rng.integers(-100, 100, 77).astype(np.int8),
        'c64': (rng.standard_normal(9) + 1j).astype(np.complex64),
        'b': rng.integers(0, 2, 13).astype(bool),
        'big': rng.standard_normal(1 << 20).astype(np.float32),
    }


def _tree(values: dict[str, np.ndarray], as_numpy: bool) -> dict:
    """The values as numpy leaves, or as device arrays (one split over the two local devices)."""
    if as_numpy:
        return {**values, 'split': values['f32']}
    local = jax.sharding.Mesh(np.array(jax.local_devices()), ('d',))
    split = jax.device_put(values['f32'], NamedSharding(local, P('d')))
    return {**{k: jnp.asarray(v) for k, v in values.items()}, 'split': split}


@multiprocess(timeout=240)
def test_numpy_on_one_host_device_kernel_on_the_others_no_false_mismatch():
    """Host 0: numpy leaves, XXH3; hosts 1-3: device arrays through the kernel. Equal values pass.

    The rows really differ in kind (checked), and without `_settle_kinds`
    every leaf would be reported: the fallback to the kernel is what makes
    them equal. Real differences are then still found on either side.
    """
    pid = jax.process_index()
    values = _values()
    tree = _tree(values, as_numpy=pid == 0)
    with _mode('auto' if pid == 0 else 'device'):
        _, rows = _treediff._fingerprint(list(zip([()] * len(tree), tree.values())))
        digests = [r[1].split('|')[2] for r in rows]
        assert all(F.is_host_digest(d) == (pid == 0) for d in digests), digests
        multihost.assert_equal(tree, 'mixed kinds')
        assert multihost.tree_diff(tree).ok
        settle = _treediff._settle_kinds
        _treediff._settle_kinds = lambda pending, *a: pending  # type: ignore[assignment]
        try:
            unsettled = multihost.tree_diff(tree)
        finally:
            _treediff._settle_kinds = settle
        assert {leaf.path for leaf in unsettled.leaves} == {f"['{k}']" for k in tree}
        assert all(leaf.odd_processes == (0,) for leaf in unsettled.leaves)
        # A flipped bit on a device-kernel host, and a changed element on the numpy host.
        for odd, path, index in [(3, 'big', 123_456), (0, 'big', 999_999), (2, 'bf16', 17)]:
            changed = dict(values)
            if pid == odd:
                changed[path] = values[path].copy()
                changed[path].view(np.uint8)[index * changed[path].itemsize] ^= 4
            diff = multihost.tree_diff(_tree(changed, as_numpy=pid == 0))
            (leaf,) = diff.leaves
            assert leaf.path == f"['{path}']" and leaf.odd_processes == (odd,), diff
            assert leaf.first_index == {odd: (index,)} and leaf.num_different == {odd: 1}
            assert not any(F.is_host_digest(d) for d in leaf.digests.values() if d)


@multiprocess(timeout=240)
def test_each_definition_finds_flips_swaps_signed_zeros_and_nan_payloads():
    """auto, device and host on every host: the odd host named for each kind of change."""
    pid = jax.process_index()
    values = _values()
    nan = np.full(5, np.nan, np.float32)
    values['nan'], values['zero'] = nan, np.zeros(4, np.float32)
    changes = {
        'bf16': lambda a: a.view(np.uint16).__setitem__(3, a.view(np.uint16)[3] ^ 1),  # one bit
        'i8': lambda a: a.__setitem__([5, 9], a[[9, 5]]),  # a swap of unequal elements
        'zero': lambda a: a.__setitem__(2, -0.0),
        'nan': lambda a: a.view(np.uint32).__setitem__(1, a.view(np.uint32)[1] | 1),
        'b': lambda a: a.__setitem__(0, not a[0]),
        'c64': lambda a: a.__setitem__(4, np.conj(a[4])),
    }
    assert values['i8'][5] != values['i8'][9]
    for how in ('auto', 'device', 'host'):
        with _mode(how):
            multihost.assert_equal(_tree(values, as_numpy=pid % 2 == 0), how)
            for n, (path, change) in enumerate(changes.items()):
                odd = n % 4
                mine = {k: v.copy() for k, v in values.items()}
                if pid == odd:
                    change(mine[path])
                diff = multihost.tree_diff(_tree(mine, as_numpy=pid % 2 == 0))
                (leaf,) = diff.leaves
                assert leaf.path == f"['{path}']" and leaf.odd_processes == (odd,), (how, diff)
                host = how != 'device'
                assert all(F.is_host_digest(d) == host for d in leaf.digests.values()), how


@multiprocess(timeout=180)
def test_check_replicas_with_mixed_kinds_and_a_bad_switch():
    """Replicas hashed by XXH3 on host 0 and the kernel elsewhere agree; an odd one is named.

    A bad ``MULTIHOST_FINGERPRINT`` on one host: every host raises, naming it.
    """
    pid = jax.process_index()
    mesh = host_mesh()
    value = np.arange(64 * 24, dtype=np.float32).reshape(64, 24)
    sharding = NamedSharding(mesh, P(None, None))
    devices = sharding.addressable_devices_indices_map(value.shape)
    arr = jax.make_array_from_single_device_arrays(
        value.shape, sharding, [jax.device_put(value, d) for d in devices]
    )
    with _mode('auto' if pid == 0 else 'device'):
        report = multihost.check_replicas(arr)
        assert report.ok, report
        kinds = {F.is_host_digest(r.digest) for g in report.groups for r in g.replicas}
        assert kinds == {False}  # settled by the kernel
        bufs = [jax.device_put(value + (1 if pid == 2 else 0), d) for d in devices]
        odd = jax.make_array_from_single_device_arrays(value.shape, sharding, bufs)
        report = multihost.check_replicas(odd)
        assert not report.ok and report.odd_processes == (2,), report
    with _mode('auto'):
        report = multihost.check_replicas(arr)  # every host XXH3: no extra round needed
        assert report.ok
        assert all(F.is_host_digest(r.digest) for g in report.groups for r in g.replicas)
    with _mode('gpu' if pid == 1 else None):
        with pytest.raises(multihost.HostFailedError, match='process 1') as e:
            multihost.assert_equal({'a': value})
        assert "MULTIHOST_FINGERPRINT='gpu' is not one of" in str(e.value)
        with pytest.raises(multihost.HostFailedError, match='MULTIHOST_FINGERPRINT'):
            multihost.check_replicas(arr)


@multiprocess(timeout=120)
def test_a_large_string_leaf_is_narrowed_by_xxh3_of_its_bytes():
    """A > 64 KiB string array (no kernel for it): blocks hashed by XXH3, the index found."""
    pid = jax.process_index()
    words = np.array([f'w{i % 997:03d}' for i in range(20_000)])  # <U4: 320,000 bytes
    assert words.nbytes > _treediff.NARROW_BYTES
    if pid == 1:
        words[12_345] = 'odd!'
    (leaf,) = multihost.tree_diff({'words': words}).leaves
    assert leaf.odd_processes == (1,) and leaf.first_index == {1: (12_345,)}
    assert leaf.num_different == {1: 1}
