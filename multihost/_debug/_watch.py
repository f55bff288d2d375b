"""Watched launches: jitted steps recorded, and checked across hosts before launch.

``multihost.watch(jax.jit(f))`` behaves like the jitted function. Each call
builds a signature key (a dict hit after a signature's first call), records
the call in the flight recorder, with ``check=True`` takes its turn in the
collective sequence (`_sequence.check_launch`) and, when some host sees the
signature for the first time, compares the compiled programs; then it
launches. A call with a tracer argument passes straight through, unrecorded.
See docs/ARCHITECTURE.md, "Watched launches and the flight recorder".
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from multihost import _jax_adapter, _recorder, _structure
from multihost._debug._colltable import KINDS
from multihost._errors import CollectiveMismatchError, HostFailedError
from multihost._exchange import _kv, _sequence
from multihost._models._records import CollectiveRecord
from multihost._text import SOURCE_PATHS_FIX, dirs_by_host, fmt_groups, fmt_hosts, grouped_lines

#: Collectives named when two hosts' programs differ: at most this many per host.
_MAX_COLLECTIVES = 256
#: Lines per block when hosts compare their HLO text (only when programs differ).
_BLOCK = 64
_MAX_LINE = 240  # characters of an HLO line or structure shown in a message
#: HLO lines longer than this are cut when two hosts share a block of them.
_MAX_SHARED_LINE = 16384
#: Characters of the input structure a host shares after a mismatch.
_MAX_TREE = 1 << 18
#: Per differing argument, values shown (the rest counted with their hosts).
_MAX_VALUES = 4
#: Host ranges named per value (``processes 0, 7, 14, 21, ... (143 in all)``).
_MAX_RANGES = 4
#: Differing arguments listed in a mismatch message (the rest counted).
_MAX_DIFFS = 3
#: Signatures listed when hosts launch different functions (the rest counted).
_MAX_GROUPS = 8
_OP = re.compile(r'=\s*(\S.*?)\s+(' + '|'.join(KINDS) + r')(?:-start)?\(')
_GROUPS = re.compile(r'replica_groups=(\S+?)(?:,\s|$)|replica_groups=(mesh\[[^\]]*\]\s*\{[^}]*\})')
_PAIRS = re.compile(r'source_target_pairs=(\{[^ ]*\})')
_METADATA = re.compile(r',?\s*metadata=\{[^}]*\}')


@dataclass
class _Signature:
    """What one input signature of a watched function is (computed once per signature)."""

    digest: str
    args: list[tuple[str, str]]  # (argument path, description), in order
    tree: str = ''  # the input structure (`_structure.structure`)
    fingerprint: str | None = None  # None until compiled
    program: str = ''  # digest of the optimized HLO, source locations and names aside
    compiled: Any = None


def watch(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, check: bool = True
) -> Any:
    """Records every call of ``fn`` in the flight recorder and checks it across hosts before launch.

    Use on a jitted function (or any callable that launches device
    collectives), directly or as a decorator::

        step = multihost.watch(jax.jit(train_step))

        @multihost.watch(name='eval')
        @jax.jit
        def eval_step(params, batch): ...

    Args:
        fn: the function to watch.
        name: the name shown in records and errors (default: ``fn``'s name).
        check: check every call across hosts before launch (one coordination
            round trip, like a barrier; ``MULTIHOST_CHECK=0`` switches it off
            like the core collectives' check). ``False`` only records (a few
            microseconds per call); the wavefront and timeline still work.

    Returns:
        A callable with ``fn``'s behaviour (results, exceptions, donation).

    Raises (from the returned callable, on every host, before launch):
        CollectiveMismatchError: hosts are about to launch different programs.
        HostFailedError: the function failed to compile on some hosts only.
        BarrierTimeoutError: some host did not reach this call in time.
    """
    if fn is None:
        return lambda f: watch(f, name=name, check=check)
    if not callable(fn):
        raise TypeError(f'multihost.watch needs a callable (a jitted function), got {fn!r}')
    return Watched(fn, name=name, check=check)


def _fn_name(fn: Any) -> str:
    inner = getattr(fn, '__wrapped__', fn)
    return str(getattr(inner, '__name__', None) or getattr(fn, '__name__', None) or repr(fn))


class Watched:
    """A watched function (see `watch`); calls behave like the wrapped function's."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None, check: bool):
        # A function jitted under `multihost.install` records its own launches:
        # watch the jitted function inside it, so each call is recorded once.
        fn = getattr(fn, '_multihost_unrecorded', fn)
        self.fn = fn
        self.name = str(name or _fn_name(fn))
        self.check = bool(check)
        statics = _jax_adapter.jit_statics(fn)
        self._by_value = statics is None  # statics unknown: every Python scalar keyed by value
        self._static_nums, self._static_names = statics or ((), ())
        self._lower = getattr(fn, 'lower', None)
        self._signatures: dict[Any, _Signature] = {}
        inner = getattr(fn, '__wrapped__', fn)
        # The qualified name, not the module's: a module may be imported under
        # other names on different hosts (scripts, notebooks, test harnesses).
        self._ident = str(getattr(inner, '__qualname__', self.name))
        try:
            self._params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self._params = []
        functools.update_wrapper(self, fn, updated=())

    def __repr__(self) -> str:
        return f'multihost.watch({self.fn!r}, name={self.name!r}, check={self.check})'

    @property
    def signatures(self) -> int:
        """How many input signatures this function was called with."""
        return len(self._signatures)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    # -- the call -------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._key(args, kwargs)
        if key is None:  # a tracer: inside an outer jit/scan, nothing to record
            return self.fn(*args, **kwargs)
        return self.launch(key, args, kwargs)

    def signature_key(self, args: tuple, kwargs: dict) -> Any:
        """The call's signature key (hashable), or None when an argument is a tracer."""
        return self._key(args, kwargs)

    def compiled_signature(self, args: tuple, kwargs: dict) -> _Signature:
        """A signature's description, compiled (`launch` takes it): its devices known early."""
        sig = self._describe(args, kwargs)
        self._compile(sig, args, kwargs)
        return sig

    def launch(
        self,
        key: Any,
        args: tuple,
        kwargs: dict,
        *,
        sig: _Signature | None = None,
        site: str | None = None,
        spans: bool | None = None,
    ) -> Any:
        """One call of signature ``key``: recorded, checked, launched.

        ``sig``: the signature's description if the caller built it
        (`compiled_signature`); ``site``: the caller's call site, ``spans``:
        what the record says of the devices (`multihost.install` knows both).
        """
        known = self._signatures.get(key)
        new = known is None
        if known is not None:
            sig = known
        elif sig is None:
            sig = self._describe(args, kwargs)
        if site is None:
            site = _sequence.call_site()
        client = _kv.client() if self.check and _sequence.checking_enabled() else None
        entry = _recorder.note(
            'launch',
            self.name,
            seq=None,
            digest=sig.digest,
            site=site,
            fingerprint=sig.fingerprint or '',
            checked=client is not None,
        )
        entry.spans = spans
        try:
            if client is not None:
                self._check(sig, new, site, entry, args, kwargs)
            elif new:
                self._compile(sig, args, kwargs)
                entry.fingerprint = sig.fingerprint or ''
            if new:
                self._signatures[key] = sig
            out = self.fn(*args, **kwargs)
        except BaseException:
            _recorder.finished(entry, failed=True)
            raise
        _recorder.launched(entry, first_array(out), last_array(out))
        return out

    # -- signature --------------------------------------------------------------------

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """(dynamic args, dynamic kwargs, static values) per the jit's static arguments."""
        if not self._static_nums and not self._static_names:
            return args, kwargs, ()
        nums = {i % len(args) if i < 0 else i for i in self._static_nums} if args else set()
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        statics: list[Any] = [(i, args[i]) for i in sorted(nums) if i < len(args)]
        dyn_kwargs = {}
        for k, v in kwargs.items():
            if k in self._static_names:
                statics.append((k, v))
            else:
                dyn_kwargs[k] = v
        return dyn_args, dyn_kwargs, tuple(statics)

    def _key(self, args: tuple, kwargs: dict) -> Any:
        """The signature key (hashable), or None when an argument is a tracer."""
        dyn_args, dyn_kwargs, statics = self._split(args, kwargs)
        leaves, treedef = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
        parts: list[Any] = []
        for x in leaves:
            t = type(x)
            if t in _CONCRETE or (t not in _KEYS and _is_concrete_array(x)):
                parts.append((x.shape, x.dtype, x.weak_type, _sharding_token(x.sharding)))
            elif t in _KEYS:  # typed PRNG keys: no weak type
                parts.append((x.shape, x.dtype, _sharding_token(x.sharding)))
            elif issubclass(t, _Tracer):
                return None
            elif t is np.ndarray:
                parts.append((x.shape, x.dtype))
            elif self._by_value:
                parts.append((t, _hashable(x)))
            else:
                parts.append(t)  # Python scalars: by type (weak), not value
        return (treedef, tuple(parts), tuple((k, _hashable(v)) for k, v in statics))

    def _describe(self, args: tuple, kwargs: dict) -> _Signature:
        """The signature's readable description (argument path -> type) and its digest."""
        dyn_args, dyn_kwargs, statics = self._split(args, kwargs)
        static_pos = {k for k, _ in statics}
        described: list[tuple[str, str]] = []
        described_full: list[str] = []  # static values uncut
        positions = [i for i in range(len(args)) if i not in static_pos]
        for i, value in zip(positions, dyn_args):
            described += _leaves(self._param(i), value, self._by_value)
        for k, v in dyn_kwargs.items():
            described += _leaves(k, v, self._by_value)
        for k, v in statics:
            label = self._param(k) if isinstance(k, int) else str(k)
            static = _structure.static(v)  # by value; functions by name, never an address
            described.append((label, f'static {_cut(static)}'))
            described_full.append(static)
        # The structure as every host sees it (no addresses of static functions).
        tree = _structure.structure(jax.tree_util.tree_structure((dyn_args, dyn_kwargs)))
        h = hashlib.blake2b(digest_size=8)
        h.update(self._ident.encode())
        h.update(tree.encode())
        for path, text in described:
            h.update(f'\0{path}\0{text}'.encode())
        for static in described_full:
            h.update(f'\0{static}'.encode())
        return _Signature(digest=h.hexdigest(), args=described, tree=tree)

    def _param(self, i: int) -> str:
        return self._params[i] if i < len(self._params) else f'arg{i}'

    # -- compile ----------------------------------------------------------------------

    def _compile(self, sig: _Signature, args: tuple, kwargs: dict) -> None:
        """Compiles ``sig`` (JAX's dispatch reuses it) and keeps its fingerprint ('' if none)."""
        if sig.fingerprint is not None:
            return
        if self._lower is None:
            sig.fingerprint = ''
            return
        compiled = self._lower(*args, **kwargs).compile()
        sig.compiled = compiled
        sig.fingerprint = _jax_adapter.fingerprint(compiled)
        sig.program = _crc('\n'.join(_normalized(_hlo_lines(compiled))))

    # -- the cross-host check ---------------------------------------------------------

    def _check(
        self,
        sig: _Signature,
        new: bool,
        site: str,
        entry: _recorder.Entry,
        args: tuple,
        kwargs: dict,
    ) -> None:
        try:
            rec, raw, anyone_new = _sequence.check_launch(
                self.name, sig.digest, new=new, site=site, entry=entry
            )
        except CollectiveMismatchError as exc:
            if exc.calls and all(c.kind == 'launch' for c in exc.calls.values()):
                raise self._signature_mismatch(exc, sig) from None
            raise
        if not anyone_new:
            return
        # A host sees this signature for the first time: compile, compare programs.
        failure = ''
        try:
            self._compile(sig, args, kwargs)
        except Exception as exc:  # the program does not build here: say so everywhere
            failure = f'{type(exc).__name__}: {exc}'[:2000]
            error: Exception | None = exc
        else:
            error = None
        entry.fingerprint = sig.fingerprint or ''
        mine = json.dumps({'fp': sig.program, 'error': failure, 'exe': sig.fingerprint or ''})
        what = 'comparing the programs compiled for a new signature'
        shared = {p: json.loads(v) for p, v in _sequence.share(rec, 'fp', mine, what=what).items()}
        failed = {p: v['error'] for p, v in shared.items() if v['error']}
        if failed:
            if error is not None and len(failed) == len(shared):
                raise error  # fails everywhere: the user's own error, as without watch
            raise HostFailedError(
                f'{self.name} [#{rec.seq}] could not be compiled on {fmt_hosts(failed)}:\n'
                + '\n'.join(grouped_lines(failed, what='distinct reasons', attr='reasons'))
                + '\nNo host launched it.',
                seq=rec.seq,
                reasons=failed,
            ) from error
        prints = {p: v['fp'] for p, v in shared.items()}
        if len(set(prints.values())) > 1:
            calls = {p: CollectiveRecord.from_json(v) for p, v in raw.items()}
            raise self._program_mismatch(rec, calls, sig, prints)
        exes = {p: v.get('exe', '') for p, v in shared.items()}
        if (
            len(set(exes.values())) > 1
            and _collectives_keyed_by_program()
            and _collectives(_hlo_lines(sig.compiled))
        ):
            calls = {p: CollectiveRecord.from_json(v) for p, v in raw.items()}
            raise self._source_paths_mismatch(rec, calls, exes)

    def _source_paths_mismatch(
        self, rec: CollectiveRecord, calls: dict[int, CollectiveRecord], exes: dict[int, str]
    ) -> CollectiveMismatchError:
        """The same program modulo source locations, different executables, on a runtime
        whose collectives meet only within one executable: the launch would hang."""
        sites = {p: calls[p].site for p in calls}
        where = (
            'called from ' + dirs_by_host(sites)
            if len({os.path.dirname(s.rsplit(':', 1)[0]) for s in sites.values()}) > 1
            else 'the files of the code it runs sit at different paths on different hosts'
        )
        return CollectiveMismatchError(
            f'watched launch mismatch at #{rec.seq}: {self.name} compiles to the same program '
            'on every host but for its source locations, and the hosts hold '
            f'{len(set(exes.values()))} distinct executables ({where}). '
            f"On jax {jax.__version__} with CPU devices a program's collectives meet only "
            'within one executable, so its collectives would never complete '
            '(caught before launch; nothing was launched).\n' + SOURCE_PATHS_FIX,
            seq=rec.seq,
            calls=calls,
        )

    def _signature_mismatch(
        self, exc: CollectiveMismatchError, sig: _Signature
    ) -> CollectiveMismatchError:
        """Hosts launch different functions or signatures: one more round for the details.

        The message leads with what differs (the functions, or the first
        differing arguments, each with the hosts holding each value) and counts
        the arguments that are the same everywhere instead of listing them.
        """
        pid = _kv.process_index()
        rec = exc.calls[pid]
        calls = exc.calls
        # One host per distinct (function, signature digest) shares the readable signature.
        firsts: dict[tuple[str, str], int] = {}
        sender = {p: firsts.setdefault((c.name, c.digest), p) for p, c in sorted(calls.items())}
        mine = (
            json.dumps({'args': sig.args, 'tree': sig.tree[:_MAX_TREE], 'ident': self._ident})
            if sender.get(pid) == pid
            else ''
        )
        try:
            shared = _sequence.share(rec, 'sig', mine, timeout=30.0)
        except Exception:
            return exc
        parsed = {q: json.loads(shared[q]) for q in set(sender.values()) if q in shared}
        infos = {p: parsed[q] for p, q in sender.items() if q in parsed}
        groups: dict[tuple[str, str], list[int]] = {}
        for p, c in sorted(calls.items()):
            groups.setdefault((c.name, c.digest), []).append(p)
        majority = max(groups.values(), key=lambda ps: (len(ps), -ps[0]))
        odd = sorted(p for p in calls if p not in majority)
        names: dict[str, list[int]] = {}
        for p, c in sorted(calls.items()):
            names.setdefault(c.name, []).append(p)
        head = f'watched launch mismatch at #{exc.seq}: '
        tail = ' (caught before launch; nothing was launched)'
        if len(names) > 1:
            head += 'processes are about to launch different functions: '
            head += _fmt_groups(names) + tail
            body = [
                f'  {fmt_hosts(ps)}: {name}({_fmt_args(_args(infos.get(ps[0])), 3)}) '
                f'at {_group_site({p: calls[p].site for p in ps})}'
                for (name, _), ps in list(groups.items())[:_MAX_GROUPS]
            ]
            if len(groups) > _MAX_GROUPS:
                body.append(f'  ... {len(groups) - _MAX_GROUPS} more signatures')
        else:
            head += f'{rec.name} has different inputs on {fmt_hosts(odd)}' + tail
            body = _input_differences(infos)
            sites = _grouped({p: c.site for p, c in calls.items()})
            files = {os.path.basename(site) for site in sites}
            if len(sites) == 1:
                body.append(f'called at {next(iter(sites))} on every host')
            elif len(files) == 1:  # notebooks: /tmp/ipykernel_<pid>/<cell>.py on each host
                body.append(
                    f'called at {next(iter(files))} on every host (in different directories)'
                )
            else:
                body.append('called at ' + _fmt_groups(sites, 2))
        return CollectiveMismatchError(
            head
            + '\n'
            + '\n'.join(body)
            + '\nEvery host must launch the same program, in the same order, with the same '
            'shapes, shardings and static arguments.',
            seq=exc.seq,
            calls=calls,
        )

    def _program_mismatch(
        self,
        rec: CollectiveRecord,
        calls: dict[int, CollectiveRecord],
        sig: _Signature,
        prints: dict[int, str],
    ) -> CollectiveMismatchError:
        """Same inputs, different executables: the first collective (or HLO line) that differs.

        Programs are compared modulo instruction names (`_normalized`): a
        host-dependent branch renumbers every instruction after it, and the
        line shown is the first that differs in op, shape, constant or operands.
        """
        hlo = _hlo_lines(sig.compiled)
        norm = _normalized(hlo)
        colls = _collectives(hlo)
        blocks = [_crc('\n'.join(norm[i : i + _BLOCK])) for i in range(0, len(norm), _BLOCK)]
        groups: dict[str, list[int]] = {}
        for p, fp in sorted(prints.items()):
            groups.setdefault(fp, []).append(p)
        # One host per distinct program shares its collectives and blocks (the
        # same program: the same lists), so no host reads N copies.
        first = {p: groups[fp][0] for p, fp in prints.items()}
        me = _kv.process_index()
        table = _table_json(sig.compiled)  # the collectives in words, with their lines
        mine = json.dumps({'colls': colls[:_MAX_COLLECTIVES], 'blocks': blocks, 'table': table})
        got_lists = _sequence.share(rec, 'coll', mine if first[me] == me else '')
        by_program = {q: json.loads(got_lists[q]) for q in set(first.values())}
        shared = {p: by_program[q] for p, q in first.items()}
        ref_fp = max(groups, key=lambda fp: (len(groups[fp]), -groups[fp][0]))
        ref = groups[ref_fp][0]
        odd = sorted(p for p, fp in prints.items() if fp != ref_fp)
        lines = [
            f'  {fmt_hosts(ps)}: program {fp[:12]}' + (' (majority)' if fp == ref_fp else '')
            for fp, ps in groups.items()
        ]
        detail = ''
        diff_colls = [p for p in odd if shared[p]['colls'] != shared[ref]['colls']]
        if diff_colls:
            p = diff_colls[0]
            a, b = shared[ref]['colls'], shared[p]['colls']
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            detail = (
                f'first differing collective (#{i} in program order):\n'
                f'  process {ref}: {_fmt_coll(a[i] if i < len(a) else None)}\n'
                f'  process {p}: {_fmt_coll(b[i] if i < len(b) else None)}'
            ) + _parting_words(shared[ref].get('table', ''), shared[p].get('table', ''), ref, p)
        else:
            # Same collectives, different program: find the first HLO line that
            # differs modulo instruction names.
            p = odd[0]
            a, b = shared[ref]['blocks'], shared[p]['blocks']
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            span = slice(k * _BLOCK, (k + 1) * _BLOCK)
            block = {
                'raw': [x[:_MAX_SHARED_LINE] for x in hlo[span]],
                'norm': [x[:_MAX_SHARED_LINE] for x in norm[span]],
                'crc': [_crc(x) for x in norm[span]],
            }
            got = _sequence.share(rec, 'hlo', json.dumps(block) if me in (ref, p) else '')
            ba, bb = json.loads(got[ref]), json.loads(got[p])  # only the two compared hosts'
            ca, cb = ba['crc'], bb['crc']
            j = next((j for j, (x, y) in enumerate(zip(ca, cb)) if x != y), min(len(ca), len(cb)))
            la, lb = _differing_excerpts(ba, bb, j)
            detail = (
                'same collectives, different program; first differing HLO line '
                f'(line {k * _BLOCK + j + 1}, metadata stripped, instruction names aside):\n'
                f'  process {ref}: {la}\n'
                f'  process {p}: {lb}'
            )
        return CollectiveMismatchError(
            f'watched launch mismatch at #{rec.seq}: {self.name} has the same inputs on every '
            f'host but compiles to different programs on {fmt_hosts(odd)} '
            '(caught before launch; nothing was launched):\n'
            + '\n'.join(lines)
            + '\n'
            + detail
            + '\nLook for flags (XLA_FLAGS, jax.config) or code that depends on the host.',
            seq=rec.seq,
            calls=calls,
        )


# -- descriptions ---------------------------------------------------------------------

_Tracer = jax.core.Tracer
#: Concrete array types seen so far (`jax.Array` subclasses that are not tracers):
#: a set lookup per leaf instead of two `isinstance` checks against ABCs.
_CONCRETE: set[type] = set()
#: Types of typed PRNG key arrays seen so far (``jax.random.key``): arrays of a
#: key dtype (``key<fry>``), without ``weak_type`` or ``is_ready``.
_KEYS: set[type] = set()


def _is_key(x: Any) -> bool:
    dtype = getattr(x, 'dtype', None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _is_concrete_array(x: Any) -> bool:
    """Whether ``x`` is a concrete array of a numeric dtype (its type is remembered either way)."""
    t = type(x)
    if not isinstance(x, jax.Array) or issubclass(t, _Tracer):
        return False
    if _is_key(x):
        _KEYS.add(t)
        return False
    _CONCRETE.add(t)
    return True


#: id(sharding) -> (the sharding, its token); sharding -> token. Equal shardings
#: share a token; a key hashes the small int, not the sharding (a Python-level
#: hash per leaf). The sharding is held, so its id is not reused while listed.
_BY_ID: dict[int, tuple[Any, int]] = {}
_BY_VALUE: dict[Any, int] = {}
_MAX_IDS = 4096


def _sharding_token(s: Any) -> int:
    hit = _BY_ID.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    token = _BY_VALUE.setdefault(s, len(_BY_VALUE))
    if len(_BY_ID) >= _MAX_IDS:
        _BY_ID.clear()
    _BY_ID[id(s)] = (s, token)
    return token


def first_array(out: Any) -> Any:
    """One `jax.Array` among a call's outputs (the first), or None; cheap for the usual shapes.

    The recorder asks it ``is_ready()``, which key arrays lack: the first
    array that is not a key, else the first key's data (the buffer it wraps).
    """
    top = out
    for _ in range(4):  # (out, aux), [arrays], {name: array}: descend into the first item
        if type(out) in _CONCRETE:
            return out
        if isinstance(out, (tuple, list)):  # containers first: no ABC check for them
            if not out:
                break
            out = out[0]
        elif isinstance(out, dict):
            if not out:
                break
            out = next(iter(out.values()))
        elif isinstance(out, jax.Array):
            if _is_concrete_array(out):  # its type remembered: a set lookup next time
                return out
            break
        else:
            break
    key = None
    for x in jax.tree_util.tree_leaves(top):
        if isinstance(x, jax.Array):
            if not _is_key(x):
                return x
            key = x if key is None else key
    return None if key is None else jax.random.key_data(key)


def last_array(out: Any) -> Any:
    """The last `jax.Array` among a call's outputs when the usual shapes show it cheaply (a
    step's ``(state, loss)``: the loss), else None: rarely donated, unlike the first."""
    for _ in range(4):  # descend into the last item, as `first_array` does into the first
        if isinstance(out, (tuple, list)) and out:
            out = out[-1]
        elif isinstance(out, dict) and out:
            out = out[next(reversed(out))]
        elif isinstance(out, jax.Array):
            return None if _is_key(out) else out
        else:
            return None
    return None


def _hashable(v: Any) -> Any:
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


def _cut(text: str, n: int = 80) -> str:
    """``text`` cut to ``n`` characters (``...`` marks the cut): messages stay bounded."""
    return text if len(text) <= n else text[: n - 3] + '...'


def _cut_repr(v: Any, n: int = 80) -> str:
    return _cut(repr(v), n)


_DTYPE_SHORT = {'float': 'f', 'int': 'i', 'uint': 'u', 'bfloat': 'bf', 'complex': 'c'}


def _dtype(dtype: Any) -> str:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return str(dtype)  # key<fry>
    name = np.dtype(dtype).name
    for long, short in _DTYPE_SHORT.items():
        if name.startswith(long) and name[len(long) :].isdigit():
            return short + name[len(long) :]
    return name


def _sharding(s: Any) -> str:
    spec = getattr(s, 'spec', None)
    mesh = getattr(s, 'mesh', None)
    if spec is not None and mesh is not None:
        axes = ','.join(f'{a}={n}' for a, n in dict(mesh.shape).items())
        return f'{spec} on mesh({axes})'
    ids = sorted(d.id for d in s.device_set)
    if len(ids) == 1:  # a host's own device: which one differs by host, by design
        return 'on one device'
    return f'{type(s).__name__} on devices {_crc(str(ids))[:6]} ({len(ids)})'


def _leaf(x: Any, by_value: bool) -> str:
    if isinstance(x, jax.Array):
        weak = ' weak' if getattr(x, 'weak_type', False) else ''
        shape = ','.join(map(str, x.shape))
        return f'{_dtype(x.dtype)}[{shape}]{weak} {_sharding(x.sharding)}'
    if isinstance(x, np.ndarray):
        return f'{_dtype(x.dtype)}[{",".join(map(str, x.shape))}] numpy'
    if by_value:
        return f'{type(x).__name__} {_cut_repr(x)}'
    return f'{type(x).__name__} (weak)'


def _leaves(label: str, value: Any, by_value: bool) -> list[tuple[str, str]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(value)
    if len(flat) == 1 and not flat[0][0]:
        return [(label, _leaf(flat[0][1], by_value))]
    return [(label + jax.tree_util.keystr(path), _leaf(x, by_value)) for path, x in flat] or [
        (label, 'empty')
    ]


def _fmt_args(args: list[tuple[str, str]], limit: int = 6) -> str:
    shown = [f'{p}: {t}' for p, t in args[:limit]]
    if len(args) > limit:
        shown.append(f'... {len(args) - limit} more')
    return ', '.join(shown)


def _args(info: dict[str, Any] | None) -> list[tuple[str, str]]:
    return [(str(p), str(t)) for p, t in (info or {}).get('args', [])]


def _fmt_groups(by: dict[str, list[int]], limit: int = _MAX_VALUES) -> str:
    """``'f32[8] on processes 0, 2-3; f32[9] on process 1'``: at most ``limit`` values."""
    return fmt_groups(by, limit, _MAX_RANGES)


def _group_site(sites: dict[int, str]) -> str:
    """A group's call site: the same on every host, or its first host's and whose it is,
    then the others' (each engine numbers its own cells: ``Cell In[4]`` here, ``In[5]`` there)."""
    by = _grouped(sites)
    first = min(sites)
    if len(by) == 1:
        return sites[first]
    others = ', '.join(f'{s} on {fmt_hosts(ps)}' for s, ps in by.items() if s != sites[first])
    return f"{sites[first]} (process {first}'s; {others})"


def _grouped(values: dict[int, str]) -> dict[str, list[int]]:
    by: dict[str, list[int]] = {}
    for p, v in sorted(values.items()):
        by.setdefault(v, []).append(p)
    return by


def _input_differences(infos: dict[int, dict[str, Any]]) -> list[str]:
    """What differs between the hosts' signatures, first difference first.

    ``infos``: process -> its shared signature (``args``: [(path,
    description)], ``tree``: the structure, ``ident``: the function's
    qualified name). Arguments are matched by path; each differing one is a
    line naming the hosts of each value (``argument 'batch': f32[8,4] on
    processes 0, 1, 3; f32[8,5] on process 2``), at most `_MAX_DIFFS`; the
    arguments that are the same everywhere are counted.
    """
    if not infos:
        return ["first difference: unknown (the hosts' signatures could not be shared)"]
    idents = _grouped({p: str(i.get('ident', '')) for p, i in infos.items()})
    if len(idents) > 1:
        return ['first difference: the function itself: ' + _fmt_groups(idents)]
    args = {p: dict(_args(i)) for p, i in infos.items()}
    order = list(dict.fromkeys(path for p in sorted(infos) for path, _ in _args(infos[p])))
    differing, same = [], 0
    for path in order:
        by = _grouped({p: a.get(path, '<missing>') for p, a in args.items()})
        if len(by) == 1:
            same += 1
        else:
            differing.append(f'argument {path!r}: ' + _fmt_groups(by))
    if not differing:
        trees = _grouped({p: str(i.get('tree', '')) for p, i in infos.items()})
        return [
            'first difference: the input structure (node types, keys, static fields): '
            + _tree_difference(trees),
            (f'all {same} arguments have' if same != 1 else 'the one argument has')
            + ' the same shape, dtype and sharding on every host',
        ]
    lines = ['first difference: ' + differing[0]]
    lines += ['also differs: ' + d for d in differing[1:_MAX_DIFFS]]
    if len(differing) > _MAX_DIFFS:
        lines.append(f'... {len(differing) - _MAX_DIFFS} more arguments differ')
    verb = 'argument is' if same == 1 else 'arguments are'
    lines.append(f'{same} other {verb} the same on every host')
    return lines


def _tree_difference(trees: dict[str, list[int]]) -> str:
    """Each host group's structure around the first character where two of them differ."""
    texts = list(trees)
    if len(texts) < 2:
        return f'beyond the first {_MAX_TREE} characters of its text'
    pos = len(os.path.commonprefix(texts[:2]))
    shown = {_excerpt(t, pos, _MAX_LINE // 2): ps for t, ps in trees.items()}
    return _fmt_groups(shown, 2)


def _excerpt(text: str, pos: int, width: int = _MAX_LINE) -> str:
    """``text`` if short, else ``width`` characters of it around ``pos``, cuts marked."""
    if len(text) <= width:
        return text
    start = max(0, min(pos - width // 4, len(text) - width))
    end = start + width
    return ('...' if start else '') + text[start:end] + ('...' if end < len(text) else '')


def _crc(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def _hlo_lines(compiled: Any) -> list[str]:
    """The optimized HLO, one entry per line, without source locations.

    Drops ``metadata={...}`` and the source tables (``FileNames``,
    ``FunctionNames``, ``FileLocations``, ``StackFrames``): they name the
    caller's files, which differ between hosts that run the same program.
    """
    if compiled is None:
        return []
    try:
        text = compiled.as_text()
    except Exception:
        return []
    out = []
    skipping = False
    for line in text.splitlines():
        if line.strip() in _SOURCE_TABLES:
            skipping = True
            continue
        if skipping:
            if not line.strip():
                skipping = False
            continue
        out.append(_METADATA.sub('', line).rstrip())
    return out


_SOURCE_TABLES = frozenset({'FileNames', 'FunctionNames', 'FileLocations', 'StackFrames'})
#: Instruction and computation names (``%multiply.1231``); in a computation's
#: header line also its parameters' names (``(param_0.5: f32[8])``).
_NAME = re.compile(r'(?<=%)[\w.\-]+')
_HEADER_NAME = re.compile(r'(?<=%)[\w.\-]+|(?<![\w.\-%])[\w.\-]+(?=: )')


def _segments(line: str) -> list[str]:
    """``line`` split into text, name, text, name, ..., text (names at odd positions)."""
    pattern = _HEADER_NAME if line.startswith(('%', 'ENTRY ')) else _NAME
    out, pos = [], 0
    for m in pattern.finditer(line):
        out += [line[pos : m.start()], m.group()]
        pos = m.end()
    out.append(line[pos:])
    return out


def _normalized(lines: list[str]) -> list[str]:
    """The HLO lines with every name replaced by its number in order of first appearance.

    Two programs that differ only in how instructions are named (a
    host-dependent branch renumbers ``%mul.1231`` to ``%mul.1234`` in all
    that follows) normalize alike; what is left to differ is substance: ops,
    shapes, constants, operands, attributes.
    """
    ids: dict[str, int] = {}
    out = []
    for line in lines:
        segs = _segments(line)
        for i in range(1, len(segs), 2):
            segs[i] = str(ids.setdefault(segs[i], len(ids)))
        out.append(''.join(segs))
    return out


def _differing_excerpts(
    a: dict[str, list[str]], b: dict[str, list[str]], j: int
) -> tuple[str, str]:
    """Line ``j`` of two hosts' shared blocks, each shown around where they differ in substance."""
    ra = a['raw'][j] if j < len(a['raw']) else None
    rb = b['raw'][j] if j < len(b['raw']) else None
    if ra is None or rb is None:
        return (
            '<end of program>' if ra is None else _excerpt(ra, 0),
            '<end of program>' if rb is None else _excerpt(rb, 0),
        )
    sa, sb = _segments(a['norm'][j]), _segments(b['norm'][j])
    ga, gb = _segments(ra), _segments(rb)
    pa = pb = 0
    if len(sa) == len(ga) and len(sb) == len(gb):  # raw and normalized segments align
        i = next((i for i, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
        off = (
            len(os.path.commonprefix([sa[i], sb[i]]))
            if i % 2 == 0 and i < len(sa) and i < len(sb)
            else 0
        )
        pa = sum(map(len, ga[:i])) + off
        pb = sum(map(len, gb[:i])) + off
    return _excerpt(ra, pa), _excerpt(rb, pb)


def _collectives_keyed_by_program() -> bool:
    """`_analyze.collectives_keyed_by_program` for this process's jax and backend (asked
    only when the hosts' executables differ: the post-mortem module is not loaded before)."""
    from multihost._models._analyze import collectives_keyed_by_program

    return collectives_keyed_by_program(jax.__version__, jax.default_backend())


def _collectives(lines: list[str]) -> list[list[str]]:
    """[op, result shape, replica groups] of each collective instruction, in program order."""
    out = []
    for line in lines:
        m = _OP.search(line)
        if m is None:
            continue
        g = _GROUPS.search(line) or _PAIRS.search(line)
        groups = next((x for x in (g.groups() if g else ()) if x), '')
        out.append([m.group(2), m.group(1), groups])
    return out


def _table_json(compiled: Any) -> str:
    """``compiled``'s `CollectiveTable` as JSON ('' when it cannot be read: the message
    then goes without its words)."""
    try:
        from multihost._debug._colltable import table_for

        return table_for(compiled).to_json()
    except Exception:
        return ''


def _parting_words(a: str, b: str, ref: int, p: int) -> str:
    """Where two hosts' tables (JSON) part, each side in words with its line (the cross-host
    collectives first, then every one); '' when either is missing or they agree."""
    if not a or not b:
        return ''
    from multihost._models._colltable import CollectiveTable

    ta, tb = CollectiveTable.from_json(a), CollectiveTable.from_json(b)
    part = ta.first_difference(tb) or ta.first_difference(tb, every=True)
    if part is None:
        return ''
    _, x, y = part
    sides = [
        f'  process {q}: ' + (f'#{op.index} {op.words()}' if op else 'no further collective')
        for q, op in ((ref, x), (p, y))
    ]
    return '\nin words, with its line:\n' + '\n'.join(sides)


def _fmt_coll(c: list[str] | None) -> str:
    if c is None:
        return '<no further collective>'
    op, shape, groups = c
    return _cut(
        f'{op} -> {shape}' + (f' over replica_groups={groups}' if groups else ''), _MAX_LINE
    )
