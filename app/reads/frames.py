"""Camera frames of view rows: each row's episode and timestamp locate its frame (LeRobot's rule, see
`app.sources.video`); the frames a request needs are grouped by video file and decoded in one forward pass per
file, then returned as an Arrow fixed-shape tensor column (uint8, (height, width, channels))."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from app.errors import DatasetError, InvalidInput
from app.reads.episode_spec import EpisodeRanges, resolve_episodes
from app.reads.takes import take_rows
from app.sources.source import EpisodeClip, Source, VideoFeature
from app.sources.video import FRAME, PTS, check_tolerance, decode_nearest, frame_schema, nearest_rows
from app.store.dataset import Dataset
from app.store.episode_index import EpisodeIndex
from app.store.segments import Segment
from app.store.views import EpisodeView

TIMESTAMP = "timestamp"


def view_schema(dataset: Dataset, index: EpisodeIndex) -> pa.Schema:
    """The columns of the view: the stored ones, then one per camera."""
    videos = dataset.info().videos
    if not videos:
        return index.schema
    stored = [name for name in videos if name in index.schema.names]
    if stored:
        raise DatasetError(f"cameras {stored} are also stored columns; the dataset is inconsistent")
    return pa.schema(
        [*index.schema, *(pa.field(key, feature.arrow_type) for key, feature in videos.items())],
        metadata=index.schema.metadata,
    )


def frame_columns(
    dataset: Dataset,
    index: EpisodeIndex,
    view: EpisodeView,
    rows: np.ndarray,
    keys: list[str],
    tolerance_s: float,
) -> dict[str, pa.Array]:
    """The frames of `keys` for view `rows` (any order, duplicates allowed), one column per key."""
    if TIMESTAMP not in index.schema.names or not index.has_episode_column:
        raise InvalidInput(f"dataset {dataset.id!r} has no {TIMESTAMP!r} and episode columns to locate frames by")
    if len(rows) == 0:
        videos = dataset.info().videos
        return {key: _empty(videos[key].arrow_type) for key in keys}
    unique, inverse = np.unique(rows, return_inverse=True)
    located = take_rows(dataset, index, view, unique, [dataset.episode_column, TIMESTAMP])
    episodes = located[dataset.episode_column].to_numpy()
    timestamps = located[TIMESTAMP].to_numpy().astype(np.float64)
    first, _ = view.episode_bounds(unique)
    frame_index = unique - first
    source = dataset.source()
    columns = {}
    for key in keys:
        feature = source.info.videos[key]
        frames = _frames(dataset, source, feature, episodes, timestamps, frame_index, tolerance_s)
        columns[key] = pa.FixedShapeTensorArray.from_numpy_ndarray(frames[inverse])
    return columns


def _frames(
    dataset: Dataset,
    source: Source,
    feature: VideoFeature,
    episodes: np.ndarray,
    timestamps: np.ndarray,
    frame_index: np.ndarray,
    tolerance_s: float,
) -> np.ndarray:
    """The frames of `feature` for rows of `episodes` at `timestamps`, checked against `tolerance_s`."""
    clips: dict[int, EpisodeClip] = {int(e): source.episode_clip(feature.key, int(e)) for e in np.unique(episodes)}
    wanted = timestamps + np.array([clips[int(e)].from_timestamp for e in episodes])
    paths = np.array([clips[int(e)].path for e in episodes], dtype=object)
    frames = np.empty((len(episodes), feature.height, feature.width, feature.channels), dtype=np.uint8)
    found = np.empty(len(episodes))
    for path in sorted(set(paths.tolist())):
        here = np.flatnonzero(paths == path)
        times, back = np.unique(wanted[here], return_inverse=True)
        segment = _frame_segment(dataset, path, feature)
        if segment is None:
            decoded, at = decode_nearest(dataset.path, path, times, feature)
        else:
            decoded, at = _nearest_in_segment(segment, times, feature)
        frames[here] = decoded[back]
        found[here] = at[back]
    check_tolerance(feature.key, episodes, frame_index, wanted, found, tolerance_s)
    return frames


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


def _frame_segment(dataset: Dataset, path: str, feature: VideoFeature) -> Segment | None:
    """The decoded-frame segment of a video file, as the cache policy has it: built on first touch (budget
    allowing), used only where `warm` built it, or never."""
    policy = dataset.limits.video_cache_policy
    if policy == "on-demand":
        return None
    return dataset.frame_segment(path, frame_schema(feature), build=policy == "first-touch")


def _nearest_in_segment(segment: Segment, times: np.ndarray, feature: VideoFeature) -> tuple[np.ndarray, np.ndarray]:
    """For each of `times`, the segment's nearest frame and its presentation time (as `decode_nearest`)."""
    pts = segment.derived(PTS, lambda: np.concatenate([b.column(0).to_numpy() for b in segment.batches]))
    rows = nearest_rows(pts, times)
    wanted, back = np.unique(rows, return_inverse=True)
    pieces = [batch.column(0) for batch in segment.take(wanted, [FRAME])]
    pixels = pa.concat_arrays(pieces).values.to_numpy()
    frames = pixels.reshape(len(wanted), feature.height, feature.width, feature.channels)
    return frames[back], pts[rows]


def _empty(kind: pa.ExtensionType) -> pa.ExtensionArray:
    return pa.ExtensionArray.from_storage(kind, pa.array([], type=kind.storage_type))
