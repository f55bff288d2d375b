"""What `multihost.install` was asked for, handed to every patcher (`_install.PATCHERS`)."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

#: The longest hold of `hold_on_error` unless told (seconds): 30 minutes.
DEFAULT_HOLD_S = 1800.0


@dataclasses.dataclass(frozen=True)
class InstallOptions:
    """The options of one `multihost.install`.

    Attributes:
        check_jit: check across hosts, before launch, every jitted launch whose
            computation spans devices of more than one process
            (``MULTIHOST_CHECK_JIT=1`` turns it on too).
        timeout: seconds after which an installed call raises
            `BarrierTimeoutError`; None: it waits as long as JAX's would
            (logging who is missing every ``MULTIHOST_TIMEOUT``), unless
            ``MULTIHOST_TIMEOUT`` is set.
        control_file: where process 0 writes the control endpoint's connection
            file (`_attach`; ``MULTIHOST_CONTROL_FILE``); None: no endpoint.
        control_address: the interface the endpoint binds (default loopback;
            ``MULTIHOST_CONTROL_ADDRESS``).
        dump_dir: where each host writes its dump when something goes wrong
            (`_job._dump`; ``MULTIHOST_DUMP_DIR`` too); None: no dumps.
        hold_on_error: a host whose program raises holds every host (`_debug._hold`)
            for at most ``hold_for`` seconds before the error goes on
            (``MULTIHOST_HOLD_ON_ERROR=1``, ``MULTIHOST_HOLD_FOR``).
        allow_exec: an attached notebook's ``%%mh`` cells run on the hosts, in their
            held frames (``MULTIHOST_ALLOW_EXEC=1``); off, the control key grants
            inspection only.
        audit: audit launches that span processes while the job runs (`_job._audit`): the
            first 10 of each jitted function, then every ``audit``-th; 0 off
            (``MULTIHOST_AUDIT=N``).
        audit_log: where each host writes the fingerprints of the audited launches'
            fresh inputs (`_job._auditlog`; ``MULTIHOST_AUDIT_LOG``); turns the audit on.
        audit_raise: the audit's first finding raises `AuditError` on every host at its
            next recorded launch (``MULTIHOST_AUDIT_RAISE=1``); turns the audit on.
    """

    check_jit: bool = False
    timeout: float | None = None
    control_file: str | None = None
    control_address: str | None = None
    dump_dir: str | None = None
    hold_on_error: bool = False
    hold_for: float = DEFAULT_HOLD_S
    allow_exec: bool = False
    audit: int = 0
    audit_log: str | None = None
    audit_raise: bool = False

    @classmethod
    def resolve(
        cls,
        check_jit: bool,
        timeout: float | None,
        control_file: str | None = None,
        control_address: str | None = None,
        dump_dir: str | None = None,
        hold_on_error: bool = False,
        hold_for: float | None = None,
        allow_exec: bool = False,
        audit: int | bool | str | None = None,
        audit_log: str | None = None,
        audit_raise: bool = False,
    ) -> InstallOptions:
        """The options as given, ``MULTIHOST_CHECK_JIT`` (and the control and dump variables) read;
        ``timeout`` checked."""
        env = os.environ.get('MULTIHOST_CHECK_JIT', '').strip().lower()
        if timeout is not None:
            timeout = float(timeout)
            if not timeout > 0:
                raise ValueError(f'install timeout must be positive seconds, got {timeout!r}')
        control_file = control_file or os.environ.get('MULTIHOST_CONTROL_FILE') or None
        control_address = control_address or os.environ.get('MULTIHOST_CONTROL_ADDRESS') or None
        dump_dir = dump_dir or os.environ.get('MULTIHOST_DUMP_DIR', '').strip() or None
        hold_env = os.environ.get('MULTIHOST_HOLD_ON_ERROR', '').strip().lower()
        exec_env = os.environ.get('MULTIHOST_ALLOW_EXEC', '').strip().lower()
        if hold_for is None:
            raw = os.environ.get('MULTIHOST_HOLD_FOR', '').strip()
            try:
                hold_for = float(raw) if raw else DEFAULT_HOLD_S
            except ValueError:
                raise ValueError(
                    f'MULTIHOST_HOLD_FOR={raw!r}: give the longest hold in seconds, e.g. 1800'
                ) from None
        if not float(hold_for) > 0:
            raise ValueError(f'hold_for must be positive seconds, got {hold_for!r}')
        from multihost._job import _audit

        every = _audit.every_from(audit) if audit is not None else _audit.from_env()
        audit_log = audit_log or os.environ.get('MULTIHOST_AUDIT_LOG', '').strip() or None
        if audit_log is not None:
            if not os.path.isdir(audit_log):
                raise ValueError(
                    f'audit_log={audit_log!r} is not a directory: create it first (each host '
                    'writes audit-<process>.jsonl there)'
                )
            every = every or _audit.DEFAULT_EVERY
        raise_env = os.environ.get('MULTIHOST_AUDIT_RAISE', '').strip().lower()
        audit_raise = bool(audit_raise) or raise_env in ('1', 'true', 'on', 'yes')
        if audit_raise:
            every = every or _audit.DEFAULT_EVERY
        if dump_dir:
            _writable_dir(os.path.abspath(dump_dir))
        hold_on_error = bool(hold_on_error) or hold_env in ('1', 'true', 'on', 'yes')
        if hold_on_error and not control_file:
            raise ValueError(
                '--hold-on-error needs --control-file PATH (MULTIHOST_CONTROL_FILE): without it '
                'no notebook can attach to the held job; add it, or drop --hold-on-error'
            )
        return cls(
            audit_raise=audit_raise,
            audit=every,
            audit_log=os.path.abspath(audit_log) if audit_log else None,
            check_jit=bool(check_jit) or env in ('1', 'true', 'on', 'yes'),
            hold_on_error=hold_on_error,
            hold_for=float(hold_for),
            allow_exec=bool(allow_exec) or exec_env in ('1', 'true', 'on', 'yes'),
            timeout=timeout,
            control_file=os.path.abspath(control_file) if control_file else None,
            control_address=control_address,
            dump_dir=os.path.abspath(dump_dir) if dump_dir else None,
        )

    def wait(self, default: float) -> float:
        """An installed call's wait: this timeout, ``MULTIHOST_TIMEOUT`` (``default``) when set,
        else forever (`math.inf`: the round logs who is missing each period, and waits on)."""
        if self.timeout is not None:
            return self.timeout
        if os.environ.get('MULTIHOST_TIMEOUT'):
            return default
        return math.inf


def _writable_dir(path: str) -> None:
    """Raises ValueError (one line) when the dumps could not be written to ``path``: found at
    start, not when a dump is needed (days later). Creates nothing: a job where nothing goes
    wrong writes nothing."""
    at = path
    while not os.path.exists(at):
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    if not os.path.isdir(at):
        raise ValueError(
            f'dump_dir={path!r} cannot be created: {at!r} is a file (give a directory, '
            '--dump-dir or MULTIHOST_DUMP_DIR)'
        )
    # A file made and removed at once, not os.access: root passes os.access almost
    # everywhere (/proc, a directory of mode 0555), and neither it nor the mode bits know
    # a read-only mount or a full quota's refusal.
    try:
        with tempfile.TemporaryFile(dir=at, prefix='.multihost-probe-'):
            pass
    except OSError as exc:
        raise ValueError(
            f'dump_dir={path!r}: no file can be made in {at!r} ({exc.strerror or exc}); give '
            'a directory this user can write (--dump-dir or MULTIHOST_DUMP_DIR)'
        ) from None
