"""What the notebook ships to engines: import an installed function (or engine tool), call it.

ipyparallel sends a function's code and imports its module on the engine,
so this module imports nothing beyond the standard library at its top.
`call_ns` passes the engine's user namespace (where ``%%mh`` cells define
variables) as the first argument; `tool` runs an engine tool by its name in the one
registry (`multihost.engine.tools`), the namespace first when the tool takes it.
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


def tool(name: str, *args: Any, **kwargs: Any) -> Any:
    """Runs engine tool ``name`` of the one registry (`multihost.engine.tools.TOOLS`), with
    the engine's user namespace first when the tool reads names there."""
    from multihost.engine.tools import tool as lookup

    found = lookup(name)
    if found.namespace:
        from IPython import get_ipython

        return found.function(get_ipython().user_ns, *args, **kwargs)
    return found.function(*args, **kwargs)
