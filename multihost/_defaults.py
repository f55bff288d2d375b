"""The defaults of a job's options, and the one reader of ``MULTIHOST_TIMEOUT``.

Stdlib only (floor 0): `multihost._job._options` builds ``multihost run``'s options from
these, so the command parses its line (a usage error, ``--help``) without importing JAX;
the rooms that act on them (`_exchange._sequence`, `_debug._hold`, `_job._audit`) take
their defaults from here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

#: Default timeout (seconds) of every barrier and collective check, unless
#: ``MULTIHOST_TIMEOUT`` says otherwise. Generous on purpose: a real job may
#: legitimately keep one host busy (say, writing a checkpoint) for minutes
#: while the others wait. Debugging sessions set it lower.
DEFAULT_TIMEOUT = 600.0

#: The longest hold unless told (seconds): 30 minutes (``--hold-for``'s default).
DEFAULT_HOLD_S = 1800.0

#: Launches of each jitted function the audit reads from its first call.
AUDIT_FIRST = 10
#: Then every N-th launch of it, unless told (``--audit=N``): see docs/benchmarks.md.
AUDIT_EVERY = 50


def timeout_from_env() -> float | None:
    """``MULTIHOST_TIMEOUT`` in seconds, None when unset: the one place that reads it (the
    explicit calls' default in `multihost._exchange._sequence`, ``install``'s timeout in
    `multihost._job._options`).

    Raises:
        ValueError: not a positive number (naming the variable and the fix).
    """
    raw = os.environ.get('MULTIHOST_TIMEOUT')
    if raw is None or raw == '':
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f'MULTIHOST_TIMEOUT must be a number of seconds, got {raw!r}. '
            'Unset it to use the default of '
            f'{DEFAULT_TIMEOUT:g} s.'
        ) from None
    if value <= 0:
        raise ValueError(f'MULTIHOST_TIMEOUT must be positive, got {raw!r}.')
    return value


@dataclasses.dataclass(frozen=True)
class HoldConfig:
    """What `multihost._debug._hold.configure` is told
    (`multihost._job._options.InstallOptions.hold`).

    Attributes:
        enabled: an uncaught exception holds every host (``--hold-on-error``).
        hold_for: the longest hold, in seconds (``--hold-for``).
        control_file: where a notebook attaches (named in the hold's line).
    """

    enabled: bool = False
    hold_for: float = DEFAULT_HOLD_S
    control_file: str | None = None


def audit_every(value: Any) -> int:
    """N from ``install(audit=...)`` / ``MULTIHOST_AUDIT``: 0 (off), True / 'on' (the default
    N), or a whole number N >= 0 as given (1: every launch).

    Raises:
        ValueError: anything else (naming it and what is accepted).
    """
    if value is None or value is False:
        return 0
    if value is True:
        return AUDIT_EVERY
    text = str(value).strip().lower()
    if text in ('on', 'yes', 'true'):
        return AUDIT_EVERY
    if text in ('off', 'no', 'false'):
        return 0
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(
            f'audit={value!r}: give N, a whole number (after the first {AUDIT_FIRST} launches '
            f'of each function, every N-th is audited; on = {AUDIT_EVERY}; 0 = off)'
        )
    return n
