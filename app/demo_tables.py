"""The demo's recording, as data: per-episode lengths and tasks drawn from the seed, smooth 6-joint state/action
trajectories, a small PNG camera image per frame, the five standard LeRobot columns, and the Arrow tables and
statistics LeRobot writes for them. Everything derives from the seed; an episode is generated on its own."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from app.demo_video import Camera

FPS = 30
CHUNKS_SIZE = 1000
MIN_LENGTH, MAX_LENGTH = 20, 160
TASKS = ("push the T to the goal", "pick the cube", "open the drawer")
JOINT_NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
STATE, ACTION, IMAGE = "observation.state", "action", "observation.image"
STANDARD_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
FEATURE_ORDER = (STATE, ACTION, IMAGE, *STANDARD_COLUMNS)  # data-file column order
STAT_NAMES = ("min", "max", "mean", "std", "count")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

Stats = dict[str, np.ndarray]


@dataclass(frozen=True)
class Plan:
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
class Episode:
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


def make_plan(
    episodes: int,
    seed: int,
    image_size: int,
    cameras: tuple[Camera, ...],
    joints: int = len(JOINT_NAMES),
    fps: int = FPS,
) -> Plan:
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
    return Plan(
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


def iter_episodes(plan: Plan) -> Iterator[Episode]:
    for episode in range(plan.episodes):
        yield make_episode(plan, episode)


def make_episode(plan: Plan, episode: int) -> Episode:
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
    return Episode(episode, columns, pixels)


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


def data_schema(joints: int = len(JOINT_NAMES)) -> pa.Schema:
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


def episode_table(episode: Episode, schema: pa.Schema) -> pa.Table:
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


# -- statistics -------------------------------------------------------------------------------------------------


def episode_stats(episode: Episode, video_stats: dict[str, Stats]) -> dict[str, Stats]:
    """Per-feature min/max/mean/std/count; vectors keep their shape, scalars get shape [1], images and videos
    [3, 1, 1] (`video_stats`: each camera's). In info.json feature order."""
    stats = {name: _stats(values.reshape(episode.length, -1)) for name, values in episode.columns.items()}
    stats[IMAGE] = image_stats(episode.pixels)
    order = [*FEATURE_ORDER[: FEATURE_ORDER.index(IMAGE) + 1], *video_stats, *STANDARD_COLUMNS]
    return {name: video_stats[name] if name in video_stats else stats[name] for name in order}


def _stats(values: np.ndarray) -> Stats:
    return {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0, dtype=np.float64),
        "std": values.std(axis=0, dtype=np.float64),
        "count": np.array([len(values)]),
    }


def image_stats(pixels: np.ndarray) -> Stats:
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


class StatsAggregate:
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


def stats_json(stats: dict[str, Stats]) -> dict[str, dict[str, Any]]:
    return {name: {stat: values[stat].tolist() for stat in STAT_NAMES} for name, values in stats.items()}


def tasks_table(plan: Plan) -> pa.Table:
    return pa.table(
        {
            "task_index": pa.array(range(len(plan.tasks)), type=pa.int64()),
            "task": pa.array(plan.tasks, type=pa.string()),
        }
    )
