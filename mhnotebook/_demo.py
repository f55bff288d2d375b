"""``mhnotebook demo``: the toolkit end to end on simulated hosts, written to a folder.

Starts 4 local hosts x 2 CPU devices (ipyparallel engines, one JAX process
each), then from this process, as a notebook would:

1. gathers a sharded global array and checks it is exact;
2. draws its layout (blocks coloured by host, labelled with device ids);
3. draws the layout of a "replicated" array whose hosts secretly disagree,
   with the disagreeing replicas flagged;
4. diffs a parameter pytree that drifted on one host: which leaf, which host,
   by how much;
5. catches a barrier-name divergence on every host instead of hanging;
6. shows where every host is while one of them is stuck.

Everything lands in ``OUT/`` (PNG + HTML + a text report) and is printed.
"""

from __future__ import annotations

import html
import os
import sys
import time

import numpy as np

SETUP = """
import jax, numpy as np, multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
pid = jax.process_index()
mesh = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ('host', 'dev'))
value = np.arange(16 * 12, dtype=np.float32).reshape(16, 12)
w = jax.make_array_from_callback(value.shape, NamedSharding(mesh, P('host', 'dev')),
                                 lambda i: value[i])
# Undefined behaviour JAX never reports: a P() array built from different data.
bias = multihost.host_local_array_to_global_array(
    np.linspace(0, 1, 8, dtype=np.float32) + (0.5 if pid == 2 else 0.0), mesh, P())
params = {'dense': {'kernel': np.ones((4, 4), np.float32), 'bias': np.zeros(4, np.float32)},
          'step': np.int32(100)}
if pid == 3:  # a process whose optimizer state drifted
    params['dense']['kernel'][1, 2] += 1e-3
"""

DIVERGE = """
try:
    multihost.sync_global_devices('save' if pid != 1 else 'eval', timeout=30)
    caught = None
except multihost.BarrierMismatchError as exc:
    caught = dict(exc.names)
print('caught BarrierMismatchError:', caught)
"""

STUCK = """
import time
if pid == 2:
    time.sleep(8)          # process 2 is busy elsewhere ...
multihost.barrier('after-eval', timeout=60)   # ... while the others wait here
"""


def _page(title: str, body: str) -> str:
    from mhnotebook.widgets._common import CSS

    return (
        f'<!doctype html><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'{CSS}<body style="font-family: sans-serif">{body}</body>'
    )


def run(out: str, hosts: int, devices: int) -> int:
    import mhnotebook
    from mhnotebook.widgets._treediff import diff_table_html, summary_html
    from mhnotebook.widgets._where import stacks_html, table_html
    from mhnotebook.widgets.layout.html_parts import header_html, legend_html
    from mhnotebook.widgets.layout.png import render_layout_png
    from multihost import Layout

    os.makedirs(out, exist_ok=True)
    report: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        report.append(text)

    t0 = time.perf_counter()
    with mhnotebook.start_local(hosts, devices) as session:
        # The start's progress line has said it on the terminal: the report only.
        report.append(
            f'{hosts} processes x {devices} CPU devices up in {time.perf_counter() - t0:.1f} s '
            f'(engines by process index: {session.engine_ids})'
        )
        session.execute(SETUP, timeout=300, echo=False)

        # 1. gather
        t = time.perf_counter()
        w = session.allgather('w')
        exact = np.array_equal(w, np.arange(16 * 12, dtype=np.float32).reshape(16, 12))
        say(
            f'\n1. gathered w: {w.dtype}{list(w.shape)} in {(time.perf_counter() - t) * 1e3:.1f} '
            f'ms, exact: {exact}'
        )

        # 2. layout of w
        layout, rep = session.layout('w')
        if not isinstance(layout, Layout):  # w and bias are arrays, not pytrees
            raise RuntimeError(f'session.layout of w returned {type(layout).__name__}')
        with open(os.path.join(out, 'layout_w.png'), 'wb') as f:
            f.write(render_layout_png(rep or layout))
        say(f'\n2. layout of w -> layout_w.png\n{layout}')

        # 3. replicated array whose hosts disagree
        layout_b, rep_b = session.layout('bias')
        if not isinstance(layout_b, Layout) or rep_b is None:  # check=True: a report
            raise RuntimeError('session.layout returned no replica report for bias')
        with open(os.path.join(out, 'layout_bias.png'), 'wb') as f:
            f.write(render_layout_png(rep_b))
        say(
            f'\n3. bias is P() (replicated), but replicas agree: {rep_b.ok}; '
            f'odd processes: {list(rep_b.odd_processes)} -> layout_bias.png\n{rep_b}'
        )
        with open(os.path.join(out, 'layouts.html'), 'w') as page:
            page.write(
                _page(
                    'layouts',
                    ''.join(
                        f'<h2>{name}</h2>{header_html(lay, r)}<img src="layout_{name}.png">'
                        f'{legend_html(lay)}'
                        for name, lay, r in (('w', layout, rep), ('bias', layout_b, rep_b))
                    ),
                )
            )

        # 4. tree diff
        diff = session.diff('params')
        with open(os.path.join(out, 'diff_params.html'), 'w') as page:
            page.write(_page('tree diff', summary_html(diff) + diff_table_html(diff)))
        say(f'\n4. params across hosts -> diff_params.html\n{diff.summary()}')

        # 5. divergent barrier names
        outputs = session.execute(DIVERGE, timeout=120, echo=False)
        say('\n5. hosts passing different barrier names:')
        for p, text in sorted(outputs.items()):
            say(f'   process {p}: {text.strip()}')

        # 6. where is everyone while process 2 is stuck
        pending = session.execute_async(STUCK)
        time.sleep(2.0)
        stacks = session.where()
        with open(os.path.join(out, 'where.html'), 'w') as page:
            page.write(_page('where', table_html(stacks) + stacks_html(stacks)))
        say('\n6. while process 2 is busy, where is everyone -> where.html')
        for p, s in sorted(stacks.items()):
            if s.waiting is not None:
                what = s.current.describe() if s.current else 'a collective'
                at = f'waiting {s.waiting_for:.1f} s in {what}'
            elif s.current is not None:
                at = f'not in a collective (last: {s.current.describe()})'
            else:
                at = 'no collective yet'
            say(f'   process {p}: {at}; innermost user frame {s.where}')
        session.wait_outputs(pending, timeout=120, echo=False)

    with open(os.path.join(out, 'report.txt'), 'w') as text_file:
        text_file.write('\n'.join(report) + '\n')
    print(f'\nwrote {sorted(os.listdir(out))} to {os.path.abspath(out)}')
    return 0 if exact and not rep_b.ok and not diff.ok else 1


def main(argv: list[str] | None = None, prog: str = 'mhnotebook') -> int:
    """The ``mhnotebook`` command (also ``python -m mhnotebook``): ``demo``.

    Returns the exit status: 0 when every check of the demo came out as it should, 1 when one
    did not, 2 (after one line naming the mistake) for a command line it cannot use.
    """
    from multihost._cmdline import Parser, UsageError, count

    parser = Parser(
        prog=prog,
        description='Debug multi-host JAX programs from a notebook. In a notebook: '
        '%load_ext mhnotebook, then %mh_cluster start; this command runs the toolkit end to end.',
        epilog=f'"{prog} demo --help" describes the demo\'s options.',
    )
    sub = parser.add_subparsers(dest='command', metavar='COMMAND', parser_class=Parser)
    demo = sub.add_parser(
        'demo',
        help='The toolkit end to end on simulated local hosts, written to a folder.',
        description='Start simulated hosts (ipyparallel engines, one JAX process each), then, '
        'as a notebook would: gather a sharded array, draw its layout, flag replicas that '
        'disagree, diff a pytree that drifted on one host, catch a barrier-name divergence and '
        'show where every host is while one is stuck. Writes PNG, HTML and a text report.',
    )
    demo.add_argument(
        '--out',
        default='mhnotebook-demo',
        metavar='DIR',
        help='The folder the pictures, pages and report are written to (default: %(default)s).',
    )
    demo.add_argument(
        '--hosts',
        type=count,
        default=4,
        metavar='N',
        help='How many simulated hosts (engines, one JAX process each) to start '
        '(default: %(default)s).',
    )
    demo.add_argument(
        '--devices',
        type=count,
        default=2,
        metavar='D',
        help='How many CPU devices each simulated host has (default: %(default)s).',
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        if args.command is None:
            parser.error('name a command: demo')
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    return run(args.out, args.hosts, args.devices)


if __name__ == '__main__':
    sys.exit(main())
