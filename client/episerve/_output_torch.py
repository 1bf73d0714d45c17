"""The torch output: numeric columns as tensors sharing the arrays' memory, in a `TensorBatch`; others as lists."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from episerve._columns import Columns
from episerve._tensor_batch import TensorBatch

MISSING = "output='torch' needs torch: pip install 'episerve[torch]'"


@cache
def torch_module() -> Any:
    """The torch module, or None where it is not installed (imported once, on first use: it takes seconds)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def available() -> bool:
    return torch_module() is not None


def convert(columns: Columns) -> TensorBatch:
    """Numeric arrays as tensors (no copy when the array is writable); object arrays as lists, with numeric
    arrays inside them (variable-length lists) as tensors too."""
    torch = torch_module()
    result = TensorBatch()
    for name, values in columns.items():
        if values.dtype == object:
            result[name] = [_maybe_tensor(torch, item) for item in values.tolist()]
        else:
            result[name] = _tensor(torch, values)
    return result


def _maybe_tensor(torch: Any, item: Any) -> Any:
    return torch.from_numpy(item) if isinstance(item, np.ndarray) and item.dtype != object else item


def _tensor(torch: Any, values: np.ndarray) -> Any:
    if not values.flags.writeable:
        values = values.copy()
    try:
        return torch.from_numpy(values)
    except TypeError:  # a dtype torch has no tensor type for (datetime64...)
        return values
