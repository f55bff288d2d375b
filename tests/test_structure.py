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
    """Key-value and barrier calls on the coordination client live in multihost/_kv.py."""
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
    # local.py is the test harness (its own start/end barriers around each call).
    assert users == ['multihost/_kv.py', 'multihost/local.py'], users
