"""One ``%%mh`` cell jitted on N engines is one program: `multihost.engine.same_cell_names`.

ipykernel names a cell's code ``/tmp/ipykernel_<pid>/<hash>.py``; JAX writes that path into
the program's op metadata. jax 0.12.1 on CPU hangs in a collective of programs that differ so
(tests/engine/test_watch_multiprocess.py runs one on real processes); here, in one process, the
programs' text is compared: with the engine's setting, the two cells' programs are equal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multihost.engine import same_cell_names
from multihost.engine.start import CELL_DIRECTORY

KEY = 'jax_hlo_source_file_canonicalization_regex'
SRC = 'def cell_step(a):\n    return jnp.sum(a) * a\n'


@pytest.fixture
def regex():
    """The setting as the test found it, restored after."""
    before = getattr(jax.config, KEY)
    yield before
    jax.config.update(KEY, before)


def _program(engine_pid: int) -> str:
    """The cell's program, with its locations, as if run on the engine with that pid."""
    scope: dict = {'jnp': jnp}
    exec(compile(SRC, f'/tmp/ipykernel_{engine_pid}/2911412474.py', 'exec'), scope)
    lowered = jax.jit(scope['cell_step']).lower(np.ones(4, np.float32))
    return lowered.as_text(debug_info=True)


def test_without_it_two_engines_compile_two_programs(regex):
    jax.config.update(KEY, None)
    a, b = [_program(pid) for pid in (4101, 4102)]  # one call site: only the cell differs
    assert 'ipykernel_4101' in a and a != b


def test_with_it_two_engines_compile_one_program(regex):
    jax.config.update(KEY, None)
    same_cell_names()
    a, b = [_program(pid) for pid in (4101, 4102)]  # one call site: only the cell differs
    assert a == b
    assert 'ipykernel_' not in a and '2911412474.py' in a  # the cell still names its lines


def test_a_pattern_already_set_is_kept(regex):
    jax.config.update(KEY, r'.*/site-packages/')
    same_cell_names()
    same_cell_names()  # twice: added once
    assert getattr(jax.config, KEY) == rf'(?:.*/site-packages/)|{CELL_DIRECTORY}'
