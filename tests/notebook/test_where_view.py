"""The "where" view, readable: words for what each host does, state groups, folded frames.

Synthetic `HostStacks` models (no cluster): an ipyparallel engine's real-looking
main thread (runpy, ipyparallel, tornado, asyncio, ipykernel, IPython frames
around a notebook cell, multihost and threading frames inside a barrier), in
ten states. The browser tests open the view's static picture in headless
Chromium and measure it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from html import unescape

import ipykernel
import jax
import pytest
from _browser import chromium, show_static
from _html import elements, inside, one
from _view_models import host_stacks, record

from mhnotebook.widgets import WhereView, _where
from multihost import CollectiveRecord, FlightRecord, HostStacks, ThreadStack, _recorder
from multihost._cells import cell_number, is_cell
from multihost._debug import _stacks
from multihost._exchange import _kv as kv_module
from multihost._models._stacks import frame_package, framework_summary, is_user_frame
from multihost._text import fmt_duration

# -- synthetic models --------------------------------------------------------------------

SITE = '/opt/venv/lib/python3.11/site-packages'
STD = '/usr/lib/python3.11'
#: An ipyparallel engine's main thread down to the cell it runs (22 framework frames).
ENGINE = (
    ('<frozen runpy>', 198, '_run_module_as_main', ''),
    ('<frozen runpy>', 88, '_run_code', ''),
    (f'{SITE}/ipyparallel/engine/__main__.py', 4, '<module>', 'main()'),
    (f'{SITE}/ipyparallel/apps/baseapp.py', 120, 'launch_new_instance', 'app.start()'),
    (f'{SITE}/ipyparallel/engine/app.py', 960, 'start', 'self.loop.start()'),
    (f'{SITE}/tornado/platform/asyncio.py', 205, 'start', 'self.asyncio_loop.run_forever()'),
    (f'{STD}/asyncio/base_events.py', 607, 'run_forever', 'self._run_once()'),
    (f'{STD}/asyncio/base_events.py', 1922, '_run_once', 'handle._run()'),
    (f'{STD}/asyncio/events.py', 80, '_run', 'self._context.run(self._callback, *self._args)'),
    (f'{SITE}/ipykernel/kernelbase.py', 545, 'dispatch_queue', 'await self.process_one()'),
    (f'{SITE}/ipykernel/kernelbase.py', 534, 'process_one', 'await dispatch(*args)'),
    (f'{SITE}/ipykernel/kernelbase.py', 437, 'dispatch_shell', 'await result'),
    (f'{SITE}/ipyparallel/engine/kernel.py', 190, 'execute_request', 'await super()...'),
    (f'{SITE}/ipykernel/kernelbase.py', 778, 'execute_request', 'reply = await reply'),
    (f'{SITE}/ipykernel/ipkernel.py', 449, 'do_execute', 'res = shell.run_cell('),
    (f'{SITE}/ipykernel/zmqshell.py', 549, 'run_cell', 'return super().run_cell(*args)'),
    (f'{SITE}/IPython/core/interactiveshell.py', 3075, 'run_cell', 'result = self._run_cell('),
    (f'{SITE}/IPython/core/interactiveshell.py', 3130, '_run_cell', 'result = runner(coro)'),
    (f'{SITE}/IPython/core/async_helpers.py', 128, '_pseudo_sync_runner', 'coro.send(None)'),
    (f'{SITE}/IPython/core/interactiveshell.py', 3334, 'run_cell_async', 'await self.run_ast'),
    (f'{SITE}/IPython/core/interactiveshell.py', 3517, 'run_ast_nodes', 'await self.run_code'),
    (f'{SITE}/IPython/core/interactiveshell.py', 3577, 'run_code', 'exec(code_obj, ns, ns)'),
)
#: An idle engine: its event loop waits for the next request.
IDLE = ENGINE[:9] + ((f'{STD}/selectors.py', 468, 'select', 'self._selector.poll(timeout)'),)
#: Inside multihost.barrier (5 framework frames).
BARRIER = (
    ('/work/src/multihost/_collectives.py', 120, 'barrier', '_sequence.enter('),
    ('/work/src/multihost/_sequence.py', 380, 'enter', 'verdict, raw = _kv.round_('),
    ('/work/src/multihost/_kv.py', 610, 'round_', 'done.wait(0.5)'),
    (f'{STD}/threading.py', 629, 'wait', 'signaled = self._cond.wait(timeout)'),
    (f'{STD}/threading.py', 331, 'wait', 'gotit = waiter.acquire(True, timeout)'),
)
LOADER = ThreadStack(
    'loader',
    3,
    False,
    True,
    (
        (f'{STD}/threading.py', 1002, '_bootstrap', 'self._bootstrap_inner()'),
        ('/home/u/proj/data.py', 51, 'prefetch', 'item = q.get()'),
        (f'{STD}/queue.py', 171, 'get', 'self.not_empty.wait()'),
    ),
)
NOW = 1.7e9
STATES = 10


def cell_file(p):
    """ipykernel's file for the same cell on host p: a directory per host pid."""
    return f'/tmp/ipykernel_{1000 + p}/2471934.py'


def cell(p, line, source):
    return (cell_file(p), line, '<module>', source)


def rec(seq, p, name, kind='barrier'):
    return CollectiveRecord(
        seq=seq, kind=kind, name=name, digest='', site='train.py:3', time=NOW - 20, process=p
    )


def flight(n, p, name, *, kind='barrier', seq=None, state='waiting', call=-1):
    return FlightRecord(
        n=n,
        kind=kind,
        name=name,
        call=call,
        seq=seq,
        digest='',
        fingerprint='',
        site='train.py:3',
        time=NOW - 12,
        wait=None,
        state=state,
        process=p,
    )


def main(frames):
    return (ThreadStack('MainThread', 1, True, False, frames), LOADER)


def host(p, state, *, waited=12.0, idle=20.0):
    """Host p in one of ten states (0-9)."""
    base = dict(
        process=p,
        answered=True,
        hostname=f'node{p // 8}',
        os_pid=4000 + p,
        time=NOW,
        engine=True,
        cells=((cell_file(p), 4),),
        idle=idle,
    )
    at_barrier = ENGINE + (cell(p, 3, "multihost.barrier('after-eval')"),) + BARRIER
    passed = dict(current=rec(6, p, 'load'), last=flight(39, p, 'load', seq=6, state='passed'))
    after_eval = flight(40, p, 'after-eval', seq=7)

    def waiting_at(current, check, frames, **gate):
        """Host p inside ``check`` (its last flight record) for ``waited`` s, in ``frames``."""
        return HostStacks(
            **base,
            current=current,
            waiting=check,
            waiting_for=waited,
            last=check,
            threads=main(frames),
            **gate,
        )

    if state == 0:
        return waiting_at(rec(7, p, 'after-eval'), after_eval, at_barrier)
    if state == 1:
        gather = flight(41, p, 'x', kind='process_allgather', seq=8)
        frames = ENGINE + (cell(p, 5, 'y = multihost.process_allgather(x)'),) + BARRIER
        return waiting_at(rec(8, p, 'x', kind='process_allgather'), gather, frames)
    if state == 2:
        return waiting_at(rec(7, p, 'after-eval'), after_eval, at_barrier, gate=7, stepping=True)
    if state == 3:
        frames = ENGINE + (
            cell(p, 2, 'params = load_shard(path)'),
            ('/home/u/proj/train.py', 88, 'load_shard', 'data = np.load(path)'),
        )
        return HostStacks(**base, **passed, threads=main(frames))
    if state == 4:
        return HostStacks(**base, **passed, threads=main(ENGINE + (cell(p, 3, 'time.sleep(60)'),)))
    if state == 5:
        return HostStacks(**base, **passed, threads=main(IDLE))
    if state == 6:
        return HostStacks(
            process=p,
            answered=False,
            current=rec(6, p, 'load'),
            error='no answer within 10 s (process dead, frozen, or its debug thread stopped)',
        )
    if state == 7:
        step = flight(42, p, 'train_step', kind='launch', seq=9, call=412)
        frames = ENGINE + (cell(p, 7, 'state = train_step(state, batch)'),) + BARRIER
        return waiting_at(rec(9, p, 'train_step', kind='launch'), step, frames)
    if state == 8:
        frames = ENGINE + (
            cell(p, 2, 'params = load_shard(path)'),
            ('/home/u/proj/data.py', 20, 'read', 'return f.read()'),
        )
        return HostStacks(**base, **passed, threads=main(frames))
    # a cell whose number the host's IPython did not say
    return HostStacks(
        **{**base, 'cells': ()},
        **passed,
        threads=main(ENGINE + (cell(p, 1, 'while True: pass'),)),
    )


def state_of(p, n):
    """Half the hosts at the barrier; the others spread over every state."""
    return 0 if p < n // 2 else (p * 7) % STATES


def many(n=1000):
    """``n`` hosts in ten states, with durations that differ within a state."""
    return {p: host(p, state_of(p, n), waited=12.0 + p % 2, idle=20.0 + p % 3) for p in range(n)}


def four():
    """Hosts 0, 1 at barrier('after-eval'), 2 loading a shard, 3 silent."""
    return {p: host(p, s) for p, s in enumerate([0, 0, 3, 6])}


# -- frames: user code or framework ----------------------------------------------------------


@pytest.mark.parametrize(
    'filename, package',
    [
        ('<frozen runpy>', 'runpy'),
        ('<frozen importlib._bootstrap>', 'importlib'),
        (f'{SITE}/ipyparallel/engine/kernel.py', 'ipyparallel'),
        (f'{SITE}/ipykernel/kernelbase.py', 'ipykernel'),
        (f'{SITE}/IPython/core/interactiveshell.py', 'IPython'),
        (f'{SITE}/tornado/platform/asyncio.py', 'tornado'),
        ('/usr/lib/python3/dist-packages/zmq/sugar/socket.py', 'zmq'),
        (f'{SITE}/jax/_src/dispatch.py', 'jax'),
        (f'{SITE}/jaxlib/xla_client.py', 'jaxlib'),
        (f'{SITE}/six.py', 'six'),
        (f'{STD}/asyncio/events.py', 'asyncio'),
        (f'{STD}/threading.py', 'threading'),
        (f'{STD}/concurrent/futures/thread.py', 'concurrent'),
        (f'{STD}/runpy.py', 'runpy'),
        ('/usr/local/lib/python3.13t/selectors.py', 'selectors'),
        ('C:\\Python311\\Lib\\asyncio\\events.py', 'asyncio'),
        ('/work/src/multihost/_kv.py', 'multihost'),  # an editable checkout
        ('/work/src/mhnotebook/_trampoline.py', 'mhnotebook'),
        ('/tmp/ipykernel_1234/123456.py', None),
        ('<ipython-input-4-0123abcd>', None),
        ('/home/u/proj/train.py', None),
        ('C:\\Users\\u\\train.py', None),
        ('<string>', None),
    ],
)
def test_frame_package_classifies_by_file_name(filename, package):
    """Framework frames are named by their package; cells and the user's files are None."""
    assert frame_package(filename) == package
    assert is_user_frame((filename, 1, 'f', '')) == (package is None)


def test_frame_package_of_the_real_modules():
    """The installed frameworks' own files (this venv) classify as framework."""
    for module, package in (
        (asyncio, 'asyncio'),
        (threading, 'threading'),
        (json, 'json'),
        (ipykernel, 'ipykernel'),
        (jax, 'jax'),
        (kv_module, 'multihost'),
        (_where, 'mhnotebook'),
    ):
        assert frame_package(module.__file__) == package, module.__file__
    import mhnotebook
    import multihost

    # this test file is user code (a file in a folder named like a package is not that
    # package once the packages' own folders are known, as the hosts give them)
    ours = tuple(os.path.dirname(m.__file__) + os.sep for m in (multihost, mhnotebook))
    assert frame_package(__file__, ours) is None
    assert frame_package(_where.__file__, ours) == 'mhnotebook'


def test_cells_and_their_numbers():
    """Cell files are recognised; only <ipython-input-N-...> carries its number; a cell reads
    as IPython says it (Cell In[4], line 3), on an engine as on a kernel."""
    assert is_cell('/tmp/ipykernel_1234/123456.py') and is_cell('<ipython-input-4-0a1b>')
    assert not is_cell('/tmp/ipykernel_1234/notes.py') and not is_cell('/home/u/123.py')
    assert cell_number('<ipython-input-4-0a1b>') == 4
    assert cell_number('/tmp/ipykernel_1234/123456.py') is None
    engine = host(0, 4)
    assert engine.frame_label(cell(0, 3, 'x')) == 'Cell In[4], line 3'
    kernel = HostStacks(**{**engine.__dict__, 'engine': False})
    assert kernel.frame_label(cell(0, 3, 'x')) == 'Cell In[4], line 3'
    unknown = host(0, 9)  # no cell numbers from its IPython
    assert unknown.frame_label(cell(0, 3, 'x')) == 'a notebook cell, line 3'
    assert unknown.frame_label(('<ipython-input-7-ab>', 2, 'f', '')) == 'Cell In[7], line 2 in f'
    assert unknown.frame_label(('/home/u/proj/data.py', 20, 'read', '')) == 'data.py:20 in read'


def test_framework_summary_names_the_most_frequent_packages():
    """The folded line counts framework frames and names the commonest packages."""
    frames = ENGINE + (cell(0, 3, 'x'),) + BARRIER
    assert framework_summary(frames) == '27 framework frames (ipykernel, IPython, ipyparallel, ...)'
    assert framework_summary(BARRIER, names=5) == '5 framework frames (multihost, threading)'
    assert framework_summary((cell(0, 3, 'x'),)) == '0 framework frames'
    assert fmt_duration(0.25) == '250 ms' and fmt_duration(12.4) == '12 s'
    assert fmt_duration(600) == '10 min' and fmt_duration(-0.1) == '0 ms'


# -- what a host is doing, in words -------------------------------------------------------------


def test_doing_says_what_each_state_is_doing_now():
    """One sentence per state; a host that left its last collective is not shown inside it."""
    words = {s: host(0, s).doing for s in range(STATES)}
    assert words == {
        0: "waiting at barrier('after-eval') #7 for 12 s",
        1: "waiting at process_allgather('x') #8 for 12 s",
        2: "waiting for release of #7 (barrier('after-eval')) for 12 s",
        3: "running user code at train.py:88 in load_shard, last collective barrier('load') #6 "
        '(20 s ago)',
        4: 'in user code at Cell In[4], line 3, in time.sleep, last collective '
        "barrier('load') #6 (20 s ago)",
        5: "idle (no user code running), last collective barrier('load') #6 (20 s ago)",
        6: 'no answer within 10 s (process dead, frozen, or its debug thread stopped); '
        "last published barrier('load') #6",
        7: 'waiting at the cross-host check of launch train_step call #412 for 12 s',
        8: "running user code at data.py:20 in read, last collective barrier('load') #6 (20 s ago)",
        9: "running user code at a notebook cell, line 1, last collective barrier('load') #6 "
        '(20 s ago)',
    }
    activities = [host(0, s).activity for s in range(STATES)]
    assert activities == [
        'waiting',
        'waiting',
        'paused',
        'running',
        'running',
        'idle',
        'no answer',
        'waiting',
        'running',
        'running',
    ]


def test_doing_without_flight_records():
    """A model without flight records (an older engine) names its last collective and its age."""
    s = HostStacks(
        process=0,
        answered=True,
        current=rec(4, 0, 'b'),
        time=NOW,
        threads=main(ENGINE + (cell(0, 3, 'train()'),)),
    )
    assert s.doing == (
        "running user code at a notebook cell, line 3, last collective barrier('b') #4 "
        '(entered 20 s ago)'
    )
    bare = HostStacks(process=1, answered=True, where='train.py:9 in f')
    assert bare.doing == 'running user code at train.py:9 in f, no collective yet'
    assert HostStacks(process=2, answered=True).doing == 'main thread not seen, no collective yet'
    assert HostStacks(process=3, answered=False, error='gone').doing == 'no answer: gone'


def test_state_ignores_durations_pids_and_cell_directories():
    """Hosts at the same check (or frame) share a state although their cell files and
    durations differ; another check, frame or gate is another state."""
    a, b = host(0, 0, waited=3.0), host(5, 0, waited=40.0)
    assert cell_file(0) != cell_file(5) and a.state == b.state
    assert len({host(p, s).state for p in (0, 1) for s in range(STATES)}) == STATES
    assert host(0, 3).state != host(0, 8).state  # same cell, other innermost frame


def test_host_stacks_json_round_trip_with_flight_records():
    """Waiting and last flight records, durations, cells survive the key-value store's JSON."""
    for s in (host(3, 0), host(3, 7), host(3, 6), host(3, 9)):
        back = HostStacks.from_json(s.to_json())
        assert back == s and back.doing == s.doing and back.state == s.state
    assert isinstance(HostStacks.from_json(host(3, 0).to_json()).waiting, FlightRecord)


def test_capture_reads_the_flight_recorder():
    """capture(): a host inside a recorded check is waiting there; after it, running again."""
    entry = _recorder.note('barrier', 'probe', seq=None, digest='', site='here.py:1')
    try:
        time.sleep(0.05)
        s = _stacks.capture(0)
        assert s.activity == 'waiting' and s.waiting is not None
        assert s.waiting.name == 'probe' and s.waiting_for >= 0.05
        assert s.doing.startswith("waiting at barrier('probe') for ")
        assert HostStacks.from_json(s.to_json()) == s
    finally:
        _recorder.finished(entry, wait=0.0)
    after = _stacks.capture(0)
    assert after.waiting is None and after.last is not None and after.last.name == 'probe'
    assert after.activity == 'running'
    assert "last collective barrier('probe') (" in after.doing and after.idle >= 0


# -- the view ---------------------------------------------------------------------------------


def test_groups_1000_hosts_in_10_states():
    """A thousand hosts in ten states: ten table rows, each naming its hosts and their words."""
    stacks = many()
    v = WhereView(stacks)
    groups = _where.state_groups(stacks)
    assert len(groups) == STATES and sum(len(g) for g in groups) == 1000
    assert sorted(p for g in groups for p in g) == list(range(1000))
    table = v._table.value
    rows = elements(table, 'mh-where-row', 'tr')
    assert len(rows) == STATES
    for row in rows:
        hosts = [int(x) for x in row['attrs']['data-hosts'].split(',')]
        assert int(row['attrs']['data-host']) == hosts[0]
        assert {f'mh-host-{p}' for p in hosts} <= row['classes']
        states = {stacks[p].state for p in hosts}
        assert len(states) == 1  # one state per row
        (doing,) = [e['text'] for e in elements(table, 'mh-where-doing') if inside(e, row)]
        first = stacks[hosts[0]]
        if first.activity == 'waiting' and first.waiting.name == 'after-eval':
            assert doing == "waiting at barrier('after-eval') #7 for 12 s to 13 s"
        if first.activity == 'no answer':
            assert 'mh-no-answer' in row['classes']
    big = rows[-1]  # largest group last
    assert big['attrs']['data-hosts'].startswith('0,1,2,')
    assert 'processes 0-500, 510, 520, 530, ... (550 in all)' in big['text']
    assert '10 states' in v._status.value and '950/1000 processes answered' in v._status.value


def test_user_frames_first_framework_frames_folded():
    """A group's main thread: the user's frames, the innermost highlighted, then one folded
    line that names the frameworks and opens the full stack; other threads collapsed."""
    stacks = four()
    html = WhereView(stacks)._stacks_html.value
    groups = elements(html, 'mh-stack-group', 'details')
    assert [g['attrs']['data-hosts'] for g in groups] == ['2', '3', '0,1']
    assert not any('open' in g['attrs'] for g in groups)  # compact: collapsed
    g2 = groups[0]
    (main,) = [d for d in elements(html, 'mh-main-thread', 'details') if inside(d, g2)]
    frames = [e for e in elements(html, 'mh-where-frame') if inside(e, main)]
    assert [e['text'] for e in frames] == [
        'Cell In[4], line 2: params = load_shard(path)',
        'train.py:88 in load_shard: data = np.load(path)',
    ]
    assert ['mh-where-innermost' in e['classes'] for e in frames] == [False, True]
    (fold,) = [d for d in elements(html, 'mh-where-fold', 'details') if inside(d, main)]
    assert 'open' not in fold['attrs']
    assert '22 framework frames (ipykernel, IPython, ipyparallel, ...)' in fold['text']
    full = stacks[2].thread_text(stacks[2].main_thread)  # the full stack, every frame
    assert full in fold['text'] and 'Cell In[4], line 2, in <module>' in full, full
    order = [id(e) for e in elements(html) if inside(e, main)]
    assert order.index(id(frames[-1])) < order.index(id(fold))  # user frames come first
    (threads,) = [d for d in elements(html, 'mh-where-threads', 'details') if inside(d, g2)]
    assert 'open' not in threads['attrs'] and '1 other thread (loader)' in threads['text']
    g0 = groups[2]
    inner = [e['text'] for e in elements(html, 'mh-where-innermost') if inside(e, g0)]
    assert inner == [  # main thread's, then the loader thread's
        "Cell In[4], line 3: multihost.barrier('after-eval')",
        'data.py:51 in prefetch: item = q.get()',
    ]
    assert 'no answer within 10 s' in groups[1]['text']


def test_text_fallback_in_sync_with_the_table():
    """text/plain: the verdict, the status, then the table's rows in the same order and words,
    each with its user frames and the framework frames as one line."""
    stacks = many(40)
    v = WhereView(stacks, verdict='hosts 0-19 wait at after-eval; process 21 is elsewhere')
    text = v._repr_mimebundle_()['text/plain']
    lines = text.splitlines()
    assert lines[0] == 'hosts 0-19 wait at after-eval; process 21 is elsewhere'
    answered = sum(s.answered for s in stacks.values())
    assert 0 < answered < 40 and lines[1].startswith(f'{answered}/40 processes answered')
    rows = elements(v._table.value, 'mh-where-row', 'tr')
    heads = [line for line in lines if line.startswith('process')]
    cells = elements(v._table.value, 'mh-where-hosts')
    doings = elements(v._table.value, 'mh-where-doing')
    expected = [f'{h["text"]}: {d["text"]}' for h, d in zip(cells, doings)]
    assert len(expected) == len(rows) and heads == expected
    assert "    > Cell In[4], line 3: multihost.barrier('after-eval')" in lines
    assert '      ... 27 framework frames (ipykernel, IPython, ipyparallel, ...)' in lines
    assert len(lines) < 80
    assert WhereView({}).text() == 'no stacks'


def test_hosts_whose_cell_numbers_differ_say_whose_cell_is_shown():
    """Each engine numbers its own cells: hosts waiting together in one cell whose numbers
    differ stay one group, and the view says whose number it shows and the others'."""
    renumbered = HostStacks(**{**host(2, 0).__dict__, 'cells': ((cell_file(2), 5),)})
    stacks = {0: host(0, 0), 1: host(1, 0), 2: renumbered}
    v = WhereView(stacks)
    note = " (process 0's cell; Cell In[5] on process 2)"
    assert _where.cells_note(stacks, (0, 1, 2)) == note
    assert _where.cells_note(stacks, (0, 1)) == ''
    text = v.text()
    assert (
        f"processes 0-2 (3 processes): waiting at barrier('after-eval') #7 for 12 s{note}" in text
    )
    assert "    > Cell In[4], line 3: multihost.barrier('after-eval')" in text, text
    (at,) = elements(v._table.value, 'mh-where-at')
    assert at['text'].endswith(note), at
    (group,) = elements(v._stacks_html.value, 'mh-stack-group', 'details')
    assert note in unescape(group['text']), group['text']


def test_verdict_line_comes_first():
    """A verdict is the view's first line (class mh-where-verdict); a string is dropped by a
    refresh, a callable is asked again."""
    stacks = four()
    v = WhereView(stacks, on_refresh=lambda: stacks, verdict="hosts 0, 1 wait at 'after-eval'")
    static = v.static_html()
    (banner,) = elements(static, 'mh-where-verdict')
    assert banner['text'] == "hosts 0, 1 wait at 'after-eval'"
    assert elements(static)[0]['text'].strip().startswith(banner['text'])  # nothing before it
    assert static.index('class="mh-banner mh-info mh-where-verdict"') < static.index('<table')
    assert v.text().splitlines()[0] == "hosts 0, 1 wait at 'after-eval'"
    v.refresh()
    assert v.verdict is None and not elements(v.static_html(), 'mh-where-verdict')
    calls = []
    w = WhereView(stacks, on_refresh=lambda: stacks, verdict=lambda: f'verdict {len(calls)}')
    calls.append(1)
    w.refresh()
    assert w.verdict == 'verdict 1' and w.text().startswith('verdict 1\n')
    plain = WhereView(stacks)
    assert plain.verdict is None and not elements(plain.static_html(), 'mh-where-verdict')


def test_many_states_are_bounded():
    """More states than rows: the table and stacks stop and count the rest."""
    stacks = {
        p: HostStacks(process=p, answered=True, where=f'train.py:{p} in f', time=NOW)
        for p in range(100)
    }
    v = WhereView(stacks)
    assert len(elements(v._table.value, 'mh-where-row', 'tr')) == _where.MAX_ROWS
    assert '36 more states' in v._table.value
    assert len(elements(v._stacks_html.value, 'mh-stack-group')) == _where.MAX_GROUPS
    assert '... 68 more states' in v.text()


# -- the view on four hand-built hosts -------------------------------------------------------------


def test_where_shows_collective_and_stack():
    """Each host's row names its current collective and gate; its main stack is shown, open."""
    stacks = host_stacks()
    v = WhereView(stacks)
    table = one(v.widget, 'mh-where-table').value
    for p, s in stacks.items():
        (row,) = elements(table, f'mh-host-{p}', 'tr')
        assert s.current.describe() in row['text']
        if s.gate is not None:
            assert f'waiting for release of #{s.gate}' in row['text']
    html = one(v.widget, 'mh-where-stacks').value
    mains = elements(html, 'mh-main-thread', 'details')
    assert mains and all('open' in d['attrs'] for d in mains)
    assert stacks[0].main_thread.stack in mains[-1]['text']
    assert "sync_global_devices('b')" in unescape(html)
    assert "sync_global_devices('c')" in unescape(html)
    threads = elements(html, 'mh-thread', 'details')
    assert threads and 'loader' in threads[0]['text'] and 'q.get()' in threads[0]['text']
    assert 'open' not in threads[0]['attrs']


def test_where_marks_unanswered_and_odd_hosts():
    """A host that did not answer and a host in another collective are marked."""
    v = WhereView(host_stacks())
    table = one(v.widget, 'mh-where-table').value
    assert [int(r['attrs']['data-host']) for r in elements(table, 'mh-no-answer', 'tr')] == [3]
    assert [int(r['attrs']['data-host']) for r in elements(table, 'mh-odd-host', 'tr')] == [2, 3]
    assert 'no answer in 5 s' in table
    status = one(v.widget, 'mh-where-status').value
    assert '3/4 processes answered' in status and 'no answer from process 3' in status


def test_where_groups_identical_stacks():
    """Hosts with identical stacks share one section; the odd ones come first."""
    stacks = host_stacks()
    stacks[2] = HostStacks(**{**stacks[0].__dict__, 'process': 2, 'hostname': 'node2'})
    stacks[3] = HostStacks(**{**stacks[0].__dict__, 'process': 3, 'gate': None})
    html = WhereView(stacks).widget.children[3].value
    groups = elements(html, 'mh-stack-group', 'details')
    assert [g['attrs']['data-hosts'] for g in groups] == ['3', '0,1,2']
    assert 'processes 0-2 (3 processes)' in groups[1]['text']


def test_where_refresh_calls_and_rerenders():
    """Refresh calls on_refresh and shows the new stacks; errors are shown, not raised."""
    fresh = [HostStacks(process=0, answered=True, current=record(9, 0, 'later'), time=1.0)]
    results = [fresh]
    v = WhereView(host_stacks(), on_refresh=lambda: results.pop())
    one(v.widget, 'mh-refresh-button').click()
    assert list(v.stacks) == [0]
    assert "barrier('later')" in unescape(one(v.widget, 'mh-where-table').value)
    one(v.widget, 'mh-refresh-button').click()  # results is empty now: IndexError
    assert 'Refresh failed: IndexError' in one(v.widget, 'mh-where-message').value
    assert list(v.stacks) == [0]
    assert WhereView(fresh).widget.children[0].children[0].disabled


def test_where_text_fallback():
    """The text/plain form is the table in words: one line per state group, then its frames."""
    stacks = host_stacks()
    v = WhereView(stacks.values())
    text = v._repr_mimebundle_()['text/plain']
    assert text == str(v) == v.text()
    assert text.splitlines()[0].startswith('3/4 processes answered')
    heads = [line for line in text.splitlines() if line.startswith('process')]
    assert heads == [
        "process 2: waiting for release of #4 (barrier('c'))",
        "process 3: no answer in 5 s; last published barrier('a') #3",
        "processes 0-1 (2 processes): waiting for release of #4 (barrier('b'))",
    ]


def test_stacks_read_from_dumps_count_who_left_a_dump_not_who_answered():
    """A post-mortem's stacks are what each host wrote before it died: 3 of a 5-host job."""
    stacks = {p: s for p, s in host_stacks().items() if s.answered}
    v = WhereView(stacks, dumps=5)
    status = unescape(one(v.widget, 'mh-where-status').value)
    assert '3 of 5 processes left a dump' in status, status
    assert 'no dump from processes 3-4' in status and 'answered' not in status, status
    assert v.text().splitlines()[0].startswith('3 of 5 processes left a dump')
    assert 'no dump' not in _where.status_text(stacks, dumps=3)
    assert _where.status_text(stacks).startswith('3/3 processes answered')  # a live job's


def test_widget_html_of_a_where_view_exports_its_content():
    """`widget_html(view)` of a where view made from this process's real stacks: the view's
    rows and words, as its static picture has them (it exported nothing before)."""
    from mhnotebook._views import stacks_view
    from mhnotebook.widgets._common import widget_html

    entry = _recorder.note('barrier', 'export', seq=None, digest='', site='here.py:1')
    try:
        view = stacks_view({0: _stacks.capture(0)})
    finally:
        _recorder.finished(entry, wait=0.0)
    html = widget_html(view)
    assert html == view.static_html() == widget_html(view.widget)
    rows = elements(html, 'mh-where-row')
    assert len(rows) == 1 and "waiting at barrier('export')" in rows[0]['text'], rows
    assert '1/1 processes answered' in unescape(html)
    assert elements(html, 'mh-main-thread')
    with pytest.raises(
        TypeError, match='widget_html takes an ipywidgets widget.*got builtins.dict'
    ):
        widget_html({0: 'stacks'})


# -- in a real browser ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def browser():
    with chromium() as b:
        yield b


def _open(browser, view, tmp_path, name):
    page = browser.new_page(viewport={'width': 1280, 'height': 720})
    html = view.static_html()
    return show_static(page, tmp_path / f'{name}.html', html, 'font-family:sans-serif')


@pytest.mark.browser
def test_1000_hosts_render_under_900_px(browser, tmp_path):
    """1,000 hosts in 10 states: one row per state, every stack collapsed, under 900 px tall."""
    view = WhereView(
        many(), verdict="processes 0-499 are waiting at barrier('after-eval') #7 for 13 s"
    )
    page = _open(browser, view, tmp_path, 'where_1000')
    try:
        height = page.evaluate('document.body.scrollHeight')
        page.screenshot(path='/tmp/where_1000.png', full_page=True)
        assert height < 900, height
        assert page.locator('tr.mh-where-row').count() == STATES
        assert page.locator('details.mh-stack-group').count() == STATES
        assert page.locator('details.mh-stack-group[open]').count() == 0
        assert page.locator('.mh-where-frame:visible').count() == 0
        assert page.locator('.mh-where-verdict').first.is_visible()
        # opening a group shows its user frames and the folded line, not the full stack
        group = page.locator('details.mh-stack-group').last
        group.locator('summary').first.click()
        assert group.locator('.mh-where-innermost').first.is_visible()
        assert group.locator('.mh-where-fold > summary').first.is_visible()
        assert not group.locator('pre.mh-stack-text').first.is_visible()
        assert page.evaluate('document.body.scrollHeight') < height + 200
    finally:
        page.close()


@pytest.mark.browser
def test_4_hosts_page_is_compact(browser, tmp_path):
    """Four hosts in three states: three rows and three collapsed stacks, a short page."""
    page = _open(browser, WhereView(four()), tmp_path, 'where_4')
    try:
        height = page.evaluate('document.body.scrollHeight')
        page.screenshot(path='/tmp/where_4.png', full_page=True)
        assert height < 300, height
        assert page.locator('tr.mh-where-row').count() == 3
        assert page.locator('details.mh-stack-group[open]').count() == 0
    finally:
        page.close()


def test_frames_named_like_ours_are_the_users_and_the_stack_says_what_it_waits_in():
    """A user's multihost.py (or multihost/ folder) is user code, shown with its folder; only
    files inside the reported package directory are ours. The doing text reads the stack."""
    from multihost._models._stacks import display_path, frame_package, stack_activity

    ours = ('/venv/lib/python3.11/site-packages/multihost/',)
    assert frame_package('/tmp/proj/multihost.py', ours) is None
    assert frame_package('/tmp/proj/multihost/data.py', ours) is None
    assert frame_package('/tmp/proj/multihost/data.py') == 'multihost'  # no dirs: by name
    assert frame_package(ours[0] + '_kv.py', ours) == 'multihost'
    assert display_path('/tmp/proj/multihost.py', ours) == 'proj/multihost.py'
    assert display_path('/home/u/train.py', ours) == 'train.py'
    orbax = '/venv/lib/python3.11/site-packages/orbax/checkpoint/_src/multihost/multihost.py'
    assert display_path(orbax) == 'orbax/checkpoint/_src/multihost/multihost.py'
    frames = (
        ('/home/u/train.py', 60, 'main', 'save(step)'),
        ('/tmp/proj/multihost.py', 5, 'wait', 'ocp.sync_global_processes(name, processes=ps)'),
        (orbax, 349, 'sync_global_processes', 'barrier_sync_fn(key=name, timeout_ms=t)'),
        (orbax, 318, '_fn', 'client.wait_at_barrier(key, timeout_ms, process_ids=ps)'),
    )
    kind, words = stack_activity(frames, ours)
    assert kind == 'coordination', words
    assert words == (
        'waiting in a coordination-service barrier at orbax/checkpoint/_src/multihost/'
        'multihost.py:318 in _fn (via sync_global_processes), called from '
        'proj/multihost.py:5 in wait'
    )
    s = HostStacks(
        process=0,
        answered=True,
        threads=(ThreadStack('MainThread', 1, True, False, frames),),
        ours=ours,
    )
    assert s.doing.startswith('waiting in a coordination-service barrier at orbax/'), s.doing
    assert s.at == 'proj/multihost.py:5 in wait'
    sleeping = (('/home/u/train.py', 88, 'load', 'time.sleep(5)'),)
    assert stack_activity(sleeping, ours) == (
        'sleep',
        'in user code at train.py:88 in load, in time.sleep',
    )


def test_a_stack_inside_jits_trace_or_compile_is_busy_compiling_not_a_device_wait():
    """jit's call frames (``cache_miss``, ``_pjit_call_impl_python``) are also those of a
    launch waiting on devices: a stack that goes on into jax's compiler (or its tracing)
    says so, kind ``'jax'`` (busy), not ``'device'`` (waiting for another host)."""
    from multihost._models._stacks import jit_phase, stack_activity

    jax_src = '/venv/lib/python3.11/site-packages/jax/_src/'
    call = (
        ('/home/u/train.py', 50, 'main', 'state = step(state, batch)'),
        (jax_src + 'pjit.py', 1, 'cache_miss', ''),
        (jax_src + 'pjit.py', 2, '_pjit_call_impl_python', ''),
    )
    compiling = (*call, (jax_src + 'compiler.py', 3, 'backend_compile_and_load', ''))
    tracing = (
        *call[:2],
        (jax_src + 'pjit.py', 4, '_trace_for_jit', ''),
        (jax_src + 'interpreters/partial_eval.py', 5, 'trace_to_jaxpr', ''),
        ('/home/u/model.py', 20, 'step', 'x = jnp.sin(x)'),
        (jax_src + 'numpy/ufuncs.py', 6, 'sin', ''),
    )
    assert jit_phase(compiling) == 'compiling' and jit_phase(tracing) == 'tracing'
    assert jit_phase(call) == ''
    assert stack_activity(compiling) == (
        'jax',
        'compiling a jitted function at train.py:50 in main',
    )
    assert stack_activity(tracing) == ('jax', 'tracing a jitted function at model.py:20 in step')
    assert stack_activity(call)[0] == 'device'  # no compile below it: it waits


def test_the_wavefront_says_a_host_compiling_its_launch_is_compiling_it_not_running_it():
    """A launch whose call is still in jit's compile is recorded as launched; the verdict and
    the host's line say it is being compiled, not that the device has not finished it."""
    import dataclasses

    from multihost import FlightRecord, HostFront, Wavefront

    def launch(p: int) -> FlightRecord:
        return FlightRecord(
            n=3, kind='launch', name='train_step', call=0, seq=-1, digest='ab' * 8,
            fingerprint='', site='/job/train.py:50', time=1000.0, wait=None,
            state='launched', process=p,
        )  # fmt: skip

    def barrier(p: int) -> FlightRecord:
        return FlightRecord(
            n=2, kind='barrier', name='ready', call=-1, seq=1, digest='ab' * 8,
            fingerprint='', site='/job/train.py:48', time=999.0, wait=None,
            state='waiting', process=p,
        )  # fmt: skip

    compiling = HostFront(
        process=1, answered=True, last=launch(1), last_launch=launch(1), pending=launch(1),
        pending_age=40.0, calls=(('train_step', 1),), where='train.py:50 in main',
        activity='compiling a jitted function at train.py:50 in main', activity_kind='jax',
    )  # fmt: skip
    running = dataclasses.replace(
        compiling, process=2, last=launch(2), last_launch=launch(2), pending=launch(2),
        activity='inside a JAX collective or device wait at train.py:50 in main',
        activity_kind='device',
    )  # fmt: skip
    waiting = HostFront(process=0, answered=True, last=barrier(0), waiting=barrier(0),
                        waiting_for=40.0)  # fmt: skip
    assert compiling.jit_phase == 'compiling' and running.jit_phase == ''
    wf = Wavefront(hosts=(waiting, compiling, running), time=1040.0)
    assert wf.verdict.startswith(
        'process 2 is inside train_step call #0 (launched 40 s ago, not done); '
        'process 1 is compiling train_step call #0 (called 40 s ago); '
        'process 0 never launched call #0: '
    ), wf.verdict
    assert compiling.doing.startswith('compiling train_step call #0 (called 40 s ago)')
    # The host's stacks say the same of its last launch.
    jax_src = '/venv/lib/python3.11/site-packages/jax/_src/'
    frames = (
        ('/job/train.py', 50, 'main', 'state = step(state, batch)'),
        (jax_src + 'pjit.py', 1, 'cache_miss', ''),
        (jax_src + 'compiler.py', 3, 'backend_compile_and_load', ''),
    )
    thread = ThreadStack('MainThread', 1, True, False, frames)
    stacks = HostStacks(process=1, answered=True, threads=(thread,), last=launch(1), idle=40.0)
    assert stacks.doing == (
        'compiling a jitted function at train.py:50 in main, last launch train_step call #0 '
        '(40 s ago, being compiled)'
    ), stacks.doing
    running = dataclasses.replace(stacks, threads=(dataclasses.replace(thread, frames=frames[:2]),))
    assert running.doing.endswith('(40 s ago, not done on device)'), running.doing
