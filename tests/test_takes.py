"""`POST /takes`: takes of several datasets in one request, answered as their Arrow IPC streams one after another.

Every stream equals the same take made alone (`POST /datasets/{id}/rows/take`), byte for byte, and the pyarrow /
PyAV oracles; cold requests come chunked, take by take, warm ones at once with a length; a bad take
is a 4xx problem naming it before any byte is sent, and a problem found once the status is out leaves the body
unfinished. The client reads a mixture's batch with one such request, and falls back to one take per dataset
where the server has no route or the takes exceed its limit.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import episerve
from app.demo import write_demo_dataset
from tests.support import (
    ServerProcess,
    assert_tables_equal,
    eventually,
    oracle,
    read_stream,
    write_generic_dataset,
)
from tests.test_errors import assert_problem
from tests.test_operations import metric, run_cli
from tests.test_windows import assert_windows_match
from tests.video_oracle import frames_for_rows

GENERIC, ROBOT_A, ROBOT_B, SHIFTED = "generic", "robots/a", "robots/b", "robots/shifted"
BIG = "robots/big"  # frames of 90 KiB: sent straight from a mapped decoded-frame segment, never copied
TOP, HIGH = "observation.images.top", "observation.images.cam_high"
FPS = {ROBOT_A: 30, ROBOT_B: 15, GENERIC: 10, BIG: 30}
CAMERAS = {ROBOT_A: {TOP: (48, 64)}, ROBOT_B: {HIGH: (64, 96)}, BIG: {TOP: (160, 192)}}
SHIFTED_EPISODE = 2  # its frames lie 10 ms off the times its rows ask for
TOKEN = "alpha"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 300  # the servers' EPISERVE_MAX_TAKE_INDICES
BODY_LIMIT = 256 * 1024  # their EPISERVE_MAX_BODY_BYTES
ENV = {"EPISERVE_TOKENS": TOKEN, "EPISERVE_MAX_TAKE_INDICES": str(LIMIT), "EPISERVE_MAX_BODY_BYTES": str(BODY_LIMIT)}
TAKES = "/takes"
ARROW = "application/vnd.apache.arrow.stream"
INLINE_TAKES = "episerve_inline_takes_total"
TAKES_ENDPOINT = TAKES  # the route, as metrics label it
TAKE_ENDPOINT = "/datasets/{dataset_id:path}/rows/take"
GOOD = {"dataset": GENERIC, "indices": [0, 1]}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generic parquet dataset and three LeRobot robots whose cameras differ in name, size, format and fps; and
    a copy of robot A whose episode 2 has its frames off the times its rows ask for."""
    path = tmp_path_factory.mktemp("takes-root")
    write_generic_dataset(path / GENERIC)
    write_demo_dataset(path / ROBOT_A, episodes=6, seed=61, files=2, cameras=CAMERAS[ROBOT_A], video_files=2)
    write_demo_dataset(
        path / ROBOT_B, format="v2.1", episodes=5, seed=62, joints=9, fps=FPS[ROBOT_B], cameras=CAMERAS[ROBOT_B]
    )
    write_demo_dataset(path / BIG, format="v2.1", episodes=2, seed=63, cameras=CAMERAS[BIG])
    shutil.copytree(path / ROBOT_A, path / SHIFTED)
    (meta,) = sorted((path / SHIFTED / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(meta)
    column = f"videos/{TOP}/from_timestamp"
    pairs = zip(table["episode_index"].to_pylist(), table[column].to_pylist(), strict=True)
    shifted = [t + 0.01 if e == SHIFTED_EPISODE else t for e, t in pairs]
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(shifted)), meta)
    return path


@pytest.fixture(scope="module")
def servers(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """Two servers of `root`: quick reads on the event loop (`on`, the default) and not (`off`: all in the pool)."""
    cache = tmp_path_factory.mktemp("takes-cache")
    on = ServerProcess([root], cache / "on", env=ENV)
    off = ServerProcess([root], cache / "off", env=ENV | {"EPISERVE_INLINE_READ_BYTES": "0"})
    with on, off:
        yield {"on": on, "off": off}


def http_of(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=AUTH, timeout=60.0)


@pytest.fixture(scope="module")
def lane_http(servers: dict[str, ServerProcess]) -> Iterator[dict[str, httpx.Client]]:
    """A client of each server, for the examples of the property tests (a new client per example costs tens of
    milliseconds of CPU)."""
    with http_of(servers["on"]) as on, http_of(servers["off"]) as off:
        yield {"on": on, "off": off}


def inline_takes(http: httpx.Client) -> float:
    return metric(http.get("/metrics").text, INLINE_TAKES)


def requests_of(http: httpx.Client, endpoint: str, status: str = "200") -> float:
    return metric(http.get("/metrics").text, "episerve_requests_total", endpoint=endpoint, method="POST", status=status)


def streams(body: bytes, count: int) -> list[bytes]:
    """The `count` Arrow IPC streams of a `POST /takes` body, each as its own bytes; the body holds nothing else."""
    reader = pa.BufferReader(body)
    parts, start = [], 0
    for _ in range(count):
        pa.ipc.open_stream(reader).read_all()
        parts.append(body[start : reader.tell()])
        start = reader.tell()
    assert start == len(body), "bytes after the last stream"
    return parts


def view(root: Path, dataset: str, episodes: Any) -> pa.Table:
    """The oracle view of `episodes` (a spec string, a list or None)."""
    if isinstance(episodes, str):
        picked = [int(part) for part in episodes.split(",")]
        return oracle(root / dataset, picked)
    return oracle(root / dataset, episodes)


def mixed_takes(root: Path, *, quick_only: bool = False) -> list[dict[str, Any]]:
    """Takes of all three datasets: duplicates, unsorted indices, an empty take, episode picks, columns in odd
    order and all stored ones, windows (one off the frame grid within its tolerance, one beside a camera), compression;
    unless `quick_only`, also takes never answered on the event loop: a camera at a smaller `frame_size`, and a window
    of camera frames."""
    rng = np.random.default_rng(9)
    a_view = view(root, ROBOT_A, [4, 1]).num_rows
    b_view = view(root, ROBOT_B, None).num_rows
    b_picked = view(root, ROBOT_B, [0, 3]).num_rows
    takes: list[dict[str, Any]] = [
        {"dataset": GENERIC, "indices": [5, 0, 5, 17, 2], "columns": ["label", "vec", "episode_index", "value"]},
        {
            "dataset": ROBOT_A,
            "episodes": [4, 1, 4],
            "indices": [a_view - 1, *rng.integers(0, a_view, 12).tolist(), 0, 0],
            "columns": ["index", TOP, "frame_index", "episode_index"],
            "frames": "pixels",
        },
        {"dataset": ROBOT_B, "indices": [], "columns": [HIGH, "index"]},
        {
            "dataset": ROBOT_B,
            "episodes": "3,0",
            "indices": [0, b_picked - 1, *rng.integers(0, b_picked, 10).tolist()],
            "columns": ["episode_index", "action", "index"],
            "delta_timestamps": {"action": [-2 / 15, 0, 1 / 15], "index": [0.0, 3 / 15]},
        },
        {
            "dataset": ROBOT_A,
            "indices": rng.integers(0, view(root, ROBOT_A, None).num_rows, 40).tolist(),
            "columns": ["episode_index", "observation.state", "index"],
            "delta_timestamps": {"observation.state": [-0.0334, 0]},  # -1/30 s within the tolerance
            "tolerance_s": 0.001,
            "compression": "zstd",
        },
        {"dataset": GENERIC, "episodes": "11,3", "indices": [3, 0, 1, 3]},  # every column
        {
            "dataset": ROBOT_A,
            "episodes": "5,2",
            "indices": [2, 0, 2, view(root, ROBOT_A, [2, 5]).num_rows - 1],
            "columns": ["action", TOP, "frame_index", "episode_index"],
            "delta_timestamps": {"action": [-1 / 30, 0]},  # windows beside a camera's plain frames
        },
        {"dataset": ROBOT_B, "episodes": "4", "indices": [1, 0]},  # every stored column of a dataset with a camera
    ]
    if not quick_only:
        indices = [b_view - 1, *rng.integers(0, b_view, 8).tolist(), 3]
        takes.append(
            {"dataset": ROBOT_B, "indices": indices, "columns": [HIGH, "episode_index"], "frame_size": [32, 48]}
        )
        takes.append(
            {
                "dataset": ROBOT_A,
                "episodes": [3],
                "indices": [0, 5, 1],
                "columns": ["frame_index", TOP, "episode_index"],
                "delta_timestamps": {TOP: [-2 / 30, 0, 1 / 30]},
            }
        )
    return takes


def alone(take: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The path and body of `take` made through `POST /datasets/{id}/rows/take`."""
    return f"/datasets/{take['dataset']}/rows/take", {k: v for k, v in take.items() if k != "dataset"}


def assert_take_equals_oracle(root: Path, take: dict[str, Any], table: pa.Table) -> None:
    """`table` holds the rows the oracles give for `take`: values from the parquet files, windows by LeRobot's
    rules, camera frames decoded by PyAV (area-resized to `frame_size`), windows of frames clamped to the episode."""
    dataset, indices = take["dataset"], take["indices"]
    picked = view(root, dataset, take.get("episodes"))
    rows = picked.take(pa.array(indices, pa.int64()))
    windows = take.get("delta_timestamps") or {}
    cameras, fps = CAMERAS.get(dataset, {}), FPS[dataset]
    if take.get("columns") is None:  # the stored columns (cameras come only when named)
        assert table.column_names == picked.column_names
    else:
        assert table.column_names == [*take["columns"], *(f"{name}_is_pad" for name in windows)]
    names = take.get("columns") or table.column_names
    plain = [name for name in names if name not in cameras]
    if windows:
        on_grid = {name: [round(d * fps) / fps for d in offsets] for name, offsets in windows.items()}
        plain_windows = {name: offsets for name, offsets in on_grid.items() if name not in cameras}
        assert_windows_match(table, picked.select(plain), indices, plain_windows, fps)
    else:
        assert_tables_equal(table.select(plain), rows.select(plain))
    size = tuple(take["frame_size"]) if "frame_size" in take else None
    for camera in [name for name in names if name in cameras]:
        offsets = windows.get(camera)
        shape = [*(size or cameras[camera]), 3] if offsets is None else [len(offsets), *(size or cameras[camera]), 3]
        assert table.schema.field(camera).type == pa.fixed_shape_tensor(pa.uint8(), shape)
        if not indices:
            continue
        keys, pads = frame_keys(root / dataset, rows, offsets, fps)
        want = frames_for_rows(root / dataset, camera, keys, size=size).reshape(len(indices), *shape)
        assert np.array_equal(table[camera].combine_chunks().to_numpy_ndarray(), want), camera
        if offsets is not None:
            assert table[f"{camera}_is_pad"].to_pylist() == pads


def frame_keys(
    dataset: Path, rows: pa.Table, offsets: list[float] | None, fps: int
) -> tuple[list[tuple[int, int]], list[list[bool]]]:
    """(episode, frame) of each row's frame, or of each frame of its window (the frame `round(offset * fps)` away,
    clamped to the episode), row after row; and the windows' padding flags."""
    lengths = oracle(dataset, None).group_by("episode_index").aggregate([("frame_index", "count")])
    length = dict(zip(lengths["episode_index"].to_pylist(), lengths["frame_index_count"].to_pylist(), strict=True))
    keys, pads = [], []
    for episode, frame in zip(rows["episode_index"].to_pylist(), rows["frame_index"].to_pylist(), strict=True):
        if offsets is None:
            keys.append((episode, frame))
            continue
        targets = [frame + round(d * fps) for d in offsets]
        keys += [(episode, min(max(t, 0), length[episode] - 1)) for t in targets]
        pads.append([not 0 <= t < length[episode] for t in targets])
    return keys, pads


def assert_takes_answer(root: Path, http: httpx.Client, takes: list[dict[str, Any]], response: httpx.Response) -> None:
    """`response` answers `takes`: each stream the bytes of the same take made alone, and the oracles' rows; the
    headers count all rows and each view."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    assert int(response.headers["x-row-count"]) == sum(len(take["indices"]) for take in takes)
    totals = [view(root, take["dataset"], take.get("episodes")).num_rows for take in takes]
    assert response.headers["x-total-rows"] == ",".join(map(str, totals))
    for number, (take, stream) in enumerate(zip(takes, streams(response.content, len(takes)), strict=True)):
        path, body = alone(take)
        single = http.post(path, json=body)
        assert single.status_code == 200, single.text
        assert stream == single.content, f"takes[{number}] differs from the same take alone"
        assert_take_equals_oracle(root, take, read_stream(stream))


# --- rows, order and headers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("lane", ["on", "off"])
def test_each_stream_equals_the_same_take_alone_and_the_oracle(
    root: Path, servers: dict[str, ServerProcess], lane: str
) -> None:
    takes = mixed_takes(root)
    with http_of(servers[lane]) as http:
        for _ in range(2):  # cold, then with the segments built and mapped
            assert_takes_answer(root, http, takes, http.post(TAKES, json={"takes": takes}))


def test_both_servers_answer_the_same_bytes(root: Path, servers: dict[str, ServerProcess]) -> None:
    takes = mixed_takes(root)
    with http_of(servers["on"]) as fast, http_of(servers["off"]) as slow:
        expected = slow.post(TAKES, json={"takes": takes})
        assert expected.status_code == 200, expected.text
        for _ in range(2):
            answer = fast.post(TAKES, json={"takes": takes})
            assert answer.status_code == 200, answer.text
            assert answer.content == expected.content
            for header in ("x-row-count", "x-total-rows", "content-type"):
                assert answer.headers[header] == expected.headers[header]


def test_takes_of_one_dataset_keep_their_order_and_may_repeat(root: Path, servers: dict[str, ServerProcess]) -> None:
    takes = [
        {"dataset": GENERIC, "indices": [17, 1], "columns": ["value"]},
        {"dataset": GENERIC, "indices": [1, 5, 1], "columns": ["value"], "episodes": [7, 3]},
        {"dataset": GENERIC, "indices": [17, 1], "columns": ["value"]},
    ]
    whole = oracle(root / GENERIC, None)["value"].to_pylist()
    picked = oracle(root / GENERIC, [3, 7])["value"].to_pylist()
    with http_of(servers["on"]) as http:
        response = http.post(TAKES, json={"takes": takes})
        assert response.status_code == 200, response.text
        tables = [read_stream(stream) for stream in streams(response.content, 3)]
    assert [t["value"].to_pylist() for t in tables] == [
        [whole[17], whole[1]],
        [picked[1], picked[5], picked[1]],
        [whole[17], whole[1]],
    ]
    assert response.headers["x-total-rows"] == f"{len(whole)},{len(picked)},{len(whole)}"


def test_the_most_takes_a_request_may_hold_are_all_answered_in_order(
    root: Path, servers: dict[str, ServerProcess]
) -> None:
    values = oracle(root / GENERIC, None)["value"].to_pylist()
    takes = [{"dataset": GENERIC, "indices": [n % 18] if n % 5 == 0 else [], "columns": ["value"]} for n in range(1024)]
    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            response = http.post(TAKES, json={"takes": takes})
            assert response.status_code == 200, response.text
            got = [read_stream(stream)["value"].to_pylist() for stream in streams(response.content, 1024)]
        assert got == [[values[n % 18]] if n % 5 == 0 else [] for n in range(1024)]
        assert int(response.headers["x-row-count"]) == 205


RANDOM_COLUMNS = {
    GENERIC: ["value", "reading", "vec", "label", "episode_index"],
    ROBOT_A: ["index", "action", "observation.state", "episode_index", "frame_index", "timestamp"],
    ROBOT_B: ["index", "action", "task_index", "episode_index"],
}


@st.composite
def random_takes(draw: st.DrawFn, root: Path) -> list[dict[str, Any]]:
    """1 to 5 takes of any of the three datasets: an episode pick or none, indices of its view (unsorted, with
    duplicates, possibly none), some of its columns in any order."""
    takes = []
    for _ in range(draw(st.integers(1, 5))):
        dataset = draw(st.sampled_from(sorted(RANDOM_COLUMNS)))
        episodes = sorted(set(oracle(root / dataset, None)["episode_index"].to_pylist()))
        pick = draw(st.none() | st.lists(st.sampled_from(episodes), min_size=1, max_size=4))
        rows = view(root, dataset, pick).num_rows
        take: dict[str, Any] = {"dataset": dataset, "indices": draw(st.lists(st.integers(0, rows - 1), max_size=30))}
        if pick is not None:
            take["episodes"] = pick
        columns = draw(st.permutations(RANDOM_COLUMNS[dataset]))
        take["columns"] = columns[: draw(st.integers(1, len(columns)))]
        takes.append(take)
    return takes


@pytest.mark.parametrize("lane", ["on", "off"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_takes_equal_the_same_takes_alone_and_the_oracle(
    root: Path, lane_http: dict[str, httpx.Client], lane: str, data: st.DataObject
) -> None:
    takes = data.draw(random_takes(root), label="takes")
    http = lane_http[lane]
    assert_takes_answer(root, http, takes, http.post(TAKES, json={"takes": takes}))


def test_concurrent_requests_each_get_their_own_takes(root: Path, servers: dict[str, ServerProcess]) -> None:
    rng = np.random.default_rng(15)
    bodies = []
    for n in range(12):
        dataset = [GENERIC, ROBOT_A, ROBOT_B][n % 3]
        rows = view(root, dataset, None).num_rows
        indices = rng.integers(0, rows, int(rng.integers(1, 60))).tolist()
        columns = RANDOM_COLUMNS[dataset][: 1 + n % 3]
        bodies.append(
            {"takes": [{"dataset": dataset, "indices": indices, "columns": columns}, GOOD | {"indices": [n]}]}
        )
    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            expected = [http.post(TAKES, json=body).content for body in bodies]

            def ask(number: int, http: httpx.Client = http) -> bytes:
                response = http.post(TAKES, json=bodies[number % len(bodies)])
                assert response.status_code == 200, response.text
                return response.content

            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(ask, range(4 * len(bodies))))
        assert answers == expected * 4


# --- answered take by take, or all at once on the event loop -----------------------------------------------


def test_a_cold_request_comes_chunked_take_by_take_and_a_warm_one_at_once_with_its_length(
    root: Path, tmp_path: Path
) -> None:
    # frames sent straight from the map, of one video file (episode 0; several files: see further down)
    big = [{"dataset": BIG, "indices": [7, 0, 7, 30], "columns": [TOP, "index", "episode_index", "frame_index"]}]
    takes = [*mixed_takes(root, quick_only=True), *big]
    with ServerProcess([root], tmp_path / "cache", env=ENV) as server, http_of(server) as http:
        cold = http.post(TAKES, json={"takes": takes})  # nothing is built yet: answered take by take
        assert "content-length" not in cold.headers and cold.headers["transfer-encoding"] == "chunked"
        assert inline_takes(http) < len(takes)  # a take whose segment is not mapped yet is read in the pool
        assert_takes_answer(root, http, takes, cold)
        deadline = time.monotonic() + 120  # all at once, on the event loop, once the segments are built
        asked = 1
        while True:
            before = inline_takes(http)
            warm = http.post(TAKES, json={"takes": takes})
            asked += 1
            assert warm.status_code == 200, warm.text
            assert warm.content == cold.content
            if inline_takes(http) > before:
                break
            assert time.monotonic() < deadline, "the takes were never answered at once"
            time.sleep(0.2)
        assert inline_takes(http) - before == len(takes)  # every take, on the event loop
        assert int(warm.headers["content-length"]) == len(warm.content)
        assert "transfer-encoding" not in warm.headers
        assert warm.headers["x-total-rows"] == cold.headers["x-total-rows"]
        assert warm.headers["x-row-count"] == cold.headers["x-row-count"]
        assert requests_of(http, TAKES_ENDPOINT) == asked  # answers on the event loop are counted under the route


# --- problems -------------------------------------------------------------------------------------------------


def named(number: int, dataset: str) -> str:
    return f"takes[{number}] (dataset {dataset!r}): "


@pytest.mark.parametrize(
    ("takes", "status", "phrases"),
    [
        ([GOOD, {"dataset": "robots/nope", "indices": [0]}], 404, [named(1, "robots/nope"), "nope"]),
        ([{"dataset": "../generic", "indices": [0]}], 422, [named(0, "../generic"), "segments"]),
        ([GOOD, {"dataset": ROBOT_A, "indices": [0, 10**6]}], 422, [named(1, ROBOT_A), "out of range"]),
        ([GOOD, GOOD, {"dataset": ROBOT_B, "indices": [0], "columns": ["nope"]}], 422, [named(2, ROBOT_B), "nope"]),
        ([{"dataset": ROBOT_A, "indices": [0], "episodes": "999"}, GOOD], 404, [named(0, ROBOT_A), "999"]),
        ([GOOD, {"dataset": ROBOT_A, "indices": [0], "episodes": "2-1"}], 422, [named(1, ROBOT_A)]),
        (
            [GOOD, {"dataset": ROBOT_B, "indices": [0], "delta_timestamps": {"action": [0.01]}}],
            422,
            [named(1, ROBOT_B), "action"],
        ),
        (
            [GOOD, {"dataset": ROBOT_A, "indices": [0], "columns": [TOP], "frame_size": [96, 128]}],
            422,
            [named(1, ROBOT_A), "only downscale"],
        ),
    ],
)
def test_a_bad_take_is_a_problem_naming_it_before_any_byte_is_sent(
    servers: dict[str, ServerProcess], takes: list[dict[str, Any]], status: int, phrases: list[str]
) -> None:
    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            assert http.post(TAKES, json={"takes": [GOOD]}).status_code == 200  # the datasets are loaded
            assert_problem(http.post(TAKES, json={"takes": takes}), status, *phrases)


def test_the_indices_of_all_takes_count_against_one_limit(servers: dict[str, ServerProcess]) -> None:
    half = {"dataset": GENERIC, "indices": [0] * (LIMIT // 2)}
    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            assert http.post(TAKES, json={"takes": [half, half]}).status_code == 200  # exactly the limit
            over = http.post(TAKES, json={"takes": [half, half, {"dataset": ROBOT_A, "indices": [0]}]})
            body = assert_problem(over, 413, f"{LIMIT + 1} indices asked by 3 takes", f"the limit is {LIMIT}")
            assert body["limit"] == LIMIT


@pytest.mark.parametrize(
    ("body", "phrases"),
    [
        ({"takes": []}, ["takes", "at least 1"]),
        ({"takes": [GOOD] * 1025}, ["takes", "at most 1024"]),
        ({}, ["takes", "Field required"]),
        ({"takes": [GOOD], "batch": 1}, ["batch", "Extra inputs"]),
        ({"takes": [GOOD, GOOD | {"colums": ["value"]}]}, ["takes.1.colums", "Extra inputs"]),
        ({"takes": GOOD}, ["takes"]),
        ({"takes": [{"dataset": GENERIC, "indices": ["0"]}]}, ["takes.0.indices.0"]),
        ({"takes": [{"dataset": GENERIC, "indices": [-1]}]}, ["takes.0.indices.0"]),
        ({"takes": [{"dataset": GENERIC, "indices": 3}]}, ["takes.0.indices"]),
        ({"takes": [{"dataset": 5, "indices": [0]}]}, ["takes.0.dataset"]),
        ({"takes": [{"dataset": "", "indices": [0]}]}, ["takes.0.dataset"]),
        ({"takes": [{"indices": [0]}]}, ["takes.0.dataset", "Field required"]),
        ({"takes": [GOOD | {"compression": "gzip"}]}, ["takes.0.compression"]),
        ({"takes": [GOOD | {"frames": "urls"}]}, ["takes.0.frames"]),
        ({"takes": [None]}, ["takes.0"]),
        ([GOOD], []),
    ],
)
def test_a_malformed_body_is_422(servers: dict[str, ServerProcess], body: Any, phrases: list[str]) -> None:
    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            assert_problem(http.post(TAKES, json=body), 422, *phrases)


def test_requests_the_endpoint_refuses_are_4xx_problems(servers: dict[str, ServerProcess]) -> None:
    body = json.dumps({"takes": [GOOD]}).encode()
    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            assert (
                http.post(TAKES, json={"takes": [GOOD]}).status_code == 200
            )  # so that it could be answered on the event loop
            in_query = http.post(f"{TAKES}?dataset={GENERIC}", json={"takes": [GOOD]})
            assert_problem(in_query, 422, "unknown query parameter 'dataset'", "takes no query parameters")
            assert_problem(http.post(TAKES, content=body, headers={"Content-Type": "text/plain"}), 415)
            assert_problem(http.post(TAKES, content=b'{"takes": [', headers={"Content-Type": "application/json"}), 400)
            assert_problem(httpx.post(f"{http.base_url}{TAKES}", json={"takes": [GOOD]}), 401, "bearer token")
            wrong = httpx.post(f"{http.base_url}{TAKES}", json={"takes": [GOOD]}, headers={"Authorization": "Bearer b"})
            assert 400 <= wrong.status_code < 500 and wrong.json()["status"] == wrong.status_code
            assert_problem(http.get(TAKES), 405)


def test_bodies_in_many_chunks_or_over_the_limit_arrive_intact_or_are_refused(
    servers: dict[str, ServerProcess],
) -> None:
    body = json.dumps({"takes": [GOOD, {"dataset": ROBOT_A, "indices": list(range(0, 200, 7))}]}).encode()
    json_type = {"Content-Type": "application/json"}

    def pieces(data: bytes, size: int) -> Iterator[bytes]:
        yield from (data[start : start + size] for start in range(0, len(data), size))

    for lane in ("on", "off"):
        with http_of(servers[lane]) as http:
            expected = http.post(TAKES, content=body, headers=json_type)
            assert expected.status_code == 200, expected.text
            for size in (1, 7, 100):
                answer = http.post(TAKES, content=pieces(body, size), headers=json_type)
                assert answer.status_code == 200, answer.text
                assert answer.content == expected.content
            spec = ",".join(["0"] * (BODY_LIMIT // 2))
            oversize = json.dumps({"takes": [GOOD | {"episodes": spec}]}).encode()
            declared = http.post(TAKES, content=oversize, headers=json_type)
            assert_problem(declared, 413, f"the limit is {BODY_LIMIT} bytes")
            streamed = http.post(TAKES, content=pieces(oversize, 16384), headers=json_type)
            assert_problem(streamed, 413, f"larger than the limit of {BODY_LIMIT} bytes")


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
LOOSE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner))


@st.composite
def loose_takes(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Takes whose fields hold plausible values or anything at all: the body a fuzzer or a confused client sends."""
    columns = ["value", "index", "action", TOP, HIGH, "episode_index", "nope"]
    plausible = {
        "dataset": st.sampled_from([GENERIC, ROBOT_A, ROBOT_B, BIG, "robots", "nope", ""]),
        "indices": st.lists(st.integers(-2, 400) | st.sampled_from([2**62, 2**63]), max_size=8),
        "episodes": st.sampled_from(["0", "1-2", "5,0", "2-1", "99", "", "x"]) | st.lists(st.integers(-1, 9)),
        "columns": st.lists(st.sampled_from(columns), max_size=4),
        "delta_timestamps": st.dictionaries(st.sampled_from(columns), st.lists(st.floats(-1, 1), max_size=3)),
        "tolerance_s": st.floats(-1, 1e7),
        "frame_size": st.lists(st.integers(-1, 300), min_size=2, max_size=2)
        | st.dictionaries(st.sampled_from([TOP, HIGH]), st.tuples(st.integers(0, 70), st.integers(0, 70))),
        "frames": st.sampled_from(["pixels", "references", "urls"]),
        "compression": st.sampled_from(["none", "lz4", "zstd", "gzip"]),
    }
    takes = []
    for _ in range(draw(st.integers(1, 3))):
        take = {"dataset": draw(plausible["dataset"]), "indices": draw(plausible["indices"])}
        for name in draw(st.lists(st.sampled_from(sorted(plausible)), max_size=4, unique=True)):
            take[name] = draw(plausible[name] | LOOSE) if draw(st.booleans()) else draw(plausible[name])
        takes.append(take)
    return takes


@pytest.mark.parametrize("lane", ["on", "off"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(takes=loose_takes())
def test_no_body_is_a_5xx_and_every_refusal_is_a_problem(
    lane_http: dict[str, httpx.Client], lane: str, takes: list[dict[str, Any]]
) -> None:
    response = lane_http[lane].post(TAKES, json={"takes": takes})
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        streams(response.content, len(takes))
        assert int(response.headers["x-row-count"]) == sum(len(take["indices"]) for take in takes)
    else:
        body = assert_problem(response, response.status_code)
        assert 400 <= body["status"] < 500


# --- a problem once the status is out -------------------------------------------------------------------------


def shifted_rows(root: Path) -> tuple[list[int], int]:
    """Positions of `robots/shifted` whose frames are fine (episodes before the shifted one), and one that is not."""
    episodes = oracle(root / SHIFTED, None)["episode_index"].to_numpy()
    good = np.flatnonzero(episodes < SHIFTED_EPISODE).tolist()
    return good, int(np.flatnonzero(episodes == SHIFTED_EPISODE)[0])


@pytest.mark.parametrize("lane", ["on", "off"])
def test_a_problem_in_a_later_take_leaves_the_body_unfinished_and_every_reader_sees_an_error(
    root: Path, servers: dict[str, ServerProcess], lane: str
) -> None:
    server = servers[lane]
    good, bad = shifted_rows(root)
    good = good * 3  # at least 60 positions
    takes = [
        {"dataset": GENERIC, "indices": [0, 1, 2], "columns": ["value"]},
        {"dataset": SHIFTED, "indices": good[:40], "columns": [TOP]},
        {"dataset": SHIFTED, "indices": [*good[40:50], bad], "columns": [TOP]},
    ]
    with http_of(server) as http, http.stream("POST", TAKES, json={"takes": takes}) as answer:
        assert answer.status_code == 200  # the first take was fine
        assert "content-length" not in answer.headers
        with pytest.raises(httpx.RemoteProtocolError):
            answer.read()

    client = episerve.Client(server.url, token=TOKEN, retries=episerve.Retries(attempts=2))
    selections = [episerve.Selection.of(t["dataset"], None, t["columns"]) for t in takes]
    with client, pytest.raises(episerve.EpiserveError):  # an error, never fewer rows
        client.read_takes(list(zip(selections, [t["indices"] for t in takes], strict=True)))
    log = server.log_path.read_text()
    cut = rf"POST /takes: answer cut short after 43 rows: takes\[2\] \(dataset '{SHIFTED}'\): no frame of '{TOP}'"
    assert re.search(cut, log), log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_a_problem_in_the_first_take_is_still_an_error_status(root: Path, servers: dict[str, ServerProcess]) -> None:
    _, bad = shifted_rows(root)
    takes = [{"dataset": SHIFTED, "indices": [bad], "columns": [TOP]}, GOOD]
    with http_of(servers["off"]) as http:
        assert_problem(http.post(TAKES, json={"takes": takes}), 422, named(0, SHIFTED), f"no frame of '{TOP}'")


@pytest.mark.parametrize("lane", ["on", "off"])
def test_a_client_gone_mid_body_leaves_nothing_held(root: Path, servers: dict[str, ServerProcess], lane: str) -> None:
    frames = {"dataset": BIG, "episodes": [0], "columns": [TOP, "index"]}  # one video file
    takes = [GOOD, frames | {"indices": list(range(0, 80))}, frames | {"indices": list(range(80, 0, -1))}, GOOD]
    with http_of(servers[lane]) as http:
        whole = http.post(TAKES, json={"takes": takes})
        assert whole.status_code == 200 and len(whole.content) > 2 * 80 * 160 * 192 * 3
        for _ in range(5):
            with (
                httpx.Client(base_url=http.base_url, headers=AUTH, timeout=60) as leaving,
                leaving.stream("POST", TAKES, json={"takes": takes}) as answer,
            ):
                assert answer.status_code == 200
                next(answer.iter_raw(65536))
        eventually(lambda: metric(http.get("/metrics").text, "episerve_inflight_bytes") == 0, 30)
        again = http.post(TAKES, json={"takes": takes})
        assert again.status_code == 200
        # The same rows; not always the same bytes: a cold first answer is read in pieces (more record batches).
        tables = [read_stream(stream) for stream in streams(again.content, len(takes))]
        assert all(t.equals(read_stream(w)) for t, w in zip(tables, streams(whole.content, len(takes)), strict=True))


def test_large_frames_from_the_segments_of_several_video_files_are_each_rows_own(root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warmed = run_cli("warm", BIG, "--videos", "--root", str(root), "--cache-dir", str(cache))
    assert warmed.returncode == 0, warmed.stderr
    take = {"dataset": BIG, "indices": [0, 100, 5, 90, 83, 84], "columns": [TOP, "episode_index", "frame_index"]}
    env = ENV | {"EPISERVE_VIDEO_CACHE_POLICY": "warmed"}  # every frame from the segments `warm` built
    with ServerProcess([root], cache, env=env) as server, http_of(server) as http:
        path, body = alone(take)
        together, single = http.post(TAKES, json={"takes": [take, GOOD]}), http.post(path, json=body)
    assert together.status_code == single.status_code == 200
    for stream in (streams(together.content, 2)[0], single.content):
        assert_take_equals_oracle(root, take, read_stream(stream))


def test_each_take_finds_its_frames_within_its_own_tolerance(root: Path, servers: dict[str, ServerProcess]) -> None:
    good, bad = shifted_rows(root)
    lenient = {"dataset": SHIFTED, "indices": [bad, good[0], bad], "columns": [TOP], "tolerance_s": 0.02}
    strict = {"dataset": SHIFTED, "indices": [bad], "columns": [TOP]}
    with http_of(servers["off"]) as http:
        answer = http.post(TAKES, json={"takes": [lenient, GOOD]})
        assert answer.status_code == 200, answer.text
        assert_problem(http.post(TAKES, json={"takes": [strict, lenient]}), 422, named(0, SHIFTED), "tolerance_s")
    rows = oracle(root / SHIFTED, None).take(pa.array(lenient["indices"]))
    keys = zip(rows["episode_index"].to_pylist(), rows["frame_index"].to_pylist(), strict=True)
    want = frames_for_rows(root / SHIFTED, TOP, keys, tolerance_s=0.02)
    got = read_stream(streams(answer.content, 2)[0])[TOP].combine_chunks().to_numpy_ndarray()
    assert np.array_equal(got, want)


# --- the client -----------------------------------------------------------------------------------------------


def client_takes(root: Path) -> list[tuple[episerve.Selection, list[int]]]:
    rng = np.random.default_rng(12)
    a_rows = view(root, ROBOT_A, [5, 0]).num_rows
    b_rows = view(root, ROBOT_B, None).num_rows
    return [
        (episerve.Selection.of(GENERIC, None, ["value", "label"]), [3, 3, 0, 17]),
        (episerve.Selection.of(ROBOT_A, [5, 0], ["index", TOP]), rng.integers(0, a_rows, 30).tolist()),
        (episerve.Selection.of(ROBOT_B, None, [HIGH, "index"], frame_size=(32, 48)), [b_rows - 1, 0, 7]),
        (episerve.Selection.of(ROBOT_B, "1", ["index"]), []),
        (
            episerve.Selection.of(ROBOT_B, "2,4", ["action", "index"], delta_timestamps={"action": [-1 / 15, 0]}),
            [0, 5, 1],
        ),
    ]


def test_read_takes_equals_a_read_take_of_each_in_one_request(root: Path, servers: dict[str, ServerProcess]) -> None:
    takes = client_takes(root)
    with episerve.Client(servers["on"].url, token=TOKEN) as client, http_of(servers["on"]) as http:
        alone = [client.read_take(selection, indices) for selection, indices in takes]
        requests, singles = requests_of(http, TAKES_ENDPOINT), requests_of(http, TAKE_ENDPOINT)
        together = client.read_takes(takes)
        assert client.read_takes([]) == []
        assert requests_of(http, TAKES_ENDPOINT) == requests + 1
        assert requests_of(http, TAKE_ENDPOINT) == singles
    assert len(together) == len(takes)
    for (selection, indices), mine, theirs in zip(takes, together, alone, strict=True):
        assert mine.table.equals(theirs.table), selection
        assert mine.table.num_rows == len(indices)
        assert mine.total_rows == theirs.total_rows == view(root, selection.dataset_id, selection.episodes).num_rows
    assert (
        together[0].table.to_pydict()
        == oracle(root / GENERIC, None).select(["value", "label"]).take([3, 3, 0, 17]).to_pydict()
    )
    with episerve.Client(servers["off"].url, token=TOKEN, compression="lz4") as packed:
        compressed = packed.read_takes(takes)
    assert [p.table.equals(q.table) for p, q in zip(compressed, together, strict=True)] == [True] * len(takes)


def test_read_takes_with_the_cache_dir_reads_the_frames_from_the_servers_segments(
    root: Path, servers: dict[str, ServerProcess]
) -> None:
    server = servers["on"]  # first touch builds each video's decoded-frame segment in the background
    rows = view(root, ROBOT_A, None).num_rows
    takes = [
        (
            episerve.Selection.of(ROBOT_A, None, [TOP, "index"]),
            [5, *np.random.default_rng(14).integers(0, rows, 38), 5],
        ),
        (episerve.Selection.of(GENERIC, None, ["value"]), [2, 1]),
    ]
    frame_bytes = 40 * 48 * 64 * 3
    with (
        episerve.Client(server.url, token=TOKEN) as plain,
        episerve.Client(server.url, token=TOKEN, cache_dir=server.cache_dir) as local,
        http_of(server) as http,
    ):
        want = plain.read_takes(takes)

        def read_from_the_files() -> bool:
            sent = metric(http.get("/metrics").text, "episerve_response_bytes_total", endpoint=TAKES_ENDPOINT)
            assert sent >= frame_bytes  # the pixels `plain` was sent, at least
            got = local.read_takes(takes)
            assert got[0].table.column_names == [TOP, "index"]
            assert got[0].table["index"].equals(want[0].table["index"])
            frames = got[0].table[TOP].combine_chunks().to_numpy_ndarray()
            assert np.array_equal(frames, want[0].table[TOP].combine_chunks().to_numpy_ndarray())
            assert got[1].table.equals(want[1].table)
            after = metric(http.get("/metrics").text, "episerve_response_bytes_total", endpoint=TAKES_ENDPOINT)
            return after - sent < frame_bytes / 4  # references, not pixels, came over the socket

        eventually(read_from_the_files, 120)


def test_read_takes_over_the_servers_limit_falls_back_to_paged_takes(
    root: Path, servers: dict[str, ServerProcess]
) -> None:
    generic = oracle(root / GENERIC, None)
    robot = oracle(root / ROBOT_A, None)
    rng = np.random.default_rng(13)
    takes = [
        (episerve.Selection.of(GENERIC, None, ["value"]), rng.integers(0, generic.num_rows, 200).tolist()),
        (episerve.Selection.of(ROBOT_A, None, ["index"]), rng.integers(0, robot.num_rows, LIMIT + 50).tolist()),
    ]
    with episerve.Client(servers["on"].url, token=TOKEN) as client, http_of(servers["on"]) as http:
        refused, singles = requests_of(http, TAKES_ENDPOINT, "413"), requests_of(http, TAKE_ENDPOINT)
        pages = client.read_takes(takes)
        assert requests_of(http, TAKES_ENDPOINT, "413") == refused + 1  # told the limit once
        assert requests_of(http, TAKE_ENDPOINT) == singles + 3  # then 200 indices, and 300 + 50
        assert [len(p.bodies) for p in pages] == [1, 2]
        assert pages[0].table["value"].to_pylist() == generic["value"].take(takes[0][1]).to_pylist()
        assert pages[1].table["index"].to_pylist() == robot["index"].take(takes[1][1]).to_pylist()
        again = client.read_takes(takes)  # the limit is known now: no request the server would refuse
        assert requests_of(http, TAKES_ENDPOINT, "413") == refused + 1
        assert [p.table.equals(q.table) for p, q in zip(pages, again, strict=True)] == [True, True]
        requests = requests_of(http, TAKES_ENDPOINT)
        small = client.read_takes([(takes[0][0], takes[0][1][:100]), (takes[1][0], takes[1][1][: LIMIT - 100])])
        assert requests_of(http, TAKES_ENDPOINT) == requests + 1  # within the limit: one request again
        assert [len(p.bodies) for p in small] == [1, 1]
        assert small[1].table["index"].to_pylist() == robot["index"].take(takes[1][1][: LIMIT - 100]).to_pylist()


def test_read_takes_whose_bodies_together_exceed_the_body_limit_falls_back_to_one_take_each(
    root: Path, servers: dict[str, ServerProcess]
) -> None:
    spec = ",".join(["1", "0"] * 24_000)  # 96 KB of episodes spec: a take fits the body limit, three do not
    takes = [(episerve.Selection.of(ROBOT_A, spec, ["index"]), [n, 0, n]) for n in (3, 5, 7)]
    want = oracle(root / ROBOT_A, [0, 1])["index"].to_pylist()
    with episerve.Client(servers["on"].url, token=TOKEN) as client:
        alone = [client.read_take(selection, indices) for selection, indices in takes]
        assert [p.table["index"].to_pylist() for p in alone] == [[want[n], want[0], want[n]] for n in (3, 5, 7)]
        together = client.read_takes(takes)
    assert [p.table.equals(q.table) for p, q in zip(together, alone, strict=True)] == [True] * 3


class OlderServer(ThreadingHTTPServer):
    """A stand-in for a server without `POST /takes`: it answers that route as ours answers an unknown one (404,
    "no route POST /takes"), and `POST /datasets/x/rows/take` with a real Arrow stream of `TABLE`. A take of
    dataset `gone` is answered 404 as ours answers an unknown dataset."""

    TABLE = pa.table({"x": pa.array(np.arange(10) * 3, pa.int64()), "y": pa.array([f"r{i}" for i in range(10)])})

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), OlderHandler)
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class OlderHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: OlderServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.paths.append(self.path)
        if self.path == "/takes" and any(take["dataset"] == "gone" for take in body["takes"]):
            self._problem(404, "takes[0] (dataset 'gone'): no dataset 'gone'")
        elif self.path == "/takes":
            self._problem(404, "no route POST /takes")
        elif self.path == "/datasets/x/rows/take":
            rows = OlderServer.TABLE.take(pa.array(body["indices"], pa.int64()))
            table = rows.select(body.get("columns", OlderServer.TABLE.column_names))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            self._answer(200, ARROW, sink.getvalue().to_pybytes(), {"X-Total-Rows": "10", "X-Row-Count": "0"})
        else:
            self._problem(404, f"no route POST {self.path}")

    def _problem(self, status: int, detail: str) -> None:
        problem = {"type": "about:blank", "title": "Not Found", "status": status, "detail": detail}
        self._answer(status, "application/problem+json", json.dumps(problem).encode(), {})

    def _answer(self, status: int, media: str, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


@pytest.fixture
def older_server() -> Iterator[OlderServer]:
    server = OlderServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_read_takes_falls_back_to_one_take_each_on_a_server_without_the_route(older_server: OlderServer) -> None:
    takes = [
        (episerve.Selection.of("x", None, ["y", "x"]), [9, 0, 9]),
        (episerve.Selection.of("x"), []),
        (episerve.Selection.of("x", None, ["x"]), [4]),
    ]
    with episerve.Client(older_server.url, retries=1) as client:
        pages = client.read_takes(takes)
        assert older_server.paths == ["/takes", *["/datasets/x/rows/take"] * 3]
        again = client.read_takes(takes)  # the route is known missing: not asked again
        assert older_server.paths[4:] == ["/datasets/x/rows/take"] * 3
    table = OlderServer.TABLE
    for (selection, indices), first, second in zip(takes, pages, again, strict=True):
        want = table.take(pa.array(indices, pa.int64())).select(list(selection.columns or table.column_names))
        assert first.table.equals(want) and second.table.equals(want)
        assert first.total_rows == 10


def test_a_missing_dataset_is_not_taken_for_a_missing_route(older_server: OlderServer) -> None:
    with (
        episerve.Client(older_server.url, retries=1) as client,
        pytest.raises(episerve.NotFound, match="no dataset 'gone'"),
    ):
        client.read_takes([(episerve.Selection.of("gone"), [0]), (episerve.Selection.of("x"), [1])])
    assert older_server.paths == ["/takes"]


# --- a mixture's batches --------------------------------------------------------------------------------------


MIXTURE = episerve.Mixture([{"dataset": ROBOT_A, "weight": 2}, {"dataset": ROBOT_B, "features": {HIGH: TOP}}])
MIXED = ["action", TOP, "index", "episode_index", "frame_index"]


def test_each_batch_of_a_mixture_through_a_dataloader_is_one_takes_request(
    root: Path, servers: dict[str, ServerProcess]
) -> None:
    server = servers["on"]
    dataset = episerve.MixtureDataset(server.url, MIXTURE, MIXED, output="numpy", token=TOKEN, seed=4)
    batches = [list(range(start, start + 8)) for start in range(0, 48, 8)]
    with http_of(server) as http:
        requests, singles = requests_of(http, TAKES_ENDPOINT), requests_of(http, TAKE_ENDPOINT)
        loader = DataLoader(dataset, batch_sampler=batches, collate_fn=episerve.collate, num_workers=2)
        got = list(loader)
        assert requests_of(http, TAKES_ENDPOINT) == requests + len(batches)
        assert requests_of(http, TAKE_ENDPOINT) == singles
    assert len(got) == len(batches)
    for positions, batch in zip(batches, got, strict=True):
        components, rows = dataset.plan.locate(0, np.asarray(positions))
        assert np.asarray(batch["dataset_index"]).tolist() == components.tolist()
        for k, component in enumerate(MIXTURE.components):
            mine = components == k
            if not mine.any():
                continue
            own = oracle(root / component.dataset, None).take(pa.array(rows[mine]))
            assert np.asarray(batch["index"])[mine].tolist() == own["index"].to_pylist()
            actions = np.asarray(own["action"].to_pylist(), dtype=np.float32)
            got_actions = np.asarray(batch["action"])[mine]
            np.testing.assert_array_equal(got_actions[:, : actions.shape[1]], actions)
            keys = zip(own["episode_index"].to_pylist(), own["frame_index"].to_pylist(), strict=True)
            camera = TOP if component.dataset == ROBOT_A else HIGH
            frames = frames_for_rows(root / component.dataset, camera, keys, size=(48, 64))
            np.testing.assert_array_equal(np.asarray(batch[TOP])[mine], frames.transpose(0, 3, 1, 2))


def test_each_batch_of_a_streamed_mixture_through_a_dataloader_is_one_takes_request(
    root: Path, servers: dict[str, ServerProcess]
) -> None:
    server = servers["on"]
    dataset = episerve.MixtureIterableDataset(
        server.url, MIXTURE, ["index"], batch_size=8, epoch_size=48, output="numpy", token=TOKEN, seed=5
    )
    with http_of(server) as http:
        requests, singles = requests_of(http, TAKES_ENDPOINT), requests_of(http, TAKE_ENDPOINT)
        got = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert requests_of(http, TAKES_ENDPOINT) == requests + 6
        assert requests_of(http, TAKE_ENDPOINT) == singles
    components, rows = dataset.source.plan.locate(0, np.arange(48))
    views = [oracle(root / component.dataset, None)["index"].to_numpy() for component in MIXTURE.components]
    expected = sorted((int(k), int(views[k][r])) for k, r in zip(components, rows, strict=True))
    delivered = [(int(k), int(i)) for batch in got for k, i in zip(batch["dataset_index"], batch["index"], strict=True)]
    assert len(got) == 6 and sorted(delivered) == expected


# --- the API description -------------------------------------------------------------------------------------


def json_refs(node: Any) -> Iterator[str]:
    """Every `$ref` in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from json_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from json_refs(value)


def resolves(document: dict[str, Any], ref: str) -> bool:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_reference_in_the_api_description_resolves(servers: dict[str, ServerProcess]) -> None:
    with http_of(servers["on"]) as http:
        document = http.get("/openapi.json").json()
    assert "/takes" in document["paths"]
    refs = set(json_refs(document))
    assert "#/components/schemas/Problem" in refs
    assert [ref for ref in sorted(refs) if not resolves(document, ref)] == []


# --- the access log -------------------------------------------------------------------------------------------


def test_successful_takes_are_logged_at_debug_like_other_row_reads(root: Path, tmp_path: Path) -> None:
    env = ENV | {"EPISERVE_LOG_LEVEL": "info"}
    with ServerProcess([root], tmp_path / "cache", env=env) as server, http_of(server) as http:
        for _ in range(3):
            assert http.post("/datasets/generic/rows/take", json={"indices": [0]}).status_code == 200
            assert http.post(TAKES, json={"takes": [GOOD]}).status_code == 200
        assert http.post(TAKES, json={"takes": []}).status_code == 422
    log = server.log_path.read_text()
    assert "POST /takes 422" in log  # a failed one is still an INFO line
    assert "POST /datasets/generic/rows/take 200" not in log
    assert "POST /takes 200" not in log
