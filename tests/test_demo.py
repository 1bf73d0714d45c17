"""Tests for app.demo: on-disk layout, agreement between data and metadata, PNG validity, determinism,
and the concurrency safety of ensure_demo_dataset. Real files in tmp_path, no mocks."""

from __future__ import annotations

import json
import multiprocessing
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.demo import ensure_demo_dataset, write_demo_dataset

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLUMNS = [
    "observation.state",
    "action",
    "observation.image",
    "timestamp",
    "frame_index",
    "episode_index",
    "index",
    "task_index",
]
CAMERA = "observation.images.top"
FEATURES = [*COLUMNS[:3], CAMERA, *COLUMNS[3:]]  # a video feature has no data column
V21_EPISODES = 40


@pytest.fixture(scope="module")
def v30(default_demo: Path) -> Path:
    """`write_demo_dataset`'s defaults (v3.0), as written once for the session."""
    return default_demo


@pytest.fixture(scope="module")
def v21(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("v21") / "demo", format="v2.1", episodes=V21_EPISODES)


@pytest.fixture(params=["v30", "v21"])
def dataset(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def read_info(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta/info.json").read_text())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def data_files(root: Path) -> list[Path]:
    return sorted(root.glob("data/*/*.parquet"))


def read_frames(root: Path, columns: list[str] | None = None) -> pa.Table:
    return pa.concat_tables(pq.read_table(path, columns=columns) for path in data_files(root))


def episode_lengths(root: Path) -> list[int]:
    if read_info(root)["codebase_version"] == "v3.0":
        return pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")["length"].to_pylist()
    return [row["length"] for row in read_jsonl(root / "meta/episodes.jsonl")]


def parse_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, decompressed IDAT) of an 8-bit RGB PNG, checking signature, chunk CRCs and IEND."""
    assert data[:8] == PNG_SIGNATURE
    chunks: list[tuple[bytes, bytes]] = []
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, color, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color) == (8, 2)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    return width, height, raw


# --- layout ---------------------------------------------------------------------------------------------------


def test_v30_layout(v30: Path) -> None:
    for name in ["meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet"]:
        assert (v30 / name).is_file(), name
    assert [p.relative_to(v30).as_posix() for p in data_files(v30)] == [
        f"data/chunk-000/file-{f:03d}.parquet" for f in range(4)
    ]
    info = read_info(v30)
    assert info["codebase_version"] == "v3.0"
    assert info["total_episodes"] == 200 and info["splits"] == {"train": "0:200"}
    assert info["fps"] == 30 and info["chunks_size"] == 1000
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert {"data_files_size_in_mb", "video_files_size_in_mb", "robot_type", "total_tasks"} <= info.keys()


def test_v21_layout(v21: Path) -> None:
    for name in ["meta/info.json", "meta/episodes.jsonl", "meta/tasks.jsonl", "meta/episodes_stats.jsonl"]:
        assert (v21 / name).is_file(), name
    assert [p.relative_to(v21).as_posix() for p in data_files(v21)] == [
        f"data/chunk-000/episode_{i:06d}.parquet" for i in range(V21_EPISODES)
    ]
    info = read_info(v21)
    assert info["codebase_version"] == "v2.1"
    assert info["total_chunks"] == 1 and info["total_videos"] == V21_EPISODES
    assert info["video_path"] == "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    assert info["data_path"].format(episode_chunk=0, episode_index=7) == "data/chunk-000/episode_000007.parquet"


def test_features_describe_the_columns(dataset: Path) -> None:
    info = read_info(dataset)
    features = info["features"]
    assert list(features) == FEATURES
    size = 16
    assert features["observation.image"] == {
        "dtype": "image",
        "shape": [size, size, 3],
        "names": ["height", "width", "channels"],
    }
    for name in ["observation.state", "action"]:
        assert features[name]["dtype"] == "float32" and features[name]["shape"] == [6]
        assert len(features[name]["names"]) == 6
    for name in COLUMNS[3:]:
        assert features[name]["shape"] == [1]
    for path in data_files(dataset):
        schema = pq.read_schema(path)
        assert schema.names == COLUMNS
        assert schema.field("observation.state").type == pa.list_(pa.float32(), 6)
        assert schema.field("action").type == pa.list_(pa.float32(), 6)
        assert schema.field("observation.image").type == pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        assert schema.field("timestamp").type == pa.float32()
        assert all(schema.field(name).type == pa.int64() for name in COLUMNS[4:])


# --- frames agree with the metadata ---------------------------------------------------------------------------


def test_frames_are_consistent(dataset: Path) -> None:
    info = read_info(dataset)
    frames = read_frames(dataset, columns=COLUMNS[3:])
    assert frames.num_rows == info["total_frames"] == sum(episode_lengths(dataset))
    np.testing.assert_array_equal(frames["index"].to_numpy(), np.arange(frames.num_rows))

    episode = frames["episode_index"].to_numpy()
    lengths = np.bincount(episode)
    assert lengths.tolist() == episode_lengths(dataset)
    assert np.all(np.diff(episode) >= 0), "rows must be in episode order"
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    frame_index = frames["frame_index"].to_numpy()
    np.testing.assert_array_equal(frame_index, np.arange(len(episode)) - starts[episode])
    expected_timestamps = (frame_index / info["fps"]).astype(np.float32)
    np.testing.assert_array_equal(frames["timestamp"].to_numpy(), expected_timestamps)

    task_index = frames["task_index"].to_numpy()
    assert task_index.min() >= 0 and task_index.max() < info["total_tasks"]
    assert all(len(set(task_index[episode == e])) == 1 for e in range(0, len(lengths), 7))


def test_v30_episode_metadata_points_at_rows(v30: Path) -> None:
    info = read_info(v30)
    meta = pq.read_table(v30 / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [row["episode_index"] for row in meta] == list(range(info["total_episodes"]))
    assert all(row["meta/episodes/chunk_index"] == 0 == row["meta/episodes/file_index"] for row in meta)
    tables = {}
    for row in meta:
        name = info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
        if name not in tables:
            tables[name] = pq.read_table(v30 / name, columns=["frame_index", "episode_index", "index"])
        table = tables[name]
        offset = row["dataset_from_index"] - table["index"][0].as_py()
        assert row["dataset_to_index"] - row["dataset_from_index"] == row["length"]
        rows = table.slice(offset, row["length"])
        assert rows.num_rows == row["length"]
        assert set(rows["episode_index"].to_pylist()) == {row["episode_index"]}
        assert rows["frame_index"].to_pylist() == list(range(row["length"]))
        assert rows["index"][0].as_py() == row["dataset_from_index"]
        assert table["episode_index"].to_pylist().count(row["episode_index"]) == row["length"], "spans files"
    assert len(tables) == 4


def test_v30_one_row_group_per_episode(v30: Path) -> None:
    for path in data_files(v30):
        parquet = pq.ParquetFile(path)
        groups = [parquet.read_row_group(i, columns=["episode_index"]) for i in range(parquet.num_row_groups)]
        episodes = [set(group["episode_index"].to_pylist()) for group in groups]
        assert all(len(e) == 1 for e in episodes)
        assert len({next(iter(e)) for e in episodes}) == parquet.num_row_groups


def test_v30_tasks(v30: Path) -> None:
    info = read_info(v30)
    tasks = pq.read_table(v30 / "meta/tasks.parquet")
    assert tasks.schema.field("task_index").type == pa.int64()
    assert tasks.schema.field("task").type == pa.string()
    by_index = dict(zip(tasks["task_index"].to_pylist(), tasks["task"].to_pylist(), strict=True))
    assert sorted(by_index) == list(range(info["total_tasks"])) and info["total_tasks"] == 3
    assert set(by_index.values()) == {"push the T to the goal", "pick the cube", "open the drawer"}
    meta = pq.read_table(v30 / "meta/episodes/chunk-000/file-000.parquet", columns=["tasks", "dataset_from_index"])
    frames = read_frames(v30, columns=["task_index"])["task_index"].to_pylist()
    for tasks_of_episode, start in zip(meta["tasks"].to_pylist(), meta["dataset_from_index"].to_pylist(), strict=True):
        assert tasks_of_episode == [by_index[frames[start]]]


def test_v21_metadata(v21: Path) -> None:
    episodes = read_jsonl(v21 / "meta/episodes.jsonl")
    tasks = {row["task_index"]: row["task"] for row in read_jsonl(v21 / "meta/tasks.jsonl")}
    stats = read_jsonl(v21 / "meta/episodes_stats.jsonl")
    assert [row["episode_index"] for row in episodes] == list(range(V21_EPISODES))
    assert [row["episode_index"] for row in stats] == list(range(V21_EPISODES))
    assert len(tasks) == read_info(v21)["total_tasks"]
    for row, path in zip(episodes, data_files(v21), strict=True):
        table = pq.read_table(path, columns=["episode_index", "task_index"])
        assert table.num_rows == row["length"]
        assert set(table["episode_index"].to_pylist()) == {row["episode_index"]}
        assert row["tasks"] == [tasks[table["task_index"][0].as_py()]]
    first = stats[0]["stats"]
    assert first["frame_index"]["count"] == [episodes[0]["length"]]
    assert first["frame_index"]["max"] == [episodes[0]["length"] - 1]
    assert np.array(first["observation.image"]["mean"]).shape == (3, 1, 1)


# --- content --------------------------------------------------------------------------------------------------


def test_episode_lengths_are_varied_and_include_a_single_frame(v30: Path) -> None:
    lengths = episode_lengths(v30)
    assert 1 in lengths
    assert max(lengths) <= 160 and len(set(lengths)) > 50


def test_images_are_decodable_pngs(dataset: Path) -> None:
    size = read_info(dataset)["features"]["observation.image"]["shape"][0]
    path = data_files(dataset)[-1]
    table = pq.read_table(path, columns=["observation.image", "frame_index", "episode_index"])
    images = table["observation.image"].combine_chunks()
    pngs = images.field("bytes").to_pylist()
    names = images.field("path").to_pylist()
    decoded = {}
    rows = zip(pngs, names, table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True)
    for png, name, episode, frame in rows:
        width, height, raw = parse_png(png)
        assert (width, height) == (size, size)
        assert len(raw) == height * (1 + 3 * width)
        assert raw[:: 1 + 3 * width] == bytes(height), "every scanline uses filter type 0"
        assert name == f"frame-{frame:06d}.png"
        assert decoded.get((episode, frame - 1)) != raw, "the image changes every frame"
        decoded[episode, frame] = raw


def test_image_size_parameter(tmp_path: Path) -> None:
    root = write_demo_dataset(tmp_path / "small", episodes=2, image_size=5)
    assert read_info(root)["features"]["observation.image"]["shape"] == [5, 5, 3]
    png = pq.read_table(data_files(root)[0])["observation.image"][0]["bytes"].as_py()
    width, height, raw = parse_png(png)
    assert (width, height, len(raw)) == (5, 5, 5 * 16)


def test_trajectories_are_smooth_and_nontrivial(v30: Path) -> None:
    frames = pq.read_table(data_files(v30)[0], columns=["observation.state", "action", "episode_index"])
    state = np.stack(frames["observation.state"].to_numpy(zero_copy_only=False))
    action = np.stack(frames["action"].to_numpy(zero_copy_only=False))
    assert state.dtype == np.float32 and state.shape[1] == 6
    assert np.abs(state).max() > 1 and np.abs(action).max() > 1
    assert not np.array_equal(state, action)
    first = frames["episode_index"].to_numpy() == 0
    steps = np.abs(np.diff(state[first], axis=0))
    assert steps.max() < 0.1 * np.ptp(state[first], axis=0).max()


def test_v30_stats_match_the_data(v30: Path) -> None:
    stats = json.loads((v30 / "meta/stats.json").read_text())
    total = read_info(v30)["total_frames"]
    frames = read_frames(v30, columns=["observation.state", "index"])
    state = np.stack(frames["observation.state"].to_numpy(zero_copy_only=False)).astype(np.float64)
    assert stats["observation.state"]["count"] == [total]
    np.testing.assert_array_equal(stats["observation.state"]["min"], state.min(axis=0))
    np.testing.assert_array_equal(stats["observation.state"]["max"], state.max(axis=0))
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(stats["observation.state"]["std"], state.std(axis=0), rtol=1e-6)
    assert stats["index"] == {
        "min": [0],
        "max": [total - 1],
        "mean": pytest.approx([(total - 1) / 2]),
        "std": pytest.approx([np.arange(total).std()]),
        "count": [total],
    }
    assert {"action", "timestamp", "frame_index", "episode_index", "task_index"} <= stats.keys()


# --- parameters and determinism -------------------------------------------------------------------------------


def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    first = write_demo_dataset(tmp_path / "a", episodes=12, seed=3, files=3)
    second = write_demo_dataset(tmp_path / "b", episodes=12, seed=3, files=3)
    files = [p.relative_to(first) for p in sorted(first.rglob("*")) if p.is_file()]
    assert files == [p.relative_to(second) for p in sorted(second.rglob("*")) if p.is_file()]
    for name in files:
        if name.suffix == ".parquet":
            assert pq.read_table(first / name).equals(pq.read_table(second / name)), name
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_different_seed_gives_different_lengths(tmp_path: Path) -> None:
    first = write_demo_dataset(tmp_path / "a", episodes=12, seed=3)
    second = write_demo_dataset(tmp_path / "b", episodes=12, seed=4)
    assert episode_lengths(first) != episode_lengths(second)


@pytest.mark.parametrize(("episodes", "files", "expected"), [(12, 1, 1), (12, 5, 5), (3, 7, 3), (10, None, 1)])
def test_files_parameter(tmp_path: Path, episodes: int, files: int | None, expected: int) -> None:
    root = write_demo_dataset(tmp_path / "demo", episodes=episodes, files=files, image_size=2)
    assert len(data_files(root)) == expected
    assert read_frames(root, columns=["index"]).num_rows == read_info(root)["total_frames"]


# --- ensure_demo_dataset --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ensured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int | None]]:
    """Two processes race to ensure the demo into an existing empty directory; returns it and their exit codes."""
    out = tmp_path_factory.mktemp("ensure") / "demo"
    out.mkdir()
    context = multiprocessing.get_context("spawn")
    options = {"episodes": 24, "files": 4, "cameras": {"observation.images.top": (32, 64)}}  # small, with a video
    workers = [context.Process(target=ensure_demo_dataset, args=(out,), kwargs=options) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=180)
    return out, [worker.exitcode for worker in workers]


def test_ensure_survives_concurrent_callers(ensured: tuple[Path, list[int | None]]) -> None:
    out, exit_codes = ensured
    assert exit_codes == [0, 0]
    assert [p.name for p in out.parent.iterdir()] == ["demo"], "the loser's temp dir was discarded"
    info = read_info(out)
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 24
    assert len(data_files(out)) == 4
    assert read_frames(out, columns=["index"]).num_rows == info["total_frames"]


def test_ensure_is_idempotent(ensured: tuple[Path, list[int | None]]) -> None:
    out, _ = ensured
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert ensure_demo_dataset(out) == out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    assert [p.name for p in out.parent.iterdir()] == ["demo"], "no temporary directories left behind"


# --- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": "v3"}, "unknown demo format"),
        ({"format": "v2.0"}, "unknown demo format"),
        ({"episodes": 0}, "episodes must be >= 1"),
        ({"image_size": 0}, "image_size must be >= 1"),
        ({"files": 0}, "files must be >= 1"),
    ],
)
def test_bad_arguments_raise(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_demo_dataset(tmp_path / "demo", **kwargs)
    assert not (tmp_path / "demo").exists(), "nothing is created for invalid arguments"


def test_non_empty_or_non_directory_out_raises(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        write_demo_dataset(tmp_path / "full", episodes=1)
    with pytest.raises(ValueError, match="not a complete dataset"):
        ensure_demo_dataset(tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        write_demo_dataset(tmp_path / "file", episodes=1)
