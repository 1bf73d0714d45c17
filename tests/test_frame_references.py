"""Camera frames by reference: a client that reads the server's cache directory gets the frames the server has
decoded straight from its segment files, and exactly the frames it would get over HTTP; anything it cannot read
there (cold cameras, a missing or rebuilt file, another directory) still comes right, over HTTP."""

from __future__ import annotations

import gc
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest

import episerve
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from episerve._local_frames import METADATA_KEY, FramesUnavailable, LocalFrames
from tests.support import ServerProcess, oracle, read_stream
from tests.test_errors import assert_problem
from tests.test_operations import run_cli
from tests.test_video import expected_frames, served_frames
from tests.video_oracle import frames_for_rows

COLUMNS = ["episode_index", "frame_index", WRIST_CAMERA, TOP_CAMERA]


@pytest.fixture(scope="module")
def warmed(video_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose `cams-v3` cameras are all decoded into segments and whose `cams-v21` ones are decoded
    for episodes 2-3 only (the `warmed` policy decodes the rest on demand)."""
    cache = tmp_path_factory.mktemp("references") / "cache"
    location = ["--root", str(video_root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams-v3", "--videos", *location).returncode == 0
    assert run_cli("warm", "cams-v21", "--episodes", "2-3", "--videos", *location).returncode == 0
    with ServerProcess([video_root], cache, env={"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}) as server:
        yield server


@pytest.fixture
def http(warmed: ServerProcess) -> Iterator[httpx.Client]:
    with warmed.client() as client:
        yield client


def _take(http: httpx.Client, name: str, body: dict) -> pa.Table:
    response = http.post(f"/datasets/{name}/rows/take", json=body)
    assert response.status_code == 200, response.text
    return read_stream(response.content)


def test_references_name_the_segment_rows_holding_each_rows_frame(
    video_root: Path, warmed: ServerProcess, http: httpx.Client
) -> None:
    view = oracle(video_root / "cams-v3", [7, 2, 5])
    indices = [*np.random.default_rng(3).integers(0, view.num_rows, 30).tolist(), 0, 0, view.num_rows - 1]
    body = {"episodes": [7, 2, 5], "indices": indices, "columns": COLUMNS}
    table = _take(http, "cams-v3", body | {"frames": "references"})
    assert table.select(COLUMNS[:2]).equals(view.take(pa.array(indices)).select(COLUMNS[:2]))
    for key in (TOP_CAMERA, WRIST_CAMERA):
        field = table.schema.field(key)
        assert pa.types.is_struct(field.type) and [f.name for f in field.type] == ["segment", "row"]
        described = orjson.loads(field.metadata[METADATA_KEY])
        shape = described["shape"]
        segments = []
        for entry in described["segments"]:  # read independently of the client, by path under the cache
            path = warmed.cache_dir / entry["path"]
            assert path.stat().st_size == entry["bytes"] and path.stat().st_ino == entry["inode"]
            frames = pa.ipc.open_file(pa.memory_map(str(path))).read_all().column("frame").combine_chunks()
            segments.append(frames.values.to_numpy().reshape(len(frames), *shape))
        references = table[key].combine_chunks()
        picked = [
            segments[s][r]
            for s, r in zip(references.field("segment").to_pylist(), references.field("row").to_pylist(), strict=True)
        ]
        assert np.array_equal(np.stack(picked), expected_frames(video_root / "cams-v3", key, table))


def test_cameras_not_decoded_into_segments_come_as_pixels(video_root: Path, http: httpx.Client) -> None:
    body = {"episodes": [1, 3], "indices": [70, 1, 0, 45], "columns": COLUMNS, "frames": "references"}
    table = _take(http, "cams-v21", body)  # episode 1 was not warmed: both cameras come as pixels
    for key in (TOP_CAMERA, WRIST_CAMERA):
        assert isinstance(table.schema.field(key).type, pa.FixedShapeTensorType)
        assert np.array_equal(served_frames(table, key), expected_frames(video_root / "cams-v21", key, table))


def test_an_unknown_frames_mode_is_422(http: httpx.Client) -> None:
    response = http.post("/datasets/cams-v3/rows/take", json={"indices": [0], "frames": "bytes"})
    assert_problem(response, 422, "frames", "'pixels', 'encoded' or 'references'")


@pytest.mark.parametrize("columns", [None, ["frame_index", TOP_CAMERA]], ids=["every column", "a camera named"])
def test_a_row_layout_of_camera_columns_is_422(http: httpx.Client, columns: list[str] | None) -> None:
    response = http.post("/datasets/cams-v3/rows/layout", json={"columns": columns})
    assert_problem(response, 422, "stored columns only", TOP_CAMERA if columns else "is a camera")


def test_a_client_reads_rows_by_layout_and_frames_by_reference_side_by_side(
    video_root: Path, warmed: ServerProcess
) -> None:
    local = episerve.Client(warmed.url, cache_dir=warmed.cache_dir)
    remote = episerve.Client(warmed.url)
    indices = [5, 0, 17, 5]
    for columns in (["episode_index", "frame_index"], COLUMNS, ["frame_index"]):
        assert local.take("cams-v3", indices, [3, 1], columns).equals(remote.take("cams-v3", indices, [3, 1], columns))


@pytest.mark.parametrize("name", ["cams-v3", "cams-v21"])
def test_a_client_with_the_cache_dir_reads_the_frames_from_it_equal_to_http(
    warmed: ServerProcess, http: httpx.Client, name: str
) -> None:
    local = episerve.Client(warmed.url, cache_dir=warmed.cache_dir)
    remote = episerve.Client(warmed.url)
    selection = episerve.Selection.of(name, [3, 2], COLUMNS)
    indices = np.random.default_rng(4).permutation(remote.count(selection))[:50]
    pages = local.read_take(selection, indices)
    expected = remote.take(name, indices, [3, 2], COLUMNS)
    assert pages.table.equals(expected)
    frame_bytes = sum(expected[key].nbytes for key in (TOP_CAMERA, WRIST_CAMERA))
    assert sum(b.size for b in pages.buffers) < frame_bytes / 10  # the frames did not come over HTTP
    assert local.local_frames is not None and local.local_frames.in_use


def test_dataloader_workers_read_frames_from_the_cache_dir(video_root: Path, warmed: ServerProcess) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dataset = episerve.EpisodeDataset(
        warmed.url, "cams-v3", episodes=[6, 0], columns=COLUMNS, cache_dir=warmed.cache_dir
    )
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, collate_fn=episerve.collate)
    seen = 0
    for batch in loader:
        rows = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
        for key, height, width in ((TOP_CAMERA, 64, 96), (WRIST_CAMERA, 48, 64)):
            frames = batch[key]
            assert frames.dtype == torch.uint8 and tuple(frames.shape[1:]) == (3, height, width)
            expected = frames_for_rows(video_root / "cams-v3", key, rows)
            assert np.array_equal(frames.numpy(), expected.transpose(0, 3, 1, 2))
        seen += len(rows)
    assert seen == len(dataset)


def _copy_of(cache: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy, ignore=shutil.ignore_patterns("*.lock", "metrics"))
    return copy


@pytest.mark.parametrize("where", ["an empty directory", "a copy of the cache"])
def test_frames_that_cannot_be_read_from_the_cache_dir_come_over_http(
    warmed: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    directory = tmp_path / "empty" if where == "an empty directory" else _copy_of(warmed.cache_dir, tmp_path)
    directory.mkdir(exist_ok=True)
    local = episerve.Client(warmed.url, cache_dir=directory)
    remote = episerve.Client(warmed.url)
    expected = remote.take("cams-v3", [5, 1, 9], columns=COLUMNS)
    with caplog.at_level(logging.WARNING, logger="episerve"):
        for _ in range(3):
            assert local.take("cams-v3", [5, 1, 9], columns=COLUMNS).equals(expected)
    reason = "No such file" if where == "an empty directory" else "is not the file the server has mapped"
    assert reason in caplog.text
    assert "3 takes in a row could not read frames" in caplog.text
    assert local.local_frames is not None and not local.local_frames.in_use  # pixels only, for a while
    assert local.take("cams-v3", [2], columns=COLUMNS).equals(remote.take("cams-v3", [2], columns=COLUMNS))


def test_a_reference_outside_the_cache_dir_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "secret.arrow").write_bytes(b"not for the client")
    described = {"shape": [2, 2, 3], "segments": [{"path": "../secret.arrow", "bytes": 18, "inode": 0, "mtime_ns": 0}]}
    references = pa.StructArray.from_arrays([pa.array([0], pa.int32()), pa.array([0], pa.int64())], ["segment", "row"])
    field = pa.field("camera", references.type, metadata={METADATA_KEY: orjson.dumps(described)})
    table = pa.Table.from_arrays([references], schema=pa.schema([field]))
    with pytest.raises(FramesUnavailable, match="lies outside"):
        LocalFrames(tmp_path / "cache").resolve(table)


def test_a_cache_dir_that_is_not_a_directory_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        episerve.Client("http://127.0.0.1:1", cache_dir=tmp_path / "missing")


def _warmed_copy(video_root: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the v2.1 demo as dataset `cams` (root, cache) with episode 2's cameras decoded into segments."""
    root, cache = tmp_path / "root", tmp_path / "cache"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    location = ["--root", str(root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams", "--episodes", "2", "--videos", *location).returncode == 0
    return root, cache


def _mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


def test_a_segment_the_server_evicts_is_let_go_and_its_frames_still_come_right(
    video_root: Path, tmp_path: Path
) -> None:
    root, cache = _warmed_copy(video_root, tmp_path)
    with ServerProcess([root], cache, env={"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}) as server:
        local = episerve.Client(server.url, cache_dir=cache)
        expected = episerve.Client(server.url).take("cams", [3, 1], [2], COLUMNS)
        assert local.take("cams", [3, 1], [2], COLUMNS).equals(expected)
        segments = sorted(cache.rglob("frames/*.arrow"))
        assert segments and all(str(s) in _mapped_files() for s in segments)
        for segment in segments:  # as the budget evicts: the sidecar first, then the file
            segment.with_suffix(".json").unlink()
            segment.unlink()
        time.sleep(1.1)
        again = local.take("cams", [3, 1], [2], COLUMNS)
        assert again.equals(expected)  # now decoded on demand by the server, as pixels
        del again
        gc.collect()
        assert not any(str(s) in _mapped_files() for s in segments)


def test_segments_rebuilt_by_another_process_are_referenced_as_rebuilt(
    video_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server process that still maps a segment file evicted and rebuilt by another process (another worker, a
    `warm`) references the file now at that path, which a new client can read, not the one it mapped."""
    cache = tmp_path / "cache"
    location = ["--root", str(video_root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams-v3", "--videos", *location).returncode == 0
    with ServerProcess([video_root], cache, env={"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}) as server:
        selection = episerve.Selection.of("cams-v3", None, COLUMNS)
        indices = list(range(0, 300, 7))
        expected = episerve.Client(server.url).take("cams-v3", indices, columns=COLUMNS)
        assert episerve.Client(server.url, cache_dir=cache).read_take(selection, indices).table.equals(expected)
        for arrow in cache.rglob("frames/*.arrow"):  # mapped by the server
            arrow.with_suffix(".json").unlink()
            arrow.unlink()
        assert run_cli("warm", "cams-v3", "--videos", *location).returncode == 0
        local = episerve.Client(server.url, cache_dir=cache)  # a new DataLoader worker, say
        with caplog.at_level(logging.WARNING, logger="episerve"):
            pages = local.read_take(selection, indices)
        assert pages.table.equals(expected)
        assert sum(b.size for b in pages.buffers) < expected[TOP_CAMERA].nbytes / 10  # read from the cache dir
        assert "come over HTTP" not in caplog.text


def test_a_client_lets_go_of_segment_files_rebuilt_since_it_mapped_them(video_root: Path, tmp_path: Path) -> None:
    """A segment file evicted from the video cache keeps its disk space while it is mapped: a client that finds
    it rebuilt unmaps the old one, as the server does."""
    cache = tmp_path / "cache"
    location = ["--root", str(video_root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams-v3", "--videos", *location).returncode == 0

    def unlinked_maps() -> list[str]:
        gc.collect()
        lines = Path("/proc/self/maps").read_text().splitlines()
        return [line for line in lines if str(cache) in line and line.endswith("(deleted)")]

    with ServerProcess([video_root], cache, env={"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}) as server:
        local = episerve.Client(server.url, cache_dir=cache)
        expected = episerve.Client(server.url).take("cams-v3", list(range(0, 300, 7)), columns=COLUMNS)
        assert local.take("cams-v3", list(range(0, 300, 7)), columns=COLUMNS).equals(expected)
        for arrow in cache.rglob("frames/*.arrow"):
            arrow.with_suffix(".json").unlink()
            arrow.unlink()
        assert run_cli("warm", "cams-v3", "--videos", *location).returncode == 0
        assert local.take("cams-v3", list(range(0, 300, 7)), columns=COLUMNS).equals(expected)
        assert unlinked_maps() == []


def test_a_segment_file_that_cannot_be_mapped_is_unavailable_not_an_error(tmp_path: Path) -> None:
    """Whatever stops a referenced file from being mapped here (an empty file; no descriptor left, a shared volume
    without `mmap`) makes the take's frames come over HTTP, not fail it."""
    empty = tmp_path / "frames.arrow"
    empty.touch()
    stat = empty.stat()
    entry = {"path": empty.name, "bytes": 0, "inode": stat.st_ino, "mtime_ns": stat.st_mtime_ns}
    references = pa.StructArray.from_arrays([pa.array([0], pa.int32()), pa.array([0], pa.int64())], ["segment", "row"])
    described = {"shape": [2, 2, 3], "segments": [entry]}
    field = pa.field("camera", references.type, metadata={METADATA_KEY: orjson.dumps(described)})
    with pytest.raises(FramesUnavailable, match="cannot map"):
        LocalFrames(tmp_path).resolve(pa.Table.from_arrays([references], schema=pa.schema([field])))


def test_a_dataset_given_as_a_client_takes_cache_dir_from_it(warmed: ServerProcess) -> None:
    with pytest.raises(ValueError, match="cache_dir is a setting of the Client"):
        episerve.EpisodeDataset(episerve.Client(warmed.url), "cams-v3", cache_dir=warmed.cache_dir)
    dataset = episerve.EpisodeDataset(episerve.Client(warmed.url, cache_dir=warmed.cache_dir), "cams-v3")
    assert dataset.client.local_frames is not None


def test_a_mapped_segment_truncated_since_is_never_read(video_root: Path, tmp_path: Path) -> None:
    """Reading a mapped page past the end of a truncated file kills the process (SIGBUS): a client re-checks the
    size of every file it reads from on each take, as the server does."""
    root, cache = _warmed_copy(video_root, tmp_path)
    with ServerProcess([root], cache, env={"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}) as server, server.client() as http:
        body = {"episodes": [2], "indices": [40, 3], "columns": [TOP_CAMERA], "frames": "references"}
        table = _take(http, "cams", body)
    local = LocalFrames(cache)
    frames = local.resolve(table).column(TOP_CAMERA).combine_chunks().to_numpy_ndarray()
    assert frames.shape == (2, 64, 96, 3)
    segment = cache / orjson.loads(table.schema.field(TOP_CAMERA).metadata[METADATA_KEY])["segments"][0]["path"]
    with segment.open("r+b") as file:  # truncated in place, by something else than episerve
        file.truncate(segment.stat().st_size // 2)
    with pytest.raises(FramesUnavailable, match="is not the file the server has mapped"):
        local.resolve(table)


def test_consecutive_rows_come_as_runs_of_the_map(warmed: ServerProcess) -> None:
    local = episerve.Client(warmed.url, cache_dir=warmed.cache_dir)
    indices = [*range(10, 50), *range(5, 0, -1), 7, 7, 8]
    table = local.take("cams-v3", indices, columns=COLUMNS)
    assert table.equals(episerve.Client(warmed.url).take("cams-v3", indices, columns=COLUMNS))
    # 40 consecutive rows in one run (two if a record batch ends among them), then 5 + 2 + 1 single rows
    assert table[TOP_CAMERA].num_chunks <= 1 + 1 + 5 + 2 + 1
