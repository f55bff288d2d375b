"""Test harness: real multi-process JAX on CPU.

Two ways to use a local cluster (`multihost.testing.LocalCluster`: N real
processes, D CPU devices each, `jax.distributed.initialize` on a free loopback
port, gloo collectives):

* mark a test ``@pytest.mark.multiprocess``: its body runs in *every*
  process of the module's cluster, bracketed by coordination-service barriers
  named after the test, so one process's failure fails the test for all;
* request the ``mp_cluster`` fixture and call ``mp_cluster.run(fn)`` to get
  every process's return value and check them together in the test process.

``MP_CLUSTER = dict(n=..., ...)`` at module level configures the module's
cluster (its *shape*; the default is 4 processes x 2 devices). Clusters are
shared across the session by shape, as ipyparallel's own test suite shares its
engines: the modules of one shape run one after another, and the cluster starts
once for them. It is restarted automatically after a test that broke it, and
before the next module whenever its workers no longer look as they did right
after they started (`_cluster_state`: environment, signal handlers, threads,
patched module attributes, a cold backend that started, collective counts that
differ), so what one module does to its hosts cannot fail another. What a module
needs in its workers beyond the shape: ``MP_CLUSTER_ENV`` (variables the workers
read at call time, such as ``MULTIHOST_TIMEOUT``: set in the shared workers while
the module runs), ``MP_CLUSTER_ENTER`` (a function run in every worker when the
module takes the cluster, and after every restart) and ``MP_CLUSTER_LEAVE`` (one
that undoes it); ``MP_CLUSTER_FRESH = True`` when a test needs processes that
no other module used (no debug thread yet, say). Every call has a hard timeout that kills the whole
cluster, and the error carries each process's traceback, Python stacks and log.

Tests not marked run in this process, where JAX is single-process: they
cover the single-process fast paths.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# XLA compiles the tests' programs with its backend (LLVM) optimizations off: the flax
# program's `train_step` takes half the CPU to compile (4.5 -> 2.2 s; a 3-process job
# 27 -> 17 s of CPU), the same on every process (nothing the toolkit checks depends on
# the machine code's speed), inherited by every process the tests start. The tutorials
# run with the flags as they were (`test_notebooks.py`: their outputs are the docs'), as
# do the benchmarks and the Binder check. MH_TESTS_XLA_O0=0, or an optimization level
# in XLA_FLAGS, keeps XLA's default.
XLA_O0 = '--xla_backend_optimization_level=0'
if os.environ.get('MH_TESTS_XLA_O0', '1') != '0' and 'optimization_level' not in os.environ.get(
    'XLA_FLAGS', ''
):
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {XLA_O0}'.strip()

import _cluster_state  # noqa: E402  (this folder is on the path, as for every test module)
import jax  # noqa: E402
import pytest  # noqa: E402

from multihost.testing import LocalCluster  # noqa: E402

jax.config.update('jax_num_cpu_devices', 4)

DEFAULT_CLUSTER = dict(n=4, devices_per_process=2)
HERE = os.path.dirname(os.path.abspath(__file__))
#: Seconds a shared cluster gets to report its state between modules.
CHECK_TIMEOUT = 60.0


def shape_of(config: dict) -> tuple:
    """The key modules share a cluster by: every option, ``env`` as sorted pairs."""
    return tuple(
        sorted(
            (k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in config.items()
        )
    )


def module_config(module) -> dict:
    config = dict(DEFAULT_CLUSTER)
    config.update(getattr(module, 'MP_CLUSTER', {}))
    # Workers import a test module by its path; this folder on their path lets
    # it import the shared `_helpers`, as it does in this process.
    paths = [HERE, os.environ.get('PYTHONPATH', '')]
    config['env'] = {**config.get('env', {}), 'PYTHONPATH': os.pathsep.join(filter(None, paths))}
    return config


class ClusterHolder:
    """One shape's cluster for the whole session: started lazily, restarted after it broke.

    `claim` hands it to the next module: a cluster that is not alive, or whose
    workers no longer look as they did right after they started (`_cluster_state`),
    is replaced by a fresh one, so what one module did to its hosts cannot fail
    another module. ``starts`` counts the processes' starts (reported at the end)."""

    def __init__(self, config: dict, log_dir: str):
        self.config = config
        self.log_dir = log_dir
        self.cluster: LocalCluster | None = None
        self.fresh: list[dict] | None = None
        self.enter: list = []
        self.starts = 0
        self.reused = 0
        self.restarts: list[str] = []  # why a shared cluster was not reused

    def get(self) -> LocalCluster:
        if self.cluster is None or not self.cluster.alive:
            if self.cluster is not None:
                self.cluster.stop()
            log_dir = os.path.join(self.log_dir, f'start-{self.starts}')
            os.makedirs(log_dir, exist_ok=True)
            # Workers inherit this process's environment: the session's, not what
            # the module running now set (a shared cluster outlives the module).
            with pytest.MonkeyPatch.context() as mp:
                for name in set(os.environ) - set(_SESSION_ENV):
                    mp.delenv(name)
                for name, value in _SESSION_ENV.items():
                    mp.setenv(name, value)
                self.cluster = LocalCluster(log_dir=log_dir, **self.config).start()
            self.starts += 1
            # What every later module must find again (`claim`).
            self.fresh = self.cluster.run(_cluster_state.state, timeout=CHECK_TIMEOUT)
            for fn, args in self.enter:
                self.cluster.run(fn, *args, timeout=CHECK_TIMEOUT)
        return self.cluster

    def claim(self, module, enter: list, fresh: bool = False) -> None:
        """Before ``module``'s first test: a fresh cluster, or a shared one checked clean.

        ``enter`` (``(function, args)`` pairs: the module's ``MP_CLUSTER_ENV`` and
        ``MP_CLUSTER_ENTER``) runs in every worker then, and again after every
        restart while the module runs."""
        self.enter = []
        cluster = self.cluster
        if cluster is not None and cluster.alive and self.fresh is not None:
            why: list[str] = []
            if fresh:
                why.append('the module asks for processes no other module used (MP_CLUSTER_FRESH)')
            try:
                now = cluster.run(_cluster_state.state, timeout=CHECK_TIMEOUT)
                seq = cluster.run(_cluster_state.sequence, timeout=CHECK_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - any failure: start afresh
                why.append(f'the state check failed: {str(exc).splitlines()[0]}')
            else:
                for p, (before, after) in enumerate(zip(self.fresh, now)):
                    why += [f'process {p}: {d}' for d in _cluster_state.differences(before, after)]
                if len(set(seq)) != 1:
                    why.append(f"the hosts' collective counts differ: {seq}")
            if why:
                line = f'{module.__name__}: ' + '; '.join(why[:3])
                self.restarts.append(line)
                with open(os.path.join(self.log_dir, 'restarts.txt'), 'a') as f:
                    f.write(line + '\n')
                cluster.stop()
            else:
                cluster.run(_cluster_state.forget, timeout=CHECK_TIMEOUT)
                self.reused += 1
        self.enter = enter
        if self.cluster is not None and self.cluster.alive:
            for fn, args in enter:
                self.cluster.run(fn, *args, timeout=CHECK_TIMEOUT)
        self.get()

    def release(self, leave: list) -> None:
        """After the module's last test: ``leave`` (``(function, args)`` pairs) in every worker.

        If it fails the cluster is stopped; if it is not run (a broken cluster),
        the next `claim` finds the difference."""
        self.enter = []
        if leave and self.cluster is not None and self.cluster.alive:
            try:
                for fn, args in leave:
                    self.cluster.run(fn, *args, timeout=CHECK_TIMEOUT)
            except Exception:  # noqa: BLE001 - stopped: the next module starts afresh
                self.cluster.stop()

    def run(self, fn, *args, **kwargs):
        return self.get().run(fn, *args, **kwargs)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


class ClusterPool:
    """The session's clusters by shape; one runs at a time (modules of a shape run together)."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.holders: dict[tuple, ClusterHolder] = {}

    def holder(self, config: dict) -> ClusterHolder:
        key = shape_of(config)
        self.stop(but=key)
        if key not in self.holders:
            self.holders[key] = ClusterHolder(
                config, os.path.join(self.log_dir, f'shape-{len(self.holders)}')
            )
        return self.holders[key]

    def stop(self, but: tuple | None = None) -> None:
        for key, h in self.holders.items():
            if key != but:
                h.stop()


_POOL: ClusterPool | None = None
#: This process's environment when the session began (what the workers inherit).
_SESSION_ENV = dict(os.environ)


@pytest.fixture(scope='session')
def mp_cluster_pool(tmp_path_factory):
    global _POOL
    _POOL = ClusterPool(str(tmp_path_factory.mktemp('cluster-logs')))
    yield _POOL
    _POOL.stop()


@pytest.fixture(scope='module')
def mp_cluster(request, mp_cluster_pool):
    module = request.module
    holder = mp_cluster_pool.holder(module_config(module))
    env = getattr(module, 'MP_CLUSTER_ENV', None)
    enter = [(_cluster_state.push_environ, (env,))] if env else []
    leave = []
    if hasattr(module, 'MP_CLUSTER_ENTER'):
        enter.append((module.MP_CLUSTER_ENTER, ()))
    if hasattr(module, 'MP_CLUSTER_LEAVE'):
        leave.append((module.MP_CLUSTER_LEAVE, ()))
    if env:
        leave.append((_cluster_state.pop_environ, ()))
    holder.claim(module, enter, fresh=getattr(module, 'MP_CLUSTER_FRESH', False))
    yield holder
    holder.release(leave)


def pytest_configure(config):
    """In a pytest-xdist worker (the README's ``pytest`` runs two, `pyproject.toml`): SIGINT
    gets Python's own handler back. execnet starts its workers with SIGINT ignored, and an
    ignored signal stays ignored in every process they start (clusters, engines, jobs):
    the tests of interrupts need the real thing."""
    import signal

    if hasattr(config, 'workerinput'):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session):
    """The shared notebook-side sessions (`_helpers.local_session`) stop with the test session."""
    helpers = sys.modules.get('_helpers')
    if helpers is not None:
        helpers.stop_shared_sessions()


def pytest_terminal_summary(terminalreporter):
    """How many clusters the session started, and why a shared one was not reused."""
    helpers = sys.modules.get('_helpers')
    if helpers is not None and sum(helpers.SESSION_STARTS):
        started, reused = helpers.SESSION_STARTS
        terminalreporter.write_line(
            f'notebook-side sessions, shared by shape: {started} started, '
            f'{reused} time(s) handed on to the next module'
        )
        for line in helpers.SESSION_RESTARTS:
            terminalreporter.write_line(f'  restarted: {line}'[:300])
    if _POOL is None or not _POOL.holders:
        return
    starts = sum(h.starts for h in _POOL.holders.values())
    reused = sum(h.reused for h in _POOL.holders.values())
    terminalreporter.write_line(
        f'multi-process clusters: {starts} started for {len(_POOL.holders)} shape(s), '
        f'{reused} time(s) handed on to the next module'
    )
    for h in _POOL.holders.values():
        for line in h.restarts:
            terminalreporter.write_line(f'  restarted: {line}'[:300])


def pytest_addoption(parser):
    parser.addoption(
        '--release',
        default='all',
        metavar='all|none|K/N',
        help='which tests marked release run: all (the default), none, or share K of N '
        '(0 <= K < N): the release tests of share K of the units (files; one test for '
        "those marked release(dealt='test')) dealt into N shares of about equal time "
        '(tests/release_seconds.json). .ci/run runs share (commits on main mod 8) of 8: '
        'every unit in 8 landings',
    )
    parser.addoption(
        '--deal',
        default=None,
        metavar='K/N',
        help='run only tests K, K+N, K+2N, ... of those collected (after --release): N runs '
        "with K = 0..N-1 run each once. .ci/run deals the second Python's rotating tests so",
    )
    parser.addoption(
        '--every',
        action='append',
        default=[],
        metavar='PATH',
        help='with --deal: the tests under PATH (a file or folder, as given on the command '
        'line) run on every share and are not dealt (repeatable)',
    )


def release_share(value: str, option: str = '--release') -> tuple[int, int] | None:
    """``--release``'s value -> (K, N), or None for all; 'none' is (0, 0).

    Raises:
        pytest.UsageError: anything else, saying what it takes.
    """
    if value == 'all':
        return None
    if value == 'none':
        return (0, 0)
    k, _, n = value.partition('/')
    if k.isdigit() and n.isdigit() and 0 <= int(k) < int(n):
        return (int(k), int(n))
    raise pytest.UsageError(
        f'{option}={value!r}: give all, none, or K/N with 0 <= K < N (e.g. {option}=1/4)'
    )


#: Seconds the release tests of each unit took (`tests/release_seconds.json`, from
#: ``pytest --durations=0`` on this 2-core machine): the shares are dealt by them. A unit is
#: a file (its release tests run together: a shared cluster starts once), or one test for
#: those marked ``release(dealt='test')`` (the tutorials: each its own kernel and cluster).
_RELEASE_SECONDS = pathlib.Path(__file__).with_name('release_seconds.json')


def release_units(units: list[str], n: int) -> list[set[str]]:
    """``units`` dealt into ``n`` shares of about equal time.

    The table's units are dealt all together, whatever was collected (so a run of one file
    deals as the whole suite does: CI asks which tutorials its share executes): the longest
    first, each to the share with the least so far (ties: by name). A unit not in the table
    goes to share ``crc32(unit) % n``. The same deal on every worker, every time.
    """
    import json
    import zlib

    seconds = json.loads(_RELEASE_SECONDS.read_text())
    share_of: dict[str, int] = {}
    load = [0] * n
    for u in sorted(seconds, key=lambda u: (-seconds[u], u)):
        k = min(range(n), key=lambda i: (load[i], i))
        share_of[u] = k
        load[k] += seconds[u]
    shares: list[set[str]] = [set() for _ in range(n)]
    for u in units:
        shares[share_of.get(u, zlib.crc32(u.encode()) % n)].add(u)
    return shares


def _file(item) -> str:
    return pathlib.Path(item.nodeid.split('::')[0]).name


def release_unit(item) -> str | None:
    """The unit a release test is dealt with (``'file.py'`` or ``'file.py::test[id]'``), or
    None for a test not marked release."""
    mark = item.get_closest_marker('release')
    if mark is None:
        return None
    dealt = mark.kwargs.get('dealt', 'file')
    if dealt not in ('file', 'test'):
        raise pytest.UsageError(f"{item.nodeid}: release(dealt={dealt!r}): give 'file' or 'test'")
    return f'{_file(item)}::{item.name}' if dealt == 'test' else _file(item)


def pytest_collection_modifyitems(config, items):
    share = release_share(config.getoption('release'))
    if share is not None:
        k, n = share
        units = {id(i): release_unit(i) for i in items}
        marked = sorted({u for u in units.values() if u is not None})
        chosen = release_units(marked, n)[k] if n else set()
        kept = [i for i in items if units[id(i)] is None or units[id(i)] in chosen]
        dropped = [i for i in items if i not in set(kept)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    deal = config.getoption('deal')
    if deal is not None:
        k, n = release_share(deal, option='--deal') or (0, 1)
        if n == 0:
            raise pytest.UsageError(f'--deal={deal!r}: give K/N with 0 <= K < N')
        every = tuple(p.rstrip('/') for p in config.getoption('every'))

        def _everywhere(item) -> bool:
            path = item.nodeid.split('::')[0]
            return any(path == p or path.startswith(p + '/') for p in every)

        dealt = [i for i in items if not _everywhere(i)]
        dropped = {id(i) for j, i in enumerate(dealt) if j % n != k}
        config.hook.pytest_deselected(items=[i for i in items if id(i) in dropped])
        items[:] = [i for i in items if id(i) not in dropped]
    elif config.getoption('every'):
        raise pytest.UsageError('--every=PATH is for --deal=K/N: give both (e.g. --deal=1/4)')
    for item in items:
        if item.get_closest_marker('multiprocess') and 'mp_cluster' not in item.fixturenames:
            item.fixturenames.append('mp_cluster')
    # The modules of one cluster shape run one after another (where the first of
    # them was), so the shared cluster of that shape starts once.
    for item in items:
        module = getattr(item, 'module', None)
        if module is not None and 'mp_cluster' in item.fixturenames and module not in _SHAPES:
            _SHAPES[module] = shape_of(module_config(module))
    # Groups with a slow test first: pytest-xdist hands each worker whole files in this
    # order, so the long ones start early and the short ones fill in at the end (the
    # longest-first rule: the two workers end together instead of one waiting).
    order: dict = {}
    slow: set = set()
    for item in items:
        order.setdefault(_group(item), len(order))
        if item.get_closest_marker('slow'):
            slow.add(_group(item))
    items.sort(key=lambda item: (_group(item) not in slow, order[_group(item)]))


def _group(item) -> object:
    """The item's cluster shape if its module uses the shared clusters, else its module."""
    module = getattr(item, 'module', None)
    return _SHAPES.get(module) or module or item.nodeid.split('::')[0]


#: Test module -> its cluster shape, for the modules that use `mp_cluster`.
_SHAPES: dict = {}


#: The suite's lock (`_Alone`) and its gate, shared by the workers of one checkout.
_LOCK_DIR = pathlib.Path(__file__).resolve().parent.parent / 'build'


class _Alone:
    """Tests marked ``alone`` run while no other test does; every other test may run beside
    another. Each test holds the lock shared (an ``alone`` one exclusively) from its setup to
    its teardown; a test waiting to run alone first takes the gate, which every test passes
    before it takes the lock, so a worker's next tests wait behind it instead of starving it."""

    def __init__(self) -> None:
        import fcntl

        self._fcntl = fcntl
        _LOCK_DIR.mkdir(exist_ok=True)
        self._gate = open(_LOCK_DIR / '.tests-gate.lock', 'a+')  # noqa: SIM115 (held open)
        self._lock = open(_LOCK_DIR / '.tests.lock', 'a+')  # noqa: SIM115
        self._held = False

    def take(self, alone: bool) -> None:
        f = self._fcntl
        if alone:
            f.flock(self._gate, f.LOCK_EX)
            f.flock(self._lock, f.LOCK_EX)
            f.flock(self._gate, f.LOCK_UN)
        else:
            f.flock(self._gate, f.LOCK_SH)
            f.flock(self._lock, f.LOCK_SH)
            f.flock(self._gate, f.LOCK_UN)
        self._held = True

    def give(self) -> None:
        if self._held:
            self._fcntl.flock(self._lock, self._fcntl.LOCK_UN)
            self._held = False


_ALONE: _Alone | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test under `_Alone`'s lock (with two or more workers only), its module fixtures'
    setup included."""
    global _ALONE
    if not os.environ.get('PYTEST_XDIST_WORKER'):
        return None
    if _ALONE is None:
        _ALONE = _Alone()
    _ALONE.take(item.get_closest_marker('alone') is not None)
    try:
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        from _pytest.runner import runtestprotocol

        runtestprotocol(item, nextitem=nextitem)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    finally:
        _ALONE.give()
    return True


def pytest_runtest_setup(item):
    """A module of another shape (or none) comes next: the shared cluster is not needed again."""
    if _POOL is not None:
        group = _group(item)
        _POOL.stop(but=group if isinstance(group, tuple) else None)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker('multiprocess')
    if marker is None:
        return None
    holder: ClusterHolder = pyfuncitem.funcargs['mp_cluster']
    params = dict(getattr(getattr(pyfuncitem, 'callspec', None), 'params', {}))
    options = dict(timeout=60.0)
    options.update(marker.kwargs)
    holder.run(pyfuncitem.obj, **params, **options)
    return True
