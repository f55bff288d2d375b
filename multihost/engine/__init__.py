"""What the notebook side calls on each engine (one engine = one host = one JAX process).

`mhnotebook` ships a tiny trampoline over ipyparallel that imports this
module on the engine and calls one of these functions, so the real code is
installed, versioned and tested here rather than pickled from the notebook.
Everything returns plain, picklable data (numpy arrays, dicts, tuples).

Gathering a value into the notebook never runs a collective: every global
array's shards are exported once (only replica 0 of each distinct block, by
its owner) and the notebook puts each block in its place. On the notebook's
own machine the engines write straight into a shared-memory file the
notebook maps; elsewhere the shards travel as zero-copy zmq buffers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from multihost import _names
from multihost._exchange import _kv, _sequence

if TYPE_CHECKING:
    from multihost import Layout, NonfiniteReport, ReplicaReport, TreeDiff, TreeLayout

__all__ = [
    'CellObject',
    'GatherError',
    'NotShipped',
    'barrier',
    'controller_address',
    'diff',
    'engine_info',
    'env_diff',
    'free_port',
    'gather_local',
    'gather_meta',
    'gather_send',
    'gather_write',
    'host_port',
    'initialize',
    'layout',
    'lookup',
    'machine_id',
    'memory_census',
    'meta_digest',
    'nonfinite',
    'realign_sequence',
    'sequence_position',
    'serve_control',
    'split_url',
]


class GatherError(ValueError):
    """A value cannot be gathered into the notebook (the message says why and what to do)."""


def machine_id() -> str:
    """An id equal on processes of the same machine (boot id + hostname)."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = hex(uuid.getnode())
    return f'{socket.gethostname()}/{boot}'


def _host_address() -> str:
    """This host's address from its host name, or the default route's (no controller known)."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET)
        ips = [i[4][0] for i in infos]  # AF_INET: (ip, port) pairs
        addrs = [ip for ip in ips if isinstance(ip, str) and not ip.startswith('127.')]
        if addrs:
            return addrs[0]
    except OSError:
        pass
    # Fall back to the address of the default route's interface.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(('10.255.255.255', 1))
            return s.getsockname()[0]
        except OSError:
            return name


# The controller's registration URL as the notebook's connection file gives it
# (`engine_info(controller=...)`), kept so later calls agree with the first.
_controller_hint: str | None = None


def _engine_registration_url() -> str | None:
    """The URL this ipyparallel engine registered at (its own connection info), if any.

    Read from the running ``IPEngine`` application only if ipyparallel is
    already loaded (this package never imports it).
    """
    import sys

    app = getattr(sys.modules.get('ipyparallel.engine.app'), 'IPEngine', None)
    try:
        if app is None or not app.initialized():
            return None
        return str(app.instance().registration_url) or None
    except Exception:  # not an engine application, or an older ipyparallel
        return None


def split_url(url: str) -> tuple[str, int]:
    """``('10.0.0.1', 5555)`` from ``tcp://10.0.0.1:5555`` (also ``[::1]:5555``, ``host:5555``)."""
    rest = url.split('://', 1)[-1].rstrip('/')
    host, sep, port = rest.rpartition(':')
    if not sep or not port.isdigit():
        return rest.strip('[]'), 0
    return host.strip('[]'), int(port)


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[fd00::2]:1234``)."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def _route_source(host: str, port: int) -> str:
    """The local address this host sends from to reach ``host`` (a UDP connect: no traffic)."""
    errors = []
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(
        host, port or 9, type=socket.SOCK_DGRAM
    ):
        with socket.socket(family, kind, proto) as s:
            try:
                s.connect(sockaddr)
                return str(s.getsockname()[0])
            except OSError as exc:
                errors.append(f'{sockaddr[0]}: {exc.strerror or exc}')
    raise OSError('; '.join(errors) or f'{host} resolves to no address')


def controller_address(controller: str | None = None) -> tuple[str, str]:
    """The address this engine uses to reach the ipyparallel controller, and how it was found.

    Other hosts reach this host at that address (the controller's network is
    the cluster's network), unlike its host name, which may resolve to
    loopback or not at all on the other hosts. Tried in order: the URL this
    engine registered at, then ``controller`` (the notebook's connection
    info); failing both, the host name's address or the default route's.

    Returns:
        ``(address, how)``; ``how`` says what was tried, for error messages.
    """
    global _controller_hint
    if controller:
        _controller_hint = controller
    tried = []
    candidates = [
        (_engine_registration_url(), 'the URL this engine registered at'),
        (_controller_hint, "the controller's URL in the notebook's connection file"),
    ]
    for url, what in candidates:
        if not url:
            continue
        host, port = split_url(url)
        try:
            address = _route_source(host, port)
        except OSError as exc:
            tried.append(f'no route to the controller at {host} ({what}): {exc}')
            continue
        return address, f'the address this host uses to reach the controller at {host} ({what})'
    address = _host_address()
    tried.append(f'fell back to the address of host name {socket.gethostname()!r}: {address}')
    return address, '; '.join(tried)


def engine_info(controller: str | None = None) -> dict[str, Any]:
    """Where this engine runs and whether JAX is distributed here yet.

    ``address`` is the address this engine uses to reach the controller
    (`controller_address`; ``controller``: the controller's URL as the
    notebook knows it, tried after the engine's own); ``address_from`` says
    how it was found; once JAX is distributed, ``coordinator`` is the
    coordination service's address.
    """
    import sys

    address, how = controller_address(controller)
    info: dict[str, Any] = dict(
        pid=os.getpid(),
        hostname=socket.gethostname(),
        address=address,
        address_from=how,
        machine=machine_id(),
        python=sys.version.split()[0],
        initialized=False,
    )
    if 'jax' in sys.modules:
        from multihost import _jax_adapter

        if _jax_adapter.client() is not None:
            import jax

            info.update(
                initialized=True,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                local_devices=[d.id for d in jax.local_devices()],
                jax=jax.__version__,
                backend=jax.default_backend(),
                coordinator=_jax_adapter.coordinator_address(),
            )
    return info


def free_port(host: str = '') -> int:
    """A TCP port free on ``host``, an address of this host (``''``: every interface).

    For the coordinator, when this is process 0: probed on the address it
    will listen on, so a port free elsewhere but taken there is not chosen.
    """
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    jax.distributed.initialize(**kwargs)
    return engine_info()


def lookup(namespace: dict[str, Any], name: str, *, cuts: bool = False) -> Any:
    """The engine value ``name`` names: ``x``, ``state.params.embed``, ``state.params['embed']``,
    ``state.opt_state[0]`` (`multihost._names.resolve`: parsed, never evaluated).

    With ``cuts``, returns ``(value, cut)``: a trailing array cut (``x[::4, :128]``) is
    returned as a tuple of ints and slices (None without one) rather than refused.

    Raises:
        GatherError: the name does not parse or a step fails (which one, what was there).
    """
    try:
        value, cut = _names.resolve(namespace, name, cuts=cuts)
    except _names.BadName as exc:
        raise GatherError(str(exc)) from None
    return (value, cut) if cuts else value


# A selection on the hosts (``%mh_allgather x[::4, :128]``): per axis of a
# global array, ('int', i) or ('slice', start, stop, step) with step > 0.
Selection = tuple[tuple[Any, ...], ...]


def _selection(name: str, index: tuple[Any, ...], shape: tuple[int, ...]) -> Selection:
    """Normalizes ``index`` (ints and slices only) against ``shape``."""
    where = name + _names.format_index(index)
    if len(index) > len(shape):
        raise GatherError(f'{where}: {len(index)} indices for an array of rank {len(shape)}.')
    out: list[tuple[str, int] | tuple[str, int, int, int]] = []
    for axis, n in enumerate(shape):
        i = index[axis] if axis < len(index) else slice(None)
        if isinstance(i, slice):
            if i.step is not None and i.step <= 0:
                raise GatherError(
                    f'{where}: a global array is sliced on the hosts with '
                    'positive steps only; reverse the result in the notebook.'
                )
            out.append(('slice', *i.indices(n)))
        elif isinstance(i, int | np.integer) and not isinstance(i, bool):
            j = int(i) + n if i < 0 else int(i)
            if not 0 <= j < n:
                raise GatherError(
                    f'{where}: index {int(i)} is out of range for axis {axis} (size {n}).'
                )
            out.append(('int', j))
        else:
            raise GatherError(f'{name}: index {i!r} is not an int or a slice.')
    return tuple(out)


def _gather_target(
    namespace: dict[str, Any], name: str, index: Any = None
) -> tuple[Any, Selection | None]:
    """The value to gather and, for a global array sliced on the hosts, its selection.

    A host-local value is sliced here with numpy (a view); a global array is
    not sliced at all: each host takes the selected part of the blocks it
    sends (`_global_blocks`), so no device computation and no collective runs.
    """
    import jax

    value, cut = lookup(namespace, name, cuts=True)
    if cut is not None and index is None:  # the name ended with it (x[3] on an array)
        head, steps = _names.parse(name, cuts=True)
        name, index = _names.format_steps(head, steps[:-1]), cut
    elif cut is not None:
        raise GatherError(
            f'{name}: cut twice ({_names.format_index(cut)} and {_names.format_index(index)}).'
        )
    if index is None:
        return value, None
    index = tuple(index) if isinstance(index, tuple | list) else (index,)
    if not isinstance(value, jax.Array | np.ndarray | np.generic):
        raise GatherError(
            f'{name}{_names.format_index(index)} slices an array, but {name} is a '
            f'{type(value).__name__}; slice one array (a variable or an attribute).'
        )
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return value, _selection(name, index, tuple(value.shape))
    try:
        if isinstance(value, jax.Array) and _key_impl(value) is not None:
            return value[index], None  # a host-local key array: cut here, still keys
        return np.asarray(value)[index], None
    except (IndexError, TypeError, ValueError) as exc:
        raise GatherError(f'{name}{_names.format_index(index)}: {exc}') from None


def _key_impl(x: Any) -> tuple[str, tuple[int, ...]] | None:
    """``(impl name, key data's trailing shape)`` of a PRNG key array, else None."""
    import jax

    dtype = getattr(x, 'dtype', None)
    if not isinstance(x, jax.Array) or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    data = jax.eval_shape(jax.random.key_data, x)  # abstract: nothing runs
    return str(jax.random.key_impl(x)), tuple(data.shape[x.ndim :])


def _key_selection(x: Any, sel: Selection | None) -> Selection | None:
    """A selection of a key array, extended over its key data's trailing axes (kept whole)."""
    key = _key_impl(x)
    if sel is None or key is None:
        return sel
    return sel + tuple(('slice', 0, n, 1) for n in key[1])


def _as_data(x: Any) -> Any:
    """A PRNG key array's key data (`jax.random.key_data`); anything else as it is."""
    import jax

    dtype = getattr(x, 'dtype', None)
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    return x


def _global_blocks(x: Any, sel: Selection | None) -> list[tuple[tuple[tuple[int, int], ...], Any]]:
    """This host's replica-0 blocks of global array ``x``: (place in the result, data).

    With a selection, the place is in the selected result's coordinates and
    the data is the selected part of the block (a numpy view); blocks that
    hold none of the selection are left out. A PRNG key array's blocks are
    its key data (each shard's `jax.random.key_data`, on its own device:
    nothing global runs), one or more axes longer.
    """
    key = _key_impl(x)
    extra = [(0, n) for n in key[1]] if key else []
    sel = _key_selection(x, sel)
    out = []
    for s in x.addressable_shards:
        if s.replica_id != 0:
            continue
        # a key array's shards may report the index of its key data (longer): cut to its rank
        bounds = [
            (sl.start or 0, x.shape[d] if sl.stop is None else sl.stop)
            for d, sl in enumerate(s.index[: x.ndim])
        ] + extra
        if sel is None:
            out.append((tuple(bounds), s))
            continue
        place, local = [], []
        for (a, b), axis in zip(bounds, sel):
            if axis[0] == 'int':
                if not a <= axis[1] < b:
                    break
                local.append(axis[1] - a)
                continue
            start, stop, step = axis[1:]
            count = len(range(start, stop, step))
            lo = max(0, -(-(a - start) // step))  # first selected position >= a
            hi = min(count, -(-(b - start) // step))
            if lo >= hi:
                break
            first = start + lo * step - a
            local.append(slice(first, first + (hi - lo - 1) * step + 1, step))
            place.append((lo, hi))
        else:
            out.append((tuple(place), (s, tuple(local))))
    return out


def _block_array(block: Any) -> np.ndarray:
    """The numpy data of a `_global_blocks` entry."""
    if isinstance(block, tuple):
        shard, local = block
        return np.asarray(_as_data(shard.data))[local]
    return np.asarray(_as_data(block.data))


def _selected_shape(sel: Selection) -> tuple[int, ...]:
    return tuple(len(range(*axis[1:])) for axis in sel if axis[0] == 'slice')


def _leaf_meta(path: str, x: Any, sel: Selection | None = None) -> dict[str, Any]:
    """Shape/dtype and this host's replica-0 blocks of one leaf."""
    import jax

    key = _key_impl(x)
    extra: dict[str, Any] = {} if key is None else {'key_impl': key[0]}
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if key is not None:
            full = tuple(x.shape) + key[1]
            shape = full if sel is None else _selected_shape(_key_selection(x, sel) or ())
        else:
            shape = tuple(x.shape) if sel is None else _selected_shape(sel)
        blocks = [place for place, _ in _global_blocks(x, sel)]
        data = x if key is None else jax.eval_shape(jax.random.key_data, x)
        dtype = str(np.dtype(data.dtype))
        return dict(kind='global', shape=shape, dtype=dtype, blocks=blocks, **extra)
    arr = _as_data(x)
    try:
        a = np.asarray(arr)
    except Exception as exc:
        raise GatherError(
            f'leaf {path} of type {type(x).__name__} cannot be converted to a numpy array ({exc}).'
        ) from None
    if a.dtype == object:
        raise GatherError(
            f'leaf {path} of type {type(x).__name__} is not numeric data; '
            'only arrays, scalars and pytrees of them can be gathered.'
        )
    return dict(kind='local', shape=tuple(a.shape), dtype=str(a.dtype), **extra)


@dataclasses.dataclass(frozen=True)
class NotShipped:
    """What a gathered pytree holds in place of a static field that cannot be pickled.

    A pytree's structure travels to the notebook pickled; a static
    (non-pytree) field such as a flax ``TrainState``'s ``tx`` (optax closures)
    cannot, so the notebook's copy holds this instead: ``text`` is the
    field's ``repr`` (cut at 200 characters), the value itself stays on the hosts.
    """

    text: str

    def __repr__(self) -> str:
        return f'<not shipped from the hosts: {self.text}>'


class CellObject:
    """A gathered pytree node whose class was defined in an engine cell (``__main__``).

    The notebook cannot import such a class (its ``__main__`` is another
    one), so the node arrives as this: the class's name, its fields as
    attributes (``gathered.params``, ``gathered.dropout_key``), the static
    ones as they were (or `NotShipped`). A pytree like the original: its
    array fields are its children.
    """

    def __init__(self, type_name: str, fields: dict[str, Any], static: tuple[str, ...]):
        self.__dict__.update(fields)
        self._mh_type = type_name
        self._mh_order = tuple(fields)
        self._mh_static = static

    def __repr__(self) -> str:
        inner = ', '.join(f'{k}={getattr(self, k)!r}' for k in self._mh_order)
        return f'{self._mh_type}({inner})'[:2000]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CellObject) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass with eq

    def _children(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        import jax

        dynamic = [k for k in self._mh_order if k not in self._mh_static]
        children = tuple((jax.tree_util.GetAttrKey(k), getattr(self, k)) for k in dynamic)
        aux = (
            self._mh_type,
            self._mh_order,
            self._mh_static,
            tuple(getattr(self, k) for k in self._mh_static),
        )
        return children, aux

    @classmethod
    def _rebuild(cls, aux: tuple[Any, ...], children: Any) -> CellObject:
        type_name, order, static, values = aux
        fields = dict(zip(static, values))
        fields.update(zip([k for k in order if k not in static], children))
        return cls(type_name, {k: fields[k] for k in order}, static)


def _register_cell_object() -> None:
    import jax

    jax.tree_util.register_pytree_with_keys(CellObject, CellObject._children, CellObject._rebuild)


_register_cell_object()


def _cell_object(node: Any) -> CellObject | None:
    """A node of a class defined in an engine cell as a `CellObject`, when its fields are known."""
    import jax

    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = [f.name for f in dataclasses.fields(node)]
    elif isinstance(node, tuple) and hasattr(type(node), '_fields'):
        names = list(type(node)._fields)  # type: ignore[attr-defined]  # a named tuple
    else:
        return None
    # Which fields are the node's pytree children: those the flattening walks into.
    # (The skeleton's leaves are ints, so a static int field is told apart only this way.)
    children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    dynamic = {
        p[0].name
        for p, _ in children
        if p and isinstance(p[0], jax.tree_util.GetAttrKey) and p[0].name in names
    }
    if isinstance(node, tuple):  # named tuples flatten by position
        dynamic = set(names)
    fields = {k: getattr(node, k) for k in names}
    static = tuple(k for k in names if k not in dynamic)
    return CellObject(
        type(node).__qualname__,
        {k: (_portable(v) if k in dynamic else _portable_static(v)) for k, v in fields.items()},
        static,
    )


def _portable_static(value: Any) -> Any:
    if _ships(value):
        return value
    text = repr(value)
    return NotShipped(text if len(text) <= 200 else text[:199] + '…')


def _from_cell(obj: Any) -> bool:
    """Whether ``obj`` (a function, class or instance) was defined in an engine cell."""
    return '__main__' in (getattr(obj, '__module__', None), getattr(type(obj), '__module__', None))


def _ships(node: Any) -> bool:
    """Whether the notebook can unpickle ``node``: it pickles, and nothing in it is from a cell."""
    import io
    import pickle

    class _Probe(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if _from_cell(obj):
                raise pickle.PicklingError(f'{obj!r:.80} was defined in an engine cell')
            return NotImplemented

    try:
        _Probe(io.BytesIO()).dump(node)
        return True
    except Exception:
        return False


def _portable(node: Any) -> Any:
    """``node`` (a skeleton: leaves are ints) as the notebook can unpickle it.

    Dataclasses (flax structs), named tuples, tuples, lists and dicts keep
    their type; only the static values the notebook could not unpickle inside
    them are replaced, by `NotShipped`. A node whose class was defined in an
    engine cell becomes a `CellObject` (the notebook cannot import it).
    """
    if _from_cell(node):
        cell = _cell_object(node)  # the notebook cannot import the class: ship its fields
        if cell is not None:
            return cell
    elif _ships(node):
        return node
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {
            f.name: _portable(getattr(node, f.name)) for f in dataclasses.fields(node) if f.init
        }
        try:
            return dataclasses.replace(node, **changes)
        except Exception:
            pass
    elif isinstance(node, tuple) and hasattr(type(node), '_fields'):
        return type(node)(*(_portable(v) for v in node))
    elif isinstance(node, list | tuple):
        return type(node)(_portable(v) for v in node)
    elif isinstance(node, dict):
        return {k: _portable(v) for k, v in node.items()}
    text = repr(node)
    return NotShipped(text if len(text) <= 200 else text[:199] + '…')


def _flatten(value: Any) -> tuple[list[Any], Any, list[str]]:
    import jax

    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(value)
    paths = [jax.tree_util.keystr(p) or '<root>' for p, _ in paths_leaves]
    leaves = [leaf for _, leaf in paths_leaves]
    skeleton = _portable(jax.tree.unflatten(treedef, list(range(len(leaves)))))
    return leaves, skeleton, paths


def _host_meta(value: Any, sel: Selection | None) -> dict[str, Any]:
    """This host's description of a value: structure, per-leaf shape/dtype and its blocks."""
    import jax

    leaves, skeleton, paths = _flatten(value)
    return dict(
        process=jax.process_index(),
        process_count=jax.process_count(),
        skeleton=skeleton,
        paths=paths,
        leaves=[_leaf_meta(p, x, sel) for p, x in zip(paths, leaves)],
    )


def meta_digest(meta: dict[str, Any]) -> str:
    """A digest of a `_host_meta` (structure, shapes, dtypes, blocks): equal means same plan."""
    import hashlib

    import jax

    text = repr((meta['paths'], meta['leaves'], meta['process_count']))
    text += str(jax.tree.structure(meta['skeleton']))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def gather_meta(
    namespace: dict[str, Any], name: str, inline_limit: int = 0, *, index: Any = None
) -> dict[str, Any]:
    """Round 1 of a gather: the structure and this host's blocks.

    When this host's blocks total at most ``inline_limit`` bytes, their data
    rides along (``'data'``: per leaf a list of flat arrays) so a small gather
    takes one round trip. ``index`` (ints and slices) selects part of an
    array on the hosts: only that part is described and sent. ``'digest'``
    is `meta_digest` of the rest, so a later `gather_write` can be sent
    without this round when nothing changed.
    """
    value, sel = _gather_target(namespace, name, index)
    out = _host_meta(value, sel)
    out['digest'] = meta_digest(out)
    if inline_limit > 0:
        total = 0
        for meta in out['leaves']:
            if meta['kind'] == 'global':
                total += sum(math.prod(b - a for a, b in idx) for idx in meta['blocks']) * (
                    np.dtype(meta['dtype']).itemsize
                )
            else:
                total += math.prod(meta['shape']) * np.dtype(meta['dtype']).itemsize
        if total <= inline_limit:
            leaves, _, _ = _flatten(value)
            out['data'] = _export_blocks(leaves, sel)
    return out


def _leaf_blocks(x: Any, sel: Selection | None) -> list[tuple[Any, np.ndarray]]:
    """The blocks of one leaf this host sends, in `_leaf_meta` order: (place, data).

    A global array: replica 0 of each block this host owns, ``place`` its
    ``((start, stop), ...)`` in the result. Anything else: the host's whole
    value, ``place`` None (it becomes this process's row).
    """
    import jax

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return [(idx, _block_array(b)) for idx, b in _global_blocks(x, sel)]
    return [(None, np.asarray(_as_data(x)))]


def _export_blocks(leaves: list[Any], sel: Selection | None = None) -> list[list[np.ndarray]]:
    # 1-D contiguous buffers travel as zero-copy zmq frames; the notebook reshapes.
    return [[np.ascontiguousarray(b).reshape(-1) for _, b in _leaf_blocks(x, sel)] for x in leaves]


def _stale(value: Any, sel: Selection | None, expect: dict[int, str] | None) -> dict | None:
    """`gather_meta`'s answer when ``expect`` (a repeated gather's plan) no longer fits here."""
    import jax

    if expect is None:
        return None
    meta = _host_meta(value, sel)
    meta['digest'] = meta_digest(meta)
    return None if expect.get(jax.process_index()) == meta['digest'] else meta


# One write into a gather file: (`_byte_span`, leaf offset, leaf shape, dtype, place, data).
_Write = tuple[tuple[int, int], int, tuple[int, ...], np.dtype, tuple[slice, ...], np.ndarray]


def _writes(
    value: Any, sel: Selection | None, layout: list[tuple[int, tuple[int, ...], str]]
) -> list[_Write]:
    """This host's writes into a gather file (`_Write`), empty blocks left out."""
    import jax

    leaves, _, _ = _flatten(value)
    pid = jax.process_index()
    out: list[_Write] = []
    for x, (offset, shape, dtype) in zip(leaves, layout):
        dt = np.dtype(dtype)
        for idx, data in _leaf_blocks(x, sel):
            place: tuple[slice, ...]
            if idx is None:  # a host-local value: this process's row
                place, data = (slice(pid, pid + 1),), data[None]
            else:
                place = tuple(slice(a, b) for a, b in idx)
            span = _byte_span(offset, tuple(shape), dt, place)
            if span is not None:
                out.append((span, offset, tuple(shape), dt, place, data))
    return out


_PWRITE_CHUNK = 16 << 20


def gather_write(
    namespace: dict[str, Any],
    name: str,
    path: str,
    layout: list[tuple[int, tuple[int, ...], str]],
    *,
    index: Any = None,
    fresh: bool = False,
    expect: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Round 2 of a shared-memory gather: write this host's blocks into the notebook's file.

    Args:
        namespace: the engine's user namespace.
        name: the variable to gather.
        path: the shared-memory file the notebook created (same machine).
        layout: per leaf ``(byte offset, result shape, dtype)`` in the file.
        index: the selection given to `gather_meta`.
        fresh: the file was just created. Its pages are then written with
            ``pwrite`` where a block's place is one span: the kernel fills
            new pages without zeroing them first and without a page fault
            per page (a mapping is used for the rest).
        expect: process index -> `meta_digest` the notebook planned with,
            when it skipped `gather_meta` (a repeated gather). If this host's
            value no longer matches, nothing is written.

    Returns:
        ``{'written': bytes}``, or ``{'meta': ...}`` (`gather_meta`'s answer)
        when ``expect`` no longer matches this host's value.
    """

    value, sel = _gather_target(namespace, name, index)
    stale = _stale(value, sel, expect)
    if stale is not None:
        return {'meta': stale}
    writes = _writes(value, sel, layout)
    if not writes:
        return {'written': 0}
    lo, hi = min(w[0][0] for w in writes), max(w[0][1] for w in writes)
    written, rest = 0, writes
    if fresh:
        rest = []  # the writes pwrite cannot do
        fd = os.open(path, os.O_WRONLY)
        try:
            for w in writes:
                (a, b), dt, data = w[0], w[3], w[5]
                if b - a != data.size * dt.itemsize:  # its place is not one span
                    rest.append(w)
                    continue
                view = np.ascontiguousarray(data, dtype=dt).reshape(-1).view(np.uint8).data
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done : done + _PWRITE_CHUNK], a + done)
                written += len(view)
        finally:
            os.close(fd)
        if not rest:
            # Map this host's part in the background, so the next gather into
            # this file (the debugging loop) only copies.
            threading.Thread(target=_premap, args=(path, lo, hi), daemon=True).start()
            return {'written': written}
    # Only the bytes this host writes are mapped (each host its own part).
    start, mm = _mapping(path, lo, hi)
    try:
        for _, offset, shape, dt, place, data in rest:
            strides = [dt.itemsize * math.prod(shape[i + 1 :]) for i in range(len(shape))]
            first = sum(s.start * st for s, st in zip(place, strides))
            dims = [s.stop - s.start for s in place] + list(shape[len(place) :])
            out = np.ndarray(
                dims, dtype=dt, buffer=mm, offset=offset + first - start, strides=strides
            )
            out[...] = data.reshape(dims)
            written += data.nbytes
    finally:
        del mm
    return {'written': written}


def _byte_span(
    offset: int, shape: tuple[int, ...], dt: np.dtype, place: tuple[slice, ...]
) -> tuple[int, int] | None:
    """The bytes from ``place``'s first element to its last, in a leaf at ``offset``."""
    starts = [s.start for s in place] + [0] * (len(shape) - len(place))
    stops = [s.stop for s in place] + list(shape[len(place) :])
    if any(b <= a for a, b in zip(starts, stops)):
        return None
    first = np.ravel_multi_index(starts, shape) if shape else 0
    last = np.ravel_multi_index([b - 1 for b in stops], shape) if shape else 0
    return offset + int(first) * dt.itemsize, offset + (int(last) + 1) * dt.itemsize


def gather_send(
    namespace: dict[str, Any],
    name: str,
    address: tuple[str, int],
    token: bytes,
    *,
    index: Any = None,
    expect: dict[int, str] | None = None,
    connect_timeout: float = 5.0,
    send_timeout: float = 600.0,
) -> dict[str, Any]:
    """Round 2 of a gather over the network: stream this host's blocks to the notebook.

    One TCP connection to the notebook's ``address``: ``token`` (16 bytes,
    given through the authenticated ipyparallel channel) and this process
    index (4 bytes, big-endian), then the raw bytes of every block in
    `gather_meta` order. Nothing else travels on it (no pickles): the
    notebook already knows every block's place and reads each straight into
    it. Blocks leave from the arrays' own memory (no copy here).

    Returns:
        ``{'sent': bytes}``; ``{'meta': ...}`` when ``expect`` (see
        `gather_write`) no longer matches this host's value, nothing sent;
        ``{'unreachable': why}`` when the notebook's address cannot be
        reached from here (the notebook then gathers through ipyparallel).
    """
    import jax

    value, sel = _gather_target(namespace, name, index)
    stale = _stale(value, sel, expect)
    if stale is not None:
        return {'meta': stale}
    leaves, _, _ = _flatten(value)
    blocks = [b for leaf in _export_blocks(leaves, sel) for b in leaf]  # in gather_meta order
    host, port = address
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except OSError as exc:
        return {'unreachable': f'{host}:{port}: {exc.strerror or exc}'}
    sent = 0
    with sock:
        sock.settimeout(send_timeout)
        sock.sendall(bytes(token) + jax.process_index().to_bytes(4, 'big'))
        for block in blocks:
            if block.nbytes:
                sock.sendall(block.view(np.uint8).data)
                sent += block.nbytes
    return {'sent': sent}


# The notebook reuses its shared-memory buffers across gathers (see
# mhnotebook/_transfer/_gather.py), so keeping this host's part of them mapped spares
# every later gather the cost of mapping it again.
_MAPPINGS: dict[str, tuple[int, int, np.ndarray]] = {}  # path -> (start, end, bytes)
_MAX_MAPPINGS = 8
_MAPPINGS_LOCK = threading.Lock()  # gather_write and its background mapping


def _premap(path: str, start: int, end: int) -> None:
    try:
        _mapping(path, start, end)
    except OSError:  # the notebook dropped the file meanwhile
        pass


def _mapping(path: str, start: int, end: int) -> tuple[int, np.ndarray]:
    """(where it starts, the mapped bytes) of a mapping of ``path`` covering [start, end)."""
    with _MAPPINGS_LOCK:
        return _mapping_locked(path, start, end)


def _mapping_locked(path: str, start: int, end: int) -> tuple[int, np.ndarray]:
    import mmap

    for old in [p for p in _MAPPINGS if p != path and not os.path.exists(p)]:
        del _MAPPINGS[old]  # the notebook unlinked it: let the memory go
    cached = _MAPPINGS.pop(path, None)
    if cached is None or not (cached[0] <= start and end <= cached[1]):
        lo = start - start % mmap.ALLOCATIONGRANULARITY
        fd = os.open(path, os.O_RDWR)
        try:
            # MAP_POPULATE maps every page in one call rather than one fault per page.
            flags = mmap.MAP_SHARED | getattr(mmap, 'MAP_POPULATE', 0)
            mm = mmap.mmap(fd, end - lo, flags=flags, offset=lo)
        finally:
            os.close(fd)
        cached = (lo, end, np.frombuffer(mm, dtype=np.uint8))
    _MAPPINGS[path] = cached  # most recently used last
    while len(_MAPPINGS) > _MAX_MAPPINGS:
        del _MAPPINGS[next(iter(_MAPPINGS))]
    return cached[0], cached[2]


def gather_local(namespace: dict[str, Any], name: str, *, index: Any = None) -> dict[str, Any]:
    """One-round gather for remote engines: the structure plus this host's blocks as arrays."""
    import jax

    value, sel = _gather_target(namespace, name, index)
    leaves, skeleton, paths = _flatten(value)
    metas = [_leaf_meta(p, x, sel) for p, x in zip(paths, leaves)]
    return dict(
        process=jax.process_index(),
        process_count=jax.process_count(),
        skeleton=skeleton,
        paths=paths,
        leaves=metas,
        data=_export_blocks(leaves, sel),
    )


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


def layout(
    namespace: dict[str, Any], name: str, check: bool = True
) -> tuple[Layout | TreeLayout, ReplicaReport | None]:
    """The `Layout` of array ``name`` and, with ``check``, its `ReplicaReport` (a collective).

    For a pytree, its `TreeLayout` (one row per leaf, each leaf's replicas
    checked with ``check``) and None.
    """
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

    with _sequence.called_from(f'notebook: %mh_diff {name}'):
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

    with _sequence.called_from('notebook: %mh_mem'):
        return multihost.memory_census(namespace, timeout=timeout)


def nonfinite(
    namespace: dict[str, Any], name: str, timeout: float | None = None
) -> NonfiniteReport:
    """`multihost.find_nonfinite` of engine value ``name`` (a collective: every host calls it)."""
    import multihost

    with _sequence.called_from(f'notebook: %mh_nan {name}'):
        value = lookup_collective(namespace, name, 'find_nonfinite', timeout=timeout)
        return multihost.find_nonfinite(value, timeout=timeout)


def lookup_collective(
    namespace: dict[str, Any], name: str, kind: str, *, timeout: float | None = None
) -> Any:
    """`lookup` for a collective: a host lacking ``name`` still takes its turn in ``kind``.

    So every host raises the same `multihost.HostFailedError` at once ("name
    'partial' is not defined ... processes 2-3") and the sequence stays aligned,
    instead of the others waiting for it until their timeout.
    """
    import multihost

    try:
        return lookup(namespace, name)
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
