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


class SharedArray(np.ndarray):
    """A numpy view of a torch tensor in shared memory (`shared`, the whole allocation); its slices know that
    tensor too, so a batch cut from a larger chunk still crosses to the main process without a copy."""

    shared: Any = None

    def __array_finalize__(self, obj: Any) -> None:
        self.shared = getattr(obj, "shared", None)


class TorchFormatter:
    """Numeric arrays as tensors, in a `TensorBatch`; object arrays as lists."""

    frames = None  # camera frames copied channels-first into `empty`

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Where a batch's large copies go (camera frames made channels-first, see `table_columns(empty=...)`).

        In a DataLoader worker, a torch tensor in shared memory seen as a numpy array while it is filled: the batch
        then crosses to the main process as it is, instead of being copied into a shared block once more when
        pickled (a 64-frame 480x640 batch is 59 MB). Elsewhere, and for arrays small enough to travel inside the
        pickle, a plain numpy array.
        """
        from torch.utils.data import get_worker_info

        if get_worker_info() is None or int(np.prod(shape)) * dtype.itemsize <= INLINE_BLOCK_BYTES:
            return np.empty(shape, dtype)
        torch = torch_module()
        tensor = shared_empty(torch, shape, _torch_dtype(torch, dtype))
        array = tensor.numpy().view(SharedArray)
        array.shared = tensor
        return array

    def format(self, columns: Columns) -> TensorBatch:
        """Numeric arrays as tensors (no copy when the array is writable; views of the shared tensor for arrays
        from `empty`); object arrays as lists, with numeric arrays inside them (variable-length lists) as tensors
        too."""
        torch = torch_module()
        result = TensorBatch()
        for name, values in columns.items():
            if isinstance(values, SharedArray) and (shared := _shared_view(torch, values)) is not None:
                result[name] = shared
            elif values.dtype == object:
                result[name] = [_maybe_tensor(torch, item) for item in values.tolist()]
            else:
                result[name] = _tensor(torch, values)
        return result


def _shared_view(torch: Any, values: SharedArray) -> Any | None:
    """`values` as a tensor on the shared storage it lies in; None if it does not (a copy made by numpy keeps the
    class but not the memory) or covers less than half of it (the whole storage would travel with it, and stay
    mapped in the main process as long as the part is kept)."""
    whole = values.shared
    if whole is None or values.dtype == object:
        return None
    storage = whole.untyped_storage()
    if 2 * values.nbytes < storage.nbytes():  # a small part: a copy of it travels, not the whole allocation
        return None
    start = values.ctypes.data - storage.data_ptr()
    itemsize = values.dtype.itemsize
    inside = start >= 0 and start + values.nbytes <= storage.nbytes()
    if not inside or start % itemsize or any(stride < 0 or stride % itemsize for stride in values.strides):
        return None
    strides = tuple(stride // itemsize for stride in values.strides)
    view = torch.empty(0, dtype=_torch_dtype(torch, values.dtype))
    return view.set_(storage, start // itemsize, values.shape, strides)


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _maybe_tensor(torch: Any, item: Any) -> Any:
    return torch.from_numpy(item) if isinstance(item, np.ndarray) and item.dtype != object else item


def _tensor(torch: Any, values: np.ndarray) -> Any:
    if not values.flags.writeable:
        values = values.copy()
    try:
        return torch.from_numpy(values)
    except TypeError:  # a dtype torch has no tensor type for (datetime64...)
        return values
