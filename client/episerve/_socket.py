"""A keep-alive HTTP/1.1 transport on plain sockets for the Arrow data requests of `http://` servers.

httpx spends about a millisecond of client CPU per small request in its layers; this transport sends the whole
request with one `sendall`, parses the status line and headers itself, and receives the body with `recv_into`
straight into a pyarrow-allocated buffer, whatever its size, keeping the connection for the next request.

Failures are raised as the httpx exceptions the client's retry loop already handles (`ConnectError`, `ReadError`,
`ReadTimeout`, `RemoteProtocolError`...). A reused connection that turns out to be closed by the server (an idle
keep-alive timeout) before any byte of the answer arrived is replaced and the request sent once more, without
spending a retry: the data requests are idempotent reads.
"""

from __future__ import annotations

import select
import socket
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import pyarrow as pa

_HEAD_BYTES = 64 << 10
_RECV_BYTES = 4 << 20
_LOW_WATER_BYTES = 512 << 10
_SO_RCVLOWAT: int | None = getattr(socket, "SO_RCVLOWAT", None)
_MAX_HEAD_BYTES = 64 << 10
_EMPTY = pa.py_buffer(b"")


class _Stale(Exception):
    """A reused connection was closed by the server before any byte of the answer arrived."""


@dataclass(frozen=True)
class RawResponse:
    """A complete response: status, reason, headers (lower-case names) and the body in one pyarrow buffer."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: pa.Buffer


class Connection:
    """One HTTP/1.1 connection: one request at a time, kept open while both sides allow."""

    def __init__(self, host: str, port: int, timeout: httpx.Timeout) -> None:
        try:
            sock = socket.create_connection((host, port), timeout=timeout.connect)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout.read)
        self.sock = sock
        self.used = False  # has answered a request (so a failure may just mean the server closed it idle)
        self.open = True

    def exchange(self, request: bytes) -> RawResponse:
        """Send `request` and read its whole response; raises `_Stale` or an httpx transport error."""
        reused = self.used
        self.used = True
        try:
            self.sock.sendall(request)
        except TimeoutError as exc:
            raise httpx.WriteTimeout("timed out sending the request") from exc
        except OSError as exc:
            if reused:
                raise _Stale from exc
            raise httpx.WriteError(str(exc)) from exc
        status, reason, headers, rest = self._read_head(reused)
        body = _EMPTY if status in (204, 304) or status < 200 else self._read_body(headers, rest)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return RawResponse(status, reason, headers, body)

    def _recv(self, size: int, what: str) -> bytes:
        try:
            return self.sock.recv(size)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"timed out reading the {what}") from exc
        except OSError as exc:
            raise httpx.ReadError(f"{exc} while reading the {what}") from exc

    def _read_head(self, reused: bool) -> tuple[int, str, dict[str, str], bytes]:
        try:
            data = self.sock.recv(_HEAD_BYTES)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("timed out waiting for the response") from exc
        except OSError as exc:
            if reused:
                raise _Stale from exc
            raise httpx.ReadError(f"{exc} while waiting for the response") from exc
        if not data:
            if reused:
                raise _Stale
            raise httpx.RemoteProtocolError("server disconnected without sending a response")
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > _MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("response head too long")
            more = self._recv(_HEAD_BYTES, "response head")
            if not more:
                raise httpx.RemoteProtocolError("server disconnected in the response head")
            data += more
        lines = data[:end].decode("latin-1").split("\r\n")
        try:
            version, code, *reason = lines[0].split(" ", 2)
            status = int(code)
        except ValueError as exc:
            raise httpx.RemoteProtocolError(f"malformed status line {lines[0]!r}") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise httpx.RemoteProtocolError(f"malformed header line {line!r}")
            headers[name.strip().lower()] = value.strip()
        if version != "HTTP/1.1" and headers.get("connection", "").lower() != "keep-alive":
            headers.setdefault("connection", "close")
        return status, reason[0] if reason else "", headers, data[end + 4 :]

    def _read_body(self, headers: dict[str, str], rest: bytes) -> pa.Buffer:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raw = self._read_chunked(rest)
        elif (length := headers.get("content-length")) is not None:
            buffer = self._read_exactly(int(length), rest)
            if _identity(headers):
                return buffer
            raw = buffer.to_pybytes()
        else:
            raw = self._read_to_end(rest)
        return pa.py_buffer(_decode(headers, raw))

    def _read_exactly(self, size: int, rest: bytes) -> pa.Buffer:
        if len(rest) > size:
            raise httpx.RemoteProtocolError(f"body longer than Content-Length ({size} bytes)")
        buffer = pa.allocate_buffer(size)
        target = memoryview(buffer).cast("B")
        target[: len(rest)] = rest
        position = len(rest)
        # A large body arrives in loopback-sized pieces; waking once per `_LOW_WATER_BYTES` instead of once per
        # piece saves most of the receive calls. The last stretch takes whatever arrives.
        waiting_for = _LOW_WATER_BYTES if size - position >= 2 * _LOW_WATER_BYTES else 1
        if waiting_for > 1:
            waiting_for = self._wake_after(waiting_for)
        try:
            while position < size:
                if waiting_for > size - position:
                    waiting_for = self._wake_after(1)
                received = self.sock.recv_into(target[position:], min(size - position, _RECV_BYTES))
                if received == 0:
                    raise httpx.ReadError(f"connection closed after {position} of {size} body bytes")
                position += received
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"timed out after {position} of {size} body bytes") from exc
        except OSError as exc:
            raise httpx.ReadError(f"{exc} after {position} of {size} body bytes") from exc
        finally:
            if waiting_for > 1 and self.open:
                self._wake_after(1)
        return buffer

    def _wake_after(self, size: int) -> int:
        """Let receives wait until `size` bytes are there (or the connection ends); returns the size in force."""
        if _SO_RCVLOWAT is None:
            return 1
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, size)
        except OSError:
            return 1  # not supported here: every receive returns what has arrived
        return size

    def _read_chunked(self, data: bytes) -> bytes:
        pieces: list[bytes] = []
        while True:
            while (line_end := data.find(b"\r\n")) < 0:
                data += self._more("chunk size")
            try:
                size = int(data[:line_end].split(b";", 1)[0], 16)
            except ValueError as exc:
                raise httpx.RemoteProtocolError("malformed chunk size") from exc
            data = data[line_end + 2 :]
            if size == 0:
                while not (data.startswith(b"\r\n") or b"\r\n\r\n" in data):  # optional trailers, then CRLF
                    data += self._more("chunked trailer")
                return b"".join(pieces)
            while len(data) < size + 2:
                data += self._more("chunk")
            pieces.append(data[:size])
            data = data[size + 2 :]

    def _more(self, what: str) -> bytes:
        more = self._recv(_RECV_BYTES, what)
        if not more:
            raise httpx.ReadError(f"connection closed in a {what}")
        return more

    def _read_to_end(self, rest: bytes) -> bytes:
        pieces = [rest]
        while more := self._recv(_RECV_BYTES, "body"):
            pieces.append(more)
        self.close()
        return b"".join(pieces)

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


def _identity(headers: Mapping[str, str]) -> bool:
    return headers.get("content-encoding", "identity").lower() in ("", "identity")


def _decode(headers: Mapping[str, str], raw: bytes) -> bytes:
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("", "identity"):
        return raw
    if encoding in ("gzip", "x-gzip", "deflate"):
        try:
            return zlib.decompress(raw, wbits=zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
        except zlib.error as exc:
            raise httpx.DecodingError(f"bad {encoding} body: {exc}") from exc
    raise httpx.DecodingError(f"unsupported content-encoding {encoding!r}")


class SocketPool:
    """Keep-alive connections to one `host:port`, reused one request at a time (one in single-threaded use)."""

    def __init__(self, host: str, port: int, timeout: httpx.Timeout) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def request(self, request: bytes) -> RawResponse:
        """Send one complete request (head and body) and return the complete response."""
        connection = self._acquire()
        try:
            try:
                response = connection.exchange(request)
            except _Stale:
                connection.close()  # closed by the server while idle: send once more on a fresh connection
                connection = Connection(self.host, self.port, self.timeout)
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
                return Connection(self.host, self.port, self.timeout)
            if connection.idle_and_alive():
                return connection
            connection.close()

    def close(self) -> None:
        """Close the idle connections (call only in the process that opened them)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
