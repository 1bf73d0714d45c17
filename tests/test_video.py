"""Camera frames served from the demo's mp4 files equal an independent PyAV decode under LeRobot's frame rule:
v2.1 and v3.0, two cameras of different sizes, unsorted and duplicated picks, takes in random order, slices,
windows past both episode ends, and through a DataLoader with workers."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episerve
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from episerve._tensor_batch import INLINE_BLOCK_BYTES
from tests.support import ServerProcess, eventually, oracle, read_stream
from tests.test_errors import assert_problem
from tests.video_oracle import episode_video, frames_for_rows

FORMATS = {"cams-v3": "v3.0", "cams-v21": "v2.1"}


@pytest.fixture(scope="module", params=["first-touch", "on-demand"])
def video_server(video_root: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """The same answers whether frames are decoded per request or served from decoded-frame segments."""
    env = {"EPISERVE_VIDEO_CACHE_POLICY": request.param}
    with ServerProcess([video_root], tmp_path_factory.mktemp("video-cache"), env=env) as server:
        server.policy = request.param
        yield server


@pytest.fixture
def http(video_server: ServerProcess):
    with httpx.Client(base_url=video_server.url, timeout=60) as client:
        yield client


def served_frames(table: pa.Table, key: str) -> np.ndarray:
    return table[key].combine_chunks().to_numpy_ndarray()


def expected_frames(root: Path, key: str, table: pa.Table) -> np.ndarray:
    rows = zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True)
    return frames_for_rows(root, key, rows)


@pytest.mark.parametrize("name", FORMATS)
def test_cameras_are_listed_with_their_geometry(http: httpx.Client, name: str) -> None:
    columns = {c["name"]: c for c in http.get(f"/datasets/{name}").json()["columns"]}
    assert columns[TOP_CAMERA]["video"]["shape"] == [64, 96, 3]
    assert columns[WRIST_CAMERA]["video"]["shape"] == [48, 64, 3]
    assert columns[TOP_CAMERA]["video"]["layout"] == "HWC"
    assert columns[TOP_CAMERA]["video"]["codec"] in ("av1", "h264")


@pytest.mark.parametrize("name", FORMATS)
def test_takes_in_random_order_of_an_unsorted_pick_equal_the_oracle(
    video_root: Path, http: httpx.Client, name: str
) -> None:
    view = oracle(video_root / name, [7, 2, 5])
    rng = np.random.default_rng(1)
    indices = [*rng.integers(0, view.num_rows, 40).tolist(), 0, 0, view.num_rows - 1]
    columns = ["episode_index", "frame_index", WRIST_CAMERA, TOP_CAMERA]
    response = http.post(
        f"/datasets/{name}/rows/take", json={"episodes": [7, 2, 5], "indices": indices, "columns": columns}
    )
    table = read_stream(response.content)
    assert table.column_names == columns
    expected_rows = view.take(pa.array(indices)).select(["episode_index", "frame_index"])
    assert table.select(["episode_index", "frame_index"]).equals(expected_rows)
    for key in (TOP_CAMERA, WRIST_CAMERA):
        assert np.array_equal(served_frames(table, key), expected_frames(video_root / name, key, table))


@pytest.mark.parametrize("name", FORMATS)
def test_slices_equal_the_oracle(video_root: Path, http: httpx.Client, name: str) -> None:
    params = {"episodes": "8,1-3", "start": 5, "stop": 150, "columns": f"{TOP_CAMERA},episode_index,frame_index"}
    table = read_stream(http.get(f"/datasets/{name}/rows", params=params).content)
    view = oracle(video_root / name, [1, 2, 3, 8]).slice(5, 145)
    assert table.select(["episode_index", "frame_index"]).equals(view.select(["episode_index", "frame_index"]))
    assert np.array_equal(served_frames(table, TOP_CAMERA), expected_frames(video_root / name, TOP_CAMERA, table))


@pytest.mark.parametrize("name", FORMATS)
def test_windows_reaching_past_both_episode_ends_clamp_and_pad(video_root: Path, http: httpx.Client, name: str) -> None:
    view = oracle(video_root / name, [4])
    last = view.num_rows - 1
    offsets = [-2.0, -1 / 30, 0.0, 2.0]
    body = {
        "episodes": "4",
        "indices": [0, 1, last],
        "columns": ["frame_index"],
        "delta_timestamps": {TOP_CAMERA: offsets},
    }
    table = read_stream(http.post(f"/datasets/{name}/rows/take", json=body).content)
    windows = table[TOP_CAMERA].combine_chunks().to_numpy_ndarray()
    assert windows.shape == (3, 4, 64, 96, 3)
    for row, position in enumerate([0, 1, last]):
        targets = [min(max(position + round(d * 30), 0), last) for d in offsets]
        expected = frames_for_rows(video_root / name, TOP_CAMERA, [(4, t) for t in targets])
        assert np.array_equal(windows[row], expected)
        pads = [not 0 <= position + round(d * 30) <= last for d in offsets]
        assert table[f"{TOP_CAMERA}_is_pad"][row].as_py() == pads


@pytest.mark.parametrize("name", FORMATS)
def test_an_empty_slice_of_a_windowed_camera_has_the_window_type(http: httpx.Client, name: str) -> None:
    query = {"stop": 0, "columns": "frame_index", "delta_timestamps": orjson.dumps({TOP_CAMERA: [0, 1 / 30]}).decode()}
    response = http.get(f"/datasets/{name}/rows", params=query)
    assert response.status_code == 200
    table = read_stream(response.content)
    assert table.num_rows == 0
    assert table.schema.field(TOP_CAMERA).type == pa.fixed_shape_tensor(pa.uint8(), [2, 64, 96, 3])
    assert int(response.headers["x-total-rows"]) > 0


def test_unknown_camera_is_422_naming_the_available_columns(http: httpx.Client) -> None:
    response = http.get("/datasets/cams-v3/rows", params={"columns": "observation.images.side", "stop": 3})
    assert_problem(response, 422, "'observation.images.side'", TOP_CAMERA)


class _FramesInSharedMemory(episerve.EpisodeDataset):
    """Reports whether a DataLoader worker's batch holds its frames in shared memory, where the worker filled them
    (then they cross to the main process without another copy)."""

    def __getitems__(self, indices):
        import torch

        batch = super().__getitems__(indices)
        batch.data["frames_filled_in_shared_memory"] = torch.tensor(batch.data[TOP_CAMERA].is_shared())
        return batch


def test_dataloader_workers_get_channels_first_frames(video_root: Path, video_server: ServerProcess) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dataset = _FramesInSharedMemory(
        video_server.url, "cams-v3", episodes=[6, 0], columns=["episode_index", "frame_index", TOP_CAMERA]
    )
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, collate_fn=episerve.collate)
    seen = 0
    for batch in loader:
        frames = batch[TOP_CAMERA]
        in_shared_memory = batch.pop("frames_filled_in_shared_memory").item()
        assert in_shared_memory == (frames.nbytes > INLINE_BLOCK_BYTES)  # large: no second copy to send them across
        assert frames.dtype == torch.uint8 and tuple(frames.shape[1:]) == (3, 64, 96)
        rows = zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
        expected = frames_for_rows(video_root / "cams-v3", TOP_CAMERA, rows)
        assert np.array_equal(frames.numpy(), expected.transpose(0, 3, 1, 2))
        seen += len(frames)
    assert seen == len(dataset)


def test_frames_of_batches_held_across_epochs_stay_intact(video_root: Path, video_server: ServerProcess) -> None:
    """Workers write later batches into shared memory the main process has dropped (`episerve._shared_blocks`):
    batches dropped at once, then batches all held, then every held batch checked once more at the end."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dataset = episerve.EpisodeDataset(video_server.url, "cams-v3", columns=["episode_index", "frame_index", TOP_CAMERA])
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, collate_fn=episerve.collate)

    def expected(batch: dict) -> np.ndarray:
        rows = zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
        return frames_for_rows(video_root / "cams-v3", TOP_CAMERA, rows).transpose(0, 3, 1, 2)

    held = []
    for epoch in range(3):
        for batch in loader:
            assert np.array_equal(batch[TOP_CAMERA].numpy(), expected(batch))
            assert batch[TOP_CAMERA].is_shared() or len(batch[TOP_CAMERA]) < 16  # full batches: in shared memory
            if epoch > 0:
                held.append(batch)
    assert len(held) == 2 * len(loader)
    assert all(np.array_equal(batch[TOP_CAMERA].numpy(), expected(batch)) for batch in held)


class _IterableFramesInSharedMemory(episerve.EpisodeIterableDataset):
    """Reports whether each batch a DataLoader worker yields holds its frames in shared memory."""

    def __iter__(self):
        import torch

        for batch in super().__iter__():
            batch["frames_filled_in_shared_memory"] = torch.tensor(batch[TOP_CAMERA].is_shared())
            yield batch


@pytest.mark.parametrize("chunk_rows", [24, 40])
def test_iterable_dataset_workers_stream_shuffled_channels_first_frames(
    video_root: Path, video_server: ServerProcess, chunk_rows: int
) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dataset = _IterableFramesInSharedMemory(
        video_server.url,
        "cams-v3",
        episodes=[6, 0, 3],
        columns=["index", "episode_index", "frame_index", TOP_CAMERA],
        chunk_rows=chunk_rows,  # batches cut across chunks: some are slices of one chunk, some joined from two
        batch_size=16,
        shuffle=True,
    )
    seen, shared = [], []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2):
        frames = batch[TOP_CAMERA]
        shared.append(batch.pop("frames_filled_in_shared_memory").item())
        assert frames.dtype == torch.uint8 and tuple(frames.shape[1:]) == (3, 64, 96)
        rows = zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
        expected = frames_for_rows(video_root / "cams-v3", TOP_CAMERA, rows)
        assert np.array_equal(frames.numpy(), expected.transpose(0, 3, 1, 2))
        seen.extend(batch["index"].tolist())
    view = oracle(video_root / "cams-v3", [0, 3, 6])
    assert sorted(seen) == sorted(view["index"].to_pylist()) and seen != sorted(seen)
    # A chunk of at most two batches is filled in shared memory, and a batch cut from it crosses as a slice of it;
    # a larger chunk stays private (each batch would take all of it along), its batches are copied out.
    assert any(shared) == (chunk_rows <= 2 * 16)


def test_a_missing_video_file_is_a_problem_naming_it_and_the_rest_still_serves(
    video_root: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(video_root / "cams-v21", root / "broken")
    (root / "broken" / "videos/chunk-000" / TOP_CAMERA / "episode_000003.mp4").unlink()
    with ServerProcess([root], tmp_path / "cache") as server, httpx.Client(base_url=server.url, timeout=60) as http:
        missing = http.get("/datasets/broken/rows", params={"episodes": "3", "columns": TOP_CAMERA, "stop": 2})
        assert_problem(missing, 503, "episode_000003.mp4")
        fine = http.get("/datasets/broken/rows", params={"episodes": "2", "columns": f"{TOP_CAMERA},action", "stop": 2})
        assert fine.status_code == 200 and read_stream(fine.content).num_rows == 2


def test_a_frame_farther_than_the_tolerance_is_a_problem_not_a_wrong_frame(video_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(video_root / "cams-v3", root / "shifted")
    (meta,) = sorted((root / "shifted" / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(meta)
    column = f"videos/{TOP_CAMERA}/from_timestamp"
    pairs = zip(table["episode_index"].to_pylist(), table[column].to_pylist(), strict=True)
    shifted = [t + 0.01 if e == 5 else t for e, t in pairs]
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(shifted, table[column].type))
    pq.write_table(table, meta)
    with ServerProcess([root], tmp_path / "cache") as server, httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"episodes": [5], "indices": [3], "columns": [TOP_CAMERA]}
        assert_problem(http.post("/datasets/shifted/rows/take", json=body), 422, TOP_CAMERA, "episode 5", "frame 3")
        loose = http.post("/datasets/shifted/rows/take", json={**body, "tolerance_s": 0.02})
        assert loose.status_code == 200


def test_first_touch_builds_one_decoded_frame_segment_per_video_file_read(
    video_root: Path, video_server: ServerProcess, http: httpx.Client
) -> None:
    for episode in (0, 8):  # one frame of each episode: they lie in two of the camera's files
        body = {"episodes": [episode], "indices": [0], "columns": ["episode_index", TOP_CAMERA]}
        table = read_stream(http.post("/datasets/cams-v3/rows/take", json=body).content)
        assert table["episode_index"].to_pylist() == [episode]

    def videos() -> set[str]:
        sources = {
            orjson.loads(sidecar.read_bytes())["source"]["path"]
            for sidecar in Path(video_server.cache_dir).rglob("frames/*.json")
        }
        return {path for path in sources if path.endswith(".mp4")}

    if video_server.policy == "on-demand":
        assert videos() == set()
    else:  # answered by decoding on demand; the segments are built in the background
        dataset = video_root / "cams-v3"
        touched = {episode_video(dataset, TOP_CAMERA, e).path.relative_to(dataset).as_posix() for e in (0, 8)}
        assert len(touched) == 2
        eventually(lambda: touched <= videos(), 60)


def test_warm_videos_builds_the_frame_segments_that_the_warmed_policy_serves(video_root: Path, tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    root, cache = tmp_path / "root", tmp_path / "cache"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    result = run_cli("warm", "cams", "--episodes", "2-3", "--videos", "--root", str(root), "--cache-dir", str(cache))
    assert result.returncode == 0, result.stderr
    assert "4 video files needed, 4 decoded" in result.stdout  # 2 episodes x 2 cameras, one file each in v2.1
    env = {"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}
    with ServerProcess([root], cache, env=env) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"episodes": "2-3", "indices": [0, 5, 70], "columns": ["episode_index", "frame_index", WRIST_CAMERA]}
        table = read_stream(http.post("/datasets/cams/rows/take", json=body).content)
        expected = expected_frames(root / "cams", WRIST_CAMERA, table)
        assert np.array_equal(served_frames(table, WRIST_CAMERA), expected)


def test_verify_checks_decoded_frame_segments_and_rebuilds_a_damaged_one(video_root: Path, tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    root, cache = tmp_path / "root", tmp_path / "cache"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    location = ["--root", str(root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams", "--episodes", "1", "--videos", *location).returncode == 0
    sidecars = {orjson.loads(p.read_bytes())["source"]["path"]: p for p in cache.rglob("frames/*.json")}
    video = f"videos/chunk-000/{TOP_CAMERA}/episode_000001.mp4"
    segment = sidecars[video].with_suffix(".arrow")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    found = run_cli("verify", "cams", *location)
    assert found.returncode == 2 and f"{video}: checksum" in found.stdout, found.stdout
    assert run_cli("verify", "cams", "--rebuild", *location).returncode == 1
    assert run_cli("verify", "cams", *location).returncode == 0


def test_a_rewritten_video_file_invalidates_exactly_its_frame_segment(video_root: Path, tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    root, cache = tmp_path / "root", tmp_path / "cache"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    location = ["--root", str(root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams", "--episodes", "1-2", "--videos", *location).returncode == 0
    videos = root / "cams" / "videos/chunk-000" / TOP_CAMERA

    def built() -> dict[str, dict]:
        sidecars = (orjson.loads(p.read_bytes()) for p in cache.rglob("frames/*.json"))
        return {s["source"]["path"]: s["source"] for s in sidecars if s["source"]["path"].endswith(".mp4")}

    before = built()
    shutil.copyfile(videos / "episode_000002.mp4", videos / "episode_000001.mp4")  # same name, other content
    with ServerProcess([root], cache) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"episodes": [1, 2], "indices": [0], "columns": ["episode_index", "frame_index", TOP_CAMERA]}
        table = read_stream(http.post("/datasets/cams/rows/take", json=body).content)
        assert np.array_equal(served_frames(table, TOP_CAMERA), expected_frames(root / "cams", TOP_CAMERA, table))
    after = built()
    rewritten, kept = (f"videos/chunk-000/{TOP_CAMERA}/episode_00000{n}.mp4" for n in (1, 2))
    assert after[kept] == before[kept]
    assert after[rewritten] != before[rewritten]  # rebuilt for the new content
    assert after[rewritten]["ctime_ns"] > before[rewritten]["ctime_ns"]


def test_a_slices_etag_changes_with_its_video_files_and_the_served_frame_size(video_root: Path, tmp_path: Path) -> None:
    """A conditional `/rows` read is 304 only while its frames are the same: a video file replaced under unchanged
    data files, or frames served at another size, answer 200 with the new frames."""
    import av

    from app.demo_video import encode_episode

    root = tmp_path / "root"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    video = root / "cams" / "videos/chunk-000" / TOP_CAMERA / "episode_000002.mp4"
    query = {"episodes": "2", "stop": "10", "columns": f"episode_index,frame_index,{TOP_CAMERA}"}
    with ServerProcess([root], tmp_path / "cache") as server, server.client() as http:
        before = http.get("/datasets/cams/rows", params=query)
        etag = before.headers["etag"]
        assert http.get("/datasets/cams/rows", params=query, headers={"If-None-Match": etag}).status_code == 304
        old = served_frames(read_stream(before.content), TOP_CAMERA)
        with av.open(str(video)) as container:  # the same frame count, other pixels
            frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
        video.write_bytes(encode_episode(255 - frames, 30))
        after = http.get("/datasets/cams/rows", params=query, headers={"If-None-Match": etag})
        assert after.status_code == 200 and after.headers["etag"] != etag
        table = read_stream(after.content)
        assert np.array_equal(served_frames(table, TOP_CAMERA), expected_frames(root / "cams", TOP_CAMERA, table))
        assert not np.array_equal(served_frames(table, TOP_CAMERA), old)
        etag = after.headers["etag"]
    env = {"EPISERVE_VIDEO_CACHE_SIZE": "32x48"}
    with ServerProcess([root], tmp_path / "cache", env=env) as server, server.client() as http:
        resized = http.get("/datasets/cams/rows", params=query, headers={"If-None-Match": etag})
        assert resized.status_code == 200 and resized.headers["etag"] != etag
        assert served_frames(read_stream(resized.content), TOP_CAMERA).shape[1:] == (32, 48, 3)


def test_responses_over_the_frame_byte_limit_are_413_stating_the_rows_that_fit_and_the_client_pages(
    video_root: Path, tmp_path: Path
) -> None:
    frame_bytes = 64 * 96 * 3
    env = {"EPISERVE_MAX_FRAME_BYTES": str(10 * frame_bytes)}
    with ServerProcess([video_root], tmp_path / "cache", env=env) as server, server.client() as http:
        big = http.get("/datasets/cams-v3/rows", params={"columns": f"{TOP_CAMERA},frame_index", "stop": 11})
        assert assert_problem(big, 413, "EPISERVE_MAX_FRAME_BYTES")["limit"] == 10
        take = http.post("/datasets/cams-v3/rows/take", json={"indices": list(range(11)), "columns": [TOP_CAMERA]})
        assert assert_problem(take, 413, "limit is 184320 bytes")["limit"] == 10
        window = {"indices": [0, 1, 2, 3], "columns": ["index"], "delta_timestamps": {TOP_CAMERA: [-0.1, 0.0, 0.1]}}
        windowed = http.post("/datasets/cams-v3/rows/take", json=window)
        assert assert_problem(windowed, 413, "4 rows of camera frames")["limit"] == 3  # three frames a row
        fits = http.get("/datasets/cams-v3/rows", params={"columns": f"{TOP_CAMERA},frame_index", "stop": 10})
        assert fits.status_code == 200 and read_stream(fits.content).num_rows == 10
        without = http.get("/datasets/cams-v3/rows", params={"columns": "frame_index,episode_index", "stop": 500})
        assert read_stream(without.content).num_rows == min(500, oracle(video_root / "cams-v3", None).num_rows)

        client = episerve.Client(server.url)
        table = client.rows("cams-v3", columns=["episode_index", "frame_index", TOP_CAMERA], episodes=[2, 5])
        assert table.num_rows == oracle(video_root / "cams-v3", [2, 5]).num_rows > 10  # in pages of 10
        expected = expected_frames(video_root / "cams-v3", TOP_CAMERA, table)
        assert np.array_equal(served_frames(table, TOP_CAMERA), expected)
        dataset = episerve.EpisodeDataset(server.url, "cams-v3", episodes=[5], columns=["frame_index", TOP_CAMERA])
        batch = dataset.__getitems__(list(range(len(dataset)))[::-1])  # one batch, taken in takes of 10
        frames = batch.data[TOP_CAMERA]
        rows = [(5, i) for i in batch.data["frame_index"].tolist()]
        expected = frames_for_rows(video_root / "cams-v3", TOP_CAMERA, rows)
        assert len(frames) == len(dataset) > 10 and np.array_equal(np.asarray(frames), expected.transpose(0, 3, 1, 2))


def test_scattered_reads_decoded_side_by_side_equal_the_oracle(video_root: Path) -> None:
    """A shuffled batch's frames of one file are cut into parts decoded at once on separate decoders; every
    frame equals an independent decode, and a run of consecutive frames is decoded in one pass."""
    from app.sources.decoders import DecoderPool
    from app.sources.video import (
        MIN_PART_FRAMES,
        MIN_PART_PIXELS,
        SIDE_BY_SIDE,
        decode_nearest_side_by_side,
        part_bounds,
        video_features,
    )
    from tests.video_oracle import decode_video

    dataset = video_root / "cams-v3"
    feature = video_features(orjson.loads((dataset / "meta/info.json").read_bytes()))[TOP_CAMERA]
    video = episode_video(dataset, TOP_CAMERA, 0)
    file_times, file_frames = decode_video(video.path)
    rel = str(video.path.relative_to(dataset))
    rng = np.random.default_rng(5)
    picked = np.sort(rng.choice(len(file_times), size=min(len(file_times), 48), replace=False))
    times = file_times[picked] + 1e-6  # a hair past each frame, as float32 timestamps are
    decoders = DecoderPool()
    out = np.zeros((len(times), feature.height, feature.width, 3), dtype=np.uint8)
    places = [np.array([i]) for i in range(len(times))]
    found = decode_nearest_side_by_side(out, places, dataset, rel, times, feature, decoders)
    assert np.array_equal(out, file_frames[picked]) and np.allclose(found, file_times[picked])
    pixels = feature.height * feature.width
    parts = min(SIDE_BY_SIDE, max(len(times) // MIN_PART_FRAMES, len(times) * pixels // MIN_PART_PIXELS))
    cut = part_bounds(times, 1 / feature.fps, pixels)
    assert len(cut) == parts + 1 and cut[0] == 0 and cut[-1] == len(times)  # scattered: cut into parts
    assert 1 <= decoders.opened <= parts  # a part that starts after another has ended takes its decoder
    assert part_bounds(file_times[:20], 1 / feature.fps, pixels) == [0, 20]  # a run: one pass
    large = 480 * 640  # a few large frames (a piece of a large answer) are still shared out
    assert len(part_bounds(times[::12], 1 / feature.fps, large)) == min(SIDE_BY_SIDE, 4 * large // MIN_PART_PIXELS) + 1
    run = np.arange(20)
    out = np.zeros((len(run), feature.height, feature.width, 3), dtype=np.uint8)
    decoders = DecoderPool()
    decode_nearest_side_by_side(out, [np.array([i]) for i in run], dataset, rel, file_times[run], feature, decoders)
    assert np.array_equal(out, file_frames[run]) and decoders.opened == 1


def test_a_scattered_read_of_a_truncated_file_fails_or_succeeds_as_one_pass_does(
    video_root: Path, tmp_path: Path
) -> None:
    """A file cut short (index first, so what remains still opens): parts of a side-by-side read that lie past its
    decodable end give the answer a single pass gives: a problem saying where the decodable frames end."""
    import av

    from app.errors import DatasetError, InvalidInput
    from app.sources.decoders import DecoderPool
    from app.sources.video import check_tolerance, decode_nearest_into, decode_nearest_side_by_side, video_features
    from tests.video_oracle import decode_video

    dataset = video_root / "cams-v3"
    feature = video_features(orjson.loads((dataset / "meta/info.json").read_bytes()))[TOP_CAMERA]
    source = episode_video(dataset, TOP_CAMERA, 0).path
    file_times, _ = decode_video(source)
    whole = tmp_path / "whole.mp4"
    with av.open(str(source)) as given, av.open(str(whole), "w", options={"movflags": "faststart"}) as remuxed:
        stream = remuxed.add_stream_from_template(given.streams.video[0], opaque=True)
        for packet in given.demux(given.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                remuxed.mux(packet)
    (tmp_path / "cut.mp4").write_bytes(whole.read_bytes()[: whole.stat().st_size * 6 // 10])
    times = np.sort(np.random.default_rng(2).choice(file_times, size=40, replace=False)) + 1e-6

    def outcome(decode) -> tuple[str, np.ndarray | None]:
        out = np.zeros((len(times), feature.height, feature.width, 3), dtype=np.uint8)
        places = [np.array([i]) for i in range(len(times))]
        try:
            found = decode(out, places, tmp_path, "cut.mp4", times, feature, DecoderPool())
            check_tolerance(TOP_CAMERA, np.zeros(len(times)), np.arange(len(times)), times, found, 1e-4)
        except (DatasetError, InvalidInput) as exc:
            return f"{type(exc).__name__}: {exc}", None
        return "frames", out

    one_pass, side_by_side = outcome(decode_nearest_into), outcome(decode_nearest_side_by_side)
    assert side_by_side[0] == one_pass[0]
    assert "no decodable frame near" in side_by_side[0] and "may be truncated" in side_by_side[0]
    if one_pass[1] is not None:
        assert np.array_equal(side_by_side[1], one_pass[1])
