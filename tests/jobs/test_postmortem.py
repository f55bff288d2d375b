"""``mhnotebook.postmortem`` / ``%mh_postmortem`` on the dumps of a real job (issue 20, item 3).

One real run per module: `_dump_job.py` in 4 plain processes under ``python
-m multihost run --dump-dir DIR --timeout 4``, process 2 sleeping before the
``ckpt`` barrier, so the others time out and every host dumps (the same job
`test_dumps.py` launches). Everything after reads the files only: the models,
the views, the magic in a real IPython shell, and bad directories.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _html import elements
from test_dumps import Job

import mhnotebook
from multihost._models import _dumpfile

N = 4
pytestmark = pytest.mark.slow  # plain processes of its own (not the mp_cluster harness)


@pytest.fixture(scope='module')
def dumps(tmp_path_factory: Any) -> Iterator[str]:
    """The dump directory of a job where process 2 is late to the ``ckpt`` barrier."""
    tmp = str(tmp_path_factory.mktemp('postmortem'))
    job = Job(tmp, N, '--timeout', '4', MODE='late', LATE='2', SLEEP='10')
    try:
        job.wait_started()
        found = job.dumps(N)
        deadline = time.monotonic() + 20  # a host asked first rewrites at its own timeout
        while time.monotonic() < deadline and [d.trigger for d in found].count('timeout') < 3:
            time.sleep(0.3)
            found = _dumpfile.read_dirs([job.dir])
    finally:
        job.kill_all()
    yield job.dir


def test_postmortem_models_from_the_files_alone(dumps: str) -> None:
    pm = mhnotebook.postmortem(dumps)
    assert pm.num_processes == N and pm.missing == ()
    assert [d.process for d in pm.dumps] == [0, 1, 2, 3]
    verdict = pm.verdict()
    assert verdict.culprits == (2,) and 'culprit: process 2' in str(verdict), str(verdict)
    where = pm.where()
    assert sorted(where) == [0, 1, 2, 3] and all(s.answered for s in where.values())
    front = pm.wavefront()
    assert front.silent == () and len(front.hosts) == N
    # The hosts that dumped at their timeout wait in the barrier, as the verdict says.
    assert "processes 0-1, 3 are waiting at barrier('ckpt')" in front.verdict, front.verdict
    assert 'process 2 is not there' in front.verdict and 'time.sleep' in front.verdict
    assert [r.name for r in pm.flight_records(last=2)[0]] == ['before', 'ckpt']
    assert [r.name for r in pm.flight_records()[2]][-1] == 'before'  # it never reached ckpt
    timeline = pm.timeline()
    assert timeline.hosts == (0, 1, 2, 3) and timeline.silent == () and timeline.steps
    text = repr(pm)
    assert f'4 of 4 processes dumped in {dumps}' in text
    assert 'process 0' in text and 'timeout' in text and 'process 2' in text
    # Process 2 was asked for its dump while it slept, or ended by the others' failure first
    # (a 'peer' dump): either way its line says what it was doing then.
    line = next(ln for ln in text.splitlines() if ln.startswith('  process 2 ('))
    assert ('request at' in line or 'peer at' in line) and 'time.sleep' in line, line
    if 'peer at' in line:
        assert 'ended' in line or 'ending' in line, line
        assert 'failed' in line or 'timed out waiting for it' in line, line


def test_a_missing_dump_is_named_and_silent(dumps: str, tmp_path: Any) -> None:
    a, b = tmp_path / 'a', tmp_path / 'b'
    a.mkdir()
    b.mkdir()
    for p in (0, 1):
        shutil.copy(os.path.join(dumps, _dumpfile.file_name(p)), a)
    shutil.copy(os.path.join(dumps, _dumpfile.file_name(2)), b)  # process 3's is lost
    pm = mhnotebook.postmortem(a, str(b))
    assert pm.missing == (3,)
    assert 'no dump from process 3' in repr(pm) and '3 of 4 processes dumped' in repr(pm)
    front = pm.wavefront()
    assert front.silent == (3,) and 'no dump from process 3' in front.hosts[3].error
    assert 'no dump from process 3' in str(pm.verdict())
    assert 'no dump from process 3' in pm._repr_html_()
    assert pm.timeline().silent == (3,) and sorted(pm.where()) == [0, 1, 2]
    from mhnotebook._views import where_view

    status = where_view(pm)._status.value
    assert '3 of 4 processes left a dump' in status and 'no dump from process 3' in status, status


def test_views_render_from_the_dumps(dumps: str) -> None:
    from mhnotebook._views import timeline_view, where_view

    pm = mhnotebook.postmortem(dumps)
    where = where_view(pm)
    verdict = elements(where._verdict_box.value, 'mh-where-verdict')
    assert verdict and verdict[0]['text'] == pm.wavefront().verdict, where._verdict_box.value
    assert '4 of 4 processes left a dump' in where._status.value, where._status.value
    timeline = timeline_view(pm)
    assert timeline._table.value and 'mh-timeline' in timeline._table.value


def test_a_postmortem_is_a_read_only_job_view(dumps: str) -> None:
    """The same protocol as a live job (`JobView`); stepping refused in one line that says
    why and what to use, by the view and by the stepper built on it."""
    from mhnotebook._views import stepper_view

    pm = mhnotebook.postmortem(dumps)
    assert isinstance(pm, mhnotebook.JobView) and not pm.live and not pm.running
    assert pm.supports('where') and pm.supports('flight_records') and not pm.supports('step')
    assert pm.stepping is False
    assert pm.timeline(last=5).num_processes == N
    before = None
    for ask in (
        pm.step_table,
        lambda: pm.set_stepping(True),
        pm.release,
        pm.release_all,
        lambda: pm.moved_on(before),  # type: ignore[arg-type]
        pm.stop_stepping,
        lambda: stepper_view(pm),
    ):
        with pytest.raises(mhnotebook.UnsupportedError) as exc:
            ask()
        message = str(exc.value)
        assert message.startswith('a post-mortem is read-only') and '\n' not in message
        assert dumps in message and 'mhnotebook.attach(PATH)' in message, message
        assert exc.value.feature == 'step' and exc.value.kind == 'post-mortem'


def test_mh_postmortem_magic_in_a_real_shell(dumps: str, tmp_path: Any) -> None:
    from _helpers import magic_shell
    from IPython.core.error import UsageError

    ip, _ = magic_shell(None)
    pm = ip.run_line_magic('mh_postmortem', dumps)
    assert isinstance(pm, mhnotebook.PostMortem) and pm.verdict().culprits == (2,)
    view = ip.run_line_magic('mh_postmortem', f'{dumps} --view where')
    assert type(view).__name__ == 'WhereView'
    assert type(ip.run_line_magic('mh_postmortem', f'{dumps} --view timeline')).__name__ == (
        'TimelineView'
    )
    empty = tmp_path / 'empty'
    empty.mkdir()
    bad = tmp_path / 'bad'
    bad.mkdir()
    (bad / 'process-0.json').write_text('not json')
    for args, says in (
        (str(tmp_path / 'nowhere'), 'no such directory'),
        (str(empty), 'no process-<i>.json dump there'),
        (str(bad), 'not JSON'),
    ):
        with pytest.raises(UsageError) as exc:
            ip.run_line_magic('mh_postmortem', args)
        message = str(exc.value)
        assert says in message and args in message and '\n' not in message, message
    with pytest.raises(mhnotebook.PostMortemError, match='needs a directory'):
        mhnotebook.postmortem()
    assert 'Example' in (ip.find_line_magic('mh_postmortem').__doc__ or '')
