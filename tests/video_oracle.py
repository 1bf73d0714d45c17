"""The expected camera frames of a LeRobot dataset (v2.1 or v3.0), computed the plain way, for tests.

LeRobot's rule (format reference, sections 4-5): the frame of a row is the decoded frame whose presentation time is
nearest to `from_timestamp + timestamp` in the episode's video file (v3.0; `from_timestamp` from the episode
metadata), or to `timestamp` in the episode's own file (v2.1); if that distance exceeds `tolerance_s`, it is an
error. `timestamp` is the row's value in the data parquet. This module decodes whole files with PyAV into
(presentation seconds, RGB frame) and picks the nearest; it shares no code with the server.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DEFAULT_TOLERANCE_S = 1e-4  # LeRobotDataset's default tolerance_s


class FrameTimestampError(ValueError):
    """No decoded frame lies within the tolerance of a query time."""


@dataclass(frozen=True)
class EpisodeVideo:
    """Where one episode's frames of one camera are: a file, and the episode's start time within it."""

    path: Path
    from_timestamp: float  # 0.0 for v2.1
    to_timestamp: float | None  # None for v2.1 (the episode's file ends with the episode)


def episode_video(dataset: Path, video_key: str, episode: int) -> EpisodeVideo:
    """The file and start time of `episode` for camera `video_key`, from info.json and the episode metadata."""
    info = _info(dataset)
    feature = info["features"].get(video_key)
    if feature is None or feature.get("dtype") != "video":
        raise KeyError(f"{video_key!r} is not a video feature of {dataset}")
    if info["codebase_version"] == "v2.1":
        chunk = episode // info["chunks_size"]
        name = info["video_path"].format(episode_chunk=chunk, video_key=video_key, episode_index=episode)
        return EpisodeVideo(dataset / name, 0.0, None)
    row = _v30_episodes(dataset).get(episode)
    if row is None:
        raise KeyError(f"episode {episode} is not in the episode metadata of {dataset}")
    prefix = f"videos/{video_key}/"
    name = info["video_path"].format(
        video_key=video_key, chunk_index=row[prefix + "chunk_index"], file_index=row[prefix + "file_index"]
    )
    return EpisodeVideo(dataset / name, float(row[prefix + "from_timestamp"]), float(row[prefix + "to_timestamp"]))


def decode_video(path: Path, size: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every frame of the file's first video stream, in presentation order: (seconds float64 (N,), uint8 RGB
    (N, H, W, 3)), resized to `size` (height, width) by FFmpeg's area averaging if given. Cached per file version
    (path, size, mtime)."""
    stat = Path(path).stat()
    return _decode_video(str(path), stat.st_size, stat.st_mtime_ns, size)


@functools.lru_cache(maxsize=4)
def _decode_video(path: str, nbytes: int, mtime_ns: int, size: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    seconds, frames = [], []
    resize = {} if size is None else {"height": size[0], "width": size[1], "interpolation": "AREA"}
    with av.open(path) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            seconds.append(float(Fraction(frame.pts) * frame.time_base))
            frames.append(frame.to_ndarray(format="rgb24", **resize))
    order = np.argsort(seconds, kind="stable")
    times = np.asarray(seconds, dtype=np.float64)[order]
    stacked = np.stack(frames)[order] if frames else np.empty((0, 0, 0, 3), dtype=np.uint8)
    times.flags.writeable = stacked.flags.writeable = False  # shared by the cache
    return times, stacked


def frames_at(
    dataset: Path,
    video_key: str,
    queries: Iterable[tuple[int, float]],
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    size: tuple[int, int] | None = None,
) -> np.ndarray:
    """The frames (N, H, W, 3) uint8 RGB for (episode_index, timestamp) pairs, under LeRobot's rule.

    Raises FrameTimestampError naming the key, episode, timestamp, file and distance when the nearest frame is
    farther than `tolerance_s` from the query time."""
    picked = []
    for episode, timestamp in queries:
        video = episode_video(dataset, video_key, episode)
        times, frames = decode_video(video.path, size)
        query = video.from_timestamp + float(timestamp)
        if len(times) == 0:
            raise FrameTimestampError(f"{video_key}: {video.path} has no frames (episode {episode})")
        nearest = int(np.argmin(np.abs(times - query)))
        distance = abs(times[nearest] - query)
        if distance > tolerance_s:
            raise FrameTimestampError(
                f"{video_key}: no frame within {tolerance_s} s of t={query:.6f} s (episode {episode}, "
                f"timestamp {timestamp}) in {video.path}; nearest at {times[nearest]:.6f} s, {distance:.6f} s away"
            )
        picked.append(frames[nearest])
    if not picked:
        raise ValueError("no queries")
    return np.stack(picked)


def frames_for_rows(
    dataset: Path,
    video_key: str,
    rows: Iterable[tuple[int, int]],
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    size: tuple[int, int] | None = None,
) -> np.ndarray:
    """The frames for (episode_index, frame_index) rows: each row's `timestamp` from the data parquet, then
    `frames_at`. For a window, pass the clamped frame index (LeRobot clamps to the episode before it looks up the
    timestamp)."""
    timestamps = _timestamps(dataset)
    queries = []
    for episode, frame_index in rows:
        episode_timestamps = timestamps.get(episode, [])
        if not 0 <= frame_index < len(episode_timestamps):
            raise KeyError(f"no row (episode {episode}, frame {frame_index}) in {dataset}")
        queries.append((episode, episode_timestamps[frame_index]))
    return frames_at(dataset, video_key, queries, tolerance_s, size)


def read_label(frame: np.ndarray) -> tuple[int, int]:
    """(episode_index, frame_index) drawn into a demo frame (app.demo_video.camera_frames): 8x8 cells in raster
    order, the first 16 the frame index and the next 16 the episode index, most significant bit first, white = 1.
    Each cell is read from the mean of its central 4x4 pixels, so codec noise does not flip a bit."""
    columns = frame.shape[1] // 8
    bits = []
    for cell in range(32):
        row, column = divmod(cell, columns)
        centre = frame[row * 8 + 2 : row * 8 + 6, column * 8 + 2 : column * 8 + 6]
        bits.append(int(centre.mean() > 127.5))
    frame_index = int("".join(map(str, bits[:16])), 2)
    episode = int("".join(map(str, bits[16:])), 2)
    return episode, frame_index


# ----------------------------------------------------------------------------------------------------
# Metadata, read once per dataset version (info.json's mtime changes when a demo is rewritten)


def _version(dataset: Path) -> tuple[str, int]:
    return str(dataset), (Path(dataset) / "meta/info.json").stat().st_mtime_ns


def _info(dataset: Path) -> dict:
    return _cached_info(*_version(dataset))


def _v30_episodes(dataset: Path) -> dict[int, dict]:
    return _cached_v30_episodes(*_version(dataset))


def _timestamps(dataset: Path) -> dict[int, list[float]]:
    return _cached_timestamps(*_version(dataset))


@functools.lru_cache(maxsize=16)
def _cached_info(dataset: str, _mtime_ns: int) -> dict:
    return json.loads((Path(dataset) / "meta/info.json").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=16)
def _cached_v30_episodes(dataset: str, _mtime_ns: int) -> dict[int, dict]:
    files = sorted(Path(dataset).glob("meta/episodes/*/*.parquet"))
    table = pa.concat_tables([pq.read_table(path) for path in files], promote_options="permissive")
    columns = [name for name in table.column_names if not name.startswith("stats/")]
    return {row["episode_index"]: row for row in table.select(columns).to_pylist()}


@functools.lru_cache(maxsize=16)
def _cached_timestamps(dataset: str, _mtime_ns: int) -> dict[int, list[float]]:
    """episode_index -> the `timestamp` column of its rows, in frame_index order (float32 values as floats)."""
    files = sorted((Path(dataset) / "data").rglob("*.parquet"))
    table = pa.concat_tables(
        [pq.read_table(path, columns=["episode_index", "frame_index", "timestamp"]) for path in files]
    )
    table = table.take(pc.sort_indices(table, [("episode_index", "ascending"), ("frame_index", "ascending")]))
    found: dict[int, list[float]] = {}
    for episode, timestamp in zip(table["episode_index"].to_pylist(), table["timestamp"].to_pylist(), strict=True):
        found.setdefault(episode, []).append(timestamp)
    return found
