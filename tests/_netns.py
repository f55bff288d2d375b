"""Hosts with their own addresses on this machine: network namespaces on a bridge (root only).

`namespace_hosts(n)` makes a bridge with an address for this side (the
notebook's "head node") in a private /24 no interface here uses, and ``n``
network namespaces, each with a veth pair on the bridge, its own address and
its loopback up. A process started with `Hosts.run` (``ip netns exec``) is
"on host i": it reaches the others only through their addresses. The
namespaces share this machine's host name, file system and ``/dev/shm``; an
address tells them apart, a name does not.

Everything is torn down when the ``with`` block ends, also on failure and on
KeyboardInterrupt: every process in each namespace and every process started
here is SIGKILLed (a live process keeps its namespace alive), then the
namespaces and the bridge are deleted. Namespaces left by a test process that
died without tearing down (``kill -9``) are removed by the next run: their
names carry the creating process's pid.

Only addresses inside the namespaces made here (and the bridge's) are ever
contacted by the tests that use this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

# In CI (`.ci/run`) a missing namespace facility must fail the run, not skip it.
REQUIRE_ENV = 'MH_REQUIRE_NETNS'
SUBNET = '10.213'  # 10.213.X.0/24, X picked at random among the unused ones
# `ip netns exec NAME` bind-mounts /etc/netns/NAME/hosts over /etc/hosts: each host's
# name resolves to its own address there, as on a real cluster (gloo, JAX's CPU
# collectives, listens on the address of the host name).
ETC_NETNS = '/etc/netns'
_NAME = re.compile(r'^mhnb-(\d+)-([0-9a-f]{4})-(\d+)$')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(['ip', *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return 'network namespaces need root (ip netns add)'
    if shutil.which('ip') is None:
        return 'no `ip` command (Debian: apt-get install iproute2)'
    return None


def skip_or_fail(reason: str) -> None:
    """Skips the test, or fails it when ``MH_REQUIRE_NETNS=1`` (CI: these tests must run)."""
    if os.environ.get(REQUIRE_ENV) == '1':
        pytest.fail(f'{reason}, and {REQUIRE_ENV}=1 requires the network-namespace tests to run')
    pytest.skip(reason)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    out = _ip('netns', 'list', check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace_processes(names: Sequence[str], timeout: float = 10.0) -> None:
    """SIGKILLs every process in each namespace and waits until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [
            int(p) for name in names for p in _ip('netns', 'pids', name, check=False).stdout.split()
        ]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _links(tag: str) -> list[str]:
    """This machine's interfaces made for namespaces tagged ``tag`` (bridge, veth ends)."""
    out = _ip('-o', 'link', check=False).stdout
    return sorted(set(re.findall(rf'\b(mh[bv]{tag}\w*)', out)))


def _delete(names: Sequence[str], tag: str) -> None:
    _kill_namespace_processes(names)
    for name in names:
        _ip('netns', 'del', name, check=False)
        shutil.rmtree(os.path.join(ETC_NETNS, name), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(ETC_NETNS)  # only if no one else's files are in it
    # Deleting a namespace deletes its veth end, and the pair with it, but not always at
    # once: delete the outer ends and the bridge here.
    for link in _links(tag):
        _ip('link', 'del', link, check=False)


def sweep_stale() -> None:
    """Removes namespaces (and their bridges) whose creating test process is gone."""
    stale: dict[str, list[str]] = {}
    for name in _namespaces():
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            stale.setdefault(m.group(2), []).append(name)
    for tag, names in stale.items():
        _delete(names, tag)


def _free_subnet() -> str:
    """``10.213.X`` with no address or route of this machine in 10.213.X.0/24."""
    used = _ip('-o', 'addr').stdout + _ip('route').stdout + _ip('-o', '-6', 'route').stdout
    for x in random.sample(range(2, 254), 252):
        if f'{SUBNET}.{x}.' not in used:
            return f'{SUBNET}.{x}'
    raise RuntimeError(f'no free /24 in {SUBNET}.0.0/16')


@dataclasses.dataclass
class Hosts:
    """``n`` namespaces on a bridge: ``names[i]`` has address ``addresses[i]``.

    Attributes:
        bridge: the bridge's interface name; ``gateway`` is its address (this side's).
        prefix: the /24 as ``10.213.X``.
    """

    tag: str
    bridge: str
    prefix: str
    gateway: str
    names: list[str]
    addresses: list[str]
    processes: list[subprocess.Popen[Any]] = dataclasses.field(default_factory=list)

    def start(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Starts ``args`` on this side, in a session of its own (killed by `close`)."""
        process = subprocess.Popen(list(args), start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def run(self, i: int, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Starts ``args`` on host ``i`` (inside its namespace), in a session of its own."""
        return self.start(['ip', 'netns', 'exec', self.names[i], *args], **kwargs)

    def pids(self) -> list[int]:
        """Processes still running in any of the namespaces."""
        return [
            int(p)
            for name in self.names
            for p in _ip('netns', 'pids', name, check=False).stdout.split()
        ]

    def close(self) -> None:
        """Kills every process of the hosts and started here, deletes namespaces and bridge.

        Idempotent. A process already reaped is not signalled: its pid (and process group
        id) may belong to another process by now (pids wrap at 32,768 here, and a busy
        suite wraps them in minutes): a stale ``killpg`` once could kill a notebook kernel,
        which is a process group leader too.
        """
        processes, self.processes = self.processes, []
        for process in processes:
            if process.poll() is None:  # not reaped: the pid is still this process's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
        _kill_namespace_processes(self.names)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        _delete(self.names, self.tag)


def _build(n: int) -> Hosts:
    tag = secrets.token_hex(2)
    prefix = _free_subnet()
    hosts = Hosts(
        tag=tag,
        bridge=f'mhb{tag}',
        prefix=prefix,
        gateway=f'{prefix}.1',
        names=[f'mhnb-{os.getpid()}-{tag}-{i}' for i in range(n)],
        addresses=[f'{prefix}.{10 + i}' for i in range(n)],
    )
    try:
        _ip('link', 'add', hosts.bridge, 'type', 'bridge')
        _ip('addr', 'add', f'{hosts.gateway}/24', 'dev', hosts.bridge)
        _ip('link', 'set', hosts.bridge, 'up')
        for i, (name, address) in enumerate(zip(hosts.names, hosts.addresses, strict=True)):
            inside, outside = f'mhv{tag}h{i}', f'mhv{tag}p{i}'
            _ip('netns', 'add', name)
            _ip('link', 'add', inside, 'type', 'veth', 'peer', 'name', outside)
            _ip('link', 'set', outside, 'master', hosts.bridge)
            _ip('link', 'set', outside, 'up')
            _ip('link', 'set', inside, 'netns', name)
            _ip('-n', name, 'addr', 'add', f'{address}/24', 'dev', inside)
            _ip('-n', name, 'link', 'set', inside, 'up')
            _ip('-n', name, 'link', 'set', 'lo', 'up')
            os.makedirs(os.path.join(ETC_NETNS, name), exist_ok=True)
            with open(os.path.join(ETC_NETNS, name, 'hosts'), 'w') as f:
                f.write(f'127.0.0.1 localhost\n{address} {socket.gethostname()}\n')
    except BaseException:
        hosts.close()
        raise
    return hosts


@contextlib.contextmanager
def namespace_hosts(n: int) -> Iterator[Hosts]:
    """``n`` hosts with their own addresses, torn down on exit.

    Skips when namespaces cannot be made here (fails instead under ``MH_REQUIRE_NETNS=1``).
    """
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    sweep_stale()
    try:
        hosts = _build(n)
    except subprocess.CalledProcessError as exc:
        skip_or_fail(f'cannot make network namespaces here: {" ".join(exc.cmd)}: {exc.stderr}')
        raise
    try:
        yield hosts
    finally:
        hosts.close()


def leftovers(hosts: Hosts) -> list[str]:
    """What of ``hosts`` still exists after `Hosts.close` (should be nothing)."""
    left = [f'namespace {name}' for name in _namespaces() if name in hosts.names]
    left += [f'link {link}' for link in _links(hosts.tag)]
    left += [f'process {p.pid}' for p in hosts.processes if p.poll() is None]
    return left


@dataclasses.dataclass
class Controller:
    """An ``ipcontroller`` on the bridge address and the connection files it wrote."""

    profile_dir: str
    cluster_id: str
    client_file: str
    engine_file: str
    process: subprocess.Popen[Any]
    log: str


def _python() -> str:
    import sys

    return sys.executable


def start_controller(hosts: Hosts, profile_dir: str, timeout: float = 60.0) -> Controller:
    """``ipcontroller --ip=<bridge address>`` with its own profile dir; waits for its files."""
    import json

    os.makedirs(os.path.join(profile_dir, 'log'), exist_ok=True)
    cluster_id = f'netns-{hosts.tag}'
    security = os.path.join(profile_dir, 'security')
    files = [
        os.path.join(security, f'ipcontroller-{cluster_id}-{kind}.json')
        for kind in ('client', 'engine')
    ]
    log = os.path.join(profile_dir, 'log', 'ipcontroller.out')
    with open(log, 'w') as out:
        process = hosts.start(
            [
                _python(),
                '-m',
                'ipyparallel.controller',
                f'--ip={hosts.gateway}',
                f'--profile-dir={profile_dir}',
                f'--cluster-id={cluster_id}',
                '--log-level=WARN',
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout
    while True:
        try:
            if all(json.load(open(f)).get('registration') for f in files):
                break
        except (OSError, ValueError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f'ipcontroller did not write {files}:\n{open(log).read()}')
        time.sleep(0.1)
    return Controller(profile_dir, cluster_id, files[0], files[1], process, log)


def start_engines(hosts: Hosts, controller: Controller) -> list[subprocess.Popen[Any]]:
    """One ``ipengine`` per host, inside its namespace, with the controller's engine file."""
    engines = []
    for i in range(len(hosts.names)):
        log = os.path.join(controller.profile_dir, 'log', f'ipengine-{i}.out')
        with open(log, 'w') as out:
            engines.append(
                hosts.run(
                    i,
                    [
                        _python(),
                        '-m',
                        'ipyparallel.engine',
                        f'--file={controller.engine_file}',
                        f'--profile-dir={controller.profile_dir}',
                        f'--cluster-id={controller.cluster_id}',
                        '--log-level=WARN',
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return engines


@dataclasses.dataclass
class Ssh:
    """An ``sshd`` on each host (port 22 of its address only) and a key that logs in as this user.

    Attributes:
        logins: ``user@address`` per host.
        options: ssh/scp options that use the key and trust the hosts' own key.
    """

    logins: list[str]
    options: list[str]


def sshd_binary() -> str | None:
    return shutil.which('sshd') or next(
        (p for p in ('/usr/sbin/sshd', '/sbin/sshd') if os.access(p, os.X_OK)), None
    )


def start_sshd(hosts: Hosts, workdir: str, timeout: float = 30.0) -> Ssh:
    """Starts ``sshd -D`` in every namespace: own config and host key, a key pair made here.

    Each listens on its host's address only; only that key logs in (no passwords, no PAM).
    """
    import getpass

    sshd = sshd_binary()
    if sshd is None:
        skip_or_fail('no sshd (Debian: apt-get install openssh-server)')
        raise AssertionError('unreachable')
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    key, host_key = os.path.join(workdir, 'id_ed25519'), os.path.join(workdir, 'host_ed25519')
    for path in (key, host_key):
        subprocess.run(
            ['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', path], check=True, timeout=30
        )
    authorized = os.path.join(workdir, 'authorized_keys')
    shutil.copy(key + '.pub', authorized)
    os.chmod(authorized, 0o600)
    os.makedirs('/run/sshd', mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    for i, address in enumerate(hosts.addresses):
        config = os.path.join(workdir, f'sshd_config-{i}')
        with open(config, 'w') as f:
            f.write(
                f'ListenAddress {address}:22\n'
                f'HostKey {host_key}\n'
                f'AuthorizedKeysFile {authorized}\n'
                f'PidFile {workdir}/sshd-{i}.pid\n'
                'PermitRootLogin prohibit-password\n'
                'PasswordAuthentication no\n'
                'KbdInteractiveAuthentication no\n'
                'UsePAM no\n'
                'StrictModes no\n'
                'Subsystem sftp internal-sftp\n'
            )
        with open(os.path.join(workdir, f'sshd-{i}.log'), 'w') as log:
            hosts.run(i, [sshd, '-D', '-e', '-f', config], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    for i, address in enumerate(hosts.addresses):
        while True:
            try:
                socket.create_connection((address, 22), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    log_text = open(os.path.join(workdir, f'sshd-{i}.log')).read()
                    raise RuntimeError(f'sshd on {address} did not start:\n{log_text}') from None
                time.sleep(0.1)
    known = os.path.join(workdir, 'known_hosts')  # every host's key, so checking stays strict
    with open(host_key + '.pub') as f:
        public = ' '.join(f.read().split()[:2])
    with open(known, 'w') as f:
        f.writelines(f'{address} {public}\n' for address in hosts.addresses)
    options = [
        '-F', '/dev/null',  # no user or system ssh config
        '-i', key,
        '-o', 'IdentitiesOnly=yes',
        '-o', 'BatchMode=yes',
        '-o', 'StrictHostKeyChecking=yes',
        '-o', f'UserKnownHostsFile={known}',
        '-o', 'LogLevel=ERROR',
        '-o', 'ConnectTimeout=10',
    ]  # fmt: skip
    user = getpass.getuser()
    return Ssh([f'{user}@{a}' for a in hosts.addresses], options)
