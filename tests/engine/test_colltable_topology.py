"""The collective table of programs compiled for real TPU pods, without TPUs: libtpu on this
CPU machine (``JAX_PLATFORMS=cpu``) compiles for a v5e:4x4 pod and for two of them
(``num_slices=2``), and the table names the mesh axes, the processes of each group, which
collectives stay inside a slice and which cross slices (DCN), and this file's lines.

Needs libtpu, as `test_layout_topology` does: skipped without it, saying so;
``MH_REQUIRE_LIBTPU=1`` fails instead. The tests at the end read HLO text alone (no libtpu).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from _helpers import libtpu_mark, source_line
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from multihost._debug._colltable import collective_table, table_for
from multihost._models._colltable import CollectiveTable

needs_libtpu = libtpu_mark()


def _partial_sums(x: jax.Array) -> jax.Array:
    return jnp.sum(x, axis=0)  # colltable: rows summed


def _step(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    rows = _partial_sums(x)
    cols = jnp.sum(x, axis=1)  # colltable: columns summed
    return rows, cols, x @ x.T


def _compiled(slices: int) -> tuple[jax.stages.Compiled, Mesh]:
    from jax.experimental import topologies

    os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # no chip: no lock (as _preview)
    extra = {'num_slices': slices} if slices > 1 else {}
    topo = topologies.get_topology_desc(topology_name='v5e:4x4', platform='tpu', **extra)
    devices = np.array(topo.devices)
    if slices > 1:
        mesh = Mesh(devices.reshape(slices, 4, 4), ('slice', 'data', 'model'))
        s = NamedSharding(mesh, P(('slice', 'data'), 'model'))
    else:
        mesh = Mesh(devices.reshape(4, 4), ('data', 'model'))
        s = NamedSharding(mesh, P('data', 'model'))
    shape = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=s)
    traced = jax.jit(_step, in_shardings=s).trace(shape)
    return traced.lower(lowering_platforms=('tpu',)).compile(), mesh


@needs_libtpu
def test_v5e_4x4_pod_names_axes_processes_and_lines():
    compiled, mesh = _compiled(1)
    table = table_for(compiled)
    assert table_for(compiled) is table  # once per executable
    assert CollectiveTable.from_json(table.to_json()) == table
    assert table.program == 'jit__step' and table.num_devices == 16
    assert table.processes == (0, 1, 2, 3) and table.slices == 0
    assert table.mesh_axes == (('data', 4), ('model', 4))
    kinds = [(op.kind, op.axes) for op in table.ops]
    assert kinds == [
        ('all-reduce', ('data',)),
        ('all-gather', ('data',)),
        ('all-reduce', ('model',)),
    ], table
    rows, gather, cols = table.ops
    # 'data' crosses the pod's 4 hosts (2x2 chips each); 'model' spans 2 hosts' chips in a row
    ids = {d.id: d for d in mesh.devices.flat}
    for g in rows.groups:
        assert [ids[i] for i in g] in [list(c) for c in mesh.devices.T]
    assert rows.process_groups == ((0, 1, 2, 3),) and rows.cross_process
    assert cols.process_groups == ((0,), (1,), (2,), (3,)) and not cols.cross_process
    assert all(op.crosses_slices is None and not op.dcn for op in table.ops)
    here = os.path.basename(__file__)
    line = source_line(_partial_sums, 'return jnp.sum(x, axis=0)')
    assert rows.site == f'{__file__}:{line} in _partial_sums'
    assert rows.frames[1] == f'{__file__}:{source_line(_step, "rows =")} in _step'
    assert table.first_holding([3]) is rows
    assert rows.words(3) == (
        f"all-reduce of f32[16] over mesh axis 'data' (processes 0-3), from {here}:{line} in "
        '_partial_sums'
    )
    assert cols.words() == (
        "all-reduce of (f32[16], f32[16,64]) over mesh axis 'model' (inside each process), "
        f'from {here}:{source_line(_step, "cols =")} in _step'
    )
    assert gather.shape == 'bf16[64,16]'


@needs_libtpu
def test_two_slices_say_which_collectives_cross_slices():
    compiled, mesh = _compiled(2)
    table = collective_table(compiled)
    assert table.slices == 2 and table.num_devices == 32 and table.processes == tuple(range(8))
    assert table.mesh_axes == (('slice', 2), ('data', 4), ('model', 4))
    across = [op for op in table.ops if op.crosses_slices]
    inside = [op for op in table.ops if op.crosses_slices is False]
    assert across and inside and len(across) + len(inside) == len(table.ops)
    # XLA splits the program per slice: across slices only the DCN transfers, over 'slice'
    assert all(op.dcn and op.axes == ('slice',) for op in across), across
    assert {op.kind for op in across} == {'all-reduce', 'all-gather'}
    # each DCN group: the same chip of both slices, one process of each
    for op in across:
        assert len(op.groups) == 16 and all(len(g) == 2 for g in op.groups)
        assert op.process_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
        assert 'across slices (DCN)' in op.words()
    assert {op.axes for op in inside} == {('data',), ('model',)}
    data = [op for op in inside if op.axes == ('data',)]
    assert all(op.process_groups == ((0, 1, 2, 3), (4, 5, 6, 7)) for op in data)
    slice_of = {d.id: d.slice_index for d in mesh.devices.flat}
    for op in inside:
        assert all(len({slice_of[i] for i in g}) == 1 for g in op.groups)
        assert 'inside a slice' in op.words()
    assert any(op.site.startswith(f'{__file__}:') for op in inside)


HLO = """HloModule jit_f, is_scheduled=true, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  ROOT %s = f32[] add(%a, %b)
}

%body (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %ag-start = (f32[2]{0}, f32[8]{0}) all-gather-start(%p), channel_id=3, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(f)/ag" source_file="/work/x.py" source_line=7}
  ROOT %ag-done = f32[8]{0} all-gather-done(%ag-start), metadata={op_name="jit(f)/ag" source_file="/work/x.py" source_line=7}
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(%x), channel_id=1, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=%add
  %cp = f32[8]{0} collective-permute(%ar), channel_id=2, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %call = f32[8]{0} call(%cp), to_apply=%body
  ROOT %rs = f32[2]{0} reduce-scatter(%call), channel_id=4, replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}, to_apply=%add
}
"""  # noqa: E501


def test_hlo_text_alone_reads_each_group_form_in_program_order():
    """Without devices the groups stay logical ids; the order steps into called computations;
    an async pair counts once, at its start."""
    table = collective_table(HLO)
    assert [(op.kind, op.name) for op in table.ops] == [
        ('all-reduce', 'ar'),
        ('collective-permute', 'cp'),
        ('all-gather', 'ag-start'),
        ('reduce-scatter', 'rs'),
    ]
    ar, cp, ag, rs = table.ops
    assert ar.groups == () and ar.groups_text == '{{0,2},{1,3}}'
    assert cp.groups_text == '{{0,1},{1,2},{2,3},{3,0}}'
    assert ag.shape == 'f32[8]' and ag.computation == 'body'
    assert ag.frames == ('/work/x.py:7',) and ag.site == '/work/x.py:7'
    assert rs.groups_text == '[2,2]<=[2,2]T(1,0)'
    assert table.notes == ('no device assignment: groups are logical ids, processes unknown',)
    assert CollectiveTable.from_json(table.to_json()) == table


def test_two_programs_part_where_their_collectives_differ_and_the_verdict_words():
    """`first_difference` finds the first differing collective; `stuck_words` says where hosts
    wait when a peer never launched, or plainly that it is not known."""
    import dataclasses

    from multihost._models._colltable import CollectiveTable, stuck_words

    a = collective_table(HLO)
    ops = list(a.ops)
    ops[1] = dataclasses.replace(ops[1], shape='f32[16]')
    b = dataclasses.replace(a, ops=tuple(ops))
    assert a.first_difference(a) is None
    assert a.first_difference(b) == (1, a.ops[1], b.ops[1])
    assert a.first_difference(dataclasses.replace(a, ops=a.ops[:2])) == (2, a.ops[2], None)
    unknown = CollectiveTable(program='step', notes=('2 programs compiled for step: ...',))
    assert stuck_words(unknown, 'step call #5', [0, 1], [2]) == (
        'processes 0-1 wait inside step call #5; which collective is not known: 2 programs '
        'compiled for step: ...'
    )
    assert stuck_words(None, 'step call #5', [0, 1], [2]) == ''


def test_every_host_inside_one_launch_names_its_collectives_not_which_one_each_is_in():
    """No host behind (a host callback or the device is slow on one): the launch's
    collectives, the first three in words, and plainly that where each host is is not seen."""
    from multihost._models._colltable import CollectiveTable, all_inside_words

    table = collective_table(HLO)
    said = all_inside_words(table, 'step call #5')
    head = "step call #5's collectives (which one each host is in is not seen from the host): "
    assert said.startswith(head + f'#0 {table.ops[0].words()}; #1 '), said
    assert said.count('; #') == min(len(table.ops), 3) - 1, said
    more = len(table.ops) - 3
    assert said.endswith(f'; ... {more} more') == (more > 0), said
    unknown = CollectiveTable(program='step', notes=('2 programs compiled for step: ...',))
    assert all_inside_words(unknown, 'step call #5') == (
        'step call #5: which collectives the hosts are in is not known: 2 programs compiled '
        'for step: ...'
    )


@needs_libtpu
def test_the_pod_under_a_stuck_collective_marks_its_groups_and_the_hosts_it_waits_for():
    """A table of a v5e:4x4 program keeps its chips; hosts 0-2 inside its launch while host
    3 never launched it: the wavefront names the all-reduce over 'data' and its pod picture
    labels each chip with its group (the mesh's columns), marks host 3's chips, and the where
    view shows it (HTML, text, PNG)."""
    from mhnotebook.widgets import WhereView
    from mhnotebook.widgets.layout.chips import chip_grid_html, render_chip_grid_png
    from multihost import FlightRecord, HostFront, HostStacks, Wavefront
    from multihost._models._chipgrid import collective_grid

    compiled, mesh = _compiled(1)
    table = table_for(compiled)
    assert len(table.devices) == 16 and all(len(d.coords) >= 2 for d in table.devices)
    assert CollectiveTable.from_json(table.to_json()).devices == table.devices
    rows = table.ops[0]
    grid = collective_grid(table, rows, waiting_for=(3,))
    assert grid is not None and grid.marked == (3,) and grid.hosts == 4
    label = {d: c.label for c in grid.chips for d in c.device_ids}
    for column in mesh.devices.T:  # the groups over 'data' are the mesh's columns
        assert len({label[d.id] for d in column}) == 1, label
    assert sorted(set(label.values())) == ['g0', 'g1', 'g2', 'g3']
    text = grid.text()
    assert text.splitlines()[0] == f'#0 {rows.words()}', text
    assert (
        'gK = in group K of #0 (4 groups)' in text
        and 'dashed: process 3, never launched it' in text
    )

    def launch(p: int) -> FlightRecord:
        return FlightRecord(
            n=3, kind='launch', name='_step', call=0, seq=-1, digest='ab' * 8,
            fingerprint='', site=f'{__file__}:50', time=1000.0, wait=None,
            state='launched', process=p,
        )  # fmt: skip

    inside = [
        HostFront(
            process=p,
            answered=True,
            last=launch(p),
            last_launch=launch(p),
            pending=launch(p),
            pending_age=40.0,
            calls=(('_step', 1),),
            collectives=table,
        )  # fmt: skip
        for p in (0, 1, 2)
    ]
    never = HostFront(process=3, answered=True, where='train.py:9 in load')
    wf = Wavefront(hosts=(*inside, never), time=1040.0)
    stuck = wf.stuck_collective()
    assert stuck is not None and stuck[1] == rows and stuck[2] == (3,)
    assert "all-reduce of f32[16] over mesh axis 'data'" in wf.verdict, wf.verdict
    assert wf.stuck_grid() == grid
    html = chip_grid_html(grid)
    assert html.count('mh-chip-marked') == 4 and 'mh-chip-title' in html  # host 3's 4 chips
    assert render_chip_grid_png(grid).startswith(b'\x89PNG')
    stacks = {p: HostStacks(process=p, answered=True) for p in range(4)}
    view = WhereView(stacks, verdict=lambda: wf)
    assert view.verdict == wf.verdict and view.grid == grid
    assert 'mh-chip-marked' in view._chips.value and f'#0 {rows.words()}' in view.text()
    assert WhereView(stacks, verdict=wf.verdict).grid is None  # a string: no picture
