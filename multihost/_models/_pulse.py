"""How busy a host was over a recent window (`Pulse`): busy told from wedged, as plain data.

Built by the sampler (`multihost._debug._pulse`) on the host, carried by `HostFront` and
`HostStacks`, read back from dumps. Format of `Pulse.words`: ``N% CPU over the last S s``
(the process's CPU time over wall time: 100% is one core busy; XLA's threads included),
then ``, stack moving`` or ``, stack unchanged`` (the main thread's Python stack, sampled
about once a second), then the state: ``progressing`` or ``wedged``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: At or above this share of one core a host is busy (below it, its own threads idle).
BUSY_PCT = 5.0
#: Activities (`HostFront.activity_kind`) that wait for the other hosts: busy or wedged
#: says nothing of a host there, so its pulse is not put in words.
WAITING_KINDS = ('coordination', 'device')


@dataclasses.dataclass(frozen=True)
class Pulse:
    """One host's CPU share and stack motion over the last ``window`` seconds.

    Attributes:
        window: the seconds the figures cover (between two samples of the host).
        cpu: the process's CPU time over that wall time, percent (100: one core).
        main_cpu: the main thread's alone, percent (None: not readable here).
        moved: whether the main thread's Python stack changed in the window (None:
            the main thread was not seen).
        samples: how many samples the window holds.
    """

    window: float
    cpu: float
    main_cpu: float | None = None
    moved: bool | None = None
    samples: int = 2

    @property
    def progressing(self) -> bool:
        """It uses CPU or its stack moves (a host doing neither is wedged)."""
        return self.cpu >= BUSY_PCT or bool(self.moved)

    @property
    def state(self) -> str:
        """``'progressing'`` or ``'wedged'``."""
        return 'progressing' if self.progressing else 'wedged'

    @property
    def words(self) -> str:
        """``'0% CPU over the last 5 s, stack unchanged: wedged'``."""
        main = ''
        if self.main_cpu is not None and abs(self.main_cpu - self.cpu) >= BUSY_PCT:
            main = f' (main thread {self.main_cpu:.0f}%)'
        stack = {True: ', stack moving', False: ', stack unchanged', None: ''}[self.moved]
        return f'{self.cpu:.0f}% CPU over the last {self.window:.0f} s{main}{stack}: {self.state}'

    @property
    def brief(self) -> str:
        """The state with its reason and no figures (what hosts in a group share):
        ``'wedged (no CPU, stack unchanged)'``, ``'progressing (busy CPU)'``."""
        if not self.progressing:
            return 'wedged (no CPU, stack unchanged)' if self.moved is False else 'wedged (no CPU)'
        return 'progressing (busy CPU)' if self.cpu >= BUSY_PCT else 'progressing (stack moving)'

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Pulse | None:
        if not isinstance(d, dict):
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
