"""The documentation's examples: what they promise when pasted into a script."""

from __future__ import annotations

import ast
import re

from tests.support import ROOT

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks() -> list[str]:
    return [
        block for path in DOC_FILES for block in re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)
    ]


def shows_something(statement: ast.stmt) -> bool:
    """A script's last statement that is a bare expression shows nothing unless it prints or `.show()`s."""
    if not isinstance(statement, ast.Expr):
        return True
    call = statement.value
    if not isinstance(call, ast.Call):
        return False
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
    return name in {"print", "show"}


def test_examples_ending_in_an_expression_print_it_when_run_as_a_script() -> None:
    blocks = python_blocks()
    assert any("duckdb.sql" in block for block in blocks)
    silent = [block for block in blocks if not shows_something(ast.parse(block).body[-1])]
    assert silent == []
