"""Temporal windows (`delta_timestamps`) equal a plain per-row reference of LeRobot's rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.demo import write_demo_dataset
from tests.support import ServerProcess, oracle, read_stream
from tests.test_errors import assert_problem

FPS = 30
HYPOTHESIS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def reference_windows(
    view: pa.Table, rows: list[int], column: str, deltas: list[float], fps: float
) -> tuple[list, list]:
    """Obviously-correct LeRobot semantics, one row and one offset at a time."""
    episodes = view["episode_index"].to_pylist()
    values = view[column].to_pylist()
    windows, pads = [], []
    for i in rows:
        first = episodes.index(episodes[i])
        last = len(episodes) - 1 - episodes[::-1].index(episodes[i])
        window, pad = [], []
        for d in deltas:
            target = i + round(d * fps)
            window.append(values[min(max(target, first), last)])
            pad.append(target < first or target > last)
        windows.append(window)
        pads.append(pad)
    return windows, pads


def assert_windows_match(
    table: pa.Table, view: pa.Table, rows: list[int], deltas: dict[str, list[float]], fps: float
) -> None:
    for column, offsets in deltas.items():
        expected, expected_pad = reference_windows(view, rows, column, offsets, fps)
        assert table[column].type == pa.list_(view.schema.field(column).type, len(offsets))
        assert table[column].to_pylist() == expected, column
        assert table[f"{column}_is_pad"].to_pylist() == expected_pad, column
    untouched = [c for c in view.column_names if c not in deltas]
    assert table.select(untouched).to_pylist() == view.take(pa.array(rows, pa.int64())).select(untouched).to_pylist()


offsets_strategy = st.lists(st.integers(-90, 90), min_size=1, max_size=6).map(lambda ks: [k / FPS for k in ks])


@pytest.fixture(scope="module")
def window_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("window-datasets")
    for seed in range(3):
        write_demo_dataset(root / f"random-{seed}", episodes=12 + 7 * seed, seed=100 + seed, files=2 + seed, cameras={})
    with ServerProcess([root], tmp_path_factory.mktemp("window-cache")) as server:
        server.datasets_root = root
        yield server


@pytest.fixture(scope="module")
def window_http(window_server: ServerProcess) -> Iterator[httpx.Client]:
    """One client of the window server for every example (a new one per request costs tens of ms of CPU)."""
    with window_server.client(timeout=30) as http:
        yield http


@HYPOTHESIS
@given(data=st.data())
def test_take_windows_equal_reference(window_server: Any, window_http: httpx.Client, data: st.DataObject) -> None:
    seed = data.draw(st.integers(0, 2), label="dataset")
    dataset = f"random-{seed}"
    episodes = data.draw(st.lists(st.integers(0, 11 + 7 * seed), min_size=1, max_size=5), label="pick")
    view = oracle(window_server.datasets_root / dataset, episodes)
    rows = data.draw(st.lists(st.integers(0, view.num_rows - 1), min_size=1, max_size=40), label="rows")
    deltas = {"action": data.draw(offsets_strategy), "index": data.draw(offsets_strategy)}
    body = {"indices": rows, "episodes": episodes, "delta_timestamps": deltas}
    response = window_http.post(f"/datasets/{dataset}/rows/take", json=body)
    assert response.status_code == 200, response.text
    assert_windows_match(read_stream(response.content), view, rows, deltas, FPS)


@HYPOTHESIS
@given(data=st.data())
def test_rows_windows_equal_reference(window_server: Any, window_http: httpx.Client, data: st.DataObject) -> None:
    episodes = data.draw(st.lists(st.integers(0, 11), min_size=1, max_size=4), label="pick")
    view = oracle(window_server.datasets_root / "random-0", episodes)
    start = data.draw(st.integers(0, view.num_rows - 1))
    stop = data.draw(st.integers(start, view.num_rows))
    deltas = {"observation.state": data.draw(offsets_strategy)}
    params = {
        "episodes": ",".join(map(str, episodes)),
        "start": start,
        "stop": stop,
        "delta_timestamps": json.dumps(deltas),
        "columns": "episode_index,observation.state",
    }
    response = window_http.get("/datasets/random-0/rows", params=params)
    assert response.status_code == 200, response.text
    table = read_stream(response.content)
    assert table.column_names == ["episode_index", "observation.state", "observation.state_is_pad"]
    assert_windows_match(
        table, view.select(["episode_index", "observation.state"]), list(range(start, stop)), deltas, FPS
    )


def test_windows_at_first_and_last_frame_of_every_episode(window_server: Any) -> None:
    view = oracle(window_server.datasets_root / "random-2", None)
    episodes = view["episode_index"].to_numpy()
    edges = np.flatnonzero(np.diff(episodes)) + 1
    rows = sorted({0, view.num_rows - 1, *edges.tolist(), *(edges - 1).tolist()})
    lengths = np.bincount(episodes)
    assert 1 in lengths.tolist()  # the demo always holds an episode of length 1
    deltas = {"action": [k / FPS for k in (-1000, -2, -1, 0, 1, 2, 1000)], "timestamp": [0.0]}
    body = {"indices": rows, "delta_timestamps": deltas}
    response = httpx.post(f"{window_server.url}/datasets/random-2/rows/take", json=body, timeout=30)
    assert response.status_code == 200, response.text
    table = read_stream(response.content)
    assert_windows_match(table, view, rows, deltas, FPS)
    single = [i for i, r in enumerate(rows) if lengths[episodes[r]] == 1]
    for i in single:  # a one-frame episode: every offset but 0 is padding, all values are that frame
        assert table["action_is_pad"][i].as_py() == [True, True, True, False, True, True, True]


def test_windows_cross_source_files_but_never_episodes(http: httpx.Client, datasets_root: Path) -> None:
    view = oracle(datasets_root / "generic", None)
    rows = list(range(view.num_rows))
    deltas = {"value": [-0.3, -0.1, 0.0, 0.1, 0.2], "label": [0.1]}
    response = http.post("/datasets/generic/rows/take", json={"indices": rows, "delta_timestamps": deltas})
    assert response.status_code == 200, response.text
    assert_windows_match(read_stream(response.content), view, rows, deltas, 10)


def test_tolerance_can_be_widened_per_request(http: httpx.Client) -> None:
    body = {"indices": [5], "delta_timestamps": {"index": [0.033]}}
    assert_problem(http.post("/datasets/lerobot/demo-v3/rows/take", json=body), 422, "0.033", "nearest valid")
    relaxed = http.post("/datasets/lerobot/demo-v3/rows/take", json={**body, "tolerance_s": 1e-3})
    assert relaxed.status_code == 200
    assert read_stream(relaxed.content)["index"].to_pylist() == [[6]]


V3 = "/datasets/lerobot/demo-v3"


@pytest.mark.parametrize(
    ("deltas", "status", "phrases"),
    [
        ({"nope": [0.0]}, 422, ["unknown column 'nope'"]),
        ({"action": []}, 422, ["'action'", "empty"]),
        ({}, 422, ["empty"]),
        ({"action": [0.01]}, 422, ["0.01", "nearest valid: 0.0"]),
        ({"action": [0.05]}, 422, ["0.05", "nearest valid: 0.0666"]),
        ({"action": [0.0] * 1025}, 413, ["1025 offsets", "limit is 1024"]),
        ({"action": ["soon"]}, 422, ["action"]),
    ],
)
def test_bad_delta_timestamps_are_rejected(http: httpx.Client, deltas: dict, status: int, phrases: list[str]) -> None:
    assert_problem(http.post(f"{V3}/rows/take", json={"indices": [0], "delta_timestamps": deltas}), status, *phrases)
    get = http.get(f"{V3}/rows", params={"stop": 3, "delta_timestamps": json.dumps(deltas)})
    assert_problem(get, status, *phrases)


def test_non_finite_offsets_are_rejected(http: httpx.Client) -> None:
    for text in ('{"action": [Infinity]}', '{"action": [NaN]}', '{"action": [1e999]}'):
        response = http.get(f"{V3}/rows", params={"stop": 3, "delta_timestamps": text})
        assert response.status_code == 422, (text, response.text)
        assert "action" in response.json()["detail"]


def test_malformed_delta_timestamps_query_is_422(http: httpx.Client) -> None:
    assert_problem(http.get(f"{V3}/rows", params={"delta_timestamps": "{not json"}), 422, "delta_timestamps")
    assert_problem(http.get(f"{V3}/rows", params={"delta_timestamps": "[1, 2]"}), 422, "delta_timestamps")


def test_windows_on_dataset_without_fps_are_422(http: httpx.Client) -> None:
    body = {"indices": [0], "delta_timestamps": {"x": [0.0]}}
    assert_problem(http.post("/datasets/plain/rows/take", json=body), 422, "no fps")


def test_window_gather_size_is_limited(datasets_root: Path, tmp_path: Path) -> None:
    env = {"EPISERVE_MAX_WINDOW_VALUES": "100"}
    with ServerProcess([datasets_root], tmp_path / "cache", env=env) as server:
        body = {"indices": list(range(30)), "delta_timestamps": {"action": [0.0, 1 / 30, 2 / 30, 3 / 30]}}
        response = httpx.post(f"{server.url}{V3}/rows/take", json=body)
        assert_problem(response, 413, "120 window values", "limit is 100")


@HYPOTHESIS
@given(data=st.data())
def test_windows_through_a_dataloader_equal_reference(window_server: Any, data: st.DataObject) -> None:
    torch = pytest.importorskip("torch")

    import episerve

    episodes = data.draw(st.lists(st.integers(0, 18), min_size=1, max_size=6), label="pick")
    deltas = {"action": data.draw(offsets_strategy, label="action"), "observation.state": [-1 / FPS, 0.0]}
    view = oracle(window_server.datasets_root / "random-1", episodes)
    dataset = episerve.EpisodeDataset(
        window_server.url,
        "random-1",
        episodes=episodes,
        columns=["index", "action", "observation.state"],
        delta_timestamps=deltas,
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=episerve.collate)
    seen = 0
    for batch in loader:
        rows = list(range(seen, seen + len(batch["index"])))
        assert batch["index"].tolist() == view["index"].to_numpy()[rows].tolist()
        for column, offsets in deltas.items():
            expected, expected_pad = reference_windows(view, rows, column, offsets, FPS)
            assert tuple(batch[column].shape) == (len(rows), len(offsets), 6)
            assert np.array_equal(batch[column].numpy(), np.asarray(expected, dtype=np.float32))
            assert batch[f"{column}_is_pad"].tolist() == expected_pad
        seen += len(rows)
    assert seen == view.num_rows


@pytest.mark.parametrize("far", ["1e18", "1e300", "9" * 400])
def test_huge_offsets_pad_with_the_last_or_first_frame_of_the_episode(
    http: httpx.Client, datasets_root: Path, far: str
) -> None:
    view = oracle(datasets_root / "lerobot" / "demo-v3", [4])
    first, last = view["index"][0].as_py(), view["index"][-1].as_py()
    rows = [0, 3, view.num_rows - 1]
    windows = f'{{"index": [{far}, -{far}, 0]}}'
    body = f'{{"indices": {rows}, "episodes": [4], "columns": ["index"], "delta_timestamps": {windows}}}'
    take = http.post(f"{V3}/rows/take", content=body, headers={"Content-Type": "application/json"})
    assert take.status_code == 200, take.text
    params = {"episodes": "4", "columns": "index", "delta_timestamps": windows}
    whole = http.get(f"{V3}/rows", params=params)
    assert whole.status_code == 200, whole.text
    expected = [[last, first, view["index"][r].as_py()] for r in rows]
    for table in (read_stream(take.content), read_stream(whole.content).take(rows)):
        assert table["index"].to_pylist() == expected
        assert table["index_is_pad"].to_pylist() == [[True, True, False]] * len(rows)


def test_non_finite_offsets_in_a_body_are_rejected(http: httpx.Client) -> None:
    for text in ("1e400", "-1e999"):
        body = f'{{"indices": [0], "delta_timestamps": {{"action": [0, {text}]}}}}'
        response = http.post(f"{V3}/rows/take", content=body, headers={"Content-Type": "application/json"})
        assert_problem(
            response, 422, "delta_timestamps['action'] holds non-finite offsets", "finite numbers of seconds"
        )
