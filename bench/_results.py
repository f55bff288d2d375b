"""Where benchmark results live: one file per script and device kind, saying how it was made.

``save('tpu_fingerprints', result)`` writes ``bench/results/<device kind>/tpu_fingerprints.json``
(the kind as jax names it, e.g. ``TPU v5 lite`` -> ``tpu-v5-lite``; ``cpu`` on a CPU), with a
``run`` entry: the commit, whether the tree had uncommitted changes, the command line, the
date (UTC) and the versions. ``MH_BENCH_COMMIT`` and ``MH_BENCH_DIRTY`` (``0``/``1``) name
them where the tree's ``.git`` is not its own (the TPU machine's copy carries a stale one).

``python bench/_results.py`` rewrites ``bench/results/README.md``: the table of the current
result of each script per device kind. A new run replaces its file; git keeps the old one.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(_HERE, 'results')


def kind_folder(device_kind: str) -> str:
    """``TPU v5 lite`` -> ``tpu-v5-lite``: the folder of a device kind's results."""
    return re.sub(r'[^a-z0-9.]+', '-', device_kind.lower()).strip('-') or 'unknown'


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ['git', *args], cwd=_HERE, capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def provenance() -> dict[str, Any]:
    """The commit, dirtiness, command line, date and versions of this run."""
    import jax
    import jaxlib
    import numpy as np

    commit = os.environ.get('MH_BENCH_COMMIT')  # set where the copy's .git is not its own
    if commit:
        dirty = {'1': True, '0': False}.get(os.environ.get('MH_BENCH_DIRTY', ''))
    else:
        commit = _git('rev-parse', 'HEAD') or 'unknown'
        dirty = bool(_git('status', '--porcelain', '--untracked-files=no'))
    return {
        'commit': commit,
        'dirty': dirty,
        'command': ' '.join(
            ['python', os.path.relpath(sys.argv[0], os.path.dirname(_HERE))] + sys.argv[1:]
        ),  # fmt: skip
        'date': datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC'),
        'python': sys.version.split()[0],
        'jax': jax.__version__,
        'jaxlib': jaxlib.__version__,
        'numpy': np.__version__,
        'machine': platform.machine(),
        'cpus': os.cpu_count(),
    }


def save(script: str, result: dict[str, Any], device_kind: str, path: str = '') -> str:
    """Writes ``result`` with its provenance to ``path`` (default: the kind's folder)."""
    if not path:
        path = os.path.join(ROOT, kind_folder(device_kind), f'{script}.json')
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump({'run': provenance(), 'device_kind': device_kind, **result}, f, indent=1)
        f.write('\n')
    return path


def index() -> str:
    """The README table: every result file, its commit, date and command."""
    lines = [
        '# Benchmark results',
        '',
        'The current result of each script per device kind, written by the script itself',
        '(`bench/_results.py`); this table by `python bench/_results.py`. Older results are in',
        "git's history of these files.",
        '',
        '| device kind | script | commit | tree | date | command |',
        '|---|---|---|---|---|---|',
    ]
    for kind in sorted(os.listdir(ROOT)) if os.path.isdir(ROOT) else []:
        folder = os.path.join(ROOT, kind)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith('.json'):
                continue
            with open(os.path.join(folder, name)) as f:
                run = json.load(f).get('run', {})
            tree = {True: 'dirty', False: 'clean'}.get(run.get('dirty'), '?')
            lines.append(
                f'| {kind} | [{name}]({kind}/{name}) | {str(run.get("commit", "?"))[:10]} | '
                f'{tree} | {run.get("date", "?")} | `{run.get("command", "?")}` |'
            )
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    os.makedirs(ROOT, exist_ok=True)
    with open(os.path.join(ROOT, 'README.md'), 'w') as f:
        f.write(index())
    print(index())
