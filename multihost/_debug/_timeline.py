"""The timeline: every host's flight records aligned step by step, and who arrives last.

The model lives in `multihost._models._timeline` (re-exported here), a pure one (standard
library only; no device, no communication): `Timeline.build` aligns checked entries by sequence
number, unchecked launches by (name, call number) and a library's own service barriers and key
waits by (kind, id, call number); `Timeline.stragglers`, `Timeline.format` and
`Timeline.to_chrome_trace` read it. `timeline` gathers the records first
(`_wavefront.flight_records`). See docs/ARCHITECTURE.md, "The timeline".
"""

from __future__ import annotations

from multihost._models._timeline import (  # noqa: F401  (the models live there; re-exported)
    FORMAT_ROWS,
    MAX_HOST_COLUMNS,
    MIN_STEPS,
    NOTEBOOK_SITE,
    USER_STEP_SITES,
    StepKey,
    Stragglers,
    Timeline,
    TimelineStep,
)


def timeline(last: int = 200, timeout: float = 10.0) -> Timeline:
    """Every host's last ``last`` flight records, gathered and aligned into a `Timeline`.

    Callable from any host, also while the others are blocked: each host's
    debug thread answers (`multihost.flight_records`). Hosts that do not
    answer within ``timeout`` are left out (`Timeline.silent`).
    """
    from multihost._debug import _wavefront
    from multihost._exchange import _kv

    records = _wavefront.flight_records(last=last, timeout=timeout)
    return Timeline.build(records, _kv.process_count())
