"""Camera frames read straight from the server's decoded-frame cache, for a client on the same machine.

With `Client(cache_dir=...)` takes ask for camera frames as references (`frames: "references"`): for a camera
whose frames the server has decoded into segments, each row names a segment file (relative to the cache
directory) and a row of it, and this module maps the file and hands out the frames as zero-copy slices of the map.
They are copied once, channels-first, into the batch, as a local memory-mapped read would; no frame crosses a
socket. A file is used only if its size, inode and modification time are those of the file the server has mapped,
so a file rebuilt since (or another cache at that path) is never read; then the frames come over HTTP instead
(`episerve._cache_files`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from episerve._cache_files import LocalReferences, SegmentUnavailable
from episerve._encoded_frames import decode_frames
from episerve._numpy import fixed_width

METADATA_KEY = b"episerve.frames"  # names the description of a column of references in its field metadata
_FRAME = "frame"  # the pixels column of a decoded-frame segment


FramesUnavailable = SegmentUnavailable  # what `LocalFrames.resolve` raises when a referenced file cannot be read


class LocalFrames(LocalReferences["_FrameSegment"]):
    """The server's cache directory as this machine sees it, and the decoded-frame segment files this process has
    mapped (see `episerve._cache_files`)."""

    noun, short_noun = "camera frames", "frames"

    def resolve(self, table: pa.Table) -> pa.Table:
        """`table` with each referenced camera column replaced by its frames (`FramesUnavailable` if some
        referenced file cannot be read here)."""
        self.files.drop_unlinked()
        for number, field in enumerate(table.schema):
            if field.metadata and METADATA_KEY in field.metadata:
                frames = self._frames(field.name, json.loads(field.metadata[METADATA_KEY]), table.column(number))
                table = table.set_column(number, pa.field(field.name, frames.type), frames)
        self.read()
        return table

    def _frames(self, name: str, described: dict[str, Any], column: pa.ChunkedArray) -> pa.ChunkedArray:
        shape = [int(n) for n in described["shape"]]
        kind = pa.fixed_shape_tensor(pa.uint8(), shape)
        encoding = described.get("encoding")  # segments of encoded images (a JPEG tier), decoded here
        stored = pa.binary() if encoding is not None else kind
        segments = [self._segment(entry, stored) for entry in described["segments"]]
        references = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        segment_of = fixed_width(references.field(0), np.dtype(np.int32))
        row_of = fixed_width(references.field(1), np.dtype(np.int64))
        if len(segment_of) and (segment_of.min() < 0 or segment_of.max() >= len(segments)):
            raise FramesUnavailable("a reference names a segment the answer does not list")
        runs = pa.chunked_array(_runs(segments, segment_of, row_of), type=stored)
        if encoding is None:
            return runs
        return pa.chunked_array([decode_frames(name, encoding, tuple(shape), runs)], type=kind)

    def _segment(self, entry: dict[str, Any], kind: pa.DataType) -> _FrameSegment:
        return self.files.mapped(entry, str(kind), lambda path, data: _FrameSegment(path, data, kind)).content


class _FrameSegment:
    """The frames of one mapped decoded-frame segment file per record batch, as tensor arrays (`kind`, a
    fixed-shape tensor type), or as the encoded images a JPEG tier keeps (`kind` binary)."""

    def __init__(self, path: Path, data: pa.Buffer, kind: pa.DataType) -> None:
        try:
            reader = pa.ipc.open_file(pa.BufferReader(data))
            column = reader.schema.get_field_index(_FRAME)
            stored = kind.storage_type if isinstance(kind, pa.FixedShapeTensorType) else kind
            if column < 0 or reader.schema.field(column).type != stored:
                raise FramesUnavailable(f"{path} holds no frames of type {kind}")
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except pa.ArrowException as exc:
            raise FramesUnavailable(f"{path} is not a decoded-frame segment: {exc}") from exc
        columns = [batch.column(column) for batch in batches]
        if isinstance(kind, pa.FixedShapeTensorType):
            columns = [pa.ExtensionArray.from_storage(kind, frames) for frames in columns]
        self.tensors = columns
        self.offsets = np.cumsum([0, *(batch.num_rows for batch in batches)])


def _runs(segments: list[_FrameSegment], segment_of: np.ndarray, row_of: np.ndarray) -> list[pa.Array]:
    """The referenced frames in order, as slices of the maps: one per run of consecutive rows of one batch."""
    if len(row_of) == 0:
        return []
    batch_of = np.empty_like(row_of)
    within = np.empty_like(row_of)
    for number, segment in enumerate(segments):
        here = np.flatnonzero(segment_of == number)
        rows = row_of[here]
        if len(rows) and (rows.min() < 0 or rows.max() >= segment.offsets[-1]):
            raise FramesUnavailable(f"a row is past the end of a segment of {segment.offsets[-1]} frames")
        batch_of[here] = np.searchsorted(segment.offsets, rows, side="right") - 1
        within[here] = rows - segment.offsets[batch_of[here]]
    breaks = (np.diff(segment_of) != 0) | (np.diff(batch_of) != 0) | (np.diff(within) != 1)
    starts = [0, *(np.flatnonzero(breaks) + 1).tolist()]
    stops = [*starts[1:], len(row_of)]
    segment_at, batch_at, within_at = (values[starts].tolist() for values in (segment_of, batch_of, within))
    return [
        segments[segment].tensors[batch].slice(row, stop - start)
        for segment, batch, row, start, stop in zip(segment_at, batch_at, within_at, starts, stops, strict=True)
    ]
