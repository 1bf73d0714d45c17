"""Rows as references into the segment cache, for clients on the same machine.

A take from mapped segments costs the server little, but the rows still cross a socket, copied by the kernel at
both ends, and each request pays for its bytes. A client that can read the server's cache directory (the same
machine, or a shared volume) asks for references instead (`rows: "references"`) and gathers the rows out of the
segment files itself, as a local memory map would: the answer is a few bytes per row, whatever the row size.

The answer has two columns, `segment` (int32, an index into the segment list) and `row` (int64, the row of that
segment file), one row per index asked, in the order asked. The schema's metadata `episerve.rows` holds JSON:
`{"columns": [...], "segments": [{"path", "bytes", "inode", "mtime_ns", "rows"}]}`: the columns the rows are read
from, in the answer's order, and each segment file relative to the server's cache directory with the size, inode,
modification time and row count of the file the server has mapped, so a client never reads a file rebuilt since.
The rows gathered from those files in that order are the table the take answers with values, schema included.

A view's layout (`POST /datasets/{id}/rows/layout`, `layout_document`) says the same for every row of a view at
once, so a client can take rows with no request at all for a while: the view's runs (`offsets`: the view row where
each run starts, then the view's length; `files`: the source file of each run; `starts`: the run's first row of
that file's segment), the columns, the segment of each source file the view reads that the server has mapped
(`segments`, each entry as above plus the `file` it holds), and for how many `seconds` the client may use it before
asking again (`EPISERVE_ROW_LAYOUT_S`: how long it may read a source file's earlier rows once it changes). A file
whose segment is not mapped is not listed: its rows are taken with a request, which maps or builds it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from app.reads.frame_references import described_segment
from app.reads.segment_memo import remembered
from app.store.mapped_segments import Segment
from app.store.views import EpisodeView

METADATA_KEY = b"episerve.rows"  # names the description of rows by reference in the answer's schema metadata
REFERENCE_SCHEMA = pa.schema([pa.field("segment", pa.int32(), nullable=False), pa.field("row", pa.int64(), False)])


def reference_batch(
    segments: list[Segment], segment_of: np.ndarray, row_of: np.ndarray, columns: list[str], cache_root: Path
) -> pa.RecordBatch:
    """The rows of `columns` whose row `i` is row `row_of[i]` of `segments[segment_of[i]]`, as references to
    those segments described relative to `cache_root`."""
    described = {"columns": columns, "segments": [_described(segment, cache_root) for segment in segments]}
    schema = REFERENCE_SCHEMA.with_metadata({METADATA_KEY: orjson.dumps(described)})
    return pa.record_batch([pa.array(segment_of, pa.int32()), pa.array(row_of, pa.int64())], schema=schema)


def layout_document(
    view: EpisodeView, columns: list[str], segments: dict[int, Segment], cache_root: Path, seconds: float
) -> dict[str, object]:
    """The layout of `view`'s rows of `columns`: its runs and the mapped `segments` (by source file number) of the
    files it reads, described relative to `cache_root`, for a client to use for `seconds`."""
    return {
        "seconds": seconds,
        "rows": len(view),
        "columns": columns,
        "offsets": view.offsets.tolist(),
        "files": view.run_file.tolist(),
        "starts": view.run_start.tolist(),
        "segments": [_described(segment, cache_root) | {"file": number} for number, segment in segments.items()],
    }


def _described(segment: Segment, cache_root: Path) -> dict[str, object]:
    """Where a segment file is and what tells it from a later rebuild (remembered while it is mapped: a segment
    lies in one cache directory)."""
    return remembered(
        segment, "row references", lambda: described_segment(segment, cache_root) | {"rows": segment.num_rows}
    )
