"""ASGI middleware: one access-log line and the request metrics per request, measured to the last byte.

Successful row reads (`GET`/`POST /rows`, `/rows/take`, `/takes`, `/rows/layout`: a training run's batches) are
logged at DEBUG, so a busy trainer does not flood the log; every other request, and every failed one, at INFO (5xx
at WARNING).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics

log = logging.getLogger("episerve.access")

CUT_SHORT = "episerve.cut_short"  # scope key: the status of the problem that cut an answer short once it was under way
ROW_READ_ROUTES = frozenset(
    {
        "/datasets/{dataset_id:path}/rows",
        "/datasets/{dataset_id:path}/rows/take",
        "/datasets/{dataset_id:path}/rows/layout",
        "/takes",
    }
)


class ObservabilityMiddleware:
    """Counts status, bytes and rows of each response and logs them with the duration and the client."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 500, "bytes": 0, "rows": None, "done": False}

        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", []):
                    if name == b"x-row-count":
                        seen["rows"] = int(value)
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    seen["done"] = True
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            self._record(scope, seen, time.perf_counter() - started)

    @staticmethod
    def _record(scope: Scope, seen: dict[str, Any], seconds: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        # Unfinished: cut short by a problem found once the status was out (its status), else the client left.
        status = seen["status"] if seen["done"] else scope.get(CUT_SHORT, 499)
        counted = _counters(endpoint, scope["method"], status)
        counted.requests.inc()
        counted.seconds.observe(seconds)
        counted.bytes.inc(seen["bytes"])
        if seen["rows"] is not None:
            counted.rows.inc(seen["rows"])
        level = access_level(endpoint, status)
        if not log.isEnabledFor(level):
            return
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else None
        query = scope.get("query_string", b"").decode("latin-1")
        path = scope["path"] + (f"?{query}" if query else "")
        log.log(
            level,
            "%s %s %s rows=%s bytes=%d %.1fms client=%s",
            scope["method"],
            path,
            status,
            seen["rows"],
            seen["bytes"],
            seconds * 1000,
            address,
            extra={
                "method": scope["method"],
                "path": path,
                "status": status,
                "rows": seen["rows"],
                "bytes": seen["bytes"],
                "duration_ms": round(seconds * 1000, 3),
                "client": address,
            },
        )


@dataclass(frozen=True)
class _Counters:
    """The metrics of one endpoint, method and status (`labels()` takes a lock and hashes on every call)."""

    requests: Any
    seconds: Any
    bytes: Any
    rows: Any


@functools.cache
def _counters(endpoint: str, method: str, status: int) -> _Counters:
    # Bounded: endpoints are route paths (or "unmatched"), methods and statuses the few HTTP has.
    return _Counters(
        metrics.REQUESTS.labels(endpoint, method, str(status)),
        metrics.REQUEST_SECONDS.labels(endpoint),
        metrics.BYTES_SERVED.labels(endpoint),
        metrics.ROWS_SERVED.labels(endpoint),
    )


def access_level(endpoint: str, status: int) -> int:
    """DEBUG for a successful row read, WARNING for a server error, INFO for everything else."""
    if status >= 500:
        return logging.WARNING
    if status < 400 and endpoint in ROW_READ_ROUTES:
        return logging.DEBUG
    return logging.INFO
