"""The toolkit's hooks, connected in one place by `wire` (idempotent).

Importing a module of `multihost` registers nothing; `wire` connects, once per process:

* the collective sequence's hooks: every collective passes the step gate first
  (`_debug._stepgate`), and collectives called off the main thread go through
  `_exchange._threads`;
* the debug thread's commands (`_exchange._bus`): ``stacks`` (`_debug._stacks`), ``front``
  and ``records`` (`_debug._wavefront`), ``stepping`` (`_debug._stepgate`), ``dump``
  (`_job._dump`), ``fate`` (`_job._fate`), and the sampler started with the thread
  (`_debug._pulse`);
* the control endpoint's ``audit`` method (`_job._audit`);
* where the wavefront gets a pending launch's collective table (`_job._launchtable`).

It is called where the toolkit starts: the first public name (`multihost._load`; the control
endpoint and the debug thread are started through public names), `install` and `multihost
run` (`_install.apply`), a notebook engine's start (`multihost.engine.start`) and a test
cluster's worker (`multihost.testing`). Code that imports an inner module directly and needs
the hooks calls it first.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_wired = False


def wire() -> None:
    """Connects every hook above (a no-op after the first call)."""
    global _wired
    if _wired:
        return
    with _lock:
        if _wired:
            return
        from multihost._debug import _pulse, _stacks, _stepgate, _wavefront
        from multihost._exchange import _threads
        from multihost._job import _audit, _dump, _fate, _launchtable

        for module in (_threads, _stepgate, _stacks, _wavefront, _pulse, _dump, _fate, _audit):
            module.wire()
        _wavefront.set_table_source(_launchtable.table_of)
        _wired = True


def wired() -> bool:
    """Whether `wire` has run in this process."""
    return _wired
