"""The two functions the notebook ships to engines: import an installed function, call it.

ipyparallel sends a function's code and imports its module on the engine,
so this module imports nothing beyond the standard library at its top.
`call_ns` passes the engine's user namespace (where ``%%mh`` cells define
variables) as the first argument.
"""

from __future__ import annotations

from typing import Any


def call(qualname: str, *args: Any, **kwargs: Any) -> Any:
    """Runs ``qualname(*args, **kwargs)`` (a dotted name importable on the engine)."""
    import importlib

    module, _, attr = qualname.rpartition('.')
    return getattr(importlib.import_module(module), attr)(*args, **kwargs)


def call_ns(qualname: str, *args: Any, **kwargs: Any) -> Any:
    """Runs ``qualname(namespace, *args, **kwargs)`` with the engine's user namespace."""
    import importlib

    from IPython import get_ipython

    module, _, attr = qualname.rpartition('.')
    namespace = get_ipython().user_ns  # the engine's user namespace
    return getattr(importlib.import_module(module), attr)(namespace, *args, **kwargs)
