"""The local ceiling for DataLoader figures: a map-style dataset over the memory-mapped IPC file that fetches a
whole batch per `__getitems__` (one batch-grouped take) and turns columns into tensors without a row loop.

The file is opened lazily in each DataLoader worker, so nothing but its path is pickled.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from bench.peers.ipc import MmapTable
from episerve import TensorBatch


def table_to_tensors(table: pa.Table) -> dict[str, Any]:
    """Numeric and fixed-size-list columns to tensors; binary and struct columns (encoded images) to lists."""
    out: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = column.combine_chunks()
        if pa.types.is_fixed_size_list(array.type):
            values = array.flatten().to_numpy()
            out[name] = _tensor(values.reshape(len(array), array.type.list_size))
        elif pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
            out[name] = _tensor(array.to_numpy())
        elif pa.types.is_struct(array.type):
            out[name] = array.field("bytes").to_pylist()
        else:
            out[name] = array.to_pylist()
    return out


def _tensor(values: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only Arrow memory: torch warns but we never write
        return torch.from_numpy(values)


def identity(batch: Any) -> Any:
    """collate_fn for datasets whose `__getitems__` already returns a whole batch."""
    return batch


class MmapBatchDataset:
    """Rows of an IPC file; `__getitems__(indices)` returns one dict of batched tensors: with `one_block`, a dict
    that DataLoader workers hand over as one block (as episerve's batches are), else a plain dict (one
    shared-memory hand-off per tensor, torch's default)."""

    def __init__(self, path: Path, one_block: bool = True) -> None:
        self.path = path
        self.one_block = one_block
        self._table: MmapTable | None = None
        self._rows = MmapTable(path).num_rows

    def __len__(self) -> int:
        return self._rows

    @property
    def table(self) -> MmapTable:
        if self._table is None:
            self._table = MmapTable(self.path)
        return self._table

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "one_block": self.one_block, "_table": None, "_rows": self._rows}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Any]:
        tensors = table_to_tensors(self.table.take(indices))
        return TensorBatch(tensors) if self.one_block else tensors

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])
