"""Analyze time on synthetic dumps: ``python bench/analyze.py [--hosts 1000]``.

Writes one dump per host (tests/_dump_cases.py: a job where two hosts are
behind and one wrote nothing) into a temporary directory with the real writer,
then times ``read_dirs`` (reading and validating every file) and ``analyze`` +
formatting, the median of 3 runs, and prints the verdict once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from multihost._models import _analyze, _dumpfile  # noqa: E402
from tests import _dump_cases  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hosts', type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for doc in _dump_cases.job_dumps(args.hosts):
            _dumpfile.write(d, doc)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        reads, verdicts = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            dumps = _dumpfile.read_dirs([d])
            t1 = time.perf_counter()
            lines = _analyze.analyze(dumps).lines()
            t2 = time.perf_counter()
            reads.append(t1 - t0)
            verdicts.append(t2 - t1)
    print(f'{len(dumps)} dumps, {size / 1e6:.1f} MB, {_dump_cases.RECORDS} records each')
    print(f'read + validate: {statistics.median(reads):.2f} s; analyze + format: '
          f'{statistics.median(verdicts) * 1e3:.0f} ms; verdict {len(lines)} lines:')  # fmt: skip
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
