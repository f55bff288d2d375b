"""``mhnotebook.postmortem(DIR...)``: a dead (or stuck) job's story from its dump files alone.

Each host of a job run with ``--dump-dir DIR`` wrote ``DIR/process-<i>.json``
(`multihost._models._dumpfile`). `postmortem` reads them into a `PostMortem`:
a read-only job view (`_jobview.JobView`): the same models a `Session` or
an `AttachedJob` answers (`where`, `wavefront`, `flight_records`, `timeline`), so
the same views (`_views.where_view`, `timeline_view`) show them, and
`verdict` is what ``python -m multihost analyze`` prints. No cluster, no
process is reached: the files are all, so the ``timeout`` the protocol's
reads take waits for nothing here, and stepping raises `UnsupportedError`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, ClassVar

from mhnotebook._errors import SessionError
from mhnotebook._jobview import FEATURES, JobView

if TYPE_CHECKING:
    from multihost import AuditReport, FlightRecord, HostStacks, Wavefront
    from multihost._models._analyze import Verdict
    from multihost._models._dumpfile import Dump
    from multihost._models._native import NativeStacks
    from multihost._models._wavefront import HostFront

__all__ = ['PostMortem', 'PostMortemError', 'postmortem']


class PostMortemError(SessionError):
    """Dump directories that cannot be read: one line naming the path and what to give."""


@dataclasses.dataclass(frozen=True)
class PostMortem(JobView):
    """What a job's dumps say, by process: a read-only `JobView` (no ``'step'`` feature).

    Attributes:
        directories: the directories read.
        dumps: one `Dump` per process that wrote one, in process order.
        num_processes: the job's size (the largest any dump names).
        native_stacks: the faulthandler stacks of hosts that held the GIL
            (``process-<i>.stacks.txt``, written from C when no Python could run).
    """

    kind: ClassVar[str] = 'post-mortem'
    features: ClassVar[frozenset[str]] = frozenset(FEATURES) - {'step', 'data'}
    live: ClassVar[bool] = False

    directories: tuple[str, ...]
    dumps: tuple[Dump, ...]
    num_processes: int
    native_stacks: tuple[NativeStacks, ...] = ()

    @property
    def missing(self) -> tuple[int, ...]:
        """Processes without a dump."""
        have = {d.process for d in self.dumps}
        return tuple(p for p in range(self.num_processes) if p not in have)

    @property
    def gone(self) -> dict[int, str]:
        """Process -> why another host's dump says it is gone."""
        out: dict[int, str] = {}
        for d in self.dumps:
            for p, why in d.gone.items():
                out.setdefault(int(p), why)
        return out

    def _why_missing(self, p: int) -> str:
        why = self.gone.get(p)
        return f'no dump from process {p}' + (f' (gone: {why})' if why else '')

    # -- the job view's hooks (`_jobview.JobView`: read-only, from the files) ----------
    def _unsupported(self, feature: str) -> str:
        dirs = ', '.join(self.directories)
        if feature == 'data':
            return (
                f'a post-mortem reads the dump files in {dirs}; its hosts are gone with their '
                "values, so it has nothing to gather, lay out or compare; to inspect a job's "
                'values, attach to it while it runs: mhnotebook.attach(PATH)'
            )
        return (
            f'a post-mortem is read-only: it reads the dump files in {dirs} and reaches no host, '
            'so it cannot step; to step a running job, attach to it: mhnotebook.attach(PATH), '
            "PATH the job's --control-file"
        )

    def _stacks(self, timeout: float) -> dict[int, HostStacks]:
        # Each dumped host's stacks, as it wrote them (one that dumped at its timeout:
        # waiting in the check that failed, as the verdict says, `_analyze.at_dump`).
        from multihost._models._analyze import at_dump

        return {d.process: at_dump(d)[1] for d in self.dumps}

    def _wavefront(self, timeout: float) -> Wavefront:
        # Every host's position at its dump (as the verdict reads it); a host without a
        # dump is silent, and why.
        from multihost._models import Wavefront
        from multihost._models._analyze import at_dump
        from multihost._models._wavefront import HostFront

        by = {d.process: _with_table(at_dump(d)[0], d) for d in self.dumps}
        hosts = tuple(
            by.get(p) or HostFront(process=p, answered=False, error=self._why_missing(p))
            for p in range(self.num_processes)
        )
        written = max((d.written for d in self.dumps), default=time.time())
        return Wavefront(hosts=hosts, time=written)

    def _records(self, last: int, timeout: float) -> dict[int, list[FlightRecord]]:
        # Each dumped host's last ``last`` flight records, oldest first.
        return {d.process: list(d.records[-last:]) if last else [] for d in self.dumps}

    def verdict(self) -> Verdict:
        """The ``python -m multihost analyze`` verdict (``str()`` of it is its text)."""
        from multihost._models._analyze import analyze

        return analyze(list(self.dumps), self.native_stacks)

    def _audit(self, timeout: float) -> AuditReport:
        # What the job's audit had found when the hosts dumped: the report of the lowest
        # process that carried one, with every host's findings (each once).
        from multihost._models._audit import AuditFinding, AuditReport

        reports = [d.audit for d in sorted(self.dumps, key=lambda d: d.process) if d.audit]
        if not reports:
            return AuditReport(process=min((d.process for d in self.dumps), default=0),
                               enabled=False)  # fmt: skip
        seen: dict[tuple[str, str, str], AuditFinding] = {}
        for r in reports:
            for f in r.findings:
                seen.setdefault((f.check, f.launch, f.path), f)
        return dataclasses.replace(reports[0], findings=tuple(seen.values()))

    # -- summary ---------------------------------------------------------------------
    def summary(self) -> list[str]:
        """One line for the job, one per dump (its trigger), one per missing dump."""
        dirs = ', '.join(self.directories)
        lines = [f'{len(self.dumps)} of {self.num_processes} processes dumped in {dirs}']
        from multihost._models._analyze import audit_lines, native_lines, position

        for d in self.dumps:
            at = time.strftime('%H:%M:%S', time.localtime(d.trigger_time or d.written))
            line = f'  process {d.process} ({d.hostname}): {d.trigger} at {at}'
            if d.trigger in ('request', 'peer', 'lost'):  # asked, or ended by another host:
                line += f': {position(d)[0]}'  # what it was doing (when the others missed it)
            elif d.asked is not None:  # its dump at another's request, kept by this later one
                then = time.strftime('%H:%M:%S', time.localtime(d.asked.trigger_time))
                line += f' (at the dump request of {then}: {position(d.asked)[0]})'
            lines.append(line)
        lines.extend(f'  {self._why_missing(p)}' for p in self.missing)
        lines.extend(f'  {g}' for g in native_lines(self.native_stacks, self.dumps))
        lines.extend(f'  {a}' for a in audit_lines(self.dumps))
        return lines

    def __repr__(self) -> str:
        return '\n'.join(self.summary())

    def _repr_pretty_(self, p: object, cycle: bool) -> None:
        p.text(repr(self))  # type: ignore[attr-defined]

    def _repr_html_(self) -> str:
        import html

        return '<pre>' + html.escape(repr(self) + '\n\n' + str(self.verdict())) + '</pre>'


def postmortem(*directories: str | os.PathLike[str]) -> PostMortem:
    """Reads the dumps a job wrote (``--dump-dir``; one directory or several) into a `PostMortem`.

    Raises:
      PostMortemError: no directory given, a directory missing or holding no
        dump, or a file there that is not a dump (one line naming the path).
    """
    from multihost._models._dumpfile import DumpFormatError, read_dirs
    from multihost._models._native import read_dirs as read_native_dirs

    if not directories:
        raise PostMortemError('postmortem needs a directory: the --dump-dir the job was run with')
    dirs = tuple(os.path.expanduser(os.fspath(d)) for d in directories)
    try:
        dumps = read_dirs(dirs)
    except DumpFormatError as exc:
        raise PostMortemError(str(exc)) from None
    native = tuple(read_native_dirs(dirs))
    if not dumps and native:  # only C-level stacks: every host was ended at once
        n = max(max(s.num_processes, s.process + 1) for s in native)
        return PostMortem(directories=dirs, dumps=(), num_processes=n, native_stacks=native)
    if not dumps:
        raise PostMortemError(
            f'{", ".join(dirs)}: no process-<i>.json dump there (is this the --dump-dir of a job '
            'that dumped? a job where nothing goes wrong writes none)'
        )
    n = max(max(d.num_processes for d in dumps), max(d.process for d in dumps) + 1)
    return PostMortem(directories=dirs, dumps=tuple(dumps), num_processes=n, native_stacks=native)


def _with_table(front: HostFront, dump: Dump) -> HostFront:
    """``front`` with the collective table its dump stored for its pending launch, if any."""
    pending = front.pending
    table = dump.collectives.get(pending.label) if pending is not None else None
    return front if table is None else dataclasses.replace(front, collectives=table)
