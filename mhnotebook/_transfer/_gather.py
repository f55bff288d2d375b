"""Fast gather of engine values into the notebook: each block travels once.

Two transports:

* ``shm`` (every engine on this machine): round 1 asks each host for the
  value's structure and the blocks it owns (replica 0 of each distinct shard);
  the notebook lays the result out in one file under ``/dev/shm``; round 2 has
  every host write its blocks straight into their places in that file, which
  the notebook maps as the result. The file comes from the session's
  `ShmPool` (``_shm.py``) and goes back to it once the returned arrays are
  gone.
* ``zmq`` (engines elsewhere): one round; each host sends its blocks as
  zero-copy ipyparallel buffers and the notebook copies each into place.

The functions here reach the hosts only through the ``call`` they are given
(`Session.call`); they know nothing of sessions.
"""

from __future__ import annotations

import dataclasses
import math
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mhnotebook._errors import HostsError, SessionError
from mhnotebook._transfer._shm import SHM_DIR, HeapPool, ShmPool
from multihost._text import fmt_hosts

# A job view's `call_tool` (`_jobview.JobView`): runs an engine tool of the registry
# (`multihost.engine.tools`: 'gather_meta'...) on the hosts, results by process index.
Call = Callable[..., list[Any]]

_PROGRESS_BYTES = 64 << 20
_INLINE_BYTES = 1 << 20  # per host: below this, one round trip over zmq


def parse_target(text: str) -> tuple[str, tuple[int | slice, ...] | None]:
    """``'x'`` -> ``('x', None)``; ``'x[::4, :128]'`` -> ``('x', (slice(None, None, 4), ...))``.

    A name (`multihost._names`: a variable, then attributes and subscripts
    with constant keys, ``state.params['embed'].embedding``) plus,
    optionally, a trailing cut of slices or several indices, which the hosts
    apply. A trailing single integer (``x[3]``, ``state.opt_state[0]``) stays
    in the name: the hosts know whether it indexes an array (a cut) or a
    sequence. Parsed with `ast`, never evaluated.

    Raises:
        ValueError: anything else, saying what is accepted.
    """
    from multihost import _names

    head, steps = _names.parse(text, cuts=True)
    if steps and steps[-1].kind == 'index':
        return _names.format_steps(head, steps[:-1]), tuple(steps[-1].value)
    return _names.format_steps(head, steps), None


@dataclasses.dataclass(frozen=True, eq=False)
class KeyData:
    """A gathered PRNG key array as its key data, where it cannot be rebuilt as keys.

    What a gather returns for a key leaf when this kernel cannot import jax,
    or jax here does not know the key's implementation (a custom one):
    ``data`` is `jax.random.key_data` of the keys (uint32, the key array's
    shape plus the implementation's key shape, e.g. ``(2,)`` for
    ``threefry2x32``), ``impl`` the implementation's name as
    ``str(jax.random.key_impl(keys))`` gives it on the hosts. Elsewhere a
    key leaf comes back as a key array:
    ``jax.random.wrap_key_data(data, impl=impl)``.
    """

    data: np.ndarray
    impl: str


def key_leaf(data: np.ndarray, impl: str) -> Any:
    """Key data gathered from the hosts as keys: a jax key array of ``impl``, else `KeyData`."""
    try:
        import jax
    except ImportError:
        return KeyData(data, impl)
    try:
        return jax.random.wrap_key_data(jax.numpy.asarray(data), impl=impl)
    except (ValueError, TypeError, KeyError):  # an implementation jax here does not know
        return KeyData(data, impl)


def _fmt_target(name: str, index: tuple[int | slice, ...] | None) -> str:
    if index is None:
        return name
    from multihost._names import format_index

    return name + format_index(index)


def human_bytes(n: float) -> str:
    """``3221225472`` -> ``'3.0 GiB'``."""
    for unit, shift in (('TiB', 40), ('GiB', 30), ('MiB', 20), ('KiB', 10)):
        if n >= 1 << shift:
            return f'{n / (1 << shift):.1f} {unit}'
    return f'{int(n)} B'


def available_memory() -> int | None:
    """Bytes of memory available on this machine (``MemAvailable``), or None if unknown."""
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # other Unixes: free pages (less than available, so a safe bound)
        return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (ValueError, OSError, AttributeError):
        return None


def _check_size(
    name: str, index: tuple[int | slice, ...] | None, total: int, max_bytes: int | None
) -> None:
    """Refuses a result over ``max_bytes`` (default: half the available memory), unallocated."""
    if max_bytes is not None:
        limit, why = int(max_bytes), f'the limit of {human_bytes(max_bytes)} (max_bytes)'
    else:
        available = available_memory()
        if available is None:
            return
        limit = available // 2
        why = f'half of the {human_bytes(available)} of memory available on this machine'
    if total <= limit:
        return
    target = _fmt_target(name, index)
    step = -(-total // max(limit, 1))
    example = f'{name}[::{step}]' if index is None else f'{name}[...]'
    raise SessionError(
        f'cannot gather {target!r}: the result would take {human_bytes(total)} '
        f'({total} bytes), more than {why}; nothing was allocated. Gather a slice, cut on '
        f'the hosts so only it travels: %mh_allgather {example} (session.allgather('
        f"'{example}')), or allow it: --max-bytes {total} (max_bytes={total})."
    )


def _leaf_name(path: str) -> str:
    return f'leaf {path}' if path and path != '<root>' else 'the value'


def _held(leaf: list[dict[str, Any]]) -> str:
    """``processes 0-2: local int64 (1,); process 3: local int64 (2,)``: the processes grouped
    by what they hold (kind, dtype, shape), each group once."""
    groups: dict[str, list[int]] = {}
    for p, lm in enumerate(leaf):
        impl = f' key<{lm["key_impl"]}>' if lm.get('key_impl') else ''
        what = f'{lm["kind"]} {lm["dtype"]}{impl} {tuple(lm["shape"])}'
        groups.setdefault(what, []).append(p)
    return '; '.join(f'{fmt_hosts(ps)}: {what}' for what, ps in groups.items())


def _plan(metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per leaf: result shape and dtype, checked to agree across hosts."""
    first = metas[0]
    n = len(metas)
    for m in metas[1:]:
        if m['paths'] != first['paths']:
            raise SessionError(
                f'hosts hold differently structured values: process 0 has leaves '
                f'{first["paths"][:8]}, process {m["process"]} has {m["paths"][:8]}. '
                'Compare them with %mh_diff.'
            )
    plan = []
    for i, path in enumerate(first['paths']):
        leaf = [m['leaves'][i] for m in metas]
        kinds = {lm['kind'] for lm in leaf}
        shapes = {lm['shape'] for lm in leaf}
        dtypes = {(lm['dtype'], lm.get('key_impl')) for lm in leaf}
        if len(kinds) > 1 or len(dtypes) > 1 or len(shapes) > 1:
            raise SessionError(
                f'{_leaf_name(path)} differs between processes: {_held(leaf)}. '
                'Compare them with %mh_diff.'
            )
        kind, shape, (dtype, key_impl) = kinds.pop(), shapes.pop(), dtypes.pop()
        if kind == 'global':
            covered = sum(math.prod(b - a for a, b in idx) for lm in leaf for idx in lm['blocks'])
            if covered != math.prod(shape):
                raise SessionError(
                    f"leaf {path}: the hosts' replica-0 blocks cover {covered} of "
                    f'{math.prod(shape)} elements; cannot assemble it.'
                )
            out_shape = tuple(shape)
        else:
            out_shape = (n, *shape)
        plan.append(
            dict(path=path, kind=kind, shape=out_shape, dtype=np.dtype(dtype), key_impl=key_impl)
        )
    return plan


def _unflatten(skeleton: Any, leaves: list[Any], plan: list[dict[str, Any]]) -> Any:
    """The gathered value: ``leaves`` in the hosts' structure, key data back as keys."""
    import jax

    leaves = [
        leaf if p.get('key_impl') is None else key_leaf(leaf, p['key_impl'])
        for leaf, p in zip(leaves, plan)
    ]
    return jax.tree.map(lambda i: leaves[i], skeleton)


class _Bar:
    def __init__(self, total_bytes: int, hosts: int, enabled: bool | None):
        self.widget = None
        if enabled is None:
            enabled = total_bytes >= _PROGRESS_BYTES
        if not enabled:
            return
        try:
            import ipywidgets as w
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is None or not hasattr(get_ipython(), 'kernel'):
                return
            self.widget = w.IntProgress(
                min=0, max=hosts, description=f'{total_bytes / 2**20:.0f} MiB'
            )
            self.widget.add_class('mh-gather-progress')
            display(self.widget)
        except ImportError:
            pass

    def step(self, _p: int) -> None:
        if self.widget is not None:
            self.widget.value += 1

    def close(self) -> None:
        if self.widget is not None:
            self.widget.close()


def _shm_available(machines: Sequence[str]) -> bool:
    from multihost._net import machine_id

    here = machine_id()
    return os.path.isdir(SHM_DIR) and all(m == here for m in machines)


class GatherState:
    """What a session keeps between gathers.

    ``pool``: the shared-memory files; ``plans``: the last plan per target
    (a repeated gather skips the structure round); the `Listener` hosts
    stream to (bound on first use to this machine's address toward the
    controller); and, once a host could not reach it, why (``'auto'`` then
    gathers through ipyparallel).
    """

    def __init__(self, controller_url: str | None = None):
        self.pool = ShmPool()
        self.heap = HeapPool()
        self.plans: dict[Any, dict[str, Any]] = {}
        self.controller_url = controller_url
        self.unreachable: str | None = None
        self._listener: Any = None

    def listener(self) -> Any:
        from mhnotebook._transfer._stream import Listener, notebook_address

        if self._listener is None:
            self._listener = Listener(notebook_address(self.controller_url))
        return self._listener

    def remember(self, key: Any, metas: list[dict[str, Any]], plan: list[dict[str, Any]]) -> dict:
        entry = dict(
            digests={m['process']: m['digest'] for m in metas},
            skeleton=metas[0]['skeleton'],
            plan=plan,
            metas=[{k: m[k] for k in ('process', 'leaves')} for m in metas],
        )
        self.plans.pop(key, None)
        self.plans[key] = entry
        while len(self.plans) > _MAX_PLANS:
            del self.plans[next(iter(self.plans))]
        return entry

    def close(self) -> None:
        self.pool.close()
        self.heap.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


_MAX_PLANS = 32
TRANSPORTS = ('auto', 'shm', 'tcp', 'zmq')


def allgather(
    call: Call,
    target: str,
    *,
    machines: Sequence[str],
    state: GatherState,
    timeout: float,
    transport: str,
    progress: bool | None,
    max_bytes: int | None = None,
) -> Any:
    """`Session.allgather`: ``call`` reaches the hosts, ``machines`` are their machine ids
    (by process index), ``state`` is what the session keeps between gathers."""
    name, index = parse_target(target)
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f'max_bytes must be >= 0, got {max_bytes!r}')
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be 'auto', 'shm', 'tcp' or 'zmq', got {transport!r}")
    inline = 0  # an explicit 'shm' always writes through shared memory
    if transport == 'auto':
        inline = _INLINE_BYTES
        if _shm_available(machines):
            transport = 'shm'
        else:
            transport = 'zmq' if state.unreachable else 'tcp'
    elif transport == 'shm' and not _shm_available(machines):
        raise SessionError(
            "transport='shm' needs every engine on this machine and /dev/shm; use transport='tcp'."
        )

    def planned(send: Callable[[Any, Any], Any]) -> Any:
        return _planned(call, state, name, index, timeout, inline, max_bytes, send)

    try:
        if transport == 'shm':
            n = len(machines)
            return planned(
                lambda entry, expect: _write_shm(
                    call, n, state.pool, name, index, timeout, progress, entry, expect
                )
            )
        if transport == 'tcp':
            try:
                return planned(
                    lambda entry, expect: _stream(call, state, name, index, timeout, entry, expect)
                )
            except _Unreachable as exc:
                state.unreachable = str(exc)
                if inline == 0:  # asked for by name: say so rather than fall back
                    raise SessionError(
                        f"transport='tcp': a host cannot reach this notebook at {exc}; "
                        "use transport='zmq' (through ipyparallel's controller)."
                    ) from None
        return _gather_zmq(call, name, index, timeout, max_bytes)
    except HostsError as exc:
        # A GatherError is the same on every host: show it once, without the remote traceback.
        # Grouped by message, each group naming its hosts (a name only some hosts lack).
        failures = exc.failures
        if failures and all(f.ename == 'GatherError' for f in failures.values()):
            groups: dict[str, list[int]] = {}
            for p, f in sorted(failures.items()):
                groups.setdefault(f.evalue, []).append(p)
            said = '; '.join(f'on {fmt_hosts(ps)}: {ev}' for ev, ps in groups.items())
            raise SessionError(f'cannot gather {_fmt_target(name, index)!r} {said}') from None
        raise


class _Unreachable(Exception):
    """A host could not connect to the notebook's listener (the message says where and why)."""


def host_copy(call: Call, name: str, process: int = 0) -> Any:
    """Process ``process``'s own copy of engine value ``name`` (a host-local value), as numpy."""
    part = call('gather_local', name, processes=[process])[0]
    return _assemble(_plan([part]), [part])[0]


def _result_bytes(plan: list[dict[str, Any]]) -> int:
    return sum(math.prod(leaf['shape']) * leaf['dtype'].itemsize for leaf in plan)


def _layout(plan: list[dict[str, Any]]) -> tuple[list[tuple[int, tuple[int, ...], str]], int]:
    """Per leaf (byte offset, shape, dtype) in one file, 64-byte aligned; and the file size."""
    layout, offset = [], 0
    for leaf in plan:
        offset = -(-offset // 64) * 64
        layout.append((offset, leaf['shape'], leaf['dtype'].str))
        offset += math.prod(leaf['shape']) * leaf['dtype'].itemsize
    return layout, max(offset, 1)


def _planned(
    call: Call,
    state: GatherState,
    name: str,
    index: Any,
    timeout: float,
    inline: int,
    max_bytes: int | None,
    move: Callable[[dict[str, Any], dict[int, str] | None], Any],
) -> Any:
    """Round 1 (the structure), then ``move(plan entry, expect)`` moves the data.

    The usual debugging loop gathers the same variable again: then round 1 is
    skipped and ``move`` goes at once with the last plan and the digests it
    was made with (``expect``); a host whose value changed shape answers with
    its new description instead, ``move`` returns None, and the gather starts
    over.
    """
    key = (name, repr(index))
    cached = state.plans.get(key)
    if cached is not None:
        _check_size(name, index, _result_bytes(cached['plan']), max_bytes)
        result = move(cached, cached['digests'])
        if result is not None:
            return result
        state.plans.pop(key, None)
    metas = call('gather_meta', name, inline, index=index, timeout=timeout)
    plan = _plan(metas)
    _check_size(name, index, _result_bytes(plan), max_bytes)
    if all('data' in m for m in metas):  # small: the data came with the structure
        return _assemble(plan, metas)
    return move(state.remember(key, metas, plan), None)


def _write_shm(
    call: Call,
    num_processes: int,
    pool: ShmPool,
    name: str,
    index: Any,
    timeout: float,
    progress: bool | None,
    entry: dict[str, Any],
    expect: dict[int, str] | None,
) -> Any:
    """Every host writes its blocks into one pooled file; the result maps it (None: stale plan)."""
    layout, total = _layout(entry['plan'])
    buf = pool.acquire(total)
    bar = _Bar(total, num_processes, progress)
    try:
        answers = call(
            'gather_write',
            name,
            buf.path,
            layout,
            index=index,
            fresh=buf.fresh,
            expect=expect,
            timeout=timeout,
            on_done=bar.step,
        )
    except BaseException:
        pool.release(buf)
        raise
    finally:
        bar.close()
    buf.fresh = False
    if any('meta' in a for a in answers):
        pool.release(buf)
        return None
    # The result is a view of the pooled buffer; when the last of its leaves
    # (and every view of them) is gone, the buffer goes back to the pool.
    base = buf.mm[:total].view(np.ndarray)
    weakref.finalize(base, pool.release, buf)
    leaves = [
        np.ndarray(shape, dtype=np.dtype(dt), buffer=base, offset=off) for off, shape, dt in layout
    ]
    return _unflatten(entry['skeleton'], leaves, entry['plan'])


def _stream(
    call: Call,
    state: GatherState,
    name: str,
    index: Any,
    timeout: float,
    entry: dict[str, Any],
    expect: dict[int, str] | None,
) -> Any:
    """Every host streams its blocks into the result here (None: stale plan)."""
    from mhnotebook._transfer._stream import StreamError, new_token, result_places

    plan = entry['plan']
    layout, total = _layout(plan)
    buf = state.heap.acquire(total)
    # The result's own array over the buffer (every leaf's .base): see below.
    base = np.frombuffer(buf, dtype=np.uint8, count=total)
    results = [
        np.ndarray(shape, dtype=np.dtype(dt), buffer=base, offset=off) for off, shape, dt in layout
    ]
    listener = state.listener()
    token = new_token()
    with listener.lock:
        receipt = listener.receive(token, result_places(plan, entry['metas'], results))
        try:
            answers = call(
                'gather_send',
                name,
                listener.address,
                token,
                index=index,
                expect=expect,
                send_timeout=timeout,
                timeout=timeout,
            )
        except BaseException:
            receipt.cancel()
            state.heap.release(buf)
            raise
        unreachable = [a['unreachable'] for a in answers if 'unreachable' in a]
        if unreachable or any('meta' in a for a in answers):
            receipt.cancel()
            state.heap.release(buf)
            if unreachable:
                raise _Unreachable(unreachable[0])
            return None
        try:
            receipt.finish({p: a['sent'] for p, a in enumerate(answers)}, min(timeout, 60.0))
        except StreamError as exc:
            state.heap.release(buf)
            raise SessionError(f'cannot gather {_fmt_target(name, index)!r}: {exc}') from None
    # As in a shared-memory gather: the buffer goes back once the result is gone.
    weakref.finalize(base, state.heap.release, buf)
    return _unflatten(entry['skeleton'], results, plan)


def _gather_zmq(
    call: Call,
    name: str,
    index: Any,
    timeout: float,
    max_bytes: int | None,
) -> Any:
    # Round 1 only describes the value (small ones come along), so an
    # oversized result is refused before any data travels.
    metas = call(
        'gather_meta',
        name,
        _INLINE_BYTES,
        index=index,
        timeout=timeout,
    )
    plan = _plan(metas)
    _check_size(name, index, _result_bytes(plan), max_bytes)
    if all('data' in m for m in metas):
        return _assemble(plan, metas)
    parts = call('gather_local', name, index=index, timeout=timeout)
    return _assemble(_plan(parts), parts)


def _assemble(plan: list[dict[str, Any]], parts: list[dict[str, Any]]) -> Any:
    """Copies every host's flat blocks into freshly allocated results."""
    leaves = []
    for i, leaf in enumerate(plan):
        out = np.empty(leaf['shape'], leaf['dtype'])
        for part in parts:
            meta, blocks = part['leaves'][i], part['data'][i]
            if leaf['kind'] == 'global':
                for idx, block in zip(meta['blocks'], blocks):
                    out[tuple(slice(a, b) for a, b in idx)] = block.reshape([b - a for a, b in idx])
            else:
                out[part['process']] = blocks[0].reshape(meta['shape'])
        leaves.append(out)
    return _unflatten(parts[0]['skeleton'], leaves, plan)
