"""Camera frames as references into the decoded-frame cache, for clients on the same machine.

A take of frames that lie in decoded-frame segments costs the server little, but moving them through a socket
costs both ends a kernel copy of every byte: for 64 frames of 224x224 that is most of the request's CPU time. A
client that can read the server's cache directory (the same machine, or a shared volume) asks for references
instead (`frames: "references"`) and copies the frames out of the segment files itself, as a local memory map
would.

A referenced camera column is a struct of `segment` (int32, an index into the field's segment list) and `row`
(int64, the row of that segment file holding the frame). The field's metadata `episerve.frames` holds JSON:
`{"shape": [H, W, C], "segments": [{"path", "bytes", "inode", "mtime_ns"}]}`, each path relative to the
server's cache directory, with the size, inode and modification time of the file the server has mapped, so a
client never reads a file rebuilt since. A camera with a frame not in a built segment (cold, or the policy
decodes on demand) comes as pixels, as without references.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from app.reads.frames import LocatedRows, frame_segment, frame_times, nearest_in_segment
from app.sources.source import Source, VideoFeature
from app.sources.video import check_tolerance
from app.store.dataset import Dataset
from app.store.segments import Segment

METADATA_KEY = b"episerve.frames"  # names the description of a column of references in its field metadata
REFERENCE_TYPE = pa.struct([pa.field("segment", pa.int32(), nullable=False), pa.field("row", pa.int64(), False)])


def frame_references(
    dataset: Dataset,
    source: Source,
    feature: VideoFeature,
    located: LocatedRows,
    tolerance_s: float,
    may_block: bool,
) -> tuple[pa.Field, pa.Array] | None:
    """The camera column of `feature` for the `located` rows as references (field and column), checked against
    `tolerance_s` like pixels are; None if some frame is not in a built segment (send pixels)."""
    times_of = frame_times(source, feature, located.episodes, located.timestamps)
    files = times_of.files()
    segments = []
    for path in files:
        segment = frame_segment(dataset, path, feature, may_block)
        if segment is not None and not segment.at_path():
            # Evicted or rebuilt by another process since this one mapped it: a client could not read the file
            # this map holds. Map the one there now (if any).
            dataset.forget_frames(segment)
            segment = frame_segment(dataset, path, feature, may_block)
        if segment is None or not segment.at_path():
            return None
        segments.append(segment)
    segment_of = np.empty(len(located.episodes), dtype=np.int32)
    row_of = np.empty(len(located.episodes), dtype=np.int64)
    found = np.empty(len(located.episodes))
    for number, (path, segment) in enumerate(zip(files, segments, strict=True)):
        here = np.flatnonzero(times_of.paths == path)
        times, back = np.unique(times_of.wanted[here], return_inverse=True)
        rows, at = nearest_in_segment(segment, times)
        segment_of[here], row_of[here], found[here] = number, rows[back], at[back]
    check_tolerance(feature.key, located.episodes, located.frame_index, times_of.wanted, found, tolerance_s)
    order = located.order
    column = pa.StructArray.from_arrays(
        [pa.array(segment_of[order]), pa.array(row_of[order])], fields=list(REFERENCE_TYPE)
    )
    described = {
        "shape": [feature.height, feature.width, feature.channels],
        "segments": [_described(segment, dataset.cache_root) for segment in segments],
    }
    return pa.field(feature.key, REFERENCE_TYPE, metadata={METADATA_KEY: orjson.dumps(described)}), column


def _described(segment: Segment, cache_root: Path) -> dict[str, object]:
    """Where a segment file is (relative to the cache directory) and what tells it from a later rebuild."""
    assert segment.path is not None
    return {
        "path": segment.path.relative_to(cache_root).as_posix(),
        "bytes": segment.nbytes,
        "inode": segment.inode,
        "mtime_ns": segment.mtime_ns,
    }
