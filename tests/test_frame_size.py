"""Camera frames at a size asked per request (`frame_size`): equal to an area resize of the decoded frames (an
independent PyAV decode, tests/video_oracle.py) in takes, slices and windows, from warmed and cold videos alike;
the served size still comes from the decoded-frame cache, other sizes never build or read it; frames by reference
fall back to pixels at the size asked; bad sizes are 422 problems; and the client's datasets ask for it."""

from __future__ import annotations

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
from tests.support import ServerProcess, eventually, oracle, read_stream
from tests.test_errors import assert_problem
from tests.test_operations import run_cli
from tests.test_video_cache import frame_segments
from tests.video_oracle import episode_video, frames_for_rows

ROWS = ["episode_index", "frame_index"]
SMALL = (24, 40)  # smaller than both cameras (64x96 and 48x64), of another aspect


@pytest.fixture(scope="module")
def warmed(video_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose `cams-v3` frames all lie in decoded-frame segments, while `cams-v21` is decoded on demand
    (the `warmed` policy reads segments only where `warm` built them)."""
    cache = tmp_path_factory.mktemp("frame-size") / "cache"
    assert run_cli("warm", "cams-v3", "--videos", "--root", str(video_root), "--cache-dir", str(cache)).returncode == 0
    with ServerProcess([video_root], cache, env={"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}) as server:
        yield server


@pytest.fixture
def http(warmed: ServerProcess) -> Iterator[httpx.Client]:
    with warmed.client() as client:
        yield client


def frames(table: pa.Table, key: str) -> np.ndarray:
    return table[key].combine_chunks().to_numpy_ndarray()


def expected(root: Path, key: str, table: pa.Table, size: tuple[int, int] | None) -> np.ndarray:
    rows = zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True)
    return frames_for_rows(root, key, rows, size=size)


def take(http: httpx.Client, name: str, body: dict) -> pa.Table:
    response = http.post(f"/datasets/{name}/rows/take", json=body)
    assert response.status_code == 200, response.text
    return read_stream(response.content)


@pytest.mark.parametrize("name", ["cams-v3", "cams-v21"])  # from warmed segments / decoded on demand
def test_a_take_at_a_smaller_frame_size_equals_an_area_resize_of_the_decoded_frames(
    video_root: Path, http: httpx.Client, name: str
) -> None:
    indices = [*np.random.default_rng(5).integers(0, 270, 30).tolist(), 0, 0]
    body = {"episodes": [7, 2, 5], "indices": indices, "columns": [*ROWS, TOP_CAMERA, WRIST_CAMERA]}
    table = take(http, name, body | {"frame_size": list(SMALL)})
    assert table.schema.field(TOP_CAMERA).type == pa.fixed_shape_tensor(pa.uint8(), [*SMALL, 3])
    for key in (TOP_CAMERA, WRIST_CAMERA):
        assert np.array_equal(frames(table, key), expected(video_root / name, key, table, SMALL)), key
    # per camera: the top camera at 32x48, the wrist camera as served
    table = take(http, name, body | {"frame_size": {TOP_CAMERA: [32, 48]}})
    assert np.array_equal(frames(table, TOP_CAMERA), expected(video_root / name, TOP_CAMERA, table, (32, 48)))
    assert np.array_equal(frames(table, WRIST_CAMERA), expected(video_root / name, WRIST_CAMERA, table, None))


@pytest.mark.parametrize("size", [(1, 1), (64, 1), (1, 96), (63, 95)])
def test_the_smallest_and_odd_sizes_equal_the_resized_frames(
    video_root: Path, http: httpx.Client, size: tuple[int, int]
) -> None:
    body = {"episodes": "2-3", "indices": [0, 90, 7], "columns": [*ROWS, TOP_CAMERA], "frame_size": list(size)}
    table = take(http, "cams-v21", body)
    assert np.array_equal(frames(table, TOP_CAMERA), expected(video_root / "cams-v21", TOP_CAMERA, table, size))


@pytest.mark.parametrize("name", ["cams-v3", "cams-v21"])
def test_slices_and_windows_at_a_smaller_frame_size_equal_the_resized_frames(
    video_root: Path, http: httpx.Client, name: str
) -> None:
    params = {"episodes": "8,1-3", "start": 5, "stop": 90, "columns": f"{TOP_CAMERA},episode_index,frame_index"}
    for size in ("24x40", orjson.dumps({TOP_CAMERA: SMALL}).decode()):
        response = http.get(f"/datasets/{name}/rows", params=params | {"frame_size": size})
        assert response.status_code == 200, response.text
        table = read_stream(response.content)
        assert np.array_equal(frames(table, TOP_CAMERA), expected(video_root / name, TOP_CAMERA, table, SMALL))
    last = oracle(video_root / name, [4]).num_rows - 1
    offsets = [-2.0, 0.0, 1 / 30]
    body = {"episodes": "4", "indices": [0, last], "columns": ["frame_index"]}
    body["delta_timestamps"] = {TOP_CAMERA: offsets}
    windows = frames(take(http, name, body | {"frame_size": list(SMALL)}), TOP_CAMERA)
    assert windows.shape == (2, 3, *SMALL, 3)
    for row, position in enumerate([0, last]):
        targets = [min(max(position + round(d * 30), 0), last) for d in offsets]
        want = frames_for_rows(video_root / name, TOP_CAMERA, [(4, t) for t in targets], size=SMALL)
        assert np.array_equal(windows[row], want)


def test_the_served_size_comes_from_the_cache_and_other_sizes_come_as_pixels_for_references(
    video_root: Path, http: httpx.Client
) -> None:
    body = {"episodes": [3, 6], "indices": [4, 0, 90, 4], "columns": [*ROWS, TOP_CAMERA, WRIST_CAMERA]}
    plain = take(http, "cams-v3", body)
    assert take(http, "cams-v3", body | {"frame_size": {TOP_CAMERA: [64, 96]}}).equals(plain)  # served: as without
    referenced = take(http, "cams-v3", body | {"frames": "references", "frame_size": {TOP_CAMERA: [64, 96]}})
    assert pa.types.is_struct(referenced.schema.field(TOP_CAMERA).type)  # read from the decoded-frame segment
    resized = take(http, "cams-v3", body | {"frames": "references", "frame_size": {TOP_CAMERA: list(SMALL)}})
    assert resized.schema.field(TOP_CAMERA).type == pa.fixed_shape_tensor(pa.uint8(), [*SMALL, 3])
    assert np.array_equal(frames(resized, TOP_CAMERA), expected(video_root / "cams-v3", TOP_CAMERA, resized, SMALL))
    assert pa.types.is_struct(resized.schema.field(WRIST_CAMERA).type)  # the other camera still by reference


def test_a_client_reading_the_cache_dir_gets_frames_at_the_size_asked(video_root: Path, warmed: ServerProcess) -> None:
    local = episerve.Client(warmed.url, cache_dir=warmed.cache_dir)
    dataset = episerve.EpisodeDataset(
        local, "cams-v3", [1, 5], [*ROWS, TOP_CAMERA, WRIST_CAMERA], image_size={TOP_CAMERA: SMALL}, output="numpy"
    )
    indices = np.random.default_rng(6).permutation(len(dataset))[:40].tolist()
    batch = episerve.collate(dataset.__getitems__(indices))
    rows = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    top = frames_for_rows(video_root / "cams-v3", TOP_CAMERA, rows, size=SMALL)
    wrist = frames_for_rows(video_root / "cams-v3", WRIST_CAMERA, rows)
    assert np.array_equal(batch[TOP_CAMERA], top.transpose(0, 3, 1, 2))
    assert np.array_equal(batch[WRIST_CAMERA], wrist.transpose(0, 3, 1, 2))
    assert local.local_frames is not None and local.local_frames.in_use  # the wrist frames came from the files


def test_a_mixture_reading_the_cache_dir_gets_resized_frames_as_pixels_and_the_others_from_the_files(
    video_root: Path, warmed: ServerProcess
) -> None:
    # one dataset twice: its 64x96 top camera, and its 48x64 wrist camera under the same name
    mixture = episerve.Mixture(
        [
            {"dataset": "cams-v3", "features": {WRIST_CAMERA: "wrist"}},
            {"dataset": "cams-v3", "features": {TOP_CAMERA: "top", WRIST_CAMERA: TOP_CAMERA}},
        ]
    )
    local = episerve.Client(warmed.url, cache_dir=warmed.cache_dir)
    dataset = episerve.MixtureDataset(local, mixture, [*ROWS, TOP_CAMERA], output="numpy", seed=2)
    batch = episerve.collate(dataset.__getitems__(list(range(50))))
    assert batch[TOP_CAMERA].shape == (50, 3, 48, 64)  # the smaller of the two: the top camera downscaled
    robot = batch["dataset_index"]
    for k, (camera, size) in enumerate([(TOP_CAMERA, (48, 64)), (WRIST_CAMERA, None)]):
        mine = robot == k
        rows = list(zip(batch["episode_index"][mine].tolist(), batch["frame_index"][mine].tolist(), strict=True))
        want = frames_for_rows(video_root / "cams-v3", camera, rows, size=size).transpose(0, 3, 1, 2)
        assert np.array_equal(batch[TOP_CAMERA][mine], want)
    assert local.local_frames is not None and local.local_frames.in_use


def test_datasets_ask_for_frames_at_their_image_size(video_root: Path, warmed: ServerProcess) -> None:
    dataset = episerve.EpisodeDataset(warmed.url, "cams-v21", "0-2", [*ROWS, TOP_CAMERA], image_size=SMALL)
    batch = episerve.collate(dataset.__getitems__([5, 0, 77]))
    assert tuple(batch[TOP_CAMERA].shape) == (3, 3, *SMALL)
    rows = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    want = frames_for_rows(video_root / "cams-v21", TOP_CAMERA, rows, size=SMALL).transpose(0, 3, 1, 2)
    assert np.array_equal(batch[TOP_CAMERA].numpy(), want)
    stream = episerve.EpisodeIterableDataset(
        warmed.url, "cams-v21", "0", [*ROWS, TOP_CAMERA], batch_size=16, image_size=SMALL, output="numpy"
    )
    first = next(iter(stream))
    rows = list(zip(first["episode_index"].tolist(), first["frame_index"].tolist(), strict=True))
    want = frames_for_rows(video_root / "cams-v21", TOP_CAMERA, rows, size=SMALL).transpose(0, 3, 1, 2)
    assert np.array_equal(first[TOP_CAMERA], want)
    with pytest.raises(ValueError, match="two positive integers"):
        episerve.EpisodeDataset(warmed.url, "cams-v21", image_size=(0, 10))


@pytest.mark.parametrize(
    ("frame_size", "phrases"),
    [
        ([65, 96], ["65x96", TOP_CAMERA, "64x96", "only downscale"]),
        ([64, 97], ["64x97", "only downscale"]),
        ({WRIST_CAMERA: [48, 65]}, [WRIST_CAMERA, "48x65", "48x64"]),
        ({"observation.images.side": [8, 8]}, ["observation.images.side", "not cameras", TOP_CAMERA]),
        ([0, 10], ["frame_size"]),
        ([10], ["frame_size"]),
        ([10, 10, 3], ["frame_size"]),
        ([-1, 10], ["frame_size"]),
        ([10.5, 10], ["frame_size"]),
        (["10", "10"], ["frame_size"]),
        ("24x40", ["frame_size"]),
        ({TOP_CAMERA: [10, 0]}, ["frame_size"]),
        ([70000, 70000], ["frame_size"]),
    ],
)
def test_bad_frame_sizes_are_422_problems(http: httpx.Client, frame_size: object, phrases: list[str]) -> None:
    body = {"indices": [0], "columns": [TOP_CAMERA, WRIST_CAMERA], "frame_size": frame_size}
    assert_problem(http.post("/datasets/cams-v3/rows/take", json=body), 422, *phrases)


@pytest.mark.parametrize(
    ("query", "phrases"),
    [
        ("24", ["HxW"]),
        ("ax4", ["HxW"]),
        ("0x4", ["frame_size"]),
        ("99999999999999999999999x4", ["frame_size"]),
        ('{"observation.images.top": [1]}', ["frame_size"]),
        ("{not json", ["frame_size"]),
        ("100x100", ["only downscale"]),
    ],
)
def test_bad_frame_sizes_in_a_query_are_422_problems(http: httpx.Client, query: str, phrases: list[str]) -> None:
    params = {"columns": TOP_CAMERA, "stop": 2, "frame_size": query}
    assert_problem(http.get("/datasets/cams-v3/rows", params=params), 422, *phrases)


def test_reads_at_another_size_never_build_decoded_frame_segments(video_root: Path, tmp_path: Path) -> None:
    """First touch builds a video's decoded-frame segment at the served size only: a read at another size decodes
    on demand and queues nothing (no second cache per size)."""
    root = video_root / "cams-v21"  # one file per episode and camera
    files = {e: episode_video(root, TOP_CAMERA, e).path.relative_to(root).as_posix() for e in (0, 1, 5)}
    cache = tmp_path / "cache"
    env = {"EPISERVE_VIDEO_CACHE_POLICY": "first-touch"}
    with ServerProcess([video_root], cache, env=env) as server, server.client() as http:
        body = {"indices": [0, 3], "columns": [*ROWS, TOP_CAMERA], "frame_size": list(SMALL)}
        for episode in (0, 1):
            resized = take(http, "cams-v21", body | {"episodes": str(episode)})
            assert np.array_equal(frames(resized, TOP_CAMERA), expected(root, TOP_CAMERA, resized, SMALL))
        take(http, "cams-v21", {"episodes": "5", "indices": [0], "columns": [TOP_CAMERA]})  # the served size
        eventually(lambda: files[5] in frame_segments(cache), 120)
        time.sleep(0.5)
    built = set(frame_segments(cache))
    assert files[0] not in built and files[1] not in built
