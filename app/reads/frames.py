"""Camera frames of view rows: each row's episode and timestamp locate its frame (LeRobot's rule, see
`app.sources.video`); the frames a request needs are grouped by video file and decoded in one forward pass per
file, then returned as an Arrow fixed-shape tensor column (uint8, (height, width, channels))."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from app.errors import DatasetError, InvalidInput, WouldBlock
from app.reads.arrow_ipc import OWN_CHUNK_BYTES
from app.reads.episode_spec import EpisodeRanges, resolve_episodes
from app.reads.pending_copies import PendingCopies
from app.reads.takes import take_rows
from app.sources.source import EpisodeClip, Source, VideoFeature
from app.sources.video import FRAME, PTS, check_tolerance, decode_nearest_side_by_side, frame_schema, nearest_rows
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


@dataclass(frozen=True)
class LocatedRows:
    """The distinct rows of a request, located for LeRobot's frame rule: `order[i]` is the distinct row of the
    request's row `i`."""

    episodes: np.ndarray
    timestamps: np.ndarray
    frame_index: np.ndarray  # the row's frame number within its episode
    order: np.ndarray


def locate_rows(
    dataset: Dataset, index: EpisodeIndex, view: EpisodeView, rows: np.ndarray, may_block: bool = True
) -> LocatedRows:
    """The episode, timestamp and frame number of each distinct one of view `rows` (not empty)."""
    check_locatable(dataset, index)
    unique, inverse = np.unique(rows, return_inverse=True)
    located = take_rows(dataset, index, view, unique, [dataset.episode_column, TIMESTAMP], may_block)
    first, _ = view.episode_bounds(unique)
    return LocatedRows(
        located[dataset.episode_column].to_numpy(),
        located[TIMESTAMP].to_numpy().astype(np.float64),
        unique - first,
        inverse,
    )


def check_locatable(dataset: Dataset, index: EpisodeIndex) -> None:
    """A problem unless the dataset's rows have what LeRobot's frame rule needs."""
    if TIMESTAMP not in index.schema.names or not index.has_episode_column:
        raise InvalidInput(f"dataset {dataset.id!r} has no {TIMESTAMP!r} and episode columns to locate frames by")


def frame_times(source: Source, feature: VideoFeature, episodes: np.ndarray, timestamps: np.ndarray) -> FrameTimes:
    """Where each row's frame is: its video file and the presentation time nearest to which it lies there."""
    clips: dict[int, EpisodeClip] = {int(e): source.episode_clip(feature.key, int(e)) for e in np.unique(episodes)}
    wanted = timestamps + np.array([clips[int(e)].from_timestamp for e in episodes])
    paths = np.array([clips[int(e)].path for e in episodes], dtype=object)
    return FrameTimes(wanted, paths)


@dataclass(frozen=True)
class FrameTimes:
    """For each row, the video file its frame is in and the time it is wanted at there."""

    wanted: np.ndarray
    paths: np.ndarray

    def files(self) -> list[str]:
        """The distinct video files, sorted."""
        return sorted(set(self.paths.tolist()))


def frame_columns(
    dataset: Dataset,
    index: EpisodeIndex,
    view: EpisodeView,
    rows: np.ndarray,
    keys: list[str],
    tolerance_s: float,
    pending: PendingCopies | None = None,
    may_block: bool = True,
    located: LocatedRows | None = None,
) -> dict[str, pa.Array]:
    """The frames of `keys` for view `rows` (any order, duplicates allowed), one column per key. Frames found
    in decoded-frame segments are left to `pending` when given (and at least `OWN_CHUNK_BYTES` each). Without
    `may_block`, only frames from segments this process has mapped, and at most `inline_read_bytes` of them
    copied (else `WouldBlock`). `located`: `rows` located already (`locate_rows`)."""
    check_locatable(dataset, index)
    if len(rows) == 0:
        videos = dataset.info().videos
        return {key: _empty(videos[key].arrow_type) for key in keys}
    if located is None:
        located = locate_rows(dataset, index, view, rows, may_block)
    source = dataset.source()
    columns = {}
    for key in keys:
        feature = source.info.videos[key]
        frames = _frames(dataset, source, feature, located, tolerance_s, pending, may_block)
        columns[key] = pa.FixedShapeTensorArray.from_numpy_ndarray(frames)
    return columns


def _frames(
    dataset: Dataset,
    source: Source,
    feature: VideoFeature,
    located: LocatedRows,
    tolerance_s: float,
    pending: PendingCopies | None,
    may_block: bool,
) -> np.ndarray:
    """The frames of `feature` for the `located` rows in request order, checked against `tolerance_s`. Each
    frame is written once, copied from the decoded-frame segment's memory map (or left to `pending`, which sends
    it from the map) or converted from the decoder straight into the result."""
    order = located.order
    times_of = frame_times(source, feature, located.episodes, located.timestamps)
    wanted, paths = times_of.wanted, times_of.paths
    frames = np.empty((len(order), feature.height, feature.width, feature.channels), dtype=np.uint8)
    deferred = pending if len(order) and frames[0].nbytes >= OWN_CHUNK_BYTES else None
    if not may_block and deferred is None and frames.nbytes > dataset.limits.inline_read_bytes:
        raise WouldBlock(f"{len(order)} frames of {feature.key} are more than {dataset.limits.inline_read_bytes} bytes")
    found = np.empty(len(located.episodes))
    for path in times_of.files():
        here = np.flatnonzero(paths == path)
        times, back = np.unique(wanted[here], return_inverse=True)
        picture_of_row = np.full(len(located.episodes), -1)
        picture_of_row[here] = back
        positions = np.flatnonzero(np.isin(order, here))
        picks = picture_of_row[order[positions]]  # which of `times` each of `positions` shows
        segment = frame_segment(dataset, path, feature, may_block)
        if segment is None:
            if not may_block:
                raise WouldBlock("camera frames are decoded off the event loop")
            places = _places(positions, picks, len(times))
            at = decode_nearest_side_by_side(frames, places, dataset.path, path, times, feature, dataset.decoders)
        else:
            pictures, batch_of, row_in_batch, at = _nearest_in_segment(segment, times, feature)
            if deferred is not None:
                places = zip(batch_of[picks].tolist(), row_in_batch[picks].tolist(), strict=True)
                deferred.add(frames, positions, [pictures[batch][row] for batch, row in places])
            else:
                _gather(frames, positions, pictures, batch_of[picks], row_in_batch[picks])
        found[here] = at[back]
    check_tolerance(feature.key, located.episodes, located.frame_index, wanted, found, tolerance_s)
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


def frame_segment(dataset: Dataset, path: str, feature: VideoFeature, may_block: bool) -> Segment | None:
    """The decoded-frame segment of a video file, as the cache policy has it: built on first touch (budget
    allowing), used only where `warm` built it, or never."""
    policy = dataset.limits.video_cache_policy
    if policy == "on-demand":
        return None
    return dataset.frame_segment(path, frame_schema(feature), policy == "first-touch", may_block)


def _gather(
    out: np.ndarray, positions: np.ndarray, pictures: list[np.ndarray], batch_of: np.ndarray, row_in_batch: np.ndarray
) -> None:
    """`out[positions[i]] = pictures[batch_of[i]][row_in_batch[i]]`. Large frames are copied one by one, straight
    into place (a vectorised scatter would first gather them into a temporary, a second copy of every byte); small
    ones by one vectorised copy per batch."""
    if out[0].nbytes >= _ONE_BY_ONE_BYTES:
        for position, batch, row in zip(positions.tolist(), batch_of.tolist(), row_in_batch.tolist(), strict=True):
            out[position] = pictures[batch][row]
        return
    for batch in np.unique(batch_of).tolist():
        chosen = batch_of == batch
        out[positions[chosen]] = pictures[batch][row_in_batch[chosen]]


_ONE_BY_ONE_BYTES = 32 * 1024


def _places(positions: np.ndarray, picks: np.ndarray, count: int) -> list[np.ndarray]:
    """For each of `count` pictures, the `positions` that show it (`picks[i]` is the picture of `positions[i]`)."""
    order = np.argsort(picks, kind="stable")
    bounds = np.searchsorted(picks[order], np.arange(count + 1))
    return np.split(positions[order], bounds[1:-1])


def _nearest_in_segment(
    segment: Segment, times: np.ndarray, feature: VideoFeature
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """For each of `times`, where the segment's nearest frame is (its batch's frames as views of the memory map,
    the batch and row of each) and its presentation time."""
    pictures = segment.derived(FRAME, lambda: _pixel_views(segment, feature))
    offsets = segment.batch_offsets
    rows, at = nearest_in_segment(segment, times)
    batches = np.searchsorted(offsets, rows, side="right") - 1
    return pictures, batches, rows - offsets[batches], at


def nearest_in_segment(segment: Segment, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of `times`, the row of the decoded-frame segment with the nearest frame, and that frame's time."""
    pts = segment.derived(PTS, lambda: np.concatenate([b.column(0).to_numpy() for b in segment.batches]))
    rows = nearest_rows(pts, times)
    return rows, pts[rows]


def _pixel_views(segment: Segment, feature: VideoFeature) -> list[np.ndarray]:
    """Each batch's frames as an (n, H, W, C) uint8 view of the memory map."""
    shape = (feature.height, feature.width, feature.channels)
    views = []
    for batch in segment.batches:
        column = batch.column(batch.schema.get_field_index(FRAME))
        values = column.values.to_numpy(zero_copy_only=True)[column.offset * column.type.list_size :]
        views.append(values[: len(column) * column.type.list_size].reshape(len(column), *shape))
    return views


def _empty(kind: pa.ExtensionType) -> pa.ExtensionArray:
    return pa.ExtensionArray.from_storage(kind, pa.array([], type=kind.storage_type))
