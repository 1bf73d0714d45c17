"""Binary columns left in the response buffer until their rows are handed out.

`EpisodeIterableDataset` holds a whole chunk (8,192 rows by default, ~100 MB of PNG frames) and hands it out a
batch at a time. Turning every blob of the chunk into a Python `bytes` up front copies the chunk once more into
freshly allocated memory, and first touches of fresh pages cost more than the copy itself. `DeferredBlobs` keeps
where each row's bytes lie and copies only the rows of the batch being handed out, into memory the allocator
reuses batch after batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from episerve._numpy import nulls, offsets


class DeferredBlobs:
    """The rows of a binary column as `bytes` (or `None` for nulls), copied out only by `tolist()`.

    Indexes like a 1-D object array (`blobs[order]`, `blobs[:n]`, `len(blobs)`); the result of indexing is
    again deferred and shares the buffers.
    """

    dtype = np.dtype(object)

    def __init__(self, views: Sequence[memoryview], source: np.ndarray, starts: np.ndarray, stops: np.ndarray):
        self._views = list(views)
        self._source = source  # per row: the index of the view holding its bytes, -1 for a null
        self._starts = starts
        self._stops = stops

    @classmethod
    def of(cls, chunks: Sequence[pa.Array]) -> DeferredBlobs:
        """The rows of binary (or large binary) arrays, in order."""
        views: list[memoryview] = []
        sources, starts, stops = [], [], []
        for chunk in chunks:
            bounds = offsets(chunk)
            data = chunk.buffers()[2]
            source = np.full(len(chunk), len(views), dtype=np.int32)
            if chunk.null_count:
                source[nulls(chunk)] = -1
            views.append(memoryview(data if data is not None else b"").cast("B"))
            sources.append(source)
            starts.append(bounds[:-1])
            stops.append(bounds[1:])
        if not views:
            return cls([], *(np.empty(0, dtype=dtype) for dtype in (np.int32, np.int64, np.int64)))
        return cls(views, np.concatenate(sources), _int64(starts), _int64(stops))

    @classmethod
    def concatenate(cls, parts: Sequence[DeferredBlobs]) -> DeferredBlobs:
        """The rows of `parts`, one after the other."""
        views: list[memoryview] = []
        sources = []
        for part in parts:
            sources.append(np.where(part._source < 0, -1, part._source + len(views)).astype(np.int32))
            views.extend(part._views)
        starts = np.concatenate([part._starts for part in parts])
        stops = np.concatenate([part._stops for part in parts])
        return cls(views, np.concatenate(sources), starts, stops)

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, key: Any) -> DeferredBlobs:
        if isinstance(key, (int, np.integer)):
            raise TypeError("index deferred blobs with a slice or an array of positions, then call tolist()")
        return DeferredBlobs(self._views, self._source[key], self._starts[key], self._stops[key])

    def tolist(self) -> list[bytes | None]:
        """Each row's bytes, copied out of the buffers."""
        views = self._views
        return [
            None if source < 0 else views[source][start:stop].tobytes()
            for source, start, stop in zip(
                self._source.tolist(), self._starts.tolist(), self._stops.tolist(), strict=True
            )
        ]


def is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _int64(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64, copy=False)
