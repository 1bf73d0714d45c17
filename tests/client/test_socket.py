"""The raw-socket transport of Arrow requests: connection reuse, reconnects, large and chunked bodies, errors."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pytest

import episerve
from episerve import _socket_transport
from episerve._socket_transport import SocketTransport
from tests.client.helpers import DEMO
from tests.support import assert_tables_equal

TABLE = pa.table({"index": pa.array(range(1000), pa.int64())})


def _stream(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _idle_connections(client: episerve.Client) -> list[_socket_transport.Connection]:
    assert isinstance(client._transport, SocketTransport)
    return list(client._transport._idle)


def _local_port(client: episerve.Client) -> int:
    """The local port of the client's one idle socket connection."""
    assert isinstance(client._transport, SocketTransport)
    (connection,) = client._transport._idle
    return connection.sock.getsockname()[1]


class _Stub(BaseHTTPRequestHandler):
    """HTTP/1.1 stub answering any POST with `TABLE`; its class attributes choose how."""

    protocol_version = "HTTP/1.1"
    chunked = False
    close_silently = False  # close the connection after each answer without `Connection: close`
    busy = 0  # answer this many requests with 503 and `Retry-After: 0.1` first
    seen: list[tuple[str, str | None, str | None]]  # (path, authorization, user-agent) of each request
    servers: list[ThreadingHTTPServer]  # the servers answering with this handler, to stop at the end

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        cls.seen.append((self.path, self.headers.get("Authorization"), self.headers.get("User-Agent")))
        if len(cls.seen) <= cls.busy:
            self._send(503, "application/problem+json", b'{"title":"Unavailable","detail":"warming up"}')
        else:
            self._send(200, "application/vnd.apache.arrow.stream", _stream(TABLE))
        if cls.close_silently:
            self.close_connection = True

    def _send(self, status: int, media: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("X-Total-Rows", str(TABLE.num_rows))
        if status == 503:
            self.send_header("Retry-After", "0.1")
        if type(self).chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 1000):
                piece = body[start : start + 1000]
                self.wfile.write(f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[tuple[str, type[_Stub]]]:
    handler = type("Stub", (_Stub,), {"seen": [], "servers": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    handler.servers.append(httpd)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    for running in handler.servers:
        running.shutdown()
        running.server_close()


def test_takes_reuse_one_socket_connection(url: str, demo_view: pa.Table) -> None:
    with episerve.Client(url) as client:
        first = client.take(DEMO, [5, 1, 5], columns=["index"])
        port = _local_port(client)
        for _ in range(20):
            assert client.take(DEMO, [7, 3], columns=["index"])["index"].to_pylist() == [7, 3]
        assert client.rows(DEMO, start=2, stop=4, columns=["index"])["index"].to_pylist() == [2, 3]
        assert _local_port(client) == port
        assert isinstance(client._transport, SocketTransport), "the requests went through httpx"
    assert first["index"].to_pylist() == [5, 1, 5]


def test_bodies_over_a_mebibyte_keep_the_connection(url: str, demo_view: pa.Table) -> None:
    with episerve.Client(url, timeout=3.0, retries=1) as client:
        pages = client.read_slice(episerve.Selection.of(DEMO))
        assert sum(buffer.size for buffer in pages.buffers) > 1 << 20
        port = _local_port(client)
        assert_tables_equal(pages.table, demo_view)
        assert_tables_equal(client.rows(DEMO), demo_view)
        assert _local_port(client) == port
        # Large bodies are received with a raised low-water mark; the next, tiny answer must not wait for it.
        (connection,) = client._transport._idle  # type: ignore[union-attr]
        if hasattr(socket, "SO_RCVLOWAT"):
            assert connection.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        started = time.monotonic()
        assert client.take(DEMO, [3], columns=["index"])["index"].to_pylist() == [3]
        assert time.monotonic() - started < 2.0 and _local_port(client) == port


def test_a_connection_closed_by_the_server_while_idle_is_replaced(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with episerve.Client(url, retries=1) as client:
        assert client.take(DEMO, [1], columns=["index"])["index"].to_pylist() == [1]
        (first,) = _idle_connections(client)
        time.sleep(6.0)  # past uvicorn's 5 s keep-alive timeout: the server has closed the connection
        # Skip the pre-send liveness check, so the request is sent on the dead socket and must be sent again.
        monkeypatch.setattr(_socket_transport.Connection, "idle_and_alive", lambda self: True)
        assert client.take(DEMO, [2], columns=["index"])["index"].to_pylist() == [2]
        # A new connection answered (its local port may be the old one's again: the kernel may reuse it at once).
        (second,) = _idle_connections(client)
        assert second is not first and not first.open


def test_silently_closed_connections_are_reopened_without_sending_twice(stub: tuple[str, type[_Stub]]) -> None:
    address, handler = stub
    handler.close_silently = True
    with episerve.Client(address, retries=1) as client:
        for _ in range(5):
            assert client.take("x", [1, 2])["index"].to_pylist() == TABLE["index"].to_pylist()
    assert len(handler.seen) == 5


def test_silently_closed_connections_detected_only_by_sending_are_reopened(
    stub: tuple[str, type[_Stub]], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, handler = stub
    handler.close_silently = True
    monkeypatch.setattr(_socket_transport.Connection, "idle_and_alive", lambda self: True)
    with episerve.Client(address, retries=1) as client:
        for _ in range(5):
            time.sleep(0.05)  # let the server's close arrive
            assert client.take("x", [1, 2]).num_rows == TABLE.num_rows
    assert len(handler.seen) == 5


def test_chunked_bodies_are_read(stub: tuple[str, type[_Stub]]) -> None:
    address, handler = stub
    handler.chunked = True
    with episerve.Client(address) as client:
        assert client.take("x", [1]).equals(TABLE)
        port = _local_port(client)
        assert client.take("x", [1]).equals(TABLE)
        assert _local_port(client) == port


def test_busy_answers_are_retried_after_retry_after(stub: tuple[str, type[_Stub]]) -> None:
    address, handler = stub
    handler.busy = 2
    with episerve.Client(address, token="tok", retries=episerve.Retries(attempts=3, deadline=5)) as client:
        assert client.take("a/b", [1]).equals(TABLE)
    assert len(handler.seen) == 3
    path, authorization, agent = handler.seen[0]
    assert path == "/datasets/a/b/rows/take"
    assert authorization == "Bearer tok" and agent == f"episerve-client/{episerve.__version__}"


def test_busy_answers_beyond_the_attempts_raise_unavailable(stub: tuple[str, type[_Stub]]) -> None:
    address, handler = stub
    handler.busy = 10
    with pytest.raises(episerve.Unavailable, match="warming up") as caught:
        episerve.Client(address, retries=episerve.Retries(attempts=2, deadline=5)).take("x", [1])
    assert caught.value.status == 503 and caught.value.method == "POST"
    assert len(handler.seen) == 2


def test_errors_through_the_socket_transport_are_typed(url: str) -> None:
    with episerve.Client(url) as client:
        with pytest.raises(episerve.NotFound, match="no dataset 'no/such'") as caught:
            client.take("no/such", [0])
        assert caught.value.url == f"{url}/datasets/no/such/rows/take" and caught.value.method == "POST"
        port = _local_port(client)
        with pytest.raises(episerve.InvalidRequest, match="'3-x'") as invalid:
            client.rows(DEMO, episodes="1,3-x", stop=2)
        assert invalid.value.status == 422 and invalid.value.url.startswith(f"{url}/datasets/{DEMO}/rows?")
        with pytest.raises(episerve.ServerError, match="nope"):
            client.take(DEMO, [0], columns=["index", "nope"])
        assert client.take(DEMO, [0], columns=["index"])["index"].to_pylist() == [0]
        assert _local_port(client) == port
        assert isinstance(client._transport, SocketTransport)


def test_unreachable_server_raises_connection_failed_naming_the_cause() -> None:
    from tests.support import free_port

    address = f"http://127.0.0.1:{free_port()}"
    retries = episerve.Retries(attempts=3, backoff=0.01, deadline=2)
    with pytest.raises(episerve.ConnectionFailed, match="ConnectError") as caught:
        episerve.Client(address, retries=retries).take(DEMO, [0])
    assert caught.value.attempts == 3 and address in str(caught.value)


def test_a_refused_first_contact_fails_fast_naming_the_url() -> None:
    from tests.support import free_port

    address = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(episerve.ConnectionFailed) as caught:
        episerve.Client(address).datasets()  # the default policy: a 60 s deadline once the server has answered
    assert time.monotonic() - started < episerve.Retries().first_contact_deadline + 2.0
    assert address in str(caught.value) and "is it running?" in str(caught.value)
    assert "ConnectError" in str(caught.value) and caught.value.attempts > 1


def test_every_retry_is_logged_as_a_warning_with_its_reason_and_the_time_left(
    stub: tuple[str, type[_Stub]], caplog: pytest.LogCaptureFixture
) -> None:
    address, handler = stub
    handler.busy = 2
    with caplog.at_level("WARNING", logger="episerve"), episerve.Client(address, retries=3) as client:
        assert client.take("x", [1]).equals(TABLE)
    retries = [record for record in caplog.records if record.name == "episerve"]
    assert [record.levelname for record in retries] == ["WARNING", "WARNING"]
    message = retries[0].getMessage()
    assert f"POST {address}/datasets/x/rows/take failed (503 Unavailable: warming up)" in message
    assert "retry 1 of 2 in 0.10 s" in message and "s left of the retry deadline" in message


def test_a_server_that_answered_once_gets_the_whole_deadline_to_come_back(stub: tuple[str, type[_Stub]]) -> None:
    address, handler = stub
    retries = episerve.Retries(attempts=100, backoff=0.05, max_backoff=0.1, deadline=20, first_contact_deadline=0.2)
    client = episerve.Client(address, retries=retries)
    assert client.take("x", [1]).equals(TABLE)
    port = int(address.rsplit(":", 1)[1])
    servers = [httpd for httpd in handler.servers]
    for httpd in servers:  # the server goes away ...
        httpd.shutdown()
        httpd.server_close()
    client.close()

    def come_back() -> None:  # ... and is back a second later, far past the first-contact deadline
        time.sleep(1.0)
        httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        handler.servers.append(httpd)
        httpd.serve_forever()

    threading.Thread(target=come_back, daemon=True).start()
    assert client.take("x", [1]).equals(TABLE)
    assert len(handler.seen) == 2
