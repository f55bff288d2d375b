"""`multihost.install`: the checked collectives in place of JAX's, in code nobody edited.

`install` puts our functions (`multihost.sync_global_devices`, ...) where
JAX's public functions of `jax.experimental.multihost_utils` were: on that
module, and wherever an imported module took one of them by name
(``from jax.experimental.multihost_utils import sync_global_devices``), found
by identity in every module's globals. Then it runs the patchers
(`patchers`). `uninstall` puts every replaced reference back, also in modules
imported while installed that took ours by name (found the same way), and
undoes the patchers. Our own modules keep JAX's originals (captured at
import): an installed call never reaches itself.

Installed calls wait as long as JAX's would (a restore may take hours):
unless a timeout was asked for (``install(timeout=...)`` or
``MULTIHOST_TIMEOUT``), they never raise `BarrierTimeoutError`; every
``MULTIHOST_TIMEOUT`` (default `DEFAULT_TIMEOUT`) they log one line naming
who is missing and where (`_sequence.waiting`). Explicit calls of
``multihost.*`` keep their own timeouts.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, Protocol

from multihost._checks import _treediff
from multihost._core import _arrays, _collectives, _fault
from multihost._exchange import _sequence
from multihost._job import _options, _wiring
from multihost._job._options import InstallOptions


class Patcher(Protocol):
    """What `install` runs after swapping the functions: a module with these two."""

    __name__: str

    def patch(self, options: InstallOptions) -> None:
        """Applies the options (again: takes the new ones); raises to refuse them."""

    def unpatch(self) -> None:
        """Undoes `patch` (a no-op when not patched)."""


def patchers() -> tuple[Patcher, ...]:
    """The patchers `install` runs, in order (`uninstall`: in reverse). Imported when
    installing, not with `multihost`: `multihost.engine` imports the package itself."""
    from multihost._job import _attach, _fate, _interrupt, _jit, _numbering, _service
    from multihost.engine import stopped

    return (
        _jit,
        _service,
        _attach,
        _numbering,  # hosts numbered one way (process_index, TPU_WORKER_ID)
        _fate,
        _interrupt,  # Ctrl-C on a main thread blocked in native code
        stopped,  # every stopped host answers an attached notebook's data tools
    )


#: JAX's public functions that become ours: name -> (ours, whether it waits in
#: the collective sequence, so its installed form gets the installed timeout).
_OURS: dict[str, tuple[Any, bool]] = {
    'assert_equal': (_treediff.assert_equal, True),
    'broadcast_one_to_all': (_collectives.broadcast_one_to_all, True),
    'global_array_to_host_local_array': (_arrays.global_array_to_host_local_array, True),
    'host_local_array_to_global_array': (_arrays.host_local_array_to_global_array, True),
    'live_devices': (_fault.live_devices, False),
    'process_allgather': (_collectives.process_allgather, True),
    'reached_preemption_sync_point': (_fault.reached_preemption_sync_point, False),  # + dump
    'sync_global_devices': (_collectives.sync_global_devices, True),
}

#: Modules whose references are never swapped: ours hold JAX's originals on purpose.
_OWN = 'multihost'


class _Installed:
    """What one `install` replaced, so that `uninstall` can put it back."""

    def __init__(self, options: InstallOptions) -> None:
        self.options = options
        self.originals: dict[str, Any] = {}  # name -> JAX's function
        self.replacements: dict[str, Any] = {}  # name -> what took its place
        self.references = 0  # by-name references replaced at install (the module's own too)
        self.patchers: list[Patcher] = []


_lock = threading.Lock()
_active: _Installed | None = None


def install(
    *,
    check_jit: bool = False,
    timeout: float | None = None,
    control_file: str | None = None,
    control_address: str | None = None,
    dump_dir: str | None = None,
    hold_on_error: bool = False,
    hold_for: float | None = None,
    allow_exec: bool = False,
    audit: int | bool | str | None = None,
    audit_log: str | None = None,
    audit_raise: bool = False,
    audit_replay: bool = False,
) -> None:
    """Makes the program's own and its libraries' multi-host calls the checked ones.

    After it, the public functions of `jax.experimental.multihost_utils` are
    `multihost`'s (sequence-checked and recorded in the flight records), in
    that module and wherever a module already imported took them by name;
    the patchers (jitted launches, the coordination client) are applied.
    Callable before `jax.distributed.initialize`: nothing touches the backend
    or the client until they exist. Functions a library bound before install
    in other ways (a closure, a class attribute) are not seen; `python -m
    multihost run` installs before the program imports anything.

    Args:
      (each option's sentence, from `_options.OPTIONS`; assembled below the function)

    Raises:
      ValueError: already installed with other options (`uninstall` first).
    """
    apply(InstallOptions.resolve(locals()))  # exactly the keywords: nothing else is bound yet


install.__doc__ = (install.__doc__ or '').replace(
    "      (each option's sentence, from `_options.OPTIONS`; assembled below the function)\n",
    _options.install_args() + '\n',
)


def apply(options: InstallOptions) -> None:
    """`install` with its options resolved (``multihost run``: `InstallOptions.resolve` of the
    command line's).

    Raises:
      ValueError: already installed with other options (`uninstall` first).
    """
    global _active
    _wiring.wire()
    with _lock:
        if _active is not None:
            if _active.options == options:
                return
            raise ValueError(
                f'multihost is already installed with {_describe(_active.options)}; '
                f'install was called again with {_describe(options)}. '
                'Call multihost.uninstall() first to change the options.'
            )
        from jax.experimental import multihost_utils

        done = _Installed(options)
        for name, (ours, timed) in _OURS.items():
            original = getattr(multihost_utils, name, None)
            if original is None:
                continue  # this JAX has no such function
            done.originals[name] = original
            done.replacements[name] = _installed_call(ours, options) if timed else ours
            if name == 'reached_preemption_sync_point':
                done.replacements[name] = _preemption_point(ours)
        done.references = _swap(done.originals, done.replacements)
        try:
            for patcher in patchers():
                patcher.patch(options)
                done.patchers.append(patcher)
        except BaseException:
            _undo(done)
            raise
        _active = done
        if options.dump_dir is not None:
            from multihost._job import _triggers

            _triggers.enable(options.dump_dir)


def uninstall() -> None:
    """Undoes `install`: every replaced reference is JAX's again (no-op when not installed).

    Modules imported while installed that took an installed function by name
    get JAX's back too; the patchers restore what they replaced.
    """
    global _active
    with _lock:
        if _active is not None:
            if _active.options.dump_dir is not None:
                from multihost._job import _triggers

                _triggers.disable()
            _undo(_active)
            _active = None


def installed() -> dict[str, Any] | None:
    """What is installed (options, replaced functions, patchers), or None."""
    with _lock:
        if _active is None:
            return None
        return {
            'check_jit': _active.options.check_jit,
            'timeout': _active.options.timeout,
            'control_file': _active.options.control_file,
            'dump_dir': _active.options.dump_dir,
            'functions': sorted(_active.originals),
            'references': _active.references,
            'patchers': [p.__name__ for p in _active.patchers],
        }


def _describe(options: InstallOptions) -> str:
    out = f'check_jit={options.check_jit}, timeout={options.timeout}'
    if options.control_file:
        out += f', control_file={options.control_file!r}'
    if options.dump_dir:
        out += f', dump_dir={options.dump_dir!r}'
    if options.audit:
        out += f', audit={options.audit}'
    return out


def _undo(done: _Installed) -> None:
    """Unpatches the patchers (last first), then swaps every installed function back."""
    try:
        for patcher in reversed(done.patchers):
            patcher.unpatch()
    finally:
        _swap(done.replacements, done.originals)


def _installed_call(ours: Callable[..., Any], options: InstallOptions) -> Callable[..., Any]:
    """``ours`` as installed: collectives given no timeout wait `InstallOptions.wait`."""

    @functools.wraps(ours)
    def installed_call(*args: Any, **kwargs: Any) -> Any:
        with _sequence.waiting(options.wait):
            return ours(*args, **kwargs)

    return installed_call


def _preemption_point(ours: Callable[..., Any]) -> Callable[..., Any]:
    """``reached_preemption_sync_point``, dumping (with a dump directory) when it says True."""

    @functools.wraps(ours)
    def reached_preemption_sync_point(step_id: int) -> bool:
        reached = ours(step_id)
        if reached:
            from multihost._job import _triggers

            _triggers.preempted(step_id)
        return bool(reached)

    return reached_preemption_sync_point


def _swap(old: dict[str, Any], new: dict[str, Any]) -> int:
    """In every imported module's globals, each value that *is* ``old[name]`` becomes ``new[name]``.

    Returns how many references were replaced. One identity test per global
    in C (`set.isdisjoint` over ids) rejects the modules holding none; our own
    modules are skipped (they keep JAX's originals on purpose).
    """
    by_id = {id(f): new[name] for name, f in old.items()}
    ids = set(by_id)
    count = 0
    for module_name, module in list(sys.modules.items()):
        if module_name == _OWN or module_name.startswith(_OWN + '.'):
            continue
        if not isinstance(module, types.ModuleType):
            continue
        # Not `vars(module)`: a lazy module's attribute access would import it.
        namespace = object.__getattribute__(module, '__dict__')
        try:
            if ids.isdisjoint(map(id, namespace.values())):
                continue
        except RuntimeError:  # another thread changed it meanwhile: look at every item
            pass
        for key, value in list(namespace.items()):
            if id(value) in ids:
                namespace[key] = by_id[id(value)]
                count += 1
    return count
