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
from multihost.engine.net import engine_info

if TYPE_CHECKING:
    from multihost import Layout, NonfiniteReport, ReplicaReport, TreeDiff, TreeLayout

__all__ = [
    'barrier',
    'diff',
    'env_diff',
    'initialize',
    'install',
    'layout',
    'lookup_collective',
    'memory_census',
    'nonfinite',
    'realign_sequence',
    'sequence_position',
    'serve_control',
]


def initialize(
    coordinator: str,
    num_processes: int,
    process_id: int,
    cpu_devices: int | None = None,
    *,
    platform: str | None = None,
    initialization_timeout: int = 120,
    heartbeat_timeout: int | None = None,
    coordinator_bind_address: str | None = None,
    recoverable: bool = False,
) -> dict[str, Any]:
    """Configures JAX on this engine and joins the distributed runtime.

    Args:
        coordinator: ``host:port`` of process 0's coordination service.
        num_processes: total number of JAX processes.
        process_id: this engine's JAX process index.
        cpu_devices: number of CPU devices to simulate (None: leave as is).
        platform: e.g. ``'cpu'`` to force the CPU backend.
        initialization_timeout: seconds to wait for every process to connect.
        heartbeat_timeout: seconds before a silent process is declared dead.
        coordinator_bind_address: ``host:port`` process 0's coordination service
            listens on (it is unauthenticated). None: JAX's default, every
            interface (``[::]:port``).
        recoverable: set ``jax_enable_recoverability`` first, so a process that
            dies does not take the others down with it (JAX's default is
            fate-sharing: the coordination service terminates every process
            once it notices one is gone); `multihost.live_devices` then
            reports the survivors.

    Then `multihost.install()`, so that what libraries call in ``%%mh`` cells is
    checked and recorded.

    Returns:
        `engine_info()` after initialization.
    """
    import jax

    if platform:
        jax.config.update('jax_platforms', platform)
    if cpu_devices:
        jax.config.update('jax_num_cpu_devices', int(cpu_devices))
    if recoverable:
        jax.config.update('jax_enable_recoverability', True)
    kwargs: dict[str, Any] = dict(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=initialization_timeout,
    )
    if heartbeat_timeout:
        kwargs['heartbeat_timeout_seconds'] = heartbeat_timeout
    if coordinator_bind_address:
        kwargs['coordinator_bind_address'] = coordinator_bind_address
    _whole_lines_from_c()
    jax.distributed.initialize(**kwargs)
    install()
    return engine_info()


def _whole_lines_from_c() -> None:
    """Makes C's ``stdout`` line-buffered (glibc; best effort, nothing elsewhere).

    Under ``PYTHONUNBUFFERED=1`` (or ``python -u``) Python leaves it unbuffered, so a
    C++ library's line (XLA's Gloo reports each new clique with one ``std::cout << ... <<
    std::endl``) is written piece by piece, and the engine's pipe reader forwards the pieces
    between the cell's own prints: ``[Gloo] Rank sum 1.0``. Line-buffered, as on a terminal,
    each line is one write.
    """
    import ctypes

    global _C_STDOUT_BUFFER
    if _C_STDOUT_BUFFER is not None:
        return
    try:
        libc = ctypes.CDLL(None)
        stream = ctypes.c_void_p.in_dll(libc, 'stdout')
        libc.fflush.argtypes = [ctypes.c_void_p]
        libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        # A buffer of its own: an unbuffered stream's is one byte, which glibc keeps when
        # given none (line-buffered on one byte is unbuffered). Kept for the process's life.
        buffer = ctypes.create_string_buffer(_C_STDOUT_BYTES)
        libc.fflush(stream)
        if libc.setvbuf(stream, ctypes.addressof(buffer), 1, _C_STDOUT_BYTES) == 0:  # _IOLBF
            _C_STDOUT_BUFFER = buffer
    except (OSError, AttributeError, ValueError):
        pass


#: C's stdout buffer (`_whole_lines_from_c`), held here while the process lives.
_C_STDOUT_BUFFER: Any = None
_C_STDOUT_BYTES = 8192


def install() -> None:
    """`multihost.install()` on this engine, unless something is installed already.

    So that what libraries call in ``%%mh`` cells (`jax.experimental.multihost_utils`,
    jitted launches) is checked and recorded like the notebook's own calls. An
    install the engine's program made itself, with its own options, stays.
    """
    import multihost

    try:
        multihost.install()
    except ValueError:  # installed already, with other options: those stay
        pass


def barrier(name: str, timeout: float | None = None) -> dict[str, Any]:
    """Runs `multihost.barrier` here and reports how it went (never raises its errors)."""
    import time

    import multihost

    t0 = time.perf_counter()
    try:
        with _sequence.called_from(f'notebook: %mh_barrier {name}'):
            multihost.barrier(name, timeout=timeout)
    except (multihost.BarrierTimeoutError, multihost.CollectiveMismatchError) as exc:
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
    import multihost

    return multihost.serve_control(authkey, (host, 0))


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

    import multihost

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
    described = multihost.describe_layout(value)
    report = None
    if check and isinstance(value, jax.Array):
        with _sequence.called_from(f'notebook: %mh_layout {name}'):
            report = multihost.check_replicas(value)
    return described, report


def diff(namespace: dict[str, Any], name: str, timeout: float | None = None) -> TreeDiff:
    """`multihost.tree_diff` of ``name`` (a collective: every host must call it)."""
    import multihost

    with _reads(), _sequence.called_from(f'notebook: %mh_diff {name}'):
        value = lookup_collective(namespace, name, 'tree_diff', timeout=timeout)
        return multihost.tree_diff(value, timeout=timeout)


def env_diff(timeout: float | None = None) -> Any:
    """`multihost.env_diff` for the notebook (a collective)."""
    import multihost

    with _sequence.called_from('notebook: %mh_env'):
        return multihost.env_diff(timeout=timeout)


def memory_census(namespace: dict[str, Any], timeout: float | None = None) -> Any:
    """`multihost.memory_census` with names from the engine namespace (a collective)."""
    import multihost

    with _reads(), _sequence.called_from('notebook: %mh_memory_census'):
        return multihost.memory_census(namespace, timeout=timeout)


def nonfinite(
    namespace: dict[str, Any], name: str, timeout: float | None = None
) -> NonfiniteReport:
    """`multihost.nonfinite` of engine value ``name`` (a collective: every host calls it)."""
    import multihost

    with _reads(), _sequence.called_from(f'notebook: %mh_nonfinite {name}'):
        value = lookup_collective(namespace, name, 'nonfinite', timeout=timeout)
        return multihost.nonfinite(value, timeout=timeout)


def lookup_collective(
    namespace: dict[str, Any], name: str, kind: str, *, timeout: float | None = None
) -> Any:
    """`lookup` for a collective: a host lacking ``name`` still takes its turn in ``kind``.

    So every host raises the same `multihost.HostFailedError` at once ("name
    'partial' is not defined ... processes 2-3") and the sequence stays aligned,
    instead of the others waiting for it until their timeout. So does a host reading host
    copies (`_checks._hostreads`) whose value is the output of a launch not finished here.
    """
    import multihost
    from multihost._checks import _hostreads

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
        except multihost.HostFailedError as failed:
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
