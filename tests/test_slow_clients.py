"""Slow and oversized requests are bounded: heads by size (431) and time (408), bodies by their declared length
(413 before a byte is read) and time (408), on the event loop and in the pool alike. Raw sockets, since an
HTTP client would not send a request this badly."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ServerProcess

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
MAX_HEADER_BYTES = 16384
TAKE = "/datasets/lerobot/demo-v3/rows/take"
SLICE = "/datasets/lerobot/demo-v3/rows"


@pytest.fixture(scope="module")
def servers(datasets_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    cache = tmp_path_factory.mktemp("slow-clients-cache")
    env = {
        "EPISERVE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "EPISERVE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "EPISERVE_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
    }
    lane = ServerProcess([datasets_root], cache / "lane", env=env)
    route = ServerProcess([datasets_root], cache / "route", env=env | {"EPISERVE_INLINE_READ_BYTES": "0"})
    with lane, route:
        yield {"lane": lane, "route": route}


@pytest.fixture(params=["lane", "route"])
def server(request: pytest.FixtureRequest, servers: dict[str, ServerProcess]) -> ServerProcess:
    return servers[request.param]


def connect(server: ServerProcess, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(timeout)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-cased names) and body of one response."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (waits up to the socket's timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def problem_detail(headers: dict[str, str], body: bytes) -> str:
    assert headers["content-type"].startswith("application/problem+json")
    return json.loads(body)["detail"]


def test_a_header_past_the_limit_is_431_and_the_connection_closed(servers: dict[str, ServerProcess]) -> None:
    with connect(servers["lane"]) as sock:
        big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the server may stop reading at the limit
            sock.sendall(big)
        status, headers, body = read_response(sock)
        assert status == 431
        assert problem_detail(headers, body) == f"the request line and headers exceed {MAX_HEADER_BYTES} bytes"
        assert closed(sock)


def test_a_query_past_the_header_limit_is_431(servers: dict[str, ServerProcess]) -> None:
    with connect(servers["lane"]) as sock:
        sock.sendall(f"GET {SLICE}?episodes={'1,' * 10_000}1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, _ = read_response(sock)
        assert status == 431


def test_heads_within_the_limit_are_served_and_kept_alive(servers: dict[str, ServerProcess]) -> None:
    with connect(servers["lane"]) as sock:
        for pause in (0.0, HEADER_TIMEOUT_S + 0.5):  # an idle keep-alive connection is not a slow head
            time.sleep(pause)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"a" * 12_000 + b"\r\n\r\n")
            status, _, body = read_response(sock)
            assert (status, body) == (200, b'{"status":"ok"}')


def test_a_head_sent_slowly_is_408_within_the_header_timeout(server: ServerProcess) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        try:
            for _ in range(20):  # one header byte every 0.2 s: never complete, never idle
                time.sleep(0.2)
                sock.sendall(b"X")
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - started
        assert status == 408
        assert problem_detail(headers, body) == "the request line and headers did not arrive within 1 s"
        assert HEADER_TIMEOUT_S - 0.1 <= elapsed < HEADER_TIMEOUT_S + 1.0
        assert closed(sock)


def test_a_connection_that_sends_nothing_is_closed_within_the_header_timeout(server: ServerProcess) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        assert closed(sock)
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 1.0


def test_many_slow_clients_are_all_released_within_the_header_timeout(servers: dict[str, ServerProcess]) -> None:
    sockets = [connect(servers["lane"]) for _ in range(100)]
    started = time.monotonic()
    try:
        for sock in sockets:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        answers = [read_response(sock)[0] for sock in sockets]
        assert all(closed(sock) for sock in sockets)
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 2.0
        assert answers == [408] * len(sockets)
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize("path", [TAKE, SLICE])
def test_a_declared_oversize_body_is_413_at_once(server: ServerProcess, path: str) -> None:
    with connect(server, timeout=BODY_TIMEOUT_S) as sock:
        started = time.monotonic()
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000000\r\n\r\n".encode()
        )
        status, headers, body = read_response(sock)  # nothing of the body was sent
        assert time.monotonic() - started < 0.5
        assert status == 413
        assert problem_detail(headers, body) == "the body is 100000000 bytes; the limit is 16777216 bytes"


@pytest.mark.parametrize("path", [TAKE, SLICE])
def test_a_body_sent_slowly_is_408_within_the_body_timeout(server: ServerProcess, path: str) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
        )
        try:
            for _ in range(12):  # a byte every 0.2 s: 100 bytes would take 20 s
                sock.sendall(b" ")
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - started
        assert status == 408
        assert headers["connection"] == "close"
        assert problem_detail(headers, body) == "the request body did not arrive within 1.5 s"
        assert BODY_TIMEOUT_S - 0.1 <= elapsed < BODY_TIMEOUT_S + 1.0
        assert closed(sock)


def test_a_body_the_response_did_not_wait_for_cannot_hold_the_connection(servers: dict[str, ServerProcess]) -> None:
    with connect(servers["lane"]) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        status, _, _ = read_response(sock)
        assert status == 200
        try:
            for _ in range(30):  # trickled far past the header timeout
                time.sleep(0.1)
                sock.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed(sock)
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 2.0


def test_a_body_cut_short_is_not_logged_as_an_error(servers: dict[str, ServerProcess]) -> None:
    for server in servers.values():
        before = server.log_path.read_text()
        for method, path in [("POST", TAKE), ("POST", SLICE), ("POST", "/datasets/lerobot/demo-v3/cache")]:
            with connect(server) as sock:
                head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100"
                sock.sendall(f'{head}\r\n\r\n{{"ind'.encode())
                time.sleep(0.2)
        with connect(server) as sock:  # still serving, and past the cut requests in the log
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[0] == 200
        time.sleep(0.5)
        logged = server.log_path.read_text()[len(before) :]
        assert "Traceback" not in logged and "ERROR" not in logged, logged
