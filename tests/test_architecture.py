"""The server's layers import downwards only (api -> reads -> store -> sources) and no module imports itself back."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
LAYERS = {"sources": 0, "store": 1, "reads": 2, "api": 3}


def _imports() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for path in APP.rglob("*.py"):
        name = ".".join(path.relative_to(APP.parent).with_suffix("").parts).removesuffix(".__init__")
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        modules[name] = found
    return {name: {d for d in found if d in modules and d != name} for name, found in modules.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 2 else None


def test_layers_import_downwards_only() -> None:
    upward = [
        f"{module} -> {dependency}"
        for module, dependencies in _imports().items()
        for dependency in dependencies
        if _layer(module) is not None and (_layer(dependency) or 0) > _layer(module)  # type: ignore[operator]
    ]
    assert upward == []


def test_no_import_cycles() -> None:
    graph = _imports()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for dependency in sorted(graph[module]):
            if state.get(dependency) == 1:
                cycles.append([*path[path.index(dependency) :], dependency])
            elif dependency not in state:
                visit(dependency, path)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []


def test_the_api_reaches_the_store_only_through_reads() -> None:
    reaching = [
        f"{module} -> {dependency}"
        for module, dependencies in _imports().items()
        if module.startswith("app.api.")
        for dependency in dependencies
        if dependency.startswith("app.store")
    ]
    assert reaching == []
