"""A session's engine starts here: JAX's distributed runtime, then `multihost.install`.

Above the rest of `multihost.engine` (and `_job`, whose installer runs `engine.stopped`, a
tool of this room, as a patcher): the start goes through the public surface, so an
engine loads the whole drop-in as any host that uses one of its names does.
"""

from __future__ import annotations

from typing import Any

from multihost.engine.net import engine_info

__all__ = ['initialize', 'install', 'same_cell_names']


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

    same_cell_names()
    try:
        multihost.install()
    except ValueError:  # installed already, with other options: those stay
        pass


#: The part of an ipykernel cell's file name that differs by process:
#: ``/tmp/ipykernel_<pid>/<hash of the cell>.py``.
CELL_DIRECTORY = r'ipykernel_[0-9]+/'


def same_cell_names() -> None:
    """Makes a ``%%mh`` cell's programs the same on every host: JAX's HLO source paths
    lose ipykernel's per-process directory.

    ipykernel names a cell's code ``/tmp/ipykernel_<pid>/<hash>.py``, and JAX writes that
    path into every op's metadata, so one cell jitted on N engines is N different
    programs. jax 0.12 on CPU then hangs in the program's first collective (its
    processes do not meet; seen with jax 0.12.1). JAX's own setting
    ``jax_hlo_source_file_canonicalization_regex`` removes what it matches from those
    paths: this adds `CELL_DIRECTORY` to it (as an alternative, keeping a pattern
    already set). Only the metadata changes; a program run outside a cell is untouched.
    """
    import jax

    current = getattr(jax.config, 'jax_hlo_source_file_canonicalization_regex', None)
    if current is not None and CELL_DIRECTORY in current:
        return
    pattern = CELL_DIRECTORY if not current else f'(?:{current})|{CELL_DIRECTORY}'
    jax.config.update('jax_hlo_source_file_canonicalization_regex', pattern)
