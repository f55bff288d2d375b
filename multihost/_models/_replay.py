"""What a replay found: where the hosts' replicas of one launch part (`multihost.replay`).

A launch is replayed on every host in three stages, each answering one cause:

1. **inputs**: the arguments already differ between hosts that should agree (a host's own
   data, the data order, an earlier step);
2. **again**: the compiled launch, run again on copies of the same arguments, gives another
   result on the same host (a transient fault, a non-deterministic operation);
3. **op by op**: the launch's jaxpr evaluated one equation at a time on every host, each
   equation's outputs compared between the hosts that hold replicas of them; the first
   equation whose outputs part is named with its line (a host-dependent callback or constant,
   a faulty chip). On one process, two op-by-op runs of the same host are compared.

numpy and the standard library only (a model: frozen, picklable, no jax).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multihost._models._treediff import LeafDiff, TreeDiff

#: `Replay.verdict` values, in the order the stages run.
VERDICTS = ('inputs', 'again', 'operation', 'outputs', 'agree')
#: Equations kept in `Replay.before`.
BEFORE = 12


@dataclass(frozen=True)
class Equation:
    """One equation of a replayed launch, as evaluated op by op.

    Attributes:
        index: its position in the op-by-op order (0-based, nested calls entered).
        primitive: the JAX primitive's name (``'dot_general'``, ``'pure_callback'``).
        scope: the calls it sits in, outermost first (``'train_step > loss_fn'``).
        inputs: its operands' types (``'f32[8,512]'``).
        outputs: its results' types.
        where: its line in the job's own code (``'train.py:88 in loss_fn'``), '' if unknown.
        library: the innermost frame in a library that is not JAX
            (``'flax/linen/linear.py:270 in __call__'``), '' if none.
    """

    index: int
    primitive: str
    scope: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    where: str = ''
    library: str = ''

    def describe(self) -> str:
        """``#412 dot_general -> f32[8,512] at train.py:88 in loss_fn <- flax/...``."""
        text = f'#{self.index} {self.primitive} -> {", ".join(self.outputs) or "()"}'
        if self.where:
            text += f' at {self.where}'
        if self.library and self.library != self.where:
            text += f' <- {self.library}'
        if self.scope:
            text += f' (in {self.scope})'
        return text


@dataclass(frozen=True)
class Replay:
    """Where one launch's replicas part between hosts, and at which stage.

    Every host gets an equal `Replay`.

    Attributes:
        name: the replayed function's name.
        num_processes: hosts that replayed it.
        verdict: the first stage that found a difference: ``'inputs'`` (the arguments
            differ: `inputs`), ``'again'`` (a host's own runs differ: `varying`),
            ``'operation'`` (the first equation whose outputs part: `first`),
            ``'outputs'`` (the compiled launch's outputs differ between hosts while every
            equation evaluated op by op agreed), or ``'agree'``.
        inputs: the arguments compared between hosts (None on one process).
        canonical: every host's host-local arguments were replaced by process 0's, and
            the differing replicas of global arrays by the first replica in their mesh,
            before the launch was run (`replay(..., canonical=True)`).
        runs: how many times the compiled launch ran on each host.
        varying: host -> the output leaves whose value changed between its own runs.
        outputs: the compiled launch's first run's outputs compared between hosts (None on
            one process).
        equations: equations evaluated op by op (0 when that stage did not run).
        total_equations: equations in the launch (nested calls entered).
        first: the first equation whose outputs part (None if none did).
        difference: that equation's differing output, between hosts (None on one process,
            where the two runs' digests differ).
        fed_by: the equations whose outputs it read (all agreed), in order.
        before: the equations evaluated just before it (at most `BEFORE`; all agreed), in
            order: what the op-by-op view lists above it.
        seconds: the time of each stage.
    """

    name: str
    num_processes: int
    verdict: str
    inputs: TreeDiff | None = None
    canonical: bool = False
    runs: int = 0
    varying: dict[int, tuple[str, ...]] = field(default_factory=dict)
    outputs: TreeDiff | None = None
    equations: int = 0
    total_equations: int = 0
    first: Equation | None = None
    difference: LeafDiff | None = None
    fed_by: tuple[Equation, ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)
    before: tuple[Equation, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the hosts agree at every stage."""
        return self.verdict == 'agree'

    def describe(self) -> str:
        """The verdict in a few lines, the cause first."""
        hosts = f'{self.num_processes} processes' if self.num_processes > 1 else 'one process'
        head = f'replay of {self.name} on {hosts}'
        if self.canonical:
            head += " (host-local arguments set to process 0's, replicas to the first's)"
        lines = [head + ':']
        if self.verdict == 'inputs' and self.inputs is not None:
            paths = ', '.join(self.inputs.differing_paths[:5])
            lines.append(f'  inputs differ between hosts: {paths}')
            lines += ['    ' + leaf.describe() for leaf in self.inputs.leaves[:3]]
            lines.append(
                '  the launch was not replayed further: its inputs already part '
                "(replay(..., canonical=True) runs it on process 0's host-local arguments)"
            )
            return '\n'.join(lines)
        if self.verdict == 'again':
            for p, leaves in sorted(self.varying.items()):
                lines.append(
                    f'  process {p} gave other results when the same launch ran again '
                    f'({self.runs} runs): {", ".join(leaves[:5])}'
                )
            lines.append('  a transient fault or a non-deterministic operation on that host')
            return '\n'.join(lines)
        if self.verdict == 'operation' and self.first is not None:
            between = 'hosts' if self.num_processes > 1 else 'two runs of this host'
            lines.append(f'  first operation whose outputs differ between {between}:')
            lines.append(f'    {self.first.describe()}')
            if self.difference is not None:
                lines.append(f'    {self.difference.describe()}')
            if self.fed_by:
                fed = ', '.join(f'#{e.index} {e.primitive}' for e in self.fed_by[:6])
                lines.append(f'    its inputs agreed (made by {fed})')
            else:
                lines.append("    its inputs agreed (the launch's arguments or constants)")
            lines.append(f'  ({self.equations} of {self.total_equations} equations evaluated)')
            return '\n'.join(lines)
        if self.verdict == 'outputs' and self.outputs is not None:
            paths = ', '.join(self.outputs.differing_paths[:5])
            lines.append(
                f'  the compiled launch gives different outputs between hosts ({paths}), '
                f'but all {self.equations} equations agreed op by op: the difference comes '
                'from how the program was compiled (compare the hosts with --check-jit)'
            )
            return '\n'.join(lines)
        lines.append(
            f'  the hosts agree: inputs, {self.runs} runs of the compiled launch, and '
            f'{self.equations} equations op by op'
        )
        return '\n'.join(lines)

    __str__ = describe
