"""Chunked bodies through the socket transport, from a raw socket server that sends exactly the bytes a test
gives, in the pieces it gives: chunk extensions, trailers, 1xx answers, framing split anywhere, chunks larger than
the first buffer, and broken framing, which is a typed error and never a wrong body."""

from __future__ import annotations

import gzip
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from episerve._socket_transport import SocketTransport
from episerve._transport import ProtocolError, ReadError, Request, Timeouts

REQUEST = Request("GET", "/x", {})


class _RawServer:
    """Accepts one connection and answers each request on it with the next answer's pieces, sent one `sendall`
    each; closes the connection after the last answer."""

    def __init__(self, answers: Sequence[Sequence[bytes]]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answers = list(answers)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for answer in self.answers:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = connection.recv(65536)
                    if not data:
                        return
                    request += data
                for piece in answer:
                    connection.sendall(piece)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[..., SocketTransport]]:
    servers: list[_RawServer] = []

    def start(*answers: Sequence[bytes]) -> SocketTransport:
        server = _RawServer(answers)
        servers.append(server)
        return SocketTransport("127.0.0.1", server.port, Timeouts(connect=10, read=10))

    yield start
    for server in servers:
        server.close()


def _head(extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n" + extra + b"\r\n"
    )


def _chunked(body: bytes, sizes: Sequence[int], extension: bytes = b"", trailers: bytes = b"") -> bytes:
    framed, position = b"", 0
    for size in sizes:
        framed += f"{size:x}".encode() + extension + b"\r\n" + body[position : position + size] + b"\r\n"
        position += size
    assert position == len(body)
    return framed + b"0\r\n" + trailers + b"\r\n"


def _split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_framing_split_anywhere_with_extensions_trailers_and_a_1xx_gives_the_exact_body(
    serve: Callable[..., SocketTransport],
) -> None:
    body = _payload(10_000, 1)
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        + _head()
        + _chunked(body, [1, 4095, 4096, 1808], extension=b";name=value", trailers=b"X-Checksum: 1\r\n")
    )
    everywhere = _split(answer, range(1, len(answer)))  # one byte a send: framing split at every place
    in_three = _split(answer, [len(answer) // 3, 2 * len(answer) // 3])
    transport = serve(everywhere, in_three, [answer])
    for _ in range(3):  # the same kept-alive connection each time: the framing was consumed exactly
        response = transport.handle_request(REQUEST)
        assert response.status == 200
        assert response.body.to_pybytes() == body
    assert len(transport._idle) == 1


def test_chunks_larger_than_the_first_buffer_arrive_whole(serve: Callable[..., SocketTransport]) -> None:
    body = _payload(7 * 2**20 + 3, 2)
    answer = _head() + _chunked(body, [3 * 2**20, 1, 4 * 2**20 + 2])
    transport = serve(_split(answer, [100, 2**20, 5 * 2**20]))
    assert transport.handle_request(REQUEST).body.to_pybytes() == body


@pytest.mark.parametrize("expected", [b"0", b"5000", b"3145728", b"7340035", b"9000000", b"99999999999999", b"x"])
def test_an_expected_length_sizes_the_buffer_and_never_changes_the_body(
    serve: Callable[..., SocketTransport], expected: bytes
) -> None:
    body = _payload(7 * 2**20 + 3, 3)
    answer = _head(b"X-Expected-Length: " + expected + b"\r\n") + _chunked(body, [3 * 2**20, 1, 4 * 2**20 + 2])
    transport = serve(_split(answer, [100, 2**20, 5 * 2**20]))
    assert transport.handle_request(REQUEST).body.to_pybytes() == body


def test_an_empty_chunked_body_is_empty(serve: Callable[..., SocketTransport]) -> None:
    transport = serve([_head() + b"0\r\n\r\n"])
    assert transport.handle_request(REQUEST).body.size == 0


@pytest.mark.parametrize(
    ("framing", "error", "words"),
    [
        (b"zz\r\nab\r\n0\r\n\r\n", ProtocolError, "invalid chunk size"),
        (b"-2\r\nab\r\n0\r\n\r\n", ProtocolError, "invalid chunk size"),
        (b"2\r\nabc\r\n0\r\n\r\n", ProtocolError, "longer than its size"),
        (b"1" * 20 + b"\r\n", ProtocolError, "invalid chunk size"),
        (b"2" + b";x" * 4000, ProtocolError, "a line longer than"),
        (b"10\r\nabc", ReadError, "closed after"),
        (b"3\r\nabc", ReadError, "closed in the end of a chunk"),
    ],
    ids=["not-hex", "negative", "too-long-data", "huge-size", "endless-line", "closed-in-data", "closed-in-framing"],
)
def test_broken_framing_is_a_typed_error_never_a_body(
    serve: Callable[..., SocketTransport], framing: bytes, error: type, words: str
) -> None:
    transport = serve([_head() + framing])
    with pytest.raises(error, match=words):
        transport.handle_request(REQUEST)


@pytest.mark.parametrize(
    "answer",
    [
        _head() + b"fffffffffffffff\r\nab",
        b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\nab",
    ],
    ids=["chunk-size", "content-length"],
)
def test_a_body_size_beyond_memory_is_a_protocol_error(serve: Callable[..., SocketTransport], answer: bytes) -> None:
    transport = serve([answer])
    with pytest.raises(ProtocolError, match="cannot be allocated"):
        transport.handle_request(REQUEST)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"HTTP/1.1 200 OK\nContent-Length: 2\n\nab", "invalid response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nab", "invalid response"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", "Upgrade"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab", "Upgrade"),
    ],
    ids=["bare-lf-lines", "bare-lf-in-a-header", "unasked-upgrade", "unasked-101"],
)
def test_a_broken_head_on_a_connection_left_open_is_a_protocol_error_at_once(
    serve: Callable[..., SocketTransport], answer: bytes, words: str
) -> None:
    transport = serve([answer], [])  # the server then waits for another request: the connection stays open
    started = time.monotonic()
    with pytest.raises(ProtocolError, match=words):
        transport.handle_request(REQUEST)
    assert time.monotonic() - started < 5  # not the read timeout (10 s)


@pytest.mark.parametrize("codings", [b"gzip, chunked", b"chunked, gzip", b"xchunked"])
def test_a_transfer_coding_other_than_chunked_is_a_protocol_error_never_a_body(
    serve: Callable[..., SocketTransport], codings: bytes
) -> None:
    body = gzip.compress(b"the body")
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: "
        + codings
        + b"\r\nConnection: close\r\n\r\n"
        + _chunked(body, [9, len(body) - 9])
    )
    transport = serve([answer])
    with pytest.raises(ProtocolError, match="transfer-coding"):
        transport.handle_request(REQUEST)
