"""The torch output: numeric columns as tensors sharing the arrays' memory, in a `TensorBatch`; others as lists."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from episerve._columns import Columns
from episerve._tensor_batch import INLINE_BLOCK_BYTES, TensorBatch, shared_empty

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


class Arrays:
    """Where a batch's large copies go (camera frames made channels-first, see `table_columns(empty=...)`).

    In a DataLoader worker they are torch tensors in shared memory, seen as numpy arrays while they are filled:
    the batch then crosses to the main process as it is, instead of being copied into a shared block once more
    when pickled (a 64-frame 480x640 batch is 59 MB). Elsewhere, and for arrays small enough to travel inside the
    pickle, plain numpy arrays.
    """

    def __init__(self) -> None:
        from torch.utils.data import get_worker_info

        self._shared = get_worker_info() is not None
        self._tensors: dict[int, tuple[np.ndarray, Any]] = {}  # id of the array: (the array, its tensor)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if not self._shared or int(np.prod(shape)) * dtype.itemsize <= INLINE_BLOCK_BYTES:
            return np.empty(shape, dtype)
        torch = torch_module()
        tensor = shared_empty(torch, shape, torch.from_numpy(np.empty(0, dtype)).dtype)
        array = tensor.numpy()
        self._tensors[id(array)] = (array, tensor)
        return array

    def tensor_of(self, array: np.ndarray) -> Any | None:
        """The shared tensor `array` is a view of, if `empty` made it."""
        held = self._tensors.get(id(array))
        return held[1] if held is not None and held[0] is array else None


def convert(columns: Columns, arrays: Arrays | None = None) -> TensorBatch:
    """Numeric arrays as tensors (no copy when the array is writable; the very tensor when `arrays` made it);
    object arrays as lists, with numeric arrays inside them (variable-length lists) as tensors too."""
    torch = torch_module()
    result = TensorBatch()
    for name, values in columns.items():
        made = arrays.tensor_of(values) if arrays is not None and isinstance(values, np.ndarray) else None
        if made is not None:
            result[name] = made
        elif values.dtype == object:
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
