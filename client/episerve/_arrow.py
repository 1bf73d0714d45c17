"""Arrow IPC response bodies read into one buffer of exactly `Content-Length` bytes, then decoded zero-copy.

httpx hands a body over in 64 KiB pieces through several layers, which tops out well below loopback speed. For
large bodies the reader takes the first piece from httpx (which holds whatever the HTTP parser buffered past the
headers) and receives the rest straight from the connection's socket into the buffer with `recv_into`. The
connection is then closed instead of being returned to the pool, since its parser has not seen those bytes; one
reconnect per multi-megabyte body is cheap. Small bodies keep the ordinary, connection-reusing path.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

import httpx
import pyarrow as pa

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DIRECT_READ_MIN_BYTES = 1 << 20
_RECV_BYTES = 4 << 20


class IncompleteBody(httpx.ReadError):
    """The connection ended before `Content-Length` bytes arrived (retried like any read error)."""


@dataclass(frozen=True)
class ArrowBody:
    """A decoded Arrow stream and the buffer its columns point into (writable, owned by the client)."""

    table: pa.Table
    buffer: pa.Buffer | None


def read_arrow(response: httpx.Response) -> ArrowBody:
    """Read a streamed httpx response holding an Arrow IPC stream and decode it without copying the data."""
    length = response.headers.get("content-length")
    encoded = response.headers.get("content-encoding", "identity").lower() not in ("", "identity")
    if length is None or encoded:
        body = pa.py_buffer(response.read())
        return ArrowBody(pa.ipc.open_stream(body).read_all(), None)
    size = int(length)
    buffer = pa.allocate_buffer(size)
    _fill(response, memoryview(buffer).cast("B"))
    return ArrowBody(pa.ipc.open_stream(buffer).read_all(), buffer)


def _fill(response: httpx.Response, target: memoryview) -> None:
    size = len(target)
    position = 0
    pieces = response.iter_raw()
    sock = _socket_of(response) if size >= DIRECT_READ_MIN_BYTES else None
    for piece in pieces:
        if position + len(piece) > size:
            raise httpx.RemoteProtocolError(f"body longer than Content-Length ({size} bytes)")
        target[position : position + len(piece)] = piece
        position += len(piece)
        if sock is not None:
            break
    if sock is not None and position < size:
        _recv_exactly(sock, target, position, response)
        response.close()  # the HTTP parser never saw these bytes: the connection must not be reused
        return
    if position != size:
        raise IncompleteBody(f"received {position} of {size} body bytes")


def _socket_of(response: httpx.Response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    if stream is None:
        return None
    sock = stream.get_extra_info("socket")
    if not isinstance(sock, socket.socket):  # a mocked or custom transport
        return None
    # Plain TCP, or TLS done by the socket itself, hands out the body bytes; TLS tunnelled through an HTTPS proxy
    # (a TLS object that is not the socket) would hand out ciphertext: keep the ordinary path there.
    if stream.get_extra_info("ssl_object") is not None and not isinstance(sock, ssl.SSLSocket):
        return None
    return sock


def _recv_exactly(sock: socket.socket, target: memoryview, position: int, response: httpx.Response) -> None:
    size = len(target)
    timeout = response.request.extensions.get("timeout", {}).get("read")
    sock.settimeout(timeout)
    try:
        while position < size:
            received = sock.recv_into(target[position:], min(size - position, _RECV_BYTES))
            if received == 0:
                raise IncompleteBody(f"connection closed after {position} of {size} body bytes")
            position += received
    except TimeoutError as exc:
        raise httpx.ReadTimeout(f"timed out after {position} of {size} body bytes") from exc
    except OSError as exc:
        raise httpx.ReadError(f"{exc} after {position} of {size} body bytes") from exc
