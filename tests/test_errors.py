"""Every bad input gets a 4xx JSON problem that names what was wrong — never a 500 or a hang."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support import assert_tables_equal, oracle, read_stream

V3 = "/datasets/lerobot/demo-v3"


def assert_problem(response: httpx.Response, status: int, *phrases: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert set(body) >= {"type", "title", "status", "detail"}
    for phrase in phrases:
        assert phrase in body["detail"], (phrase, body["detail"])
    return body


@pytest.mark.parametrize(
    ("spec", "phrase"),
    [
        ("abc", "invalid term 'abc'"),
        ("-3", "invalid term '-3'"),
        ("1,,2", "invalid term ''"),
        ("5-2", "end is before start"),
        ("1.5", "invalid term '1.5'"),
        ("", "episodes spec is empty"),
    ],
)
def test_malformed_episode_spec_is_422(http: httpx.Client, spec: str, phrase: str) -> None:
    assert_problem(http.get(f"{V3}/rows", params={"episodes": spec}), 422, phrase)


def test_unknown_episodes_are_404_and_named(http: httpx.Client) -> None:
    assert_problem(http.get(f"{V3}/rows", params={"episodes": "3,60,75-80"}), 404, "60", "75-80")


def test_huge_episode_range_is_answered_without_expanding_it(http: httpx.Client) -> None:
    body = assert_problem(http.get(f"{V3}/rows", params={"episodes": "0-999999999999"}), 404)
    assert "60-999999999999" in body["detail"]


def test_start_after_stop_is_422(http: httpx.Client) -> None:
    assert_problem(http.get(f"{V3}/rows", params={"start": 10, "stop": 3}), 422, "start (10) is greater than stop (3)")


@pytest.mark.parametrize("params", [{"start": -1}, {"stop": -5}, {"start": "x"}, {"stop": 2**70}])
def test_negative_or_non_integer_bounds_are_422(http: httpx.Client, params: dict) -> None:
    body = assert_problem(http.get(f"{V3}/rows", params=params), 422)
    assert next(iter(params)) in body["detail"]


def test_range_past_the_end_is_clamped_like_a_python_slice(http: httpx.Client) -> None:
    response = http.get(f"{V3}/rows", params={"episodes": "0", "start": 10_000, "stop": 20_000})
    assert response.status_code == 200
    assert response.headers["x-start"] == response.headers["x-stop"] == response.headers["x-total-rows"]


def test_unknown_columns_are_422_and_named(http: httpx.Client) -> None:
    assert_problem(http.get(f"{V3}/rows", params={"columns": "index,nope,also_nope"}), 422, "'nope'", "'also_nope'")
    taken = http.post(f"{V3}/rows/take", json={"indices": [0], "columns": ["ghost"]})
    assert_problem(taken, 422, "'ghost'")


def test_duplicate_columns_are_422(http: httpx.Client) -> None:
    assert_problem(http.get(f"{V3}/rows", params={"columns": "index,index"}), 422, "more than once")


def test_unknown_dataset_is_404(http: httpx.Client) -> None:
    assert_problem(http.get("/datasets/nobody/nothing/rows"), 404, "'nobody/nothing'")
    assert_problem(http.get("/datasets/missing"), 404, "'missing'")


@pytest.mark.parametrize(
    ("path", "phrase"),
    [
        ("/datasets/lerobot/%2e%2e/rows", "'..'"),
        ("/datasets/%2e%2e/%2e%2e/etc/rows", "'..'"),
        ("/datasets/%2Fetc%2Fpasswd/rows", "absolute path"),
        ("/datasets/lerobot%5Cdemo-v3/rows", "backslashes"),
        ("/datasets/a/b/c/rows", "more than one '/'"),
    ],
)
def test_ids_that_could_leave_the_root_are_rejected(http: httpx.Client, path: str, phrase: str) -> None:
    assert_problem(http.get(path), 422, phrase)


def test_symlink_leaving_the_root_is_not_served(server, http: httpx.Client, tmp_path) -> None:
    from app.demo import write_demo_dataset

    outside = write_demo_dataset(tmp_path / "outside", episodes=3)
    link = server.roots[0] / "escape"
    link.symlink_to(outside, target_is_directory=True)
    try:
        assert_problem(http.get("/datasets/escape/rows"), 404, "'escape'")
    finally:
        link.unlink()


def test_episodes_on_dataset_without_episode_column_is_422(http: httpx.Client) -> None:
    assert_problem(http.get("/datasets/plain/rows", params={"episodes": "0"}), 422, "no episode column")


def test_too_many_rows_for_one_response_is_413(datasets_root, tmp_path) -> None:
    from tests.support import ServerProcess

    env = {
        "EPISERVE_MAX_ROWS_PER_RESPONSE": "100",
        "EPISERVE_MAX_TAKE_INDICES": "10",
        "EPISERVE_MAX_BODY_BYTES": "2048",
        "EPISERVE_MAX_EPISODE_SPEC_CHARS": "20",
    }
    with ServerProcess([datasets_root], tmp_path / "cache", env=env) as server, server.client() as c:
        assert assert_problem(c.get(f"{V3}/rows"), 413, "limit is 100 rows")["limit"] == 100
        assert c.get(f"{V3}/rows", params={"stop": 100}).status_code == 200
        too_many = assert_problem(c.post(f"{V3}/rows/take", json={"indices": list(range(11))}), 413, "limit is 10")
        assert too_many["limit"] == 10
        assert_problem(c.post(f"{V3}/rows", json={"stop": 101}), 413, "limit is 100 rows")
        assert_problem(c.post(f"{V3}/rows/take", json={"indices": [0] * 10, "pad": "x" * 4000}), 413, "2048 bytes")
        assert_problem(c.get(f"{V3}/rows", params={"episodes": ",".join(["1"] * 20)}), 413, "limit is 20")


def test_take_index_out_of_range_is_422(http: httpx.Client) -> None:
    assert_problem(http.post(f"{V3}/rows/take", json={"indices": [0, 10**9]}), 422, "out of range", "1000000000")


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        ({"indices": [-1]}, "indices.0"),
        ({"indices": ["1"]}, "indices.0"),
        ({"indices": [1.5]}, "indices.0"),
        ({}, "indices"),
        ({"indices": [0], "episodes": [-2]}, "episodes"),
        ({"indices": [0], "surprise": 1}, "surprise"),
        ([1, 2], "body"),
    ],
)
def test_invalid_take_body_is_422(http: httpx.Client, body: object, phrase: str) -> None:
    assert_problem(http.post(f"{V3}/rows/take", json=body), 422, phrase)


def test_non_json_take_body_is_400(http: httpx.Client) -> None:
    response = http.post(f"{V3}/rows/take", content=b"{not json", headers={"content-type": "application/json"})
    assert_problem(response, 400, "not valid JSON")


def test_wrong_content_type_is_415(http: httpx.Client) -> None:
    response = http.post(f"{V3}/rows/take", content=b"indices=1", headers={"content-type": "text/plain"})
    assert_problem(response, 415, "application/json", "text/plain")


def test_unknown_route_and_method_are_problems(http: httpx.Client) -> None:
    assert_problem(http.get("/nowhere"), 404, "/nowhere")
    assert_problem(http.delete("/datasets"), 405, "DELETE is not allowed on /datasets; allowed: GET")
    assert http.delete("/datasets").headers["allow"] == "GET"
    assert "POST" in http.put(f"{V3}/rows/take").headers["allow"].split(", ")
    assert set(http.delete(f"{V3}/rows").headers["allow"].split(", ")) == {"GET", "POST"}


@pytest.mark.parametrize(
    ("body", "status", "phrase"),
    [
        ({"start": 9, "stop": 2}, 422, "start (9) is greater than stop (2)"),
        ({"start": -1}, 422, "start"),
        ({"episodes": "2-1"}, 422, "end is before start"),
        ({"episodes": [1000]}, 404, "1000"),
        ({"columns": ["nope"]}, 422, "'nope'"),
        ({"rows": 3}, 422, "rows"),
    ],
)
def test_invalid_post_rows_body_is_rejected(http: httpx.Client, body: dict, status: int, phrase: str) -> None:
    assert_problem(http.post(f"{V3}/rows", json=body), status, phrase)


ROWS_ACCEPTS = (
    "this endpoint accepts: columns, compression, delta_timestamps, episodes, frame_size, frames, start, stop, "
    "tolerance_s"
)


@pytest.mark.parametrize(
    ("method", "path", "query", "phrases"),
    [
        (
            "GET",
            f"{V3}/rows",
            "episode=1",
            ["unknown query parameter 'episode' (did you mean 'episodes'?)", ROWS_ACCEPTS],
        ),
        (
            "GET",
            f"{V3}/rows",
            "episodes=1&column=action&zzz=2",
            ["unknown query parameters 'column' (did you mean 'columns'?), 'zzz'; ", ROWS_ACCEPTS],
        ),
        ("GET", V3, "verbose=1", ["unknown query parameter 'verbose'; this endpoint takes no query parameters"]),
        ("GET", "/datasets", "limit=5", ["unknown query parameter 'limit'"]),
        ("GET", f"{V3}/episodes", "episodes=1", ["unknown query parameter 'episodes'"]),
        ("GET", f"{V3}/cache", "episodes=1", ["unknown query parameter 'episodes'"]),
        ("POST", f"{V3}/cache", "episodes=1", ["unknown query parameter 'episodes'"]),
        ("POST", f"{V3}/rows", "stop=3", ["unknown query parameter 'stop'; this endpoint takes no query parameters"]),
        ("POST", f"{V3}/rows/take", "indices=3", ["unknown query parameter 'indices'"]),
    ],
)
def test_unknown_query_parameters_are_422_naming_them_and_the_nearest_valid_name(
    http: httpx.Client, method: str, path: str, query: str, phrases: list[str]
) -> None:
    body = {"indices": [0]} if path.endswith("take") else {}
    response = http.request(method, f"{path}?{query}", json=body if method == "POST" else None)
    assert_problem(response, 422, *phrases)


@pytest.mark.parametrize("lane", ["event loop", "pool"])
def test_repeated_episodes_and_columns_are_their_union(http: httpx.Client, datasets_root, lane: str) -> None:
    compressed = {"compression": "none"} if lane == "pool" else {}  # a compressed slice is read in the pool
    query = [("episodes", "5"), ("episodes", "2-3"), ("columns", "episode_index"), ("columns", "index")]
    response = http.get(f"{V3}/rows", params=[*query, *compressed.items()])
    assert response.status_code == 200, response.text
    table = read_stream(response.content)
    expected = oracle(datasets_root / "lerobot" / "demo-v3", [2, 3, 5]).select(["episode_index", "index"])
    assert table.column_names == ["episode_index", "index"]
    assert_tables_equal(table, expected)


@pytest.mark.parametrize(
    ("path", "query", "name"),
    [
        (f"{V3}/rows", "stop=3&stop=4", "stop"),
        (f"{V3}/rows", "start=1&episodes=2&start=0", "start"),
        (f"{V3}/rows", "delta_timestamps={}&delta_timestamps={}", "delta_timestamps"),
    ],
)
def test_a_repeated_parameter_that_is_not_a_list_is_422(http: httpx.Client, path: str, query: str, name: str) -> None:
    assert_problem(http.get(f"{path}?{query}"), 422, f"query parameter {name!r} is given more than once")


def test_health_and_metrics_accept_cache_busting_query_parameters(http: httpx.Client) -> None:
    assert http.get("/healthz?_=1712345").json() == {"status": "ok"}
    assert http.get("/readyz?nocache=1").json()["status"] == "ready"
    assert "episerve_requests_total" in http.get("/metrics?t=1").text


def test_openapi_states_the_dataset_id_form_and_non_empty_query_values(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    rows = paths["/datasets/{dataset_id}/rows"]["get"]["parameters"]
    dataset_id = next(p for p in rows if p["name"] == "dataset_id")
    pattern = re.compile(dataset_id["schema"]["pattern"])
    assert all(pattern.match(good) for good in ["demo", "lerobot/demo-v3", "a_b.c"])
    assert not any(pattern.match(bad) for bad in ["", "a/b/c", "../x", "/abs", ".hidden", "a b"])
    for bad in ["a/b/c", ".hidden"]:  # what the pattern refuses, the server refuses too
        assert http.get(f"/datasets/{bad}").status_code in (404, 422)
    episodes = next(p for p in rows if p["name"] == "episodes")
    assert episodes["schema"]["minLength"] == 1
    assert_problem(http.get(f"{V3}/rows?episodes="), 422, "empty")
