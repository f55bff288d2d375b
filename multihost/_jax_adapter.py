"""The one place where `multihost` reaches into JAX internals (`jax._src`).

JAX has public APIs for everything array-related that `multihost` needs
(`jax.make_array_from_single_device_arrays`, `NamedSharding`, `jax.jit(...,
out_shardings=...)`). It has none for the distributed runtime's
coordination-service client (key-value store, `wait_at_barrier`, live nodes)
or for the preemption sync manager. Every such use lives in this module, each
commented with what it touches and why, so a JAX upgrade that moves these
internals breaks exactly one file.

Verified against jax 0.10.2 and jax 0.12.
"""

from __future__ import annotations

from typing import Any

# INTERNAL: `jax._src.core`'s trace state (what `core.trace_state_clean` reads:
# the current trace is the eval trace, or none yet, and the axis environment
# is the top one) and `jax._src.config.disable_jit` (the `jax.disable_jit()`
# state). Public JAX says neither; `multihost.install`'s jitted functions ask
# both on every call to tell a launch from a call being traced (inside an
# outer jit, scan, grad or vmap, with or without tracer arguments) or run
# eagerly op by op, in well under a microsecond and without flattening the
# arguments.
from jax._src import config as _config
from jax._src import core as _core

# INTERNAL: `jax._src.distributed.global_state` is the process-wide state that
# `jax.distributed.initialize` fills in. Its `.client` (a
# `DistributedRuntimeClient`) and `.preemption_sync_manager` are not exported
# by any public module.
from jax._src import distributed as _distributed


def client() -> Any | None:
    """The coordination-service client, or None when JAX is not distributed.

    INTERNAL: `global_state.client` — the C++ `DistributedRuntimeClient`
    (methods used by `multihost`: `key_value_set`, `key_value_try_get`,
    `blocking_key_value_get`, `key_value_dir_get`, `key_value_delete`,
    `wait_at_barrier`, `get_live_nodes`).
    """
    return _distributed.global_state.client


def client_class() -> type | None:
    """The class of the coordination-service client, also before `jax.distributed.initialize`.

    INTERNAL: ``type(global_state.client)`` once there is a client; before,
    the same class from jaxlib's extension module (`jax._src.lib._jax`,
    ``DistributedRuntimeClient``; a nanobind class whose methods can be
    replaced on the class). `multihost._job._service` patches its barrier and
    blocking-get methods, because libraries (orbax) keep their own reference
    to the client object. None when neither is found (JAX moved it).
    """
    c = _distributed.global_state.client
    if c is not None:
        return type(c)
    from jax._src import lib as _lib

    ext = getattr(_lib, '_jax', None) or getattr(_lib, 'xla_extension', None)
    cls = getattr(ext, 'DistributedRuntimeClient', None)
    return cls if isinstance(cls, type) else None


def preemption_sync_manager() -> Any | None:
    """The preemption sync manager, or None when the service is off.

    INTERNAL: `global_state.preemption_sync_manager` — created by
    `jax.distributed.initialize` when `jax_enable_preemption_service` is on;
    its `reached_sync_point(step_id)` runs the agreement protocol.
    """
    return _distributed.global_state.preemption_sync_manager


def distributed_state() -> Any:
    """The process-wide distributed state (``.client``, ``.preemption_sync_manager``).

    INTERNAL: `jax._src.distributed.global_state` itself, for hot paths that
    read both attributes per call (`reached_preemption_sync_point` runs every
    training step) without two function calls.
    """
    return _distributed.global_state


def coordinator_address() -> str | None:
    """The coordinator address `jax.distributed.initialize` connected to.

    INTERNAL: `global_state.coordinator_address`; used only in messages.
    """
    return _distributed.global_state.coordinator_address


def backends_started() -> bool:
    """Whether this process has started its JAX backends (the first device operation does).

    INTERNAL: `jax._src.xla_bridge.backends_are_initialized` — no public API
    says it; a cold host's backend start waits for every other host's, so the
    cold-host tests check that a collective's check ran before it.
    """
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def device_assignment(sharding: Any) -> list[Any]:
    """The ordered device list of a sharding that is not a `NamedSharding`.

    INTERNAL: `Sharding._device_assignment` — public shardings expose only the
    unordered `device_set`; a replicated sharding built on these devices must
    keep their order for `jax.jit` to accept it next to the input.
    """
    return list(sharding._device_assignment)


def jit_statics(fn: Any) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """(static_argnums, static_argnames) of a `jax.jit` function; None when unknown.

    INTERNAL: `PjitFunction._jit_info` (a `PjitInfo`, built by
    `jax._src.pjit`) — the public object does not say which arguments are
    static, and `multihost.watch` must key static arguments by value and the
    others by type. None (not a jitted function, or JAX moved it): the caller
    keys every Python scalar by value, which is correct, only less cached.
    """
    info = getattr(fn, '_jit_info', None)
    if info is None:
        return None
    try:
        return tuple(info.static_argnums), tuple(info.static_argnames)
    except (AttributeError, TypeError):
        return None


def fingerprint(compiled: Any) -> str:
    """The fingerprint of a compiled executable (`jax.stages.Compiled`); '' when there is none.

    `Compiled.runtime_executable()` is public; its `.fingerprint` (bytes,
    computed by the PJRT client from the optimized program) is not
    documented. Two hosts compiling the same program get the same value.
    """
    try:
        fp = compiled.runtime_executable().fingerprint
    except Exception:
        return ''
    if fp is None:
        return ''
    if isinstance(fp, bytes):
        try:
            return fp.decode('ascii')
        except UnicodeDecodeError:
            return fp.hex()
    return str(fp)


_trace = _core.trace_state_strong_ref  # `trace_ctx.trace` without the property
_axis_env = _core.axis_env_state  # `trace_ctx.axis_env`
_eval_trace = _core.eval_trace
_top_axis_env = _core.top_axis_env
_disable_jit = _config.disable_jit


def launches_now() -> bool:
    """Whether a jitted function called now launches a computation (nothing traces, jit on).

    `jax._src.core.trace_state_clean` inlined (three C++ reads, no Python
    call inside): the hot path of every installed jitted call.
    """
    trace = _trace.value
    clean = trace is None or (trace is _eval_trace and _axis_env.value is _top_axis_env)
    return clean and not _disable_jit.value


def exclude_from_tracebacks(path: str) -> None:
    """Hides the frames of the file ``path`` in the tracebacks JAX filters, like its own.

    INTERNAL: `jax._src.traceback_util.register_exclusion`; `multihost.install`
    wraps every jitted function, and its one frame between the user's call and
    JAX's is noise in a traceback JAX shortens.
    """
    from jax._src import traceback_util

    traceback_util.register_exclusion(path)


def exit_cleanup() -> None:
    """What JAX does at interpreter exit, done now: backends cleared, distributed shut down.

    INTERNAL: `jax._src.api.clean_up` is the `atexit` handler JAX registers at
    import (clear the backends, clear caches, `jax.distributed.shutdown()`);
    calling it twice is harmless (the second finds nothing to clear or shut).
    `multihost`'s exit handler runs it before joining the debug thread, so that
    thread leaves its blocking coordination-service call (cancelled by the
    shutdown) while the interpreter still runs: a thread that returns from that
    C++ call after finalization began is ended inside it, which aborts the
    process (``terminate called ... FATAL: exception not rethrown``, exit -6).
    """
    from jax._src import api

    api.clean_up()


def has_host_copy(x: Any) -> bool:
    """Whether jax already holds a host copy of single-device array ``x`` (made by an
    earlier ``np.asarray``, kept on the array): reading it again copies nothing.

    INTERNAL: `jax._src.array.ArrayImpl._npy_value`, the numpy value `_value` caches when
    the copy was a real one (not a view of CPU memory). Public JAX does not say whether a
    copy is cached; `fingerprint.planning` packs small leaves into one buffer only when it is not.
    """
    return getattr(x, '_npy_value', None) is not None


def host_copy(x: Any) -> Any:
    """The host copy jax holds of single-device array ``x`` (a read-only numpy array), or
    None where it holds none or ``x`` was deleted.

    INTERNAL: `jax._src.array.ArrayImpl._npy_value` (see `has_host_copy`). ``np.asarray(x)``
    returns the same array through `__array__` and `_value`: 2-4 us a leaf of Python, and
    ``copy_to_host_async`` before it another 3-4 us, paid per small leaf at every
    fingerprint of a model state (`fingerprint.execute`); this read costs neither.
    """
    kept = getattr(x, '_npy_value', None)
    if kept is None or x.is_deleted():
        return None
    return kept


def equation_frames(eqn: Any) -> list[tuple[str, int, str]]:
    """(file, line, function) of the Python frames that made jaxpr equation ``eqn``,
    innermost first; empty when JAX kept none.

    INTERNAL: `JaxprEqn.source_info` is a `jax._src.source_info_util.SourceInfo`; its
    ``traceback`` (a jaxlib `Traceback`) has ``frames``. Public JAX offers no way to read
    where an equation came from; `multihost.replay` names the first equation whose outputs
    part between hosts by its line in the user's code.
    """
    try:
        frames = eqn.source_info.traceback.frames
    except AttributeError:
        return []
    return [(f.file_name, int(f.line_num), f.function_name) for f in frames or ()]


def cache_size(fn: Any) -> int:
    """How many programs a `jax.jit` function holds compiled (-1 when it does not say).

    INTERNAL: `PjitFunction._cache_size()` (C++, about 0.3 us) — public JAX does not say
    when a call compiled. `multihost.install`'s jit asks it after each recorded launch and
    keeps a new program's abstract signature, so a hang dump can name its collectives.
    """
    try:
        return int(fn._cache_size())
    except Exception:
        return -1


def executable_of(compiled: Any) -> Any:
    """The executable inside a `jax.stages.Compiled` (the same object each time JAX's own
    cache hands back the same program), else ``compiled`` itself.

    INTERNAL: `Compiled._executable` (a `MeshExecutable`): lowering a signature again gives a
    new `Compiled` around the cached executable; the collective table is cached by it.
    """
    return getattr(compiled, '_executable', None) or compiled
