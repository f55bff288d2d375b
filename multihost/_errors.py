"""Exceptions raised by `multihost`.

The hierarchy::

    Exception
    ├── MultihostError                      base of everything `multihost` adds
    │   ├── CollectiveMismatchError         processes called different collectives
    │   │   │   (also an AssertionError)    at the same point in their sequence
    │   │   └── BarrierMismatchError        processes passed different barrier names
    │   ├── HostMismatchError               `assert_equal`: values differ
    │   │       (also an AssertionError)
    │   ├── BarrierTimeoutError             a host did not arrive in time
    │   │       (also a TimeoutError)
    │   ├── StepTimeoutError                stepping: a step was not released
    │   │       (also a TimeoutError)       in time
    │   ├── HostFailedError                 some hosts could not take part in a
    │   │                                   collective (missing name, bad value)
    │   ├── CollectiveInterruptedError      a host was interrupted (SIGINT) in
    │   │                                   the collective; the others stop too
    │   └── CoordinatorUnreachableError     the coordination service (process 0)
    │           (also a ConnectionError)    is gone
    └── jax...multihost_utils.ProcessFailureError
        └── ProcessFailureError             `live_devices`: a process died or
                                            restarted (JAX's handlers catch it)

`CollectiveMismatchError` and `HostMismatchError` subclass `AssertionError`
so code written against `jax.experimental.multihost_utils` (which raises
`AssertionError` for both situations) keeps working unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jax.experimental import multihost_utils as _jax_multihost_utils


class MultihostError(Exception):
    """Base class of the errors `multihost` adds beyond JAX's."""


class CollectiveMismatchError(MultihostError, AssertionError):
    """Hosts reached the same point of their collective sequence with different calls.

    Raised on every host, before anyone enters a device collective that would
    otherwise hang or crash inside XLA.

    Attributes:
        seq: the position in the collective sequence where the hosts differ.
        calls: process index -> the `CollectiveRecord` that host made there.
    """

    def __init__(self, message: str, *, seq: int, calls: Mapping[int, Any]):
        super().__init__(message)
        self.seq = seq
        self.calls = dict(calls)


class BarrierMismatchError(CollectiveMismatchError):
    """Hosts passed different names to the same barrier.

    Attributes:
        names: process index -> the barrier name that host passed.
    """

    def __init__(
        self, message: str, *, seq: int, calls: Mapping[int, Any], names: Mapping[int, str]
    ):
        super().__init__(message, seq=seq, calls=calls)
        self.names = dict(names)


class HostMismatchError(MultihostError, AssertionError):
    """`assert_equal` found hosts holding different values.

    Attributes:
        diff: the `TreeDiff` describing every differing leaf.
    """

    def __init__(self, message: str, *, diff: Any):
        super().__init__(message)
        self.diff = diff


class BarrierTimeoutError(MultihostError, TimeoutError):
    """Some hosts did not reach a barrier or collective within the timeout.

    Attributes:
        name: the barrier (or collective) name this host waited at.
        timeout: the timeout in seconds.
        missing: sorted process indices that did not arrive.
        positions: process index -> the last `CollectiveRecord` that host
            reached (its kind, name, sequence number and call site), for every
            host that published one.
        label: what this host waited in, in words (``barrier('ckpt') #2``; empty
            when not known).
    """

    def __init__(
        self,
        message: str,
        *,
        name: str,
        timeout: float,
        missing: Sequence[int],
        positions: Mapping[int, Any],
        label: str = '',
    ):
        super().__init__(message)
        self.label = label
        self.name = name
        self.timeout = timeout
        self.missing = sorted(missing)
        self.positions = dict(positions)


class StepTimeoutError(MultihostError, TimeoutError):
    """Stepping is on and a step was not released within ``MULTIHOST_STEP_TIMEOUT``.

    Attributes:
        seq: the step (position in the collective sequence) the host waited at.
        timeout: the timeout in seconds.
    """

    def __init__(self, message: str, *, seq: int, timeout: float):
        super().__init__(message)
        self.seq = seq
        self.timeout = timeout


class HostFailedError(MultihostError, RuntimeError):
    """Some hosts could not take part in a collective and said why.

    A host that cannot take part (a name it does not define, a value it
    cannot convert) still takes its turn in the exchange with its reason, so
    every host raises this same error at once and the collective sequence
    stays aligned.

    Attributes:
        seq: the collective's position in the sequence.
        reasons: process index -> why that host could not take part.
    """

    def __init__(self, message: str, *, seq: int, reasons: Mapping[int, str]):
        super().__init__(message)
        self.seq = seq
        self.reasons = dict(reasons)


class CollectiveInterruptedError(MultihostError, RuntimeError):
    """Another host was interrupted while waiting in this collective.

    Attributes:
        seq: the collective's position in the sequence.
        by: the process that was interrupted.
    """

    def __init__(self, message: str, *, seq: int, by: int):
        super().__init__(message)
        self.seq = seq
        self.by = by


class AuditError(MultihostError, RuntimeError):
    """The audit found a divergence, and the job runs with ``--audit-raise``.

    Raised on every host at the audited launch the finding was made at (that launch waits
    for the hosts' verdict on it), so its inputs are still in the caller's frame; the
    finding's line in full (``multihost audit: ...``) was printed first, the message is its
    headline.

    Attributes:
        finding: the `AuditFinding`.
    """

    def __init__(self, message: str, *, finding: Any):
        super().__init__(message)
        self.finding = finding


class CoordinatorUnreachableError(MultihostError, ConnectionError):
    """The coordination service (run by process 0) cannot be reached.

    Attributes:
        during: what this host was doing (``'waiting for mh/e/0/3/v'``...).
        positions: process index -> the last `CollectiveRecord` this host
            knew for that process (often only its own).
    """

    def __init__(self, message: str, *, during: str, positions: Mapping[int, Any] | None = None):
        super().__init__(message)
        self.during = during
        self.positions = dict(positions or {})


class ProcessFailureError(_jax_multihost_utils.ProcessFailureError):
    """Raised by `live_devices` when one or more processes have failed.

    A subclass of JAX's own ``ProcessFailureError``, so handlers written for
    ``jax.experimental.multihost_utils`` catch it too.

    Attributes:
        failed_devices: the set of devices whose processes died or restarted.
    """

    def __init__(self, failed_devices: set[Any]):
        self.failed_devices = failed_devices
        Exception.__init__(self, f'Devices failed: {failed_devices}')
