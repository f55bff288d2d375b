"""The collective table of a recorded launch, made when a dump asks (never on the launch path).

The installed jit (`_jit.Jitted`) leaves two things, at almost no cost per launch: the call in
flight on each thread (`IN_FLIGHT`: its record, function and arguments, removed when the
call returns) and, when a call compiled a new program (JAX's cache grew), that call's
signature as shapes and shardings. A dump's pending launch is found in one of them and
lowered again: JAX's caches hand back the program it ran (about a millisecond), whose
`CollectiveTable` is made once and cached by the executable. When a function holds several
programs and its pending call has returned, which one ran is not known from the host: when
the programs' cross-host collectives agree (a second program for other input shardings) the
table is theirs, with a note; else it says so in its notes and has no rows.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import weakref
from typing import Any

from multihost._models._colltable import CollectiveTable

#: thread ident -> (record, Jitted, args, kwargs) while that thread is inside the call.
IN_FLIGHT: dict[int, tuple[Any, Any, tuple, dict]] = {}
#: Every Jitted alive (to find the one whose last launch a dump shows pending).
JITTED: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
#: Signatures kept per function (one per program it compiled, the newest ones).
MAX_PROGRAMS = 8


def abstract(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` with every array as a `jax.ShapeDtypeStruct` (shape, dtype, and
    sharding when committed; readable also once donated); None when they cannot be read."""
    import jax

    def shape(x: Any) -> Any:
        if isinstance(x, jax.Array):  # an uncommitted array follows the others' devices
            sharding = x.sharding if getattr(x, 'committed', True) else None
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return x

    try:
        return jax.tree.map(shape, (args, kwargs))
    except Exception:  # an argument JAX cannot flatten here: no table for it
        return None


def table_of(pending: Any) -> CollectiveTable | None:
    """The collective table of the launch record ``pending`` (a `FlightRecord`); None when no
    installed jit made it."""
    for rec, jitted, args, kwargs in list(IN_FLIGHT.values()):
        if _same(rec, pending):
            return _table(jitted, abstract(args, kwargs))
    for jitted in list(JITTED):
        rec = jitted._entry
        if rec is None or not _same(rec, pending):
            continue
        if jitted._programs > 1:
            return _one_of(jitted)
        return _table(jitted, jitted._abstract[-1] if jitted._abstract else None)
    return None


def _one_of(jitted: Any) -> CollectiveTable:
    """The table of a returned call of a function holding several programs: which one it ran
    is not known on the host, but when every program kept has the same cross-host
    collectives (a second program for other input shardings, say) that does not matter."""
    n, name = jitted._programs, jitted._name
    tables = [_table(jitted, sig) for sig in jitted._abstract]
    known = [t for t in tables if t is not None]
    if len(known) == n and all(t.first_difference(known[-1]) is None for t in known):
        note = (
            f'{n} programs compiled for {name}, with the same cross-host collectives: '
            'which one this call ran does not change them'
        )
        return dataclasses.replace(known[-1], notes=(*known[-1].notes, note))
    why = 'their cross-host collectives differ' if len(known) == n else 'not every one was kept'
    return CollectiveTable(
        program=name,
        notes=(
            f'{n} programs compiled for {name} ({why}): which one this call ran is not known '
            'on the host (multihost run --check-jit keys each call by its signature)',
        ),
    )


def _same(rec: Any, pending: Any) -> bool:
    return bool(rec.kind == pending.kind and rec.name == pending.name and rec.call == pending.call)


def _table(jitted: Any, sig: tuple[tuple, dict] | None) -> CollectiveTable | None:
    if sig is None:
        return None
    from multihost._debug._colltable import table_for

    args, kwargs = sig
    with _lock:
        compiled = jitted._fn.trace(*args, **kwargs).lower().compile()
        return table_for(compiled)


def for_dump(pending: Any) -> dict[str, Any]:
    """``{label: table}`` (JSON-ready) of a dump's pending launch; {} when there is none, or it
    cannot be made (a dump never fails for it: the reason goes into the table's notes)."""
    if pending is None or getattr(pending, 'kind', '') != 'launch':
        return {}
    try:
        table = table_of(pending)
    except Exception as exc:  # lowering again failed: say so, never fail the dump
        table = CollectiveTable(
            program=str(pending.name),
            notes=(f'the program could not be lowered again: {type(exc).__name__}: {exc}'[:300],),
        )
    if table is None:
        return {}
    return {pending.label: json.loads(table.to_json())}
