"""The decoded-frame cache and the decoders behind it: frames served downscaled, a disk budget with
least-recently-used eviction, crash safety and one build across processes, and decoders reused by sequential
reads. Every answer is checked against an independent PyAV decode (tests/video_oracle.py)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import shutil
import threading
import time
from fractions import Fraction
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest

from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from app.reads.episode_spec import parse_episode_spec
from app.reads.frames import video_files_needed
from app.settings import Settings
from app.sources.decoders import DecoderPool
from app.sources.source import DatasetPath, VideoFeature
from app.sources.video import decode_nearest_into, frame_schema, video_features
from app.store.catalog import Catalog
from tests.direct_reads import take
from tests.support import ServerProcess, eventually, killed_mid_frame_build, read_stream
from tests.test_operations import metric, run_cli
from tests.video_oracle import decode_video, episode_video, frames_for_rows


def decode_nearest(
    root: DatasetPath, rel: str, times: np.ndarray, feature: VideoFeature, decoders: DecoderPool
) -> tuple[np.ndarray, np.ndarray]:
    """For each of `times` (seconds, ascending), the decoded frame whose presentation time is nearest, and that
    time: (uint8 (N, H, W, 3) at the camera's served size, float64 (N,))."""
    frames = np.empty((len(times), feature.height, feature.width, 3), dtype=np.uint8)
    places = np.arange(len(times)).reshape(-1, 1)
    return frames, decode_nearest_into(frames, places, root, rel, times, feature, decoders)


ROWS = ["episode_index", "frame_index"]


def served(table: pa.Table, key: str) -> np.ndarray:
    return table[key].combine_chunks().to_numpy_ndarray()


def expected(root: Path, key: str, table: pa.Table, size: tuple[int, int] | None = None) -> np.ndarray:
    rows = zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True)
    return frames_for_rows(root, key, rows, size=size)


def frame_segments(cache: Path) -> dict[str, Path]:
    """Video file -> its decoded-frame segment, for every published one."""
    return {
        orjson.loads(p.read_bytes())["source"]["path"]: p.with_suffix(".arrow") for p in cache.rglob("frames/*.json")
    }


# -- downscaling ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["first-touch", "on-demand"])
def test_frames_are_served_at_the_configured_size_equal_to_an_area_resize_of_the_decoded_frames(
    video_root: Path, tmp_path: Path, policy: str
) -> None:
    sizes = {"cams-v3": (32, 48), "cams-v21": (40, 24)}  # the default for every dataset, and one of another aspect
    env = {"EPISERVE_VIDEO_CACHE_SIZE": "32x48,cams-v21=40x24", "EPISERVE_VIDEO_CACHE_POLICY": policy}
    cache = tmp_path / "cache"
    with ServerProcess([video_root], cache, env=env) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for name, size in sizes.items():
            columns = {c["name"]: c for c in http.get(f"/datasets/{name}").json()["columns"]}
            assert columns[TOP_CAMERA]["video"]["shape"] == [*size, 3]
            assert columns[TOP_CAMERA]["video"]["file_shape"] == [64, 96, 3]
            assert columns[WRIST_CAMERA]["video"]["file_shape"] == [48, 64, 3]
            body = {
                "episodes": [7, 2],
                "indices": [0, 40, 3, 41, 1, 0],
                "columns": [*ROWS, TOP_CAMERA, WRIST_CAMERA],
            }
            for _ in ("cold", "cached") if policy == "first-touch" else ("on demand",):
                table = read_stream(http.post(f"/datasets/{name}/rows/take", json=body).content)
                for key in (TOP_CAMERA, WRIST_CAMERA):
                    frames = served(table, key)
                    assert frames.shape == (6, *size, 3)
                    assert np.array_equal(frames, expected(video_root / name, key, table, size))
                if policy == "first-touch":  # the first read queued the builds: the second is served from them
                    dataset = video_root / name
                    touched = {
                        episode_video(dataset, key, episode).path.relative_to(dataset).as_posix()
                        for key in (TOP_CAMERA, WRIST_CAMERA)
                        for episode in set(table["episode_index"].to_pylist())
                    }
                    eventually(lambda touched=touched: touched <= set(frame_segments(cache)), 120)
    if policy == "on-demand":
        assert frame_segments(cache) == {}


# -- the disk budget -----------------------------------------------------------------------------------------------


def test_eviction_under_a_small_budget_keeps_the_most_recently_used_segments_and_every_answer_correct(
    video_root: Path, tmp_path: Path
) -> None:
    root, cache = video_root / "cams-v21", tmp_path / "cache"  # one file per episode and camera
    budget = 4_000_000  # room for about three episodes' frames of the 64x96 camera
    env = {"EPISERVE_VIDEO_CACHE_BYTES": str(budget)}
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 2]
    files = {e: episode_video(root, TOP_CAMERA, e).path.relative_to(root).as_posix() for e in range(9)}
    with ServerProcess([video_root], cache, env=env) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for episode in order:
            params = {"episodes": str(episode), "columns": ",".join([*ROWS, TOP_CAMERA])}
            table = read_stream(http.get("/datasets/cams-v21/rows", params=params).content)
            assert np.array_equal(served(table, TOP_CAMERA), expected(root, TOP_CAMERA, table))
            eventually(lambda episode=episode: files[episode] in frame_segments(cache), 60)  # built in the background
            resident = frame_segments(cache)
            assert sum(path.stat().st_size for path in resident.values()) <= budget
            assert files[episode] in resident  # the segment just read stays
            time.sleep(0.01)  # distinct modification times: the order of use is the order of reads
        status = http.get("/datasets/cams-v21/cache").json()["frame_segments"]
    resident = set(frame_segments(cache))
    assert 1 < len(resident) < 9  # some were evicted, some kept
    projected = status.pop("projected")
    assert status == {
        "built": len(resident),
        "bytes": sum(p.stat().st_size for p in frame_segments(cache).values()),
        "budget_bytes": budget,
        "hot": None,  # no hot layer configured
    }
    info = orjson.loads((root / "meta" / "info.json").read_bytes())
    shapes = [feature["shape"] for feature in info["features"].values() if feature["dtype"] == "video"]
    frames = info["total_frames"]
    exact = sum(frames * (int(np.prod(shape)) + 8) + 64 * 1024 for shape in shapes)  # pixels, times, framing
    note = projected.pop("note")
    assert projected == {
        "tiers": ["raw"],
        "frames_per_camera": frames,
        "bytes": exact,
        "estimated": False,
        "raw_bytes": exact,
        "fits_budget": False,
    }
    assert "EPISERVE_VIDEO_CACHE_BYTES" in note and "decoded on demand" in note
    assert "EPISERVE_VIDEO_FRAME_TIER=jpeg" in note  # what would fit, said where exact frames do not
    most_recent = list(dict.fromkeys(reversed(order)))  # distinct episodes, most recently read first
    assert resident == {files[e] for e in most_recent[: len(resident)]}


def test_a_video_larger_than_the_whole_budget_is_decoded_on_demand(video_root: Path, tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    env = {"EPISERVE_VIDEO_CACHE_BYTES": "1000"}
    result = run_cli(
        "warm", "cams", "--episodes", "1", "--videos", "--root", str(root), "--cache-dir", str(cache), env=env
    )
    assert result.returncode == 0, result.stderr
    assert "2 larger than EPISERVE_VIDEO_CACHE_BYTES (decoded on demand)" in result.stdout
    assert "cams: all decoded frames take " in result.stdout and "(exact pixels: " in result.stdout
    assert "as JPEG (EPISERVE_VIDEO_FRAME_TIER=jpeg, lossy) they would need at most" in result.stdout
    with ServerProcess([root], cache, env=env) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"episodes": [1], "indices": [5, 0], "columns": [*ROWS, TOP_CAMERA]}
        table = read_stream(http.post("/datasets/cams/rows/take", json=body).content)
        assert np.array_equal(served(table, TOP_CAMERA), expected(root / "cams", TOP_CAMERA, table))
    assert frame_segments(cache) == {}
    assert list(cache.rglob("frames/*.arrow")) == []


@pytest.fixture(scope="module")
def large_frame_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One camera of 128x192 (72 KiB a frame: large enough to be sent from the decoded-frame segment's memory
    map rather than copied), its episodes in two mp4 files."""
    root = tmp_path_factory.mktemp("large-frames")
    write_demo_dataset(root / "big", episodes=6, seed=21, cameras={TOP_CAMERA: (128, 192)}, video_files=2)
    return root


def test_large_frames_sent_from_the_cache_equal_the_decoded_ones_in_takes_slices_and_compressed_answers(
    large_frame_root: Path, tmp_path: Path
) -> None:
    root, cache = large_frame_root / "big", tmp_path / "cache"
    files = {e: episode_video(root, TOP_CAMERA, e).path for e in range(6)}
    warmed = [e for e in range(6) if files[e] == files[0]]
    assert 0 < len(warmed) < 6  # answers mix frames from a segment and frames decoded on demand
    result = run_cli(
        "warm", "big", "--episodes", ",".join(map(str, warmed)), "--videos", "--root", str(large_frame_root),
        "--cache-dir", str(cache),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    env = {"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}
    with ServerProcess([large_frame_root], cache, env=env) as server, httpx.Client(base_url=server.url) as http:
        total = int(http.get("/datasets/big/rows", params={"stop": 0}).headers["x-total-rows"])
        rng = np.random.default_rng(4)
        for count in (7, 90):  # answers of one encoded piece (< 4 MiB) and streamed ones
            indices = [*rng.integers(0, total, count).tolist(), 0, 0]  # random order, duplicates
            for compression in (None, "lz4"):
                body = {"indices": indices, "columns": [*ROWS, TOP_CAMERA], "compression": compression}
                table = read_stream(http.post("/datasets/big/rows/take", json=body).content)
                assert len(table) == count + 2
                assert np.array_equal(served(table, TOP_CAMERA), expected(root, TOP_CAMERA, table))
        for episodes in (",".join(map(str, warmed)), "0-5"):
            params = {"episodes": episodes, "start": 3, "stop": 70, "columns": ",".join([*ROWS, TOP_CAMERA])}
            table = read_stream(http.get("/datasets/big/rows", params=params).content)
            assert len(table) == 67
            assert np.array_equal(served(table, TOP_CAMERA), expected(root, TOP_CAMERA, table))

        # Once the segment is mapped, takes of its frames are answered on the event loop (any size: the frames
        # are sent from the map); a take that needs a frame decoded, or a camera window, goes to the route.
        body = {"episodes": warmed, "indices": list(range(80, 0, -1)), "columns": [*ROWS, TOP_CAMERA]}
        unwarmed = {"episodes": [e for e in range(6) if e not in warmed], "indices": [5, 1], "columns": [TOP_CAMERA]}
        window = {**body, "delta_timestamps": {TOP_CAMERA: [-0.1, 0.0]}}
        for request, on_the_loop in ((body, 1), (unwarmed, 0), (window, 0), (body, 1)):
            before = metric(http.get("/metrics").text, "episerve_inline_takes_total")
            response = http.post("/datasets/big/rows/take", json=request)
            assert response.status_code == 200, response.text
            assert metric(http.get("/metrics").text, "episerve_inline_takes_total") - before == on_the_loop
        table = read_stream(response.content)
        rows_alone = read_stream(http.post("/datasets/big/rows/take", json={**body, "columns": ROWS}).content)
        assert table.select(ROWS).equals(rows_alone) and len(table) == 80
        assert np.array_equal(served(table, TOP_CAMERA), expected(root, TOP_CAMERA, table))
    assert set(frame_segments(cache)) == {files[0].relative_to(root).as_posix()}  # nothing else was built


# -- crash safety and one build across processes ------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_video_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One camera, every episode in one mp4 file (thousands of frames): a frame-segment build takes a while."""
    root = tmp_path_factory.mktemp("long-video")
    write_demo_dataset(root / "long", format="v3.0", episodes=24, seed=5, video_files=1)
    return root


def _build_frames_of(root: str, cache: str, rel: str, barrier: object | None) -> tuple[int, str]:
    """In a fresh process: read every frame of one video file through the read path (first touch builds its
    segment); return how many segments this process built and a digest of the frames served."""
    catalog = Catalog(Settings(roots=[Path(root)], cache_dir=Path(cache), build_batch_bytes=64 * 1024), [Path(root)])
    dataset = catalog.get("long")
    index = dataset.index()
    if barrier is not None:
        barrier.wait()  # type: ignore[attr-defined]
    episodes = sorted(int(e) for e in index.episodes)
    spec = parse_episode_spec(f"{episodes[0]}-{episodes[-1]}", 10**9)
    rows = list(range(0, index.total_rows, 7))
    taken = take(dataset, spec, rows, [*ROWS, TOP_CAMERA]).table
    eventually(lambda: not dataset.frames.queued(rel), 300)  # the build the read queued in the background
    return dataset.frames.builds, hashlib.sha256(served(taken, TOP_CAMERA).tobytes()).hexdigest()


def _build_frames_of_into(root: str, rel: str, cache: str) -> tuple[int, str]:
    return _build_frames_of(root, cache, rel, None)


def _the_video(root: Path) -> str:
    return episode_video(root / "long", TOP_CAMERA, 0).path.relative_to(root / "long").as_posix()


def test_sigkill_during_a_frame_segment_build_leaves_nothing_that_is_served(
    long_video_root: Path, tmp_path: Path
) -> None:
    rel = _the_video(long_video_root)
    build = partial(_build_frames_of_into, str(long_video_root), rel)
    cache = killed_mid_frame_build(build, tmp_path, 200_000)

    with ServerProcess([long_video_root], cache) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        body = {"episodes": "0-23", "indices": [0, 500, 17, 1500], "columns": [*ROWS, TOP_CAMERA]}
        table = read_stream(http.post("/datasets/long/rows/take", json=body).content)
        assert np.array_equal(served(table, TOP_CAMERA), expected(long_video_root / "long", TOP_CAMERA, table))
        eventually(lambda: list(frame_segments(cache)) == [rel], 120)  # rebuilt in the background
    assert list(cache.rglob("*.tmp")) == []


def _queue_a_frame_build_and_stop(root: str, cache: str, rel: str) -> list[str]:
    """In a fresh process: queue the background build of one video's frames as a first-touch read does, stop the
    process's background builds at once (as server shutdown does) and wait for the builder; return the files left
    in the frames directory."""
    from app.store import segment_builds

    catalog = Catalog(Settings(roots=[Path(root)], cache_dir=Path(cache), build_batch_bytes=64 * 1024), [Path(root)])
    dataset = catalog.get("long")
    dataset.index()
    schema = frame_schema(video_features(json.loads((Path(root) / "long/meta/info.json").read_text()))[TOP_CAMERA])
    assert dataset.frames.segment(rel, schema, build=True) is None  # not built yet: queued
    segment_builds.stop_background_builds()
    segment_builds.background_builds("frames").shutdown(wait=True)
    return sorted(p.name for p in dataset.frames.directory.iterdir())


def test_stopping_background_builds_gives_up_a_frame_build_without_leaving_anything(
    long_video_root: Path, tmp_path: Path
) -> None:
    context = multiprocessing.get_context("spawn")
    rel = _the_video(long_video_root)
    with context.Pool(1) as pool:
        left = pool.apply(_queue_a_frame_build_and_stop, (str(long_video_root), str(tmp_path / "cache"), rel))
    assert not [name for name in left if name.endswith((".tmp", ".arrow", ".json"))]  # only its lock file, if any
    assert frame_segments(tmp_path / "cache") == {}
    with ServerProcess([long_video_root], tmp_path / "cache") as server, server.client() as http:
        body = {"episodes": "0-23", "indices": [0, 500], "columns": [*ROWS, TOP_CAMERA]}
        table = read_stream(http.post("/datasets/long/rows/take", json=body).content)
        assert np.array_equal(served(table, TOP_CAMERA), expected(long_video_root / "long", TOP_CAMERA, table))
        eventually(lambda: list(frame_segments(tmp_path / "cache")) == [rel], 120)  # queued again, and built


def test_four_processes_asking_for_the_same_cold_video_build_its_segment_once(
    long_video_root: Path, tmp_path: Path
) -> None:
    context = multiprocessing.get_context("spawn")
    cache = tmp_path / "cache"
    rel = _the_video(long_video_root)
    with context.Manager() as manager:
        barrier = manager.Barrier(4)
        with context.Pool(4) as pool:
            results = pool.starmap(_build_frames_of, [(str(long_video_root), str(cache), rel, barrier)] * 4)
    assert sum(builds for builds, _ in results) == 1
    assert len({digest for _, digest in results}) == 1
    assert list(frame_segments(cache)) == [rel]
    assert list(cache.rglob("*.tmp")) == []


def test_prune_keeps_current_frame_segments_and_removes_the_frames_of_a_rewritten_video(
    video_root: Path, tmp_path: Path
) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    shutil.copytree(video_root / "cams-v21", root / "cams")
    location = ["--root", str(root), "--cache-dir", str(cache)]
    assert run_cli("warm", "cams", "--episodes", "1-2", "--videos", *location).returncode == 0
    before = frame_segments(cache)
    assert len(before) == 4
    assert run_cli("cache", "prune", *location).returncode == 0
    assert frame_segments(cache) == before
    videos = root / "cams/videos/chunk-000" / TOP_CAMERA
    shutil.copyfile(videos / "episode_000002.mp4", videos / "episode_000001.mp4")
    assert run_cli("cache", "prune", *location).returncode == 0
    assert set(frame_segments(cache)) == set(before) - {f"videos/chunk-000/{TOP_CAMERA}/episode_000001.mp4"}


# -- decoders ------------------------------------------------------------------------------------------------------


def _camera(dataset: Path):
    info = json.loads((dataset / "meta/info.json").read_text())
    return video_features(info)[TOP_CAMERA]


@pytest.mark.parametrize("run_threads", [1, 0])
def test_sequential_reads_of_a_video_decode_on_with_one_decoder_and_jumps_stay_exact(
    video_root: Path, run_threads: int
) -> None:
    dataset = video_root / "cams-v3"
    video = episode_video(dataset, TOP_CAMERA, 0)
    rel = video.path.relative_to(dataset).as_posix()
    times, frames = decode_video(video.path)
    pool = DecoderPool(capacity=2, run_threads=run_threads)
    for start in range(0, len(times), 16):  # a sequential reader: each read starts where the last one stopped
        got, at = decode_nearest(dataset, rel, times[start : start + 16], _camera(dataset), pool)
        assert np.array_equal(got, frames[start : start + 16]) and np.array_equal(at, times[start : start + 16])
    assert pool.opened == 1
    spread = list(range(0, len(times), 13))  # one read with gaps: seeks across them
    for picked in ([40, 41, 45], [0, 3], [len(times) - 2, len(times) - 1], [10, 12], [11], spread):
        got, at = decode_nearest(dataset, rel, times[picked], _camera(dataset), pool)
        assert np.array_equal(got, frames[picked]) and np.array_equal(at, times[picked])
    # With frame-threaded runs, scattered reads get a single-threaded decoder of their own.
    assert pool.opened == (1 if run_threads == 1 else 2)


def test_threads_reading_one_video_at_once_each_get_exact_frames(video_root: Path) -> None:
    dataset = video_root / "cams-v3"
    video = episode_video(dataset, TOP_CAMERA, 0)
    rel = video.path.relative_to(dataset).as_posix()
    times, frames = decode_video(video.path)
    pool = DecoderPool(capacity=2)
    wrong: list[int] = []

    def read(offset: int) -> None:
        for start in range(offset, len(times), 24):
            got, _ = decode_nearest(dataset, rel, times[start : start + 6], _camera(dataset), pool)
            if not np.array_equal(got, frames[start : start + 6]):
                wrong.append(start)

    threads = [threading.Thread(target=read, args=(offset,)) for offset in (0, 6, 12, 18)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_times_between_frames_pick_the_nearest_frame_once_converted(video_root: Path) -> None:
    dataset = video_root / "cams-v3"
    video = episode_video(dataset, TOP_CAMERA, 0)
    rel = video.path.relative_to(dataset).as_posix()
    times, frames = decode_video(video.path)
    step = times[6] - times[5]
    wanted = np.array([times[5], times[5] + 0.3 * step, times[5] + 0.45 * step, times[6] - 0.2 * step, times[6]])
    got, at = decode_nearest(dataset, rel, wanted, _camera(dataset), DecoderPool())
    assert np.array_equal(got, frames[[5, 5, 5, 6, 6]])
    assert np.array_equal(at, times[[5, 5, 5, 6, 6]])


def test_the_catalog_shares_one_decoder_pool_of_the_configured_size(video_root: Path, tmp_path: Path) -> None:
    settings = Settings(roots=[video_root], cache_dir=tmp_path / "cache", video_decoders=1)
    catalog = Catalog(settings, [video_root])
    v3, v21 = catalog.get("cams-v3"), catalog.get("cams-v21")
    assert v3.decoders is v21.decoders and v3.decoders.capacity == 1
    for dataset in (v3, v21):
        video = episode_video(dataset.path, TOP_CAMERA, 1)
        rel = video.path.relative_to(dataset.path).as_posix()
        times, frames = decode_video(video.path)
        got, _ = decode_nearest(dataset.path, rel, times[:4], _camera(dataset.path), dataset.decoders)
        assert np.array_equal(got, frames[:4])
    assert v3.decoders.opened == 2 and len(v3.decoders._idle) == 1  # the older decoder was closed


def _decode_in_child(dataset: str, rel: str, times: list[float], pool: DecoderPool, results: object) -> None:
    inherited = len(pool._idle)
    got, _ = decode_nearest(Path(dataset), rel, np.asarray(times), _camera(Path(dataset)), pool)
    results.put((inherited, hashlib.sha256(got.tobytes()).hexdigest()))  # type: ignore[attr-defined]


def test_a_forked_child_decodes_with_its_own_decoders(video_root: Path) -> None:
    dataset = video_root / "cams-v3"
    video = episode_video(dataset, TOP_CAMERA, 0)
    rel = video.path.relative_to(dataset).as_posix()
    times, frames = decode_video(video.path)
    pool = DecoderPool()
    decode_nearest(dataset, rel, times[:8], _camera(dataset), pool)  # leaves an open decoder in the parent
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_decode_in_child, args=(str(dataset), rel, times[8:20].tolist(), pool, results))
    child.start()
    inherited, digest = results.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert inherited == 0
    assert digest == hashlib.sha256(np.ascontiguousarray(frames[8:20]).tobytes()).hexdigest()


def test_warm_lists_each_video_file_once_per_camera(video_root: Path, tmp_path: Path) -> None:
    catalog = Catalog(Settings(roots=[video_root], cache_dir=tmp_path / "cache"), [video_root])
    files = video_files_needed(catalog.get("cams-v3"), parse_episode_spec("0-8", 10**9))
    assert len(files) == 6  # 3 files per camera


@pytest.mark.parametrize(("gop", "b_frames"), [(30, 0), (12, 3), (30, 3)])
def test_long_keyframe_intervals_decode_the_nearest_frames_without_looping(
    tmp_path: Path, gop: int, b_frames: int
) -> None:
    import av

    from app.sources.source import VideoFeature

    path = tmp_path / "long-gop.mp4"
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30, options={"g": str(gop), "bf": str(b_frames)})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for _ in range(90):
            image = rng.integers(0, 255, size=(48, 64, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    times, frames = decode_video(path)
    feature = VideoFeature("cam", 48, 64, 3, "h264", "yuv420p", 30.0)
    pool = DecoderPool()
    shuffled = np.random.default_rng(1).permutation(90)
    for picked in ([25], [23, 26, 88], [5, 70], [44], *np.split(shuffled, 15)):
        picked = np.sort(picked)
        got, at = decode_nearest(tmp_path, path.name, times[picked], feature, pool)
        assert np.array_equal(got, frames[picked]) and np.array_equal(at, times[picked])
        hair = times[picked] - 1e-7  # float32 timestamps land a hair before or after the frame
        got, _ = decode_nearest(tmp_path, path.name, np.maximum(hair, 0), feature, pool)
        assert np.array_equal(got, frames[picked])
        # Within a hair past a frame it is settled without the next; farther on, the nearer of the two is found.
        for past, nearest in ((5e-5, picked), (0.4 / 30, picked), (0.6 / 30, np.minimum(picked + 1, 89))):
            got, at = decode_nearest(tmp_path, path.name, times[picked] + past, feature, pool)
            assert np.array_equal(got, frames[nearest]) and np.array_equal(at, times[nearest])


@pytest.mark.parametrize("b_frames", [3, 0])
def test_frames_a_tenth_of_a_millisecond_apart_still_give_the_nearest(tmp_path: Path, b_frames: int) -> None:
    """A frame's recorded duration is not always the gap to the next frame shown (with B-frames it is the gap in
    decoding order), so a time just past a frame is settled on it only where it is: never a frame farther than
    the next one."""
    import av

    from app.sources.source import VideoFeature

    path = tmp_path / "close.mp4"
    time_base = Fraction(1, 90000)
    pts = [pair * 3000 + offset for pair in range(12) for offset in (0, 9)]  # pairs 0.1 ms apart, 1/30 s between
    with av.open(str(path), "w") as output:
        stream = output.add_stream("libx264", rate=30, options={"g": "12", "bf": str(b_frames)})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.time_base = stream.codec_context.time_base = time_base
        for number, at in enumerate(pts):  # flat frames: x264 makes B-frames of them
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), number * 10, dtype=np.uint8), format="rgb24")
            frame.pts, frame.time_base = at, time_base
            for packet in stream.encode(frame):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    times, frames = decode_video(path)
    feature = VideoFeature("cam", 48, 64, 3, "h264", "yuv420p", 30.0)
    wanted = np.sort(np.concatenate([times + 5e-5, times[1::2] - 5e-6, times]))
    for picks in (wanted, wanted[::3], wanted[1::5]):
        got, at = decode_nearest(tmp_path, path.name, picks, feature, DecoderPool())
        expected = np.array([int(np.argmin(np.abs(times - t))) for t in picks])
        assert np.array_equal(at, times[expected]) and np.array_equal(got, frames[expected])
