"""`EpisodeDataset`: map-style random access to a dataset view, one HTTP request per DataLoader batch."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from episerve._client import Client, connect
from episerve._collate import Batch
from episerve._columns import table_columns
from episerve._episodes import Episodes
from episerve._mixture import Mixture
from episerve._outputs import Formatter, Output, formatter
from episerve._retry import Retries
from episerve._selection import DeltaTimestamps, ImageSize, Selection

try:
    from torch.utils.data import Dataset as _Base
except ImportError:  # numpy-only installs
    _Base = object  # type: ignore[assignment,misc]


class EpisodeDataset(_Base):  # type: ignore[misc]
    """Rows of a dataset view by position, as dicts of tensors (numpy arrays when torch is not installed).

    The view is the selected `episodes` (a spec like `"0,3-5"` or an iterable of ids; all when None) in ascending
    episode order, then stored frame order; `len(ds)` is its row count. Each sample maps column names to values:
    scalars as 0-d tensors, fixed-size lists as `(d,)` tensors (a `delta_timestamps` window of them as `(T, d)`,
    with a bool `<column>_is_pad` of shape `(T,)`), strings as `str`, image columns as encoded `bytes` or, with
    `decode_images=True`, `(C, H, W)` uint8 tensors.

    `__getitems__` fetches a whole DataLoader batch in one request and returns it already batched: use
    `DataLoader(ds, batch_size=B, collate_fn=episerve.collate)` to receive `(B, ...)` tensors without any
    per-sample work. `transform`, if given, is applied to each sample (and then batches are stacked again).

    `cache_dir`, on the server's machine (or with its cache on a shared volume), is the server's cache directory as
    seen from here: rows the server has cached and camera frames it has decoded are then read from its segment
    files instead of over the socket, so a batch costs one small request whatever its size (see `Client`).

    `image_size` — `(height, width)`, or `{camera: (height, width)}` — has the server downscale camera frames to
    that size (area averaging, as its decoded-frame cache does), no larger than the size it serves them at. Frames
    at another size than the served one are decoded on demand, never read from the decoded-frame cache: for speed,
    serve them at the size trained at (`EPISERVE_VIDEO_CACHE_SIZE`).

    Creating the dataset makes one small request (the view length, which also validates the dataset, episodes and
    columns); it pickles without its connections, so DataLoader workers open their own.

    Given an `episerve.Mixture` instead of a dataset id, it makes a `MixtureDataset` with the same arguments.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instead = cls._instead(*args, **kwargs)
        return super().__new__(cls) if instead is None else instead

    @classmethod
    def _instead(cls, url: Any = None, dataset_id: Any = None, *args: Any, **kwargs: Any) -> Any:
        """The dataset to make instead of an instance of `cls` for these constructor arguments (None: an instance):
        here a `MixtureDataset` for a `Mixture`; a subclass may answer for its own arguments."""
        if cls is EpisodeDataset and isinstance(dataset_id, Mixture):
            from episerve._mixture_dataset import mixture_dataset

            return mixture_dataset(url, dataset_id, args, kwargs)
        return None

    def __init__(
        self,
        url: str | Client,
        dataset_id: str,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        *,
        tolerance_s: float | None = None,
        decode_images: bool = False,
        output: Output | Formatter | None = None,
        token: str | None = None,
        retries: Retries | int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        image_size: ImageSize | None = None,
    ) -> None:
        self.client = connect(url, token, retries, cache_dir)
        self.selection = Selection.of(dataset_id, episodes, columns, delta_timestamps, tolerance_s, image_size)
        self.transform = transform
        self.decode_images = decode_images
        self.output = formatter(output)
        self._length = self.client.count(self.selection)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        view = f"{self.selection.dataset_id!r}, episodes={self.selection.episodes!r}"
        return f"EpisodeDataset({self.client.url!r}, {view}, rows={len(self)})"

    def __getitem__(self, index: int) -> Any:
        sample = self._fetch([index])[0]
        return sample if self.transform is None else self.transform(sample)

    def __getitems__(self, indices: Sequence[int]) -> Batch | list[Any]:
        """The samples at `indices` in one request, as a `Batch` (a batch dict that is also a list of samples)."""
        batch = self._fetch(indices)
        if self.transform is None:
            return batch
        return [self.transform(sample) for sample in batch]

    def _fetch(self, indices: Sequence[int]) -> Batch:
        """The rows at `indices` as a batch, in the output's form."""
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        positions = np.where(positions < 0, positions + self._length, positions)
        if len(positions) and (positions.min() < 0 or positions.max() >= self._length):
            bad = np.asarray(indices).reshape(-1)[(positions < 0) | (positions >= self._length)]
            raise IndexError(f"index {bad[0]} out of range for a view of {self._length} rows")
        pages = self.client.read_take(self.selection, positions)
        columns = table_columns(
            pages.table,
            buffers=pages.buffers,
            decode_images=self.decode_images,
            empty=self.output.empty,
            frames=self.output.frames,
            arrays=pages.arrays,
        )
        return Batch(self.output.format(columns), len(positions))
