"""Quick reads (their segments mapped, small enough) are answered on the event loop; every such answer must equal
the one read in the thread pool, byte for byte.

Two servers share one datasets root: one answering quick reads on the event loop (the default, "fast") and one
reading everything in the pool (`EPISERVE_INLINE_READ_BYTES=0`, "slow"), so every read below is answered once
each way and compared.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from tests.support import ServerProcess, assert_tables_equal, oracle, read_stream
from tests.test_errors import assert_problem
from tests.test_operations import metric

TAKE = "/datasets/lerobot/demo-v3/rows/take"
INLINE_TAKES = "episerve_inline_takes_total"


@pytest.fixture(scope="module")
def fast_and_slow(
    datasets_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    cache = tmp_path_factory.mktemp("quick-reads-cache")
    env = {"EPISERVE_TOKENS": "alpha", "EPISERVE_MAX_BODY_BYTES": "65536"}
    on = ServerProcess([datasets_root], cache / "on", env=env)
    off = ServerProcess([datasets_root], cache / "off", env=env | {"EPISERVE_INLINE_READ_BYTES": "0"})
    headers = {"Authorization": "Bearer alpha"}
    with (
        on,
        off,
        httpx.Client(base_url=on.url, headers=headers) as fast,
        httpx.Client(base_url=off.url, headers=headers) as slow,
    ):
        yield fast, slow


def inline_takes(http: httpx.Client) -> float:
    return metric(http.get("/metrics").text, INLINE_TAKES)


def wait_for_a_quick_take(http: httpx.Client, timeout: float = 30.0) -> None:
    """Take until a take is answered on the event loop: on a fresh server the first takes build and map the
    segments in the pool."""
    deadline = time.monotonic() + timeout
    before = inline_takes(http)
    while inline_takes(http) == before:
        assert time.monotonic() < deadline, "no take was ever answered on the event loop"
        assert http.post(TAKE, json={"indices": [1, 2, 3]}).status_code == 200
        time.sleep(0.05)


def assert_answered_alike(
    ask: Callable[[httpx.Client], httpx.Response], fast_and_slow: tuple[httpx.Client, httpx.Client], headers: list[str]
) -> None:
    """The slow server's answer, then the fast server's twice (the first may map segments in the pool, the second
    is answered on the event loop): equal bodies and `headers`."""
    fast, slow = fast_and_slow
    slow_answer = ask(slow)
    assert slow_answer.status_code == 200, slow_answer.text
    for _ in range(2):
        fast_answer = ask(fast)
        assert fast_answer.status_code == 200, fast_answer.text
        assert fast_answer.content == slow_answer.content
        for header in headers:
            assert fast_answer.headers[header] == slow_answer.headers[header], header


def test_quick_takes_equal_takes_read_in_the_pool_byte_for_byte(
    fast_and_slow: tuple[httpx.Client, httpx.Client], datasets_root: Path
) -> None:
    fast, slow = fast_and_slow
    rng = np.random.default_rng(5)
    view = oracle(datasets_root / "lerobot" / "demo-v3", None)
    bodies = [
        {"indices": rng.integers(0, view.num_rows, 256).tolist()},  # spans all three files, duplicates likely
        {"indices": [view.num_rows - 1, 0, 5, 5, 4]},
        {"indices": [0, 1, 2], "columns": ["action", "episode_index"]},
        {"indices": [3, 0], "episodes": "2,7-9"},
        {"indices": [10, 11], "episodes": [9, 2, 9]},
        {"indices": [], "columns": ["timestamp"]},
        {"indices": [1, 40], "delta_timestamps": {"action": [0, 1 / 30, 2 / 30], "observation.state": [-1 / 30, 0]}},
        {"indices": [7, 8], "compression": "zstd"},
        {"indices": rng.integers(0, view.num_rows, 64).tolist(), "columns": ["observation.image", "index"]},
    ]
    before = inline_takes(fast)
    headers = ["content-type", "content-length", "x-total-rows", "x-row-count"]
    for body in bodies:
        assert_answered_alike(lambda http, body=body: http.post(TAKE, json=body), fast_and_slow, headers)
    assert inline_takes(fast) - before >= len(bodies)
    assert inline_takes(slow) == 0

    first = read_stream(fast.post(TAKE, json=bodies[0]).content)
    assert_tables_equal(first, view.take(pa.array(bodies[0]["indices"])))


def test_takes_that_are_not_quick_are_read_in_the_pool(fast_and_slow: tuple[httpx.Client, httpx.Client]) -> None:
    fast, _ = fast_and_slow
    fast.post(TAKE, json={"indices": [0]})  # the segments a quick read uses are mapped
    assert_problem(httpx.post(f"{fast.base_url}{TAKE}", json={"indices": [0]}), 401, "bearer token")
    assert_problem(fast.post(TAKE, json={"indices": [10**9]}), 422, "out of range")
    assert_problem(fast.post(TAKE, json={"indices": [0], "columns": ["nope"]}), 422, "nope")
    assert_problem(fast.post(TAKE, json={"indices": [0], "episodes": "999"}), 404, "999")
    assert_problem(fast.post(TAKE, content=b"{", headers={"Content-Type": "application/json"}), 400, "JSON")
    assert_problem(fast.post(TAKE, content=b'{"indices": [0]}', headers={"Content-Type": "text/plain"}), 415)
    assert_problem(fast.post("/datasets/lerobot/nope/rows/take", json={"indices": [0]}), 404, "nope")
    window = {"action": [k / 30 for k in range(5000)]}
    assert_problem(fast.post(TAKE, json={"indices": list(range(5000)), "delta_timestamps": window}), 413)


def test_bodies_in_many_chunks_arrive_intact(fast_and_slow: tuple[httpx.Client, httpx.Client]) -> None:
    fast, slow = fast_and_slow
    body = b'{"indices": [' + b", ".join(b"%d" % i for i in range(0, 600, 3)) + b"]}"
    expected = slow.post(TAKE, content=body, headers={"Content-Type": "application/json"}).content

    def chunked(size: int) -> Iterator[bytes]:
        for start in itertools.count(0, size):
            if start >= len(body):
                return
            yield body[start : start + size]

    for size in (1, 7, 100, len(body)):
        answer = fast.post(TAKE, content=chunked(size), headers={"Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text
        assert answer.content == expected

    oversize = b'{"indices": [' + b"0, " * 40_000 + b"0]}"  # beyond the servers' 64 KiB body limit, in pieces
    pieces = (oversize[i : i + 16384] for i in range(0, len(oversize), 16384))
    answer = fast.post(TAKE, content=pieces, headers={"Content-Type": "application/json"})
    assert_problem(answer, 413, "larger than the limit of 65536 bytes")


def test_takes_on_the_event_loop_are_counted_under_the_take_route(
    fast_and_slow: tuple[httpx.Client, httpx.Client],
) -> None:
    fast, _ = fast_and_slow
    wait_for_a_quick_take(fast)
    endpoint = "/datasets/{dataset_id:path}/rows/take"
    before = metric(
        fast.get("/metrics").text, "episerve_requests_total", endpoint=endpoint, method="POST", status="200"
    )
    inline_before = inline_takes(fast)
    for _ in range(5):
        assert fast.post(TAKE, json={"indices": [1, 2, 3]}).status_code == 200
    text = fast.get("/metrics").text
    assert metric(text, "episerve_requests_total", endpoint=endpoint, method="POST", status="200") == before + 5
    assert metric(text, INLINE_TAKES) == inline_before + 5
    assert metric(text, "episerve_rows_served_total", endpoint=endpoint) >= 15


ROWS = "/datasets/lerobot/demo-v3/rows"
INLINE_SLICES = "episerve_inline_slices_total"


def test_quick_slices_equal_slices_read_in_the_pool_byte_for_byte(
    fast_and_slow: tuple[httpx.Client, httpx.Client], datasets_root: Path
) -> None:
    fast, slow = fast_and_slow
    view = oracle(datasets_root / "lerobot" / "demo-v3", None)
    queries = [
        {},
        {"start": 5, "stop": 40},
        {"start": 0, "stop": view.num_rows + 100},  # clamped, across every file
        {"episodes": "2,7-9", "columns": "action,index"},
        {"episodes": "9", "start": 3},
        {"start": 30, "stop": 30},
        {"columns": "observation.image,timestamp", "stop": 50},
    ]
    before = metric(fast.get("/metrics").text, INLINE_SLICES)
    headers = ["content-type", "content-length", "etag", "x-total-rows", "x-start", "x-stop"]
    for query in queries:
        assert_answered_alike(lambda http, query=query: http.get(ROWS, params=query), fast_and_slow, headers)
    assert metric(fast.get("/metrics").text, INLINE_SLICES) - before >= len(queries)
    assert metric(slow.get("/metrics").text, INLINE_SLICES) == 0

    whole = read_stream(fast.get(ROWS).content)
    assert_tables_equal(whole, view)


def test_slices_that_are_not_quick_are_read_in_the_pool(fast_and_slow: tuple[httpx.Client, httpx.Client]) -> None:
    fast, _ = fast_and_slow
    assert fast.get(ROWS, params={"stop": 5}).status_code == 200  # the segments a quick read uses are mapped
    before = metric(fast.get("/metrics").text, INLINE_SLICES)
    assert_problem(httpx.get(f"{fast.base_url}{ROWS}"), 401, "bearer token")
    assert_problem(fast.get(ROWS, params={"start": "-1"}), 422, "start")
    assert_problem(fast.get(ROWS, params={"start": "x"}), 422, "start")
    assert_problem(fast.get(ROWS, params={"start": 9, "stop": 3}), 422, "greater than stop")
    assert_problem(fast.get(ROWS, params={"columns": "nope"}), 422, "nope")
    assert_problem(fast.get(ROWS, params={"episodes": "999"}), 404, "999")
    assert_problem(fast.get(ROWS, params={"episodes": "1-"}), 422)
    assert_problem(fast.get("/datasets/lerobot/nope/rows"), 404, "nope")
    assert_problem(fast.get(f"{ROWS}?stop=3&stop=4"), 422, "'stop' is given more than once")
    windowed = fast.get(ROWS, params={"stop": 4, "delta_timestamps": '{"action": [0, 0.0333333]}'})
    assert read_stream(windowed.content).schema.field("action").type.list_size == 2
    compressed = fast.get(ROWS, params={"stop": 4, "compression": "zstd"})
    assert compressed.headers["x-arrow-compression"] == "zstd" and read_stream(compressed.content).num_rows == 4
    etag = fast.get(ROWS, params={"stop": 4}).headers["etag"]
    assert fast.get(ROWS, params={"stop": 4}, headers={"If-None-Match": etag}).status_code == 304
    assert metric(fast.get("/metrics").text, INLINE_SLICES) == before + 1  # only the plain slice before the 304


def test_unknown_query_parameters_are_422_either_way(fast_and_slow: tuple[httpx.Client, httpx.Client]) -> None:
    wait_for_a_quick_take(fast_and_slow[0])  # so that these could be answered on the event loop
    for http in fast_and_slow:
        assert_problem(
            http.get(f"{ROWS}?episode=1"), 422, "unknown query parameter 'episode' (did you mean 'episodes'?)"
        )
        assert_problem(http.get(f"{ROWS}?stop=3&colums=action"), 422, "'colums' (did you mean 'columns'?)")
        answer = http.post(f"{TAKE}?episodes=1", json={"indices": [0]})
        assert_problem(answer, 422, "unknown query parameter 'episodes'; this endpoint takes no query parameters")


def _post_json(http: httpx.Client, path: str, text: str) -> httpx.Response:
    return http.post(path, content=text, headers={"Content-Type": "application/json"})


def test_huge_integers_are_422_either_way(fast_and_slow: tuple[httpx.Client, httpx.Client]) -> None:
    nines = "9" * 25
    wait_for_a_quick_take(fast_and_slow[0])
    for http in fast_and_slow:
        assert_problem(http.get(ROWS, params={"episodes": "9" * 4301}), 422, "(4301 digits) in episodes spec is too")
        assert_problem(http.get(ROWS, params={"episodes": f"1-{nines}"}), 422, f"episode id {nines} in episodes")
        assert_problem(http.get(ROWS, params={"start": "9" * 5000}), 422, "start")
        assert_problem(http.get(ROWS, params={"stop": nines}), 422, "stop", "less than or equal to 4611686018427387904")
        padded = http.get(ROWS, params={"start": "0" * 30 + "1", "stop": 3})
        assert padded.status_code == 200 and padded.headers["x-start"] == "1"
        assert_problem(_post_json(http, TAKE, f'{{"indices": [{nines}]}}'), 422, "indices.0: integer out of range")
        big = _post_json(http, TAKE, f'{{"indices": [{"9" * 400}]}}')
        assert_problem(big, 422, "indices.0: Input should be less than or equal to 4611686018427387904")
        assert_problem(_post_json(http, TAKE, f'{{"indices": [{"9" * 5000}]}}'), 422, "a number has too many digits")
        in_list = _post_json(http, TAKE, f'{{"indices": [0], "episodes": [-{nines}]}}')
        assert_problem(in_list, 422, "episodes.list[constrained-int].0: integer out of range")
        in_spec = _post_json(http, TAKE, f'{{"indices": [0], "episodes": "{"9" * 4301}"}}')
        assert_problem(in_spec, 422, "(4301 digits) in episodes spec is too large")
        slice_body = _post_json(http, ROWS, f'{{"start": {"9" * 400}}}')
        assert_problem(slice_body, 422, "start: Input should be less than or equal to 4611686018427387904")
