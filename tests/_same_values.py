"""The same values in a session's engines and in a batch job's stopped frames (test_attach_models).

``VALUES`` runs as the setup of a `local_session` (4 hosts x 2 CPU devices) and at the
top level of `_held_job.py` (4 plain processes x 2 devices under ``multihost run
--hold-on-error``): the same global array, with a NaN in process 2's rows, and a tree
that differs on process 1.
"""

VALUES = """
import numpy as _np
import jax as _jax
from jax.sharding import Mesh as _Mesh, PartitionSpec as _P
from jax.experimental import multihost_utils as _mu

_me = _jax.process_index()
_mesh = _Mesh(_np.array(_jax.devices()).reshape(4, 2), ('host', 'dev'))
_rows = _np.arange(16, dtype=_np.float32).reshape(2, 8) + 100 * _me
if _me == 2:
    _rows[1, 3] = _np.nan
x = _mu.host_local_array_to_global_array(_rows, _mesh, _P('host', 'dev'))
tree = {'w': _np.full(4, float(_me == 1), _np.float32), 'b': _np.arange(3.0)}
"""
