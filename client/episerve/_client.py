"""`Client`: the HTTP API as Python calls returning `pyarrow.Table`s and plain dicts.

Every request goes through one `Transport` per process (recreated after `fork`, so DataLoader workers never share
a socket with their parent) and one retry loop, bounded in attempts and time. Reads larger than the server's
limits are split into pages the server accepts.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import numpy as np
import pyarrow as pa

from episerve._cache_files import SegmentUnavailable
from episerve._encoded_frames import FRAMES, decoded_frames
from episerve._episodes import Episodes
from episerve._errors import (
    ConnectionFailed,
    EpiserveError,
    InvalidRequest,
    NotFound,
    ServerError,
    TooLarge,
    server_error,
)
from episerve._local_frames import LocalFrames
from episerve._local_rows import LocalRows
from episerve._retry import PROGRESS_HEADER, RETRY_STATUSES, Retries, RetryBudget, parse_retry_after
from episerve._row_layouts import Located, RowLayout, RowLayouts
from episerve._selection import ArrowBody, DeltaTimestamps, Pages, Selection
from episerve._transport import (
    ConnectError,
    Request,
    Response,
    Timeouts,
    Transport,
    TransportError,
    UnsupportedURL,
)
from episerve._transport_choice import transport_for

__version__ = "0.1.0"

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_TIMEOUT = 60.0
_PAGE_ROWS = 1_000_000  # the server's default `max_rows_per_response`
_TAKE_INDICES = 100_000  # the server's default `max_take_indices`
_MAX_TAKES = 1024  # takes per `POST /takes` request
_MAX_SPEC_IN_URL = 4000  # longer episode specs travel in a POST /rows body instead of the query string
_USER_AGENT = f"episerve-client/{__version__}"
_NO_BODY = pa.py_buffer(b"")  # the body of rows gathered here, without a response
_ROWS_UNKNOWN = "rows: Extra inputs are not permitted"  # a server from before rows by reference, asked for them

log = logging.getLogger("episerve")


class Client:
    """A connection to an episerve server.

    `token` is sent as `Authorization: Bearer <token>` (default: `$EPISERVE_TOKEN`). `timeout` is in seconds (or
    any object with `connect` and `read` seconds, such as an `httpx.Timeout`). `retries` bounds how long a request
    keeps retrying connection errors and 429/502/503/504 (a `Retries`, or an int number of attempts); each retry
    is logged as a warning on the `episerve` logger. `compression` (`"lz4"` or `"zstd"`) asks for compressed
    Arrow bodies, worth it across slow links (pyarrow decompresses them). `cache_dir` is the server's cache
    directory as this machine sees it (the server runs here, or its cache is a volume shared with this machine):
    takes then read their rows and the camera frames the server has decoded straight from its segment files, not
    over the socket (rows not cached yet, windowed columns, cameras not decoded yet and `rows()` still come over
    HTTP). `frames="encoded"` asks for
    camera frames (those without windows) as JPEG bytes and decodes them in this process (the `jpeg` extra): a
    480x640 frame crosses the network in a tenth of its raw bytes or less, and the trainer's cores decode, not the
    server's; the frames are lossy unless the dataset's frame tier is JPEG already (then they equal its pixels).
    `frames="jpeg"` asks for them the same way but leaves them JPEG bytes (a list of `bytes` per camera in a
    batch) for the trainer to decode, with `episerve.decode_jpeg(frames, device="cuda")` on the GPU. Encoded
    frames come over HTTP even with `cache_dir` (the default `frames="pixels"` reads a JPEG tier's segments by
    reference and decodes them here).
    Server errors are raised as
    `ServerError` subclasses; a server that stays unreachable raises `ConnectionFailed`. Safe to use from several
    threads, to pickle, and across `fork`. Use it as a context manager or call `close()`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float | Any = DEFAULT_TIMEOUT,
        retries: Retries | int | None = None,
        compression: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        frames: str = "pixels",
    ) -> None:
        if compression not in (None, "lz4", "zstd"):
            raise ValueError(f"compression must be None, 'lz4' or 'zstd', got {compression!r}")
        if frames not in FRAMES:
            raise ValueError(f"frames must be one of {', '.join(map(repr, FRAMES))}, got {frames!r}")
        self.frames = frames
        self.url = url.rstrip("/")
        self.compression = compression
        self.token = token if token is not None else os.environ.get("EPISERVE_TOKEN") or None
        if isinstance(timeout, int | float):
            self.timeouts = Timeouts(connect=float(timeout), read=float(timeout))
        else:
            self.timeouts = Timeouts(connect=timeout.connect, read=timeout.read)
        if isinstance(retries, int):
            retries = Retries(attempts=retries)
        self.retries = retries or Retries()
        self.local_frames = LocalFrames(cache_dir) if cache_dir is not None else None
        self.local_rows = LocalRows(cache_dir) if cache_dir is not None else None
        self.row_layouts = RowLayouts(self._row_layout) if cache_dir is not None else None
        self._page_rows = _PAGE_ROWS
        self._take_indices = _TAKE_INDICES
        self._takes_supported = True
        self._transport: Transport | None = None
        self._pid = 0
        self._answered = False  # the server has answered this client (or the one it was copied from) once

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # --- catalog and cache -------------------------------------------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        """The catalog: one dict per dataset with `id`, `format`, `rows`, `episodes` and `fps`."""
        return self._json("GET", "/datasets")["datasets"]

    def info(self, dataset_id: str) -> dict[str, Any]:
        """One dataset's description: columns, LeRobot features, fps, tasks, row and episode counts, cache state."""
        return self._json("GET", _path(dataset_id))

    def episodes(self, dataset_id: str) -> list[dict[str, Any]]:
        """Per-episode `episode_index`, `length`, row range `[dataset_from_index, dataset_to_index)` in the view of
        every episode and, where the format records them, `tasks`."""
        return self._json("GET", _path(dataset_id, "/episodes"))["episodes"]

    def stats(self, dataset_id: str) -> dict[str, Any] | None:
        """The dataset's feature statistics as LeRobot loads them, `{feature: {stat: values}}` (None without any)."""
        return self._json("GET", _path(dataset_id, "/stats"))["stats"]

    def mixtures(self) -> list[dict[str, Any]]:
        """The server's named mixtures: one dict per mixture with `id`, `components` (each with `dataset`, `weight`,
        `share`, `rows`, `dataset_version` and its `episodes` and `features` if any) and `version`."""
        return self._json("GET", "/mixtures")["mixtures"]

    def mixture(self, mixture_id: str) -> dict[str, Any]:
        """One named mixture as `mixtures()` describes it; `episerve.Mixture.named(client, id)` makes it a
        `Mixture`."""
        return self._json("GET", "/mixtures/" + quote(mixture_id, safe="/"))

    def cache_status(self, dataset_id: str) -> dict[str, Any]:
        """The dataset's cache on the server: segments built and total, bytes, builds in progress, warm-up job."""
        return self._json("GET", _path(dataset_id, "/cache"))

    def warm(self, dataset_id: str, episodes: Episodes = None) -> dict[str, Any]:
        """Start building the cache of `episodes` (all when None) on the server, in the background.

        Returns the warm-up job as the server reports it; follow it with `cache_status()`.
        """
        spec = Selection.of(dataset_id, episodes).episodes
        return self._json("POST", _path(dataset_id, "/cache"), body={} if spec is None else {"episodes": spec})

    # --- rows ------------------------------------------------------------------------------------------------

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
        return self.count(Selection.of(dataset_id, episodes, columns, delta_timestamps, tolerance_s))

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
        selection = Selection.of(dataset_id, episodes, columns, delta_timestamps, tolerance_s)
        return self.read_slice(selection, start, stop).table

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
        selection = Selection.of(dataset_id, episodes, columns, delta_timestamps, tolerance_s)
        return self.read_take(selection, indices).table

    def count(self, selection: Selection) -> int:
        """The row count of `selection`'s view (one small request, which also validates the selection)."""
        response = self._slice(selection, 0, 0)
        return int(response.headers["x-total-rows"])

    def read_slice(self, selection: Selection, start: int = 0, stop: int | None = None) -> Pages:
        """View rows `[start, stop)` of `selection` as the response pages, with the view length.

        The lower-level form of `rows()`: the pages keep the response buffers, so columns can be used without
        copying them.
        """
        if start < 0 or (stop is not None and stop < 0):
            raise ValueError("start and stop are view positions and must be non-negative")
        bodies: list[ArrowBody] = []
        position = start
        while True:
            page_stop = position + self._page_rows if stop is None else min(stop, position + self._page_rows)
            try:
                response = self._slice(selection, position, page_stop)
            except TooLarge as exc:
                self._page_rows = _smaller_limit(exc, page_stop - position)
                continue
            body = _arrow_body(response, selection.dataset_id, self.frames)
            bodies.append(body)
            total, served_stop = int(response.headers["x-total-rows"]), int(response.headers["x-stop"])
            end = total if stop is None else min(stop, total)
            if served_stop >= end or body.table.num_rows == 0:
                return Pages(bodies, total)
            position = served_stop

    def read_take(self, selection: Selection, indices: Sequence[int] | np.ndarray) -> Pages:
        """The rows at view positions `indices` of `selection`, in that order, as the response pages.

        The lower-level form of `take()`: long index lists are split into takes the server accepts.
        """
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        bodies: list[ArrowBody] = []
        total = 0
        position = 0
        while True:
            page = wanted[position : position + self._take_indices]
            try:
                body, total = self._take_page(selection, page)
            except TooLarge as exc:
                self._take_indices = _smaller_limit(exc, len(page))
                continue
            bodies.append(body)
            position += len(page)
            if position >= len(wanted):
                return Pages(bodies, total)

    def read_takes(self, takes: Sequence[tuple[Selection, Sequence[int] | np.ndarray]]) -> list[Pages]:
        """The rows of several takes, each a selection (of any dataset) and its view positions: one `Pages` per
        take, in order, its rows in the order asked.

        One `POST /takes` request when the takes fit the server's limits together (a mixture's batch), else one
        paged take each, as from a server without `/takes`.
        """
        wanted = [(selection, np.asarray(indices, dtype=np.int64).reshape(-1)) for selection, indices in takes]
        count = sum(len(indices) for _, indices in wanted)
        while self._takes_supported and 0 < len(wanted) <= _MAX_TAKES and count <= self._take_indices:
            try:
                return self._takes_request(wanted)
            except TooLarge as exc:
                try:
                    self._take_indices = _smaller_limit(exc, count)
                except TooLarge:
                    break  # over a limit other than indices (the body's size): one take at a time may fit
            except NotFound as exc:
                if not str(exc.body.get("detail", "")).startswith("no route "):
                    raise
                self._takes_supported = False  # an older server
        return [self.read_take(selection, indices) for selection, indices in wanted]

    def _takes_request(self, takes: list[tuple[Selection, np.ndarray]]) -> list[Pages]:
        """One `POST /takes` request (none when every take is read from `cache_dir` by its view's layout); rows and
        camera frames read from `cache_dir` where they can be."""
        located = [self._located_here(selection, page) for selection, page in takes]
        if all(found is not None for found in located):
            here = [self._gathered_here(selection, found) for (selection, _), found in zip(takes, located, strict=True)]
            if all(taken is not None for taken in here):
                return [Pages([body], total) for body, total in here]  # type: ignore[misc]
        payload = [{"dataset": selection.dataset_id} | _take_body(selection, page) for selection, page in takes]
        payload = [take | self._answer_fields() for take in payload]
        references = self._references()
        if references:
            response = self._send_for_references("/takes", {"takes": [take | references for take in payload]})
            if response is not None:
                tables, buffer, totals = self._takes_answer(response, len(payload))
                resolved = self._resolved(tables, references)
                if resolved is not None:
                    return [
                        Pages([ArrowBody(t, buffer, arrays)], total)
                        for (t, arrays), total in zip(resolved, totals, strict=True)
                    ]
        response = self._send("POST", "/takes", body={"takes": payload}, arrow=True)
        tables, buffer, totals = self._takes_answer(response, len(payload))
        return [Pages([ArrowBody(t, buffer)], total) for t, total in zip(tables, totals, strict=True)]

    def _takes_answer(self, response: Response, takes: int) -> tuple[list[pa.Table], pa.Buffer, list[int]]:
        """The tables of a `POST /takes` answer (its streams, one after another), their buffer and view lengths."""
        body = _arrow_body_buffer(response, "the takes")
        reader = pa.BufferReader(body)
        tables = [decoded_frames(pa.ipc.open_stream(reader).read_all(), self.frames) for _ in range(takes)]
        totals = [int(total) for total in response.headers["x-total-rows"].split(",")]
        if reader.tell() != body.size or len(totals) != takes:
            raise EpiserveError(f"the server answered {takes} takes with another number of streams")
        return tables, body, totals

    def _take_page(self, selection: Selection, page: np.ndarray) -> tuple[ArrowBody, int]:
        """One `/rows/take` request and the view length (no request when the rows are read from `cache_dir` by the
        view's layout); rows and camera frames read from `cache_dir` where they can be."""
        here = self._taken_here(selection, page)
        if here is not None:
            return here
        payload = _take_body(selection, page) | self._answer_fields()
        path = _path(selection.dataset_id, "/rows/take")
        references = self._references()
        if references:
            response = self._send_for_references(path, payload | references)
            if response is not None:
                body = _arrow_body(response, selection.dataset_id, self.frames)
                resolved = self._resolved([body.table], references)
                if resolved is not None:
                    table, arrays = resolved[0]
                    return ArrowBody(table, body.buffer, arrays), int(response.headers["x-total-rows"])
        response = self._send("POST", path, body=payload, arrow=True)
        return _arrow_body(response, selection.dataset_id, self.frames), int(response.headers["x-total-rows"])

    def _taken_here(self, selection: Selection, page: np.ndarray) -> tuple[ArrowBody, int] | None:
        """The rows at view positions `page` gathered from `cache_dir` by the view's layout (`episerve._row_layouts`),
        with the view's length, without a request; None when they must be asked for (no layout, a file whose
        segment is not mapped by the server, a file that cannot be read here)."""
        located = self._located_here(selection, page)
        return self._gathered_here(selection, located) if located is not None else None

    def _located_here(self, selection: Selection, page: np.ndarray) -> tuple[RowLayout, Located] | None:
        """The layout of `selection`'s view and where the rows at `page` lie by it; None when a request must take
        them."""
        local, layouts = self.local_rows, self.row_layouts
        if local is None or layouts is None or not local.in_use:
            return None
        layout = layouts.current(selection)
        located = layout.locate(page) if layout is not None else None
        return (layout, located) if layout is not None and located is not None else None

    def _gathered_here(self, selection: Selection, found: tuple[RowLayout, Located]) -> tuple[ArrowBody, int] | None:
        """The rows `found` locates, gathered from `cache_dir`, with the view's length; None (the layout set aside
        for a while) when a file it names cannot be read here."""
        layout, located = found
        assert self.local_rows is not None and self.row_layouts is not None
        try:
            table, arrays = self.local_rows.gather(layout.columns, *located)
        except SegmentUnavailable:  # a take by reference says why, and counts the miss
            self.row_layouts.set_aside(selection)
            return None
        return ArrowBody(table, _NO_BODY, arrays), layout.rows

    def _row_layout(self, selection: Selection) -> dict[str, Any]:
        """The `/rows/layout` answer for `selection`'s view and columns."""
        body = {name: value for name, value in _selection_fields(selection).items() if name in ("episodes", "columns")}
        return self._json("POST", _path(selection.dataset_id, "/rows/layout"), body=body)

    def _references(self) -> dict[str, str]:
        """The fields with which a take asks for references into `cache_dir`: rows (`episerve._local_rows`) and
        camera frames (`episerve._local_frames`), each unless paused after takes that could not read them."""
        fields = {}
        if self.local_rows is not None and self.local_rows.in_use:
            fields["rows"] = "references"
        # Encoded frames come as the server encodes them: a raw tier's segments would give the exact frames instead.
        if self.local_frames is not None and self.local_frames.in_use and self.frames == "pixels":
            fields["frames"] = "references"
        return fields

    def _send_for_references(self, path: str, body: dict[str, Any]) -> Response | None:
        """The answer to a take asking for references; None from a server that does not know rows by reference
        (asked no more)."""
        try:
            return self._send("POST", path, body=body, arrow=True)
        except InvalidRequest as exc:
            if self.local_rows is None or _ROWS_UNKNOWN not in str(exc.body.get("detail", "")):
                raise
            self.local_rows = None
            return None

    def _resolved(
        self, tables: list[pa.Table], references: dict[str, str]
    ) -> list[tuple[pa.Table, dict[str, np.ndarray]]] | None:
        """The answers to takes that asked for `references`, with what they reference read from `cache_dir` (and
        the columns of rows gathered here as arrays, see `ArrowBody.arrays`); None (the miss noted) when some
        referenced file cannot be read here: the takes are asked for again, by value."""
        resolved: list[tuple[pa.Table, dict[str, np.ndarray]]] = []
        for table in tables:
            local: LocalRows | LocalFrames | None = self.local_rows
            if not LocalRows.referenced(table):  # rows by value, camera frames perhaps by reference
                local = self.local_frames if "frames" in references else None
            if local is None:
                resolved.append((table, {}))
                continue
            try:
                if isinstance(local, LocalRows):
                    resolved.append(local.resolve_columns(table))
                else:
                    resolved.append((local.resolve(table), {}))
            except SegmentUnavailable as exc:
                local.missed(exc)
                return None
        return resolved

    def _slice(self, selection: Selection, start: int, stop: int | None) -> Response:
        """One `/rows` request: GET with a query, or POST with a body when the episode list is too long for a URL."""
        fields = _slice_fields(selection, start, stop) | self._answer_fields()
        path = _path(selection.dataset_id, "/rows")
        if selection.episodes is not None and len(selection.episodes) > _MAX_SPEC_IN_URL:
            return self._send("POST", path, body=fields, arrow=True)
        query = {name: _query_value(name, value) for name, value in fields.items()}
        return self._send("GET", path, query=query, arrow=True)

    def _answer_fields(self) -> dict[str, Any]:
        """The fields of every read request that say how the answer comes: compression, frames encoded."""
        fields: dict[str, Any] = {}
        if self.compression is not None:
            fields["compression"] = self.compression
        if self.frames != "pixels":
            fields["frames"] = "encoded"  # "jpeg" too: the same bytes, left undecoded here
        return fields

    # --- sending ---------------------------------------------------------------------------------------------

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        return json.loads(self._send(method, path, body=body).body.to_pybytes())

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        arrow: bool = False,
    ) -> Response:
        """Send with retries and return the successful response; error statuses raise `ServerError`s."""
        request = self._request(method, path, query, body, arrow)
        url = self.url + path + (request.target[request.target.index("?") :] if query else "")
        budget = RetryBudget(self.retries)
        while True:
            try:
                response = self._transport_of_this_process().handle_request(request)
            except UnsupportedURL as exc:
                raise ConnectionFailed(str(exc), attempts=1, elapsed=0.0) from exc
            except TransportError as exc:
                first_contact = not self._answered and isinstance(exc, ConnectError)
                deadline = self.retries.first_contact_deadline if first_contact else None
                reason = f"{type(exc).__name__}: {exc}"
                wait = budget.next_wait(deadline=deadline)
                if wait is None:
                    raise ConnectionFailed(
                        _unreachable(self.url, method, path, budget, reason, first_contact),
                        attempts=budget.attempt,
                        elapsed=budget.elapsed,
                    ) from exc
                _log_retry(method, url, reason, wait, budget, deadline)
            else:
                self._answered = True
                if response.status < 400:
                    return response
                error = _error(response, method, url)
                progress = response.headers.get(PROGRESS_HEADER) if error.status == 503 else None
                wait = budget.next_wait(parse_retry_after(response.headers.get("retry-after")), progress=progress)
                if error.status not in RETRY_STATUSES or error.body.get("transient") is False or wait is None:
                    raise error
                if progress is not None:
                    _log_download_wait(method, url, error.detail, wait, budget)
                else:
                    _log_retry(method, url, f"{error.status} {error.title}: {error.detail}", wait, budget, None)
            time.sleep(wait)

    def _request(self, method: str, path: str, query: dict[str, Any] | None, body: Any, arrow: bool) -> Request:
        target = urlsplit(self.url).path + path
        if query:
            target += "?" + urlencode(query)
        headers = {"User-Agent": _USER_AGENT, "Accept": ARROW_STREAM if arrow else "application/json"}
        headers["Accept-Encoding"] = "identity"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        content = b""
        if body is not None:
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        return Request(method, target, headers, content)

    def _transport_of_this_process(self) -> Transport:
        if self._transport is None or self._pid != os.getpid():
            # A forked child must not touch its parent's sockets: leave the inherited connections alone (closing
            # them could disturb the parent's) and open fresh ones.
            self._transport = transport_for(self.url, self.timeouts)
            self._pid = os.getpid()
        return self._transport

    def close(self) -> None:
        """Close this process's connections (the client reconnects if used again)."""
        if self._transport is not None and self._pid == os.getpid():
            self._transport.close()
        self._transport = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_transport"], state["_pid"] = None, 0
        return state


def connect(
    url: str | Client, token: str | None, retries: Retries | int | None, cache_dir: str | os.PathLike[str] | None
) -> Client:
    """A dataset's client: `url` itself if it is a `Client` (which has its own settings), else a new one."""
    if not isinstance(url, Client):
        return Client(url, token, retries=retries, cache_dir=cache_dir)
    if cache_dir is not None:
        raise ValueError("cache_dir is a setting of the Client: pass Client(url, cache_dir=...) instead")
    return url


def _path(dataset_id: str, suffix: str = "") -> str:
    return f"/datasets/{quote(dataset_id, safe='/')}{suffix}"


def _slice_fields(selection: Selection, start: int, stop: int | None) -> dict[str, Any]:
    """A `/rows` request's fields, as a POST body holds them (the query string encodes them as text)."""
    fields: dict[str, Any] = {"start": start}
    if stop is not None:
        fields["stop"] = stop
    return fields | _selection_fields(selection)


def _take_body(selection: Selection, indices: np.ndarray) -> dict[str, Any]:
    return {"indices": indices.tolist()} | _selection_fields(selection)


def _selection_fields(selection: Selection) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if selection.episodes is not None:
        fields["episodes"] = selection.episodes
    if selection.columns is not None:
        fields["columns"] = list(selection.columns)
    if selection.delta_timestamps is not None:
        fields["delta_timestamps"] = selection.delta_timestamps
    if selection.tolerance_s is not None:
        fields["tolerance_s"] = selection.tolerance_s
    if isinstance(selection.frame_size, dict):
        fields["frame_size"] = {camera: list(size) for camera, size in selection.frame_size.items()}
    elif selection.frame_size is not None:
        fields["frame_size"] = list(selection.frame_size)
    return fields


def _query_value(name: str, value: Any) -> Any:
    if name == "frame_size" and isinstance(value, list):
        return "x".join(map(str, value))
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return value


def _arrow_body(response: Response, dataset_id: str, frames: str) -> ArrowBody:
    body = _arrow_body_buffer(response, f"dataset {dataset_id!r}")
    return ArrowBody(decoded_frames(pa.ipc.open_stream(body).read_all(), frames), body)


def _arrow_body_buffer(response: Response, what: str) -> pa.Buffer:
    media = response.headers.get("content-type", "").split(";")[0].strip()
    if media != ARROW_STREAM:
        raise EpiserveError(f"expected an Arrow stream for {what}, got {media or 'no type'!r}")
    return response.body


def _error(response: Response, method: str, url: str) -> ServerError:
    raw = response.body.to_pybytes()
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace").strip()
    return server_error(response.status, body, reason=response.reason, method=method, url=url)


def _log_retry(method: str, url: str, reason: str, wait: float, budget: RetryBudget, deadline: float | None) -> None:
    left = budget.deadline(deadline) - budget.elapsed
    log.warning(
        "%s %s failed (%s); retry %d of %d in %.2f s, %.1f s left of the retry deadline",
        method,
        url,
        reason,
        budget.attempt,
        budget.policy.attempts - 1,
        wait,
        max(0.0, left),
    )


def _log_download_wait(method: str, url: str, detail: str, wait: float, budget: RetryBudget) -> None:
    left = budget.deadline() - budget.elapsed
    log.info(
        "%s %s waits for the server's download (%s); next try in %.2f s (given up if it does not move for %.1f s)",
        method,
        url,
        detail,
        wait,
        max(0.0, left),
    )


def _unreachable(url: str, method: str, path: str, budget: RetryBudget, reason: str, first_contact: bool) -> str:
    attempts = f"after {budget.attempt} attempts in {budget.elapsed:.1f} s"
    if first_contact:
        return f"could not reach the episerve server at {url} ({method} {path}) {attempts}: {reason}; is it running?"
    return f"could not reach {url} ({method} {path}) {attempts}: {reason}"


def _smaller_limit(error: TooLarge, asked: int) -> int:
    """A page size under the limit the server stated (the problem's `limit` field), else half of `asked` (a 413
    from a proxy in front of the server states none); re-raises when no smaller page can help (the 413 was about
    something else)."""
    stated = error.body.get("limit")
    limit = stated if isinstance(stated, int) and not isinstance(stated, bool) else asked // 2
    if not 0 < limit < asked:
        raise error
    return limit
