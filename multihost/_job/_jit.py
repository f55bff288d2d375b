"""Installed jit: every function jitted after `patch` records each of its launches.

`patch` replaces `jax.jit` (and `jax.experimental.pjit.pjit`, while JAX still
has it), and every reference to them that modules outside JAX and
`multihost` took by name (``from jax import jit``), with versions that return
a `Jitted`: JAX's own jitted function inside, called directly (its C++ fast
path is untouched), plus one flight-recorder entry per launch (kind
``'launch'``, the function's name, the first call site outside JAX and
`multihost`, whether the computation spans devices of other processes, and a
weak reference to an output to ask ``is_ready()`` later). Calls made while
something traces (inside an outer jit, scan, grad, vmap) or under
`jax.disable_jit` are not launches and pass straight through; so do functions
JAX or `multihost` jit themselves (eager operations are not launches).

Record-only, a call costs a few microseconds: no flattening of the
arguments, no signature. Whether the computation spans processes is read
after the call from an output's sharding (cached per sharding object), and
until then the function's previous answer stands.

With ``check_jit`` every call builds `multihost.watch`'s signature key
(`_watch.Watched`); a signature seen for the first time is compiled before
launch to learn its devices, and only the signatures that span devices of
more than one process take `watch`'s cross-host check (`_sequence.check_launch`
and the program comparison); the others are recorded only.

With stepping on (`multihost.set_stepping`, a `ControlClient`, ``mhnotebook.attach``),
a recorded launch waits at `_stepgate.launch_gate` until released; a checked
one waits at the collective step gate.

Functions jitted before `patch` are not seen. `unpatch` puts every replaced
reference back, including the ones modules imported meanwhile took by name;
functions jitted meanwhile keep working and stop recording.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jaxlib

from multihost import _cells, _jax_adapter, _recorder
from multihost._debug import _stepgate, _watch
from multihost._exchange import _sequence
from multihost._job import _audit, _launchtable
from multihost._job._options import InstallOptions

#: Module name prefixes whose references are never replaced: JAX's own (which
#: jits its eager operations) and the toolkit's.
_SKIP_MODULES = ('jax', 'jaxlib', 'multihost')
#: Folders whose code is neither a call site nor a user of the installed jit.
_SKIP_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (jax.__file__, jaxlib.__file__, os.path.dirname(os.path.abspath(__file__)))
)


class _State:
    """What is patched now (one per process)."""

    def __init__(self) -> None:
        self.active = False
        self.check = False
        self.wait = 0.0  # check_jit's wait at a check (`InstallOptions.wait`)
        self.jit: Any = None  # JAX's jax.jit
        self.pjit: Any = None  # JAX's pjit, when it has one
        self.jit_patched: Any = None
        self.pjit_patched: Any = None
        self.pjit_deprecation: tuple[dict[str, Any], Any] | None = None  # (table, JAX's entry)
        self.excluded = False  # this file hidden in JAX's tracebacks (once per process)


_state = _State()
# Read by every call (module globals: one dict lookup each).
_ACTIVE = False
_CHECK = False
_AUDIT = False


# -- the jitted function ------------------------------------------------------------


class Jitted:
    """A function jitted under `multihost.install`: JAX's jitted function, launches recorded.

    Calls, attributes (``lower``, ``trace``, ``eval_shape``, ``clear_cache``,
    ``__wrapped__``, ...), method binding, ``repr`` and pickling are those of
    JAX's object inside.
    """

    __slots__ = (
        '_fn',
        '_name',
        '_spans',
        '_sharding',
        '_watched',
        '_by_key',
        '_entry',
        '_programs',
        '_abstract',
        '__dict__',
        '__weakref__',
    )

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        self._name = _name(fn)
        self._spans: bool | None = None  # the last launch's answer
        self._sharding: Any = None  # ... read from this output sharding
        self._watched: _watch.Watched | None = None  # check_jit only: signatures, the check
        self._by_key: dict[Any, bool] = {}  # check_jit only: signature -> spans processes
        self._entry: Any = None  # the last recorded launch's entry
        self._programs = 0  # programs JAX holds compiled for it, at the last launch
        self._abstract: tuple = ()  # (args, kwargs) as shapes of each program compiled, newest last
        _launchtable.JITTED.add(self)
        self.__dict__.update(getattr(fn, '__dict__', {}))  # __wrapped__, __name__, _jit_info...

    # JAX's stages, on the class: `jax.stages.Wrapped` (a runtime protocol) looks
    # for them there, not through `__getattr__`.
    @property
    def lower(self) -> Any:
        return self._fn.lower

    @property
    def trace(self) -> Any:
        return self._fn.trace

    @property
    def eval_shape(self) -> Any:
        return self._fn.eval_shape

    @property
    def clear_cache(self) -> Any:
        return self._fn.clear_cache

    @property
    def _multihost_unrecorded(self) -> Any:
        """JAX's jitted function inside (`multihost.watch` records it once, not twice)."""
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if not _ACTIVE or not _jax_adapter.launches_now():
            return fn(*args, **kwargs)
        if _CHECK:
            return self._checked(args, kwargs)
        return self._recorded(_site(), args, kwargs)

    def _recorded(self, site: str, args: tuple, kwargs: dict) -> Any:
        """The launch, recorded (not checked); with stepping on, held at the launch gate first."""
        if _AUDIT:
            _audit.before(self._name, self._fn, args, kwargs)
        if _stepgate.stepping_enabled():
            _stepgate.launch_gate(self._name, site)
        entry = _recorder.note('launch', self._name, seq=None, digest='', site=site, checked=False)
        entry.spans = self._spans
        ident = threading.get_ident()
        _launchtable.IN_FLIGHT[ident] = (entry, self, args, kwargs)  # a dump lowers it again
        try:
            out = self._fn(*args, **kwargs)
        except BaseException:
            _recorder.finished(entry, failed=True)
            raise
        finally:
            _launchtable.IN_FLIGHT.pop(ident, None)
        self._entry = entry
        programs = _jax_adapter.cache_size(self._fn)
        if programs != self._programs:  # this call compiled: keep its signature, as shapes
            kept = self._abstract if programs > self._programs else ()  # () after clear_cache
            self._programs = programs
            self._abstract = (
                *kept[1 - _launchtable.MAX_PROGRAMS :],
                _launchtable.abstract(args, kwargs),
            )
        # The record learns the launch's devices and keeps an output to ask later.
        try:
            first = _watch.first_array(out)
            if first is not None:
                sharding = first.sharding
                if sharding is not self._sharding:  # JAX reuses a program's output shardings
                    self._spans, self._sharding = _spans_of(sharding), sharding
                entry.spans = self._spans
            last = _watch.last_array(out)
        except Exception:  # an output JAX made but this cannot read: record without it
            first = last = None
        _recorder.launched(entry, first, last)
        if _AUDIT:
            _audit.after(self._name, site, self._fn, self._spans, args, kwargs, out)
        return out

    def _checked(self, args: tuple, kwargs: dict) -> Any:
        """A call under ``check_jit``: checked across hosts when its computation spans processes."""
        watched = self._watched
        if watched is None:
            watched = self._watched = _watch.Watched(self._fn, name=self._name, check=True)
        key = watched.signature_key(args, kwargs)
        if key is None:  # a tracer argument (under `jax.ensure_compile_time_eval`, say)
            return self._fn(*args, **kwargs)
        site = _site(3)
        spans = self._by_key.get(key)
        sig = None
        if spans is None:
            try:
                sig = watched.compiled_signature(args, kwargs)
            except Exception:  # does not build here: the check says so on every host
                spans = True
            else:
                spans = self._by_key[key] = _compiled_spans(sig.compiled)
        if spans:  # checked as installed calls wait: as long as JAX's would, unless asked
            if _AUDIT:
                _audit.before(self._name, self._fn, args, kwargs)
            with _sequence.waiting(_state.wait):
                out = watched.launch(key, args, kwargs, sig=sig, site=site, spans=True)
            if _AUDIT:
                _audit.after(self._name, site, self._fn, True, args, kwargs, out)
            return out
        return self._recorded(site, args, kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __getattr__(self, name: str) -> Any:
        try:
            fn = object.__getattribute__(self, '_fn')
        except AttributeError:  # not initialized yet (copy, unpickling)
            raise AttributeError(name) from None
        return getattr(fn, name)

    def __repr__(self) -> str:
        return repr(self._fn)

    def __reduce__(self) -> tuple[Callable[[Any], Jitted], tuple[Any]]:
        # Pickles as JAX's object does (it fails as JAX's fails) and comes back installed.
        return _restore, (self._fn,)


def _restore(fn: Any) -> Jitted:
    """Unpickling: JAX's jitted function, wrapped again."""
    return Jitted(fn)


def _name(fn: Any) -> str:
    """The jitted function's name, the same on every host (no addresses)."""
    inner = getattr(fn, '__wrapped__', fn)
    while isinstance(inner, functools.partial):
        inner = inner.func
    name = getattr(inner, '__name__', None) or getattr(fn, '__name__', None)
    return str(name or type(inner).__name__)


#: id(sharding) -> (the sharding, whether its devices belong to other processes too).
_SPANS: dict[int, tuple[Any, bool]] = {}
_MAX_SHARDINGS = 4096


def _spans_of(sharding: Any) -> bool:
    """Whether ``sharding`` holds devices of a process other than this one (cached)."""
    hit = _SPANS.get(id(sharding))
    if hit is not None and hit[0] is sharding:
        return hit[1]
    me = jax.process_index()
    spans = any(d.process_index != me for d in sharding.device_set)
    if len(_SPANS) >= _MAX_SHARDINGS:
        _SPANS.clear()
    _SPANS[id(sharding)] = (sharding, spans)
    return spans


def _compiled_spans(compiled: Any) -> bool:
    """Whether a compiled computation's inputs or outputs lie on devices of other processes."""
    if compiled is None:
        return True  # unknown: check
    shardings = jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings))
    return any(_spans_of(s) for s in shardings)


# -- call sites ---------------------------------------------------------------------

#: File name -> whether it is JAX's or the toolkit's.
_INSIDE: dict[str, bool] = {}


def _skipped(filename: str) -> bool:
    inside = _INSIDE.get(filename)
    if inside is None:
        inside = _INSIDE[filename] = os.path.abspath(filename).startswith(_SKIP_DIRS)
    return inside


def _site(depth: int = 2) -> str:
    """``file:line`` of the innermost frame outside JAX and `multihost` (or the cell's site).

    ``depth``: how far up the user's frame usually is (2: the caller of
    `Jitted.__call__`); reached at once, the frames between are never made
    into frame objects (Python 3.11+ makes them lazily).
    """
    override = _sequence.site_override()
    if override is not None:
        return override
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        inside = _INSIDE.get(code.co_filename)
        if inside is None:
            inside = _skipped(code.co_filename)
        if not inside:
            return _cells.place(code.co_filename, frame.f_lineno)  # a cell: Cell In[4], line 3
        frame = frame.f_back
    return '<unknown>'


# -- the patched functions ------------------------------------------------------------


def _wrap(out: Any) -> Any:
    """JAX's jitted function (or decorator making one) -> the installed one."""
    if hasattr(out, 'lower') and hasattr(out, 'trace') and callable(out):
        return Jitted(out)
    if callable(out):  # ``jax.jit(static_argnums=...)``: a decorator

        def decorator(fun: Callable[..., Any]) -> Any:
            return _wrap(out(fun))

        return decorator
    return out


def _patched(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (jax.jit or pjit), returning `Jitted` to every caller outside JAX and us."""

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if _skipped(sys._getframe(1).f_code.co_filename):
            return out  # JAX's eager operations, the toolkit's own programs
        return _wrap(out)

    return patched


def _modules() -> Iterator[dict[str, Any]]:
    """The namespaces of the imported modules outside JAX and `multihost`."""
    for name, module in list(sys.modules.items()):
        if module is None or name.split('.', 1)[0] in _SKIP_MODULES:
            continue
        try:  # not through the module's own __getattribute__: lazy modules stay unloaded
            namespace = object.__getattribute__(module, '__dict__')
        except Exception:
            continue
        if isinstance(namespace, dict):
            yield namespace


def _replace(pairs: dict[int, tuple[Any, Any]]) -> None:
    """Every module reference to an ``old`` object becomes ``new`` (``pairs``: id(old) -> both)."""
    ids = set(pairs)
    for namespace in _modules():
        try:
            if ids.isdisjoint(map(id, namespace.values())):  # a loop in C: most modules
                continue
            hits = [(k, v) for k, v in namespace.items() if id(v) in pairs]
        except RuntimeError:  # the module's namespace changed meanwhile (another thread)
            continue
        for k, v in hits:
            old, new = pairs[id(v)]
            if v is old:
                namespace[k] = new


def _pjit_module() -> Any:
    try:
        return importlib.import_module('jax.experimental.pjit')
    except ImportError:
        return None


def _patch_pjit() -> None:
    """Replaces ``jax.experimental.pjit.pjit`` (served through a deprecation warning, or not)."""
    module = _pjit_module()
    if module is None:
        return
    table = getattr(module, '_deprecations', None)
    if isinstance(table, dict) and 'pjit' in table and 'pjit' not in vars(module):
        message, original = table['pjit']
        if original is None:  # JAX made it raise: nothing to patch
            return
        _state.pjit, _state.pjit_patched = original, _patched(original)
        _state.pjit_deprecation = (table, table['pjit'])
        table['pjit'] = (message, _state.pjit_patched)
        _clear_getattr_cache(module)
    elif callable(vars(module).get('pjit')):
        _state.pjit = module.pjit
        _state.pjit_patched = module.pjit = _patched(module.pjit)


def _unpatch_pjit() -> None:
    module = _pjit_module()
    if module is None or _state.pjit is None:
        return
    if _state.pjit_deprecation is not None:
        table, entry = _state.pjit_deprecation
        if table.get('pjit', (None, None))[1] is _state.pjit_patched:
            table['pjit'] = entry
        _clear_getattr_cache(module)
    elif vars(module).get('pjit') is _state.pjit_patched:
        module.pjit = _state.pjit


def _clear_getattr_cache(module: Any) -> None:
    """JAX's deprecation ``__getattr__`` caches what it served: forget it."""
    clear = getattr(vars(module).get('__getattr__'), 'cache_clear', None)
    if clear is not None:
        clear()


# -- the patcher contract ---------------------------------------------------------------


def patch(options: InstallOptions) -> None:
    """Installs the recording jit (``options.check_jit``: check spanning launches across hosts).

    Touches neither the backend nor the coordination service: callable before
    `jax.distributed.initialize`. Patching again only takes the new options.
    """
    global _ACTIVE, _CHECK, _AUDIT
    _CHECK = _state.check = options.check_jit
    _audit.enable(
        options.audit,
        options.audit_log,
        options.audit_raise,
        replay=options.audit_replay,
        replay_dir=options.dump_dir,
    )
    _AUDIT = options.audit > 0
    _state.wait = options.wait
    if _state.active:
        return
    if not _state.excluded:
        _jax_adapter.exclude_from_tracebacks(os.path.abspath(__file__))
        _state.excluded = True
    _state.jit = jax.jit
    _state.jit_patched = _patched(jax.jit)
    _patch_pjit()
    pairs = {id(_state.jit): (_state.jit, _state.jit_patched)}
    if _state.pjit is not None:
        pairs[id(_state.pjit)] = (_state.pjit, _state.pjit_patched)
    jax.jit = _state.jit_patched
    _replace(pairs)
    _state.active = _ACTIVE = True


def unpatch() -> None:
    """Puts back every reference `patch` replaced and every one taken by name since."""
    global _ACTIVE, _CHECK, _AUDIT
    if not _state.active:
        return
    _ACTIVE = _CHECK = _AUDIT = _state.active = _state.check = False
    _audit.enable(0)
    if jax.jit is _state.jit_patched:
        jax.jit = _state.jit
    _unpatch_pjit()
    pairs = {id(_state.jit_patched): (_state.jit_patched, _state.jit)}
    if _state.pjit is not None:
        pairs[id(_state.pjit_patched)] = (_state.pjit_patched, _state.pjit)
    _replace(pairs)
    _state.jit = _state.jit_patched = _state.pjit = _state.pjit_patched = None
    _state.pjit_deprecation = None
