"""IPython magics: ``%load_ext mhnotebook``.

Each magic only parses its arguments and delegates to a `Session` method
(or, for the views, to `_views`, which asks the session for models and
returns a widget); user mistakes raise `UsageError` with a message that says
what to do; a failure on the hosts is shown as its ``ename: evalue``.
Nothing typed by the user is evaluated, except the code of a ``%%mh`` cell
(which runs on the engines).

The room: `_multihost_magics` (the magics: arguments, docstrings),
`_entry` (the session, delegating to it, the entry points that show an
interrupt), `_options` (shared options, checks of what was typed),
`_cluster_actions` (``%mh_cluster``), `_run` (``%%mh``, ``%mh_wait``),
`_results` (what the magics print), `_help` (``%mh_help``, this docstring).

{MAGIC_DOCS}
"""

from typing import Any

from mhnotebook._magics._entry import current_session
from mhnotebook._magics._help import magic_docs
from mhnotebook._magics._multihost_magics import MultihostMagics

__all__ = ['MultihostMagics', 'current_session', 'load_ipython_extension']

__doc__ = __doc__.replace('{MAGIC_DOCS}', magic_docs(MultihostMagics))


def load_ipython_extension(ipython: Any) -> None:
    """IPython's hook for ``%load_ext``: registers the ``%mh_*`` magics."""
    ipython.register_magics(MultihostMagics)
