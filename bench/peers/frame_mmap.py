"""The local reference for decoded camera frames: the dataset's frames decoded once into one uncompressed Arrow IPC
file (a row per dataset row: `index` and the frame's raw (H, W, 3) pixels) and read through a memory map.

`MmapFrames.__getitems__` answers a DataLoader batch the way episerve's client does, minus the network: each
frame copied once from the map into the batch, then turned channels-first (the client's `(B, C, H, W)`), and
handed to the main process as one block (`TensorBatch`, whose workers reuse their shared-memory blocks as
episerve's do), so the two differ by the network alone. The file is opened lazily in each DataLoader worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.camera_datasets import CAMERA, CameraDataset
from bench.peers.camera_decode import TOLERANCE_S, row_locations
from episerve import TensorBatch

BATCH_BYTES = 16 * 1024 * 1024


def write_frames(dataset: CameraDataset, out: Path) -> Path:
    """Decode every frame of the dataset in order into `out` (unless it exists); rows follow the dataset's rows."""
    import av

    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    files, file_of_row, time_of_row = row_locations(dataset)
    size = dataset.frame_bytes
    schema = pa.schema([pa.field("index", pa.int64()), pa.field(CAMERA, pa.list_(pa.uint8(), size))])
    per_batch = max(1, BATCH_BYTES // size)
    tmp = out.with_suffix(".tmp")
    row = 0
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for number, rel in enumerate(files):
            wanted = time_of_row[file_of_row == number]  # rows are in file order
            pending: list[np.ndarray] = []
            k = 0
            with av.open(str(dataset.path / rel)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                for frame in container.decode(stream):
                    at = float(Fraction(frame.pts) * stream.time_base)
                    if k >= len(wanted) or abs(at - wanted[k]) > TOLERANCE_S:
                        raise RuntimeError(f"{rel}: the frame at {at:.6f} s is not the next row's frame")
                    k += 1
                    pending.append(frame.to_ndarray(format="rgb24").reshape(-1))
                    if len(pending) == per_batch:
                        row = _write(writer, schema, row, pending)
                        pending = []
            row = _write(writer, schema, row, pending)
    if row != dataset.rows:
        raise RuntimeError(f"decoded {row} frames of {dataset.name}; it has {dataset.rows} rows")
    tmp.rename(out)
    return out


def _write(writer: pa.ipc.RecordBatchFileWriter, schema: pa.Schema, row: int, frames: list[np.ndarray]) -> int:
    if not frames:
        return row
    pixels = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(frames)), schema.field(CAMERA).type.list_size)
    index = pa.array(np.arange(row, row + len(frames), dtype=np.int64))
    writer.write_batch(pa.RecordBatch.from_arrays([index, pixels], schema=schema))
    return row + len(frames)


class MmapFrames:
    """Rows of a decoded-frame IPC file; `__getitems__(indices)` returns one `TensorBatch` of `index` (B,) and the
    camera as uint8 (B, C, H, W)."""

    def __init__(self, path: Path, height: int, width: int) -> None:
        self.path, self.shape = path, (height, width, 3)
        self._views: tuple[list[np.ndarray], np.ndarray] | None = None
        self._rows = sum(batch.num_rows for batch in self._open())

    def __len__(self) -> int:
        return self._rows

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "shape": self.shape, "_views": None, "_rows": self._rows}

    def _open(self) -> list[pa.RecordBatch]:
        reader = pa.ipc.open_file(pa.memory_map(str(self.path)))
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]

    def views(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Each record batch's frames as an (n, H, W, 3) view of the map, and the batches' first rows."""
        if self._views is None:
            batches = self._open()
            views = []
            for batch in batches:
                column = batch.column(1)
                values = column.values.to_numpy(zero_copy_only=True)
                views.append(values[: len(column) * column.type.list_size].reshape(len(column), *self.shape))
            offsets = np.concatenate([[0], np.cumsum([b.num_rows for b in batches])]).astype(np.int64)
            self._views = (views, offsets)
        return self._views

    def __getitems__(self, indices: Sequence[int]) -> TensorBatch:
        import torch

        views, offsets = self.views()
        rows = np.asarray(indices, dtype=np.int64)
        numbers = np.searchsorted(offsets, rows, side="right") - 1
        frames = np.empty((len(rows), *self.shape), dtype=np.uint8)
        local = (rows - offsets[numbers]).tolist()
        for position, (number, row) in enumerate(zip(numbers.tolist(), local, strict=True)):
            frames[position] = views[number][row]
        channels_first = np.ascontiguousarray(np.moveaxis(frames, -1, -3))
        return TensorBatch({CAMERA: torch.from_numpy(channels_first), "index": torch.from_numpy(rows)})

    def __getitem__(self, index: int) -> TensorBatch:
        return self.__getitems__([index])
