"""The structure stays easy to see: no import cycle, one JAX-internals adapter, one KV user.

Read from the source (AST), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent.parent
PACKAGES = ('multihost', 'mhnotebook')


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob('*.py'):
            out[_name_of(path)] = path
    return out


def _name_of(path: pathlib.Path) -> str:
    """``multihost/_exchange/_kv.py`` -> ``multihost._exchange._kv``; a package's
    ``__init__.py`` -> the package."""
    if not path.is_relative_to(ROOT):
        return path.stem  # a file a test wrote
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _named(
    path: pathlib.Path, modules: dict[str, pathlib.Path] | None = None, name: str = ''
) -> set[str]:
    """Every module ``path`` imports, in any form and anywhere in it (module level, inside a
    function, under ``TYPE_CHECKING``, in an ``__init__.py``):

    * ``import a.b`` -> ``a.b``; ``from a import b`` -> ``a.b`` when that is a project
      module, else ``a``; relative imports resolved against ``path``'s package;
    * ``importlib.import_module('a.b')``, ``__import__('a.b')``: their literal name;
    * in a module that imports by a computed name (``importlib.import_module(name)``), every
      string that names a project module below a package (``'multihost.engine.stopped'``): the
      table of modules it loads (the install patchers, the public surface's homes) is what
      it imports.

    The ``__init__.py`` of a package, which Python runs before any module in it, is not
    counted for its submodules' importers: `test_the_jax_free_rooms_import_without_jax`
    imports the rooms for real, so what that costs is measured there.
    """
    modules = _modules() if modules is None else modules
    tree = ast.parse(path.read_text())
    package = (name or _name_of(path)).split('.')
    if path.name != '__init__.py':
        package = package[:-1]
    out: set[str] = set()
    computed = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = '.'.join([*parent, base] if base else parent)
            for alias in node.names:
                sub = f'{base}.{alias.name}'
                out.add(sub if sub in modules else base)
        elif isinstance(node, ast.Call) and _loads_by_name(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(arg.value)
            else:
                computed = True
    if computed:
        out.update(
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and n.value in modules
            and '.' in n.value  # a module of a package (a bare package name: a prefix, a label)
        )
    return {n for n in out if n}


def _loads_by_name(func: ast.expr) -> bool:
    """``importlib.import_module``, ``import_module`` or ``__import__``."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', '')
    return name in ('import_module', '__import__')


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """Project modules ``path`` imports (`_named`), the packages' public surfaces included."""
    return {m for m in _named(path, modules) if m in modules} - {_name_of(path)}


def test_no_import_cycle():
    """No module reaches itself through imports (the packages' public surfaces included)."""
    modules = _modules()
    graph = {m: _imports(p, modules) for m, p in modules.items()}
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
        '_cmdline': 0,  # argparse that raises UsageError, counts: both commands' parsers
        '_defaults': 0,  # a job's option defaults (stdlib): `multihost run` parses without jax
        '_cells': 0,  # notebook cells as IPython names them (Cell In[4]), looked up lazily
        # the frozen models that cross the wire, the dump files and their analysis: numpy +
        # stdlib, importable without jax (test_the_jax_free_rooms_import_without_jax)
        '_models': 1,
        '_exchange': 2,  # kv rounds, the collective sequence, the debug bus
        '_core': 3,  # the drop-in collectives and array conversions
        '_debug': 3,  # stacks, step gate, watch, wavefront, timeline, control
        '_checks': 4,  # tree diff, layout, replicas, census, non-finite values
        'engine': 5,  # the tools a host runs for the notebook (stopped: on an attached job too)
        '_job': 6,  # install (its patchers: engine.stopped too), run, dumps, audit
        '__init__': 7,  # the public surface: loads every room below on its first name
        # the test harness: LocalCluster, its worker (a host that loads the drop-in whole, as
        # a user's program does), the plain-process jobs
        'testing': 8,
        '__main__': 9,
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


#: Modules on another floor than their room's. A session's engine starts through the public
#: surface (`multihost.engine.start`: JAX, then `multihost.install`, which loads the drop-in),
#: above `_job`, whose installer runs the room's `stopped` patcher; the face hands it on.
PLACED = {'multihost.engine.start': 8, 'multihost.engine': 8}


def _floor(module: str) -> int:
    pkg, room = _room(module)
    return PLACED.get(module, FLOORS[pkg][room])


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
        floor = _floor(m)
        crossing = {'mhnotebook'} & _top_imports(path) if pkg == 'multihost' else set()
        for dep in _imports(path, modules) | crossing:
            dpkg, droom = _room(dep)
            if pkg == 'multihost' and dpkg == 'mhnotebook':
                wrong.append(f'{m} -> {dep} (the engine side never imports the notebook side)')
            elif dpkg == pkg and (droom != room or _floor(dep) > floor) and _floor(dep) >= floor:
                wrong.append(f'{m} (floor {floor}) -> {dep} (floor {_floor(dep)})')
    assert not wrong, 'imports against the floor map:\n' + '\n'.join(sorted(wrong))


def _top_imports(path: pathlib.Path) -> set[str]:
    """Top-level package names imported by ``path`` (every form, `_named`)."""
    return {name.split('.')[0] for name in _named(path)}


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
    both a session's engines and an attached job's stopped hosts run them from."""
    import re

    from multihost.engine import stopped
    from multihost.engine.tools import TOOLS

    named = set()
    for m, path in _modules().items():
        if m.startswith('mhnotebook'):
            text = path.read_text()
            named.update(re.findall(r"(?:call_tool|_one|_tool|call)\(\s*'(\w+)'", text))
    assert {'gather_meta', 'gather_send', 'layout', 'diff', 'run_cell'} <= named, named
    missing = sorted(named - set(TOOLS))
    assert not missing, f'asked for by the notebook but not in multihost.engine.tools: {missing}'
    assert not hasattr(stopped, 'TOOLS'), 'a second table of tools: use multihost.engine.tools'
    for name, tool in TOOLS.items():
        assert tool.name == name and callable(tool.function) and tool.timeout > 0, name


def _imported_modules(path: pathlib.Path) -> set[str]:
    """The modules ``path`` imports (`_named`: ``from a.b import c`` is ``a.b``, and ``a.b.c``
    only when it is a project module), lazy ones included."""
    return _named(path)


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


#: The floor-0 helpers that import jax (the exceptions every host raises; the one jax._src
#: user): the rooms the notebook reads the models with stand on the others.
JAX_HELPERS = ('multihost._errors', 'multihost._jax_adapter')

#: Run with jax and jaxlib blocked: an import of either raises.
_BLOCK_JAX = """
import importlib.abc, sys

class _NoJax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jax', 'jaxlib'):
            raise ImportError(f'{name} is blocked in this test')

sys.meta_path.insert(0, _NoJax())
"""


def _without_jax(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter in which importing jax raises."""
    return subprocess.run(
        [sys.executable, '-c', _BLOCK_JAX + code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _jax_free_modules() -> list[str]:
    """Every module of the models room and of the floor-0 helpers but `JAX_HELPERS`."""
    return sorted(
        m
        for m in _modules()
        if m.startswith('multihost.')
        and FLOORS['multihost'].get(_room(m)[1], 9) <= FLOORS['multihost']['_models']
        and m not in JAX_HELPERS
    )


def test_the_jax_free_rooms_import_without_jax(tmp_path: pathlib.Path):
    """The models room (models, dump files, analysis) and the text helpers import with jax
    blocked, and so does the notebook: a post-mortem of real dump files, its verdict and its
    widgets, in a process where importing jax raises."""
    from multihost._models import _dumpfile

    sys.path.insert(0, str(ROOT / 'tests'))
    import _dump_cases

    for doc in _dump_cases.job_dumps(4):
        _dumpfile.write(str(tmp_path), doc)
    rooms = _jax_free_modules()
    assert {'multihost._models._analyze', 'multihost._models._dumpfile', 'multihost._text'} <= set(
        rooms
    ), rooms
    code = (
        'import importlib, sys\n'
        f'for name in {rooms!r}: importlib.import_module(name)\n'
        'import mhnotebook\n'
        'from mhnotebook import _views\n'
        'job = mhnotebook.postmortem(sys.argv[1])\n'
        'print(str(job.verdict()).splitlines()[0])\n'
        'print(type(_views.where_view(job)).__name__, type(_views.timeline_view(job)).__name__)\n'
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))\n"
    )
    done = _without_jax(code, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        '4 dumps of 4 processes (written for request: processes 1, 3; timeout: processes 0, 2)',
        'WhereView TimelineView',
        '[]',
    ], done.stdout


def test_the_jax_block_is_real():
    """The block above bites: `import multihost` alone imports no jax, its first public name
    loads the drop-in (jax first), which raises there."""
    done = _without_jax('import multihost\nprint("imported")\nmultihost.barrier\n')
    assert done.stdout == 'imported\n', done.stdout
    assert 'jax is blocked in this test' in done.stderr, done.stderr


def test_the_public_surface_loads_whole_on_its_first_name():
    """``import multihost`` imports no jax; its first public name loads every room and wires
    the hooks (`multihost._job._wiring`): the step gate's enter hook, collectives off the main
    thread, the debug thread's commands, the audit's control method; ``from multihost import
    *`` and ``dir`` give every public name."""
    code = (
        'import sys\n'
        'import multihost\n'
        "assert 'jax' not in sys.modules and 'multihost._core' not in sys.modules\n"
        'from multihost import *\n'
        'from multihost._debug import _control\n'
        'from multihost._exchange import _bus, _sequence, _threads\n'
        'missing = [n for n in multihost.__all__ if n not in globals()]\n'
        'assert not missing and set(multihost.__all__) <= set(dir(multihost)), missing\n'
        'assert _sequence._enter_hook is not None and _sequence._off_main is _threads\n'
        "assert {'stacks', 'front', 'records', 'stepping'} <= set(_bus._HANDLERS)\n"
        "assert 'audit' in _control._METHODS\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.stdout == 'ok\n', done.stderr


def test_importing_a_module_wires_nothing_and_wire_connects_every_hook():
    """Every module of `multihost` imported in a fresh process registers no command, hook
    or method; `multihost._job._wiring.wire()` connects each one once (a second call changes
    nothing)."""
    code = (
        'import importlib, pkgutil, multihost\n'
        "names = [m.name for m in pkgutil.walk_packages(multihost.__path__, 'multihost.')\n"
        "         if not m.name.endswith('__main__')]\n"
        'for name in names:\n'
        '    importlib.import_module(name)\n'
        'from multihost._job import _wiring\n'
        'from multihost._debug import _control\n'
        'from multihost._exchange import _bus, _sequence, _threads\n'
        'assert len(names) > 80 and not _wiring.wired()\n'
        'assert not _bus._HANDLERS and not _bus._ON_START, (_bus._HANDLERS, _bus._ON_START)\n'
        'assert _sequence._enter_hook is None and _sequence._off_main is None\n'
        "assert 'audit' not in _control._METHODS\n"
        'from multihost._debug import _wavefront\n'
        'assert _wavefront._table_source is None\n'
        '_wiring.wire()\n'
        'got = (dict(_bus._HANDLERS), list(_bus._ON_START), _sequence._enter_hook)\n'
        '_wiring.wire()\n'
        'assert got == (dict(_bus._HANDLERS), list(_bus._ON_START), _sequence._enter_hook)\n'
        "assert set(_bus._HANDLERS) == {'stacks', 'front', 'records', 'stepping', 'dump', 'fate'}\n"
        'assert len(_bus._ON_START) == 2 and _sequence._off_main is _threads\n'
        "assert _sequence._enter_hook is not None and 'audit' in _control._METHODS\n"
        'assert _wavefront._table_source is not None\n'
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.stdout == 'ok\n', done.stderr


def test_the_public_names_are_bound_where_type_checkers_read_them():
    """`multihost._HOMES` (what `_load` binds) is what the ``TYPE_CHECKING`` imports of
    ``multihost/__init__.py`` say, name for name, and ``__all__`` lists exactly those names."""
    import multihost

    said = {}
    tree = ast.parse((ROOT / 'multihost' / '__init__.py').read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If))
    for node in ast.walk(block):
        if isinstance(node, ast.ImportFrom):
            said.update({(a.asname or a.name): (node.module, a.name) for a in node.names})
    assert said == multihost._HOMES
    assert sorted(multihost.__all__) == sorted(multihost._HOMES)


def test_every_import_form_is_seen(tmp_path: pathlib.Path):
    """The import reader sees a name given to importlib, a table of modules loaded by a
    computed name, a relative import, an import in a function, and the public surface."""
    src = tmp_path / 'forms.py'
    src.write_text(
        'import importlib\n'
        'PATCHERS = ("multihost.engine.stopped", "multihost")\n'
        'def f(name):\n'
        '    import multihost\n'
        '    from . import _layout\n'
        '    importlib.import_module("multihost._debug._stacks")\n'
        '    return importlib.import_module(name)\n'
    )
    modules = _modules()
    assert _named(src, modules, 'multihost._checks.forms') == {
        'importlib',
        'multihost',
        'multihost._checks._layout',
        'multihost._debug._stacks',
        'multihost.engine.stopped',
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


def test_no_function_is_over_100_lines():
    """STYLE: a function that does not fit on a screen and a half is two functions (its
    docstring counts: a long explanation belongs in the module's)."""
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 100:
                    long.append(f'{name}.{node.name}: {lines} lines')
    assert not long, long


def test_the_release_tests_are_dealt_into_shares_of_about_equal_time():
    """`conftest.release_units`: every unit in exactly one share, the shares' times within
    the longest unit's of each other, the same deal every time (each xdist worker deals) and
    whatever else was collected (a run of one file deals as the whole suite)."""
    import json

    from conftest import _RELEASE_SECONDS, release_units

    seconds = json.loads(_RELEASE_SECONDS.read_text())
    units = sorted([*seconds, 'test_not_in_the_table.py'])
    for n in (4, 8):
        shares = release_units(units, n)
        assert sorted(u for share in shares for u in share) == units
        assert release_units(list(reversed(units)), n) == shares
        loads = [sum(seconds.get(u, 0) for u in share) for share in shares]
        assert max(loads) - min(loads) <= max(seconds.values()), loads
        some = units[::3]
        assert release_units(some, n) == [share & set(some) for share in shares]
    assert release_units(units, 1) == [set(units)]


def test_tutorials_are_dealt_one_by_one_and_every_share_keeps_the_rest():
    """`pytest --release=K/N` on the tutorials (marked ``release(dealt='test')``): each
    tutorial in exactly one share, the unmarked test in every share."""
    path = 'tests/notebook/test_notebooks.py'
    whole, _ = _collected('--release=all', path)
    shares = [_collected(f'--release={k}/2', path)[0] for k in range(2)]
    tutorials = [t for t in whole if '.ipynb]' in t]
    assert len(tutorials) >= 4
    dealt = [t for share in shares for t in share if '.ipynb]' in t]
    assert sorted(dealt) == sorted(tutorials)
    assert all(len([t for t in share if '.ipynb]' in t]) < len(tutorials) for share in shares)
    rest = set(whole) - set(tutorials)
    assert rest and all(rest <= set(share) for share in shares)


def _collected(*args: str) -> tuple[list[str], int]:
    """The test ids ``pytest --co`` keeps with ``args`` (a fresh pytest, one process), and how
    many it collected before any was deselected."""
    out = subprocess.run(
        [sys.executable, '-m', 'pytest', '--co', '-q', '-n', '0', '-p', 'no:cacheprovider', *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    (summary,) = [line for line in out.stdout.splitlines() if 'collected' in line]
    return [line for line in out.stdout.splitlines() if '::' in line], int(
        summary.split()[0].split('/')[-1]
    )


def test_deal_keeps_the_every_paths_on_every_share_and_deals_the_rest_once():
    """`--deal=K/N --every=PATH` (what CI's second Python runs): the tests under PATH on both
    shares; the others dealt, each on exactly one share."""
    every, dealt = 'tests/engine/test_core_single.py', 'tests/engine/test_options.py'
    (kept0, whole), (kept1, _) = (
        _collected(f'--deal={k}/2', f'--every={every}', every, dealt) for k in (0, 1)
    )
    mine = [t for t in kept0 if t.startswith(every)]
    assert mine and mine == [t for t in kept1 if t.startswith(every)]
    rest = [[t for t in kept if t.startswith(dealt)] for kept in (kept0, kept1)]
    assert rest[0] and rest[1] and not set(rest[0]) & set(rest[1])
    assert len(mine) + len(rest[0]) + len(rest[1]) == whole
