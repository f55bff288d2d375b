"""Nothing a notebook kernel starts may outlive it: a watchdog process and owner-named files.

`start_watchdog` starts one process per local cluster that SIGKILLs the cluster's processes
(by their ``IPP_CLUSTER_ID`` / ``IPP_PROFILE_DIR``, and their descendants) once the kernel
dies; shared-memory files are named ``mhnb-<pid>-<start>-...`` and swept when their owner is
gone. Why and how: docs/ARCHITECTURE.md, "Cleanup". Run as ``python -m mhnotebook._cleanup
--owner PID ...`` (the watchdog); stdlib and psutil only (ipyparallel depends on psutil).
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import subprocess
import sys
import time
from typing import IO

SHM_DIR = '/dev/shm'
SHM_PREFIX = 'mhnb-'
_SHM_NAME = re.compile(r'^mhnb-(\d+)-(\d+|x)-')
_READY = b'ready\n'


# -- process identity -------------------------------------------------------------------


def process_start(pid: int) -> str | None:
    """An id of when process ``pid`` started, or None if it is gone (or a zombie).

    Equal for the same process whenever asked, different for a later process
    that reuses the pid: the start time in clock ticks since boot
    (``/proc/<pid>/stat``), else psutil's creation time.
    """
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        data = b''
    if data:
        fields = data[data.rindex(b')') + 2 :].split()  # the name may contain spaces
        if fields[0] in (b'Z', b'X'):
            return None
        return fields[19].decode()  # field 22: starttime
    try:
        import psutil

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return f'{proc.create_time():.0f}'
    except Exception:
        return None


def is_alive(pid: int, start: str | None) -> bool:
    """Whether the process that had ``start`` (see `process_start`) still runs as ``pid``."""
    now = process_start(pid)
    if now is None:
        return False
    return start is None or now == start


# -- shared-memory files ----------------------------------------------------------------


def shm_prefix() -> str:
    """The name prefix of this process's shared-memory files: ``mhnb-<pid>-<start>-``."""
    pid = os.getpid()
    return f'{SHM_PREFIX}{pid}-{process_start(pid) or "x"}-'


def shm_owner(name: str) -> tuple[int, str | None] | None:
    """``(pid, start)`` of the process that created shared-memory file ``name``, or None."""
    m = _SHM_NAME.match(os.path.basename(name))
    if m is None:
        return None
    return int(m.group(1)), (None if m.group(2) == 'x' else m.group(2))


def sweep_shm(directory: str = SHM_DIR, *, owner: int | None = None) -> list[str]:
    """Removes this user's shared-memory files whose owner is gone; returns their paths.

    Args:
        directory: where the files live.
        owner: only files of this (dead) pid, whatever its start time.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    uid = os.geteuid()
    stale: list[str] = []
    for name in names:
        who = shm_owner(name)
        if who is None:
            continue
        pid, start = who
        if owner is not None and pid != owner:
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != uid:
                continue  # another user's: not ours to judge
        except OSError:
            continue
        if owner is None and is_alive(pid, start):
            continue
        stale.append(path)
    return _unlink(stale)


def _unlink(paths: list[str]) -> list[str]:
    """Removes ``paths``; the ones it removed (one already gone or not ours is skipped)."""
    removed = []
    for path in paths:
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


# -- the cluster's processes ------------------------------------------------------------


def cluster_processes(cluster_id: str, profile_dir: str) -> list[int]:
    """Pids of every live process of the ipyparallel cluster ``cluster_id`` on this machine.

    A process belongs to the cluster when its environment holds the
    cluster's ``IPP_CLUSTER_ID`` and ``IPP_PROFILE_DIR`` (ipyparallel's
    launchers set both), or when it descends from such a process.
    """
    import psutil

    me = os.getpid()
    roots = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue  # gone, a zombie, or not ours
        if env.get('IPP_CLUSTER_ID') == cluster_id and env.get('IPP_PROFILE_DIR') == profile_dir:
            roots.append(proc)
    found = {p.pid: p for p in roots}
    for proc in roots:
        try:
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.Error:
            pass
    found.pop(me, None)
    return sorted(found)


def kill_cluster(cluster_id: str, profile_dir: str, *, rounds: int = 3) -> list[int]:
    """SIGKILLs every process of the cluster (see `cluster_processes`); returns their pids.

    Looks again a few times (0.2 s apart) for processes that were starting
    while it looked.
    """
    import psutil

    killed: list[int] = []
    for i in range(rounds):
        pids = cluster_processes(cluster_id, profile_dir)
        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        for proc in procs:  # collected first: killing a parent re-parents its children
            try:
                proc.send_signal(signal.SIGKILL)  # checks the pid was not reused
                killed.append(proc.pid)
            except psutil.Error:
                pass
        if i + 1 < rounds:
            time.sleep(0.2)
    return killed


# -- the watchdog -----------------------------------------------------------------------


#: Watchdog logs kept in a profile's ``log/`` (one per cluster started; older ones go).
KEEP_LOGS = 5


def prune_watchdog_logs(log_dir: str, keep: int = KEEP_LOGS) -> list[str]:
    """Removes all but the ``keep`` newest ``mhnotebook-watchdog-*.log`` in ``log_dir``, never
    one whose kernel still runs (its cluster id ``mhnb-<pid>-...`` names it); the removed paths."""
    try:
        names = [n for n in os.listdir(log_dir) if n.startswith('mhnotebook-watchdog-')]
    except OSError:
        return []
    paths = sorted(
        (os.path.join(log_dir, n) for n in names if n.endswith('.log')),
        key=lambda p: os.stat(p).st_mtime if os.path.exists(p) else 0.0,
        reverse=True,
    )
    stale = []
    for path in paths[keep:]:
        owner = os.path.basename(path)[len('mhnotebook-watchdog-') :].split('-')
        if len(owner) > 1 and owner[0] == 'mhnb' and owner[1].isdigit():
            pid = int(owner[1])
            if pid != os.getpid() and is_alive(pid, None):
                continue  # another running kernel's cluster: its log stays
        stale.append(path)
    return _unlink(stale)


def start_watchdog(
    cluster_id: str, profile_dir: str, log_path: str | None = None
) -> subprocess.Popen[bytes]:
    """Starts the watchdog of one local cluster owned by this process; returns its Popen.

    It outlives this process on purpose (a session of its own, so a signal to
    the kernel's process group does not reach it) and exits once it has
    killed the cluster: when this process dies, or when `stop_watchdog` says so.
    """
    pid = os.getpid()
    cmd = [
        sys.executable,
        '-m',
        'mhnotebook._cleanup',
        '--owner',
        str(pid),
        '--owner-start',
        process_start(pid) or 'x',
        '--cluster-id',
        cluster_id,
        '--profile-dir',
        profile_dir,
    ]
    log: IO[bytes] | int = open(log_path, 'ab') if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        if not isinstance(log, int):  # our file, not DEVNULL
            log.close()


def watchdog_ready(proc: subprocess.Popen, timeout: float) -> bool:
    """Waits at most ``timeout`` s for the watchdog to say it watches; False if it did not."""
    stdout = proc.stdout
    if stdout is None:
        raise ValueError('the watchdog was started without stdout=PIPE (see start_watchdog)')
    ready, _, _ = select.select([stdout], [], [], timeout)
    return bool(ready) and stdout.readline() == _READY


def stop_watchdog(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Tells the watchdog the cluster was stopped: it kills any straggler and exits."""
    try:
        if proc.stdin is not None:
            proc.stdin.write(b'stop\n')
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


def _owner_gone_event(owner: int, start: str | None) -> int | None:
    """A pidfd that becomes readable when ``owner`` exits (None: poll instead)."""
    if not hasattr(os, 'pidfd_open'):
        return None
    try:
        fd = os.pidfd_open(owner)
    except OSError:
        return None
    if not is_alive(owner, start):  # the pid was reused before we opened it
        os.close(fd)
        return None
    return fd


def watch(owner: int, start: str | None, cluster_id: str, profile_dir: str) -> str:
    """Blocks until ``owner`` dies or says stop on stdin, then kills the cluster; returns why."""
    pidfd = _owner_gone_event(owner, start) if is_alive(owner, start) else None
    stdin: int | None = sys.stdin.buffer.fileno()
    why = 'owner gone'
    os.write(sys.stdout.fileno(), _READY)
    while is_alive(owner, start):
        fds = ([stdin] if stdin is not None else []) + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(fds, [], [], 0.25)
        if pidfd is not None and pidfd in ready:
            break
        if stdin is not None and stdin in ready:
            data = os.read(stdin, 4096)
            if b'stop' in data:
                why = 'stopped'
                break
            if not data:
                # The pipe closed without 'stop': the owner is dying (a killed process closes
                # its files before /proc shows it dead) or dropped us. Watch the pid alone.
                stdin = None
    if is_alive(owner, start):  # stopped: the owner stopped the cluster, nothing starts now
        kill_cluster(cluster_id, profile_dir, rounds=1)
        return why
    sweep_shm(owner=owner)  # first: it takes a moment, killing takes a few
    kill_cluster(cluster_id, profile_dir)  # again after a moment: a launch may have been under way
    return 'owner gone'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m mhnotebook._cleanup')
    parser.add_argument('--owner', type=int, required=True)
    parser.add_argument('--owner-start', default='x')
    parser.add_argument('--cluster-id', required=True)
    parser.add_argument('--profile-dir', required=True)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):  # a closing terminal must not stop it
        signal.signal(sig, signal.SIG_IGN)
    start = None if args.owner_start == 'x' else args.owner_start
    why = watch(args.owner, start, args.cluster_id, args.profile_dir)
    print(f'mhnotebook watchdog of {args.cluster_id}: {why}', file=sys.stderr, flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
