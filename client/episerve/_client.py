"""`Client`: the HTTP API as Python calls returning `pyarrow.Table`s and plain dicts.

One keep-alive `httpx.Client` per process (recreated after `fork`, so DataLoader workers never share a socket with
their parent), plus, for the Arrow data requests to `http://` servers, a keep-alive raw-socket transport
(`_socket.SocketPool`, also per process) that costs a fraction of httpx's CPU per request. Retries are bounded in
attempts and time and shared by both transports; large slices or takes are split into pages the server accepts.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit
from urllib.request import getproxies, proxy_bypass

import httpx
import numpy as np
import pyarrow as pa

from episerve._arrow import ARROW_STREAM, ArrowBody, read_arrow
from episerve._episodes import Episodes, episode_spec
from episerve._errors import ConnectionFailed, EpiserveError, ServerError, TooLarge, server_error
from episerve._retry import RETRY_STATUSES, Retries, RetryBudget, parse_retry_after
from episerve._socket import RawResponse, SocketPool

__version__ = "0.1.0"

DeltaTimestamps = Mapping[str, Sequence[float]]

DEFAULT_TIMEOUT = 60.0
_PAGE_ROWS = 1_000_000  # the server's default `max_rows_per_response`
_TAKE_INDICES = 100_000  # the server's default `max_take_indices`
_MAX_SPEC_IN_URL = 4000  # longer episode specs travel in a POST /rows body instead of the query string
_LIMIT_IN_DETAIL = re.compile(r"limit is (\d+)")
_USER_AGENT = f"episerve-client/{__version__}"


@dataclass(frozen=True)
class Pages:
    """The Arrow bodies of one logical read, in order, and the length of the view they come from."""

    bodies: list[ArrowBody]
    total_rows: int

    @property
    def table(self) -> pa.Table:
        tables = [body.table for body in self.bodies]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    @property
    def buffers(self) -> list[pa.Buffer]:
        return [body.buffer for body in self.bodies if body.buffer is not None]


class Client:
    """A connection to an episerve server.

    `token` is sent as `Authorization: Bearer <token>` (default: `$EPISERVE_TOKEN`). `timeout` is in seconds (or an
    `httpx.Timeout`). `retries` bounds how long a request keeps retrying connection errors and 429/502/503/504
    (a `Retries`, or an int number of attempts). `compression` (`"lz4"` or `"zstd"`) asks for compressed Arrow
    bodies, worth it across slow links (pyarrow decompresses them). Server errors are raised as `ServerError`
    subclasses; a server that stays unreachable raises `ConnectionFailed`. Safe to use from several threads, to
    pickle, and across `fork`. Use it as a context manager or call `close()`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retries: Retries | int | None = None,
        compression: str | None = None,
    ) -> None:
        if compression not in (None, "lz4", "zstd"):
            raise ValueError(f"compression must be None, 'lz4' or 'zstd', got {compression!r}")
        self.url = url.rstrip("/")
        self.compression = compression
        self.token = token if token is not None else os.environ.get("EPISERVE_TOKEN") or None
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        if isinstance(retries, int):
            retries = Retries(attempts=retries)
        self.retries = retries or Retries()
        self._page_rows = _PAGE_ROWS
        self._take_indices = _TAKE_INDICES
        self._http: httpx.Client | None = None
        self._sockets: SocketPool | None = None
        self._pid = 0

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # --- catalog -------------------------------------------------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        """The catalog: one dict per dataset with `id`, `format`, `rows`, `episodes` and `fps`."""
        return self._json("GET", "/datasets")["datasets"]

    def info(self, dataset_id: str) -> dict[str, Any]:
        """One dataset's description: columns, LeRobot features, fps, tasks, row and episode counts, cache state."""
        return self._json("GET", _path(dataset_id))

    def episodes(self, dataset_id: str) -> list[dict[str, Any]]:
        """Per-episode `episode_index`, `length` and, where the format records them, `tasks`."""
        return self._json("GET", _path(dataset_id, "/episodes"))["episodes"]

    # --- rows ----------------------------------------------------------------------------------------------

    def num_rows(
        self,
        dataset_id: str,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        *,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
    ) -> int:
        """Rows in the view of `episodes` (all episodes when None), without reading any.

        The server validates `columns` and `delta_timestamps` too, so a bad selection fails here, up front.
        """
        headers, _ = self._slice(dataset_id, episode_spec(episodes), 0, 0, columns, delta_timestamps, tolerance_s)
        return int(headers["x-total-rows"])

    def rows(
        self,
        dataset_id: str,
        episodes: Episodes = None,
        start: int = 0,
        stop: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
    ) -> pa.Table:
        """View rows `[start, stop)` (clamped to the view like a Python slice) as one table.

        The view is the selected episodes (a spec like `"0,3-5"` or an iterable of ids; all when None) in
        ascending episode order, then stored frame order. Slices larger than the server's per-response limit are
        read page by page. `delta_timestamps` (`{column: [seconds...]}`) turns those columns into temporal windows
        and adds `<column>_is_pad` flags.
        """
        return self._read_pages(dataset_id, episodes, start, stop, columns, delta_timestamps, tolerance_s).table

    def take(
        self,
        dataset_id: str,
        indices: Sequence[int] | np.ndarray,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        *,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
    ) -> pa.Table:
        """Rows at view positions `indices`, in that order (duplicates allowed), as one table."""
        return self._take_rows(dataset_id, indices, episodes, columns, delta_timestamps, tolerance_s).table

    def _read_pages(
        self,
        dataset_id: str,
        episodes: Episodes = None,
        start: int = 0,
        stop: int | None = None,
        columns: Sequence[str] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
    ) -> Pages:
        """`rows()` with the response buffers and the view length (for zero-copy conversion)."""
        if start < 0 or (stop is not None and stop < 0):
            raise ValueError("start and stop are view positions and must be non-negative")
        spec = episode_spec(episodes)
        bodies: list[ArrowBody] = []
        position = start
        while True:
            page_stop = position + self._page_rows if stop is None else min(stop, position + self._page_rows)
            try:
                headers, body = self._slice(
                    dataset_id, spec, position, page_stop, columns, delta_timestamps, tolerance_s
                )
            except TooLarge as exc:
                self._page_rows = _smaller_limit(exc, page_stop - position)
                continue
            bodies.append(body)
            total, served_stop = int(headers["x-total-rows"]), int(headers["x-stop"])
            end = total if stop is None else min(stop, total)
            if served_stop >= end or body.table.num_rows == 0:
                return Pages(bodies, total)
            position = served_stop

    def _take_rows(
        self,
        dataset_id: str,
        indices: Sequence[int] | np.ndarray,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
    ) -> Pages:
        """`take()` with the response buffers and the view length (for zero-copy conversion)."""
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        return self._take_pages(dataset_id, wanted, episode_spec(episodes), columns, delta_timestamps, tolerance_s)

    def _take_pages(
        self,
        dataset_id: str,
        indices: np.ndarray,
        spec: str | None,
        columns: Sequence[str] | None,
        delta_timestamps: DeltaTimestamps | None,
        tolerance_s: float | None,
    ) -> Pages:
        bodies: list[ArrowBody] = []
        total = 0
        position = 0
        while True:
            page = indices[position : position + self._take_indices]
            payload = _body(page, spec, columns, delta_timestamps, tolerance_s)
            if self.compression is not None:
                payload["compression"] = self.compression
            try:
                headers, body = self._request("POST", _path(dataset_id, "/rows/take"), body=payload, arrow=True)
            except TooLarge as exc:
                self._take_indices = _smaller_limit(exc, len(page))
                continue
            bodies.append(body)
            total = int(headers["x-total-rows"])
            position += len(page)
            if position >= len(indices):
                return Pages(bodies, total)

    def _slice(
        self,
        dataset_id: str,
        spec: str | None,
        start: int,
        stop: int | None,
        columns: Sequence[str] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
    ) -> tuple[Mapping[str, str], ArrowBody]:
        """One `/rows` request: GET with a query, or POST with a body when the episode list is too long for a URL."""
        params = _params(spec, start, stop, columns, delta_timestamps, tolerance_s)
        if self.compression is not None:
            params["compression"] = self.compression
        if spec is not None and len(spec) > _MAX_SPEC_IN_URL:
            body = {**params, "columns": list(columns) if columns is not None else None}
            if delta_timestamps is not None:
                body["delta_timestamps"] = _windows(delta_timestamps)
            body = {k: v for k, v in body.items() if v is not None}
            return self._request("POST", _path(dataset_id, "/rows"), body=body, arrow=True)
        return self._request("GET", _path(dataset_id, "/rows"), params=params, arrow=True)

    # --- transport -----------------------------------------------------------------------------------------

    def _json(self, method: str, path: str) -> Any:
        return self._request(method, path)[1]

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        arrow: bool = False,
    ) -> tuple[Mapping[str, str], Any]:
        """Send with retries; the response headers and its decoded body (JSON, or an `ArrowBody`).

        Arrow requests to `http://` servers go over the raw-socket transport, everything else over httpx.
        """
        headers = {"Accept": ARROW_STREAM, "Accept-Encoding": "identity"} if arrow else None
        sockets = self._socket_pool() if arrow else None
        prepared = None if sockets is None else self._raw_request(method, path, params, body)
        budget = RetryBudget(self.retries)
        while True:
            try:
                if sockets is not None and prepared is not None:  # the raw-socket transport
                    request, url = prepared
                    raw = sockets.request(request)
                    if raw.status < 400:
                        return raw.headers, _decode_raw(raw, url)
                    error = _raw_error(raw, method, url)
                    retry_after = parse_retry_after(raw.headers.get("retry-after"))
                else:
                    with self._client().stream(method, path, params=params, json=body, headers=headers) as response:
                        if response.status_code < 400:
                            return response.headers, self._decode(response, arrow)
                        error = _error(response)
                        retry_after = parse_retry_after(response.headers.get("retry-after"))
                if error.status not in RETRY_STATUSES:
                    raise error
                wait = budget.next_wait(retry_after)
                if wait is None:
                    raise error
            except httpx.UnsupportedProtocol as exc:
                raise ConnectionFailed(f"cannot reach {self.url}: {exc}", attempts=1, elapsed=0.0) from exc
            except httpx.TransportError as exc:
                wait = budget.next_wait()
                if wait is None:
                    raise ConnectionFailed(
                        f"could not reach {self.url} ({method} {path}) after {budget.attempt} attempts in "
                        f"{budget.elapsed:.1f} s: {type(exc).__name__}: {exc}",
                        attempts=budget.attempt,
                        elapsed=budget.elapsed,
                    ) from exc
            time.sleep(wait)

    @staticmethod
    def _decode(response: httpx.Response, arrow: bool) -> Any:
        if not arrow:
            return json.loads(response.read())
        media = response.headers.get("content-type", "").split(";")[0].strip()
        if media != ARROW_STREAM:
            raise EpiserveError(f"expected an Arrow stream from {response.request.url}, got {media or 'no type'!r}")
        return read_arrow(response)

    def _raw_request(self, method: str, path: str, params: dict[str, Any] | None, body: Any) -> tuple[bytes, str]:
        """The complete HTTP/1.1 request (head and JSON body) for the socket transport, and its URL."""
        parts = urlsplit(self.url)
        target = parts.path + path
        url = self.url + path
        if params:
            query = urlencode(params)
            target, url = f"{target}?{query}", f"{url}?{query}"
        head = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}", f"User-Agent: {_USER_AGENT}"]
        head += [f"Accept: {ARROW_STREAM}", "Accept-Encoding: identity"]
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")
        content = b""
        if body is not None:
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            head += ["Content-Type: application/json", f"Content-Length: {len(content)}"]
        elif method != "GET":
            head.append("Content-Length: 0")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + content, url

    def _socket_pool(self) -> SocketPool | None:
        """This process's raw-socket transport, or None where httpx must carry the request (https, proxies)."""
        if self._pid == os.getpid():
            if self._sockets is not None:
                return self._sockets
        else:
            self._reset_for_this_process()
        parts = urlsplit(self.url)
        if parts.scheme != "http" or parts.hostname is None or _proxied(parts.hostname):
            return None
        self._sockets = SocketPool(parts.hostname, parts.port or 80, self.timeout)
        return self._sockets

    def _client(self) -> httpx.Client:
        http = self._http
        if http is not None and self._pid == os.getpid():
            return http
        if self._pid != os.getpid():
            self._reset_for_this_process()
        headers = {"User-Agent": _USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        http = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout)
        self._http = http
        return http

    def _reset_for_this_process(self) -> None:
        # A forked child must not touch its parent's sockets: leave the inherited connections alone (closing them
        # could disturb the parent's) and open fresh ones.
        self._http, self._sockets, self._pid = None, None, os.getpid()

    def close(self) -> None:
        """Close this process's connections (the client reconnects if used again)."""
        if self._pid == os.getpid():
            if self._http is not None:
                self._http.close()
            if self._sockets is not None:
                self._sockets.close()
        self._http, self._sockets = None, None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_http"], state["_sockets"], state["_pid"] = None, None, 0
        return state


def _proxied(host: str) -> bool:
    """Whether httpx would route plain-http requests to `host` through a proxy from the environment."""
    proxies = getproxies()
    return bool(proxies.get("http") or proxies.get("all")) and not proxy_bypass(host)


def _decode_raw(response: RawResponse, url: str) -> ArrowBody:
    media = response.headers.get("content-type", "").split(";")[0].strip()
    if media != ARROW_STREAM:
        raise EpiserveError(f"expected an Arrow stream from {url}, got {media or 'no type'!r}")
    return ArrowBody(pa.ipc.open_stream(response.body).read_all(), response.body)


def _raw_error(response: RawResponse, method: str, url: str) -> ServerError:
    raw = response.body.to_pybytes()
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace").strip()
    return server_error(response.status, body, reason=response.reason, method=method, url=url)


def _path(dataset_id: str, suffix: str = "") -> str:
    return f"/datasets/{quote(dataset_id, safe='/')}{suffix}"


def _params(
    spec: str | None,
    start: int,
    stop: int | None,
    columns: Sequence[str] | None = None,
    delta_timestamps: DeltaTimestamps | None = None,
    tolerance_s: float | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {"start": start}
    if stop is not None:
        params["stop"] = stop
    if spec is not None:
        params["episodes"] = spec
    if columns is not None:
        params["columns"] = ",".join(columns)
    if delta_timestamps is not None:
        params["delta_timestamps"] = json.dumps(_windows(delta_timestamps), separators=(",", ":"))
    if tolerance_s is not None:
        params["tolerance_s"] = tolerance_s
    return params


def _body(
    indices: np.ndarray,
    spec: str | None,
    columns: Sequence[str] | None,
    delta_timestamps: DeltaTimestamps | None,
    tolerance_s: float | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"indices": indices.tolist()}
    if spec is not None:
        body["episodes"] = spec
    if columns is not None:
        body["columns"] = list(columns)
    if delta_timestamps is not None:
        body["delta_timestamps"] = _windows(delta_timestamps)
    if tolerance_s is not None:
        body["tolerance_s"] = tolerance_s
    return body


def _windows(delta_timestamps: DeltaTimestamps) -> dict[str, list[float]]:
    return {column: [float(d) for d in deltas] for column, deltas in delta_timestamps.items()}


def _error(response: httpx.Response) -> ServerError:
    raw = response.read()
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace").strip()
    request = response.request
    return server_error(
        response.status_code, body, reason=response.reason_phrase, method=request.method, url=str(request.url)
    )


def _smaller_limit(error: TooLarge, asked: int) -> int:
    """A page size under the limit the server stated (problem field `limit`, else its detail), else half of
    `asked`; re-raises when no smaller page can help (the 413 was about something else)."""
    stated = error.body.get("limit")
    if not isinstance(stated, int):
        match = _LIMIT_IN_DETAIL.search(error.detail)
        stated = int(match.group(1)) if match else None
    limit = asked // 2 if stated is None else stated
    if not 0 < limit < asked:
        raise error
    return limit
