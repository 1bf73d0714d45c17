"""Camera frames of view rows, the pieces `ViewRead` reads them with: each row's episode and timestamp locate its
frame (LeRobot's rule, see `app.sources.video`); the frames a request needs are grouped by video file, found
nearest in a decoded-frame segment (as views of its map) or decoded in one forward pass per file, and returned as
an Arrow fixed-shape tensor column (uint8, (height, width, channels))."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from app.errors import DatasetError, InvalidInput
from app.reads.episode_spec import EpisodeRanges, resolve_episodes
from app.reads.segment_memo import remembered
from app.sources.frame_tiers import FRAME, PTS, Pictures
from app.sources.source import EpisodeClip, Source, VideoFeature
from app.sources.video import frame_schema, nearest_rows
from app.store.dataset import Dataset
from app.store.episode_index import EpisodeIndex
from app.store.mapped_segments import Segment

TIMESTAMP = "timestamp"


def view_schema(dataset: Dataset, index: EpisodeIndex) -> pa.Schema:
    """The columns of the view: the stored ones, then one per camera (remembered per index snapshot)."""
    info = dataset.info()
    known = _VIEW_SCHEMAS.get(id(index))
    if known is not None and known[0]() is index and known[1] is info:
        return known[2]
    videos = info.videos
    if not videos:
        return index.schema
    stored = [name for name in videos if name in index.schema.names]
    if stored:
        raise DatasetError(f"cameras {stored} are also stored columns; the dataset is inconsistent")
    schema = pa.schema(
        [*index.schema, *(pa.field(key, feature.arrow_type) for key, feature in videos.items())],
        metadata=index.schema.metadata,
    )
    if len(_VIEW_SCHEMAS) >= _KEPT_VIEW_SCHEMAS:
        _VIEW_SCHEMAS.clear()  # atomic, unlike dropping the oldest while other threads add theirs
    _VIEW_SCHEMAS[id(index)] = (weakref.ref(index), info, schema)
    return schema


# By the index snapshot's id, checked against a weak reference to it (an id may be reused once it is gone).
_VIEW_SCHEMAS: dict[int, tuple[weakref.ref[EpisodeIndex], object, pa.Schema]] = {}
_KEPT_VIEW_SCHEMAS = 64


def resized_cameras(
    cameras: Mapping[str, VideoFeature],
    answered: Iterable[str],
    frame_size: tuple[int, int] | Mapping[str, tuple[int, int]] | None,
) -> dict[str, VideoFeature]:
    """The cameras a request asks for at another size than they are served at (`frame_size`: one (height, width)
    for every camera `answered`, or one per camera named), each as the camera served at that size; a problem for a
    name that is no camera, or a size larger than the served one (a request may only downscale: the server's
    configuration bounds the bytes of every frame it decodes)."""
    if frame_size is None:
        return {}
    if isinstance(frame_size, Mapping):
        unknown = [key for key in frame_size if key not in cameras]
        if unknown:
            raise InvalidInput(f"frame_size names {unknown}, which are not cameras of the dataset: {list(cameras)}")
        sizes = dict(frame_size)
    else:
        sizes = {key: frame_size for key in answered}
    resized = {}
    for key, (height, width) in sizes.items():
        served = cameras[key]
        if height > served.height or width > served.width:
            raise InvalidInput(
                f"frame_size {height}x{width} of camera {key!r} is larger than the {served.height}x{served.width} "
                "it is served at: a request may only downscale frames (enlarge them on the client, or serve them "
                "larger with EPISERVE_VIDEO_CACHE_SIZE)"
            )
        if (height, width) != (served.height, served.width):
            resized[key] = served.resized(height, width)
    return resized


@dataclass(frozen=True)
class LocatedRows:
    """The distinct rows of a request, located for LeRobot's frame rule: `order[i]` is the distinct row of the
    request's row `i`."""

    episodes: np.ndarray
    timestamps: np.ndarray
    frame_index: np.ndarray  # the row's frame number within its episode
    order: np.ndarray


def frame_times(source: Source, feature: VideoFeature, episodes: np.ndarray, timestamps: np.ndarray) -> FrameTimes:
    """Where each row's frame is: its video file and the presentation time nearest to which it lies there."""
    distinct, episode_of_row = np.unique(episodes, return_inverse=True)
    clips: list[EpisodeClip] = [source.episode_clip(feature.key, e) for e in distinct.tolist()]
    files = sorted({clip.path for clip in clips})
    file_of_clip = np.array([files.index(clip.path) for clip in clips], dtype=np.int64)
    starts = np.array([clip.from_timestamp for clip in clips], dtype=np.float64)
    return FrameTimes(timestamps + starts[episode_of_row], files, file_of_clip[episode_of_row])


@dataclass(frozen=True)
class FrameTimes:
    """For each row, the time its frame is wanted at in its video file, and which file (an index into `paths`,
    the distinct files, sorted)."""

    wanted: np.ndarray
    paths: list[str]
    file_of_row: np.ndarray

    def rows_in(self, file: int) -> np.ndarray:
        """The rows whose frame lies in `paths[file]`."""
        if len(self.paths) == 1:
            return np.arange(len(self.wanted))
        return np.flatnonzero(self.file_of_row == file)


def video_files_needed(dataset: Dataset, episodes: EpisodeRanges | None) -> list[tuple[str, pa.Schema]]:
    """(video file, frame schema) of every camera of the selected episodes, for `warm --videos`."""
    index = dataset.index()
    source = dataset.source()
    selected = index.episodes if episodes is None else resolve_episodes(episodes, index.episodes)
    files: dict[str, pa.Schema] = {}
    for key, feature in source.info.videos.items():
        for episode in selected.tolist():
            files.setdefault(source.episode_clip(key, int(episode)).path, frame_schema(feature))
    return sorted(files.items())


def gather_pictures(
    out: np.ndarray, positions: np.ndarray, pictures: list[Pictures], batch_of: np.ndarray, row_in_batch: np.ndarray
) -> None:
    """`out[positions[i]] = pictures[batch_of[i]][row_in_batch[i]]`, batch by batch, each frame written straight
    into place (copied from the map, or decoded, as the tier keeps it)."""
    if len(positions) == 0:
        return
    for batch in np.unique(batch_of).tolist():
        chosen = batch_of == batch
        pictures[batch].copy_into(out, positions[chosen], row_in_batch[chosen])


def places_of(positions: np.ndarray, picks: np.ndarray, count: int) -> list[np.ndarray]:
    """For each of `count` pictures, the `positions` that show it (`picks[i]` is the picture of `positions[i]`)."""
    order = np.argsort(picks, kind="stable")
    bounds = np.searchsorted(picks[order], np.arange(count + 1))
    return np.split(positions[order], bounds[1:-1])


def nearest_pictures(
    segment: Segment, times: np.ndarray, feature: VideoFeature
) -> tuple[list[Pictures], np.ndarray, np.ndarray, np.ndarray]:
    """For each of `times`, where the segment's nearest frame is (its batch's frames as views of the memory map,
    the batch and row of each) and its presentation time."""
    pictures = remembered(segment, FRAME, lambda: _pixel_views(segment, feature))
    offsets = segment.batch_offsets
    rows, at = nearest_in_segment(segment, times)
    batches = np.searchsorted(offsets, rows, side="right") - 1
    return pictures, batches, rows - offsets[batches], at


def nearest_in_segment(segment: Segment, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of `times`, the row of the decoded-frame segment with the nearest frame, and that frame's time."""
    pts = remembered(segment, PTS, lambda: np.concatenate([b.column(0).to_numpy() for b in segment.batches]))
    rows = nearest_rows(pts, times)
    return rows, pts[rows]


def _pixel_views(segment: Segment, feature: VideoFeature) -> list[Pictures]:
    """Each batch's frames as pixels: (n, H, W, C) uint8 views of the memory map for raw frames, decoded when read
    for encoded ones (the camera's tier says)."""
    return [
        feature.tier.pictures(batch.column(batch.schema.get_field_index(FRAME)), feature.shape)
        for batch in segment.batches
    ]


def encoded_frames(segment: Segment, rows: np.ndarray) -> pa.Array | None:
    """The frames of segment `rows` (any order) as the segment keeps them encoded, in that order; None for a
    segment of raw frames."""
    offsets = segment.batch_offsets
    batches = np.searchsorted(offsets, rows, side="right") - 1
    order = np.argsort(batches, kind="stable")
    chunks = []
    for batch in np.unique(batches).tolist():
        column = segment.batches[batch].column(segment.batches[batch].schema.get_field_index(FRAME))
        if not pa.types.is_binary(column.type):
            return None
        chunks.append(column.take(pa.array(rows[order][batches[order] == batch] - offsets[batch])))
    if not chunks:
        return pa.array([], pa.binary())
    gathered = pa.concat_arrays(chunks)
    back = np.empty(len(rows), dtype=np.int64)
    back[order] = np.arange(len(rows))
    return gathered.take(pa.array(back))


def tensor_column(frames: np.ndarray, feature: VideoFeature) -> pa.ExtensionArray:
    """`frames` (n, height, width, channels, C-contiguous uint8) as a column of the camera's tensor type,
    zero-copy (a quarter of the cost of `FixedShapeTensorArray.from_numpy_ndarray`, which checks its input)."""
    kind = feature.arrow_type
    values = pa.Array.from_buffers(pa.uint8(), frames.size, [None, pa.py_buffer(frames)])
    storage = pa.Array.from_buffers(kind.storage_type, len(frames), [None], children=[values])
    return pa.ExtensionArray.from_storage(kind, storage)


class ReusedBlocks:
    """uint8 arrays of at most `most_bytes`, handed out again once nothing but this holds them (CPython's reference
    count says so; an answer's frames are held until its piece is sent): at most `kept` blocks, the largest free
    one evicted when a request finds none free. Frames decoded into fresh memory cost a page fault per 4 KiB on
    top of the decode (a tenth of a 224x224 JPEG tier's read); larger arrays are fresh each time."""

    def __init__(self, kept: int, most_bytes: int) -> None:
        self._kept, self._most_bytes = kept, most_bytes
        self._blocks: list[np.ndarray] = []
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised uint8 array of `shape`: a view of a free block large enough, else a new one."""
        size = int(np.prod(shape))
        if size == 0 or size > self._most_bytes:
            return np.empty(shape, dtype=np.uint8)
        with self._lock:
            free = [n for n in range(len(self._blocks)) if sys.getrefcount(self._blocks[n]) <= _FREE_REFERENCES]
            fitting = [n for n in free if self._blocks[n].size >= size]
            if fitting:
                return self._blocks[min(fitting, key=lambda n: self._blocks[n].size)][:size].reshape(shape)
            if len(self._blocks) >= self._kept:
                if not free:
                    return np.empty(shape, dtype=np.uint8)
                del self._blocks[max(free, key=lambda n: self._blocks[n].size)]
            block = np.empty(size, dtype=np.uint8)
            self._blocks.append(block)
            return block.reshape(shape)


# References to a free block while `sys.getrefcount(self._blocks[n])` looks at it: the list's and the argument.
_FREE_REFERENCES = 2
# The frames of this process's reads: a piece of an answer (about 4 MiB) each, for the reads of its thread pool and
# the pieces read ahead or waiting to be sent.
FRAME_BLOCKS = ReusedBlocks(kept=6, most_bytes=8 * 1024 * 1024)


def empty_frames(kind: pa.ExtensionType) -> pa.ExtensionArray:
    return pa.ExtensionArray.from_storage(kind, pa.array([], type=kind.storage_type))


def camera_windows(frames: pa.FixedShapeTensorArray, width: int) -> pa.FixedShapeTensorArray:
    """Frames gathered row-major (n * width) as one (width, height, width, channels) tensor per row."""
    if len(frames) == 0:  # pyarrow cannot build a tensor array from an empty ndarray (a count: `stop=0`)
        kind = pa.fixed_shape_tensor(frames.type.value_type, [width, *frames.type.shape])
        storage = pa.FixedSizeListArray.from_arrays(pa.array([], frames.type.value_type), kind.storage_type.list_size)
        return pa.ExtensionArray.from_storage(kind, storage)
    stacked = frames.to_numpy_ndarray()
    return pa.FixedShapeTensorArray.from_numpy_ndarray(stacked.reshape(-1, width, *stacked.shape[1:]))
