"""The notebook side against a real local ipyparallel cluster (4 engines x 2 CPU devices).

Sessions, fast gather exactness for every layout the issue lists, errors,
magics through a real IPython shell, connect() to a cluster started elsewhere
with engine ids that differ from process indices, and restart/stop.
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import local_session, wait_until
from _helpers import magic_shell as _shell

from mhnotebook import HostsError, SessionError

pytestmark = pytest.mark.cluster

SETUP = """
import jax, numpy as np, multihost
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
flat = Mesh(np.array(jax.devices()), ('d',))
def make(shape, spec, m=mesh):
    v = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return jax.make_array_from_callback(shape, NamedSharding(m, spec), lambda i: v[i])
a_x = make((16, 6), P('x'))
a_xy = make((8, 6), P('x', 'y'))
a_none_y = make((8, 6), P(None, 'y'))
a_rep = make((8, 6), P())
a_1d = make((32,), P('d'), flat)
a_3d = make((8, 4, 6), P('x', None, 'y'))
a_0d = make((), P())
loc = np.arange(6).reshape(2, 3) * (jax.process_index() + 1)
scalar = jax.process_index() * 1.5
tree = {'w': a_xy, 'stats': (loc, scalar), 'u8': np.full(3, jax.process_index(), np.uint8)}
"""

GLOBALS = {
    'a_x': (16, 6),
    'a_xy': (8, 6),
    'a_none_y': (8, 6),
    'a_rep': (8, 6),
    'a_1d': (32,),
    'a_3d': (8, 4, 6),
    'a_0d': (),
}


@pytest.fixture(scope='module')
def session():
    with local_session(SETUP) as s:
        yield s


def test_engine_ids_ordered_by_reported_process_index(session):
    """engine_ids[p] is the engine whose JAX process index is p."""
    got = session.call('multihost.engine.engine_info')
    assert [info['process_index'] for info in got] == [0, 1, 2, 3]
    assert [h.process_index for h in session.processes] == [0, 1, 2, 3]
    assert sorted(session.engine_ids) == sorted(session.client.ids)


@pytest.mark.parametrize('transport', ['shm', 'shm-fresh', 'tcp', 'zmq', 'auto'])
@pytest.mark.parametrize('name', sorted(GLOBALS))
def test_gather_global_arrays_exact(session, name, transport):
    """P('x'), P('x','y'), P(None,'y'), P(), 1-D, 3-D and 0-D gather to the exact value
    (shm-fresh: into a new file, filled by pwrite where a block's place is one span)."""
    shape = GLOBALS[name]
    if transport == 'shm-fresh':
        transport = 'shm'
        if session._gathers is not None:
            session._gathers.pool.clear()
    out = session.allgather(name, transport=transport)
    assert isinstance(out, np.ndarray) and out.shape == shape and out.dtype == np.float32
    np.testing.assert_array_equal(
        out, np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    )


@pytest.mark.parametrize('transport', ['shm', 'tcp', 'zmq'])
def test_gather_host_local_and_pytree(session, transport):
    """Host-local leaves stack by process index; pytrees keep their structure and dtypes."""
    out = session.allgather('tree', transport=transport)
    assert set(out) == {'w', 'stats', 'u8'}
    np.testing.assert_array_equal(out['w'], np.arange(48, dtype=np.float32).reshape(8, 6))
    loc, scalar = out['stats']
    np.testing.assert_array_equal(
        loc, np.stack([np.arange(6).reshape(2, 3) * (p + 1) for p in range(4)])
    )
    np.testing.assert_array_equal(scalar, np.arange(4) * 1.5)
    assert out['u8'].dtype == np.uint8 and out['u8'].shape == (4, 3)
    np.testing.assert_array_equal(out['u8'][:, 0], np.arange(4))


def test_gather_sends_each_block_once(session):
    """Only replica 0 of each block is exported: a replicated array is sent by exactly one host."""
    metas = session.call('multihost.engine.gather_meta', 'a_rep', namespace=True)
    blocks = [b for m in metas for b in m['leaves'][0]['blocks']]
    assert blocks == [((0, 8), (0, 6))]
    metas = session.call('multihost.engine.gather_meta', 'a_none_y', namespace=True)
    assert sum(len(m['leaves'][0]['blocks']) for m in metas) == 2  # two column blocks, 8 devices


def test_a_sessions_data_tools_run_the_one_registrys_tools(session):
    """Issue 45 item 1: `call_tool` runs a tool of `multihost.engine.tools` by name on the
    engines (the data tools are written once over it); a session has one namespace, so a
    frame is refused in one line, and None is the registry's default timeout."""
    metas = session.call_tool('gather_meta', 'a_rep', 0)
    assert len(metas) == 4 and [b for m in metas for b in m['leaves'][0]['blocks']] == [
        ((0, 8), (0, 6))
    ]
    layout, _ = session.layout('a_rep')
    got = session.call_tool('layout', 'a_rep', True, timeout=60)[0][0]
    assert (got.shape, got.nbytes) == (layout.shape, layout.nbytes) == ((8, 6), 8 * 6 * 4)
    with pytest.raises(ValueError, match="frame= is for an attached job .* a session's hosts"):
        session.layout('a_rep', frame=0)
    with pytest.raises(ValueError, match="no engine tool 'layot'; known:"):
        session.call_tool('layot', 'a_rep')


def test_gather_errors_are_clear(session):
    """Unknown names, non-names and non-numeric values give errors that say what to do."""
    with pytest.raises(SessionError, match="name 'nope' is not defined on this engine"):
        session.allgather('nope')
    # Issue 32 item 4: a close name is suggested, and the hosts lacking one are named.
    session.execute('params = {"w": np.ones(2)}\nif jax.process_index() == 0:\n    only0 = 1',
                    echo=False)  # fmt: skip
    with pytest.raises(SessionError) as info:
        session.allgather('parms')
    assert str(info.value) == (
        "cannot gather 'parms' on processes 0-3: name 'parms' is not defined on this engine; "
        "did you mean 'params'? Define it in a %%mh cell first (every host runs the cell)."
    ), str(info.value)
    with pytest.raises(SessionError) as info:
        session.allgather('only0')
    assert str(info.value).startswith(
        "cannot gather 'only0' on processes 1-3: name 'only0' is not defined on this engine"
    ), str(info.value)
    with pytest.raises(ValueError, match='is not a name of an engine value'):
        session.allgather('x[0]; import os')
    session.execute('obj = object()', echo=False)
    with pytest.raises(SessionError, match='not numeric data'):
        session.allgather('obj')
    with pytest.raises(SessionError, match='has no attribute'):
        session.allgather('mesh.nothing_here')


def test_execute_reports_every_failing_host(session, capsys):
    """A cell failing on some hosts raises HostsError with each failing host's traceback."""
    with pytest.raises(HostsError) as info:
        session.execute(
            'if jax.process_index() in (1, 3): raise RuntimeError(f"bad {jax.process_index()}")',
            echo=False,
        )
    assert sorted(info.value.errors) == [1, 3]
    assert 'bad 3' in info.value.errors[3]
    out = session.execute('print("p", jax.process_index())')
    assert out[2].strip() == 'p 2'
    assert '[process 2] p 2' in capsys.readouterr().out


def test_a_cells_output_leaves_out_the_collectives_librarys_connection_chatter(session, capsys):
    """Issue 32 item 6: XLA's Gloo reports each new clique on fd 1 of every process in it; the
    cell's output (echoed and returned) keeps the user's lines and drops only that report."""
    code = (
        'import jax.numpy as jnp\n'
        'pair = [d for d in jax.devices() if d.process_index in (1, 3)][1::2]\n'
        'pair = Mesh(np.array(pair), ("p",))\n'
        'if jax.process_index() in (1, 3):\n'
        '    v = jax.make_array_from_callback((2,), NamedSharding(pair, P("p")),'
        ' lambda i: np.arange(2.0)[i])\n'
        '    print("sum", float(jax.jit(jnp.sum, out_shardings=NamedSharding(pair, P()))(v)))\n'
        'print("[Gloo] my own line")\n'
        # Gloo writes on fd 1 from C; ipykernel's pipe reader forwards that to the cell on a
        # thread of its own, which a loaded machine may not run before the cell ends.
        'import time; time.sleep(1.0)\n'
    )
    capsys.readouterr()
    pending = session.execute_async(code)
    out = session.wait_outputs(pending, timeout=120)
    raw = {p: ''.join(ar.stdout) for p, ar in pending.items()}
    assert all('peer ranks' in raw[p] for p in (1, 3)), raw  # it did chatter
    echoed = capsys.readouterr().out
    for text in (echoed, *out.values()):
        assert 'peer ranks' not in text, (echoed, out)
    assert out[1] == out[3] == 'sum 1.0\n[Gloo] my own line\n', out
    assert out[0] == '[Gloo] my own line\n', out
    assert '[process 3] sum 1.0' in echoed and '[process 0] [Gloo] my own line' in echoed, echoed


def test_a_c_librarys_line_reaches_the_cell_whole_between_the_cells_own_prints(session):
    """The same report written as Gloo writes it (``std::cout << ...``: piece by piece when
    C's stdout is unbuffered, as under PYTHONUNBUFFERED=1) with a ``print`` in between: the
    engine's C stdout is line-buffered, so the report comes whole and is left out; before,
    its pieces landed around the print (``[Gloo] Rank python line``) and stayed."""
    code = (
        'import ctypes, time\n'
        'libc = ctypes.CDLL(None)\n'
        'libc.printf(b"[Gloo] Rank ")\n'
        'time.sleep(0.3)\n'
        'print("python line")\n'
        'time.sleep(0.3)\n'
        'libc.printf(b"1 is connected to 1 peer ranks. Expected number of connected peer '
        'ranks is : 1\\n")\n'
        'libc.fflush(None)\n'
        'time.sleep(1.0)\n'  # ipykernel's pipe reader forwards fd 1 on a thread of its own
    )
    out = session.execute(code, timeout=60, echo=False)
    assert set(out.values()) == {'python line\n'}, out


def test_barrier_through_session(session):
    """Session.barrier runs a timed barrier on every host and reports per host."""
    results = session.barrier('nb-barrier', timeout=30)
    assert sorted(results) == [0, 1, 2, 3] and all(r['ok'] for r in results.values())


def test_magics_in_a_real_shell(session):
    """%mh runs cells on every host, %mh_allgather stores the value, mistakes raise UsageError."""
    from IPython.core.error import UsageError
    from IPython.testing.globalipapp import get_ipython, start_ipython
    from IPython.utils.capture import capture_output

    ip = start_ipython() or get_ipython()
    ip.run_line_magic('load_ext', 'mhnotebook')
    magics = ip.magics_manager.registry['MultihostMagics']
    magics.session = None
    with pytest.raises(UsageError, match='no cluster yet'):
        ip.run_line_magic('mh_allgather', 'x')
    magics.session = session
    with capture_output() as cap:
        ip.run_cell_magic(
            'mh', '--timeout 60', 'z = np.arange(3) * jax.process_index()\nprint("ok")'
        )
    assert '[process 3] ok' in cap.stdout
    with capture_output() as cap:
        ip.run_line_magic('mh_allgather', 'z -o zz')
    np.testing.assert_array_equal(ip.user_ns['zz'], np.arange(3)[None] * np.arange(4)[:, None])
    assert 'zz = z gathered from 4 processes' in cap.stdout
    with capture_output() as cap:
        ip.run_line_magic('mh_allgather', 'a_xy')
    assert ip.user_ns['a_xy'].shape == (8, 6)
    for bad in ['1x', 'z -o 2y', 'z; import os']:
        with pytest.raises(UsageError):
            ip.run_line_magic('mh_allgather', bad)
    with capture_output() as cap:
        ip.run_line_magic('mh_barrier', 'from-magic --timeout 20')
    assert cap.stdout.count("passed 'from-magic'") == 4
    with capture_output() as cap:
        ip.run_cell_magic('mh', '', 'raise ValueError("only on host " + str(jax.process_index()))')
    assert 'only on host 2' in cap.stdout and cap.stdout.count('--- process ') == 4
    with capture_output() as cap:  # the same mistake on every host: one traceback
        ip.run_cell_magic('mh', '', 'raise ValueError("the same everywhere")')
    assert cap.stdout.count('the same everywhere') == 2, cap.stdout  # the line, the error
    assert '--- processes 0-3 ---' in cap.stdout, cap.stdout
    assert 'mh_allgather' in (ip.find_line_magic('mh_allgather').__doc__ or '')
    magics.session = None


def test_layout_and_diff_magics_return_views(session):
    """%mh_layout flags a replicated array whose hosts disagree; %mh_diff names the odd host."""
    from IPython.core.error import UsageError

    from mhnotebook.widgets import LayoutView, TreeDiffView

    ip, magics = _shell(session)
    session.execute(
        'import multihost\n'
        'bad = multihost.host_local_array_to_global_array(\n'
        '    np.arange(4.0) + (jax.process_index() == 2), mesh, P())\n'
        'params = {"w": np.ones(3) * (1 + (jax.process_index() == 1)), "b": np.zeros(2)}',
        echo=False,
    )
    view = ip.run_line_magic('mh_layout', 'a_xy')
    assert isinstance(view, LayoutView) and view.report.ok
    assert view.layout.shape == (8, 6) and len(view.layout.shards) == 8
    view = ip.run_line_magic('mh_layout', 'bad --no-values')
    assert not view.report.ok and view.report.odd_processes == (2,)
    view = ip.run_line_magic('mh_layout', 'a_3d --axes 0,2')
    assert view.grid.axes == (0, 2)
    diff = ip.run_line_magic('mh_diff', 'params')
    assert isinstance(diff, TreeDiffView)
    assert [leaf.path for leaf in diff.diff.leaves] == ["['w']"]
    assert diff.diff.leaves[0].odd_processes == (1,)
    # a pytree is one table (its leaves here: numpy, each host its own)
    tree = ip.run_line_magic('mh_layout', 'params')
    assert [r[:4] for r in tree.tree.rows()] == [
        ("['b']", '[2]', 'float64', 'numpy'),
        ("['w']", '[3]', 'float64', 'numpy'),
    ]
    with pytest.raises(UsageError, match='--axes pick the displayed axes of one array.*params'):
        ip.run_line_magic('mh_layout', 'params --axes 0,1')
    with pytest.raises(UsageError, match='--axes'):
        ip.run_line_magic('mh_layout', 'a_3d --axes x,y')
    magics.session = None


def test_stuck_cell_shows_where_every_host_is(session):
    """%%mh --timeout on a hung barrier gives control back and shows each host's place."""
    from IPython.utils.capture import capture_output

    from mhnotebook.widgets import WhereView

    ip, magics = _shell(session)
    code = (
        'import time\nif jax.process_index() == 3:\n    time.sleep(10)\nmultihost.barrier("late")'
    )
    with capture_output() as cap:
        ip.run_cell_magic('mh', '--timeout 2', code)
    assert 'still running after 2 s' in cap.stdout
    views = [o for o in cap.outputs if 'text/plain' in o.data]
    assert views, 'no where view displayed'
    stacks = session.where()
    assert stacks[0].current.name == 'late' and stacks[0].current.kind == 'barrier'
    assert stacks[3].current is None or stacks[3].current.name != 'late'
    assert 'sleep' in stacks[3].format() or 'line 3' in stacks[3].format()
    view = ip.run_line_magic('mh_where', '')
    assert isinstance(view, WhereView)
    verdict = view.text().splitlines()[0]  # the wavefront's verdict leads
    assert "processes 0-2 are waiting at barrier('late')" in verdict, view.text()
    assert 'process 3 is not there' in verdict, verdict
    session.wait_outputs(session.execute_async('pass'), timeout=60, echo=False)
    magics.session = None


def test_a_stuck_cell_reads_as_ipython_names_it(session, tmp_path):
    """%mh_where of a host stuck in a cell says ``Cell In[N], line L`` (N: that engine's
    execution count, as its IPython numbers the cell), and so do the wavefront, the timeline
    and an error; never the kernel's cell file ``/tmp/ipykernel_<pid>/<hash>.py``."""
    import re

    from mhnotebook.widgets import WhereView

    ip, magics = _shell(session)
    go = tmp_path / 'go'
    code = (
        'import os, sys, time\n'
        'here = sys._getframe().f_code.co_filename\n'
        "print('label', *get_ipython().compile.format_code_name(here))\n"
        f'while jax.process_index() == 3 and not os.path.exists({str(go)!r}):\n'
        '    time.sleep(0.05)\n'
        "multihost.barrier('cellsite', timeout=300)\n"
    )
    pending = session.execute_async(code)
    try:
        wait_until(
            lambda: 'process 3 is not there' in (session.wavefront().verdict or ''),
            120,
            'hosts 0-2 in the barrier, host 3 in its loop',
        )
        view = ip.run_line_magic('mh_where', '')
        assert isinstance(view, WhereView)
        text = view.text()
        html = view._stacks_html.value + view._table.value
    finally:
        go.touch()
        outputs = session.wait_outputs(pending, timeout=120, echo=False)
    # The count each engine's own IPython gave the cell (its label), printed by the cell itself.
    counts = {
        p: int(re.search(r'label Cell In\[(\d+)\]', out).group(1)) for p, out in outputs.items()
    }
    n = counts[3]
    assert set(counts.values()) == {n}, counts  # the same cells ran on every host
    verdict = text.splitlines()[0]
    assert "processes 0-2 are waiting at barrier('cellsite')" in verdict, text
    assert re.search(rf'process 3 is not there.*Cell In\[{n}\], line [45]', verdict), verdict
    assert re.search(rf'process 3: .*Cell In\[{n}\], line [45]', text), text
    assert f'> Cell In[{n}], line 6: ' in text, text  # hosts 0-2's innermost frame
    assert f'Cell In[{n}], line 6, in &lt;module&gt;' in html  # the full stack, as IPython's
    shown = re.sub(r' title="[^"]*"', '', html)  # a frame's hover title keeps its file
    assert 'ipykernel_' not in text and 'ipykernel_' not in shown, text  # no kernel cell file
    # The wavefront and the timeline name the call site the same way, on every host.
    front = session.wavefront()
    assert front.hosts[0].last_collective.site == f'Cell In[{n}], line 6', front.hosts[0]
    step = next(s for s in session.timeline(last=20).steps if s.name == 'cellsite')
    assert {r.site for r in step.records.values()} == {f'Cell In[{n}], line 6'}, step.records
    # An error names each host's call in the same words (its traceback, IPython's, agrees).
    with pytest.raises(HostsError) as err:
        session.execute(
            "multihost.barrier('a' if jax.process_index() != 1 else 'b', timeout=60)",
            timeout=120,
            echo=False,
        )
    failure = err.value.failures[0]
    plain = re.sub(r'\x1b\[[0-9;]*m', '', failure.traceback)
    m = re.search(r'Cell In\[(\d+)\], line 1', plain)
    assert m, plain
    assert f"barrier('b') at Cell In[{m.group(1)}], line 1" in failure.evalue, failure.evalue
    assert 'ipykernel_' not in failure.evalue, failure.evalue
    magics.session = None


def test_stepping_from_the_notebook(session):
    """%mh_step on: hosts pause before each barrier; %mh_step step releases them one at a time."""

    from IPython.utils.capture import capture_output

    ip, magics = _shell(session)
    ip.run_line_magic('mh_step', 'on')
    with capture_output() as cap:
        ip.run_cell_magic(
            'mh', '', 'multihost.barrier("s1")\nmultihost.barrier("s2")\nprint("done")'
        )
    assert 'running in the background' in cap.stdout

    def wait_for(name):
        def arrived():
            step = session.step_table().pending
            return step is not None and step.complete and step.majority.name == name

        def state():
            done = {p: (ar.ready(), ar.ready() and ar.error) for p, ar in magics.background.items()}
            return f'every host at {name}: {session.step_table()}; {done}'

        wait_until(arrived, 60, state, period=0.2)

    wait_for('s1')
    ip.run_line_magic('mh_step', 'step')
    wait_for('s2')
    view = ip.run_line_magic('mh_step', 'continue')
    assert not magics.stepping and not view.table.stepping
    with capture_output() as cap:
        ip.run_line_magic('mh_wait', '--timeout 60')
    assert cap.stdout.count('] done') == 4, cap.stdout
    magics.session = None


def test_shm_buffers_are_reused_only_after_results_are_dropped(session):
    """A kept result is never overwritten by a later gather; a dropped one's buffer is reused."""
    import gc

    session.execute('counter = a_x + 0', echo=False)
    first = session.allgather('counter', transport='shm')
    kept = first.copy()
    session.execute('counter = a_x + 1', echo=False)
    second = session.allgather('counter', transport='shm')
    np.testing.assert_array_equal(first, kept)  # untouched by the second gather
    np.testing.assert_array_equal(second, kept + 1)
    pool = session._gathers.pool
    gc.collect()  # results of earlier tests kept alive by a cycle give theirs back now
    in_use = {id(b) for b in pool.free}
    del first
    gc.collect()
    freed = [b for b in pool.free if id(b) not in in_use]
    assert len(freed) == 1, 'the dropped result did not give its buffer back'
    third = session.allgather('counter', transport='shm')
    assert freed[0] not in pool.free  # reused
    np.testing.assert_array_equal(third, kept + 1)
    view = third[2:5]
    del third
    gc.collect()
    assert freed[0] not in pool.free  # a view still holds it
    np.testing.assert_array_equal(view, (kept + 1)[2:5])


@pytest.mark.parametrize('transport', ['shm', 'tcp'])
def test_repeated_gather_follows_a_value_that_changed(session, transport):
    """A repeated gather skips the structure round; a host whose value changed is noticed."""
    session.execute('again = a_x + 0', echo=False)
    first = session.allgather('again', transport=transport)
    assert ('again', 'None') in session._gathers.plans  # planned once, reused below
    session.execute('again = a_x * 2', echo=False)  # same layout, new values
    np.testing.assert_array_equal(session.allgather('again', transport=transport), first * 2)
    # every host changes shape: the stale plan is noticed and the gather starts over
    session.execute('again = a_x[: a_x.shape[0] // 2]', echo=False)
    np.testing.assert_array_equal(
        session.allgather('again', transport=transport), first[: first.shape[0] // 2]
    )
    # one host alone changes: nothing stale is written, and the hosts' disagreement is named
    session.execute(
        'import numpy as np\nagain = np.zeros(3) if jax.process_index() == 2 else np.zeros(4)',
        echo=False,
    )
    with pytest.raises(SessionError) as info:  # grouped by what they hold (issue 32 item 5)
        session.allgather('again', transport=transport)
    assert str(info.value) == (
        'the value differs between processes: processes 0-1, 3: local float64 (4,); '
        'process 2: local float64 (3,). Compare them with %mh_diff.'
    ), str(info.value)
    session.execute('again = np.full(5, jax.process_index())', echo=False)
    got = session.allgather('again', transport=transport)
    np.testing.assert_array_equal(got, np.repeat(np.arange(4), 5).reshape(4, 5))


def test_tcp_listener_drops_strangers_and_reuses_memory_only_after_results_are_dropped(
    session,
):
    """A connection without the gather's token is dropped unread; results are never
    overwritten while held, and their memory is reused once they are gone."""
    import gc
    import socket

    session.execute('streamed = a_x + 0', echo=False)
    first = session.allgather('streamed', transport='tcp')
    kept = first.copy()
    address = session._gathers.listener().address
    strangers = [socket.create_connection(address, timeout=5) for _ in range(3)]
    strangers[0].sendall(b'\0' * 16 + (1).to_bytes(4, 'big') + b'junk' * 100)  # wrong token
    strangers[1].sendall(b'x' * 7)  # half a hello, then nothing
    session.execute('streamed = a_x + 1', echo=False)
    second = session.allgather('streamed', transport='tcp')
    np.testing.assert_array_equal(first, kept)  # held: untouched by the second gather
    np.testing.assert_array_equal(second, kept + 1)
    for s in strangers:
        s.close()
    heap = session._gathers.heap
    before = len(heap.free)
    del first
    gc.collect()
    assert len(heap.free) == before + 1, 'the dropped result did not give its memory back'
    third = session.allgather('streamed', transport='tcp')
    assert len(heap.free) == before  # reused
    np.testing.assert_array_equal(third, kept + 1)


def test_timeline_magic_names_the_late_host(session, tmp_path):
    """%mh_timeline: host 3, late to every watched step, is named; --chrome writes the trace."""
    import json

    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    from mhnotebook.widgets import TimelineView

    ip, magics = _shell(session)
    session.execute(
        'import time, jax.numpy as jnp\n'
        'nb_step = multihost.watch(jax.jit(lambda a: jnp.sum(a) * 0.5 + a), name="nb_step")\n'
        'nb_a = nb_step(a_1d)\n'
        'nb_a.block_until_ready()\n'
        'for _ in range(12):\n'
        '    if jax.process_index() == 3:\n'
        '        time.sleep(0.04)\n'
        '    nb_a = nb_step(nb_a)\n'
        '    nb_a.block_until_ready()\n',
        timeout=60,
        echo=False,
    )
    path = tmp_path / 'steps.json'
    with capture_output() as cap:
        view = ip.run_line_magic('mh_timeline', f'--last 12 --chrome {path}')
    assert isinstance(view, TimelineView)
    steps = view.timeline.steps
    assert [s.label for s in steps] == [f'nb_step call #{k}' for k in range(1, 13)], view.text()
    st = view.timeline.stragglers()
    assert st.host == 3 and st.share >= 0.8, view.text()
    assert view.text().startswith('process 3 arrived last in ')
    assert f'wrote a Chrome trace of 12 steps (one track per process) to {path}' in cap.stdout
    events = json.loads(path.read_text())['traceEvents']
    assert {e['pid'] for e in events if e['ph'] == 'X'} == {0, 1, 2, 3}
    with pytest.raises(UsageError, match='--last takes a positive number'):
        ip.run_line_magic('mh_timeline', '--last 0')
    assert 'Example' in (ip.find_line_magic('mh_timeline').__doc__ or '')
    magics.session = None


def test_timeline_counts_a_users_barrier_marks_jaxs_own_and_names_no_one_from_one_step(
    session,
):
    """Issue 32 item 8, in a real shell: ``%mh_barrier`` is a step of the user's; the
    ``assert_equal`` that ``jax.device_put`` makes inside JAX says so, at the user's line;
    from fewer steps than it needs, no straggler is named."""
    from IPython.utils.capture import capture_output

    ip, magics = _shell(session)
    with capture_output():
        ip.run_cell_magic(
            'mh', '', 'nb_put = jax.device_put(np.arange(8.0), NamedSharding(mesh, P()))'
        )
        ip.run_line_magic('mh_barrier', 'nb-ckpt --timeout 30')
    view = ip.run_line_magic('mh_timeline', '--last 2')
    put, ckpt = view.timeline.steps[-2:]
    assert put.inside == 'jax.device_put' and not put.notebook, view.text()
    assert all(r.site.endswith(', line 1 (inside jax.device_put)') for r in put.records.values()), (
        put.records
    )
    assert ckpt.name == 'nb-ckpt' and not ckpt.notebook, view.text()
    st = view.timeline.stragglers()
    assert st.host is None and st.steps == 2 and st.notebook == 0, view.text()
    assert view.text().startswith('too few steps to name a straggler: 2 of the 5 it needs')
    assert '[inside jax.device_put]' in view.text() and 'inside jax.device_put' in (
        view.static_html()
    )
    magics.session = None


def test_a_view_magic_run_again_closes_the_view_it_replaces(session):
    """Issue 33 item 3: re-running ``%mh_layout x`` (or ``%mh_where``) closes the widgets of
    the view it replaces, so the kernel's widgets stay flat; a view kept under a user's
    name stays open; a closed view still has its text."""
    import ipywidgets.widgets.widget as ww

    ip, magics = _shell(session)
    first = ip.run_line_magic('mh_layout', 'a_xy')
    alive = len(ww._instances)
    second = ip.run_line_magic('mh_layout', 'a_xy')
    assert first._closed and not hasattr(first, 'layout') and not second._closed
    assert first._repr_mimebundle_() == {'text/plain': second.text()}
    assert len(ww._instances) <= alive, (len(ww._instances), alive)
    steady = len(ww._instances)
    for _ in range(3):
        ip.run_line_magic('mh_layout', 'a_xy')
        assert len(ww._instances) == steady, (len(ww._instances), steady)
    other = ip.run_line_magic('mh_layout', 'a_3d')  # another name: both stay
    last = magics.shown._last['%mh_layout a_xy']
    assert not other._closed and not last._closed
    ip.user_ns['kept_view'] = last  # the user keeps it: left open
    ip.run_line_magic('mh_layout', 'a_xy')
    assert not last._closed
    del ip.user_ns['kept_view']
    where = ip.run_line_magic('mh_where', '')
    ip.run_line_magic('mh_where', '')
    assert where._closed and 'process' in where.text()
    magics.session = None


def test_the_toolkits_calls_leave_ipyparallels_caches_flat(session):
    """Issue 33 item 2: ipyparallel keeps every message id in the client's ``history`` and
    every result in the hub's database (up to 1,024 records or 1 GB) unless purged; the
    toolkit's calls, cells and barriers forget theirs once read, so 40 more rounds leave
    both as they were (the hub is told in batches of 64); a user's own entry stays."""
    import time

    c = session.client

    def sizes():
        return len(c.history), len(c.hub_history())

    def round_():
        session.call('multihost.engine.engine_info')
        session.execute('_soak = 1', echo=False)
        session.barrier('soak')

    round_()
    history0, hub0 = sizes()
    mine = c[session.engine_ids[0]].apply_async(int, '7')  # a user's own call
    assert mine.get(10) == 7
    for _ in range(40):
        round_()
    n = session.num_processes
    # The hub is told on a thread of its own: given time (a loaded machine), it catches up.
    wait_until(lambda: sizes()[1] <= hub0 + 1 + 3 * n + 64, 20.0, lambda: f'{hub0}, {sizes()}',
               period=0.2, sleep=time.sleep)  # fmt: skip
    history, hub = sizes()
    assert history <= history0 + 1 + 3 * n, (history0, history)  # one round in flight
    assert hub <= hub0 + 1 + 3 * n + 64, (hub0, hub)  # 40 rounds sent 480 messages
    assert mine.msg_ids[0] in c.history and mine.msg_ids[0] in c.hub_history()


def test_diff_of_a_tie_blames_no_host_and_shows_both_values(session):
    """Issue 32 item 3, in a real shell: processes 0-1 hold one value, 2-3 another: no
    majority, so ``%mh_diff`` names no odd host, says so, and shows both values."""
    from IPython.utils.capture import capture_output

    ip, magics = _shell(session)
    session.execute('tie_w = {"w": np.full(3, 1.5 if jax.process_index() >= 2 else 0.5)}',
                    echo=False)  # fmt: skip
    with capture_output():
        view = ip.run_line_magic('mh_diff', 'tie_w')
    (leaf,) = view.diff.leaves
    assert leaf.tie and leaf.odd_processes == () and view.diff.odd_processes == ()
    text = view.text()
    assert 'no majority, so no process is odd' in text and 'odd processes' not in text, text
    assert "['w'] [value]: processes 0-1 and 2-3 differ; no majority" in text, text
    assert 'process 0: [0.5 0.5 0.5]' in text and 'process 2: [1.5 1.5 1.5]' in text, text
    assert 'no majority, so no process is odd' in view.static_html()
    assert view._details.titles == ("['w']  [value]  no majority",), view._details.titles
    magics.session = None


def test_census_magics_name_the_odd_host(session):
    """%mh_env names a flag set on process 2 only; %mh_memory_census names the 64 MiB array
    process 1 keeps."""
    from mhnotebook.widgets import EnvView, MemoryView

    ip, magics = _shell(session)
    session.execute(
        'import os, jax.numpy as jnp\n'
        'saved_flags = os.environ.get("XLA_FLAGS")\n'
        'if jax.process_index() == 2:\n'
        '    os.environ["XLA_FLAGS"] = "--xla_dump_to=/tmp/nowhere"\n'
        'leak = [jnp.zeros((16, 1024, 1024))] if jax.process_index() == 1 else []\n',
        echo=False,
    )
    try:
        env = ip.run_line_magic('mh_env', '')
        assert isinstance(env, EnvView)
        assert [e.key for e in env.diff.entries] == ['env.XLA_FLAGS'], env.text()
        assert env.diff.odd_processes == (2,)
        assert 'xla_dump_to' in env.static_html() and 'mh-env-table' in env.static_html()
        mem = ip.run_line_magic('mh_memory_census', '')
        assert isinstance(mem, MemoryView)
        assert mem.census.odd_processes == (1,), mem.text()
        assert 'leak[0]' in mem.census.only_some[0].names, mem.text()
        assert 'data:image/png' in mem.static_html()  # the heatmap
        assert 'mh-mem-leaks' in mem.static_html() and 'leak[0]' in mem.static_html()
    finally:
        session.execute(
            'leak = None\n'
            'if saved_flags is None:\n'
            '    os.environ.pop("XLA_FLAGS", None)\n'
            'else:\n'
            '    os.environ["XLA_FLAGS"] = saved_flags\n',
            echo=False,
        )
        magics.session = None


def test_nan_magic_names_host_device_and_index(session):
    """%mh_nonfinite names the shard on process 2 holding a NaN, marks its block; a clean tree
    is ok."""
    from IPython.core.error import UsageError

    from mhnotebook.widgets import NonfiniteView

    ip, magics = _shell(session)
    session.execute(
        'def _poison(i):\n'
        '    v = np.arange(96, dtype=np.float32).reshape(16, 6)[i].copy()\n'
        '    if jax.process_index() == 2 and i[0].start == 8:\n'
        '        v[1, 1] = np.nan\n'
        '    return v\n'
        'nan_x = jax.make_array_from_callback((16, 6), NamedSharding(mesh, P("x")), _poison)\n'
        'nan_tree = {"x": nan_x, "loc": loc}\n',
        echo=False,
    )
    try:
        view = ip.run_line_magic('mh_nonfinite', 'nan_tree')
        assert isinstance(view, NonfiniteView)
        report = view.report
        # P('x') over the (4, 2) mesh: host 2 holds rows 8:12 on both of its devices.
        assert [(s.process, s.local_device, s.index, s.nan, s.first) for s in report.shards] == [
            (2, 0, ((8, 12), (0, 6)), 1, (9, 1)),
            (2, 1, ((8, 12), (0, 6)), 1, (9, 1)),
        ], report.format()
        assert "['x'] block [8:12, 0:6] on process 2, device" in view.text()
        assert [b.index for b in view.layout_view.grid.marked] == [((8, 12), (0, 6))]
        assert 'mh-nonfinite-shard ' in view.static_html()
        assert ip.run_line_magic('mh_nonfinite', 'tree').report.ok
        with pytest.raises(UsageError, match='not defined'):
            ip.run_line_magic('mh_nonfinite', 'no_such_name')
        assert 'Example' in (ip.find_line_magic('mh_nonfinite').__doc__ or '')
    finally:
        session.execute('nan_x = nan_tree = None', echo=False)
        magics.session = None


def test_library_calls_in_cells_are_recorded_on_the_engines(session):
    """The engines install at start-up: a library's own `multihost_utils.sync_global_devices`
    in a %%mh cell is checked and lands in every engine's flight records, by name and site."""
    import ast

    from IPython.utils.capture import capture_output

    ip, magics = _shell(session)
    try:
        with capture_output():
            ip.run_cell_magic(
                'mh',
                '--timeout 60',
                'from jax.experimental.multihost_utils import sync_global_devices\n'
                "sync_global_devices('lib-in-cell')\n",
            )
    finally:
        magics.session = None
    out = session.execute(
        'from multihost import _recorder\n'
        'from multihost._job import _install\n'
        '_last = _recorder.snapshot(jax.process_index())[-1]\n'
        'print(repr((_last.kind, _last.name, _last.state, bool(_install.installed()))))',
        echo=False,
    )
    for p in range(4):
        assert ast.literal_eval(out[p].strip().splitlines()[-1]) == (
            'barrier',
            'lib-in-cell',
            'passed',
            True,
        ), out[p]


def test_replay_magic_names_the_first_operation_where_hosts_part(session):
    """%mh_replay step(w, x): the step's jaxpr op by op on the engines; a host-dependent
    constant on process 3 is named at its multiply; bad calls raise UsageError."""
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    ip, _ = _shell(session)
    session.execute(
        'import jax.numpy as jnp\n'
        'rw = multihost.host_local_array_to_global_array(\n'
        '    np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), mesh, P())\n'
        'rx = make((8, 4), P())\n'
        'def drift_step(w, x):\n'
        '    h = jnp.tanh(x @ w / 100.0)\n'
        '    return h * (1.0 + 1e-3 * (jax.process_index() == 3))\n'
        'def same_step(w, x):\n'
        '    return jnp.tanh(x @ w / 100.0)\n',
        echo=False,
    )
    from mhnotebook.widgets import ReplayView

    with capture_output() as cap:
        view = ip.run_line_magic('mh_replay', 'drift_step(rw, rx)')
    assert isinstance(view, ReplayView) and not cap.stdout, cap.stdout
    said = view.text()
    assert 'replay of drift_step on 4 processes:' in said, said
    assert 'first operation whose outputs differ between hosts:' in said
    assert ' mul -> f32[8,3] at ' in said and 'on process 3' in said, said
    # the view: the equations before it (agreed), the multiply marked, with its line
    html = view.widget.children[2].value
    assert html.count('mh-replay-parted') == 1 and 'mh-replay-agreed' in html, html
    assert view.replay.first is not None and view.replay.first.primitive == 'mul'
    assert [e.index for e in view.replay.before] == list(
        range(max(0, view.replay.first.index - 12), view.replay.first.index)
    )
    again = ip.run_line_magic('mh_replay', 'same_step(rw, rx) --again 3')
    assert 'the hosts agree: inputs, 3 runs of the compiled launch' in again.text(), again.text()
    assert again.widget.children[2].value == ''  # no operation parted: no table
    for bad in ['drift_step', 'drift_step(rw, x=rx)', 'drift_step(rw, 1 + 2)', 'f(rw) --again 0']:
        with pytest.raises(UsageError):
            ip.run_line_magic('mh_replay', bad)
