"""A fault-injecting HTTP proxy in front of the tests' S3 server: it forwards every request as it is, and on demand
delays each one, fails the reads of objects, or answers listings with garbage. Each request it saw is recorded."""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Seen:
    """A request the proxy received, and the status it answered."""

    method: str
    path: str
    range: str | None
    authorization: str
    status: int


class StoreProxy:
    """Forwards to the S3 server on `upstream_port` (127.0.0.1). Faults, settable at any time:

    - `delay_s`: every request waits this long before it is forwarded;
    - `fail_reads`: (status, S3 error code) answered to every GET or HEAD of an object (listings still pass);
    - `fail_row_groups`: the same answer, but only to ranged GETs that stop short of the object's end, so a
      parquet footer (read from the end) arrives and the row groups after it do not;
    - `listing_body`: listings are answered 200 with this body instead of the listing."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay_s = 0.0
        self.fail_reads: tuple[int, str] | None = None
        self.fail_row_groups: tuple[int, str] | None = None
        self.listing_body: bytes | None = None
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="store-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def heal(self) -> None:
        """No more faults: every request is forwarded at once."""
        self.delay_s, self.fail_reads, self.fail_row_groups, self.listing_body = 0.0, None, None, None

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def __enter__(self) -> StoreProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up on a delayed answer closes its connection: not a failure of the test


def _handler(proxy: StoreProxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else each answer waits for a delayed ACK (40 ms)

        def log_message(self, format: str, *args: object) -> None:
            pass

        def forward(self) -> None:
            if proxy.delay_s:
                time.sleep(proxy.delay_s)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            listing = "list-type" in self.path or self.path.rstrip("/").count("/") < 2
            if listing and proxy.listing_body is not None and self.command == "GET":
                return self.answer(200, proxy.listing_body, "application/xml")
            if not listing and proxy.fail_reads and self.command in ("GET", "HEAD"):
                return self.refuse(*proxy.fail_reads)
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body or None, headers=dict(self.headers.items()))
                response = upstream.getresponse()
                data = response.read()
            finally:
                upstream.close()
            span = response.getheader("Content-Range")
            if span and proxy.fail_row_groups and not _reaches_the_end(span):
                return self.refuse(*proxy.fail_row_groups)
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS]
            length = response.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
            self.send(response.status, [*headers, ("Content-Length", length)], data)

        def refuse(self, status: int, code: str) -> None:
            xml = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{code} (injected)</Message></Error>"
            self.answer(status, xml.encode(), "application/xml")

        def answer(self, status: int, data: bytes, kind: str) -> None:
            self.send(status, [("Content-Type", kind), ("Content-Length", str(len(data)))], data)

        def send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            auth = self.headers.get("Authorization", "")
            proxy.record(Seen(self.command, self.path, self.headers.get("Range"), auth, status))
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

    return Handler


_HOP_HEADERS = {"transfer-encoding", "connection", "content-length", "keep-alive"}


def _reaches_the_end(content_range: str) -> bool:
    """Whether a `Content-Range: bytes first-last/total` ends at the object's last byte."""
    span, _, total = content_range.split(" ", 1)[-1].partition("/")
    return total == "*" or int(span.split("-")[1]) + 1 == int(total)
