"""The server's layers import downwards only (api -> reads -> store -> sources) and no module imports itself back."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise
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


# --- the client (`client/episerve`) ---------------------------------------------------------------------------------

CLIENT = Path(__file__).resolve().parents[1] / "client" / "episerve"
CONCRETE_TRANSPORTS = {"episerve._socket_transport", "episerve._httpx_transport"}


def _module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that one import statement of `module` loads: `import a.b`, `from a.b import c`
    (`a.b.c` when that is a module, else `a.b`), relative forms included (`from ._x import y`, `from . import _x`)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & known
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = ".".join(package[: len(package) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    submodules = {f"{base}.{alias.name}" for alias in node.names} & known
    named_in_base = any(f"{base}.{alias.name}" not in known for alias in node.names)
    return submodules | ({base} & known if named_in_base else set())


def _package_imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package at `root` and the modules of that package it imports, lazily or not."""
    paths = {_module_name(path, root): path for path in root.rglob("*.py")}
    known = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            found |= _imported(node, name, is_package, known)
        graph[name] = found - {name}
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph`, as the modules around it (first and last the same); [] when there is none."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return list(reversed(exc.args[1]))  # the sorter lists each module before the module that imports it
    return []


def test_client_has_no_import_cycles() -> None:
    assert _a_cycle(_package_imports(CLIENT)) == []


def test_client_transport_interface_imports_no_concrete_transport() -> None:
    graph = _package_imports(CLIENT)
    assert set(graph) >= CONCRETE_TRANSPORTS  # both still exist under these names
    assert graph["episerve._transport"] & CONCRETE_TRANSPORTS == set()


def test_client_import_reading_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg._a import A\n")
    (package / "_a.py").write_text("from ._b import B\nA = 1\n")
    (package / "_b.py").write_text("def f():\n    from . import _c\n")
    (package / "_c.py").write_text("import pkg.sub.d\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "d.py").write_text("from .. import _a\nfrom ..sub import e\n")
    (package / "sub" / "e.py").write_text("from . import d as _d\n")

    graph = _package_imports(package)

    assert graph["pkg"] == {"pkg._a"}
    assert graph["pkg._a"] == {"pkg._b"}
    assert graph["pkg._b"] == {"pkg._c"}
    assert graph["pkg._c"] == {"pkg.sub.d"}
    assert graph["pkg.sub.d"] == {"pkg._a", "pkg.sub.e"}
    cycle = _a_cycle(graph)
    assert cycle[0] == cycle[-1]
    assert all(after in graph[before] for before, after in pairwise(cycle))
    assert set(cycle) in ({"pkg._a", "pkg._b", "pkg._c", "pkg.sub.d"}, {"pkg.sub.d", "pkg.sub.e"})
    graph["pkg.sub.d"] = set()
    assert _a_cycle(graph) == []


def test_the_api_reaches_the_store_only_through_reads() -> None:
    reaching = [
        f"{module} -> {dependency}"
        for module, dependencies in _imports().items()
        if module.startswith("app.api.")
        for dependency in dependencies
        if dependency.startswith("app.store")
    ]
    assert reaching == []
