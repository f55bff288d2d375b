"""Which keys differ between hosts: keyed rows compared with bounded reads at any host count.

`compare` (inside a collective: `tree_diff`'s fingerprints, the census's
`_dict_diff`) gives every host the same `RowDiff`: a digest of each host's rows
first, then the rows of one representative per group of alike hosts, or above
`REFERENCE_ABOVE` hosts their deltas against a reference host's. `plan`,
`delta` and `merge` are pure, so the exchange at 1,000 hosts can be replayed in
one process (`tests/engine/test_scale.py`). See docs/ARCHITECTURE.md, "Tree diff".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from multihost._exchange import _kv, _sequence

#: Above this many hosts, `compare` exchanges deltas against a reference host
#: instead of every distinct host's rows (one round more, bounded reads).
REFERENCE_ABOVE = 64

#: A row: [key, value], as JSON gives it back.
Row = list[str]


@dataclasses.dataclass(frozen=True)
class RowDiff:
    """The keys whose values differ between hosts.

    Attributes:
        num_keys: how many distinct keys the hosts hold together.
        differing: per differing key, in first-seen order over the hosts by
            process index: ``(key, host -> value)``, None where a host lacks it.
    """

    num_keys: int
    differing: tuple[tuple[str, dict[int, str | None]], ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Who moves rows: hosts grouped by head, one representative per group.

    Attributes:
        rep_of: host -> the representative of its group (its lowest host).
        reference: the representative of the largest group (ties: lowest).
    """

    rep_of: dict[int, int]
    reference: int

    @classmethod
    def of(cls, heads: Mapping[int, str]) -> Plan:
        groups: dict[str, list[int]] = {}
        for p in sorted(heads):
            groups.setdefault(heads[p], []).append(p)
        reference = max(groups.values(), key=lambda g: (len(g), -g[0]))[0]
        return cls({p: g[0] for g in groups.values() for p in g}, reference)

    @property
    def representatives(self) -> list[int]:
        return sorted(set(self.rep_of.values()))


def head(blob: str) -> str:
    """The 16-byte digest (hex) of a host's rows, as JSON."""
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def dumps(rows: Sequence[Sequence[str]]) -> str:
    """Rows as the compact JSON that travels (and is digested)."""
    return json.dumps([[k, v] for k, v in rows], separators=(',', ':'))


def delta(ref_rows: Sequence[Sequence[str]], rows: Sequence[Sequence[str]]) -> dict[str, Any]:
    """What a representative shares above `REFERENCE_ABOVE` hosts: its rows against the reference's.

    ``{'n': len, 'd': [[i, key, reference value, own value], ...]}`` when its
    keys are the reference's, in the same order; else ``{'rows': rows}``.
    """
    if len(rows) == len(ref_rows) and all(a[0] == b[0] for a, b in zip(rows, ref_rows)):
        return {
            'n': len(rows),
            'd': [
                [i, k, rv, v] for i, ((k, v), (_, rv)) in enumerate(zip(rows, ref_rows)) if v != rv
            ],
        }
    return {'rows': [[k, v] for k, v in rows]}


def merge(
    plan: Plan,
    published: Mapping[int, Any],
    ref_rows: Sequence[Sequence[str]] | None,
) -> RowDiff:
    """Every host's view of the differences (pure: the same inputs give the same `RowDiff`).

    Args:
        plan: the groups (`Plan.of` the heads).
        published: representative (other than the reference) -> its whole
            rows (a list) or its `delta` (a dict).
        ref_rows: the reference's rows; may be None when every published
            value is a delta of the ``'d'`` form.
    """
    patches: dict[int, dict[int, list[Any]]] = {}
    whole: dict[int, Sequence[Sequence[str]]] = {}
    for r in plan.representatives:
        if r == plan.reference:
            continue
        value = published[r]
        if isinstance(value, dict) and 'd' in value:
            patches[r] = {int(e[0]): e for e in value['d']}
        else:
            whole[r] = value['rows'] if isinstance(value, dict) else value
    if not whole:  # every host holds the reference's keys in its order
        if ref_rows is not None:
            num_keys = len(ref_rows)
        else:
            num_keys = next(int(published[r]['n']) for r in patches)
        return _merge_patches(plan, patches, num_keys)
    if ref_rows is None:
        raise ValueError("merge: whole rows were published but the reference's rows are unknown")
    return _merge_whole(plan, patches, whole, ref_rows)


def _merge_patches(
    plan: Plan, patches: Mapping[int, Mapping[int, list[Any]]], num_keys: int
) -> RowDiff:
    """`merge` when every representative published a ``'d'`` delta: the reference's key order.

    The reference's rows are not needed: each patch entry carries the
    reference's key and value next to its own.
    """
    differing = []
    for i in sorted({i for p in patches.values() for i in p}):
        first = next(p[i] for p in patches.values() if i in p)
        key, ref_value = first[1], first[2]
        values: dict[int, str | None] = {}
        for h in sorted(plan.rep_of):
            e = patches.get(plan.rep_of[h], {}).get(i)
            values[h] = e[3] if e is not None else ref_value
        differing.append((key, values))
    return RowDiff(num_keys, tuple(differing))


def _merge_whole(
    plan: Plan,
    patches: Mapping[int, Mapping[int, list[Any]]],
    whole_rows: Mapping[int, Sequence[Sequence[str]]],
    ref_rows: Sequence[Sequence[str]],
) -> RowDiff:
    """`merge` when some representative published whole rows: keys merged in first-seen order."""
    ref = plan.reference
    whole = {r: {k: v for k, v in rows} for r, rows in whole_rows.items()}
    ref_keys = [k for k, _ in ref_rows]
    ref_map = {k: v for k, v in ref_rows}
    ref_index = {k: i for i, k in enumerate(ref_keys)}

    def value_of(r: int, k: str) -> str | None:
        if r == ref:
            return ref_map.get(k)
        if r in whole:
            return whole[r].get(k)
        i = ref_index.get(k)
        if i is None:
            return None
        e = patches[r].get(i)
        return e[3] if e is not None else ref_map[k]

    order: list[str] = []
    seen: set[str] = set()
    ref_seen = False
    for r in plan.representatives:
        if r in whole:
            keys = [k for k, _ in whole_rows[r]]
        elif ref_seen:
            continue  # the reference's key order, already merged
        else:
            keys, ref_seen = ref_keys, True
        for k in keys:
            if k not in seen:
                seen.add(k)
                order.append(k)
    candidates: set[str] = set()
    for patch in patches.values():
        candidates.update(ref_keys[i] for i in patch)
    for m in whole.values():
        candidates.update(k for k, v in m.items() if ref_map.get(k) != v)
        candidates.update(k for k in ref_keys if k not in m)
    hosts = sorted(plan.rep_of)
    return RowDiff(
        len(order),
        tuple(
            (k, {h: value_of(plan.rep_of[h], k) for h in hosts}) for k in order if k in candidates
        ),
    )


def compare(
    rec: _sequence.CollectiveRecord,
    rows: Sequence[Sequence[str]],
    timeout: float | None,
) -> RowDiff | None:
    """Inside collective ``rec``: the keys whose values differ between hosts (None: no key).

    Every host calls it with its rows (unique string keys, string values)
    and gets the same answer. The rounds: docs/ARCHITECTURE.md, "Tree diff".
    """
    blob = dumps(rows)
    heads = _sequence.share(rec, 'head', head(blob), timeout=timeout, same=True)
    if len(set(heads.values())) <= 1:
        return None
    plan = Plan.of(heads)
    me = rec.process
    mine = [[k, v] for k, v in rows]
    rep = plan.rep_of[me]
    if len(heads) <= REFERENCE_ABOVE:
        got = _sequence.share(rec, 'rows', blob if me == rep else '', timeout=timeout)
        full = {r: mine if r == rep else json.loads(got[r]) for r in plan.representatives}
        return merge(plan, full, full[plan.reference])
    client = _kv.client()
    ref_key = _sequence.stage_dir(rec, 'ref') + '/rows'
    if me == plan.reference:
        _kv.put(client, ref_key, blob)
    _sequence.share(rec, 'ref', '', timeout=timeout)  # the reference's rows are there
    in_reference = rep == plan.reference
    ref_rows = mine if in_reference else None
    out = ''
    if me == rep and not in_reference:
        ref_rows = _read(client, ref_key)
        out = json.dumps(delta(ref_rows, mine), separators=(',', ':'))
    got = _sequence.share(rec, 'delta', out, timeout=timeout)
    published = {r: json.loads(got[r]) for r in plan.representatives if r != plan.reference}
    if ref_rows is None and any('rows' in d for d in published.values()):
        ref_rows = _read(client, ref_key)
    return merge(plan, published, ref_rows)


def _read(client: Any, k: str) -> list[Row]:
    text = _kv.get(client, k)
    if text is None:  # written before the reference arrived at the round: cannot happen
        raise RuntimeError(f"the reference host's rows are missing at {k}")
    rows: list[Row] = json.loads(text)
    return rows
