"""Large `/rows` responses stream batch by batch with an exact length, and stop when the client leaves."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import ServerProcess, assert_tables_equal, read_stream
from tests.test_operations import metric

ROWS_ENDPOINT = "/datasets/{dataset_id:path}/rows"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, pa.Table]]:
    """A 24 MB dataset (blobs of 12 KB), served with small stored batches so a response spans many of them."""
    root = tmp_path_factory.mktemp("big-root")
    (root / "big").mkdir()
    rng = np.random.default_rng(4)
    n = 2000
    table = pa.table(
        {
            "episode_index": np.repeat(np.arange(20), n // 20),
            "blob": [rng.bytes(12_000) for _ in range(n)],
            "x": rng.normal(size=n),
        }
    )
    pq.write_table(table, root / "big" / "part-0.parquet", row_group_size=100)
    (root / "big" / "episerve.json").write_text('{"fps": 10}')
    env = {"EPISERVE_BUILD_BATCH_BYTES": str(1 << 20)}
    with ServerProcess([root], tmp_path_factory.mktemp("big-cache"), env=env) as server:
        yield server, table


def test_a_large_range_streams_every_row_with_an_exact_length(big: tuple[ServerProcess, pa.Table]) -> None:
    server, table = big
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.get("/datasets/big/rows", params={"start": 150, "stop": 1950})
        assert answer.status_code == 200
        assert int(answer.headers["content-length"]) == len(answer.content) > 20_000_000
        assert answer.headers["x-row-count"] == "1800"
        assert_tables_equal(read_stream(answer.content), table.slice(150, 1800))
        body = http.post("/datasets/big/rows", json={"episodes": [3, 1], "columns": ["x", "blob"]})
        expected = pa.concat_tables([table.slice(100, 100), table.slice(300, 100)]).select(["x", "blob"])
        assert_tables_equal(read_stream(body.content), expected)


def test_a_client_leaving_mid_stream_ends_it_as_499_and_the_server_goes_on(big: tuple[ServerProcess, pa.Table]) -> None:
    server, table = big
    with httpx.Client(base_url=server.url, timeout=30) as http:
        before = metric(
            http.get("/metrics").text, "episerve_requests_total", endpoint=ROWS_ENDPOINT, method="GET", status="499"
        )
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET /datasets/big/rows HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            received = 0
            while received < 200_000:
                received += len(sock.recv(65536))
        deadline = time.monotonic() + 10
        left = before
        while left == before and time.monotonic() < deadline:
            time.sleep(0.05)
            text = http.get("/metrics").text
            left = metric(text, "episerve_requests_total", endpoint=ROWS_ENDPOINT, method="GET", status="499")
        assert left == before + 1
        whole = http.get("/datasets/big/rows", params={"start": 0, "stop": 10})
        assert_tables_equal(read_stream(whole.content), table.slice(0, 10))


def test_a_windowed_answer_larger_than_a_piece_is_sent_in_slices_intact(big: tuple[ServerProcess, pa.Table]) -> None:
    server, table = big
    with httpx.Client(base_url=server.url, timeout=60) as http:
        params = {"start": 0, "stop": 1500, "columns": "blob", "delta_timestamps": '{"blob": [0, 0.1]}'}
        answer = http.get("/datasets/big/rows", params=params)
        assert answer.status_code == 200, answer.text
        assert int(answer.headers["content-length"]) == len(answer.content) > 36_000_000  # one 36 MB batch, cut
    got = read_stream(answer.content)
    assert got.num_rows == 1500 and got.column_names == ["blob", "blob_is_pad"]
    blobs = table["blob"].to_pylist()
    for row in (0, 98, 99, 100, 777, 1499):
        last = row // 100 * 100 + 99  # episodes hold 100 rows each
        assert got["blob"][row].as_py() == [blobs[row], blobs[min(row + 1, last)]]
        assert got["blob_is_pad"][row].as_py() == [False, row + 1 > last]


def test_stream_parts_point_into_the_batches_they_encode(tmp_path: Path) -> None:
    """Large column buffers go out as views of the memory-mapped batch (no copy of the data); the parts joined
    are exactly the stream Arrow itself writes, also for slices whose offsets must be rebased."""
    from app.reads.arrow_ipc import OWN_CHUNK_BYTES, encode_stream, stream_size

    rng = np.random.default_rng(8)
    n = 50_000
    stored = pa.record_batch(
        {"x": rng.normal(size=n), "label": [f"frame-{i}" for i in range(n)], "flag": rng.integers(0, 2, n) > 0}
    )
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_file(sink, stored.schema) as writer:
        writer.write_batch(stored)
    mapped = pa.ipc.open_file(pa.memory_map(str(tmp_path / "s.arrow"))).get_batch(0)
    batches = [mapped, mapped.slice(1_234, 30_000)]

    parts = [part for group in encode_stream(mapped.schema, batches) for part in group]

    expected = pa.BufferOutputStream()
    with pa.ipc.new_stream(expected, mapped.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    body = b"".join(parts)
    assert body == expected.getvalue().to_pybytes() and len(body) == stream_size(mapped.schema, batches)
    low = mapped.column("x").buffers()[1].address
    high = low + (tmp_path / "s.arrow").stat().st_size
    in_map = [p for p in parts if isinstance(p, memoryview) and low <= pa.py_buffer(p).address < high]
    assert sum(p.nbytes for p in in_map) >= 0.9 * (n + 30_000) * 8  # the float values, straight from the map
    assert all(len(p) >= OWN_CHUNK_BYTES for p in parts if isinstance(p, memoryview))


@pytest.mark.parametrize("adds", [1, 2])
def test_pending_rows_are_sent_from_their_sources_and_the_stream_equals_the_filled_one(adds: int) -> None:
    """Rows left pending (camera frames in a decoded-frame segment) go out as views of their sources, also
    when a batch is sent in slices, and when they were added in several calls (a camera's frames from the
    segments of several video files); the stream is byte for byte the one of the filled batches, and reading
    the data fills them in place."""
    from app.reads.arrow_ipc import encode_stream
    from app.reads.pending_copies import PendingCopies

    rng = np.random.default_rng(9)
    shape = (6, 4096, 3)  # 72 KiB a row
    sources = rng.integers(0, 256, (10, *shape), dtype=np.uint8)
    target = np.empty((7, *shape), dtype=np.uint8)
    target[[1, 4]] = rng.integers(0, 256, (2, *shape), dtype=np.uint8)  # rows already in place (decoded)
    rows, picks = np.array([0, 2, 3, 5, 6]), [9, 0, 0, 3, 7]  # one source may fill several rows
    pending = PendingCopies()
    for part in np.array_split(np.arange(len(rows)), adds):
        pending.add(target, rows[part], [sources[picks[i]] for i in part])
    filled = target.copy()
    filled[rows] = sources[picks]
    index = pa.array(np.arange(7, dtype=np.int64))
    unfilled = pa.record_batch({"frame": pa.FixedShapeTensorArray.from_numpy_ndarray(target), "index": index})
    complete = pa.record_batch({"frame": pa.FixedShapeTensorArray.from_numpy_ndarray(filled), "index": index})
    cuts = [(0, 3), (3, 4)]  # slices, as large batches are sent

    parts = [
        part
        for group in encode_stream(unfilled.schema, [unfilled.slice(*cut) for cut in cuts], pending=pending)
        for part in group
    ]

    expected = pa.BufferOutputStream()
    with pa.ipc.new_stream(expected, complete.schema) as writer:
        for cut in cuts:
            writer.write_batch(complete.slice(*cut))
    assert b"".join(parts) == expected.getvalue().to_pybytes()
    low, high = sources.ctypes.data, sources.ctypes.data + sources.nbytes
    from_sources = [p for p in parts if isinstance(p, memoryview) and low <= pa.py_buffer(p).address < high]
    assert [p.nbytes for p in from_sources] == [target[0].nbytes] * len(rows)  # each pending row, from its source
    assert not np.array_equal(target[rows], filled[rows])  # sending filled nothing in
    pending.make()
    assert np.array_equal(target, filled)
