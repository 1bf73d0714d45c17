"""`GET /rows` and `POST /rows/take` return exactly the oracle's rows, in the documented order."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import assert_tables_equal, oracle, read_stream

DATASETS = {"lerobot/demo-v3": 60, "lerobot/demo-v21": 30}
GENERIC_EPISODES = [0, 1, 2, 3, 7, 9, 11]
HYPOTHESIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def get_rows(http: httpx.Client, dataset: str, **params: object) -> pa.Table:
    response = http.get(f"/datasets/{dataset}/rows", params={k: v for k, v in params.items() if v is not None})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/vnd.apache.arrow.stream"
    assert int(response.headers["content-length"]) == len(response.content)
    return read_stream(response.content)


def take_rows(http: httpx.Client, dataset: str, **body: object) -> pa.Table:
    response = http.post(f"/datasets/{dataset}/rows/take", json=body)
    assert response.status_code == 200, response.text
    return read_stream(response.content)


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_all_rows_equal_source_in_stored_order(http: httpx.Client, datasets_root: Path, dataset: str) -> None:
    assert_tables_equal(get_rows(http, dataset), oracle(datasets_root / dataset, None))


@pytest.mark.parametrize("dataset", sorted(DATASETS))
@HYPOTHESIS
@given(data=st.data())
def test_random_episode_picks_equal_oracle(
    http: httpx.Client, datasets_root: Path, dataset: str, data: st.DataObject
) -> None:
    count = DATASETS[dataset]
    pick = data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=12), label="pick")
    spec = ",".join(map(str, pick))  # unsorted, with duplicates
    expected = oracle(datasets_root / dataset, pick)
    assert_tables_equal(get_rows(http, dataset, episodes=spec), expected)
    assert sorted(set(expected["episode_index"].to_pylist())) == sorted(set(pick))


@HYPOTHESIS
@given(pick=st.lists(st.sampled_from(GENERIC_EPISODES), min_size=1, max_size=6))
def test_generic_parquet_with_interleaved_episodes_equals_oracle(
    http: httpx.Client, datasets_root: Path, pick: list[int]
) -> None:
    expected = oracle(datasets_root / "generic", pick)
    assert_tables_equal(get_rows(http, "generic", episodes=",".join(map(str, pick))), expected)


def test_unsorted_episode_pick_returns_ascending_episode_order(http: httpx.Client) -> None:
    table = get_rows(http, "lerobot/demo-v3", episodes="5,2,8", columns="episode_index,frame_index")
    episodes = table["episode_index"].to_numpy()
    assert list(dict.fromkeys(episodes.tolist())) == [2, 5, 8]
    for episode in (2, 5, 8):
        frames = table.filter(pa.compute.equal(table["episode_index"], episode))["frame_index"].to_numpy()
        assert frames.tolist() == list(range(len(frames)))


def test_ranges_in_episode_spec(http: httpx.Client, datasets_root: Path) -> None:
    expected = oracle(datasets_root / "lerobot/demo-v3", [*range(3, 8), 10])
    assert_tables_equal(get_rows(http, "lerobot/demo-v3", episodes="3-7, 10,4-5"), expected)


@HYPOTHESIS
@given(data=st.data())
def test_start_stop_slice_the_view_like_python(http: httpx.Client, datasets_root: Path, data: st.DataObject) -> None:
    pick = data.draw(st.lists(st.integers(0, 59), min_size=1, max_size=5))
    expected = oracle(datasets_root / "lerobot/demo-v3", pick)
    start = data.draw(st.integers(0, expected.num_rows + 5))
    stop = data.draw(st.integers(start, expected.num_rows + 10))
    response = http.get(
        "/datasets/lerobot/demo-v3/rows",
        params={"episodes": ",".join(map(str, pick)), "start": start, "stop": stop},
    )
    assert response.status_code == 200
    assert int(response.headers["x-total-rows"]) == expected.num_rows
    table = read_stream(response.content)
    assert_tables_equal(table, expected.slice(start, max(0, min(stop, expected.num_rows) - start)))


def test_columns_are_projected_in_the_order_asked(http: httpx.Client, datasets_root: Path) -> None:
    table = get_rows(http, "lerobot/demo-v3", episodes="4", columns="index,action")
    expected = oracle(datasets_root / "lerobot/demo-v3", [4]).select(["index", "action"])
    assert_tables_equal(table, expected)


@pytest.mark.parametrize("dataset", [*sorted(DATASETS), "generic"])
@HYPOTHESIS
@given(data=st.data())
def test_take_returns_rows_in_requested_order_with_duplicates(
    http: httpx.Client, datasets_root: Path, dataset: str, data: st.DataObject
) -> None:
    episodes = GENERIC_EPISODES if dataset == "generic" else list(range(DATASETS[dataset]))
    pick = data.draw(st.lists(st.sampled_from(episodes), min_size=1, max_size=8))
    view = oracle(datasets_root / dataset, pick)
    indices = data.draw(st.lists(st.integers(0, view.num_rows - 1), min_size=1, max_size=64))
    table = take_rows(http, dataset, indices=indices, episodes=list(reversed(pick)))
    assert_tables_equal(table, view.take(pa.array(indices)))


def test_take_without_episodes_indexes_the_whole_dataset(http: httpx.Client, datasets_root: Path) -> None:
    view = oracle(datasets_root / "lerobot/demo-v21", None)
    indices = [view.num_rows - 1, 0, 17, 17, 3]
    table = take_rows(http, "lerobot/demo-v21", indices=indices, columns=["index", "observation.state"])
    assert_tables_equal(table, view.take(pa.array(indices)).select(["index", "observation.state"]))


def test_take_of_no_indices_is_an_empty_table_with_the_schema(http: httpx.Client) -> None:
    table = take_rows(http, "lerobot/demo-v3", indices=[], columns=["index"])
    assert table.num_rows == 0
    assert table.column_names == ["index"]


def test_dataset_without_episode_column_is_one_episode(http: httpx.Client, datasets_root: Path) -> None:
    assert_tables_equal(get_rows(http, "plain"), oracle(datasets_root / "plain", None, column="x"))


def test_polars_and_pyarrow_read_the_same_stream(http: httpx.Client) -> None:
    response = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "1-3", "columns": "index,action"})
    from_pyarrow = read_stream(response.content)
    from_polars = pl.read_ipc_stream(response.content)
    assert from_polars.equals(pl.from_arrow(from_pyarrow))
    assert from_polars["index"].to_list() == from_pyarrow["index"].to_pylist()


def test_etag_is_stable_and_answers_if_none_match(http: httpx.Client) -> None:
    first = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "2"})
    second = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "2"})
    other = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "3"})
    assert first.headers["etag"] == second.headers["etag"] != other.headers["etag"]
    cached = http.get(
        "/datasets/lerobot/demo-v3/rows", params={"episodes": "2"}, headers={"If-None-Match": first.headers["etag"]}
    )
    assert cached.status_code == 304
    assert cached.content == b""


def test_image_column_holds_real_png_bytes(http: httpx.Client) -> None:
    table = get_rows(http, "lerobot/demo-v3", episodes="0", columns="observation.image", stop=2)
    image = table["observation.image"][0].as_py()
    assert image["bytes"].startswith(b"\x89PNG\r\n\x1a\n")
    assert np.frombuffer(image["bytes"][16:24], dtype=">u4").tolist() == [16, 16]


def test_post_rows_takes_the_selection_in_a_body(http: httpx.Client, datasets_root: Path) -> None:
    pick = list(range(59, -1, -2))  # a long, unsorted list
    body = {"episodes": pick, "start": 5, "stop": 400, "columns": ["index", "episode_index"]}
    response = http.post("/datasets/lerobot/demo-v3/rows", json=body)
    assert response.status_code == 200, response.text
    expected = oracle(datasets_root / "lerobot/demo-v3", pick).select(["index", "episode_index"])
    assert_tables_equal(read_stream(response.content), expected.slice(5, 395))
    assert int(response.headers["x-total-rows"]) == expected.num_rows
    same = http.get(
        "/datasets/lerobot/demo-v3/rows",
        params={"episodes": ",".join(map(str, pick)), "start": 5, "stop": 400, "columns": "index,episode_index"},
    )
    assert same.content == response.content


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_streams_decode_to_the_same_rows(http: httpx.Client, datasets_root: Path, codec: str) -> None:
    plain = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "0-9"})
    packed = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "0-9", "compression": codec})
    assert packed.headers["x-arrow-compression"] == codec
    assert len(packed.content) < len(plain.content)
    assert_tables_equal(read_stream(packed.content), oracle(datasets_root / "lerobot/demo-v3", range(10)))
    assert pl.read_ipc_stream(packed.content).equals(pl.read_ipc_stream(plain.content))
    taken = http.post("/datasets/lerobot/demo-v3/rows/take", json={"indices": [9, 2, 2], "compression": codec})
    assert_tables_equal(read_stream(taken.content), read_stream(plain.content).take(pa.array([9, 2, 2])))


def test_compressed_stream_chunks_concatenate_to_a_valid_stream(datasets_root: Path) -> None:
    from app.reads.arrow_ipc import encode_stream

    table = oracle(datasets_root / "lerobot/demo-v3", None)
    batches = table.to_batches(max_chunksize=500)
    chunks = [b"".join(parts) for parts in encode_stream(table.schema, batches, "zstd")]
    assert len(chunks) == len(batches) + 2  # schema, one chunk per batch, end of stream
    assert_tables_equal(read_stream(b"".join(chunks)), table)


def test_unknown_compression_is_422(http: httpx.Client) -> None:
    response = http.get("/datasets/lerobot/demo-v3/rows", params={"compression": "gzip"})
    assert response.status_code == 422 and "compression" in response.json()["detail"]
