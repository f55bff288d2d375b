"""The structure stays easy to see: no import cycle, one JAX-internals adapter, one KV user.

Read from the source (AST), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).parent.parent
PACKAGES = ('multihost', 'mhnotebook')


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob('*.py'):
            parts = path.relative_to(ROOT).with_suffix('').parts
            name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
            out[name] = path
    return out


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """Project modules imported anywhere in ``path`` (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f'{node.module}.{alias.name}'
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m not in PACKAGES}


def test_no_import_cycle():
    """No module reaches itself through imports (package __init__ files aside)."""
    modules = _modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items() if m not in PACKAGES}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                cycles.append(' -> '.join([*path, nxt]))
            elif nxt not in path and len(path) < 8:
                visit(nxt, [*path, nxt])

    for m in sorted(graph):
        visit(m, [m])
    assert not cycles, 'import cycles:\n' + '\n'.join(sorted(set(cycles)))


def test_jax_internals_only_in_the_adapter():
    """`jax._src` is imported by exactly one module, multihost/_jax_adapter.py."""
    users = sorted(
        str(p.relative_to(ROOT))
        for p in _modules().values()
        if any(
            (isinstance(n, ast.ImportFrom) and (n.module or '').startswith('jax._src'))
            or (isinstance(n, ast.Import) and any(a.name.startswith('jax._src') for a in n.names))
            for n in ast.walk(ast.parse(p.read_text()))
        )
    )
    assert users == ['multihost/_jax_adapter.py'], users


def test_only_the_exchange_talks_to_the_coordination_service():
    """Key-value and barrier calls on the coordination client live in multihost/_exchange/_kv.py."""
    calls = (
        'key_value_set',
        'key_value_try_get',
        'key_value_dir_get',
        'key_value_delete',
        'key_value_increment',
        'blocking_key_value_get',
        'wait_at_barrier',
    )
    users = sorted(
        str(p.relative_to(ROOT))
        for p in _modules().values()
        if any(
            isinstance(n, ast.Attribute) and n.attr in calls
            for n in ast.walk(ast.parse(p.read_text()))
        )
    )
    # The test harness's worker: its own start/end barriers around each call.
    assert users == ['multihost/_exchange/_kv.py', 'multihost/testing/_worker.py'], users


#: Each package's rooms by floor: a module may import its own room and rooms on
#: lower floors, never sideways or upward. A top-level module is a room of its own.
FLOORS = {
    'multihost': {
        # floor 0: helpers that import no other project module
        '_errors': 0,
        '_text': 0,
        '_jax_adapter': 0,
        '_recorder': 0,
        '_structure': 0,
        '_names': 0,
        '_net': 0,  # addresses, routes, free ports (stdlib): engine, testing and the notebook
        '_cells': 0,  # notebook cells as IPython names them (Cell In[4]), looked up lazily
        '_models': 1,  # the frozen models that cross the wire: numpy + stdlib, no engine code
        '_exchange': 2,  # kv rounds, the collective sequence, the debug bus
        '_core': 3,  # the drop-in collectives and array conversions
        '_debug': 3,  # stacks, step gate, watch, wavefront, timeline, control
        '_checks': 4,  # tree diff, layout, replicas, census, non-finite values
        '_job': 5,  # install, run, dumps, signal handlers (programs we did not start)
        'engine': 5,  # what the notebook calls on an engine
        'testing': 5,  # the test harness: LocalCluster, its worker, the plain-process jobs
        '__main__': 6,
        '__init__': 6,  # the public surface re-exports every room
    },
    'mhnotebook': {
        '_errors': 0,
        '_trampoline': 0,
        '_cleanup': 0,  # the watchdog runs as its own process: stdlib only
        'widgets': 0,  # views: pure functions of multihost's models
        '_transfer': 1,  # gathered blocks: /dev/shm files, a tcp stream
        '_interrupt': 1,
        '_poll': 1,  # the wait for hosts' results (calls, JAX start-up)
        # the one protocol of every job view, the data tools once over one transport hook
        # (a gather through `_transfer`); stepping's wait (moved_on)
        '_jobview': 2,
        '_lifecycle': 2,  # a session's engines, dead hosts, interrupts, stop and restart
        '_session': 3,
        '_attach': 3,  # a job started elsewhere, through its control endpoint
        '_postmortem': 3,  # a job's dump files: the same models, no cluster
        '_cluster': 4,  # start / connect engines, JAX initialization
        '_views': 4,  # Session -> models -> widgets
        '_magics': 5,
        '__init__': 6,
        '_demo': 7,  # the main job: uses the public surface, as a user does
        '__main__': 8,
    },
}


def _room(module: str) -> tuple[str, str]:
    """``multihost._exchange._kv`` -> ('multihost', '_exchange'); the package -> '__init__'."""
    parts = module.split('.')
    pkg, room = parts[0], parts[1] if len(parts) > 1 else '__init__'
    return pkg, room


def test_every_module_lives_in_a_room_of_the_floor_map():
    """A new file or folder is placed on the map (ARCHITECTURE.md draws the same map)."""
    unplaced = sorted(m for m in _modules() if _room(m)[1] not in FLOORS[_room(m)[0]])
    assert not unplaced, (
        f'modules in no room of FLOORS (add them, and to ARCHITECTURE.md): {unplaced}'
    )
    on_disk = {
        p.stem if p.is_file() else p.name
        for pkg in PACKAGES
        for p in (ROOT / pkg).iterdir()
        if (p.suffix == '.py') or (p / '__init__.py').exists()
    }
    reserved: set[str] = set()  # rooms the map keeps for the next issues
    missing = sorted(set().union(*map(set, FLOORS.values())) - on_disk - reserved)
    assert not missing, f'rooms on the map but not on disk: {missing}'


def test_no_import_runs_sideways_or_upward_between_rooms():
    """Rooms import only themselves and lower floors; multihost never imports mhnotebook."""
    modules = _modules()
    wrong = []
    for m, path in modules.items():
        pkg, room = _room(m)
        floor = FLOORS[pkg][room]
        crossing = {'mhnotebook'} & _top_imports(path) if pkg == 'multihost' else set()
        for dep in _imports(path, modules) | crossing:
            dpkg, droom = _room(dep)
            if pkg == 'multihost' and dpkg == 'mhnotebook':
                wrong.append(f'{m} -> {dep} (the engine side never imports the notebook side)')
            elif dpkg == pkg and droom != room and FLOORS[pkg][droom] >= floor:
                wrong.append(f'{m} (floor {floor}) -> {dep} (floor {FLOORS[pkg][droom]})')
    assert not wrong, 'imports against the floor map:\n' + '\n'.join(sorted(wrong))


def _top_imports(path: pathlib.Path) -> set[str]:
    """Top-level package names imported by ``path``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split('.')[0])
        elif isinstance(node, ast.Import):
            out.update(a.name.split('.')[0] for a in node.names)
    return out


def test_every_engine_function_the_notebook_calls_is_in_engine_all():
    """'multihost.engine.X' strings in mhnotebook name functions engine exports in __all__."""
    import re

    import multihost.engine as engine

    called = set()
    for m, path in _modules().items():
        if m.startswith('mhnotebook'):
            called.update(re.findall(r"'multihost\.engine\.(\w+)'", path.read_text()))
    assert called, 'no engine call found: the pattern no longer matches how the notebook calls'
    missing = sorted(called - set(engine.__all__))
    assert not missing, f'called by the notebook but not in multihost.engine.__all__: {missing}'
    assert all(callable(getattr(engine, name)) for name in called), called


def test_every_engine_tool_the_notebook_names_is_in_the_one_registry():
    """Tools the notebook asks for by name (``call_tool('layout', ...)``, a gather's
    ``call('gather_meta', ...)``) are tools of `multihost.engine.tools.TOOLS`, the registry
    both a session's engines and an attached job's held hosts run them from."""
    import re

    from multihost.engine import held
    from multihost.engine.tools import TOOLS

    named = set()
    for m, path in _modules().items():
        if m.startswith('mhnotebook'):
            text = path.read_text()
            named.update(re.findall(r"(?:call_tool|_one|_tool|call)\(\s*'(\w+)'", text))
    assert {'gather_meta', 'gather_send', 'layout', 'diff', 'run_cell'} <= named, named
    missing = sorted(named - set(TOOLS))
    assert not missing, f'asked for by the notebook but not in multihost.engine.tools: {missing}'
    assert not hasattr(held, 'TOOLS'), 'a second table of tools: use multihost.engine.tools'
    for name, tool in TOOLS.items():
        assert tool.name == name and callable(tool.function) and tool.timeout > 0, name


def _imported_modules(path: pathlib.Path) -> set[str]:
    """The modules ``path``'s import statements name (``from a.b import c``: ``a.b``, and
    ``a.b.c`` only when it is a project module), lazy ones included."""
    modules = _modules()
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f'{node.module}.{a.name}' for a in node.names} & set(modules)
            out.update(subs or {node.module})
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _third_party_reached(start: str) -> dict[str, set[str]]:
    """Project module -> the non-stdlib packages it imports, for every project module ``start``
    reaches through imports (itself included, lazy imports too)."""
    import sys

    modules = _modules()
    seen, todo, out = set(), [start], {}
    while todo:
        m = todo.pop()
        if m in seen or m not in modules:
            continue
        seen.add(m)
        third = {
            top
            for top in _top_imports(modules[m])
            if top not in sys.stdlib_module_names and top not in PACKAGES
        }
        if third:
            out[m] = third
        todo.extend(_imported_modules(modules[m]))
    return out


def test_the_models_room_imports_no_engine_code():
    """multihost/_models imports numpy, the standard library and floor-0 helpers only, and
    nothing it reaches imports jax (nor any package but numpy)."""
    wrong = []
    for m, path in _modules().items():
        if not m.startswith('multihost._models'):
            continue
        for dep in _imported_modules(path):
            parts = dep.split('.')
            if parts[0] == 'multihost':
                room = parts[1] if len(parts) > 1 else '__init__'
                if room != '_models' and (FLOORS['multihost'].get(room) != 0 or 'jax' in room):
                    wrong.append(f'{m} -> {dep} (neither a model nor a floor-0 helper)')
        for reached, third in _third_party_reached(m).items():
            if third - {'numpy'}:
                wrong.append(f'{m} reaches {reached}, which imports {sorted(third)}')
    assert not wrong, 'the models room imports engine code:\n' + '\n'.join(sorted(set(wrong)))


def test_the_models_check_sees_jax_through_a_helper():
    """The reach above is real: a floor-0 helper importing jax counts against the models."""
    assert 'jax' in _third_party_reached('multihost._jax_adapter')['multihost._jax_adapter']
    assert _third_party_reached('multihost._models._layout') == {
        'multihost._models._layout': {'numpy'},
        'multihost._models._hardware': {'numpy'},
    }


#: What the widgets may import from multihost: the models, and the floor-0 helpers for text
#: (`_text`) and notebook cells (`_cells`). Not `multihost` itself: it imports every room.
WIDGET_ALLOWED = ('multihost._models', 'multihost._text', 'multihost._cells')


def _engine_imports(path: pathlib.Path) -> list[str]:
    """The multihost modules ``path`` imports that a widget may not."""
    return sorted(
        dep
        for dep in _imported_modules(path)
        if dep.split('.')[0] == 'multihost'
        and not any(dep == a or dep.startswith(a + '.') for a in WIDGET_ALLOWED)
    )


def test_widgets_import_models_and_text_helpers_only():
    """mhnotebook/widgets draw models: from multihost they import `_models`, `_text`, `_cells`."""
    wrong = [
        f'{m} -> {dep}'
        for m, path in _modules().items()
        if m.startswith('mhnotebook.widgets')
        for dep in _engine_imports(path)
    ]
    assert not wrong, 'widgets importing engine code:\n' + '\n'.join(wrong)


def test_the_widget_check_catches_an_engine_import(tmp_path: pathlib.Path):
    """The check above is real: a widget importing `multihost._checks` (even lazily) fails it."""
    bad = tmp_path / 'bad.py'
    bad.write_text(
        'from multihost._checks._layout import format_index\n'
        'from multihost._models._layout import Index\n'
        'from multihost import Layout\n'
        'def f():\n'
        '    import multihost._debug._stacks\n'
    )
    assert _engine_imports(bad) == [
        'multihost',
        'multihost._checks._layout',
        'multihost._debug._stacks',
    ]
