"""The engine's side of the notebook's calls: JAX start-up, barriers, checks, the sequence.

Each wraps a `multihost` function so that it runs under the notebook's
name in the collective sequence (`_sequence.called_from`) and returns plain,
picklable data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from multihost._exchange import _kv, _sequence
from multihost.engine.gather import GatherError, lookup

if TYPE_CHECKING:
    from multihost._models import Layout, NonfiniteReport, ReplicaReport, TreeDiff, TreeLayout

__all__ = [
    'barrier',
    'diff',
    'env_diff',
    'layout',
    'lookup_collective',
    'memory_census',
    'nonfinite',
    'realign_sequence',
    'replay',
    'sequence_position',
    'serve_control',
]


def barrier(name: str, timeout: float | None = None) -> dict[str, Any]:
    """Runs `multihost.barrier` here and reports how it went (never raises its errors)."""
    import time

    from multihost._core._collectives import barrier as checked_barrier
    from multihost._errors import BarrierTimeoutError, CollectiveMismatchError

    t0 = time.perf_counter()
    try:
        with _sequence.called_from(f'notebook: %mh_barrier {name}'):
            checked_barrier(name, timeout=timeout)
    except (BarrierTimeoutError, CollectiveMismatchError) as exc:
        # .missing for a timeout, .names for a name mismatch
        extra = {k: getattr(exc, k) for k in ('missing', 'names') if hasattr(exc, k)}
        return dict(
            ok=False,
            error=type(exc).__name__,
            message=str(exc),
            elapsed=time.perf_counter() - t0,
            **extra,
        )
    return dict(ok=True, elapsed=time.perf_counter() - t0)


def serve_control(authkey: bytes, host: str = '') -> tuple[str, int]:
    """Starts this process's control endpoint (answers while the main thread is busy).

    ``host``: the address to listen on (``''``: every interface).
    """
    from multihost._debug._control import serve_control as serve

    return serve(authkey, (host, 0))


def _reads() -> Any:
    """`_recorder.reading_host_copies` while a recorded launch is in flight on this host: a
    device program a tool launched would queue behind it (`_checks._hostreads`)."""
    from multihost import _recorder

    try:
        busy = bool(_recorder.in_flight(_kv.process_index()))
    except Exception:
        busy = False
    return _recorder.reading_host_copies(busy)


def layout(
    namespace: dict[str, Any], name: str, check: bool = True
) -> tuple[Layout | TreeLayout, ReplicaReport | None]:
    """The `Layout` of array ``name`` and, with ``check``, its `ReplicaReport` (a collective).

    For a pytree, its `TreeLayout` (one row per leaf, each leaf's replicas
    checked with ``check``) and None.
    """
    with _reads():
        return _layout(namespace, name, check)


def _layout(
    namespace: dict[str, Any], name: str, check: bool
) -> tuple[Layout | TreeLayout, ReplicaReport | None]:
    import jax

    from multihost._checks._layout import describe_layout
    from multihost._checks._replicas import check_replicas

    with _sequence.called_from(f'notebook: %mh_layout {name}'):
        # Every host takes this turn, so one lacking the name fails them all at once
        # (otherwise the others would wait in check_replicas until their timeout).
        value = lookup_collective(namespace, name, 'layout')
        _sequence.enter('layout', name)
    if not isinstance(value, jax.Array | np.ndarray):
        # A pytree: one row per leaf (its replicas checked leaf by leaf, on every host alike).
        from multihost._checks._treelayout import tree_layout

        with _sequence.called_from(f'notebook: %mh_layout {name}'):
            return tree_layout(value, name, check=check), None
    described = describe_layout(value)
    report = None
    if check and isinstance(value, jax.Array):
        with _sequence.called_from(f'notebook: %mh_layout {name}'):
            report = check_replicas(value)
    return described, report


def diff(namespace: dict[str, Any], name: str, timeout: float | None = None) -> TreeDiff:
    """`multihost.tree_diff` of ``name`` (a collective: every host must call it)."""
    from multihost._checks._treediff import tree_diff

    with _reads(), _sequence.called_from(f'notebook: %mh_diff {name}'):
        value = lookup_collective(namespace, name, 'tree_diff', timeout=timeout)
        return tree_diff(value, timeout=timeout)


def env_diff(timeout: float | None = None) -> Any:
    """`multihost.env_diff` for the notebook (a collective)."""
    from multihost._checks._census import env_diff as checked_env_diff

    with _sequence.called_from('notebook: %mh_env'):
        return checked_env_diff(timeout=timeout)


def memory_census(namespace: dict[str, Any], timeout: float | None = None) -> Any:
    """`multihost.memory_census` with names from the engine namespace (a collective)."""
    from multihost._checks._census import memory_census as census

    with _reads(), _sequence.called_from('notebook: %mh_memory_census'):
        return census(namespace, timeout=timeout)


def nonfinite(
    namespace: dict[str, Any], name: str, timeout: float | None = None
) -> NonfiniteReport:
    """`multihost.nonfinite` of engine value ``name`` (a collective: every host calls it)."""
    from multihost._checks._nonfinite import nonfinite as checked_nonfinite

    with _reads(), _sequence.called_from(f'notebook: %mh_nonfinite {name}'):
        value = lookup_collective(namespace, name, 'nonfinite', timeout=timeout)
        return checked_nonfinite(value, timeout=timeout)


def replay(
    namespace: dict[str, Any],
    fn: str,
    args: list[str],
    again: int = 2,
    canonical: bool = False,
    timeout: float | None = None,
) -> Any:
    """`multihost.replay` of engine function ``fn`` on engine values ``args`` (a collective)."""
    from multihost._checks._replay import replay as run

    with _sequence.called_from(f'notebook: %mh_replay {fn}({", ".join(args)})'):
        function = lookup_collective(namespace, fn, 'replay', timeout=timeout)
        values = [lookup_collective(namespace, a, 'replay', timeout=timeout) for a in args]
        return run(function, *values, again=again, canonical=canonical, timeout=timeout)


def lookup_collective(
    namespace: dict[str, Any], name: str, kind: str, *, timeout: float | None = None
) -> Any:
    """`lookup` for a collective: a host lacking ``name`` still takes its turn in ``kind``.

    So every host raises the same `multihost.HostFailedError` at once ("name
    'partial' is not defined ... processes 2-3") and the sequence stays aligned,
    instead of the others waiting for it until their timeout. So does a host reading host
    copies (`_checks._hostreads`) whose value is the output of a launch not finished here.
    """
    from multihost._checks import _hostreads
    from multihost._errors import HostFailedError

    try:
        value = lookup(namespace, name)
        # Reading host copies (a launch in flight here), a leaf not ready is named on every
        # host at once, never waited for.
        why = _hostreads.unready(value, name) if _hostreads.active() else None
        if why is not None:
            raise GatherError(why)
        return value
    except GatherError as exc:
        reason = str(exc)
        try:
            _sequence.fail_turn(kind, '', reason, timeout=timeout)
        except HostFailedError as failed:
            # Every host lacks it the same way (a typo): say it once, in one line.
            if len(failed.reasons) == _kv.process_count() and set(failed.reasons.values()) == {
                reason
            }:
                raise GatherError(reason) from None
            raise


def sequence_position() -> int:
    """The number of the next multihost collective this process will enter."""
    return _sequence.position()


def realign_sequence(seq: int) -> int:
    """Moves this process's collective count forward to ``seq`` (after an interrupt).

    Returns the position now.
    """
    _sequence.realign(int(seq))
    return _sequence.position()
