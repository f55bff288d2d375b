"""mhnotebook: debug multi-host JAX programs from a notebook.

Sessions (`start_local`, `connect`) drive one JAX process per ipyparallel
engine; an attached job (`attach`) and a post-mortem (`postmortem`) answer the
same questions of a job (`JobView`); ``%load_ext mhnotebook`` adds the
``%mh_*`` magics.
"""

from typing import TYPE_CHECKING, Any

from mhnotebook._attach import AttachedJob, AttachError, attach
from mhnotebook._cluster.connect import connect
from mhnotebook._cluster.local import start_local
from mhnotebook._errors import (
    HostDiedError,
    HostGoneError,
    HostsError,
    InterruptReport,
    RemoteFailure,
    SessionError,
    SessionInterruptedError,
    SessionTimeoutError,
)
from mhnotebook._jobview import JobView, UnsupportedError
from mhnotebook._postmortem import PostMortem, PostMortemError, postmortem
from mhnotebook._session import HostInfo, Session

__all__ = [
    'AttachError',
    'AttachedJob',
    'HostDiedError',
    'HostGoneError',
    'HostInfo',
    'HostsError',
    'InterruptReport',
    'JobView',
    'KeyData',
    'PostMortem',
    'PostMortemError',
    'RemoteFailure',
    'Session',
    'SessionError',
    'SessionInterruptedError',
    'SessionTimeoutError',
    'UnsupportedError',
    'attach',
    'connect',
    'current_session',
    'postmortem',
    'start_local',
]

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


def __getattr__(name: str) -> Any:
    # The version is written once, in multihost (the engine side this package
    # always ships with); read lazily, so `import mhnotebook` stays free of jax.
    if name == '__version__':
        from multihost import __version__

        return __version__
    if name == 'KeyData':  # what a gathered PRNG key leaf is where it cannot be keys
        from mhnotebook._transfer._gather import KeyData

        return KeyData
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def current_session() -> Session:
    """The session the ``%mh_*`` magics use (started by ``%mh_cluster``)."""
    from mhnotebook._magics import current_session as current

    return current()


def load_ipython_extension(ipython: 'InteractiveShell') -> None:  # noqa: D103 - IPython's hook
    from mhnotebook._magics import load_ipython_extension as load

    load(ipython)
