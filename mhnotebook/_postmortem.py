"""``mhnotebook.postmortem(DIR...)``: a dead (or stuck) job's story from its dump files alone.

Each host of a job run with ``--dump-dir DIR`` wrote ``DIR/process-<i>.json``
(`multihost._job._dumpfile`). `postmortem` reads them into a `PostMortem`:
the same models a `Session` or an `AttachedJob` answers (`where`, `wavefront`,
`records`, `timeline`), so the same views (`_views.where_view`,
`timeline_view`) show them, and `verdict` is what ``python -m multihost
analyze`` prints. No cluster, no process is reached: the files are all.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from mhnotebook._errors import SessionError

if TYPE_CHECKING:
    from multihost import FlightRecord, HostStacks, Timeline, Wavefront
    from multihost._job._analyze import Verdict
    from multihost._job._dumpfile import Dump

__all__ = ['PostMortem', 'PostMortemError', 'postmortem']


class PostMortemError(SessionError):
    """Dump directories that cannot be read: one line naming the path and what to give."""


@dataclasses.dataclass(frozen=True)
class PostMortem:
    """What a job's dumps say, by process.

    Attributes:
        directories: the directories read.
        dumps: one `Dump` per process that wrote one, in process order.
        num_processes: the job's size (the largest any dump names).
    """

    directories: tuple[str, ...]
    dumps: tuple[Dump, ...]
    num_processes: int

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

    # -- the models a Session answers (the keyword arguments are accepted, unused) ----
    def where(self, *, timeout: float = 0.0) -> dict[int, HostStacks]:
        """Each dumped host's stacks, as it wrote them (one that dumped at its timeout:
        waiting in the check that failed, as the verdict says, `_analyze.at_dump`)."""
        from multihost._job._analyze import at_dump

        del timeout
        return {d.process: at_dump(d)[1] for d in self.dumps}

    def wavefront(self, *, timeout: float = 0.0) -> Wavefront:
        """Every host's position at its dump (as the verdict reads it, `_analyze.at_dump`);
        a host without a dump is silent, and why."""
        from multihost import Wavefront
        from multihost._debug._wavefront import HostFront
        from multihost._job._analyze import at_dump

        del timeout
        by = {d.process: at_dump(d)[0] for d in self.dumps}
        hosts = tuple(
            by.get(p) or HostFront(process=p, answered=False, error=self._why_missing(p))
            for p in range(self.num_processes)
        )
        written = max((d.written for d in self.dumps), default=time.time())
        return Wavefront(hosts=hosts, time=written)

    def records(self, *, last: int = 200, timeout: float = 0.0) -> dict[int, list[FlightRecord]]:
        """Each dumped host's last ``last`` flight records, oldest first."""
        del timeout
        return {d.process: list(d.records[-last:]) if last else [] for d in self.dumps}

    def timeline(self, *, last: int = 200, timeout: float = 0.0) -> Timeline:
        """The hosts' records aligned into steps (hosts without a dump are silent)."""
        from multihost import Timeline

        del timeout
        return Timeline.build(self.records(last=last), self.num_processes)

    def verdict(self) -> Verdict:
        """The ``python -m multihost analyze`` verdict (``str()`` of it is its text)."""
        from multihost._job._analyze import analyze

        return analyze(list(self.dumps))

    # -- summary ---------------------------------------------------------------------
    def summary(self) -> list[str]:
        """One line for the job, one per dump (its trigger), one per missing dump."""
        dirs = ', '.join(self.directories)
        lines = [f'{len(self.dumps)} of {self.num_processes} processes dumped in {dirs}']
        for d in self.dumps:
            at = time.strftime('%H:%M:%S', time.localtime(d.trigger_time or d.written))
            lines.append(f'  process {d.process} ({d.hostname}): {d.trigger} at {at}')
        lines.extend(f'  {self._why_missing(p)}' for p in self.missing)
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
    from multihost._job._dumpfile import DumpFormatError, read_dirs

    if not directories:
        raise PostMortemError('postmortem needs a directory: the --dump-dir the job was run with')
    dirs = tuple(os.path.expanduser(os.fspath(d)) for d in directories)
    try:
        dumps = read_dirs(dirs)
    except DumpFormatError as exc:
        raise PostMortemError(str(exc)) from None
    if not dumps:
        raise PostMortemError(
            f'{", ".join(dirs)}: no process-<i>.json dump there (is this the --dump-dir of a job '
            'that dumped? a job where nothing goes wrong writes none)'
        )
    n = max(max(d.num_processes for d in dumps), max(d.process for d in dumps) + 1)
    return PostMortem(directories=dirs, dumps=tuple(dumps), num_processes=n)
