"""Outputs: what the datasets hand out, one formatter per output, looked up by name.

A formatter turns a batch's per-column numpy arrays (from `_columns`) into what training code receives: numpy
arrays (`_output_numpy`), torch tensors (`_output_torch`) or LeRobot's samples (`_output_lerobot`). It also says
where a batch's large copies go (`empty`), and may make the camera columns itself from their channels-last record
batches (`frames`, None to have them copied channels-first into `empty`). Adding an output is one module with its
formatter class, `available()` and `MISSING`, and one line in `_OUTPUTS`.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal, Protocol

import numpy as np

from episerve._columns import Columns, Frames

Output = Literal["torch", "numpy"]

# name: (module, formatter class); each module is imported when first used (torch takes seconds)
_OUTPUTS = {
    "torch": ("episerve._output_torch", "TorchFormatter"),
    "numpy": ("episerve._output_numpy", "NumpyFormatter"),
    "lerobot": ("episerve._output_lerobot", "LeRobotFormatter"),
}


class Formatter(Protocol):
    """One output: where a batch's large copies go, how camera columns are made, and the batch dict handed out."""

    frames: Frames | None

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray: ...

    def format(self, columns: Columns) -> dict[str, Any]: ...


def formatter(output: str | Formatter | None, **options: Any) -> Formatter:
    """The formatter of the output named `output` (made with `options`): `torch` when torch is importable and
    nothing else was asked for, else `numpy`. A formatter passes through as it is."""
    if output is not None and not isinstance(output, str):
        return output
    if output is None:
        output = "torch" if _module("torch").available() else "numpy"
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(map(repr, _OUTPUTS))}, not {output!r}")
    module = _module(output)
    if not module.available():
        raise ImportError(module.MISSING)
    return getattr(module, _OUTPUTS[output][1])(**options)


def to_output(columns: Columns, output: str | Formatter) -> dict[str, Any]:
    """`columns` as the output `output` hands them out (a batch dict)."""
    return formatter(output).format(columns)


def _module(name: str) -> Any:
    return importlib.import_module(_OUTPUTS[name][0])
