"""Batches as the datasets return them, and the DataLoader collate function that passes them through whole.

`EpisodeDataset.__getitems__` answers a DataLoader batch with one request and returns a `Batch`: the batch dict of
`(batch, ...)` tensors that also behaves as the sequence of its samples (built only if someone indexes it). torch's
map-style fetcher hands that to `collate_fn`: `collate` returns the dict as is, while torch's `default_collate`
still works (slower: it splits the batch into samples and stacks them again). How a batch dict crosses from a
DataLoader worker to the main process is `_tensor_batch`'s.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episerve._output_torch import torch_module


class Batch(Sequence[dict[str, Any]]):
    """A batch dict (`data`, one `(batch, ...)` tensor or list per column) that is also a sequence of samples."""

    def __init__(self, data: dict[str, Any], length: int) -> None:
        self.data = data
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        if not -self._length <= index < self._length:
            raise IndexError(f"sample {index} out of range for a batch of {self._length}")
        return {name: values[index] for name, values in self.data.items()}

    def __repr__(self) -> str:
        return f"Batch({self._length} samples, columns={list(self.data)})"


def collate(batch: Any) -> Any:
    """`collate_fn` for DataLoaders over episerve datasets.

    A `Batch` (what `EpisodeDataset.__getitems__` returns) becomes its batch dict without copying; a dict passes
    through; a list of sample dicts is stacked column by column (tensors with `torch.stack`, arrays with
    `numpy.stack`, numbers into a tensor or array, anything else into a list).
    """
    if isinstance(batch, Batch):
        return batch.data
    if isinstance(batch, Mapping):
        return batch
    if isinstance(batch, Sequence) and batch and all(isinstance(sample, Mapping) for sample in batch):
        return {name: _stack([sample[name] for sample in batch]) for name in batch[0]}
    return batch


def _stack(values: list[Any]) -> Any:
    torch = torch_module()
    if torch is not None and all(isinstance(v, torch.Tensor) for v in values):
        if len({v.shape for v in values}) == 1:
            return torch.stack(values)
        return values
    if all(isinstance(v, np.ndarray | np.generic) for v in values) and len({np.shape(v) for v in values}) == 1:
        return np.stack(values)
    if all(isinstance(v, numbers.Number) for v in values):
        array = np.asarray(values)
        return torch.from_numpy(array) if torch is not None else array
    return values
