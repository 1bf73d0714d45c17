"""The hot layer over the JPEG tier (`EPISERVE_VIDEO_HOT_BYTES`), against real servers: a hot file's frames are
kept as raw pixels of the tier's JPEG round trip, so every answer equals the oracle (an independent JPEG round trip
of the frames decoded from the MP4s, tests/video_oracle.py) whether it was decoded on demand, read from the JPEG
segment or from the hot segment; the hot budget evicts hot segments least recently used first and never a JPEG
one; same-machine clients read hot pixels by reference; `frames=encoded` still sends the tier's JPEG bytes; a
hot build killed midway leaves nothing served."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest

import episerve
from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from app.reads.frames import video_files_needed
from app.settings import Settings
from app.sources.video import frame_schema, hot_camera
from app.store.catalog import Catalog
from app.store.dataset import Dataset
from tests.support import ServerProcess, eventually, killed_mid_frame_build, read_stream
from tests.test_frame_tiers import QUALITY, ROWS, exact, jpeg_round_trip, pixels
from tests.video_oracle import decode_video

JPEG = {"EPISERVE_VIDEO_FRAME_TIER": f"jpeg:{QUALITY}"}
ROOMY = JPEG | {"EPISERVE_VIDEO_HOT_BYTES": str(10**9)}


def published(cache: Path, store: str) -> dict[str, int]:
    """Video file -> bytes of its published segment in the `store` directory (`frames` or `hot-frames`)."""
    return {
        orjson.loads(p.read_bytes())["source"]["path"]: p.with_suffix(".arrow").stat().st_size
        for p in cache.rglob(f"{store}/*.json")
    }


def sidecar_rows(cache: Path, store: str, rel: str) -> int:
    sidecar = next(p for p in cache.rglob(f"{store}/*.json") if orjson.loads(p.read_bytes())["source"]["path"] == rel)
    return int(orjson.loads(sidecar.read_bytes())["rows"])


def take(http: httpx.Client, name: str, body: dict) -> pa.Table:
    answer = http.post(f"/datasets/{name}/rows/take", json=body)
    assert answer.status_code == 200, answer.text
    return read_stream(answer.content)


def test_hot_frames_equal_the_jpeg_round_trip_cold_from_the_jpeg_segment_and_from_the_hot_segment(
    video_root: Path, tmp_path: Path
) -> None:
    root, cache = video_root / "cams-v21", tmp_path / "cache"
    body = {"episodes": [5], "indices": [0, 9, 3, 9, 14], "columns": [*ROWS, TOP_CAMERA]}
    answers = []
    with ServerProcess([video_root], cache, env=JPEG) as server, server.client() as http:  # no hot layer
        answers.append(take(http, "cams-v21", body))  # decoded on demand
        eventually(lambda: len(published(cache, "frames")) == 1, 60)
        assert http.get("/datasets/cams-v21/cache").json()["frame_segments"]["hot"] is None
    hot_budget = 10**8
    env = JPEG | {"EPISERVE_VIDEO_HOT_BYTES": str(hot_budget)}
    with ServerProcess([video_root], cache, env=env) as server, server.client() as http:
        answers.append(take(http, "cams-v21", body))  # from the JPEG segment; the hot build queued
        eventually(lambda: len(published(cache, "hot-frames")) == 1, 60)
        answers.append(take(http, "cams-v21", body))  # from the hot segment
        report = http.get("/datasets/cams-v21/cache").json()["frame_segments"]
    reference = jpeg_round_trip(exact(root, TOP_CAMERA, answers[0]))
    for answer in answers:
        assert answer["frame_index"].to_pylist() == [0, 9, 3, 9, 14]
        assert np.array_equal(pixels(answer, TOP_CAMERA), reference)
    (rel, hot_bytes), (jpeg_rel, jpeg_bytes) = (
        *published(cache, "hot-frames").items(),
        *published(cache, "frames").items(),
    )
    assert rel == jpeg_rel
    frames = sidecar_rows(cache, "hot-frames", rel)
    assert frames * 64 * 96 * 3 <= hot_bytes < frames * 64 * 96 * 3 * 1.1  # raw-sized pixels
    assert jpeg_bytes < hot_bytes / 3
    assert report["hot"] == {"built": 1, "bytes": hot_bytes, "budget_bytes": hot_budget}
    assert report["built"] == 1 and report["bytes"] == jpeg_bytes  # the JPEG segments, reported apart


def test_the_hot_budget_evicts_least_recently_used_hot_segments_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "cams", format="v2.1", episodes=4, seed=71, cameras={TOP_CAMERA: (64, 96)})

    def read(http: httpx.Client, episode: int) -> None:
        params = {"episodes": str(episode), "columns": ",".join([*ROWS, TOP_CAMERA])}
        table = read_stream(http.get("/datasets/cams/rows", params=params).content)
        wanted = jpeg_round_trip(exact(root / "cams", TOP_CAMERA, table))
        assert table.num_rows > 0 and np.array_equal(pixels(table, TOP_CAMERA), wanted), episode

    def hot(cache: Path) -> dict[int, int]:
        """Episode -> bytes of its published hot segment."""
        return {int(Path(rel).stem.rpartition("_")[2]): size for rel, size in published(cache, "hot-frames").items()}

    # The hot segments' sizes, built without a limit.
    unbounded = tmp_path / "unbounded"
    with ServerProcess([root], unbounded, env=ROOMY) as server, server.client() as http:
        for episode in range(4):
            read(http, episode)
        eventually(lambda: len(hot(unbounded)) == 4, 120)
    size = hot(unbounded)
    rels = {int(Path(rel).stem.rpartition("_")[2]): rel for rel in published(unbounded, "hot-frames")}
    # What admission reserves for a segment before it is built: its frames' raw bytes and a little more.
    est = {e: sidecar_rows(unbounded, "hot-frames", rel) * (64 * 96 * 3 + 8) + 64 * 1024 for e, rel in rels.items()}
    # Room for two hot segments and not three: each build past two evicts exactly the least recently used one.
    fits = max(size[0] + est[1], size[0] + est[2], size[2] + est[3])
    overflows = min(size[0] + size[1] + est[2], size[0] + size[2] + est[3])
    assert fits < overflows, size
    budget = (fits + overflows) // 2
    cache = tmp_path / "cache"
    env = JPEG | {"EPISERVE_VIDEO_HOT_BYTES": str(budget), "EPISERVE_VIDEO_HOT_MIN_IDLE_S": "0"}
    steps = [(0, {0}), (1, {0, 1}), (0, {0, 1}), (2, {0, 2}), (3, {2, 3})]  # reading 0 again makes 1 the oldest
    with ServerProcess([root], cache, env=env) as server, server.client() as http:
        for episode, resident in steps:
            time.sleep(1.1)  # a segment's use is recorded at most once a second per process
            read(http, episode)
            eventually(lambda episode=episode: episode in hot(cache), 60)  # built in the background
            assert set(hot(cache)) == resident, episode
            assert sum(hot(cache).values()) <= budget
        eventually(lambda: len(published(cache, "frames")) == 4, 60)
        # Two cold reads back to back queue two builds before either is published: each is admitted again when it
        # starts, against the segments published by then, so the second evicts what the first left.
        read(http, 0)
        read(http, 1)
        eventually(lambda: {0, 1} <= set(hot(cache)), 60)
        assert set(hot(cache)) == {0, 1}
        assert sum(hot(cache).values()) <= budget
        for episode in range(4):  # every answer still right, hot or not (the cold ones queue hot builds again)
            time.sleep(1.1)
            read(http, episode)
            eventually(lambda episode=episode: episode in hot(cache), 60)
            assert sum(hot(cache).values()) <= budget
        assert len(published(cache, "frames")) == 4  # hot eviction never takes a JPEG segment

    # With the default minimum idle time, segments in use are kept: a shuffled read over more files than the hot
    # budget holds leaves the two first hot and the others on their JPEG segments, instead of rebuilding in turn.
    kept = tmp_path / "kept"
    env = JPEG | {"EPISERVE_VIDEO_HOT_BYTES": str(budget)}
    with ServerProcess([root], kept, env=env) as server, server.client() as http:
        for episode in (0, 1):
            read(http, episode)
            eventually(lambda episode=episode: episode in hot(kept), 60)
        for episode in (2, 3, 0, 1, 2, 3):
            read(http, episode)
        eventually(lambda: len(published(kept, "frames")) == 4, 60)  # every file's JPEG segment is built
        for episode in (2, 3):
            read(http, episode)
        assert set(hot(kept)) == {0, 1}


def test_a_client_on_the_same_machine_reads_hot_pixels_by_reference(video_root: Path, tmp_path: Path) -> None:
    columns = [*ROWS, TOP_CAMERA, WRIST_CAMERA]
    cache = tmp_path / "cache"
    indices = [0, 40, 3, 41, 1, 0, 12]
    with ServerProcess([video_root], cache, env=ROOMY) as server:
        with server.client(120) as http:
            params = {"episodes": "0-8", "columns": ",".join(columns)}
            assert http.get("/datasets/cams-v3/rows", params=params).status_code == 200  # every file touched
            eventually(lambda: len(published(cache, "hot-frames")) == 6 and len(published(cache, "frames")) == 6, 120)
            body = {"episodes": [7, 2], "indices": indices, "columns": columns, "frames": "references"}
            referenced = read_stream(http.post("/datasets/cams-v3/rows/take", json=body).content)
            for key in (TOP_CAMERA, WRIST_CAMERA):
                described = orjson.loads(referenced.schema.field(key).metadata[b"episerve.frames"])
                assert "encoding" not in described  # raw pixels: mapped, no decode
                assert all("/hot-frames/" in segment["path"] for segment in described["segments"])
        with episerve.Client(server.url) as remote:
            expected = remote.take("cams-v3", indices, [7, 2], columns)
        local = episerve.Client(server.url, cache_dir=cache)
        pages = local.read_take(episerve.Selection.of("cams-v3", [7, 2], columns), indices)
        assert pages.table.equals(expected)
        assert local.local_frames is not None and local.local_frames._misses == 0  # by reference, no fallback
        local.close()
    for key in (TOP_CAMERA, WRIST_CAMERA):
        assert np.array_equal(pixels(expected, key), jpeg_round_trip(exact(video_root / "cams-v3", key, expected)))


def test_encoded_frames_of_hot_files_are_the_jpeg_tiers_bytes(video_root: Path, tmp_path: Path) -> None:
    """A hot segment holds pixels only: `frames=encoded` sends the JPEG segment's bytes, or, where there is none (a
    video cache budget too small for any), the exact frames encoded once, never the hot pixels encoded again."""
    body = {"episodes": [6], "indices": [0, 8, 2, 8, 11], "columns": [*ROWS, TOP_CAMERA]}
    encoded_body = body | {"frames": "encoded"}
    answers = {}
    for name, env in (("jpeg", ROOMY), ("hot only", ROOMY | {"EPISERVE_VIDEO_CACHE_BYTES": "1"})):
        cache = tmp_path / name.replace(" ", "-")
        with ServerProcess([video_root], cache, env=env) as server, server.client() as http:
            take(http, "cams-v21", body)
            eventually(lambda cache=cache: len(published(cache, "hot-frames")) == 1, 60)
            if name == "jpeg":
                eventually(lambda cache=cache: len(published(cache, "frames")) == 1, 60)
            else:
                assert published(cache, "frames") == {}
            answers[name] = (take(http, "cams-v21", body), take(http, "cams-v21", encoded_body))
    (pixels_jpeg, encoded_jpeg), (pixels_hot, encoded_hot) = answers["jpeg"], answers["hot only"]
    assert encoded_hot[TOP_CAMERA].to_pylist() == encoded_jpeg[TOP_CAMERA].to_pylist()
    assert encoded_hot.schema.field(TOP_CAMERA).metadata[b"episerve.quality"] == f"{QUALITY}:444".encode()
    decoded = np.stack(
        [np.asarray(episerve_decode(data)) for data in encoded_hot[TOP_CAMERA].to_pylist()]  # the client's decode
    )
    assert np.array_equal(decoded, pixels(pixels_hot, TOP_CAMERA))
    assert np.array_equal(pixels(pixels_hot, TOP_CAMERA), pixels(pixels_jpeg, TOP_CAMERA))


def episerve_decode(data: bytes) -> np.ndarray:
    import simplejpeg

    return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)


def _build_hot_frames(root: str, cache: str) -> None:
    """In a fresh process: build the hot segment of the one video file of `long`."""
    settings = Settings(
        roots=[Path(root)],
        cache_dir=Path(cache),
        build_batch_bytes=64 * 1024,
        video_frame_tier=f"jpeg:{QUALITY}",
        video_hot_bytes=10**9,
    )
    dataset = Catalog(settings, [Path(root)]).get("long")
    rel = next(iter(video_files_needed(dataset, None)))[0]
    assert dataset.hot_frames is not None
    dataset.hot_frames.build_now(rel, frame_schema(hot_camera(dataset.source().info.videos[TOP_CAMERA])))


def test_sigkill_during_a_hot_segment_build_leaves_nothing_that_is_served(tmp_path: Path) -> None:
    write_demo_dataset(tmp_path / "data" / "long", format="v3.0", episodes=12, seed=5, video_files=1)
    build = partial(_build_hot_frames, str(tmp_path / "data"))
    cache = killed_mid_frame_build(build, tmp_path, 100_000, store="hot-frames")
    with ServerProcess([tmp_path / "data"], cache, env=ROOMY) as server, server.client() as http:
        body = {"indices": [0, 300, 17, 900], "columns": [*ROWS, TOP_CAMERA]}
        for _ in ("decoded on demand", "from the rebuilt hot segment"):
            table = take(http, "long", body)
            reference = exact(tmp_path / "data" / "long", TOP_CAMERA, table)
            assert np.array_equal(pixels(table, TOP_CAMERA), jpeg_round_trip(reference))
            eventually(lambda: len(published(cache, "hot-frames")) == 1, 120)
        eventually(lambda: len(published(cache, "frames")) == 1, 120)  # the JPEG segment, queued after it
    assert list(cache.rglob("*.tmp")) == []


@pytest.mark.parametrize("value", ["-1", "lots", "1.5"])
def test_a_bad_hot_budget_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="video_hot_bytes"):
        Settings(video_hot_bytes=value)


def _long_dataset(data: Path, cache: Path, episodes: int, **settings: Any) -> tuple[Dataset, str]:
    """The JPEG-tier dataset `long` (one video file) with a hot layer, opened in this process, and its video file."""
    if not (data / "long").exists():
        write_demo_dataset(data / "long", format="v3.0", episodes=episodes, seed=5, video_files=1)
    tier = {"video_frame_tier": f"jpeg:{QUALITY}", "video_hot_bytes": 10**9}
    dataset = Catalog(Settings(roots=[data], cache_dir=cache, **tier, **settings), [data]).get("long")
    assert dataset.hot_frames is not None
    return dataset, next(iter(video_files_needed(dataset, None)))[0]  # the index loaded


def _video_opens(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every open of a video container from now on (PyAV's `av.open`, counted, then called)."""
    import av

    opened: list[object] = []
    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *args, **kwargs: opened.append(args) or real_open(*args, **kwargs))
    return opened


def test_a_video_file_fingerprinted_by_the_hot_layer_is_not_opened_again_for_the_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quick read's ETag fingerprints its video files through the tier's store, on the event loop: a file the hot
    layer already fingerprinted comes from memory (a stat), not from another open of its container."""
    dataset, rel = _long_dataset(tmp_path / "data", tmp_path / "cache", episodes=4)
    assert dataset.hot_frames is not None
    opened = _video_opens(monkeypatch)
    seen_by_the_hot_layer = dataset.hot_frames.file_fingerprint(rel)
    assert len(opened) == 1  # the hot layer's first look at the file
    assert dataset.frames.file_fingerprint(rel) is seen_by_the_hot_layer
    assert len(opened) == 1
    (tmp_path / "data" / "long" / rel).touch()  # a change: both stores look again, once
    assert dataset.frames.file_fingerprint(rel) is dataset.hot_frames.file_fingerprint(rel) != seen_by_the_hot_layer
    assert len(opened) == 2


def test_a_hot_segment_is_made_from_the_built_jpeg_segment_without_the_video_and_equals_one_made_from_the_video(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the file's JPEG segment built, its hot segment decodes the stored JPEGs (no video opened, no encode);
    without it, the hot segment comes from the video's frames through the round trip. Both hold the same pixels."""
    small = {"build_batch_bytes": 64 * 1024}  # several hot batches per JPEG segment batch
    from_jpeg, rel = _long_dataset(tmp_path / "data", tmp_path / "cache-a", episodes=6, **small)
    from_video, same = _long_dataset(tmp_path / "data", tmp_path / "cache-b", episodes=6, **small)
    assert same == rel
    camera = from_jpeg.source().info.videos[TOP_CAMERA]
    assert from_jpeg.hot_frames is not None and from_video.hot_frames is not None
    assert from_jpeg.frames.build_now(rel, frame_schema(camera)) is not None
    opened = _video_opens(monkeypatch)
    hot = from_jpeg.hot_frames.build_now(rel, frame_schema(hot_camera(camera)))
    assert opened == []  # made from the JPEG segment
    reference = from_video.hot_frames.build_now(rel, frame_schema(hot_camera(camera)))
    assert opened  # no JPEG segment in this cache: made from the video
    assert hot is not None and reference is not None
    made = pa.Table.from_batches(hot.projected(None))
    assert made.num_rows == reference.num_rows == sidecar_rows(tmp_path / "cache-a", "hot-frames", rel)
    assert made.equals(pa.Table.from_batches(reference.projected(None)), check_metadata=True)
    assert len(hot.projected(None)) == len(reference.projected(None))  # batches of the build's size either way


@pytest.mark.parametrize("damage", ["a byte changed", "truncated"])
def test_a_jpeg_segment_damaged_since_it_was_built_is_not_copied_into_the_hot_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """A hot segment is made from the JPEG segment only once the whole file matches its checksum: a damaged one
    (even one this process has mapped, which it trusts) leaves the hot segment to the video, with the right
    pixels."""
    dataset, rel = _long_dataset(tmp_path / "data", tmp_path / "cache", episodes=6)
    camera = dataset.source().info.videos[TOP_CAMERA]
    assert dataset.hot_frames is not None
    kept = dataset.frames.build_now(rel, frame_schema(camera))
    assert kept is not None
    with open(kept.path, "r+b") as file:
        if damage == "truncated":
            file.truncate(kept.path.stat().st_size // 2)
        else:
            file.seek(kept.path.stat().st_size // 2)
            byte = file.read(1)
            file.seek(-1, 1)
            file.write(bytes([byte[0] ^ 0x10]))
    opened = _video_opens(monkeypatch)
    hot = dataset.hot_frames.build_now(rel, frame_schema(hot_camera(camera)))
    assert hot is not None and opened  # made from the video
    table = pa.Table.from_batches(hot.projected(None))
    frames = np.asarray(table.column("frame").combine_chunks().values).reshape(len(table), *camera.shape)
    _, every_frame = decode_video(tmp_path / "data" / "long" / rel)  # the oracle's own decode of the MP4
    assert np.array_equal(frames, jpeg_round_trip(every_frame))


def test_a_first_touch_builds_the_jpeg_segment_before_the_hot_one_which_is_then_made_from_it(
    video_root: Path, tmp_path: Path
) -> None:
    """One build at a time, in the order queued: a first read of a cold file queues its JPEG segment first, so its
    hot segment is made from the JPEG segment (a decode of stored JPEGs) rather than from the video."""
    cache = tmp_path / "cache"
    body = {"episodes": [5], "indices": [0, 9, 3], "columns": [*ROWS, TOP_CAMERA]}
    with ServerProcess([video_root], cache, env=ROOMY) as server, server.client() as http:
        cold = take(http, "cams-v21", body)  # decoded on demand; both builds queued
        eventually(lambda: len(published(cache, "hot-frames")) == len(published(cache, "frames")) == 1, 60)
        hot = take(http, "cams-v21", body)
    sidecars = {store: next(cache.rglob(f"{store}/*.json")) for store in ("frames", "hot-frames")}
    built = {store: orjson.loads(path.read_bytes()) for store, path in sidecars.items()}
    assert built["frames"]["source"] == built["hot-frames"]["source"]
    assert sidecars["frames"].stat().st_mtime_ns <= sidecars["hot-frames"].stat().st_mtime_ns
    assert np.array_equal(pixels(hot, TOP_CAMERA), pixels(cold, TOP_CAMERA))
