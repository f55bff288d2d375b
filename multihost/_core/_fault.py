"""Preemption sync points and live devices (docs/API.md §2, last two rows)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from multihost import _jax_adapter
from multihost._errors import ProcessFailureError

# The process-wide distributed state: one object for the life of the process
# (`jax.distributed.initialize` fills it in; it is never replaced).
_STATE = _jax_adapter.distributed_state()


def reached_preemption_sync_point(step_id: int) -> bool:
    """Whether every host has reached the step at which to save after a preemption notice.

    When any host receives a preemption notice (SIGTERM by default), the
    notice reaches every host and a background protocol agrees on the safe
    step: the largest step any host has reported, plus one. Call this at every
    training step, on every host, starting from the same step; it returns
    True exactly at the safe step, on every host.

    Args:
      step_id: the current training step.

    Returns:
      True at the agreed sync step; False otherwise, and always False when
      the distributed runtime is not initialized.

    Raises:
      RuntimeError: the preemption sync manager is not running (the
        ``jax_enable_preemption_service`` config was off at initialization).
    """
    state = _STATE  # called every training step: no function call on the way
    if state.client is None:
        return False
    manager = state.preemption_sync_manager
    if manager is None:
        raise RuntimeError(
            'Preemption sync manager has not been initialized. Make sure the'
            " 'jax_enable_preemption_service' config is enabled."
        )
    return manager.reached_sync_point(step_id)


def _live(client: Any, devices: Sequence[Any]) -> dict[Any, int]:
    """Device -> incarnation of its process, for the devices whose process is alive.

    `get_live_nodes` is itself barrier-like: it returns once every live
    process among ``devices``' owners has called it.
    """
    processes = sorted({d.process_index for d in devices})
    if jax.process_index() not in processes:
        raise ValueError(
            'Provided devices do not have any local devices. live_devices needs '
            f"at least one of process {jax.process_index()}'s devices, e.g. "
            'live_devices(jax.devices()).'
        )
    incarnations = client.get_live_nodes(processes)
    return {d: incarnations[d.process_index] for d in devices if d.process_index in incarnations}


class _LiveDevices:
    """Remembers the last agreed live set, so a restarted process is detected."""

    def __init__(self) -> None:
        self._known: dict[Any, int] | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, devices: Sequence[Any]) -> Iterator[list[Any]]:
        client = _jax_adapter.client()
        if client is None:
            raise RuntimeError('Distributed JAX not initialized.')
        if not devices:
            raise ValueError('No devices provided. Pass e.g. jax.devices().')
        with self._lock:
            if self._known is None:
                self._known = _live(client, devices)
            before = self._known
        error: BaseException | None = None
        try:
            yield sorted(before, key=lambda d: d.id)
        except Exception as exc:  # re-raised below, after the exit barrier
            error = exc
        after = _live(client, devices)
        with self._lock:
            self._known = after
        failed = {d for d in before if after.get(d) != before[d]}
        if failed:
            raise ProcessFailureError(failed) from error
        if error is not None:
            raise error


live_devices = _LiveDevices()
live_devices.__doc__ = """Context manager yielding the devices whose processes are alive.

Use as ``with multihost.live_devices(jax.devices()) as devices: ...``.

Barrier semantics: entering waits for every live process owning one of
``devices`` and yields the same sorted list of live devices to all of them.
Atomicity: on exit, either every participant finished the block normally, or
every participant raises.

Args:
  devices: devices of interest; must include at least one local device.

Yields:
  The live devices among ``devices``, sorted by id.

Raises:
  RuntimeError: ``Distributed JAX not initialized.``
  ValueError: no devices, or none of them local.
  ProcessFailureError: a process owning some of ``devices`` died or restarted
    (its incarnation changed); ``.failed_devices`` names its devices.
"""
