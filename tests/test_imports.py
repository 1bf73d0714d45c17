"""Every module of the server (`app`) and of the client (`episerve`) imports.

tests/python310/run.sh runs this on Python 3.10, where torch (the client's optional extra) is not installed: there a
module of `episerve.lerobot` imports or refuses with the error that names torch, and every other module imports."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from tests.support import ROOT

HAS_TORCH = importlib.util.find_spec("torch") is not None


def module_names(package: Path) -> list[str]:
    """The dotted name of every module under the package directory `package`, read from its files."""
    names = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("name", module_names(ROOT / "app") + module_names(ROOT / "client" / "episerve"))
def test_every_module_imports(name: str) -> None:
    if HAS_TORCH or not name.startswith("episerve.lerobot"):
        importlib.import_module(name)
        return
    try:
        importlib.import_module(name)
    except ImportError as refused:
        assert "needs torch" in str(refused), refused
