"""The replay's view: why the hosts' replicas of one launch part (`multihost.replay`).

`ReplayView` draws a `multihost.Replay`: a banner with the verdict (the stage that found a
difference: the inputs, a host's own runs, an operation, the compiled outputs, or none),
then by stage: the differing inputs or varying leaves as a list; for an operation, the
equations in op-by-op order around it (the ones evaluated just before it, those that fed it,
all agreed), the first that parted marked, each with its primitive, its outputs and its line
in the job's code and the library's; the size of the difference. A pure function of its model,
with the model's own text (`Replay.describe`) as the plain-text form.
"""

from __future__ import annotations

import ipywidgets as widgets

from mhnotebook.widgets._common import View, add_classes, banner, esc, expect_model
from multihost._models._replay import Equation, Replay
from multihost._text import short_site

#: Banner words per verdict.
_HEAD = {
    'inputs': 'the inputs already differ between hosts',
    'again': "a host's own runs of the launch differ",
    'operation': 'the first operation whose outputs part',
    'outputs': 'the compiled outputs differ, every operation agreed',
    'agree': 'the hosts agree',
}


_STYLE = {
    'parted': 'background:#fde0dc;font-weight:bold',
    'fed': 'background:#eaf5ea',
    'agreed': '',
}


def _row(e: Equation, status: str) -> str:
    where = esc(short_site(e.where)) if e.where else '<small>(no line)</small>'
    library = (
        f'<br><small>&larr; {esc(short_site(e.library))}</small>'
        if e.library and e.library != e.where
        else ''
    )
    words = {'parted': 'parts', 'fed': 'agreed; fed it', 'agreed': 'agreed'}[status]
    return (
        f'<tr class="mh-replay-eqn mh-replay-{status}" style="{_STYLE[status]}">'
        f'<td>#{e.index}</td><td><code>{esc(e.primitive)}</code></td>'
        f'<td><small>{esc(", ".join(e.outputs) or "()")}</small></td>'
        f'<td>{where}{library}</td><td><small>{esc(e.scope)}</small></td>'
        f'<td>{words}</td></tr>'
    )


def equations_html(replay: Replay) -> str:
    """The equations around the first that parted, in op-by-op order: those evaluated just
    before it and those that fed it (agreed), then it (marked); '' without one."""
    first = replay.first
    if first is None:
        return ''
    fed = {e.index for e in replay.fed_by}
    shown = {e.index: e for e in (*replay.fed_by, *replay.before)}
    rows = []
    previous = None
    for i in sorted(shown):
        if previous is not None and i > previous + 1:
            rows.append(f'<tr class="mh-replay-gap"><td colspan="6">… {i - previous - 1} '
                        'equations, agreed</td></tr>')  # fmt: skip
        rows.append(_row(shown[i], 'fed' if i in fed else 'agreed'))
        previous = i
    if previous is not None and first.index > previous + 1:
        rows.append(f'<tr class="mh-replay-gap"><td colspan="6">… {first.index - previous - 1} '
                    'equations, agreed</td></tr>')  # fmt: skip
    rows.append(_row(first, 'parted'))
    return (
        '<table class="mh-replay-table mh-table"><tr><th>#</th><th>operation</th>'
        '<th>outputs</th><th>line</th><th>in</th><th>between hosts</th></tr>'
        f'{"".join(rows)}</table>'
    )


def _details_html(replay: Replay) -> str:
    """What the stage found, besides the equations: the differing inputs or outputs, the
    varying leaves, the size of the difference."""
    lines: list[str] = []
    if replay.verdict == 'inputs' and replay.inputs is not None:
        lines += [f'<code>{esc(p)}</code>' for p in replay.inputs.differing_paths[:8]]
        lines += [esc(leaf.describe()) for leaf in replay.inputs.leaves[:3]]
    elif replay.verdict == 'again':
        lines += [
            f'process {p}: {esc(", ".join(leaves[:5]))}'
            for p, leaves in sorted(replay.varying.items())
        ]
    elif replay.verdict == 'outputs' and replay.outputs is not None:
        lines += [f'<code>{esc(p)}</code>' for p in replay.outputs.differing_paths[:8]]
    elif replay.verdict == 'operation' and replay.difference is not None:
        lines.append(esc(replay.difference.describe()))
    if replay.verdict in ('operation', 'outputs', 'agree'):
        lines.append(
            f'<small>{replay.equations} of {replay.total_equations} equations evaluated; '
            f'the compiled launch ran {replay.runs} times on each host</small>'
        )
    items = ''.join(f'<li>{line}</li>' for line in lines)
    return f'<ul class="mh-replay-details">{items}</ul>' if items else ''


class ReplayView(View):
    """A `multihost.Replay`: the verdict, then the equations around the first that parted.

    Stable CSS classes: ``mh-replay`` (the view), ``mh-replay-summary`` (the banner),
    ``mh-replay-details`` (the stage's findings), ``mh-replay-table`` (rows
    ``mh-replay-eqn``, also ``mh-replay-parted`` for the first operation whose outputs part,
    ``mh-replay-fed`` for those that fed it, ``mh-replay-agreed`` for the others; a skipped
    run of agreeing equations ``mh-replay-gap``).
    """

    def __init__(self, replay: Replay):
        expect_model('ReplayView', replay, Replay, 'multihost.replay(fn, *args) on every host')
        self.replay = replay
        head = f'replay of {esc(replay.name)}: {_HEAD.get(replay.verdict, replay.verdict)}'
        first = replay.first
        if first is not None:
            at = f' at {short_site(first.where)}' if first.where else ''
            head += f' &mdash; #{first.index} {esc(first.primitive)}{esc(at)}'
        if replay.canonical:
            head += " (host-local arguments set to process 0's, replicas to the first's)"
        kind = 'mh-ok' if replay.ok else 'mh-flagged'
        parts = [
            add_classes(widgets.HTML(banner(head, kind)), 'mh-replay-summary'),
            add_classes(widgets.HTML(_details_html(replay)), 'mh-replay-details-box'),
            add_classes(widgets.HTML(equations_html(replay)), 'mh-replay-table-box'),
        ]
        self.widget = add_classes(widgets.VBox(parts), 'mh-replay')

    def text(self) -> str:
        return self.replay.describe()
