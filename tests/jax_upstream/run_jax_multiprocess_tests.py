"""Runs JAX's own multi-process tests plain and with `multihost.install()` active, and compares.

Issue 19 item 5: install must change nothing but what it adds. JAX's
`tests/multiprocess/*.py` (jax-ml/jax at the tag of the installed jax) run
with their own harness (`jax._src.test_multiprocess`: the file starts its
workers itself), once plain and once with a `sitecustomize.py` first on
PYTHONPATH that calls `multihost.install()` in every process (the workers
inherit PYTHONPATH); each worker's `jax_<i>_stderr.log` is parsed for
absltest's `[ RUN ]` / `[ OK ]` / `[ FAILED ]` / `[ SKIPPED ]` lines and the
verdicts are compared per test. A difference not in `EXPECTED_DIFFERENCES`
(each with its reason, as docs/API.md lists it) makes the exit status 1.

The files are JAX's code and are never committed: point `--jax-tests` (or
`MH_JAX_TESTS`) at a checkout's `tests/multiprocess`. Without them the
script says how to fetch them and exits 0 ("skipped"), so a machine without
network skips it. Not a pytest test (it runs minutes; tests/project/test_jax_upstream.py
runs it on one file when the files are there).

    python tests/jax_upstream/run_jax_multiprocess_tests.py --jax-tests DIR [--files a,b]
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / 'build' / 'jax' / 'tests' / 'multiprocess'
FILES = (
    'multihost_utils_test',
    'array_test',
    'pjit_test',
    'host_callback_test',
    'all_reduce_test',
    'all_gather_test',
)
MODES = ('plain', 'installed')
MARKER = 'MH-JAX-UPSTREAM: multihost.install() active in pid'

# (file, test) -> (plain verdict, installed verdict, why). Each is a
# difference docs/API.md lists; any other difference fails the run.
EXPECTED_DIFFERENCES: dict[tuple[str, str], tuple[str, str, str]] = {
    ('multihost_utils_test', 'MultiHostUtilsTest.test_process_allgather_cache_hit'): (
        'OK',
        'FAILED',
        "small gathers travel in the sequence check's key-value exchange and compile "
        'nothing (docs/API.md section 3, "Cost"), so the test\'s "exactly one C++ '
        'jit-cache miss" counts none',
    ),
}

PORTPICKER = '''\
"""portpicker stand-in for JAX's multi-process test harness: a free port from the OS."""
import socket


def pick_unused_port(pid=None, portserver_address=None):
    del pid, portserver_address  # portpicker's arguments: the OS needs no port server
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]
'''

SITECUSTOMIZE = f'''\
"""Installs multihost in every process of the run; a failure ends the process (site only warns)."""
import os
import sys

try:
    import multihost

    multihost.install()
except BaseException as exc:
    sys.stderr.write(f'MH-JAX-UPSTREAM: multihost.install() failed: {{exc!r}}\\n')
    sys.stderr.flush()
    os._exit(97)
sys.stderr.write(f'{MARKER} {{os.getpid()}}\\n')
sys.stderr.flush()
'''

_LINE = re.compile(r'^\[\s*(RUN|OK|FAILED|SKIPPED)\s*\] (\S+)', re.MULTILINE)
_ERROR_LINE = re.compile(r'^(ERROR|FAIL): (\S+) \((\S+)\)', re.MULTILINE)


def fetch_hint(version: str) -> str:
    """How to get the test files for this jax (CI has no network: it skips)."""
    clone = f'git clone --depth 1 --branch jax-v{version} https://github.com/jax-ml/jax'
    return textwrap.dedent(f"""\
        JAX's multi-process tests are not in this repository (they are JAX's code).
        Fetch them for the installed jax {version}:
            {clone} {ROOT / 'build' / 'jax'}
        then run (the default location is {DEFAULT_DIR}):
            python {pathlib.Path(__file__).relative_to(ROOT)} --jax-tests {DEFAULT_DIR}
        or set MH_JAX_TESTS to a copy of jax's tests/multiprocess directory.""")


def parse_worker_log(text: str) -> dict[str, str]:
    """Test name -> verdict in one worker's stderr ('CRASHED': started, never finished)."""
    verdicts: dict[str, str] = {}
    for kind, name in _LINE.findall(text):
        if kind == 'RUN':
            verdicts.setdefault(name, 'CRASHED')
        elif verdicts.get(name) != 'FAILED':  # the summary repeats FAILED lines
            verdicts[name] = kind
    # unittest's "ERROR: test_x (module.Class.test_x)" for errors absltest lists as FAILED too
    for _kind, method, qualified in _ERROR_LINE.findall(text):
        name = '.'.join(qualified.split('.')[-2:]) if '.' in qualified else method
        if name in verdicts:
            verdicts[name] = 'FAILED'
    return verdicts


def combine(per_worker: list[dict[str, str]]) -> dict[str, str]:
    """Per test, one verdict: the workers' if they agree, else each worker's."""
    names = sorted({n for w in per_worker for n in w})
    out = {}
    for name in names:
        seen = [w.get(name, 'ABSENT') for w in per_worker]
        out[name] = (
            seen[0] if len(set(seen)) == 1 else ' '.join(f'p{i}:{v}' for i, v in enumerate(seen))
        )
    return out


def _support_dir(base: pathlib.Path, mode: str) -> pathlib.Path:
    d = base / f'site-{mode}'
    d.mkdir(parents=True, exist_ok=True)
    (d / 'portpicker.py').write_text(PORTPICKER)
    if mode == 'installed':
        (d / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    return d


def run_file(
    path: pathlib.Path, mode: str, work: pathlib.Path, args: argparse.Namespace
) -> tuple[dict[str, str], str]:
    """Runs one test file with its harness; (test -> verdict, a one-line note on the run)."""
    out = work / path.stem / mode
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    support = _support_dir(work, mode)
    env = dict(os.environ)
    env.pop('MULTIHOST_INSTALL', None)  # the .pth hook would install in the plain run too
    env.update(
        JAX_PLATFORMS='cpu',
        JAX_NUM_CPU_DEVICES=str(args.devices),
        TEST_UNDECLARED_OUTPUTS_DIR=str(out),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(support), str(ROOT), env.get('PYTHONPATH', '')) if p
        ),
    )
    cmd = [
        sys.executable,
        str(path),
        f'--num_processes={args.num_processes}',
        '--cpu_collectives_implementation=gloo',
    ]
    start = time.monotonic()
    with open(out / 'controller.log', 'wb') as log:
        proc = subprocess.Popen(
            cmd, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc: int | str = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the harness and every worker it started
            proc.wait()
            rc = f'timeout after {args.timeout:.0f} s'
    elapsed = time.monotonic() - start
    logs = [out / f'jax_{i}_stderr.log' for i in range(args.num_processes)]
    texts = [p.read_text(errors='replace') if p.exists() else '' for p in logs]
    note = f'rc={rc}, {elapsed:.0f} s, logs in {out}'
    if not any(texts):
        note += '; no worker started (see controller.log)'
    elif mode == 'installed':
        missing = [i for i, t in enumerate(texts) if MARKER not in t]
        if missing:
            note += f'; INSTALL NOT ACTIVE in workers {missing}'
    return combine([parse_worker_log(t) for t in texts]), note


def compare(
    file: str, plain: dict[str, str], installed: dict[str, str]
) -> tuple[list[str], list[str]]:
    """Table rows and the unexpected differences of one file."""
    rows, unexpected = [], []
    expected_here = {t: e for (f, t), e in EXPECTED_DIFFERENCES.items() if f == file}
    for name in sorted(set(plain) | set(installed)):
        a, b = plain.get(name, 'ABSENT'), installed.get(name, 'ABSENT')
        mark = ''
        if a != b:
            exp = expected_here.get(name)
            if exp and exp[:2] == (a, b):
                mark = f'expected: {exp[2]}'
            else:
                mark = 'UNEXPECTED'
                unexpected.append(f'{file}: {name}: plain {a}, installed {b}')
        rows.append(f'  {name:<78} {a:<8} {b:<8} {mark}')
    for name in expected_here:
        if plain.get(name, 'ABSENT') == installed.get(name, 'ABSENT'):
            rows.append(
                f'  (expected difference not seen: {name}: both {plain.get(name, "ABSENT")})'
            )
    return rows, unexpected


def counts(verdicts: dict[str, str]) -> str:
    """'27 OK, 2 SKIPPED' style summary."""
    c = collections.Counter(v if ' ' not in v else 'MIXED' for v in verdicts.values())
    return ', '.join(f'{n} {k}' for k, n in sorted(c.items())) or 'no tests ran'


def main(argv: list[str] | None = None) -> int:
    """Runs the files plain and installed; 1 on an unexpected difference."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        '--jax-tests',
        type=pathlib.Path,
        default=pathlib.Path(os.environ.get('MH_JAX_TESTS', DEFAULT_DIR)),
    )
    p.add_argument(
        '--files', default=','.join(FILES), help='comma-separated file stems (default: all six)'
    )
    p.add_argument('--timeout', type=float, default=900.0, help='seconds per file and mode')
    p.add_argument('--num-processes', type=int, default=4)
    p.add_argument('--devices', type=int, default=2, help='CPU devices per process')
    p.add_argument(
        '--work', type=pathlib.Path, default=None, help='where the logs go (default: a temp dir)'
    )
    args = p.parse_args(argv)
    version = importlib.metadata.version('jax')
    files = [f.strip().removesuffix('.py') for f in args.files.split(',') if f.strip()]
    present = [f for f in files if (args.jax_tests / f'{f}.py').is_file()]
    if not present:
        print(f'skipped: no {", ".join(files)} in {args.jax_tests}\n{fetch_hint(version)}')
        return 0
    for f in sorted(set(files) - set(present)):
        print(f'skipped: {f}.py is not in {args.jax_tests}')
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix='mh-jax-upstream-'))
    print(
        f'jax {version}, python {sys.version.split()[0]}, '
        f'tests from {args.jax_tests}, logs in {work}'
    )
    unexpected: list[str] = []
    summary = []
    for f in present:
        results = {}
        for mode in MODES:
            results[mode], note = run_file(args.jax_tests / f'{f}.py', mode, work, args)
            print(f'{f} [{mode}]: {counts(results[mode])} ({note})', flush=True)
            if 'INSTALL NOT ACTIVE' in note:
                unexpected.append(f'{f}: install was not active in every worker')
        rows, bad = compare(f, results['plain'], results['installed'])
        print(f'  {"test":<78} {"plain":<8} {"installed":<8}')
        print('\n'.join(rows))
        if not results['plain'] and not results['installed']:
            bad.append(f'{f}: no test ran in either mode (see the logs)')
        unexpected += bad
        summary.append(
            f'  {f:<22} plain: {counts(results["plain"]):<28} '
            f'installed: {counts(results["installed"])}'
        )
    print('summary:\n' + '\n'.join(summary))
    if unexpected:
        print('UNEXPECTED differences:\n  ' + '\n  '.join(unexpected))
        return 1
    print('no unexpected difference')
    return 0


if __name__ == '__main__':
    sys.exit(main())
