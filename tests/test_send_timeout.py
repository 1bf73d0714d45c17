"""A client that stops reading its response is cut off after `EPISERVE_SEND_TIMEOUT_S` without progress, and the
unsent rest is freed; one that reads slowly but steadily gets its whole response. Raw sockets with a small
receive buffer, so that the server's sends really wait on the client."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import ServerProcess, read_stream

SEND_TIMEOUT_S = 3.0
PAUSE_EVERY_BYTES = 2 << 20  # the steady reader pauses after each 2 MiB: 12 pauses in all
ROWS = 400
BLOB_BYTES = 64 * 1024  # 25 MiB in all: far more than the socket buffers hold
SLICE = "/datasets/blobs/rows"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("send-timeout-root")
    (root / "blobs").mkdir()
    rng = np.random.default_rng(7)
    blobs = [rng.integers(0, 256, BLOB_BYTES, dtype=np.uint8).tobytes() for _ in range(ROWS)]
    table = pa.table({"episode_index": np.arange(ROWS) // 40, "index": np.arange(ROWS), "blob": blobs})
    pq.write_table(table, root / "blobs" / "part-0.parquet", row_group_size=100)
    env = {"EPISERVE_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S), "EPISERVE_LOG_LEVEL": "warning"}
    with ServerProcess([root], tmp_path_factory.mktemp("send-timeout-cache"), env=env) as running:
        with running.client() as http:  # builds the segment, so the reads below only send
            assert http.get(SLICE, params={"stop": 1}).status_code == 200
        yield running


def _ask(server: ServerProcess, receive_buffer: int | None = 4096) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", server.port))
    sock.settimeout(30)
    sock.sendall(f"GET {SLICE} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def _received_until_closed(sock: socket.socket) -> int:
    """Bytes read until the server closed or reset the connection."""
    total = 0
    try:
        while chunk := sock.recv(1 << 20):
            total += len(chunk)
    except ConnectionResetError:
        pass
    return total


def test_a_client_that_stops_reading_is_cut_off_after_the_send_timeout(server: ServerProcess) -> None:
    with _ask(server) as sock:
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
        time.sleep(SEND_TIMEOUT_S + 2.0)  # reads nothing on: the server gives up
        received = len(head) + _received_until_closed(sock)
    assert received < ROWS * BLOB_BYTES // 2  # it got what the buffers held, not the response
    log = server.log_path.read_text()
    assert f"read nothing of its response for {SEND_TIMEOUT_S:g} s; connection closed" in log


def test_the_server_answers_others_while_a_client_stalls(server: ServerProcess) -> None:
    with _ask(server) as stalled, server.client() as http:
        assert stalled.recv(4096).startswith(b"HTTP/1.1 200")
        response = http.get(SLICE, params={"start": 10, "stop": 20, "columns": "index"})
        assert read_stream(response.content).column("index").to_pylist() == list(range(10, 20))


def test_a_slow_steady_reader_gets_its_whole_response(server: ServerProcess) -> None:
    with _ask(server, receive_buffer=None) as sock:
        data = bytearray()
        expected: int | None = None  # head and body, once the head has arrived
        unpaused = 0
        deadline = time.monotonic() + 120
        while (expected is None or len(data) < expected) and time.monotonic() < deadline:
            chunk = sock.recv(1 << 20)
            assert chunk, "the server closed the connection of a reader that kept reading"
            data += chunk
            if expected is None and b"\r\n\r\n" in data:
                head = bytes(data).partition(b"\r\n\r\n")[0]
                length = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                expected = len(head) + 4 + int(length.split(b":")[1])
            unpaused += len(chunk)
            if unpaused >= PAUSE_EVERY_BYTES:  # pauses, each shorter than the timeout, longer in all
                time.sleep(SEND_TIMEOUT_S / 4)
                unpaused = 0
    body = bytes(data).partition(b"\r\n\r\n")[2]
    table = read_stream(body)
    assert table.column("index").to_pylist() == list(range(ROWS))
    assert len(table.column("blob")[ROWS - 1].as_py()) == BLOB_BYTES
