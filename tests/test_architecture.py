"""The package's shape: no import circles, no imports through strings, one module per command."""

from __future__ import annotations

import ast
from pathlib import Path

import nopebench
from nopebench.cli import app

PACKAGE = Path(nopebench.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("nopebench", *path.relative_to(PACKAGE).with_suffix("").parts))
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the nopebench modules it imports anywhere in its body (lazy imports too)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nopebench"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[mod].add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name.startswith("nopebench")}
    return graph


def test_no_import_circle():
    graph = _imports(_modules())

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = [m for m in graph if m in reach(m)]
    assert circles == []


def test_no_import_through_a_string():
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                assert name not in ("import_module", "__import__"), mod


def test_each_command_is_one_module_under_commands():
    commands = {p.stem for p in (PACKAGE / "commands").glob("*.py")} - {"__init__", "options"}
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {n.replace("-", "_") for n in names} == commands
