"""What the audit of a running job found (`AuditReport`), as plain data.

Built by `multihost._job._audit` on every host from the digests all hosts shared for one
audited launch (so every host holds the same findings), carried into the dumps and read
back by `multihost analyze` and the post-mortem.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from multihost._text import fmt_hosts, short_site

#: The thread that shares the audit's tables: its exchanges' flight records carry its name.
AUDIT_THREAD = 'multihost-audit'
#: The checks, in the order a report lists them.
CHECKS = ('drift', 'duplicate', 'nonfinite')
#: What each check is called in a finding's line.
CHECK_WORDS = {
    'drift': 'replica drift',
    'duplicate': 'duplicate data',
    'nonfinite': 'first non-finite',
}


@dataclasses.dataclass(frozen=True)
class AuditFinding:
    """One divergence the audit found, the first launch it was seen at.

    Attributes:
        check: ``'drift'`` (replicas of one block differ across processes),
            ``'duplicate'`` (fresh input blocks of different processes are
            identical) or ``'nonfinite'`` (a launch's outputs hold NaN or Inf).
        launch: the jitted function's name.
        call: which call of it (0-based, as the flight records count).
        site: ``file:line`` of the call.
        path: the argument or result as a user writes it
            (``state.params['Dense_1']['bias']``, ``result[1]``).
        processes: the processes the finding names (the odd replicas' holders,
            the processes holding identical blocks, the processes whose outputs
            held non-finite values).
        detail: the rest of the line (which blocks, against whom, which inputs).
        time: when the launch was audited (seconds since the epoch, on the host that
            made the report).
    """

    check: str
    launch: str
    call: int
    site: str
    path: str
    processes: tuple[int, ...]
    detail: str
    time: float = 0.0

    def format(self) -> str:
        """``replica drift at train_step call #5 (train.py:88): <path> ...``."""
        return f'{self.headline()}: {self.path} {self.detail}'

    def headline(self) -> str:
        """``replica drift at train_step call #5 (train.py:88)``: what and where, no detail."""
        word = CHECK_WORDS.get(self.check, self.check)
        where = f' ({short_site(self.site)})' if self.site else ''
        return f'{word} at {self.launch} call #{self.call}{where}'

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), 'processes': list(self.processes)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditFinding:
        return cls(**{**data, 'processes': tuple(int(p) for p in data.get('processes', ()))})


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """The audit of one host: what it checked and what it found.

    Attributes:
        process: the host that made the report.
        enabled: whether the job runs with the audit on.
        every: after the first `first` launches of a function, every ``every``-th is audited.
        first: launches of each function audited from its first call.
        audited: launches audited so far (their digests shared and compared).
        leaves: array leaves compared so far (arguments and results, summed over launches).
        findings: what was found, each once (the first launch it was seen at).
        stopped: why the audit stopped early ('' while it runs).
        seconds: time this host spent reading, hashing and comparing for the audit (off
            the main thread; not the wait for the audited launch's results).
        waited: seconds the main thread waited before a launch until the audit had read
            the previous one's results (which that launch may donate): the rest of the
            audited launch itself, then the reading.
        replays: with ``--audit-replay``, each replay's verdict (`Replay.describe`), headed
            by the launch replayed and the finding that asked for it.
    """

    process: int
    enabled: bool
    every: int = 0
    first: int = 0
    audited: int = 0
    leaves: int = 0
    findings: tuple[AuditFinding, ...] = ()
    stopped: str = ''
    seconds: float = 0.0
    waited: float = 0.0
    replays: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No finding."""
        return not self.findings

    def of(self, check: str) -> tuple[AuditFinding, ...]:
        """The findings of one check."""
        return tuple(f for f in self.findings if f.check == check)

    def format(self) -> str:
        if not self.enabled:
            return 'audit: off (multihost run --audit, MULTIHOST_AUDIT=N or install(audit=N))'
        then = 'every launch' if self.every == 1 else f'every {self.every}-th'
        head = (
            f'audit: {self.audited} launch(es) audited on process {self.process} '
            f'(the first {self.first} of each function, then {then}), '
            f'{len(self.findings) or "no"} finding(s)'
        )
        if self.stopped:
            head += f'; stopped: {self.stopped}'
        lines = [head] + [f'  {f.format()}' for f in self.findings]
        lines += ['  ' + text.replace('\n', '\n  ') for text in self.replays]
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format()

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data['findings'] = [f.to_json() for f in self.findings]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditReport:
        findings = tuple(AuditFinding.from_json(f) for f in data.get('findings', ()))
        return cls(**{**data, 'findings': findings, 'replays': tuple(data.get('replays', ()))})


def odd_ones(holders: dict[str, list[int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the processes holding a minority digest, the others): ``holders`` is digest ->
    processes. The digest most processes hold is taken as right (ties: the one the lowest
    process holds)."""
    ranked = sorted(holders.items(), key=lambda kv: (-len(set(kv[1])), min(kv[1])))
    odd = tuple(sorted({p for _, ps in ranked[1:] for p in ps}))
    right = tuple(sorted(set(ranked[0][1]) - set(odd)))
    return odd, right


def drift_detail(block: str, odd: tuple[int, ...], right: tuple[int, ...]) -> str:
    against = f' from {fmt_hosts(right)}' if right else ''
    return f'block {block} differs on {fmt_hosts(odd)}{against}'
