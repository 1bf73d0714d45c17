"""Memory for answers is bounded by `EPISERVE_MAX_INFLIGHT_BYTES`, not by how clients read: large takes are read
and sent piece by piece, connections that ask for them and read nothing hold one piece each, and the other
clients get their rows meanwhile. Also: the budget itself, and large (chunked, compressed) answers intact."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.api.arrow_response import SEND_BYTES
from app.api.inflight import InflightBudget
from app.demo_cameras import TOP_CAMERA
from app.reads.pieces import PIECE_BYTES
from tests.support import ServerProcess, assert_tables_equal, read_stream, rss_anon_with_children
from tests.test_operations import metric

ROWS = 480
BLOB_BYTES = 256 * 1024  # 120 MiB in all: every stalled take asks for all of it
BUDGET = 96 * 1024 * 1024
STALLED = 12
TAKE = "/datasets/blobs/rows/take"


def _blob(row: int) -> bytes:
    return np.random.default_rng(row).integers(0, 256, BLOB_BYTES, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("inflight-root")
    (root / "blobs").mkdir()
    table = pa.table(
        {"episode_index": np.arange(ROWS) // 48, "index": np.arange(ROWS), "blob": [_blob(r) for r in range(ROWS)]}
    )
    pq.write_table(table, root / "blobs" / "part-0.parquet", row_group_size=60)
    env = {"EPISERVE_MAX_INFLIGHT_BYTES": str(BUDGET), "EPISERVE_SEND_TIMEOUT_S": "120"}
    with ServerProcess([root], tmp_path_factory.mktemp("inflight-cache"), env=env) as running:
        with running.client() as http:  # builds and maps the segment: the reads below only read and send
            assert http.get("/datasets/blobs/rows", params={"stop": 1}).status_code == 200
            assert http.post(TAKE, json={"indices": [0]}).status_code == 200
        yield running


def _stalled_take(server: ServerProcess) -> socket.socket:
    """A connection that asks for every row and then reads nothing (after the head)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    body = orjson.dumps({"indices": list(range(ROWS))})
    head = f"POST {TAKE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def test_stalled_readers_hold_at_most_the_budget_and_others_get_their_rows(server: ServerProcess) -> None:
    pid = server.process.pid if server.process else 0
    baseline = rss_anon_with_children(pid)
    stalled = [_stalled_take(server) for _ in range(STALLED)]
    peak, errors, served = baseline, [], [0]
    stop = threading.Event()

    def trainer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with server.client() as http:
            while not stop.is_set():
                rows = rng.integers(0, ROWS, 24).tolist()  # 6 MiB: read in the thread pool, in two pieces
                answer = http.post(TAKE, json={"indices": rows, "columns": ["index", "blob"]})
                got = read_stream(answer.content)
                if got.column("index").to_pylist() != rows or got.column("blob")[5].as_py() != _blob(rows[5]):
                    errors.append(rows)
                served[0] += 1

    trainers = [threading.Thread(target=trainer, args=(seed,)) for seed in range(3)]
    try:
        for thread in trainers:
            thread.start()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            peak = max(peak, rss_anon_with_children(pid))
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in trainers:
            thread.join()
        for sock in stalled:
            sock.close()
    assert not errors
    assert served[0] >= 10
    assert peak - baseline < BUDGET, f"RssAnon grew by {(peak - baseline) / 2**20:.0f} MiB"


def test_a_large_take_comes_in_pieces_chunked_and_intact(server: ServerProcess) -> None:
    rows = [*range(ROWS - 1, -1, -3), 7, 7]
    with server.client() as http:
        for compression in (None, "zstd", "lz4"):
            body = {"indices": rows, "columns": ["blob", "index"], "compression": compression}
            answer = http.post(TAKE, json={k: v for k, v in body.items() if v is not None})
            assert answer.status_code == 200, answer.text
            assert "content-length" not in answer.headers and answer.headers["transfer-encoding"] == "chunked"
            assert answer.headers["x-row-count"] == str(len(rows))
            assert answer.headers.get("x-arrow-compression") == compression
            got = read_stream(answer.content)
            assert got.column("index").to_pylist() == rows
            expected = pa.table({"blob": [_blob(r) for r in rows], "index": rows})
            assert_tables_equal(got, expected.cast(got.schema))


def test_a_large_compressed_slice_is_compressed_batch_by_batch_and_intact(server: ServerProcess) -> None:
    with server.client() as http:
        answer = http.get("/datasets/blobs/rows", params={"start": 10, "stop": 200, "compression": "zstd"})
        assert answer.status_code == 200
        assert answer.headers["x-arrow-compression"] == "zstd" and "content-length" not in answer.headers
        got = read_stream(answer.content)
    assert got.column("index").to_pylist() == list(range(10, 200))
    assert got.column("blob")[0].as_py() == _blob(10) and got.column("blob")[189].as_py() == _blob(199)


def test_the_budget_makes_holds_wait_their_turn_and_grants_an_oversized_one_alone() -> None:
    async def scenario() -> list[str]:
        budget, order = InflightBudget(100), []
        first = await budget.hold(60)
        waiting = asyncio.ensure_future(budget.hold(50))
        await asyncio.sleep(0)
        assert not waiting.done() and budget.try_hold(10) is None  # nobody overtakes a waiting hold
        first.set(40)
        second = await waiting
        order.append(f"used {budget.used}")
        big = asyncio.ensure_future(budget.hold(500))
        await asyncio.sleep(0)
        assert not big.done()
        first.release()
        second.release()
        third = await big  # larger than the budget: granted once nothing else is held
        order.append(f"used {budget.used}")
        cancelled = asyncio.ensure_future(budget.hold(1))
        await asyncio.sleep(0)
        cancelled.cancel()
        third.release()
        order.append(f"used {budget.used}")
        return order

    assert asyncio.run(scenario()) == ["used 90", "used 500", "used 0"]


def test_stored_rows_are_not_read_ahead_of_a_reader_that_stops(server: ServerProcess) -> None:
    """Stored rows are a copy from the maps: a reader that stops after the head holds one piece, not two."""
    sock = _stalled_take(server)
    try:
        peak, deadline = 0.0, time.monotonic() + 3
        with server.client() as http:
            while time.monotonic() < deadline:
                peak = max(peak, metric(http.get("/metrics").text, "episerve_inflight_bytes"))
                time.sleep(0.05)
        assert SEND_BYTES + PIECE_BYTES // 2 <= peak <= SEND_BYTES + PIECE_BYTES * 5 // 4, peak / 2**20
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        got = read_stream(_body_of(_read_response(sock)))
    finally:
        sock.close()
    assert got.column("index").to_pylist() == list(range(ROWS))


def test_camera_frames_are_read_ahead_while_a_piece_is_sent(video_root: Path, tmp_path: Path) -> None:
    """A reader that stops after the head of a take of camera frames (decoded on demand): the server sends what
    the socket takes of the first piece and decodes the next one meanwhile, so two pieces are held; the answer,
    read at last, equals the same take read at once."""
    with ServerProcess([video_root], tmp_path / "cache") as running, running.client() as http:
        rows = http.get("/datasets/cams-v3").json()["rows"]
        body = {"indices": (list(range(rows)) * 10)[:900], "columns": ["index", TOP_CAMERA]}  # 18 KiB frames
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", running.port))
        data = orjson.dumps(body)
        take = "/datasets/cams-v3/rows/take"
        head = (
            f"POST {take} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        try:
            sock.sendall(head.encode() + data)
            held, deadline = 0.0, time.monotonic() + 60
            while held < SEND_BYTES + PIECE_BYTES * 3 // 2 and time.monotonic() < deadline:
                held = metric(http.get("/metrics").text, "episerve_inflight_bytes")
                time.sleep(0.05)
            assert held >= SEND_BYTES + PIECE_BYTES * 3 // 2, f"{held / 2**20:.1f} MiB held: nothing read ahead"
            assert held <= SEND_BYTES + 3 * PIECE_BYTES, f"{held / 2**20:.1f} MiB held: more than two pieces"
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            got = read_stream(_body_of(_read_response(sock)))
        finally:
            sock.close()
        expected = read_stream(http.post(take, json=body).content)
    assert got.column("index").to_pylist() == body["indices"]
    assert_tables_equal(got, expected)


def _read_response(sock: socket.socket) -> bytes:
    """Everything up to the end of a chunked response (the connection stays open: keep-alive)."""
    data = bytearray()
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed the connection mid-answer"
        data += chunk
    return bytes(data)


def _body_of(response: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response."""
    head, _, _ = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower(), head
    body, at = bytearray(), len(head) + 4
    while True:  # by offsets: slicing off each chunk would copy the rest of a 100 MiB answer every time
        line_end = response.index(b"\r\n", at)
        size = int(response[at:line_end], 16)
        if size == 0:
            return bytes(body)
        body += response[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2


def test_reading_ahead_takes_only_the_spare_half_of_the_budget() -> None:
    async def scenario() -> list[bool]:
        budget = InflightBudget(100)
        first, second = budget.try_hold(30), budget.try_hold(10)
        assert first is not None and second is not None
        grown = [first.try_grow_into_spare(40)]  # 50 of 100 held: still half free
        grown.append(second.try_grow_into_spare(11))  # would be 51
        waiting = asyncio.ensure_future(budget.hold(60))  # does not fit: waits
        await asyncio.sleep(0)
        grown.append(second.try_grow_into_spare(12))  # somebody waits: nothing ahead of need
        first.release()
        await waiting
        assert budget.used == 70
        return grown

    assert asyncio.run(scenario()) == [True, False, False]
