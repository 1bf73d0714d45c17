"""Ways to read rows from a running episerve server into a `pyarrow.Table`, behind one small interface.

- `ClientAccess`: the `episerve` client package (what users run; the figures use it whenever it is installed).
- `HttpxAccess`: plain httpx, body read in full (the naive client, for comparison).
- `SocketAccess`: a minimal HTTP/1.1 reader on a raw socket that reads exactly `Content-Length` bytes into a
  reused buffer: the ceiling of what any Python client can get out of the server.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import httpx
import pyarrow as pa


class Access(Protocol):
    """Rows of a dataset as a `pyarrow.Table`, by contiguous range or by index."""

    label: str

    def rows(
        self, dataset: str, start: int, stop: int, columns: Sequence[str] | None = None, episodes: str | None = None
    ) -> pa.Table: ...

    def take(
        self,
        dataset: str,
        indices: Sequence[int],
        columns: Sequence[str] | None = None,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: str | None = None,
    ) -> pa.Table: ...

    def close(self) -> None: ...


def _rows_params(start: int, stop: int, columns: Sequence[str] | None, episodes: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"start": start, "stop": stop}
    if episodes is not None:
        params["episodes"] = episodes
    if columns is not None:
        params["columns"] = ",".join(columns)
    return params


def _take_body(
    indices: Sequence[int],
    columns: Sequence[str] | None,
    delta_timestamps: dict[str, list[float]] | None,
    episodes: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"indices": [int(i) for i in indices]}
    if episodes is not None:
        body["episodes"] = episodes
    if columns is not None:
        body["columns"] = list(columns)
    if delta_timestamps is not None:
        body["delta_timestamps"] = delta_timestamps
    return body


class HttpxAccess:
    """httpx with its default body handling: the whole body as `bytes`, then decoded."""

    label = "httpx (default read)"

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=120.0)

    def rows(
        self, dataset: str, start: int, stop: int, columns: Sequence[str] | None = None, episodes: str | None = None
    ) -> pa.Table:
        response = self.http.get(f"/datasets/{dataset}/rows", params=_rows_params(start, stop, columns, episodes))
        response.raise_for_status()
        return pa.ipc.open_stream(response.content).read_all()

    def take(
        self,
        dataset: str,
        indices: Sequence[int],
        columns: Sequence[str] | None = None,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: str | None = None,
    ) -> pa.Table:
        body = _take_body(indices, columns, delta_timestamps, episodes)
        response = self.http.post(f"/datasets/{dataset}/rows/take", json=body)
        response.raise_for_status()
        return pa.ipc.open_stream(response.content).read_all()

    def close(self) -> None:
        self.http.close()


class SocketAccess:
    """HTTP/1.1 keep-alive on one raw socket, each body received into one reused buffer.

    A table returned here points into that buffer and is only valid until the next call: fine for measuring,
    not for keeping data.
    """

    label = "raw socket, reused buffer"

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.sock: socket.socket | None = None
        self.buffer = bytearray(1 << 20)
        self.head = bytearray()

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.sock

    def _request(self, method: str, target: str, body: bytes = b"") -> pa.Table:
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        request = head.encode() + b"\r\n" + body
        reused = self.sock is not None
        try:
            sock = self._connect()
            sock.sendall(request)
            status, length, rest = self._read_head(sock)
        except (ConnectionError, OSError):
            if not reused:
                raise
            self.close()  # the server closed an idle keep-alive connection: reconnect once
            sock = self._connect()
            sock.sendall(request)
            status, length, rest = self._read_head(sock)
        if len(self.buffer) < length:
            self.buffer = bytearray(length)
        view = memoryview(self.buffer)
        view[: len(rest)] = rest
        position = len(rest)
        while position < length:
            received = sock.recv_into(view[position:length])
            if received == 0:
                raise ConnectionError("connection closed mid-body")
            position += received
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {bytes(view[:length])[:300]!r}")
        return pa.ipc.open_stream(pa.py_buffer(view[:length])).read_all()

    def _read_head(self, sock: socket.socket) -> tuple[int, int, bytes]:
        data = bytes(self.head)
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed in the response head")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.split(":", 1) for line in lines[1:])
        length = int(next(v for k, v in headers.items() if k.strip().lower() == "content-length"))
        self.head = bytearray(rest[length:])  # nothing pipelined here, so this stays empty
        return status, length, rest[:length]

    def rows(
        self, dataset: str, start: int, stop: int, columns: Sequence[str] | None = None, episodes: str | None = None
    ) -> pa.Table:
        query = urlencode(_rows_params(start, stop, columns, episodes))
        return self._request("GET", f"/datasets/{dataset}/rows?{query}")

    def take(
        self,
        dataset: str,
        indices: Sequence[int],
        columns: Sequence[str] | None = None,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: str | None = None,
    ) -> pa.Table:
        body = json.dumps(_take_body(indices, columns, delta_timestamps, episodes)).encode()
        return self._request("POST", f"/datasets/{dataset}/rows/take", body)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def client_available() -> bool:
    """Whether the `episerve` client package offers `Client` yet."""
    try:
        import episerve
    except ImportError:
        return False
    return hasattr(episerve, "Client")


class ClientAccess:
    """The `episerve.Client` package."""

    label = "episerve.Client"

    def __init__(self, url: str) -> None:
        import episerve

        self.client = episerve.Client(url)

    def rows(
        self, dataset: str, start: int, stop: int, columns: Sequence[str] | None = None, episodes: str | None = None
    ) -> pa.Table:
        return self.client.rows(dataset, episodes, start=start, stop=stop, columns=columns)

    def take(
        self,
        dataset: str,
        indices: Sequence[int],
        columns: Sequence[str] | None = None,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: str | None = None,
    ) -> pa.Table:
        return self.client.take(dataset, indices, episodes, columns=columns, delta_timestamps=delta_timestamps)

    def close(self) -> None:
        self.client.close()


def best_access(url: str) -> Access:
    """The episerve client when installed, else the plain httpx reader (labelled as such in the report)."""
    return ClientAccess(url) if client_available() else HttpxAccess(url)
