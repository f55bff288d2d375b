"""JAX's own multi-process tests: the same verdicts with `multihost.install()` active (issue 19, 5).

The files are JAX's and never committed: the slow test runs
tests/jax_upstream/run_jax_multiprocess_tests.py on `multihost_utils_test`
when they are there (`MH_JAX_TESTS=DIR`, or the script's default location),
else it skips with the reason (CI has no network). The fast tests check the
script's log parsing, its comparison and its "skipped" path without them.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import types

import pytest

SCRIPT = pathlib.Path(__file__).parent.parent / 'jax_upstream' / 'run_jax_multiprocess_tests.py'


def _script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location('run_jax_multiprocess_tests', SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """\
Running tests under Python 3.11.7: /proc/self/exe
[ RUN      ] MultiHostUtilsTest.test_a
[       OK ] MultiHostUtilsTest.test_a
[ RUN      ] MultiHostUtilsTest.test_b
[  FAILED  ] MultiHostUtilsTest.test_b
[ RUN      ] MultiHostUtilsTest.test_c
[  SKIPPED ] MultiHostUtilsTest.test_c
[ RUN      ] MultiHostUtilsTest.test_d
"""


def test_worker_log_parsing_and_the_verdict_of_several_workers() -> None:
    s = _script()
    one = s.parse_worker_log(
        LOG + '[  FAILED  ] MultiHostUtilsTest.test_b\n'
    )  # absltest's summary repeats it
    assert one == {
        'MultiHostUtilsTest.test_a': 'OK',
        'MultiHostUtilsTest.test_b': 'FAILED',
        'MultiHostUtilsTest.test_c': 'SKIPPED',
        'MultiHostUtilsTest.test_d': 'CRASHED',
    }
    other = dict(one, **{'MultiHostUtilsTest.test_a': 'FAILED'})
    combined = s.combine([one, one, other])
    assert combined['MultiHostUtilsTest.test_b'] == 'FAILED'
    assert combined['MultiHostUtilsTest.test_a'] == 'p0:OK p1:OK p2:FAILED'


def test_only_the_listed_differences_are_expected() -> None:
    s = _script()
    name = 'MultiHostUtilsTest.test_process_allgather_cache_hit'
    plain = {name: 'OK', 'MultiHostUtilsTest.test_x': 'OK'}
    rows, unexpected = s.compare('multihost_utils_test', plain, dict(plain, **{name: 'FAILED'}))
    assert unexpected == []
    assert any(name in r and 'expected: small gathers' in r for r in rows)
    # the same test the other way round, or another test, is unexpected
    _, unexpected = s.compare('multihost_utils_test', {name: 'FAILED'}, {name: 'OK'})
    assert unexpected == [f'multihost_utils_test: {name}: plain FAILED, installed OK']
    _, unexpected = s.compare(
        'multihost_utils_test', plain, dict(plain, **{'MultiHostUtilsTest.test_x': 'SKIPPED'})
    )
    assert unexpected == [
        'multihost_utils_test: MultiHostUtilsTest.test_x: plain OK, installed SKIPPED'
    ]


def test_without_the_files_it_says_how_to_fetch_them_and_skips(tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), '--jax-tests', str(tmp_path / 'absent')],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('skipped: ')
    assert 'git clone --depth 1 --branch jax-v' in out.stdout
    assert 'https://github.com/jax-ml/jax' in out.stdout


@pytest.mark.slow
def test_jax_multihost_utils_tests_same_verdicts_installed(tmp_path: pathlib.Path) -> None:
    s = _script()
    where = pathlib.Path(os.environ.get('MH_JAX_TESTS', s.DEFAULT_DIR))
    if not (where / 'multihost_utils_test.py').is_file():
        pytest.skip(
            f"JAX's multi-process tests are not at {where} (MH_JAX_TESTS); "
            + s.fetch_hint('<version>')
        )
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            '--jax-tests',
            str(where),
            '--files',
            'multihost_utils_test',
            '--timeout',
            '110',
            '--work',
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert 'no unexpected difference' in out.stdout
    for mode in ('plain', 'installed'):
        line = next(
            ln
            for ln in out.stdout.splitlines()
            if ln.startswith(f'multihost_utils_test [{mode}]: ')
        )
        assert ' OK' in line and 'INSTALL NOT ACTIVE' not in line, line
