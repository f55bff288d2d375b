"""The cross-host census: environments and memory that differ between hosts.

`env_diff` -> `EnvDiff` (versions, ``JAX_*``/``XLA_*``/... variables, ``jax.config``, the git
commit, digests of the user's own sources; keys that differ per host by design listed apart)
and `memory_census` -> `MemoryCensus` (device memory, live arrays by shape, dtype and spec,
arrays only some hosts hold, hosts whose bytes stand out). Both are collectives that move only
what differs (`_dict_diff` on `_rowdiff`): docs/ARCHITECTURE.md, "The census".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
import statistics
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from typing import Any

from multihost._checks import _rowdiff
from multihost._exchange import _kv, _sequence
from multihost._text import fmt_hosts

#: Environment-variable prefixes that matter to a JAX job.
ENV_PREFIXES = ('JAX_', 'XLA_', 'LIBTPU_', 'TPU_', 'NCCL_', 'CUDA_', 'MULTIHOST_')
#: Keys whose values differ per host by design: listed apart, never "odd".
_BY_DESIGN = re.compile(
    r'(WORKER_ID|VISIBLE_DEVICES|VISIBLE_CHIPS|RANK|PROCID|PROCESS_ID|PROCESS_INDEX|HOSTNAME'
    r'|HOST_BOUNDS|_HOST$|_PORT$|PORTS?$|_ADDR$|ADDRESS|_IP$|^host\.)'
)
_MAX_VALUE = 500  # characters of a value that travel
_MAX_KEYS = 2000  # keys per host compared
_MAX_SOURCES = 300  # user source files digested
_MAX_SOURCE_BYTES = 8 << 20
#: Host groups, and devices, that `MemoryCensus.format` lists; the rest are counted.
MAX_TEXT_LINES = 16


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


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One key whose value differs between hosts.

    Attributes:
        key: ``'env.XLA_FLAGS'``, ``'version.jaxlib'``, ``'jax.config.jax_enable_x64'``,
            ``'git.commit'``, ``'source.train.py'``, ...
        values: indexed by process: the value there (None: absent on that host).
        majority: the most common value (ties: the lowest process's).
        odd_processes: hosts whose value is not the majority's.
    """

    key: str
    values: tuple[str | None, ...]
    majority: str | None
    odd_processes: tuple[int, ...]

    def describe(self) -> str:
        odd = '; '.join(
            f'{fmt_hosts([p])}: {_show(self.values[p])}' for p in self.odd_processes[:8]
        )
        more = f' (+{len(self.odd_processes) - 8} more)' if len(self.odd_processes) > 8 else ''
        return f'{self.key}: {_show(self.majority)} on most; {odd}{more}'


def _show(value: str | None) -> str:
    return '(unset)' if value is None else repr(value)


def _entry(key: str, values: Mapping[int, str | None], n: int) -> EnvEntry:
    vals = tuple(values.get(p) for p in range(n))
    counts: dict[str | None, int] = {}
    for v in vals:
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.values())
    majority = next(v for v in vals if counts[v] == best)
    odd = tuple(p for p, v in enumerate(vals) if v != majority)
    return EnvEntry(key=key, values=vals, majority=majority, odd_processes=odd)


@dataclasses.dataclass(frozen=True)
class EnvDiff:
    """What differs between the hosts' environments (`env_diff`).

    Attributes:
        num_processes: how many hosts were compared.
        entries: keys that differ, ordered by key (empty: identical hosts).
        per_host: keys that differ per host by design (ranks, worker ids,
            visible devices, host names, ports, addresses), listed apart.
        compared: how many keys each host compared (process 0's count).
    """

    num_processes: int
    entries: tuple[EnvEntry, ...]
    per_host: tuple[EnvEntry, ...] = ()
    compared: int = 0

    @property
    def ok(self) -> bool:
        """No key differs (keys that differ by design do not count)."""
        return not self.entries

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Hosts that differ from the majority in at least one key."""
        return tuple(sorted({p for e in self.entries for p in e.odd_processes}))

    def __getitem__(self, key: str) -> EnvEntry:
        for e in self.entries + self.per_host:
            if e.key == key:
                return e
        raise KeyError(f'{key!r} does not differ between hosts')

    def format(self) -> str:
        head = f'environments of {self.num_processes} hosts ({self.compared} keys compared): ' + (
            'identical'
            if self.ok
            else f'{len(self.entries)} key(s) differ, odd: {fmt_hosts(self.odd_processes)}'
        )
        lines = [head] + [f'  {e.describe()}' for e in self.entries]
        if self.per_host:
            lines.append(
                f'  differ per host by design: {", ".join(e.key for e in self.per_host[:20])}'
                + (' ...' if len(self.per_host) > 20 else '')
            )
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format()


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


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device's memory.

    Attributes:
        id: the jax device id.
        process: the host's process index.
        local: the device's index among its host's devices.
        live_bytes: bytes of live arrays' shards on this device (always known).
        in_use / peak / limit: from ``memory_stats()``; None where the backend
            reports none (CPU does not).
    """

    id: int
    process: int
    local: int
    live_bytes: int
    in_use: int | None = None
    peak: int | None = None
    limit: int | None = None

    @property
    def label(self) -> str:
        return f'process {self.process} · dev {self.local} (id {self.id})'


@dataclasses.dataclass(frozen=True)
class ArrayGroup:
    """Live arrays of one kind: (shape, dtype, sharding spec), counted per host.

    Attributes:
        shape, dtype, spec: what identifies the kind.
        counts: indexed by process: how many such arrays that host holds.
        host_bytes: bytes one such array takes on a host (its addressable shards).
        names: engine-namespace names that refer to such arrays, where known.
    """

    shape: tuple[int, ...]
    dtype: str
    spec: str
    counts: tuple[int, ...]
    host_bytes: int
    names: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return f'{self.dtype}{list(self.shape)} {self.spec}'.rstrip()

    @property
    def extra_processes(self) -> tuple[int, ...]:
        """Hosts holding more of these than the fewest any host holds."""
        low = min(self.counts)
        return tuple(p for p, c in enumerate(self.counts) if c > low)


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """One host's live arrays and devices."""

    process: int
    live_count: int
    live_bytes: int
    devices: tuple[DeviceMemory, ...]
    largest: tuple[ArrayGroup, ...] = ()


@dataclasses.dataclass(frozen=True)
class MemoryCensus:
    """Memory across hosts (`memory_census`).

    Attributes:
        hosts: one `HostMemory` per process.
        only_some: kinds of live arrays whose count differs between hosts
            (leak candidates), largest first.
        stats_available: whether the backend reports ``memory_stats()``.
    """

    hosts: tuple[HostMemory, ...]
    only_some: tuple[ArrayGroup, ...] = ()
    stats_available: bool = False

    @property
    def median_bytes(self) -> float:
        return statistics.median(h.live_bytes for h in self.hosts) if self.hosts else 0.0

    @property
    def heavy_processes(self) -> tuple[int, ...]:
        """Hosts whose live bytes exceed the median by more than 10% and 1 MiB."""
        med = self.median_bytes
        return tuple(
            h.process
            for h in self.hosts
            if h.live_bytes > med * 1.1 and h.live_bytes - med > (1 << 20)
        )

    @property
    def odd_processes(self) -> tuple[int, ...]:
        """Hosts that stand out: heavy, or holding arrays the others do not (1 MiB or more)."""
        extra = {p for g in self.only_some if g.host_bytes >= (1 << 20) for p in g.extra_processes}
        return tuple(sorted(extra | set(self.heavy_processes)))

    def format(self) -> str:
        """The verdict, then hosts and devices grouped by identical lines, and the kinds of
        arrays only some hosts hold. Bounded at any number of hosts: at most
        `MAX_TEXT_LINES` lines of hosts (those that stand out always among them) and of
        devices, the rest counted."""
        lines = [
            f'memory of {len(self.hosts)} hosts: live arrays per host, median '
            f'{_mib(self.median_bytes)}'
            + (
                f'; odd: {fmt_hosts(self.odd_processes)}'
                if self.odd_processes
                else '; no host stands out'
            )
        ]
        lines += self._host_lines()
        if not self.stats_available:
            lines.append(
                '  device memory_stats(): not reported by this backend (CPU); '
                'device figures are live-array bytes'
            )
        else:
            lines += self._device_lines()
        for g in self.only_some[:10]:
            names = f' ({", ".join(g.names[:3])})' if g.names else ''
            lines.append(
                f'  only some hosts hold {g.kind}{names}, {_mib(g.host_bytes)} each: '
                + _by_count(g.counts)
            )
        if len(self.only_some) > 10:
            lines.append(f'  ... and {len(self.only_some) - 10} more kinds only some hosts hold')
        return '\n'.join(lines)

    def _host_lines(self) -> list[str]:
        """``'  processes 0-2, 4: 3 arrays, 8.0 MiB'``: hosts with the same line grouped."""
        heavy = set(self.heavy_processes)
        groups: dict[str, list[int]] = {}
        for h in self.hosts:
            mark = ' <-- stands out' if h.process in heavy else ''
            line = f'{h.live_count} arrays, {_mib(h.live_bytes)}{mark}'
            groups.setdefault(line, []).append(h.process)
        items = list(groups.items())
        if len(items) > MAX_TEXT_LINES:
            # The hosts that stand out first, then the largest groups; shown in process order.
            ranked = sorted(items, key=lambda kv: (heavy.isdisjoint(kv[1]), -len(kv[1])))
            items = sorted(ranked[: MAX_TEXT_LINES - 1], key=lambda kv: kv[1][0])
        lines = [f'  {fmt_hosts(ps)}: {text}' for text, ps in items]
        shown = {p for _, ps in items for p in ps}
        left = [h.live_bytes for h in self.hosts if h.process not in shown]
        if left:
            lines.append(
                f'  ... and {len(left)} more hosts ({len(groups) - len(items)} other lines), '
                f'{_span(left)} each'
            )
        return lines

    def _device_lines(self) -> list[str]:
        """Devices that report ``memory_stats()``, those with the same line grouped; beyond
        `MAX_TEXT_LINES` groups, the largest group and the most memory in use, the rest
        counted."""
        groups: dict[str, list[DeviceMemory]] = {}
        for h in self.hosts:
            for d in h.devices:
                if d.in_use is None:
                    continue
                lim = f' of {_mib(d.limit)}' if d.limit else ''
                line = f'in use {_mib(d.in_use)}{lim}, peak {_mib(d.peak or 0)}'
                groups.setdefault(line, []).append(d)
        items = list(groups.items())
        if len(items) > MAX_TEXT_LINES:
            largest = max(items, key=lambda kv: len(kv[1]))[0]
            heaviest = sorted(
                (text for text in groups if text != largest),
                key=lambda text: -max(d.in_use or 0 for d in groups[text]),
            )
            keep = {largest, *heaviest[: MAX_TEXT_LINES - 2]}
            items = [kv for kv in items if kv[0] in keep]
        lines = []
        for text, devs in items:
            who = (
                devs[0].label
                if len(devs) == 1
                else f'{len(devs)} devices of {fmt_hosts({d.process for d in devs})}'
            )
            lines.append(f'  {who}: {text}')
        shown = {text for text, _ in items}
        left = [d.in_use or 0 for text, devs in groups.items() if text not in shown for d in devs]
        if left:
            lines.append(
                f'  ... and {len(left)} more devices ({len(groups) - len(items)} other lines), '
                f'in use {_span(left)}'
            )
        return lines

    def __str__(self) -> str:
        return self.format()


def _by_count(counts: Sequence[int], max_groups: int = 4) -> str:
    """``(0, 0, 0, 1)`` -> ``'1 on process 3; 0 on processes 0-2'`` (fewest hosts first)."""
    hosts: dict[int, list[int]] = {}
    for p, c in enumerate(counts):
        hosts.setdefault(c, []).append(p)
    ranked = sorted(hosts.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    text = '; '.join(f'{c} on {fmt_hosts(ps)}' for c, ps in ranked[:max_groups])
    if len(ranked) > max_groups:
        rest = sum(len(ps) for _, ps in ranked[max_groups:])
        text += f'; ... {len(ranked) - max_groups} other counts on {rest} hosts'
    return text


def _mib(n: float | int) -> str:
    return f'{n / (1 << 20):.1f} MiB'


def _span(values: Sequence[int]) -> str:
    """``'8.0 MiB'`` or ``'8.0 MiB to 9.6 MiB'``: the range of byte counts."""
    lo, hi = _mib(min(values)), _mib(max(values))
    return lo if lo == hi else f'{lo} to {hi}'


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
        for d in on:
            if d in per_device:
                per_device[d] += shard_bytes
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
            DeviceMemory(id=i, process=p, local=loc, live_bytes=b, in_use=u, peak=pk, limit=lim)
            for i, loc, b, u, pk, lim in s['devices']
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
