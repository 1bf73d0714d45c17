"""The decoded-frame cache of one dataset: a segment store of its cameras' frames, one segment per video file, kept
within the video cache budget shared by every dataset (`app.store.frame_budget`).

A request that finds a video cold is answered by decoding on demand, not after decoding the whole file: its
segment is queued to build in the background, if the budget has room for it. The fingerprint of a video file is
remembered while the file stays unchanged (one `stat` per request instead of a read of its header), and shared by
the dataset's frame stores (its tier's and the hot layer's), which fingerprint the same files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from app.sources import SourceFingerprint
from app.sources.frame_tiers import estimated_frame_segment_bytes, hot_batches, hot_layer_of, projected_frame_disk
from app.sources.source import VideoFeature
from app.store.frame_budget import FrameBudget
from app.store.mapped_segments import Segment, SegmentLRU
from app.store.segments import SegmentStore


class FrameCache(SegmentStore):
    """`<cache>/frames/`: the decoded-frame segments of a dataset's video files."""

    def __init__(self, directory: Path, lru: SegmentLRU, budget: FrameBudget, batch_bytes: int, verify: bool) -> None:
        super().__init__(directory, lru, batch_bytes, verify, builder="frames")
        self.budget = budget
        self._fingerprints: dict[str, SourceFingerprint] = {}

    def file_fingerprint(self, rel: str) -> SourceFingerprint:
        """The fingerprint of video file `rel`, remembered while the file stays unchanged."""
        source = self.reader
        assert source is not None, "the dataset's index is loaded before its frames are read"
        known = self._fingerprints.get(rel)
        if known is None or not source.is_unchanged(known):
            known = self._fingerprints[rel] = source.fingerprint(rel)[0]
        return known

    def mapped_segment(self, rel: str) -> Segment | None:
        """The decoded-frame segment of video file `rel` if this process has it mapped already. A file this process
        has not fingerprinted has no segment mapped here: None, without a look at the file (which may not even be
        there yet: a Hub dataset's video is fetched by the first read that needs it)."""
        if rel not in self._fingerprints:
            return None
        mapped = self.opened(self.file_fingerprint(rel))
        return None if mapped is None else self._used(mapped)

    def segment(self, rel: str, schema: pa.Schema, build: bool) -> Segment | None:
        """The decoded-frame segment of video file `rel` if it is built; else None (decode on demand), and with
        `build` its build queued in the background if the budget has room for it."""
        source = self.file_fingerprint(rel)
        segment = self.open_if_built(source, schema)
        if segment is None:
            if build and not self.queued(rel) and self._admit(source, schema):
                self.build_in_background(source, schema, admit=lambda: self._admit(source, schema))
            return None
        return self._used(segment)

    def build_now(self, rel: str, schema: pa.Schema) -> Segment | None:
        """The decoded-frame segment of video file `rel`, built now if it is not (None if it is larger than the
        whole budget)."""
        source = self.file_fingerprint(rel)
        segment = self.open_if_built(source, schema)
        if segment is None:
            if not self._admit(source, schema):
                return None
            segment = self.open(source, schema)
        return self._used(segment)

    def status(self, cameras: Sequence[VideoFeature], frames: int) -> dict[str, Any]:
        """Segments built, their bytes, the budget, and the disk all the frames of `cameras` (`frames` each) would
        take (`projected`)."""
        sizes = self.published_sizes()
        return {
            "built": len(sizes),
            "bytes": sum(sizes),
            "budget_bytes": self.budget.limit,
            "projected": projected_frame_disk(cameras, frames, self.budget.limit),
        }

    def _admit(self, source: SourceFingerprint, schema: pa.Schema) -> bool:
        """Make room in the budget for the decoded-frame segment of `source` (False: it never fits)."""
        return self.budget.admit(self.paths(source.path).arrow, estimated_frame_segment_bytes(schema, source.rows))

    def _used(self, segment: Segment) -> Segment:
        self.budget.touch(self.paths(segment.source.path).arrow)
        return segment


class HotFrameCache(FrameCache):
    """`<cache>/hot-frames/`: the hot pixels over an encoded tier (`app.sources.frame_tiers.HotPixels`). A file
    whose tier segment is built, and still matches its checksum, is made hot from it, each stored JPEG decoded (the
    same pixels as the round trip of the video's frames, at a fraction of the cost: no video decode, no encode);
    other files from the video."""

    def __init__(self, directory: Path, tier_frames: FrameCache, budget: FrameBudget) -> None:
        super().__init__(directory, tier_frames.lru, budget, tier_frames.batch_bytes, tier_frames.verify_on_open)
        self.tier_frames = tier_frames
        # The same files as the tier's: one look at each serves both (a quick read's ETag on the event loop
        # never opens a file the other store has fingerprinted).
        self._fingerprints = tier_frames._fingerprints

    def _batches(self, source: SourceFingerprint, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        layer = hot_layer_of(schema)
        kept = None if layer is None else self.tier_frames.sound_batches(source, layer[0].of.schema(layer[1]))
        if layer is None or kept is None:
            return super()._batches(source, schema)
        hot, shape = layer
        return hot_batches(kept, hot, schema, shape, self.batch_bytes)
