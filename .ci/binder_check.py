"""Binder, proven from its own files: the environment repo2docker would build, the tutorials in it.

mybinder.org builds with repo2docker, which reads ``binder/`` and ignores the
rest of the repository's packaging. This check asks repo2docker itself
(installed in a tools venv, ``build/binder/tools``; no Docker) what it would do
with this repository, and does that:

1. the build context is the repository as Binder gets it: tracked and
   untracked files, not ignored ones;
2. repo2docker picks the buildpack, the Python (``binder/runtime.txt``) and its
   base notebook environment, a conda lock file it ships. A fresh venv with
   that Python gets the lock's Python packages at the lock's versions, with
   uv (``--no-deps``: conda installs a lock as it is; bytecode compiled, as
   conda's packages come; uv from the tools venv: 16 s of CPU where pip took 44);
3. into a fresh home (repo2docker's ``REPO_DIR``) go the files repo2docker
   copies before its pre-assemble scripts, then those scripts run verbatim
   (with our ``binder/requirements.txt``: none, since repo2docker sees its
   ``.`` line as a local requirement and installs it once the repository is
   there); then the whole repository, the assemble scripts and each post-build
   script (``chmod +x binder/postBuild && ./binder/postBuild``), verbatim;
4. JupyterLab from the environment must serve the tutorials; every tutorial
   then runs top to bottom with nbclient in the environment's kernel, from its
   own folder (tutorials matching ``EXEMPT`` would be skipped; none is);
5. the memory of every process started for 4 (server, kernel, simulated hosts,
   the cluster's helpers: the whole container on Binder) is sampled every
   0.2 s; the check fails when the peak passes ``LIMIT``. Tutorials run two at a
   time (``PARALLEL``), each with its own marker: a peak is the server's memory
   with one tutorial's, as on Binder where one runs at a time.

Memory is the sum of PSS (shared pages split between the processes that map
them: a container's memory counts them once); the sum of RSS (shared pages
counted in every process) is reported beside it. Deviations from a real
Binder build are listed in CONTRIBUTING.md.

Usage: ``python3 .ci/binder_check.py`` (Python 3.11+; it installs what it needs).
CI splits it in two (``--build-only`` while the tests run, ``--run-built`` after them)
and runs an eighth of the tutorials on each landing (``--share K/8``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / 'build' / 'binder'
# Tutorials that cannot run on Binder (glob patterns). None: 05_real_cluster runs its
# stand-in cluster there (local engines), as it does without MH_CLUSTER_URL_FILE anywhere.
EXEMPT: tuple[str, ...] = ()
LIMIT = 2 * 10**9  # mybinder.org's memory limit (2G)
MARKER = 'MH_BINDER_CHECK'  # in the environment of every process this check starts
PARALLEL = 2  # tutorials run at once (each in its own kernel; memory is counted per tutorial)
# Conda packages of the base environment whose pip name differs, or that are not pip's.
PIP_NAMES = {
    'brotli-python': 'brotli',
    'jupyterhub-base': 'jupyterhub',
    'nbconvert-core': 'nbconvert',
    'python-fastjsonschema': 'fastjsonschema',
    'cpython': None,  # the interpreter itself
}


def log(msg: str) -> None:
    print(f'binder-check: {msg}', flush=True)


def run(cmd: list[str], **kw: Any) -> None:
    start = time.monotonic()
    log('$ ' + ' '.join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, **kw)
    log(f'  ({time.monotonic() - start:.0f} s)')


# -- what repo2docker would do ----------------------------------------------------------------


def copy_context() -> Path:
    """The repository as Binder gets it: what git tracks plus untracked, not ignored, files."""
    context = WORK / 'context'
    shutil.rmtree(context, ignore_errors=True)
    files = subprocess.run(
        ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b'\0')
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():  # a deleted, not yet committed file is still listed
            dst = context / os.fsdecode(name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return context


def repo2docker_plan(context: Path) -> dict[str, Any]:
    """repo2docker's plan for the context, from repo2docker itself (in the tools venv)."""
    tools = WORK / 'tools'  # kept between local runs; CI starts from a fresh clone
    python = tools / 'bin' / 'python'
    if not (tools / 'bin' / 'uv').exists():
        run([sys.executable, '-m', 'venv', str(tools)])
        run([str(python), '-m', 'pip', 'install', '-q', 'jupyter-repo2docker', 'uv'])
    out = subprocess.run(
        [str(python), __file__, '--plan'], cwd=context, check=True, capture_output=True, text=True
    ).stdout
    plan: dict[str, Any] = json.loads(out)
    log(
        f'repo2docker {plan["version"]}: {plan["buildpack"]}, Python {plan["python"]}, '
        f'base environment {Path(plan["base_environment"]).name}'
    )
    return plan


def plan_here() -> None:
    """Runs in the tools venv, in the context: prints repo2docker's plan as JSON."""
    import repo2docker
    import repo2docker.buildpacks
    from repo2docker.app import Repo2Docker

    r2d = Repo2Docker()
    picked = next(
        (bp for bp in (BP(base_image=r2d.base_image) for BP in r2d.buildpacks) if bp.detect()),
        None,
    ) or r2d.default_buildpack(base_image=r2d.base_image)
    picked.platform = 'linux/amd64'
    env = dict(picked.get_build_env())
    if 'KERNEL_ENVIRONMENT_FILE' in env:
        raise SystemExit('a separate kernel environment (Python < 3.7) is not emulated here')
    here = Path(repo2docker.buildpacks.__file__).parent
    files = picked.get_build_script_files()
    lock = next(src for src, dst in files.items() if dst == env['NB_ENVIRONMENT_FILE'])
    plan = {
        'version': repo2docker.__version__,
        'buildpack': type(picked).__name__,
        'python': picked.python_version,
        'base_environment': str(here / lock),
        'preassemble_files': picked.get_preassemble_script_files(),
        'preassemble_scripts': picked.get_preassemble_scripts(),
        'assemble_scripts': picked.get_assemble_scripts(),
        'post_build_scripts': picked.get_post_build_scripts(),
        'start_script': picked.get_start_script(),
    }
    print(json.dumps(plan))


def find_python(version: str) -> str:
    """This machine's Python ``version`` (pyenv's own interpreters first: its shim needs
    PYENV_VERSION)."""
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
    raise SystemExit(f'repo2docker would use Python {version}; none on this machine')


def base_packages(lock: Path) -> list[str]:
    """The Python packages of a conda lock file, as pinned pip requirements."""
    pins = []
    for line in lock.read_text().splitlines():
        if not line.startswith('http'):
            continue
        stem = re.sub(r'\.(conda|tar\.bz2)$', '', line.split('#')[0].rsplit('/', 1)[1])
        name, version, build = stem.rsplit('-', 2)
        if build.startswith('py'):  # pyh...: noarch Python; py312...: compiled for Python
            pip_name = PIP_NAMES.get(name, name)
            if pip_name is not None:
                pins.append(f'{pip_name}=={version}')
    return pins


def build_env(plan: dict[str, Any], context: Path, home: Path) -> tuple[Path, dict[str, str]]:
    """The environment, built as repo2docker's plan says; returns it and the build's variables."""
    env_dir = WORK / 'env'
    shutil.rmtree(env_dir, ignore_errors=True)
    run([find_python(plan['python']), '-m', 'venv', str(env_dir)])
    pins = WORK / 'base-environment.txt'
    pins.write_text('\n'.join(base_packages(Path(plan['base_environment']))) + '\n')
    uv = WORK / 'tools' / 'bin' / 'uv'  # the lock as it is: no resolver, any installer will do
    run([str(uv), 'pip', 'install', '-q', '--python', str(env_dir / 'bin' / 'python'),
         '--no-deps', '--compile-bytecode', '-r', str(pins)])  # fmt: skip

    variables = {
        **os.environ,
        'NB_USER': getpass.getuser(),
        'NB_PYTHON_PREFIX': str(env_dir),
        'KERNEL_PYTHON_PREFIX': str(env_dir),
        'CONDA_DEFAULT_ENV': str(env_dir),
        'HOME': str(home),
        'REPO_DIR': str(home),
        'PATH': f'{env_dir / "bin"}{os.pathsep}{home / ".local" / "bin"}{os.pathsep}'
        + os.environ['PATH'],
    }

    def scripts(steps: list[tuple[str, str]]) -> None:
        for _user, script in steps:  # repo2docker runs them as NB_USER or root; here, as us
            run(['bash', '-c', textwrap.dedent(script.strip('\n'))], cwd=home, env=variables)

    for src, dst in plan['preassemble_files'].items():  # COPY src/<src> ${REPO_DIR}/<dst>
        (home / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(context / src, home / dst)
    scripts(plan['preassemble_scripts'])
    shutil.copytree(context, home, dirs_exist_ok=True)  # COPY src/ ${REPO_DIR}/
    scripts(plan['assemble_scripts'])
    scripts([('', f'chmod +x {s} && ./{s}') for s in plan['post_build_scripts']])
    return env_dir, variables


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


def marked(prefix: str) -> dict[str, list[int]]:
    """Marker value -> the processes whose environment carries it (values starting with
    ``prefix``: this run's)."""
    needle = f'{MARKER}={prefix}'.encode()
    out: dict[str, list[int]] = {}
    for entry in os.scandir('/proc'):
        if entry.name.isdigit():
            try:
                with open(f'/proc/{entry.name}/environ', 'rb') as f:
                    found = [v for v in f.read().split(b'\0') if v.startswith(needle)]
            except OSError:
                continue
            if found:
                value = found[0].decode().split('=', 1)[1]
                out.setdefault(value, []).append(int(entry.name))
    return out


def ours(token: str) -> list[int]:
    """Every process this run started (its marker value starts with ``token``)."""
    return [p for pids in marked(token).values() for p in pids]


class Sampler(threading.Thread):
    """Samples the summed PSS and RSS of the marked processes and keeps the peaks of what one
    Binder user runs at a time: the server (marker ``token``) with one tutorial (marker
    ``token-<name>``: its kernel, simulated hosts and helpers). Tutorials run two at a time
    here; each is measured with the server, as when it runs alone."""

    def __init__(self, token: str, interval: float = 0.2):
        super().__init__(daemon=True)
        self.token, self.interval = token, interval
        self.peak_pss = self.peak_rss = self.peak_procs = 0
        self.peak_of = ''  # the tutorial at the peak
        self.samples = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            groups = marked(self.token)
            server = groups.pop(self.token, [])
            for name, pids in (groups or {'': []}).items():
                every = server + pids
                pss = sum(_field(f'/proc/{p}/smaps_rollup', 'Pss:') for p in every)
                rss = sum(_field(f'/proc/{p}/status', 'VmRSS:') for p in every)
                if pss > self.peak_pss:
                    self.peak_pss, self.peak_of = pss, name[len(self.token) + 1 :]
                self.peak_rss = max(self.peak_rss, rss)
                self.peak_procs = max(self.peak_procs, len(every))
            self.samples += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


# -- JupyterLab and the tutorials ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_lab(
    env_dir: Path, repo: Path, run_env: dict[str, str], start_script: str | None
) -> subprocess.Popen[bytes]:
    """JupyterLab from the environment, as on Binder; returns once it serves the tutorials."""
    port, token = free_port(), uuid.uuid4().hex
    cmd = [str(repo / start_script)] if start_script else []  # binder/start wraps the server
    cmd += [str(env_dir / 'bin' / 'jupyter'), 'lab', '--no-browser', '--ip=127.0.0.1']
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


BUILT = WORK / 'built.json'  # what --build-only leaves for --run-built


def build(start: float) -> tuple[Path, Path, dict[str, str], dict[str, Any], float]:
    """Steps 1-3: the context, repo2docker's plan, the environment in a fresh home."""
    WORK.mkdir(parents=True, exist_ok=True)
    BUILT.unlink(missing_ok=True)
    context = copy_context()
    plan = repo2docker_plan(context)
    repo = WORK / 'home'  # repo2docker's REPO_DIR: the home of a new container
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir()
    env_dir, variables = build_env(plan, context, repo)
    return repo, env_dir, variables, plan, time.monotonic() - start


def check(args: argparse.Namespace) -> None:
    # `timeout` in CI sends SIGTERM: clean up (the finally below) as on any failure.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start = time.monotonic()
    if args.run_built:  # the environment a --build-only run left (CI builds it early)
        if not BUILT.exists():
            raise SystemExit(
                f'binder-check: no built environment at {BUILT}: run with --build-only first'
            )
        saved = json.loads(BUILT.read_text())
        repo, env_dir = Path(saved['repo']), Path(saved['env_dir'])
        variables, plan, built = saved['variables'], saved['plan'], saved['built_s']
    else:
        repo, env_dir, variables, plan, built = build(start)
    if args.build_only:
        BUILT.write_text(
            json.dumps(
                {
                    'repo': str(repo),
                    'env_dir': str(env_dir),
                    'variables': variables,
                    'plan': plan,
                    'built_s': built,
                }  # fmt: skip
            )
        )
        log(f'environment built in {built:.0f} s; --run-built runs the tutorials in it')
        return

    notebooks = [
        p
        for p in sorted((repo / 'notebooks').glob('*.ipynb'))
        if not any(fnmatch.fnmatch(p.name, pat) for pat in EXEMPT)
    ]
    exempt = sorted(
        {p.name for p in (repo / 'notebooks').glob('*.ipynb')} - {p.name for p in notebooks}
    )
    if args.share is not None:  # CI: a share of the tutorials on each landing (by name)
        k, n = args.share
        left_for_others = [p.name for i, p in enumerate(notebooks) if i % n != k]
        notebooks = notebooks[k::n]
        log(f'share {k}/{n}: the other shares run {", ".join(left_for_others) or "none"}')
    token = uuid.uuid4().hex
    run_env = {**variables, MARKER: token, 'VIRTUAL_ENV': str(env_dir)}
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
    lab = start_lab(env_dir, repo, run_env, plan['start_script'])
    try:
        run_start = time.monotonic()
        log(f'executing {", ".join(p.name for p in notebooks)} (exempt: {exempt or "none"}), '
            f'{PARALLEL} at a time')  # fmt: skip

        def execute_one(path: Path) -> None:
            env = {**run_env, MARKER: f'{token}-{path.stem}'}
            left = max(10.0, args.timeout - (time.monotonic() - run_start))
            subprocess.run(
                [str(env_dir / 'bin' / 'python'), __file__, '--execute', str(path)],
                cwd=repo,
                env=env,
                check=True,
                timeout=left,
            )

        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            for done in [pool.submit(execute_one, p) for p in notebooks]:
                done.result()  # the first failure fails the check (the rest still finish)
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
        f'this run took {time.monotonic() - start:.0f} s'
    )
    log(
        f'peak memory of the server with one tutorial ({sampler.peak_of}: its kernel and '
        f'simulated hosts; {sampler.peak_procs} processes, {sampler.samples} samples): '
        f'{sampler.peak_pss / 1e9:.2f} GB PSS ({sampler.peak_rss / 1e9:.2f} GB summed RSS); '
        f'limit {LIMIT / 1e9:.1f} GB'
    )
    if sampler.samples == 0 or sampler.peak_pss == 0:
        raise SystemExit('binder-check: no memory samples were taken')
    if sampler.peak_pss > LIMIT:
        raise SystemExit(f'binder-check: FAILED: peak memory is above {LIMIT / 1e9:.1f} GB')
    log('OK')


def share_arg(value: str) -> tuple[int, int]:
    """``--share``'s K/N (0 <= K < N), or a usage error saying what it takes."""
    k, _, n = value.partition('/')
    if k.isdigit() and n.isdigit() and 0 <= int(k) < int(n):
        return int(k), int(n)
    raise argparse.ArgumentTypeError(f'{value!r}: give K/N with 0 <= K < N, e.g. 1/4')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--execute', nargs='+', help=argparse.SUPPRESS)  # inside the env
    parser.add_argument('--plan', action='store_true', help=argparse.SUPPRESS)  # the tools venv
    parser.add_argument('--timeout', type=float, default=900, help='seconds for the tutorials')
    parser.add_argument(
        '--build-only', action='store_true', help='build the environment (steps 1-3) and stop'
    )
    parser.add_argument(
        '--run-built',
        action='store_true',
        help='run the tutorials (steps 4-5) in the environment a --build-only run left',
    )
    parser.add_argument(
        '--share',
        type=share_arg,
        metavar='K/N',
        help='run only tutorial K, K+N, K+2N, ... (sorted by name): N runs cover them all',
    )
    args = parser.parse_args()
    if args.plan:
        plan_here()
    elif args.execute:
        execute(args.execute)
    else:
        check(args)


if __name__ == '__main__':
    main()
