"""Binder, proven from its own files: build the environment as repo2docker would, run the tutorials.

repo2docker (what mybinder.org runs) reads ``binder/`` and ignores the rest of
the repository's packaging. This check does what it does, without Docker:

1. copies the repository as Binder sees it (tracked and untracked files, not
   ignored ones) to ``build/binder/repo``;
2. makes a fresh venv with the Python of ``binder/runtime.txt``;
3. installs repo2docker's base notebook environment (``.ci/repo2docker-base.txt``);
4. runs ``pip install -r binder/requirements.txt`` from the repository's root,
   as repo2docker does (so ``.`` is the repository), then ``binder/postBuild``;
5. starts JupyterLab from that environment (it must serve the tutorials) and
   executes every tutorial with nbclient in the environment's kernel, from the
   tutorial's folder, with a fresh home (tutorials matching ``EXEMPT`` would
   be skipped; none is);
6. samples the memory of every process it started (the server, the kernel,
   the simulated hosts and the cluster's helpers: the whole container on
   Binder) every 0.2 s, and fails when the peak passes ``LIMIT``.

Memory is the sum of PSS (shared pages split between the processes that map
them, as a container's memory counts them once); the sum of RSS (shared pages
counted in every process) is reported beside it.

Usage: ``python3 .ci/binder_check.py`` (any Python 3.11+; no packages needed).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / 'build' / 'binder'
BASE_ENV = ROOT / '.ci' / 'repo2docker-base.txt'
# Tutorials that cannot run on Binder (glob patterns). None: 05_real_cluster runs its
# stand-in cluster there (local engines), as it does without MH_CLUSTER_URL_FILE anywhere.
EXEMPT: tuple[str, ...] = ()
LIMIT = 2 * 10**9  # mybinder.org's memory limit (2G)
MARKER = 'MH_BINDER_CHECK'  # in the environment of every process this check starts


def log(msg: str) -> None:
    print(f'binder-check: {msg}', flush=True)


def run(cmd: list[str], **kw: object) -> None:
    start = time.monotonic()
    log('$ ' + ' '.join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    log(f'  ({time.monotonic() - start:.0f} s)')


# -- the environment, as repo2docker builds it ------------------------------------------------


def runtime_python(repo: Path) -> str:
    """The interpreter of ``binder/runtime.txt`` (``python-3.12`` -> a python3.12 here)."""
    text = (repo / 'binder' / 'runtime.txt').read_text().strip()
    m = re.fullmatch(r'python-(\d+\.\d+)', text)
    if m is None:
        raise SystemExit(f'binder/runtime.txt says {text!r}; expected python-X.Y')
    version = m.group(1)
    # pyenv's interpreters themselves first (its python3.12 shim needs PYENV_VERSION).
    found = sorted(Path('/root/.pyenv/versions').glob(f'{version}*/bin/python{version}'))
    for cand in [*map(str, found), shutil.which(f'python{version}')]:
        if cand is None:
            continue
        probe = subprocess.run(
            [cand, '-c', 'import sys; print("%d.%d" % sys.version_info[:2])'],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return cand
    raise SystemExit(f'binder/runtime.txt asks for Python {version}, not found on this machine')


def copy_repo() -> Path:
    """The repository as Binder gets it: what git tracks plus untracked, not ignored, files."""
    repo = WORK / 'repo'
    shutil.rmtree(repo, ignore_errors=True)
    files = subprocess.run(
        ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b'\0')
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():  # a deleted, not yet committed file is still listed
            dst = repo / os.fsdecode(name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return repo


def build_env(python: str, repo: Path) -> Path:
    env_dir = WORK / 'env'
    shutil.rmtree(env_dir, ignore_errors=True)
    run([python, '-m', 'venv', str(env_dir)])
    pip = [str(env_dir / 'bin' / 'python'), '-m', 'pip', 'install', '-q']
    run([*pip, '-r', str(BASE_ENV)])
    # repo2docker: `${KERNEL_PYTHON_PREFIX}/bin/pip install --no-cache-dir -r
    # "binder/requirements.txt"`, in the repository's root.
    run([*pip, '-r', 'binder/requirements.txt'], cwd=repo)
    post_build = repo / 'binder' / 'postBuild'
    if post_build.exists():
        post_build.chmod(0o755)
        path = f'{env_dir / "bin"}{os.pathsep}{os.environ["PATH"]}'
        run([str(post_build)], cwd=repo, env={**os.environ, 'PATH': path})
    return env_dir


# -- memory --------------------------------------------------------------------------------------


def _field(path: str, key: str) -> int:
    """A ``Key:   123 kB`` line of a /proc file, in bytes (0 if the process is gone)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def ours(token: str) -> list[int]:
    """Every process whose environment carries this check's marker."""
    needle = f'{MARKER}={token}'.encode()
    pids = []
    for entry in os.scandir('/proc'):
        if entry.name.isdigit():
            try:
                with open(f'/proc/{entry.name}/environ', 'rb') as f:
                    if needle in f.read().split(b'\0'):
                        pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Sampler(threading.Thread):
    """Samples the summed PSS and RSS of the marked processes; keeps the peaks."""

    def __init__(self, token: str, interval: float = 0.2):
        super().__init__(daemon=True)
        self.token, self.interval = token, interval
        self.peak_pss = self.peak_rss = self.peak_procs = 0
        self.samples = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            pids = ours(self.token)
            pss = sum(_field(f'/proc/{p}/smaps_rollup', 'Pss:') for p in pids)
            rss = sum(_field(f'/proc/{p}/status', 'VmRSS:') for p in pids)
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.samples += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


# -- JupyterLab and the tutorials ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_lab(env_dir: Path, repo: Path, run_env: dict[str, str]) -> subprocess.Popen[bytes]:
    """JupyterLab from the environment, as on Binder; returns once it serves the tutorials."""
    port, token = free_port(), uuid.uuid4().hex
    cmd = [str(env_dir / 'bin' / 'jupyter'), 'lab', '--no-browser', '--ip=127.0.0.1']
    cmd += [f'--port={port}', f'--IdentityProvider.token={token}', '--allow-root']
    log(f'$ {" ".join(cmd[:4])} ... (port {port})')
    lab = subprocess.Popen(
        cmd,
        cwd=repo,
        env=run_env,
        stdout=open(WORK / 'lab.log', 'wb'),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
    )
    names = sorted(p.name for p in (repo / 'notebooks').glob('*.ipynb'))
    deadline = time.monotonic() + 120
    while True:
        try:
            for path in ['lab', *(f'api/contents/notebooks/{n}' for n in names)]:
                url = f'http://127.0.0.1:{port}/{path}?token={token}'
                with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
                    assert r.status == 200, (url, r.status)
            log(f'JupyterLab serves /lab and the {len(names)} tutorials')
            return lab
        except OSError:
            if lab.poll() is not None or time.monotonic() > deadline:
                lab.kill()
                raise SystemExit(f'JupyterLab did not start; see {WORK / "lab.log"}') from None
            time.sleep(0.5)


def execute(paths: list[str]) -> None:
    """Runs inside the environment: each notebook top to bottom in its own folder."""
    import nbformat
    from nbclient import NotebookClient

    probe = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell('import sys; print(sys.prefix)')]
    )
    NotebookClient(probe, kernel_name='python3', timeout=120).execute()
    prefix = probe.cells[0].outputs[0]['text'].strip()
    if Path(prefix).resolve() != Path(sys.prefix).resolve():
        raise SystemExit(f'the kernel runs in {prefix}, not in the environment ({sys.prefix})')
    for path in map(Path, paths):
        nb = nbformat.read(path, as_version=4)
        start = time.monotonic()
        client = NotebookClient(
            nb,
            kernel_name='python3',
            timeout=300,
            resources={'metadata': {'path': str(path.parent)}},
        )
        client.execute()
        nbformat.write(nb, WORK / path.name)
        log(f'{path.name}: ran top to bottom in {time.monotonic() - start:.0f} s')


def check(args: argparse.Namespace) -> None:
    # `timeout` in CI sends SIGTERM: clean up (the finally below) as on any failure.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start = time.monotonic()
    WORK.mkdir(parents=True, exist_ok=True)
    repo = copy_repo()
    env_dir = build_env(runtime_python(repo), repo)
    built = time.monotonic() - start

    notebooks = [
        p
        for p in sorted((repo / 'notebooks').glob('*.ipynb'))
        if not any(fnmatch.fnmatch(p.name, pat) for pat in EXEMPT)
    ]
    exempt = sorted(
        {p.name for p in (repo / 'notebooks').glob('*.ipynb')} - {p.name for p in notebooks}
    )
    token = uuid.uuid4().hex
    home = WORK / 'home'  # a fresh home, as in a new container
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    run_env = {
        **os.environ,
        MARKER: token,
        'HOME': str(home),
        'PATH': f'{env_dir / "bin"}{os.pathsep}{os.environ["PATH"]}',
        'VIRTUAL_ENV': str(env_dir),
    }
    for var in (
        'PYTHONPATH',
        'JUPYTER_PATH',
        'JUPYTER_CONFIG_DIR',
        'JUPYTER_DATA_DIR',
        'IPYTHONDIR',
    ):
        run_env.pop(var, None)
    sampler = Sampler(token)
    sampler.start()
    lab = start_lab(env_dir, repo, run_env)
    try:
        run_start = time.monotonic()
        log(f'executing {", ".join(p.name for p in notebooks)} (exempt: {exempt or "none"})')
        subprocess.run(
            [str(env_dir / 'bin' / 'python'), __file__, '--execute', *map(str, notebooks)],
            cwd=repo,
            env=run_env,
            check=True,
            timeout=args.timeout,
        )
        ran = time.monotonic() - run_start
    finally:
        lab.send_signal(signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.kill()
        sampler.stop()
        for pid in ours(token):  # anything of ours left behind (none, normally)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    log(
        f'environment built in {built:.0f} s; tutorials ran in {ran:.0f} s; '
        f'total {time.monotonic() - start:.0f} s'
    )
    log(
        f'peak memory of the server, the kernel and the simulated hosts '
        f'({sampler.peak_procs} processes, {sampler.samples} samples): '
        f'{sampler.peak_pss / 1e9:.2f} GB PSS ({sampler.peak_rss / 1e9:.2f} GB summed RSS); '
        f'limit {LIMIT / 1e9:.1f} GB'
    )
    if sampler.samples == 0 or sampler.peak_pss == 0:
        raise SystemExit('binder-check: no memory samples were taken')
    if sampler.peak_pss > LIMIT:
        raise SystemExit(f'binder-check: FAILED: peak memory is above {LIMIT / 1e9:.1f} GB')
    log('OK')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--execute', nargs='+', help=argparse.SUPPRESS)  # inside the env
    parser.add_argument('--timeout', type=float, default=900, help='seconds for the tutorials')
    args = parser.parse_args()
    if args.execute:
        execute(args.execute)
    else:
        check(args)


if __name__ == '__main__':
    main()
