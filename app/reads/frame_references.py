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

from app.sources.source import VideoFeature
from app.store.mapped_segments import Segment

METADATA_KEY = b"episerve.frames"  # names the description of a column of references in its field metadata
REFERENCE_TYPE = pa.struct([pa.field("segment", pa.int32(), nullable=False), pa.field("row", pa.int64(), False)])


def reference_column(
    feature: VideoFeature, segments: list[Segment], segment_of: np.ndarray, row_of: np.ndarray, cache_root: Path
) -> tuple[pa.Field, pa.Array]:
    """The camera column of `feature` (field and column) whose row `i` references row `row_of[i]` of
    `segments[segment_of[i]]`, the segments described relative to `cache_root`."""
    column = pa.StructArray.from_arrays([pa.array(segment_of), pa.array(row_of)], fields=list(REFERENCE_TYPE))
    described = {
        "shape": [feature.height, feature.width, feature.channels],
        "segments": [described_segment(segment, cache_root) for segment in segments],
    }
    if feature.tier.decodes:  # the segments keep encoded images: the client decodes them
        described["encoding"] = feature.tier.name
    return pa.field(feature.key, REFERENCE_TYPE, metadata={METADATA_KEY: orjson.dumps(described)}), column


def described_segment(segment: Segment, cache_root: Path) -> dict[str, object]:
    """Where a segment file is (relative to the cache directory) and what tells it from a later rebuild."""
    assert segment.path is not None
    return {
        "path": segment.path.relative_to(cache_root).as_posix(),
        "bytes": segment.nbytes,
        "inode": segment.inode,
        "mtime_ns": segment.mtime_ns,
    }
