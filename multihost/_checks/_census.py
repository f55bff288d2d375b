"""The cross-host census: environments and memory that differ between hosts.

`env_diff` -> `EnvDiff` (versions, ``JAX_*``/``XLA_*``/... variables, ``jax.config``, the git
commit, digests of the user's own sources; keys that differ per host by design listed apart)
and `memory_census` -> `MemoryCensus` (device memory, live arrays by shape, dtype and spec,
arrays only some hosts hold, hosts whose bytes stand out). Both are collectives that move only
what differs (`_dict_diff` on `_rowdiff`): docs/ARCHITECTURE.md, "The census". The models
live in `multihost._models._census` (re-exported here).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import sysconfig
from collections.abc import Mapping
from typing import Any

from multihost._checks import _rowdiff
from multihost._exchange import _kv, _sequence
from multihost._models._census import (  # noqa: F401  (the models live there; re-exported)
    MAX_TEXT_LINES,
    ArrayGroup,
    DeviceMemory,
    EnvDiff,
    EnvEntry,
    HostMemory,
    MemoryCensus,
    _entry,
)

#: Environment-variable prefixes that matter to a JAX job.
ENV_PREFIXES = ('JAX_', 'XLA_', 'LIBTPU_', 'TPU_', 'MEGASCALE_', 'NCCL_', 'CUDA_', 'MULTIHOST_')
#: Keys whose values differ per host by design: listed apart, never "odd".
_BY_DESIGN = re.compile(
    r'(WORKER_ID|SLICE_ID|VISIBLE_DEVICES|VISIBLE_CHIPS|RANK|PROCID|PROCESS_ID|PROCESS_INDEX|HOSTNAME'
    r'|HOST_BOUNDS|_HOST$|_PORT$|PORTS?$|_ADDR$|ADDRESS|_IP$|^host\.)'
)
_MAX_VALUE = 500  # characters of a value that travel
_MAX_KEYS = 2000  # keys per host compared
_MAX_SOURCES = 300  # user source files digested
_MAX_SOURCE_BYTES = 8 << 20


# -- the exchange ---------------------------------------------------------------------


def _value_digest(text: str) -> str:
    """12 hex digits of a value: the rows compare digests, only differing values travel."""
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def _dict_diff(
    rec: _sequence.CollectiveRecord, mine: Mapping[str, str], timeout: float | None
) -> dict[str, dict[int, str | None]]:
    """The keys whose values differ between hosts: key -> process -> value (None: absent).

    One round when every host holds the same map; otherwise the per-key
    digests travel through `_rowdiff` (bounded reads at any number of hosts),
    then the values of the differing keys, one host per distinct value.
    """
    items = sorted(mine.items())[:_MAX_KEYS]
    diff = _rowdiff.compare(rec, [(k, _value_digest(v)) for k, v in items], timeout)
    if diff is None:
        return {}
    me = rec.process
    own = dict(items)
    # Who sends each differing key's value: the lowest host holding that digest.
    senders = {k: _first_holders(digests) for k, digests in diff.differing}
    values = {k: own[k][:_MAX_VALUE] for k, first in senders.items() if first.get(me) == me}
    got = {
        p: json.loads(v)
        for p, v in _sequence.share(rec, 'vals', json.dumps(values), timeout=timeout).items()
    }
    return {
        k: {p: None if (q := first.get(p)) is None else got[q][k] for p in sorted(got)}
        for k, first in senders.items()
    }


def _first_holders(digests: Mapping[int, str | None]) -> dict[int, int]:
    """Host -> the lowest host whose digest equals its own (hosts lacking the key left out)."""
    first: dict[str, int] = {}
    return {p: first.setdefault(d, p) for p, d in sorted(digests.items()) if d is not None}


# -- environments ---------------------------------------------------------------------


def environment() -> dict[str, str]:
    """This host's environment as compared by `env_diff` (key -> text)."""
    import jax
    import jaxlib
    import numpy as np

    out: dict[str, str] = {
        'version.python': sys.version.split()[0],
        'version.jax': jax.__version__,
        'version.jaxlib': jaxlib.__version__,
        'version.numpy': np.__version__,
        'host.name': socket.gethostname(),
    }
    try:
        devices = jax.local_devices()
        out['backend.platform'] = devices[0].platform
        out['backend.runtime'] = str(devices[0].client.platform_version)
        out['backend.local_devices'] = str(len(devices))
        out['backend.device_kind'] = devices[0].device_kind
    except Exception as exc:  # no backend: say so
        out['backend.error'] = f'{type(exc).__name__}: {exc}'
    for k, v in os.environ.items():
        if k.startswith(ENV_PREFIXES):
            out[f'env.{k}'] = v
    for k, v in jax.config.values.items():
        out[f'jax.config.{k}'] = repr(v)
    commit = _git_commit(os.getcwd())
    if commit:
        out['git.commit'] = commit
    out.update(_source_digests())
    return out


def _git_commit(start: str) -> str:
    """The commit checked out in ``start``'s repository (read from .git; no subprocess)."""
    d = os.path.abspath(start)
    while True:
        git = os.path.join(d, '.git')
        if os.path.isdir(git):
            break
        parent = os.path.dirname(d)
        if parent == d:
            return ''
        d = parent
    try:
        with open(os.path.join(git, 'HEAD')) as f:
            head = f.read().strip()
        if not head.startswith('ref: '):
            return head
        ref = head[5:]
        path = os.path.join(git, ref)
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip()
        with open(os.path.join(git, 'packed-refs')) as f:
            for line in f:
                if line.strip().endswith(' ' + ref):
                    return line.split()[0]
    except OSError:
        return ''
    return ''


def _source_digests() -> dict[str, str]:
    """``source.<path>`` -> digest of the user's own modules (outside Python and site-packages)."""
    skip = tuple(
        os.path.abspath(p) + os.sep
        for p in {sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['purelib'], sys.prefix}
    )
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # multihost/
    cwd = os.getcwd()
    out: dict[str, str] = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, '__file__', None)
        if not path or not path.endswith('.py'):
            continue
        path = os.path.abspath(path)
        if path.startswith(skip) or path.startswith(here) or 'site-packages' in path:
            continue
        if '/ipykernel_' in path or path.startswith('/tmp/'):
            continue  # notebook cells: their file names differ by host
        try:
            if os.path.getsize(path) > _MAX_SOURCE_BYTES:
                continue
            with open(path, 'rb') as f:
                digest = hashlib.blake2b(f.read(), digest_size=8).hexdigest()
        except OSError:
            continue
        name = os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else path
        out[f'source.{name}'] = digest
        if len(out) >= _MAX_SOURCES:
            break
    return out


def env_diff(*, timeout: float | None = None) -> EnvDiff:
    """What differs between the hosts' environments: versions, flags, config, code.

    A collective: every host calls it and gets the same `EnvDiff`. Only the
    keys that differ travel in full; identical hosts cost one round.
    """
    mine = environment()
    rec = _sequence.enter('env_diff', '', tree_digest='', timeout=timeout)
    n = _kv.process_count()
    differing = _dict_diff(rec, mine, timeout) if n > 1 else {}
    entries: list[EnvEntry] = []
    per_host: list[EnvEntry] = []
    for key, values in sorted(differing.items()):
        name = key[len('env.') :] if key.startswith('env.') else key
        (per_host if _BY_DESIGN.search(name) else entries).append(_entry(key, values, n))
    return EnvDiff(
        num_processes=n,
        entries=tuple(entries),
        per_host=tuple(per_host),
        compared=min(len(mine), _MAX_KEYS),
    )


# -- memory ---------------------------------------------------------------------------


def _spec(sharding: Any) -> str:
    spec = getattr(sharding, 'spec', None)
    if spec is not None:
        return str(spec)
    return type(sharding).__name__


def _names(namespace: Mapping[str, Any] | None) -> dict[int, list[str]]:
    """id(array) -> names in ``namespace`` referring to it (top level and one container level)."""
    import jax

    out: dict[int, list[str]] = {}
    if not namespace:
        return out
    budget = 20000
    for name, value in list(namespace.items()):
        if name.startswith('_'):
            continue
        if isinstance(value, jax.Array):
            out.setdefault(id(value), []).append(name)
            continue
        if isinstance(value, (dict, list, tuple)):
            try:
                flat, _ = jax.tree_util.tree_flatten_with_path(value)
            except Exception:
                continue
            for path, leaf in flat[:budget]:
                if isinstance(leaf, jax.Array):
                    out.setdefault(id(leaf), []).append(name + jax.tree_util.keystr(path))
            budget -= len(flat)
            if budget <= 0:
                break
    return out


def _host_memory(namespace: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """This host's summary (JSON-able) and its kind -> "count|bytes" map for `_dict_diff`."""
    import jax

    pid = _kv.process_index()
    devices = jax.local_devices()
    local_index = {d.id: i for i, d in enumerate(devices)}
    per_device = {d.id: 0 for d in devices}
    padded = {d.id: 0 for d in devices}
    names = _names(namespace)
    groups: dict[str, dict[str, Any]] = {}
    count = total = 0
    for x in jax.live_arrays():
        try:
            if x.is_deleted():
                continue
            sharding = x.sharding
            shard_shape = sharding.shard_shape(x.shape)
            itemsize = x.dtype.itemsize
            shard_bytes = int(itemsize * _prod(shard_shape))
            on = [d.id for d in sharding.addressable_devices]
        except Exception:
            continue
        count += 1
        host_bytes = shard_bytes * len(on)
        total += host_bytes
        try:  # with the layout's padding (TPU tiles), spread evenly over the shards
            padded_shard = int(x.on_device_size_in_bytes()) // max(len(on), 1)
        except Exception:
            padded_shard = shard_bytes
        for d in on:
            if d in per_device:
                per_device[d] += shard_bytes
                padded[d] += padded_shard
        key = json.dumps([list(x.shape), str(x.dtype), _spec(sharding)])
        g = groups.setdefault(key, {'count': 0, 'bytes': host_bytes, 'names': []})
        g['count'] += 1
        g['names'] += names.get(id(x), [])[:4]
    stats_available = False
    dev = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:
            stats = None
        if stats:
            stats_available = True
        dev.append(
            [
                d.id,
                local_index[d.id],
                per_device[d.id],
                None if not stats else stats.get('bytes_in_use'),
                None if not stats else stats.get('peak_bytes_in_use'),
                None if not stats else stats.get('bytes_limit'),
                None if not stats else stats.get('largest_free_block_bytes'),
                padded[d.id],
                str(getattr(d, 'device_kind', '') or ''),
                list(getattr(d, 'coords', None) or ()),
            ]
        )
    largest = sorted(groups.items(), key=lambda kv: -kv[1]['bytes'] * kv[1]['count'])[:16]
    summary = {
        'p': pid,
        'count': count,
        'bytes': total,
        'devices': dev,
        'stats': stats_available,
        'largest': [[k, g['count'], g['bytes'], sorted(set(g['names']))[:4]] for k, g in largest],
    }
    kinds = {
        k: f'{g["count"]}|{g["bytes"]}|{",".join(sorted(set(g["names"]))[:4])}'
        for k, g in groups.items()
    }
    return summary, kinds


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _group(
    key: str, counts: tuple[int, ...], host_bytes: int, names: tuple[str, ...]
) -> ArrayGroup:
    shape, dtype, spec = json.loads(key)
    return ArrayGroup(
        shape=tuple(shape),
        dtype=dtype,
        spec=spec,
        counts=counts,
        host_bytes=host_bytes,
        names=names,
    )


def memory_census(
    namespace: Mapping[str, Any] | None = None, *, timeout: float | None = None
) -> MemoryCensus:
    """Memory across hosts: per device and per host, and what only some hosts hold.

    A collective: every host calls it and gets the same `MemoryCensus`. Each
    host shares a short summary (counts, bytes, per-device figures, its 16
    largest kinds of arrays); kinds of arrays are then compared with only the
    differing ones travelling.

    Args:
        namespace: where to look up names for arrays (a notebook engine's
            namespace); default: the ``__main__`` module's globals.
        timeout: seconds to wait for every host.
    """
    if namespace is None:
        main = sys.modules.get('__main__')
        namespace = getattr(main, '__dict__', None)
    summary, kinds = _host_memory(namespace)
    n = _kv.process_count()
    rec = _sequence.enter('memory_census', '', tree_digest='', timeout=timeout)
    if n > 1:
        summaries = {
            p: json.loads(v)
            for p, v in _sequence.share(
                rec, 'summary', json.dumps(summary), timeout=timeout
            ).items()
        }
        differing = _dict_diff(rec, kinds, timeout)
    else:
        summaries, differing = {summary['p']: summary}, {}
    hosts = []
    for p in range(n):
        s = summaries[p]
        devs = tuple(
            DeviceMemory(
                id=i,
                process=p,
                local=loc,
                live_bytes=b,
                in_use=u,
                peak=pk,
                limit=lim,
                largest_free=free,
                padded_bytes=pad,
                kind=kind,
                coords=tuple(coords),
            )
            for i, loc, b, u, pk, lim, free, pad, kind, coords in s['devices']
        )
        largest = tuple(
            _group(k, tuple(c if q == p else 0 for q in range(n)), b, tuple(names))
            for k, c, b, names in s['largest']
        )
        hosts.append(
            HostMemory(
                process=p,
                live_count=s['count'],
                live_bytes=s['bytes'],
                devices=devs,
                largest=largest,
            )
        )
    only = []
    for key, values in differing.items():
        counts: list[int] = []
        size = 0
        names: set[str] = set()
        for p in range(n):
            v = values.get(p)
            if v is None:
                counts.append(0)
                continue
            c, b, nm = v.split('|', 2)
            counts.append(int(c))
            size = max(size, int(b))
            names.update(x for x in nm.split(',') if x)
        if len(set(counts)) > 1:  # the same counts (only names differ): not a leak
            only.append(_group(key, tuple(counts), size, tuple(sorted(names))))
    only.sort(key=lambda g: -g.host_bytes * (max(g.counts) - min(g.counts)))
    return MemoryCensus(
        hosts=tuple(hosts),
        only_some=tuple(only),
        stats_available=any(s['stats'] for s in summaries.values()),
    )
