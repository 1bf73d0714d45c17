"""Outputs: what the datasets hand out, one module per output, looked up by name.

An output turns a batch's per-column numpy arrays (from `_columns`) into what training code receives: torch
tensors (`_output_torch`) or numpy arrays (`_output_numpy`). Adding an output is one module with `available()`,
`empty` (where large copies go) and `convert(columns)`, and one line in `_OUTPUTS`.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

from episerve._columns import Allocate, Columns

Output = Literal["torch", "numpy"]

_OUTPUTS = {"torch": "episerve._output_torch", "numpy": "episerve._output_numpy"}  # imported when first used


def resolve_output(output: str | None) -> str:
    """The output's name: `torch` when torch is importable and nothing else was asked for, else `numpy`."""
    if output is None:
        return "torch" if _module("torch").available() else "numpy"
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(map(repr, _OUTPUTS))}, not {output!r}")
    module = _module(output)
    if not module.available():
        raise ImportError(module.MISSING)
    return output


def allocator(output: str) -> Allocate:
    """Where the output named `output` wants a batch's large copies made (`table_columns(empty=...)`)."""
    return _module(output).empty


def to_output(columns: Columns, output: str) -> dict[str, Any]:
    """`columns` as the output named `output` hands them out (a batch dict)."""
    return _module(output).convert(columns)


def _module(name: str) -> Any:
    return importlib.import_module(_OUTPUTS[name])
