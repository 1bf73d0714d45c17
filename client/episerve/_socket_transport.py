"""The transport for plain `http://` servers: keep-alive sockets, httptools for HTTP/1.1, bodies received in place.

Why not httpx here: httpx spends about a millisecond of client CPU per small request in its layers, and hands a
large body over in 64 KiB pieces that top out well below loopback speed (`bench/client_read.py`). This transport
sends each request with one `sendall` and lets httptools (llhttp, the parser uvicorn uses) parse the response
head only. The body is then received with `recv_into` straight into one pyarrow-allocated buffer: a body of known
`Content-Length` into a buffer of its size, a chunked one (how the server streams answers it builds piece by piece)
into a buffer that grows as chunks announce their sizes, the chunk framing read beside it. No body byte passes
through Python objects or is joined afterwards: at a 480x640 camera's ~60 MB a batch, those copies cost the
trainer more CPU than the server's JPEG decode. Since the parser never sees the body, every response gets a fresh
parser, while the connection itself is kept for the next request. (h11, pure Python, cost about 0.1 ms of client
CPU per request here: as much again as the rest of a 256-row take.)

A reused connection that turns out to have been closed by the server (an idle keep-alive timeout) before any byte
of the answer arrived is replaced and the request sent once more, without spending a retry: the requests the
client makes are idempotent reads.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import zlib

import httptools
import pyarrow as pa

from episerve._transport import (
    ConnectError,
    ConnectTimeout,
    ProtocolError,
    ReadError,
    ReadTimeout,
    Request,
    Response,
    Timeouts,
)

_RECV_BYTES = 4 << 20
_HEAD_RECV_BYTES = 64 << 10
_MAX_HEAD_BYTES = 64 << 10
_MAX_CHUNK_LINE_BYTES = 4 << 10  # a chunk's size line with its extensions, or one trailer line
_FIRST_CHUNKED_BYTES = 1 << 20  # a chunked body's first buffer; it doubles as needed
_LOW_WATER_BYTES = 512 << 10
_SO_RCVLOWAT: int | None = getattr(socket, "SO_RCVLOWAT", None)
_EMPTY = pa.py_buffer(b"")


class _Stale(Exception):
    """A reused connection was closed by the server before any byte of the answer arrived."""


class _Head:
    """The parser's callbacks: the response head (the parser is fed the head only)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.on_message_begin()

    def on_message_begin(self) -> None:  # again after an informational (1xx) answer
        self.reason = b""
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.keep_alive = False
        self.message_done = False

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # only known while the message is being parsed

    def on_message_complete(self) -> None:
        self.message_done = True


class Connection:
    """One HTTP/1.1 connection: one request at a time, kept open while both sides allow."""

    def __init__(self, host: str, port: int, timeouts: Timeouts) -> None:
        try:
            sock = socket.create_connection((host, port), timeout=timeouts.connect)
        except TimeoutError as exc:
            raise ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise ConnectError(f"{exc} (connecting to {host}:{port})") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeouts.read)
        self.host = host if port == 80 else f"{host}:{port}"
        self.sock = sock
        self.used = False  # has answered a request (so a failure may just mean the server closed it idle)
        self.open = True

    def exchange(self, request: Request) -> Response:
        """Send `request` and read its whole response; raises `_Stale` or a `TransportError`."""
        reused = self.used
        self.used = True
        try:
            self.sock.sendall(_serialized(request, self.host))
        except TimeoutError as exc:
            raise ReadTimeout("timed out sending the request") from exc
        except OSError as exc:
            if reused:
                raise _Stale from exc
            raise ReadError(f"{exc} while sending the request") from exc
        head = _Head()
        after_head = self._read_head(head, reused)
        status = head.parser.get_status_code()
        body = self._read_body(head, after_head)
        if not head.keep_alive:
            self.close()
        return Response(status, head.reason.decode("latin-1"), head.headers, _decoded(head.headers, body))

    def _read_head(self, head: _Head, reused: bool) -> bytes:
        """Parse the response head (after any informational 1xx answers); returns the bytes received after it."""
        received = b""
        fed = 0  # the bytes of `received` the parser has seen: a head in progress, never a byte beyond it
        first = True
        while True:
            end = received.find(b"\r\n\r\n", max(fed - 3, 0))
            if end >= 0:
                self._feed(head.parser, received[fed : end + 4])
                received, fed = received[end + 4 :], 0
                if head.head_done and head.parser.get_status_code() >= 200:
                    return received
                continue  # a 1xx is followed by the real answer
            # The head so far goes to the parser as it arrives, so that a malformed one (bare LF line ends, which
            # llhttp rejects) fails at once instead of waiting for an end of head that never comes.
            if fed < len(received):
                self._feed(head.parser, received[fed:])
                fed = len(received)
            if len(received) > _MAX_HEAD_BYTES:
                raise ProtocolError(f"the response head is longer than {_MAX_HEAD_BYTES} bytes")
            try:
                data = self.sock.recv(_HEAD_RECV_BYTES)
            except TimeoutError as exc:
                raise ReadTimeout("timed out waiting for the response") from exc
            except OSError as exc:
                if reused and first:
                    raise _Stale from exc
                raise ReadError(f"{exc} while waiting for the response") from exc
            if not data:
                if reused and first:
                    raise _Stale
                raise ProtocolError("the server closed the connection without a complete response head")
            first = False
            received += data

    def _read_body(self, head: _Head, received: bytes) -> pa.Buffer:
        if head.message_done:
            return _EMPTY  # no body (204, 304, a Content-Length of 0)
        codings = head.headers.get("transfer-encoding")
        if codings is not None:  # the client sends no `TE`: chunked is the one transfer coding a server may use
            if [coding.strip().lower() for coding in codings.split(",")] != ["chunked"]:
                raise ProtocolError(f"unsupported transfer-coding {codings!r} (only chunked is accepted)")
            return self._receive_chunked(received, _expected_length(head.headers.get("x-expected-length")))
        length = head.headers.get("content-length")
        if length is not None:  # into a buffer of the client's own, even when it all arrived
            return self._receive_exactly(_content_length(length), received)
        return self._receive_to_end([received])  # delimited by the end of the connection

    @staticmethod
    def _feed(parser: httptools.HttpResponseParser, data: bytes) -> None:
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise ProtocolError(f"invalid response from the server: {exc}") from exc
        except httptools.HttpParserUpgrade as exc:  # not an HttpParserError: a 101 the client never asked for
            raise ProtocolError("the server switched protocols (101 Upgrade) unasked") from exc

    def _receive(self, what: str, most: int = _RECV_BYTES) -> bytes:
        try:
            return self.sock.recv(most)
        except TimeoutError as exc:
            raise ReadTimeout(f"timed out reading {what}") from exc
        except OSError as exc:
            raise ReadError(f"{exc} while reading {what}") from exc

    def _receive_to_end(self, pieces: list[bytes]) -> pa.Buffer:
        while data := self._receive("the body"):
            pieces.append(data)
        self.close()
        return _joined(pieces)

    def _receive_exactly(self, size: int, received: bytes) -> pa.Buffer:
        if len(received) > size:
            raise ProtocolError(f"the body is longer than its Content-Length ({size} bytes)")
        try:
            buffer = pa.allocate_buffer(size)
        except (MemoryError, pa.ArrowException) as exc:
            raise _unallocatable(size, exc) from exc
        with memoryview(buffer).cast("B") as target:
            target[: len(received)] = received
            self._fill(target, len(received), "body bytes")
        return buffer

    def _receive_chunked(self, received: bytes, expected: int = 0) -> pa.Buffer:
        """A chunked body, de-chunked: each chunk's data is received in place into one growing buffer, its framing
        (size lines, the CRLF after each chunk, trailers) read through a small byte string beside it. `expected`:
        the length the server expects (`X-Expected-Length`), which the buffer is sized to at once (memory is
        reserved, not touched), so a body no longer than that is never copied into a larger buffer."""
        framing = _ChunkFraming(self, received)
        buffer = pa.allocate_buffer(0, resizable=True)
        if expected:
            with contextlib.suppress(MemoryError, pa.ArrowException):  # else grown as chunks arrive
                buffer.resize(expected, shrink_to_fit=False)
        filled = 0
        while size := framing.next_chunk_size():
            if filled + size > buffer.size:
                _resize(buffer, max(filled + size, 2 * buffer.size, _FIRST_CHUNKED_BYTES))
            with memoryview(buffer).cast("B")[filled : filled + size] as target:
                taken = framing.take_into(target)
                self._fill(target, taken, "a chunk's bytes")
            filled += size
            framing.expect_crlf()
        framing.skip_trailers()
        return buffer.slice(0, filled) if filled else _EMPTY

    def _fill(self, target: memoryview, position: int, what: str) -> None:
        """Receive into `target[position:]` until it is full."""
        size = len(target)
        # A large body arrives in loopback-sized pieces; waking once per `_LOW_WATER_BYTES` instead of once per
        # piece saves most of the receive calls. The last stretch takes whatever arrives.
        waiting_for = _LOW_WATER_BYTES if size - position >= 2 * _LOW_WATER_BYTES else 1
        if waiting_for > 1:
            waiting_for = self._wake_after(waiting_for)
        try:
            while position < size:
                if waiting_for > size - position:
                    waiting_for = self._wake_after(1)
                count = self.sock.recv_into(target[position:], min(size - position, _RECV_BYTES))
                if count == 0:
                    raise ReadError(f"the connection closed after {position} of {size} {what}")
                position += count
        except TimeoutError as exc:
            raise ReadTimeout(f"timed out after {position} of {size} {what}") from exc
        except OSError as exc:
            raise ReadError(f"{exc} after {position} of {size} {what}") from exc
        finally:
            if waiting_for > 1 and self.open:
                self._wake_after(1)

    def _wake_after(self, size: int) -> int:
        """Let receives wait until `size` bytes are there (or the connection ends); returns the size in force."""
        if _SO_RCVLOWAT is None:
            return 1
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, size)
        except OSError:
            return 1  # not supported here: every receive returns what has arrived
        return size

    def idle_and_alive(self) -> bool:
        """Whether the connection can take a request: open, and the server has neither closed it nor sent
        anything unasked (a readable idle socket means EOF or garbage)."""
        if not self.open:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        self.open = False
        self.sock.close()


def _serialized(request: Request, host: str) -> bytes:
    """The request as HTTP/1.1 bytes: head, then body; header values must not break the head's lines."""
    lines = [f"{request.method} {request.target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in request.headers.items()]
    if request.body or request.method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(request.body)}")
    head = "\r\n".join(lines)
    if any(c in head for c in "\0\x7f") or head.count("\n") != len(lines) - 1 or head.count("\r") != len(lines) - 1:
        raise ValueError("a request header or target contains control characters")
    return (head + "\r\n\r\n").encode("latin-1") + request.body


def _resize(buffer: pa.ResizableBuffer, size: int) -> None:
    """Grow `buffer` to `size` bytes (keeping its capacity when smaller)."""
    try:
        buffer.resize(size, shrink_to_fit=False)
    except (MemoryError, pa.ArrowException) as exc:
        raise _unallocatable(size, exc) from exc


def _unallocatable(size: int, exc: Exception) -> ProtocolError:
    """A body size the server announced (a broken or hostile `Content-Length` or chunk size) that this process
    cannot allocate: an answer the client cannot take, so a `TransportError` like any other, not a `MemoryError`."""
    return ProtocolError(f"the server announced a body of {size} bytes, which cannot be allocated: {exc}")


def _expected_length(text: str | None) -> int:
    """`X-Expected-Length` as a buffer size: 0 when absent or invalid, at most `_MAX_EXPECTED_BYTES` (a hint, never
    trusted beyond that)."""
    if text is None or not text.strip().isdigit():
        return 0
    return min(int(text), _MAX_EXPECTED_BYTES)


_MAX_EXPECTED_BYTES = 1 << 32


def _content_length(text: str) -> int:
    if not text.strip().isdigit():
        raise ProtocolError(f"invalid Content-Length {text!r}")
    return int(text)


class _ChunkFraming:
    """The framing of a chunked body (RFC 9112 7.1): reads size lines, the CRLF after each chunk's data and the
    trailers from the connection, keeping bytes received beyond them for the chunk data that follows."""

    def __init__(self, connection: Connection, received: bytes) -> None:
        self._connection = connection
        self._pending = received

    def next_chunk_size(self) -> int:
        """The next chunk's size (0 for the last chunk, whose trailers follow)."""
        line = self._line("a chunk size")
        digits = line.split(b";", 1)[0].strip()
        if not digits or len(digits) > 15 or digits.strip(b"0123456789abcdefABCDEF"):
            raise ProtocolError(f"invalid chunk size line {line[:40]!r}")
        return int(digits, 16)

    def take_into(self, target: memoryview) -> int:
        """Move the chunk data already received into the start of `target`; how many bytes that was."""
        count = min(len(self._pending), len(target))
        target[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def expect_crlf(self) -> None:
        if self._line("the end of a chunk"):
            raise ProtocolError("a chunk is longer than its size")

    def skip_trailers(self) -> None:
        while self._line("the trailers"):
            pass

    def _line(self, what: str) -> bytes:
        """The next line without its CRLF."""
        while (end := self._pending.find(b"\r\n")) < 0:
            if len(self._pending) > _MAX_CHUNK_LINE_BYTES:
                raise ProtocolError(f"a line longer than {_MAX_CHUNK_LINE_BYTES} bytes in {what}")
            data = self._connection._receive(what, _HEAD_RECV_BYTES)  # little of the chunk data beyond
            if not data:
                raise ReadError(f"the connection closed in {what} of a chunked body")
            self._pending += data
        line, self._pending = self._pending[:end], self._pending[end + 2 :]
        return line


def _joined(pieces: list[bytes]) -> pa.Buffer:
    if not pieces:
        return _EMPTY
    return pa.py_buffer(pieces[0] if len(pieces) == 1 else b"".join(pieces))


def _decoded(headers: dict[str, str], body: pa.Buffer) -> pa.Buffer:
    """The body without its content coding: the client asks for `identity`, but a proxy may compress anyway."""
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip", "deflate"):
        try:
            return pa.py_buffer(zlib.decompress(body.to_pybytes(), wbits=zlib.MAX_WBITS | 32))
        except zlib.error as exc:
            raise ProtocolError(f"bad {encoding} body: {exc}") from exc
    raise ProtocolError(f"unsupported content-encoding {encoding!r}")


class SocketTransport:
    """Keep-alive connections to one `host:port`, reused one request at a time (one in single-threaded use)."""

    def __init__(self, host: str, port: int, timeouts: Timeouts) -> None:
        self.host, self.port, self.timeouts = host, port, timeouts
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def handle_request(self, request: Request) -> Response:
        """Send one request and return the complete response."""
        connection = self._acquire()
        try:
            try:
                response = connection.exchange(request)
            except _Stale:
                connection.close()  # closed by the server while idle: send once more on a fresh connection
                connection = Connection(self.host, self.port, self.timeouts)
                response = connection.exchange(request)
        except BaseException:
            connection.close()
            raise
        if connection.open:
            with self._lock:
                self._idle.append(connection)
        return response

    def _acquire(self) -> Connection:
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return Connection(self.host, self.port, self.timeouts)
            if connection.idle_and_alive():
                return connection
            connection.close()

    def close(self) -> None:
        """Close the idle connections (call only in the process that opened them)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
