"""Write deterministic, realistic LeRobot-format demo datasets (v3.0 or v2.1).

The frames are synthetic but shaped like a real recording: smooth 6-joint state/action trajectories, a small PNG
camera image per frame, the five standard LeRobot columns, camera videos (mp4, see `app.demo_video`) and the
metadata files each format version defines (see the LeRobot format reference, sections 1-4). Everything derives from
`seed`. Episodes are generated and written one at a time (videos encoded a few episodes ahead, in parallel), so
memory stays bounded by a few episodes, not the dataset.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import struct
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app import demo_video
from app.demo_video import Camera

FORMATS = ("v3.0", "v2.1")
FPS = 30
CHUNKS_SIZE = 1000
EPISODES_PER_FILE = 50  # default v3.0 rollover: about 4 data files for the default 200 episodes
MIN_LENGTH, MAX_LENGTH = 20, 160
TASKS = ("push the T to the goal", "pick the cube", "open the drawer")
ROBOT_TYPE = "so100"
JOINT_NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
STATE, ACTION, IMAGE = "observation.state", "action", "observation.image"
STANDARD_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
FEATURE_ORDER = (STATE, ACTION, IMAGE, *STANDARD_COLUMNS)  # data-file column order
V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
INFO_PATH = "meta/info.json"
TOP_CAMERA, WRIST_CAMERA = "observation.images.top", "observation.images.wrist"
# Camera key -> (height, width). The default demo has one camera; TWO_CAMERAS adds a smaller second one.
DEFAULT_CAMERAS: Mapping[str, tuple[int, int]] = MappingProxyType({TOP_CAMERA: (64, 96)})
TWO_CAMERAS: Mapping[str, tuple[int, int]] = MappingProxyType({TOP_CAMERA: (64, 96), WRIST_CAMERA: (48, 64)})
VIDEO_EPISODES_PER_FILE = 80  # default v3.0 video rollover: 3 files per camera for 200 episodes, apart from data's
_ENCODE_WORKERS = max(1, min(4, os.cpu_count() or 1))

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_STAT_NAMES = ("min", "max", "mean", "std", "count")

Stats = dict[str, np.ndarray]


@dataclass(frozen=True)
class _Plan:
    """Per-episode lengths and tasks, drawn from the seed before any frame is generated."""

    seed: int
    image_size: int
    cameras: tuple[Camera, ...]
    joints: tuple[str, ...]  # names of the state/action dimensions
    fps: int
    lengths: np.ndarray  # int64, one per episode
    starts: np.ndarray  # global `index` of each episode's first frame
    task_index: np.ndarray  # int64, one per episode
    tasks: list[str]  # task strings in task_index order

    @property
    def episodes(self) -> int:
        return len(self.lengths)

    @property
    def total_frames(self) -> int:
        return int(self.lengths.sum())


@dataclass(frozen=True)
class _EpisodeVideo:
    """One camera's recording of one episode: a standalone mp4 starting at t=0, and its pixel stats."""

    mp4: bytes
    stats: Stats


@dataclass(frozen=True)
class _Episode:
    """One generated episode: numeric columns by name, plus the camera pixels (frames, H, W, 3) uint8."""

    index: int
    columns: dict[str, np.ndarray]
    pixels: np.ndarray

    @property
    def length(self) -> int:
        return len(self.columns["index"])

    @property
    def start(self) -> int:
        return int(self.columns["index"][0])


def write_demo_dataset(
    out: Path,
    *,
    format: str = "v3.0",
    episodes: int = 200,
    seed: int = 0,
    image_size: int = 16,
    files: int | None = None,
    cameras: Mapping[str, tuple[int, int]] | None = DEFAULT_CAMERAS,
    video_files: int | None = None,
    joints: int = len(JOINT_NAMES),
    fps: int = FPS,
) -> Path:
    """Write a demo dataset into directory `out` (created; must be empty or absent) and return `out`.

    `format` is "v3.0" (episodes packed into `files` data files, default about one per 50 episodes) or "v2.1"
    (one data file per episode; `files` is ignored). `image_size` is the side of the square RGB image column.
    `cameras` maps video feature keys to (height, width), both even, with room for the frame label's 32 cells of
    8x8 pixels (e.g. 32x64; see `app.demo_video.camera_frames`); `None` or `{}` writes no videos. v3.0 packs each
    camera's episodes into `video_files` mp4 files (default about one per 80 episodes; independent of the data
    files); v2.1 writes one mp4 per episode and camera. `joints` is the width of the state and action vectors (a
    robot with another arm: more joints than the six named ones are called `joint_6`, `joint_7`...); `fps` the frame
    rate of the recording (timestamps and videos).
    `meta/info.json` is written last, so its presence marks a complete dataset.
    Raises ValueError for an unknown format, episodes < 1, image_size < 1, files < 1, video_files < 1, a camera
    that cannot be encoded, or a non-empty `out`.
    """
    out = Path(out)
    _validate_arguments(format, episodes, image_size, files, video_files)
    recorded_cameras = _cameras(cameras)
    _prepare_empty_dir(out)
    plan = _make_plan(episodes, seed, image_size, recorded_cameras, joints, fps)
    if format == "v3.0":
        n_files = min(files if files is not None else math.ceil(episodes / EPISODES_PER_FILE), episodes)
        n_video_files = min(video_files or math.ceil(episodes / VIDEO_EPISODES_PER_FILE), episodes)
        _write_v30(out, plan, n_files, n_video_files)
    else:
        _write_v21(out, plan)
    _write_json(out / INFO_PATH, _info(plan, format))
    return out


def ensure_demo_dataset(out: Path) -> Path:
    """Write the default demo (v3.0) into `out` unless a complete one is already there; safe under
    concurrent callers from several processes (write into a temp sibling dir, then os.rename into place;
    if the rename loses the race, discard the temp). Return `out`.

    Raises ValueError if `out` exists and holds something other than a complete dataset.
    """
    out = Path(out)
    if _is_complete(out):
        return out
    if out.exists() and not _is_empty_dir(out):
        raise ValueError(f"{out} exists and is not a complete dataset; refusing to write the demo over it")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Hidden name: dataset scanners skip dot-directories, so a half-written temp is never served.
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        write_demo_dataset(tmp)
        try:
            os.rename(tmp, out)  # atomic; replaces `out` only if it is absent or an empty directory
        except OSError as exc:
            if not _is_complete(out):  # not another caller's finished demo: something foreign is there
                raise ValueError(f"cannot move the demo dataset into {out}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------------
# Validation and planning


def _cameras(cameras: Mapping[str, tuple[int, int]] | None) -> tuple[Camera, ...]:
    found = tuple(Camera(key, int(height), int(width)) for key, (height, width) in (cameras or {}).items())
    for camera in found:
        demo_video.validate_camera(camera)
        if camera.key in FEATURE_ORDER:
            raise ValueError(f"camera key {camera.key!r} is already a feature of the demo")
    return found


def _validate_arguments(
    format: str, episodes: int, image_size: int, files: int | None, video_files: int | None
) -> None:
    if format not in FORMATS:
        raise ValueError(f"unknown demo format {format!r}; expected one of {', '.join(FORMATS)}")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if files is not None and files < 1:
        raise ValueError(f"files must be >= 1 (or None for the default), got {files}")
    if video_files is not None and video_files < 1:
        raise ValueError(f"video_files must be >= 1 (or None for the default), got {video_files}")


def _prepare_empty_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.exists() and not _is_empty_dir(out):
        raise ValueError(f"{out} is not empty; a demo dataset must be written into an empty or absent directory")
    out.mkdir(parents=True, exist_ok=True)


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and next(path.iterdir(), None) is None


def _is_complete(path: Path) -> bool:
    return (path / INFO_PATH).is_file()


def _make_plan(episodes: int, seed: int, image_size: int, cameras: tuple[Camera, ...], joints: int, fps: int) -> _Plan:
    if joints < 1 or fps < 1:
        raise ValueError(f"joints and fps must be at least 1, got {joints} and {fps}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(MIN_LENGTH, MAX_LENGTH + 1, size=episodes, dtype=np.int64)
    if episodes >= 10:
        lengths[rng.integers(episodes)] = 1  # edge case readers must handle: a one-frame episode
    choices = rng.integers(len(TASKS), size=episodes).tolist()
    # Task indices in order of first appearance, as LeRobot assigns them while recording.
    first_seen = list(dict.fromkeys(choices))
    remap = {choice: i for i, choice in enumerate(first_seen)}
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return _Plan(
        seed=seed,
        image_size=image_size,
        cameras=cameras,
        joints=tuple(JOINT_NAMES[i] if i < len(JOINT_NAMES) else f"joint_{i}" for i in range(joints)),
        fps=fps,
        lengths=lengths,
        starts=starts,
        task_index=np.array([remap[c] for c in choices], dtype=np.int64),
        tasks=[TASKS[c] for c in first_seen],
    )


# ----------------------------------------------------------------------------------------------------
# Frame generation


def _iter_episodes(plan: _Plan) -> Iterator[_Episode]:
    for episode in range(plan.episodes):
        yield _make_episode(plan, episode)


def _iter_recorded_episodes(plan: _Plan) -> Iterator[tuple[_Episode, dict[str, _EpisodeVideo]]]:
    """Episodes in order, each with its camera videos; videos are encoded a few episodes ahead on worker threads
    (the encoders release the GIL), while the caller writes the parquet of earlier episodes."""
    if not plan.cameras:
        for episode in _iter_episodes(plan):
            yield episode, {}
        return
    pending: deque[tuple[_Episode, dict[str, Future[_EpisodeVideo]]]] = deque()
    with ThreadPoolExecutor(_ENCODE_WORKERS, thread_name_prefix="demo-video") as pool:
        for episode in _iter_episodes(plan):
            jobs = {camera.key: pool.submit(_record_video, camera, episode, plan.fps) for camera in plan.cameras}
            pending.append((episode, jobs))
            if len(pending) > 2 * _ENCODE_WORKERS:
                done, jobs = pending.popleft()
                yield done, {key: job.result() for key, job in jobs.items()}
        while pending:
            done, jobs = pending.popleft()
            yield done, {key: job.result() for key, job in jobs.items()}


def _record_video(camera: Camera, episode: _Episode, fps: int) -> _EpisodeVideo:
    frames = demo_video.camera_frames(camera, episode.index, episode.columns["frame_index"])
    return _EpisodeVideo(demo_video.encode_episode(frames, fps), _image_stats(frames))


def _make_episode(plan: _Plan, episode: int) -> _Episode:
    rng = np.random.default_rng([plan.seed, episode])
    length = int(plan.lengths[episode])
    frame_index = np.arange(length, dtype=np.int64)
    seconds = frame_index / plan.fps
    state, action = _trajectories(rng, seconds, len(plan.joints), plan.fps)
    columns = {
        STATE: state,
        ACTION: action,
        "timestamp": seconds.astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.full(length, episode, dtype=np.int64),
        "index": plan.starts[episode] + frame_index,
        "task_index": np.full(length, plan.task_index[episode], dtype=np.int64),
    }
    pixels = _pixels(frame_index, plan.image_size, rng.uniform(0.0, 2 * np.pi))
    return _Episode(episode, columns, pixels)


def _trajectories(
    rng: np.random.Generator, seconds: np.ndarray, joints: int, fps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Smooth joint positions in degrees; the action leads the state by one frame, like a position target."""
    offset = rng.uniform(-30.0, 30.0, joints)
    amplitude = rng.uniform(5.0, 45.0, joints)
    frequency = rng.uniform(0.1, 0.6, joints)
    phase = rng.uniform(0.0, 2 * np.pi, joints)
    angle = 2 * np.pi * frequency * seconds[:, None] + phase
    state = offset + amplitude * np.sin(angle)
    action = offset + amplitude * np.sin(angle + 2 * np.pi * frequency / fps)
    return state.astype(np.float32), action.astype(np.float32)


def _pixels(frame_index: np.ndarray, size: int, episode_phase: float) -> np.ndarray:
    """Drifting colour waves: smooth within a frame, different in every frame and episode."""
    coords = np.linspace(0.0, 1.0, size, dtype=np.float32)
    x, y = coords[None, None, :], coords[None, :, None]
    phase = (2 * np.pi * frame_index / 60.0 + episode_phase).astype(np.float32)[:, None, None]
    rgb = np.empty((len(frame_index), size, size, 3), dtype=np.float32)
    rgb[..., 0] = np.sin(2 * np.pi * x + phase)
    rgb[..., 1] = np.sin(2 * np.pi * y - 0.7 * phase)
    rgb[..., 2] = np.cos(np.pi * (x + y) + 0.5 * phase)
    return (127.5 * rgb + 128.0).astype(np.uint8)  # [-1, 1] -> [0.5, 255.5], truncated to 0..255


def _encode_pngs(pixels: np.ndarray) -> list[bytes]:
    """One 8-bit RGB PNG per frame of `pixels` (frames, H, W, 3)."""
    frames, height, width, _ = pixels.shape
    scanlines = np.zeros((frames, height, 1 + 3 * width), dtype=np.uint8)  # leading 0 = filter type "None"
    scanlines[:, :, 1:] = pixels.reshape(frames, height, 3 * width)
    head = _PNG_SIGNATURE + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    tail = _png_chunk(b"IEND", b"")
    return [head + _png_chunk(b"IDAT", zlib.compress(frame.tobytes())) + tail for frame in scanlines]


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


# ----------------------------------------------------------------------------------------------------
# Arrow tables and schema


def _features(
    image_size: int, cameras: tuple[Camera, ...], joints: tuple[str, ...], fps: int
) -> dict[str, dict[str, Any]]:
    """info.json `features`, in data-file column order; cameras (no data column) follow the image column."""
    vector = {"dtype": "float32", "shape": [len(joints)]}
    image = {"dtype": "image", "shape": [image_size, image_size, 3], "names": ["height", "width", "channels"]}
    scalar_dtypes = {"timestamp": "float32", **{name: "int64" for name in STANDARD_COLUMNS[1:]}}
    return {
        STATE: {**vector, "names": list(joints)},
        ACTION: {**vector, "names": list(joints)},
        IMAGE: image,
        **{camera.key: demo_video.video_feature(camera, fps) for camera in cameras},
        **{name: {"dtype": dtype, "shape": [1], "names": None} for name, dtype in scalar_dtypes.items()},
    }


def _data_schema(joints: int) -> pa.Schema:
    vector = pa.list_(pa.float32(), joints)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    fields = [
        pa.field(STATE, vector),
        pa.field(ACTION, vector),
        pa.field(IMAGE, image),
        pa.field("timestamp", pa.float32()),
        *(pa.field(name, pa.int64()) for name in STANDARD_COLUMNS[1:]),
    ]
    return pa.schema(fields, metadata={"huggingface": json.dumps(_huggingface_features(joints))})


def _huggingface_features(joints: int) -> dict[str, Any]:
    """The HF `datasets` Features JSON that LeRobot data files carry as schema metadata."""

    def value(dtype: str) -> dict[str, str]:
        return {"dtype": dtype, "_type": "Value"}

    vector = {"feature": value("float32"), "length": joints, "_type": "Sequence"}
    return {
        "info": {
            "features": {
                STATE: vector,
                ACTION: vector,
                IMAGE: {"_type": "Image"},
                "timestamp": value("float32"),
                **{name: value("int64") for name in STANDARD_COLUMNS[1:]},
            }
        }
    }


def _episode_table(episode: _Episode, schema: pa.Schema) -> pa.Table:
    image_type = schema.field(IMAGE).type
    pngs = pa.array(_encode_pngs(episode.pixels), type=pa.binary())
    paths = pa.array([f"frame-{i:06d}.png" for i in range(episode.length)], type=pa.string())
    image = pa.StructArray.from_arrays([pngs, paths], fields=list(image_type))
    arrays = []
    for field in schema:
        if field.name == IMAGE:
            arrays.append(image)
        elif pa.types.is_fixed_size_list(field.type):
            values = episode.columns[field.name]
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1]))
        else:
            arrays.append(pa.array(episode.columns[field.name], type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


# ----------------------------------------------------------------------------------------------------
# Statistics


def _episode_stats(episode: _Episode, videos: dict[str, _EpisodeVideo]) -> dict[str, Stats]:
    """Per-feature min/max/mean/std/count; vectors keep their shape, scalars get shape [1], images and videos
    [3, 1, 1]. In info.json feature order."""
    stats = {name: _stats(values.reshape(episode.length, -1)) for name, values in episode.columns.items()}
    stats[IMAGE] = _image_stats(episode.pixels)
    order = [*FEATURE_ORDER[: FEATURE_ORDER.index(IMAGE) + 1], *videos, *STANDARD_COLUMNS]
    return {name: videos[name].stats if name in videos else stats[name] for name in order}


def _stats(values: np.ndarray) -> Stats:
    return {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0, dtype=np.float64),
        "std": values.std(axis=0, dtype=np.float64),
        "count": np.array([len(values)]),
    }


def _image_stats(pixels: np.ndarray) -> Stats:
    """Per-channel stats scaled to [0, 1], shape [3, 1, 1], as LeRobot stores them for cameras."""
    # A 256-bin histogram per channel gives exact stats far faster than float reductions over every pixel.
    levels = np.arange(256, dtype=np.float64)
    channels = pixels.reshape(-1, 3).T
    histograms = np.stack([np.bincount(channel, minlength=256) for channel in channels])
    present = histograms > 0
    mean = histograms @ levels / channels.shape[1]
    variance = histograms @ levels**2 / channels.shape[1] - mean**2
    per_channel = {
        "min": np.argmax(present, axis=1) / 255.0,
        "max": (255 - np.argmax(present[:, ::-1], axis=1)) / 255.0,
        "mean": mean / 255.0,
        "std": np.sqrt(np.maximum(variance, 0.0)) / 255.0,
    }
    return {stat: values.reshape(3, 1, 1) for stat, values in per_channel.items()} | {"count": np.array([len(pixels)])}


class _StatsAggregate:
    """Count-weighted merge of episode stats (what LeRobot's `aggregate_stats` computes)."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[str, Any]] = {}

    def add(self, episode_stats: dict[str, Stats]) -> None:
        for name, stats in episode_stats.items():
            count = int(stats["count"][0])
            mean = stats["mean"].astype(np.float64)
            part = self._parts.setdefault(name, {"count": 0, "sum": 0.0, "sumsq": 0.0})
            part["count"] += count
            part["sum"] = part["sum"] + mean * count
            part["sumsq"] = part["sumsq"] + (stats["std"] ** 2 + mean**2) * count
            part["min"] = np.minimum(part.get("min", stats["min"]), stats["min"])
            part["max"] = np.maximum(part.get("max", stats["max"]), stats["max"])

    def result(self) -> dict[str, Stats]:
        merged = {}
        for name, part in self._parts.items():
            mean = part["sum"] / part["count"]
            variance = np.maximum(part["sumsq"] / part["count"] - mean**2, 0.0)
            merged[name] = {
                "min": part["min"],
                "max": part["max"],
                "mean": mean,
                "std": np.sqrt(variance),
                "count": np.array([part["count"]]),
            }
        return merged


def _stats_json(stats: dict[str, Stats]) -> dict[str, dict[str, Any]]:
    return {name: {stat: values[stat].tolist() for stat in _STAT_NAMES} for name, values in stats.items()}


# ----------------------------------------------------------------------------------------------------
# Format writers


def _write_v30(out: Path, plan: _Plan, n_files: int, n_video_files: int) -> None:
    schema = _data_schema(len(plan.joints))
    aggregate = _StatsAggregate()
    episode_rows: list[dict[str, Any]] = []
    writer: pq.ParquetWriter | None = None
    current_file = -1
    videos = _V30Videos(out, n_video_files, plan.episodes)
    try:
        for episode, recorded in _iter_recorded_episodes(plan):
            # Roll over by episode count; an episode never spans two files.
            file_number = episode.index * n_files // plan.episodes
            if file_number != current_file:
                if writer is not None:
                    writer.close()
                writer = _open_data_writer(out, file_number, schema)
                current_file = file_number
            writer.write_table(_episode_table(episode, schema))  # one row group per episode, as LeRobot does
            video_columns = videos.append(episode.index, recorded)
            stats = _episode_stats(episode, recorded)
            aggregate.add(stats)
            episode_rows.append(_v30_episode_row(plan, episode, file_number, video_columns, stats))
    finally:
        if writer is not None:
            writer.close()
        videos.close()
    _write_parquet(out / V30_EPISODES_PATH.format(chunk_index=0, file_index=0), pa.Table.from_pylist(episode_rows))
    _write_parquet(out / "meta/tasks.parquet", _tasks_table(plan))
    _write_json(out / "meta/stats.json", _stats_json(aggregate.result()))


class _V30Videos:
    """Each camera's current v3.0 video file; episodes are appended back to back and roll over by episode count
    (an episode never spans two files)."""

    def __init__(self, out: Path, n_files: int, episodes: int) -> None:
        self._out, self._n_files, self._episodes = out, n_files, episodes
        self._open: dict[str, tuple[int, demo_video.ConcatenatedVideo]] = {}

    def append(self, episode: int, recorded: dict[str, _EpisodeVideo]) -> dict[str, Any]:
        """Append the episode's videos; return its `videos/<key>/...` episode-metadata columns."""
        file_number = episode * self._n_files // self._episodes
        chunk, file = divmod(file_number, CHUNKS_SIZE)
        columns: dict[str, Any] = {}
        for key, video in recorded.items():
            current = self._open.get(key)
            if current is None or current[0] != file_number:
                if current is not None:
                    current[1].close()
                path = self._out / V30_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
                current = self._open[key] = (file_number, demo_video.ConcatenatedVideo(path))
            start, end = current[1].append(video.mp4)
            columns |= {
                f"videos/{key}/chunk_index": chunk,
                f"videos/{key}/file_index": file,
                f"videos/{key}/from_timestamp": start,
                f"videos/{key}/to_timestamp": end,
            }
        return columns

    def close(self) -> None:
        for _, video in self._open.values():
            video.close()
        self._open.clear()


def _open_data_writer(out: Path, file_number: int, schema: pa.Schema) -> pq.ParquetWriter:
    chunk, file = divmod(file_number, CHUNKS_SIZE)
    path = out / V30_DATA_PATH.format(chunk_index=chunk, file_index=file)
    path.parent.mkdir(parents=True, exist_ok=True)
    return pq.ParquetWriter(path, schema)


def _v30_episode_row(
    plan: _Plan, episode: _Episode, file_number: int, video_columns: dict[str, Any], stats: dict[str, Stats]
) -> dict[str, Any]:
    chunk, file = divmod(file_number, CHUNKS_SIZE)
    row: dict[str, Any] = {
        "episode_index": episode.index,
        "tasks": [plan.tasks[plan.task_index[episode.index]]],
        "length": episode.length,
        "data/chunk_index": chunk,
        "data/file_index": file,
        "dataset_from_index": episode.start,
        "dataset_to_index": episode.start + episode.length,
        **video_columns,
    }
    for name, feature_stats in stats.items():
        for stat in _STAT_NAMES:
            row[f"stats/{name}/{stat}"] = feature_stats[stat].tolist()
    row["meta/episodes/chunk_index"] = 0
    row["meta/episodes/file_index"] = 0
    return row


def _tasks_table(plan: _Plan) -> pa.Table:
    return pa.table(
        {
            "task_index": pa.array(range(len(plan.tasks)), type=pa.int64()),
            "task": pa.array(plan.tasks, type=pa.string()),
        }
    )


def _write_v21(out: Path, plan: _Plan) -> None:
    schema = _data_schema(len(plan.joints))
    meta = out / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    with (
        open(meta / "episodes.jsonl", "w", encoding="utf-8") as episodes_file,
        open(meta / "episodes_stats.jsonl", "w", encoding="utf-8") as stats_file,
    ):
        for episode, recorded in _iter_recorded_episodes(plan):
            chunk = episode.index // CHUNKS_SIZE
            path = out / V21_DATA_PATH.format(episode_chunk=chunk, episode_index=episode.index)
            _write_parquet(path, _episode_table(episode, schema))
            for key, video in recorded.items():
                video_path = out / V21_VIDEO_PATH.format(
                    episode_chunk=chunk, video_key=key, episode_index=episode.index
                )
                video_path.parent.mkdir(parents=True, exist_ok=True)
                video_path.write_bytes(video.mp4)
            task = plan.tasks[plan.task_index[episode.index]]
            _write_json_line(episodes_file, {"episode_index": episode.index, "tasks": [task], "length": episode.length})
            stats = _stats_json(_episode_stats(episode, recorded))
            _write_json_line(stats_file, {"episode_index": episode.index, "stats": stats})
    with open(meta / "tasks.jsonl", "w", encoding="utf-8") as tasks_file:
        for task_index, task in enumerate(plan.tasks):
            _write_json_line(tasks_file, {"task_index": task_index, "task": task})


def _info(plan: _Plan, format: str) -> dict[str, Any]:
    """meta/info.json, keys in the order LeRobot writes them for `format`."""
    info: dict[str, Any] = {
        "codebase_version": format,
        "robot_type": ROBOT_TYPE,
        "total_episodes": plan.episodes,
        "total_frames": plan.total_frames,
        "total_tasks": len(plan.tasks),
    }
    if format == "v3.0":
        info |= {"chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200}
        data_path, video_path = V30_DATA_PATH, V30_VIDEO_PATH
    else:
        info |= {
            "total_videos": plan.episodes * len(plan.cameras),
            "total_chunks": math.ceil(plan.episodes / CHUNKS_SIZE),
            "chunks_size": CHUNKS_SIZE,
        }
        data_path, video_path = V21_DATA_PATH, V21_VIDEO_PATH
    return info | {
        "fps": plan.fps,
        "splits": {"train": f"0:{plan.episodes}"},
        "data_path": data_path,
        "video_path": video_path if plan.cameras else None,
        "features": _features(plan.image_size, plan.cameras, plan.joints, plan.fps),
    }


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_json_line(handle: TextIO, value: Any) -> None:
    handle.write(json.dumps(value, ensure_ascii=False) + "\n")
