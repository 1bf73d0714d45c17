"""Generate P9's datasets: LeRobot v3.0 layouts with one AV1 camera, encoded as LeRobot records (GOP 2).

Each episode is encoded on its own with the demo's encoder settings (`app.demo_video`: SVT-AV1, yuv420p, GOP 2,
CRF 30; H.264 only where the FFmpeg build has no AV1 encoder) and appended by stream copy to the camera's current
mp4, which rolls over at LeRobot's 200 MB. The frames are the dataset's content (`CameraSize.content`):
"synthetic", a drifting colour gradient plus a fine random texture that moves a few pixels a frame plus fresh
per-frame sensor noise (not trivially compressible: about 40 KB a frame at 480x640, against ~2 KB for a smooth
synthetic scene); "photo", a pan and zoom over photographs with sensor noise; "aloha", the ALOHA insertion scene
rendered with MuJoCo (`bench/aloha_scene.py`, its renders cached beside the datasets' root in `camera-renders`).
The state and action are a random walk unrelated to the frames unless other `Signals` are asked for (the
lossy-training measurement's actions are the camera's next views). A finished dataset carries a `bench.json` marker
with its parameters and is reused by later runs.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.config import CameraSize
from bench.datasets import ACTION, DATA_PATH, EPISODES_PATH, FPS, STATE, TASKS

CAMERA = "observation.images.top"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
VIDEO_FILE_BYTES = 200 * 1024 * 1024  # LeRobot's `video_files_size_in_mb` default
JOINTS = 6
_MARKER = "bench.json"
_TEXTURE_LEVELS = 40  # amplitude of the moving texture
_NOISE_LEVELS = 5  # amplitude of the fresh per-frame noise
_ENCODERS = 2  # episodes encoded side by side (each encoder single-threaded, see app.demo_video)


@dataclass(frozen=True)
class CameraDataset:
    """A generated camera dataset on disk."""

    name: str
    root: Path  # the served root; the dataset is root / name
    height: int
    width: int
    lengths: list[int]
    videos: list[str]  # video files relative to the dataset, in (chunk, file) order
    codec: str

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def rows(self) -> int:
        return sum(self.lengths)

    @property
    def episodes(self) -> int:
        return len(self.lengths)

    @property
    def video_bytes(self) -> int:
        return sum((self.path / rel).stat().st_size for rel in self.videos)

    @property
    def frame_bytes(self) -> int:
        return self.height * self.width * 3


@dataclass(frozen=True)
class Signals:
    """What a camera dataset's `observation.state` and `action` hold: `rows(size, episode, first, length)` gives an
    episode's (state, action), float32 arrays of `length` rows, the episode starting at the scene's frame `first`."""

    name: str  # kept in the marker: a dataset of other signals is generated again
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    rows: Callable[[CameraSize, int, int, int], tuple[np.ndarray, np.ndarray]]
    stats: bool = False  # write meta/stats.json (LeRobot's `make_dataset` needs it for ImageNet camera statistics)


def _random_walk(size: CameraSize, episode: int, first: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """A random walk of the joints as the state; the action is the next row's state."""
    rng = np.random.default_rng([size.seed, 3, episode])
    state = np.cumsum(rng.normal(0.0, 0.02, size=(length, JOINTS)), axis=0).astype(np.float32)
    return state, np.roll(state, -1, axis=0)


_JOINT_NAMES = tuple(f"joint_{i}" for i in range(JOINTS))
RANDOM_WALK = Signals("random walk", _JOINT_NAMES, _JOINT_NAMES, _random_walk)


def ensure_camera_dataset(root: Path, size: CameraSize, signals: Signals = RANDOM_WALK) -> CameraDataset:
    """The dataset `size` under `root`, generated unless an identical one is already there."""
    path = root / size.name
    marker = path / _MARKER
    wanted = {"size": asdict(size), "signals": signals.name}
    if not (marker.is_file() and ({"signals": RANDOM_WALK.name} | json.loads(marker.read_text())) == wanted):
        shutil.rmtree(path, ignore_errors=True)
        _write(path, size, signals)
        marker.write_text(json.dumps(wanted))
    return describe_camera_dataset(root, size.name)


def describe_camera_dataset(root: Path, name: str) -> CameraDataset:
    path = root / name
    info = json.loads((path / "meta/info.json").read_text())
    height, width, _ = info["features"][CAMERA]["shape"]
    episodes = pq.read_table(path / EPISODES_PATH).to_pylist()
    prefix = f"videos/{CAMERA}/"
    videos = sorted(
        {
            VIDEO_PATH.format(
                video_key=CAMERA, chunk_index=e[prefix + "chunk_index"], file_index=e[prefix + "file_index"]
            )
            for e in episodes
        }
    )
    codec = info["features"][CAMERA]["info"]["video.codec"]
    return CameraDataset(name, root, height, width, [e["length"] for e in episodes], videos, codec)


def _lengths(size: CameraSize) -> list[int]:
    rng = np.random.default_rng(size.seed)
    return rng.integers(size.min_length, size.max_length + 1, size=size.episodes).tolist()


class _Scene:
    """The camera's view: frame `i` of the whole recording (episodes follow each other without a cut)."""

    def __init__(self, size: CameraSize) -> None:
        self.height, self.width = size.height, size.width
        rng = np.random.default_rng([size.seed, 1])
        self.texture = rng.integers(0, _TEXTURE_LEVELS, size=(size.height + 64, size.width + 64, 3), dtype=np.uint8)
        y, x = np.mgrid[0 : size.height, 0 : size.width].astype(np.float32)
        self.x, self.y = x * (640 / size.width), y * (480 / size.height)  # the same scene at every resolution
        self.seed = size.seed

    def frame(self, i: int) -> np.ndarray:
        phase = np.float32(0.08 * i)
        base = np.empty((self.height, self.width, 3), dtype=np.float32)
        base[..., 0] = np.sin(self.x / 90 + phase)
        base[..., 1] = np.sin(self.y / 70 - 0.7 * phase)
        base[..., 2] = np.cos((self.x + self.y) / 150 + 0.5 * phase)
        dx, dy = (2 * i) % 64, i % 64
        noise = np.random.default_rng([self.seed, 2, i]).integers(0, _NOISE_LEVELS, size=base.shape, dtype=np.uint8)
        pixels = 70 * base + 100 + self.texture[dy : dy + self.height, dx : dx + self.width] + noise
        return pixels.clip(0, 255).astype(np.uint8)


def photo_view(i: int) -> tuple[float, float, float]:
    """What `_PhotoScene` shows at frame `i`: (zoom, the share of the mosaic's height the view spans; top and left,
    where the view lies between the mosaic's top or left edge, 0, and its bottom or right edge, 1)."""
    return 0.55 + 0.25 * np.sin(i / 90), 0.5 + 0.5 * np.sin(i / 70), 0.5 + 0.5 * np.cos(i / 110)


class _PhotoScene:
    """Camera-like content: a slow pan and zoom over a mosaic of scikit-image's bundled photographs, with fresh
    Gaussian sensor noise every frame (sigma 3 levels). Real textures and edges cost an encoder and a decoder what
    camera data costs them, which the synthetic scene does not (it disagrees 3x on disk and decode time)."""

    PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")

    def __init__(self, size: CameraSize) -> None:
        import skimage.data

        tiles = [getattr(skimage.data, name)()[:400, :450] for name in self.PHOTOS]
        tiles = [np.pad(t, ((0, 400 - t.shape[0]), (0, 450 - t.shape[1]), (0, 0)), mode="reflect") for t in tiles]
        self.mosaic = np.concatenate(
            [np.concatenate(tiles[:2], axis=1), np.concatenate(tiles[2:], axis=1)], axis=0
        ).astype(np.float32)
        self.height, self.width, self.seed = size.height, size.width, size.seed

    def frame(self, i: int) -> np.ndarray:
        full_h, full_w = self.mosaic.shape[:2]
        zoom, top_share, left_share = photo_view(i)
        view_h = zoom * full_h
        view_w = min(view_h * self.width / self.height, full_w - 1)
        top = (full_h - view_h) * top_share
        left = (full_w - view_w) * left_share
        ys = top + (np.arange(self.height, dtype=np.float32) + 0.5) * view_h / self.height
        xs = left + (np.arange(self.width, dtype=np.float32) + 0.5) * view_w / self.width
        y0 = np.clip(ys.astype(np.int64), 0, full_h - 2)
        x0 = np.clip(xs.astype(np.int64), 0, full_w - 2)
        fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
        rows = self.mosaic[y0] * (1 - fy) + self.mosaic[y0 + 1] * fy  # bilinear: rows, then columns
        pixels = rows[:, x0] * (1 - fx) + rows[:, x0 + 1] * fx
        noise = np.random.default_rng([self.seed, 3, i]).standard_normal(size=pixels.shape, dtype=np.float32)
        pixels += 3 * noise
        return pixels.clip(0, 255).astype(np.uint8)


class Scene(Protocol):
    """A camera's view, `height` x `width`: `frame(i)` is frame `i` of the whole recording, (h, w, 3) uint8."""

    height: int
    width: int

    def frame(self, i: int) -> np.ndarray: ...


def _scene(size: CameraSize, root: Path) -> Scene:
    """The scene of `size.content`; an ALOHA scene's renders are cached beside `root` (raises
    `bench.aloha_scene.SceneUnavailable` where they cannot be made)."""
    if size.content == "aloha":
        from bench.aloha_scene import AlohaScene

        return AlohaScene(size.height, size.width, root.parent / "camera-renders")
    return _PhotoScene(size) if size.content == "photo" else _Scene(size)


def _encode(scene: Scene, first: int, length: int) -> bytes:
    """Frames `first .. first + length` of the scene as one episode's mp4, frame k at pts k/fps (app.demo_video's
    encoder settings), streamed: one frame in memory at a time."""
    import av

    from app.demo_video import ENCODER, PIX_FMT

    time_base = Fraction(1, FPS)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream(ENCODER.name, rate=FPS, options=ENCODER.options)
        stream.width, stream.height, stream.pix_fmt = scene.width, scene.height, PIX_FMT
        for k in range(length):
            frame = av.VideoFrame.from_ndarray(scene.frame(first + k), format="rgb24")
            frame.pts, frame.time_base = k, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def _encoded_episodes(scene: Scene, lengths: list[int]) -> Iterator[bytes]:
    """Each episode's mp4 in order, encoded `_ENCODERS` at a time."""
    firsts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    with ThreadPoolExecutor(_ENCODERS, thread_name_prefix="bench-video") as pool:
        jobs = [pool.submit(_encode, scene, firsts[e], length) for e, length in enumerate(lengths)]
        for job in jobs:
            yield job.result()


def _write(path: Path, size: CameraSize, signals: Signals) -> None:
    from app.demo_video import ConcatenatedVideo

    scene = _scene(size, path.parent)
    lengths = _lengths(size)
    episodes: list[dict[str, Any]] = []
    video: ConcatenatedVideo | None = None
    file_index, file_bytes, start = -1, VIDEO_FILE_BYTES, 0
    try:
        for episode, mp4 in enumerate(_encoded_episodes(scene, lengths)):
            if file_bytes + len(mp4) > VIDEO_FILE_BYTES and file_bytes > 0:
                if video is not None:
                    video.close()
                file_index, file_bytes = file_index + 1, 0
                rel = VIDEO_PATH.format(video_key=CAMERA, chunk_index=0, file_index=file_index)
                video = ConcatenatedVideo(path / rel)
            assert video is not None
            from_s, to_s = video.append(mp4)
            file_bytes += len(mp4)
            length = lengths[episode]
            episodes.append(_episode_row(episode, length, start, file_index, from_s, to_s))
            start += length
    finally:
        if video is not None:
            video.close()
    vectors = _write_data(path, size, lengths, signals)
    _write_meta(path, size, lengths, episodes, signals)
    if signals.stats:
        _write_stats(path, scene, vectors)


def _write_data(path: Path, size: CameraSize, lengths: list[int], signals: Signals) -> dict[str, np.ndarray]:
    """The data file, one row group per episode; the state and action of every row."""
    out = path / DATA_PATH.format(chunk_index=0, file_index=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    state_dims, action_dims = len(signals.state_names), len(signals.action_names)
    schema = pa.schema(
        [pa.field(STATE, pa.list_(pa.float32(), state_dims)), pa.field(ACTION, pa.list_(pa.float32(), action_dims))]
        + [pa.field("timestamp", pa.float32())]
        + [pa.field(name, pa.int64()) for name in ("frame_index", "episode_index", "index", "task_index")]
    )
    start = 0
    vectors: dict[str, list[np.ndarray]] = {STATE: [], ACTION: []}
    with pq.ParquetWriter(out, schema) as writer:
        for episode, length in enumerate(lengths):
            frame = np.arange(length, dtype=np.int64)
            state, action = signals.rows(size, episode, start, length)
            vectors[STATE].append(state)
            vectors[ACTION].append(action)
            columns = [
                pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), state_dims),
                pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), action_dims),
                pa.array((frame / FPS).astype(np.float32)),
                pa.array(frame),
                pa.array(np.full(length, episode, dtype=np.int64)),
                pa.array(start + frame),
                pa.array(np.full(length, episode % len(TASKS), dtype=np.int64)),
            ]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))  # one row group per episode
            start += length
    return {name: np.concatenate(parts) for name, parts in vectors.items()}


def _write_stats(path: Path, scene: Scene, vectors: dict[str, np.ndarray], every: int = 8) -> None:
    """meta/stats.json as LeRobot writes it: each vector's min, max, mean, std and count over every row; the
    camera's per-channel ones, in [0, 1], over every `every`-th frame of the scene (before encoding)."""
    from app.demo_tables import image_stats

    stats: dict[str, dict[str, Any]] = {}
    for name, values in vectors.items():
        stats[name] = {
            "min": values.min(axis=0).tolist(),
            "max": values.max(axis=0).tolist(),
            "mean": values.mean(axis=0, dtype=np.float64).tolist(),
            "std": values.std(axis=0, dtype=np.float64).tolist(),
            "count": [len(values)],
        }
    frames = np.stack([scene.frame(i) for i in range(0, len(vectors[STATE]), every)])
    stats[CAMERA] = {stat: values.tolist() for stat, values in image_stats(frames).items()}
    (path / "meta/stats.json").write_text(json.dumps(stats, indent=4))


def _episode_row(episode: int, length: int, start: int, file_index: int, from_s: float, to_s: float) -> dict[str, Any]:
    prefix = f"videos/{CAMERA}/"
    return {
        "episode_index": episode,
        "tasks": [TASKS[episode % len(TASKS)]],
        "length": length,
        "data/chunk_index": 0,
        "data/file_index": 0,
        "dataset_from_index": start,
        "dataset_to_index": start + length,
        prefix + "chunk_index": 0,
        prefix + "file_index": file_index,
        prefix + "from_timestamp": from_s,
        prefix + "to_timestamp": to_s,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
    }


def _write_meta(
    path: Path, size: CameraSize, lengths: list[int], episodes: list[dict[str, Any]], signals: Signals
) -> None:
    from app.demo_video import Camera, video_feature

    (path / EPISODES_PATH).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episodes), path / EPISODES_PATH)
    tasks = pa.table({"task_index": pa.array(range(len(TASKS)), pa.int64()), "task": pa.array(TASKS)})
    pq.write_table(tasks, path / "meta/tasks.parquet")
    features: dict[str, Any] = {
        STATE: {"dtype": "float32", "shape": [len(signals.state_names)], "names": list(signals.state_names)},
        ACTION: {"dtype": "float32", "shape": [len(signals.action_names)], "names": list(signals.action_names)},
        CAMERA: video_feature(Camera(CAMERA, size.height, size.width), FPS),
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "robot_type": "bench",
        "total_episodes": len(lengths),
        "total_frames": int(sum(lengths)),
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": VIDEO_FILE_BYTES // (1024 * 1024),
        "fps": FPS,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH,
        "features": features,
    }
    (path / "meta/info.json").write_text(json.dumps(info, indent=4))
