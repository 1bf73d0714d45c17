"""Generate the benchmark datasets: LeRobot v3.0 layouts of a realistic size, deterministic from a seed.

`vector` holds 14-joint state/action trajectories plus the five standard columns; `image` adds a 64x64 PNG camera
column whose noisy content keeps each frame near 11 KB, as real camera frames do. Data files roll over at 100 MB
like LeRobot's writer, one row group per episode. A finished dataset carries a `bench.json` marker with its
parameters, so later runs reuse it instead of writing it again.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.config import DatasetSize

FPS = 30
JOINTS = 14
STATE, ACTION, IMAGE = "observation.state", "action", "observation.image"
FILE_BYTES = 100 * 1024 * 1024
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
TASKS = ("fold the towel", "stack the cups", "open the drawer")
_MARKER = "bench.json"
_NOISE_LEVELS = 48  # pixel noise amplitude: keeps zlib from shrinking a 64x64 frame much below 11 KB
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class GeneratedDataset:
    """A dataset on disk: its id (directory name under the root) and what it holds."""

    name: str
    root: Path  # the served root; the dataset is root / name
    rows: int
    episodes: int
    lengths: list[int]
    files: list[Path]  # source parquet files, sorted

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def parquet_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    @property
    def has_image(self) -> bool:
        return IMAGE in pq.read_schema(self.files[0]).names

    def episode_starts(self) -> np.ndarray:
        """Global row where each episode starts, plus the total at the end."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)


def ensure_dataset(root: Path, size: DatasetSize) -> GeneratedDataset:
    """The dataset `size` under `root`, generated unless an identical one is already there."""
    path = root / size.name
    marker = path / _MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("size") == asdict(size):
        return describe(root, size.name)
    shutil.rmtree(path, ignore_errors=True)
    _write(path, size)
    marker.write_text(json.dumps({"size": asdict(size)}))
    return describe(root, size.name)


def describe(root: Path, name: str) -> GeneratedDataset:
    path = root / name
    episodes = pq.read_table(path / EPISODES_PATH, columns=["length"])["length"].to_pylist()
    files = sorted((path / "data").rglob("*.parquet"))
    return GeneratedDataset(name, root, sum(episodes), len(episodes), episodes, files)


def _lengths(size: DatasetSize) -> np.ndarray:
    rng = np.random.default_rng(size.seed)
    return rng.integers(size.min_length, size.max_length + 1, size=size.episodes, dtype=np.int64)


def _write(path: Path, size: DatasetSize) -> None:
    lengths = _lengths(size)
    schema = _schema(size.image_side)
    episode_rows: list[dict[str, Any]] = []
    writer: pq.ParquetWriter | None = None
    file_index, written, start = -1, FILE_BYTES, 0
    try:
        for episode, length in enumerate(lengths.tolist()):
            table = _episode_table(size, episode, start, length, schema)
            if written + table.nbytes > FILE_BYTES and written > 0:
                if writer is not None:
                    writer.close()
                file_index, written = file_index + 1, 0
                out = path / DATA_PATH.format(chunk_index=0, file_index=file_index)
                out.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(out, schema)
            assert writer is not None
            writer.write_table(table)  # one row group per episode, as LeRobot's recorder writes
            written += table.nbytes
            episode_rows.append(_episode_row(episode, length, start, file_index))
            start += length
    finally:
        if writer is not None:
            writer.close()
    _write_meta(path, size, lengths, episode_rows)


def _episode_table(size: DatasetSize, episode: int, start: int, length: int, schema: pa.Schema) -> pa.Table:
    rng = np.random.default_rng([size.seed, episode])
    frame = np.arange(length, dtype=np.int64)
    state = np.cumsum(rng.normal(0.0, 0.02, size=(length, JOINTS)), axis=0) + rng.uniform(-1, 1, JOINTS)
    action = np.roll(state, -1, axis=0) + rng.normal(0.0, 0.001, size=state.shape)
    columns: dict[str, pa.Array] = {
        STATE: _vectors(state.astype(np.float32)),
        ACTION: _vectors(action.astype(np.float32)),
    }
    if size.image_side is not None:
        pngs = _noisy_pngs(rng, length, size.image_side)
        paths = pa.array([f"frame-{i:06d}.png" for i in range(length)], type=pa.string())
        columns[IMAGE] = pa.StructArray.from_arrays([pa.array(pngs, type=pa.binary()), paths], ["bytes", "path"])
    columns |= {
        "timestamp": pa.array((frame / FPS).astype(np.float32)),
        "frame_index": pa.array(frame),
        "episode_index": pa.array(np.full(length, episode, dtype=np.int64)),
        "index": pa.array(start + frame),
        "task_index": pa.array(np.full(length, episode % len(TASKS), dtype=np.int64)),
    }
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def _vectors(values: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def _noisy_pngs(rng: np.random.Generator, frames: int, side: int) -> list[bytes]:
    """RGB PNGs: a drifting gradient plus per-pixel noise, so they compress about as badly as camera frames."""
    coords = np.linspace(0.0, 1.0, side, dtype=np.float32)
    drift = np.linspace(0.0, 60.0, frames, dtype=np.float32)[:, None, None, None]
    base = 140.0 * coords[None, :, None, None] * coords[None, None, :, None] + drift
    pixels = (base + rng.integers(0, _NOISE_LEVELS, size=(frames, side, side, 3))).clip(0, 255).astype(np.uint8)
    scanlines = np.zeros((frames, side, 1 + 3 * side), dtype=np.uint8)  # leading 0 = PNG filter "None"
    scanlines[:, :, 1:] = pixels.reshape(frames, side, 3 * side)
    head = _PNG_SIGNATURE + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
    tail = _png_chunk(b"IEND", b"")
    return [head + _png_chunk(b"IDAT", zlib.compress(s.tobytes(), 6)) + tail for s in scanlines]


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _schema(image_side: int | None) -> pa.Schema:
    vector = pa.list_(pa.float32(), JOINTS)
    fields = [pa.field(STATE, vector), pa.field(ACTION, vector)]
    hf: dict[str, Any] = {
        STATE: {"feature": {"dtype": "float32", "_type": "Value"}, "length": JOINTS, "_type": "Sequence"},
        ACTION: {"feature": {"dtype": "float32", "_type": "Value"}, "length": JOINTS, "_type": "Sequence"},
    }
    if image_side is not None:
        fields.append(pa.field(IMAGE, pa.struct([("bytes", pa.binary()), ("path", pa.string())])))
        hf[IMAGE] = {"_type": "Image"}
    fields.append(pa.field("timestamp", pa.float32()))
    hf["timestamp"] = {"dtype": "float32", "_type": "Value"}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        fields.append(pa.field(name, pa.int64()))
        hf[name] = {"dtype": "int64", "_type": "Value"}
    return pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": hf}})})


def _episode_row(episode: int, length: int, start: int, file_index: int) -> dict[str, Any]:
    return {
        "episode_index": episode,
        "tasks": [TASKS[episode % len(TASKS)]],
        "length": length,
        "data/chunk_index": 0,
        "data/file_index": file_index,
        "dataset_from_index": start,
        "dataset_to_index": start + length,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
    }


def _write_meta(path: Path, size: DatasetSize, lengths: np.ndarray, episode_rows: list[dict[str, Any]]) -> None:
    (path / EPISODES_PATH).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episode_rows), path / EPISODES_PATH)
    tasks = pa.table({"task_index": pa.array(range(len(TASKS)), pa.int64()), "task": pa.array(TASKS)})
    pq.write_table(tasks, path / "meta/tasks.parquet")
    vector = {"dtype": "float32", "shape": [JOINTS], "names": [f"joint_{i}" for i in range(JOINTS)]}
    features: dict[str, Any] = {STATE: vector, ACTION: vector}
    if size.image_side is not None:
        side = size.image_side
        features[IMAGE] = {"dtype": "image", "shape": [side, side, 3], "names": ["height", "width", "channels"]}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "robot_type": "bench",
        "total_episodes": len(lengths),
        "total_frames": int(lengths.sum()),
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": FPS,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": DATA_PATH,
        "video_path": None,
        "features": features,
    }
    (path / "meta/info.json").write_text(json.dumps(info, indent=4))
