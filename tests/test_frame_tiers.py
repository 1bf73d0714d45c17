"""Frame tiers and encoded frames on the wire, against real servers: the JPEG tier's frames equal an independent
JPEG round trip (simplejpeg, accurate DCT) of the reference frames decoded from the MP4s (tests/video_oracle.py),
cold (decoded on demand) and from its built segments alike; its segments are a fraction of raw; `frames=encoded`
sends JPEG bytes the client decodes to the same pixels, through a DataLoader with workers; bad values are problems."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest
import simplejpeg

import episerve
from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from app.reads.frames import video_files_needed
from app.reads.tier_psnr import SAMPLE_FRAMES
from app.settings import Settings
from app.sources.video import frame_schema
from app.store.catalog import Catalog
from tests.support import ServerProcess, eventually, killed_mid_frame_build, read_stream
from tests.video_oracle import frames_for_rows

ROWS = ["episode_index", "frame_index"]
QUALITY = 90
TAKE = {"episodes": [7, 2], "indices": [0, 40, 3, 41, 1, 0, 12], "columns": [*ROWS, TOP_CAMERA, WRIST_CAMERA]}


def jpeg_round_trip(frames: np.ndarray, quality: int = QUALITY, subsampling: str = "444") -> np.ndarray:
    """The oracle of the JPEG tier: each frame encoded and decoded by libjpeg-turbo, as the tier states it."""
    out = np.empty_like(frames)
    for i, frame in enumerate(frames):
        data = simplejpeg.encode_jpeg(frame, quality=quality, colorspace="RGB", colorsubsampling=subsampling)
        out[i] = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)
    return out


def exact(root: Path, key: str, table: pa.Table) -> np.ndarray:
    rows = zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True)
    return frames_for_rows(root, key, rows)


def pixels(table: pa.Table, key: str) -> np.ndarray:
    return table[key].combine_chunks().to_numpy_ndarray()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def sampled_psnr(root: Path, key: str) -> float:
    """The PSNR `/datasets/<id>` states for a JPEG-tier camera: over the first `SAMPLE_FRAMES` frames of episode 0,
    the tier's round trip against the exact frames."""
    reference = frames_for_rows(root, key, [(0, i) for i in range(SAMPLE_FRAMES)])
    return psnr(jpeg_round_trip(reference), reference)


def frame_bytes(table: pa.Table) -> int:
    """Bytes of one frame of the top camera in `table`."""
    return int(np.prod(table.schema.field(TOP_CAMERA).type.shape))


def frame_segment_bytes(cache: Path) -> dict[str, int]:
    """Video file -> bytes of its published frame segment."""
    return {
        orjson.loads(p.read_bytes())["source"]["path"]: p.with_suffix(".arrow").stat().st_size
        for p in cache.rglob("frames/*.json")
    }


@pytest.fixture(scope="module")
def jpeg_server(video_root: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    env = {"EPISERVE_VIDEO_FRAME_TIER": f"jpeg:{QUALITY},cams-v21=raw"}
    with ServerProcess([video_root], tmp_path_factory.mktemp("cache"), env=env) as running:
        yield running


def test_the_jpeg_tier_serves_the_same_round_tripped_frames_cold_and_from_its_segments(
    jpeg_server: ServerProcess, video_root: Path
) -> None:
    root = video_root / "cams-v3"
    with httpx.Client(base_url=jpeg_server.url, timeout=60) as http:
        described = {c["name"]: c for c in http.get("/datasets/cams-v3").json()["columns"]}
        assert described[TOP_CAMERA]["frames"] == {
            "tier": "jpeg",
            "lossy": True,
            "quality": QUALITY,
            "chroma_subsampling": "444",
            "psnr_db": pytest.approx(sampled_psnr(root, TOP_CAMERA), abs=0.006),
            "psnr_frames": SAMPLE_FRAMES,
        }
        assert {c["name"]: c for c in http.get("/datasets/cams-v21").json()["columns"]}[TOP_CAMERA]["frames"] == {
            "tier": "raw",
            "lossy": False,
        }
        cold = read_stream(http.post("/datasets/cams-v3/rows/take", json=TAKE).content)
        rows_only = read_stream(http.post("/datasets/cams-v3/rows/take", json=TAKE | {"columns": ROWS}).content)
        assert cold.select(ROWS).equals(rows_only)
        for key in (TOP_CAMERA, WRIST_CAMERA):
            reference = exact(root, key, cold)
            assert np.array_equal(pixels(cold, key), jpeg_round_trip(reference))
            assert psnr(pixels(cold, key), reference) >= 30  # lossy, stated, and close
        eventually(lambda: len(frame_segment_bytes(jpeg_server.cache_dir)) >= 2, 120)  # built in the background
        warm = read_stream(http.post("/datasets/cams-v3/rows/take", json=TAKE).content)
        for key in (TOP_CAMERA, WRIST_CAMERA):
            assert np.array_equal(pixels(warm, key), pixels(cold, key))
        # A take of more frames than a piece holds is decoded piece by piece, so chunked: with the length a client
        # sizes its buffer by, a little over.
        repeats = 8 * 2**20 // (len(TAKE["indices"]) * frame_bytes(warm)) + 1
        many = TAKE | {"indices": TAKE["indices"] * repeats, "columns": [TOP_CAMERA]}
        answer = http.post("/datasets/cams-v3/rows/take", json=many)
        assert answer.headers["transfer-encoding"] == "chunked"
        expected = int(answer.headers["x-expected-length"])
        assert len(answer.content) <= expected <= 1.1 * len(answer.content) + 64 * 1024
        first = pixels(read_stream(answer.content), TOP_CAMERA)[: len(TAKE["indices"])]
        assert np.array_equal(first, pixels(warm, TOP_CAMERA))
        # A slice reads them too, in view order.
        params = {"episodes": "7", "columns": ",".join([*ROWS, TOP_CAMERA]), "stop": "10"}
        sliced = read_stream(http.get("/datasets/cams-v3/rows", params=params).content)
        assert sliced["frame_index"].to_pylist() == list(range(10))
        assert np.array_equal(pixels(sliced, TOP_CAMERA), jpeg_round_trip(exact(root, TOP_CAMERA, sliced)))


def test_jpeg_segments_are_a_fraction_of_raw_frames(jpeg_server: ServerProcess, video_root: Path) -> None:
    with httpx.Client(base_url=jpeg_server.url, timeout=120) as http:
        params = {"episodes": "0-8", "columns": f"frame_index,{TOP_CAMERA},{WRIST_CAMERA}"}
        everything = http.get("/datasets/cams-v3/rows", params=params)  # touches every video file: all are built
        assert everything.status_code == 200, everything.text
    eventually(lambda: len(frame_segment_bytes(jpeg_server.cache_dir)) >= 6, 120)  # 3 files x 2 cameras
    sizes = frame_segment_bytes(jpeg_server.cache_dir)
    info = orjson.loads((video_root / "cams-v3/meta/info.json").read_bytes())
    for rel, nbytes in sizes.items():
        key = TOP_CAMERA if TOP_CAMERA in rel else WRIST_CAMERA
        height, width, channels = info["features"][key]["shape"]
        sidecar = next(
            p
            for p in jpeg_server.cache_dir.rglob("frames/*.json")
            if orjson.loads(p.read_bytes())["source"]["path"] == rel
        )
        frames = orjson.loads(sidecar.read_bytes())["rows"]
        assert nbytes < frames * height * width * channels / 3, (rel, nbytes, frames)
    with httpx.Client(base_url=jpeg_server.url, timeout=120) as http:
        report = http.get("/datasets/cams-v3/cache").json()
        assert "frame_segments" in report, report
        status = report["frame_segments"]
    projected = status["projected"]
    assert status["built"] == len(sizes) and status["bytes"] == sum(sizes.values())
    assert projected["tiers"] == [f"jpeg:{QUALITY}:444"] and projected["estimated"] is True
    assert projected["frames_per_camera"] == info["total_frames"]
    assert sum(sizes.values()) <= projected["bytes"] < projected["raw_bytes"]  # a generous estimate, below raw
    assert projected["fits_budget"] is True and "note" not in projected


def test_encoded_frames_on_the_wire_are_the_tiers_bytes_or_a_jpeg_of_exact_frames(
    jpeg_server: ServerProcess, video_root: Path
) -> None:
    with httpx.Client(base_url=jpeg_server.url, timeout=60) as http:
        for name in ("cams-v3", "cams-v21"):  # the JPEG tier, and raw frames encoded for the wire
            asked = read_stream(http.post(f"/datasets/{name}/rows/take", json=TAKE).content)
            answer = http.post(f"/datasets/{name}/rows/take", json=TAKE | {"frames": "encoded"})
            assert answer.status_code == 200, answer.text
            encoded = read_stream(answer.content)
            assert encoded["frame_index"].to_pylist() == asked["frame_index"].to_pylist()
            for key in (TOP_CAMERA, WRIST_CAMERA):
                field = encoded.schema.field(key)
                assert field.type == pa.binary()
                assert field.metadata[b"episerve.encoding"] == b"jpeg"
                shape = orjson.loads(field.metadata[b"shape"])
                decoded = np.stack(
                    [
                        simplejpeg.decode_jpeg(b, colorspace="RGB", fastdct=False, fastupsample=False)
                        for b in encoded[key].to_pylist()
                    ]
                )
                assert list(decoded.shape[1:]) == shape
                if name == "cams-v3":  # the bytes the tier keeps: exactly the pixels it serves
                    assert field.metadata[b"episerve.quality"] == f"{QUALITY}:444".encode()
                    assert np.array_equal(decoded, pixels(asked, key))
                else:  # raw frames, encoded at quality 95 for the wire
                    assert field.metadata[b"episerve.quality"] == b"95:420"
                    assert np.array_equal(pixels(asked, key), exact(video_root / name, key, asked))
                    assert psnr(decoded, pixels(asked, key)) >= 35
            # A slice asks for them in its query.
            query = {"episodes": "2", "columns": f"frame_index,{TOP_CAMERA}", "stop": "3", "frames": "encoded"}
            sliced = read_stream(http.get(f"/datasets/{name}/rows", params=query).content)
            assert sliced.schema.field(TOP_CAMERA).type == pa.binary() and sliced.num_rows == 3
            # An empty answer has the same schema.
            empty = read_stream(
                http.post(f"/datasets/{name}/rows/take", json=TAKE | {"indices": [], "frames": "encoded"}).content
            )
            assert empty.num_rows == 0 and empty.schema.field(TOP_CAMERA).type == pa.binary()


def test_bad_frames_values_are_problems(jpeg_server: ServerProcess) -> None:
    with httpx.Client(base_url=jpeg_server.url, timeout=60) as http:
        bad = http.post("/datasets/cams-v3/rows/take", json=TAKE | {"frames": "jpeg"})
        assert bad.status_code == 422 and "frames" in bad.json()["detail"]
        bad = http.get("/datasets/cams-v3/rows", params={"frames": "references"})  # takes only
        assert bad.status_code == 422 and "frames" in bad.json()["detail"]
        assert bad.headers["content-type"].startswith("application/problem+json")
        # Windowed cameras come as pixels, the others encoded.
        windows = {TOP_CAMERA: [-0.1, 0.0]}
        mixed = http.post("/datasets/cams-v3/rows/take", json=TAKE | {"frames": "encoded", "delta_timestamps": windows})
        assert mixed.status_code == 200, mixed.text
        table = read_stream(mixed.content)
        pixels_only = read_stream(
            http.post("/datasets/cams-v3/rows/take", json=TAKE | {"delta_timestamps": windows}).content
        )
        assert table.column(TOP_CAMERA).equals(pixels_only.column(TOP_CAMERA))
        assert table.schema.field(WRIST_CAMERA).type == pa.binary()


def test_the_client_decodes_encoded_frames_in_dataloader_workers(jpeg_server: ServerProcess) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    columns = ["episode_index", "frame_index", TOP_CAMERA]
    with episerve.Client(jpeg_server.url) as client:
        expected = client.take("cams-v3", list(range(64)), episodes="0-8", columns=columns)
    dataset = episerve.EpisodeDataset(
        episerve.Client(jpeg_server.url, frames="encoded"), "cams-v3", episodes="0-8", columns=columns
    )
    loader = DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=episerve.collate)
    seen = [batch for _, batch in zip(range(4), loader, strict=False)]
    frames = torch.cat([batch[TOP_CAMERA] for batch in seen]).numpy()
    reference = pixels(expected, TOP_CAMERA)[: len(frames)].transpose(0, 3, 1, 2)  # channels-first, as LeRobot
    assert frames.shape == reference.shape and frames.dtype == np.uint8
    assert np.array_equal(frames, reference)
    assert (
        torch.cat([batch["frame_index"] for batch in seen]).tolist()
        == expected["frame_index"].to_pylist()[: len(frames)]
    )
    with pytest.raises(ValueError, match="frames must be one of"):
        episerve.Client(jpeg_server.url, frames="png")


def test_jpeg_frames_reach_the_batch_undecoded_and_decode_jpeg_gives_the_tiers_pixels(
    jpeg_server: ServerProcess, video_root: Path
) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from episerve.lerobot import RemoteLeRobotDataset

    columns = ["episode_index", "frame_index", TOP_CAMERA]
    with episerve.Client(jpeg_server.url) as client:
        expected = client.take("cams-v3", list(range(48)), episodes="0-8", columns=columns)
    # Through DataLoader workers, and from a client that could read the segments by reference: over HTTP, as bytes.
    undecoded = episerve.Client(jpeg_server.url, frames="jpeg", cache_dir=jpeg_server.cache_dir)
    dataset = episerve.EpisodeDataset(undecoded, "cams-v3", episodes="0-8", columns=columns)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=episerve.collate)
    seen = [batch for _, batch in zip(range(3), loader, strict=False)]
    for batch in seen:
        assert isinstance(batch[TOP_CAMERA], list) and len(batch[TOP_CAMERA]) == 16
        assert all(isinstance(data, bytes) and data[:2] == b"\xff\xd8" for data in batch[TOP_CAMERA])  # JPEG SOI
    frames = torch.cat([episerve.decode_jpeg(batch[TOP_CAMERA]) for batch in seen])
    reference = pixels(expected, TOP_CAMERA).transpose(0, 3, 1, 2)  # channels-first, as LeRobot
    assert frames.dtype == torch.uint8 and frames.is_contiguous()
    assert np.array_equal(frames.numpy(), reference)
    assert torch.cat([batch["frame_index"] for batch in seen]).tolist() == expected["frame_index"].to_pylist()
    # The same bytes as a take of the tier's encoded frames; a raw-tier dataset's are a JPEG of the exact frames.
    taken = undecoded.take("cams-v3", [5, 1], episodes="0-8", columns=[TOP_CAMERA])
    with httpx.Client(base_url=jpeg_server.url, timeout=60) as http:
        body = {"indices": [5, 1], "episodes": "0-8", "columns": [TOP_CAMERA], "frames": "encoded"}
        wire = read_stream(http.post("/datasets/cams-v3/rows/take", json=body).content)
    assert taken[TOP_CAMERA].to_pylist() == wire[TOP_CAMERA].to_pylist()
    raw = undecoded.take("cams-v21", [0, 9], columns=[*ROWS, TOP_CAMERA])
    decoded = episerve.decode_jpeg(raw[TOP_CAMERA].to_pylist()).numpy().transpose(0, 2, 3, 1)
    assert psnr(decoded, exact(video_root / "cams-v21", TOP_CAMERA, raw)) >= 35
    # Streamed in chunks by the iterable dataset: the same.
    streamed = episerve.EpisodeIterableDataset(undecoded, "cams-v3", episodes="0-1", columns=columns, chunk_rows=40)
    chunks = list(DataLoader(streamed, batch_size=16, num_workers=2, collate_fn=episerve.collate))
    with episerve.Client(jpeg_server.url) as client:
        whole = client.rows("cams-v3", episodes="0-1", columns=columns)
    position_of = {
        (episode, frame): n
        for n, (episode, frame) in enumerate(
            zip(whole["episode_index"].to_pylist(), whole["frame_index"].to_pylist(), strict=True)
        )
    }
    for batch in chunks:
        assert all(isinstance(data, bytes) for data in batch[TOP_CAMERA])
        decoded_chunk = episerve.decode_jpeg(batch[TOP_CAMERA]).numpy().transpose(0, 2, 3, 1)
        rows_read = zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
        positions = [position_of[row] for row in rows_read]
        assert np.array_equal(decoded_chunk, pixels(whole, TOP_CAMERA)[positions])
    assert sum(len(batch[TOP_CAMERA]) for batch in chunks) == whole.num_rows
    # A mixture of both tiers' datasets: the same pixels as its batches with frames decoded in the workers.
    mixture = episerve.Mixture([{"dataset": "cams-v3", "weight": 2}, {"dataset": "cams-v21", "weight": 1}])
    mixed = {}
    for frames in ("encoded", "jpeg"):
        sampled = episerve.MixtureDataset(
            episerve.Client(jpeg_server.url, frames=frames), mixture, columns=[TOP_CAMERA], epoch_size=48, seed=5
        )
        batches = list(DataLoader(sampled, batch_size=16, num_workers=2, collate_fn=episerve.collate))
        mixed[frames] = [batch[TOP_CAMERA] for batch in batches]
    assert all(isinstance(frames, list) for frames in mixed["jpeg"])
    decoded_mixture = torch.cat([episerve.decode_jpeg(frames) for frames in mixed["jpeg"]])
    assert torch.equal(decoded_mixture, torch.cat(mixed["encoded"]))
    # Clear errors: LeRobot's samples need pixels, frames must be there, CUDA must be.
    with pytest.raises(ValueError, match="frames='encoded'"):
        RemoteLeRobotDataset(episerve.Client(jpeg_server.url, frames="jpeg"), "cams-v3")
    with pytest.raises(episerve.EpiserveError, match="row 1 came without a frame"):
        episerve.decode_jpeg([taken[TOP_CAMERA][0].as_py(), None])
    if not torch.cuda.is_available():
        with pytest.raises(episerve.EpiserveError, match="no CUDA device"):
            episerve.decode_jpeg(taken[TOP_CAMERA].to_pylist(), device="cuda")
    assert episerve.decode_jpeg([]).shape == (0,)
    undecoded.close()


def test_a_tier_switch_on_a_warm_cache_serves_the_new_tier_never_the_old_frames(
    video_root: Path, tmp_path: Path
) -> None:
    root, cache = video_root / "cams-v21", tmp_path / "cache"
    body = {"episodes": [4], "indices": [0, 5, 9, 2], "columns": [*ROWS, TOP_CAMERA]}
    settings = [("raw", None), (f"jpeg:{QUALITY}", QUALITY), ("jpeg:100:444", 100), ("raw", None)]
    sizes: list[int] = []

    def rebuilt() -> bool:  # the segment of the tier now set is published (its size differs from the last tier's)
        now = list(frame_segment_bytes(cache).values())
        return len(now) == 1 and (not sizes or now[0] != sizes[-1])

    for tier, quality in settings:
        env = {"EPISERVE_VIDEO_FRAME_TIER": tier}
        with ServerProcess([video_root], cache, env=env) as server, server.client() as http:
            for _ in ("first read", "from the segment built for it"):
                table = read_stream(http.post("/datasets/cams-v21/rows/take", json=body).content)
                reference = exact(root, TOP_CAMERA, table)
                wanted = reference if quality is None else jpeg_round_trip(reference, quality)
                assert np.array_equal(pixels(table, TOP_CAMERA), wanted), tier
                eventually(rebuilt, 60)
            sizes.append(next(iter(frame_segment_bytes(cache).values())))
    raw, jpeg90, jpeg100, raw_again = sizes
    assert jpeg90 < jpeg100 < raw == raw_again


def _build_jpeg_frames(root: str, cache: str) -> None:
    """In a fresh process: read every frame of the one video file of `long`, which builds its JPEG segment."""
    settings = Settings(
        roots=[Path(root)], cache_dir=Path(cache), build_batch_bytes=64 * 1024, video_frame_tier="jpeg:90"
    )
    dataset = Catalog(settings, [Path(root)]).get("long")
    rel = next(iter(video_files_needed(dataset, None)))[0]
    dataset.frames.build_now(rel, frame_schema(dataset.source().info.videos[TOP_CAMERA]))


def test_sigkill_during_a_jpeg_segment_build_leaves_nothing_that_is_served(tmp_path: Path) -> None:
    write_demo_dataset(tmp_path / "data" / "long", format="v3.0", episodes=12, seed=5, video_files=1)
    cache = killed_mid_frame_build(partial(_build_jpeg_frames, str(tmp_path / "data")), tmp_path, 20_000)
    env = {"EPISERVE_VIDEO_FRAME_TIER": "jpeg:90"}
    with ServerProcess([tmp_path / "data"], cache, env=env) as server, server.client() as http:
        body = {"indices": [0, 300, 17, 900], "columns": [*ROWS, TOP_CAMERA]}
        for _ in ("decoded on demand", "from the rebuilt segment"):
            table = read_stream(http.post("/datasets/long/rows/take", json=body).content)
            reference = exact(tmp_path / "data" / "long", TOP_CAMERA, table)
            assert np.array_equal(pixels(table, TOP_CAMERA), jpeg_round_trip(reference))
            eventually(lambda: len(frame_segment_bytes(cache)) == 1, 120)
    assert list(cache.rglob("*.tmp")) == []


def test_a_client_on_the_same_machine_reads_jpeg_segments_by_reference(jpeg_server: ServerProcess) -> None:
    columns = [*ROWS, TOP_CAMERA]
    with httpx.Client(base_url=jpeg_server.url, timeout=120) as http:
        params = {"episodes": "0-8", "columns": ",".join(columns)}
        assert http.get("/datasets/cams-v3/rows", params=params).status_code == 200  # every file touched: built
        eventually(lambda: len(frame_segment_bytes(jpeg_server.cache_dir)) >= 3, 120)
        referenced = http.post("/datasets/cams-v3/rows/take", json=TAKE | {"columns": columns, "frames": "references"})
        field = read_stream(referenced.content).schema.field(TOP_CAMERA)
        assert orjson.loads(field.metadata[b"episerve.frames"])["encoding"] == "jpeg"
    indices = [0, 40, 3, 41, 1, 0, 12]
    with episerve.Client(jpeg_server.url) as remote:
        expected = remote.take("cams-v3", indices, [7, 2], columns)
    local = episerve.Client(jpeg_server.url, cache_dir=jpeg_server.cache_dir)
    pages = local.read_take(episerve.Selection.of("cams-v3", [7, 2], columns), indices)
    assert pages.table.equals(expected)
    assert local.local_frames is not None and local.local_frames._misses == 0  # read by reference, no fallback
    local.close()


def test_encoded_frames_are_the_servers_encoding_on_the_same_machine_too(jpeg_server: ServerProcess) -> None:
    """A raw tier's segments hold exact frames: a client with `cache_dir` asking for encoded frames still gets the
    JPEG the server encodes, by take and by slice, the same as over HTTP alone."""
    columns, indices = [*ROWS, TOP_CAMERA], list(range(10))
    body = {"indices": indices, "episodes": "0-1", "columns": columns, "frames": "references"}
    with httpx.Client(base_url=jpeg_server.url, timeout=120) as http:
        http.get("/datasets/cams-v21/rows", params={"episodes": "0-1", "columns": ",".join(columns)})  # builds

        def referable() -> bool:
            field = read_stream(http.post("/datasets/cams-v21/rows/take", json=body).content).schema.field(TOP_CAMERA)
            return field.metadata is not None and b"episerve.frames" in field.metadata

        eventually(referable, 120)
    with episerve.Client(jpeg_server.url, frames="encoded") as over_http:
        expected = over_http.take("cams-v21", indices, episodes="0-1", columns=columns)
    with episerve.Client(jpeg_server.url, frames="encoded", cache_dir=jpeg_server.cache_dir) as local:
        assert local.take("cams-v21", indices, episodes="0-1", columns=columns).equals(expected)
        assert local.rows("cams-v21", episodes="0-1", columns=columns).slice(0, len(indices)).equals(expected)
    with episerve.Client(jpeg_server.url) as exact_frames:
        assert not exact_frames.take("cams-v21", indices, episodes="0-1", columns=columns).equals(expected)


def test_encoded_frames_are_the_same_bytes_cold_and_from_the_jpeg_segments(video_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    body = {"episodes": [3], "indices": [0, 7, 2, 7], "columns": [*ROWS, TOP_CAMERA], "frames": "encoded"}
    env = {"EPISERVE_VIDEO_FRAME_TIER": f"jpeg:{QUALITY}"}
    with ServerProcess([video_root], cache, env=env) as server, server.client() as http:
        cold = read_stream(http.post("/datasets/cams-v21/rows/take", json=body).content)  # decoded on demand
        eventually(lambda: len(frame_segment_bytes(cache)) == 1, 60)
        warm = read_stream(http.post("/datasets/cams-v21/rows/take", json=body).content)  # the segment's bytes
        # Rows of a built file and of one not built yet in one answer: each frame still the bytes the tier keeps
        # (never a JPEG of the built file's decoded JPEGs).
        query = {"episodes": "3,5", "columns": f"frame_index,{TOP_CAMERA}", "frames": "encoded"}
        half_built = read_stream(http.get("/datasets/cams-v21/rows", params=query).content)
        eventually(lambda: len(frame_segment_bytes(cache)) == 2, 60)
        built = read_stream(http.get("/datasets/cams-v21/rows", params=query).content)
    assert cold[TOP_CAMERA].to_pylist() == warm[TOP_CAMERA].to_pylist()
    assert cold.schema.field(TOP_CAMERA).metadata == warm.schema.field(TOP_CAMERA).metadata
    assert half_built.num_rows == built.num_rows > 0
    assert half_built[TOP_CAMERA].to_pylist() == built[TOP_CAMERA].to_pylist()


def test_segments_of_both_tiers_are_evicted_least_recently_used_first_under_one_budget(tmp_path: Path) -> None:
    """A raw and a JPEG dataset share one video cache budget: a raw build evicts the JPEG segment used least
    recently (not the raw one used after it), a JPEG build evicts the raw segment used least recently; the budget
    holds throughout and every answer equals its oracle, exact or round-tripped, wherever its frames come from."""
    root = tmp_path / "root"
    for name, seed in (("raw-cams", 61), ("jpeg-cams", 62)):  # one camera, one file per episode
        write_demo_dataset(root / name, format="v2.1", episodes=3, seed=seed, cameras={TOP_CAMERA: (64, 96)})
    files = [(name, episode) for name in ("raw-cams", "jpeg-cams") for episode in range(3)]
    tiers = {"EPISERVE_VIDEO_FRAME_TIER": "jpeg:100,raw-cams=raw"}

    def read(http: httpx.Client, name: str, episode: int) -> None:
        params = {"episodes": str(episode), "columns": ",".join([*ROWS, TOP_CAMERA])}
        table = read_stream(http.get(f"/datasets/{name}/rows", params=params).content)
        reference = exact(root / name, TOP_CAMERA, table)
        wanted = reference if name == "raw-cams" else jpeg_round_trip(reference, 100)
        assert table.num_rows > 0 and np.array_equal(pixels(table, TOP_CAMERA), wanted), (name, episode)

    def resident(cache: Path) -> dict[tuple[str, int], int]:
        """(dataset, episode) -> bytes, of every published frame segment."""
        found = {}
        for sidecar in cache.rglob("frames/*.json"):
            name = sidecar.parent.parent.name.rpartition("-")[0]  # the directory is NAME-HASH
            path = orjson.loads(sidecar.read_bytes())["source"]["path"]  # .../episode_000002.mp4
            found[name, int(Path(path).stem.rpartition("_")[2])] = sidecar.with_suffix(".arrow").stat().st_size
        return found

    # The segments' sizes, built without a budget.
    unbounded = tmp_path / "unbounded"
    with ServerProcess([root], unbounded, env=tiers) as server, server.client() as http:
        for key in files:
            read(http, *key)
        eventually(lambda: len(resident(unbounded)) == len(files), 120)
    size = resident(unbounded)
    raw0, raw1, raw2 = (size["raw-cams", e] for e in range(3))
    jpeg0, jpeg1 = size["jpeg-cams", 0], size["jpeg-cams", 1]
    assert max(jpeg0, jpeg1) < min(raw0, raw1, raw2) / 2  # the JPEG tier keeps a fraction of raw
    # Room for raw 0, JPEG 1 and raw 1 with a margin below what JPEG 0 (or JPEG 2, estimated at a quarter of raw
    # above quality 95) would add: each build past it evicts exactly one segment.
    budget = raw0 + jpeg1 + raw1 + min(jpeg0, raw2 // 4) // 2
    uses = [
        (("jpeg-cams", 0), set()),
        (("raw-cams", 0), set()),
        (("jpeg-cams", 1), set()),
        (("raw-cams", 1), {("jpeg-cams", 0)}),  # a raw build evicts the least recently used: a JPEG segment
        (("jpeg-cams", 2), {("jpeg-cams", 0), ("raw-cams", 0)}),  # a JPEG build evicts a raw one
    ]
    cache = tmp_path / "cache"
    env = tiers | {"EPISERVE_VIDEO_CACHE_BYTES": str(budget)}
    with ServerProcess([root], cache, env=env) as server, server.client() as http:
        for step, (key, evicted) in enumerate(uses):
            read(http, *key)
            eventually(lambda key=key: key in resident(cache), 60)  # built in the background
            used_so_far = {k for k, _ in uses[: step + 1]}
            assert set(resident(cache)) == used_so_far - evicted, key
            assert sum(resident(cache).values()) <= budget
            time.sleep(0.05)  # distinct modification times: the order of use is the order of reads
        for key, _ in uses:  # every answer is still right, from a segment or decoded again
            read(http, *key)
