"""Row endpoints: a contiguous slice of a view (`GET`/`POST /rows`) and rows by view index (`POST /rows/take`).

All answer with an Arrow IPC stream of exact Content-Length. The work runs in one thread-pool call per request
(quick takes and plain slices are answered ahead of these routes: see `app.api.fast_lane`); small bodies are
encoded at once, large ones stream from the memory-mapped segments one batch at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pyarrow as pa
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, TypeAdapter, ValidationError

from app.api.arrow_response import ArrowPartsResponse, ArrowStreamResponse
from app.api.deps import get_dataset, get_settings, json_body_schema, read_json_body, run_read
from app.api.problems import ProblemException, problem_responses
from app.arrow_stream import (
    ARROW_STREAM_MEDIA_TYPE,
    OWN_PART_BYTES,
    encode_stream,
    encode_whole,
    stream_size,
    table_batches,
)
from app.dataset import Dataset, RowSlice, SliceBounds
from app.episode_spec import EpisodeRanges, format_ranges, parse_episode_spec, ranges_from_ids
from app.settings import Settings
from app.windows import DEFAULT_TOLERANCE_S, WindowRequest

router = APIRouter(tags=["rows"])

MAX_ROW = 2**62
_SINGLE_PIECE_BYTES = 4 * 1024 * 1024


def _header(description: str, kind: str = "integer", required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": {"type": kind}}


_COUNT_HEADERS = {
    "X-Row-Count": _header("Rows in this response."),
    "X-Total-Rows": _header("Rows in the whole view of the picked episodes (N)."),
    "X-Arrow-Compression": _header("The body's codec, when compression was asked.", "string", required=False),
}
_SLICE_HEADERS = {
    "X-Start": _header("First view row served."),
    "X-Stop": _header("End (exclusive) of the view rows served."),
    "X-Total-Rows": _COUNT_HEADERS["X-Total-Rows"],
    "ETag": _header("Names the source files' state and the query; send it back in If-None-Match.", "string"),
}
_ARROW_BODY = {ARROW_STREAM_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}
_SLICE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Arrow IPC stream of the rows",
        "content": _ARROW_BODY,
        "headers": {**_COUNT_HEADERS, **_SLICE_HEADERS},
    },
    304: {"description": "Not modified (If-None-Match named the current ETag)", "headers": _SLICE_HEADERS},
    **problem_responses(404, 413),
}
_BODY_PROBLEMS = problem_responses(400, 413, 415)
_TAKE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Arrow IPC stream of the rows, in the order asked",
        "content": _ARROW_BODY,
        "headers": _COUNT_HEADERS,
    },
    **problem_responses(404),
    **_BODY_PROBLEMS,
}


DeltaTimestamps = dict[str, list[StrictInt | StrictFloat]]
Compression = Literal["none", "lz4", "zstd"] | None
_COMPRESSION_HELP = "Arrow IPC body compression (lz4 or zstd) for slow links; every Arrow reader decompresses it."
_DELTA_TIMESTAMPS = TypeAdapter(DeltaTimestamps)


class RowSelection(BaseModel):
    """What every row request selects: episodes, columns and optional temporal windows."""

    model_config = ConfigDict(extra="forbid")

    episodes: str | list[Annotated[StrictInt, Field(ge=0, le=MAX_ROW)]] | None = Field(
        None, description="Episode spec ('0,3-5') or list of episode ids; absent means every episode."
    )
    columns: list[str] | None = Field(None, description="Columns to return, in this order; absent means all.")
    delta_timestamps: DeltaTimestamps | None = Field(
        None,
        description="LeRobot temporal windows: {column: [offset seconds, ...]}. Each windowed column becomes a "
        "fixed-size list of len(offsets) values, plus a boolean `<column>_is_pad` list.",
    )
    tolerance_s: float = Field(DEFAULT_TOLERANCE_S, ge=0, description="How far offsets may be off the 1/fps grid.")
    compression: Compression = Field(None, description=_COMPRESSION_HELP)


class TakeRequest(RowSelection):
    """Rows by position in the view of `episodes` (all episodes when absent)."""

    indices: list[Annotated[StrictInt, Field(ge=0, le=MAX_ROW)]] = Field(
        description="View row positions; order is kept and duplicates are allowed."
    )


class SliceRequest(RowSelection):
    """A contiguous slice of the view of `episodes`, as GET /rows takes it in its query."""

    start: StrictInt = Field(0, ge=0, le=MAX_ROW, description="First view row (inclusive).")
    stop: StrictInt | None = Field(None, ge=0, le=MAX_ROW, description="End view row (exclusive); clamped.")


def episode_ranges(spec: str | list[int] | None, settings: Settings) -> EpisodeRanges | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        return parse_episode_spec(spec, settings.max_episode_spec_chars)
    if len(spec) > settings.max_take_indices:
        raise ProblemException(
            413, f"{len(spec)} episode ids; the limit is {settings.max_take_indices}", limit=settings.max_take_indices
        )
    return ranges_from_ids(spec)


def _windows(delta_timestamps: dict | None, tolerance_s: float) -> WindowRequest | None:
    return None if delta_timestamps is None else WindowRequest(delta_timestamps, tolerance_s)


def _parse_delta_timestamps(text: str | None) -> dict | None:
    """The JSON-encoded `delta_timestamps` query value, validated."""
    if text is None:
        return None
    try:
        return _DELTA_TIMESTAMPS.validate_json(text)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        raise ProblemException(
            422, f"delta_timestamps must be a JSON object of column -> list of seconds: {detail}"
        ) from exc


def columns_of(spec: str | None) -> list[str] | None:
    """The column names of a comma-separated `columns` query value."""
    return None if spec is None else [c.strip() for c in spec.split(",")]


def _arrow_response(
    schema: pa.Schema, batches: list[pa.RecordBatch], headers: dict[str, str], compression: Compression
) -> Response:
    """Small bodies encoded at once (tiny ones into one buffer); large ones batch by batch as they are sent
    (compressed ones without a known length)."""
    headers = {**headers, "X-Row-Count": str(sum(b.num_rows for b in batches))}
    codec = None if compression in (None, "none") else compression
    if codec is not None:
        headers["X-Arrow-Compression"] = codec
    if sum(b.get_total_buffer_size() for b in batches) < OWN_PART_BYTES:  # nbytes costs ~16 us a batch
        return ArrowPartsResponse([memoryview(encode_whole(schema, batches, codec))], headers)
    size = stream_size(schema, batches)
    if size <= _SINGLE_PIECE_BYTES:
        return ArrowPartsResponse([part for parts in encode_stream(schema, batches, codec) for part in parts], headers)
    if codec is not None:
        chunks = (b"".join(parts) for parts in encode_stream(schema, batches, codec))
        return StreamingResponse(chunks, media_type=ARROW_STREAM_MEDIA_TYPE, headers=headers)
    return ArrowStreamResponse(schema, batches, headers, size)


@router.get(
    "/datasets/{dataset_id:path}/rows",
    summary="A contiguous slice of the view, as an Arrow IPC stream",
    response_class=Response,
    responses=_SLICE_RESPONSES,
)
async def read_rows(
    request: Request,
    dataset: Dataset = Depends(get_dataset),
    settings: Settings = Depends(get_settings),
    episodes: str | None = Query(None, description="Episode spec, e.g. '0,3-5,9'; absent means every episode."),
    start: int = Query(0, ge=0, le=MAX_ROW, description="First view row (inclusive)."),
    stop: int | None = Query(None, ge=0, le=MAX_ROW, description="End view row (exclusive); clamped to the view."),
    columns: str | None = Query(None, description="Comma-separated columns, in the order wanted."),
    delta_timestamps: str | None = Query(
        None, description='JSON object of LeRobot windows, e.g. {"action": [0, 0.0333333, 0.0666667]}.'
    ),
    tolerance_s: float = Query(DEFAULT_TOLERANCE_S, ge=0, le=1e6, description="Frame-grid tolerance of offsets."),
    compression: Compression = Query(None, description=_COMPRESSION_HELP),
) -> Response:
    selection = SliceRequest.model_construct(
        episodes=episodes,
        start=start,
        stop=stop,
        columns=columns_of(columns),
        delta_timestamps=_parse_delta_timestamps(delta_timestamps),
        tolerance_s=tolerance_s,
        compression=compression,
    )
    conditional = request.headers.get("if-none-match")
    return await run_read(request, slice_response, dataset, settings, selection, conditional)


@router.post(
    "/datasets/{dataset_id:path}/rows",
    summary="The same slice as GET /rows, with the selection in a JSON body (for long episode lists)",
    response_class=Response,
    responses={**_SLICE_RESPONSES, **_BODY_PROBLEMS},
    openapi_extra=json_body_schema(SliceRequest),
)
async def read_rows_with_body(
    request: Request,
    dataset: Dataset = Depends(get_dataset),
    settings: Settings = Depends(get_settings),
) -> Response:
    body = await read_json_body(request, SliceRequest, settings.max_body_bytes)
    conditional = request.headers.get("if-none-match")
    return await run_read(request, slice_response, dataset, settings, body, conditional)


def slice_response(
    dataset: Dataset, settings: Settings, selection: SliceRequest, conditional: str | None, inline: bool = False
) -> Response:
    """The Arrow response of a slice, or 304 when `conditional` (If-None-Match) names its ETag (`inline`: see
    `Dataset.read_slice`)."""
    start, stop, columns, compression = selection.start, selection.stop, selection.columns, selection.compression
    ranges = episode_ranges(selection.episodes, settings)
    windows = _windows(selection.delta_timestamps, selection.tolerance_s)
    if stop is not None and start > stop:
        raise ProblemException(422, f"start ({start}) is greater than stop ({stop})")

    def headers_of(bounds: SliceBounds | RowSlice) -> dict[str, str]:
        query = [format_ranges(ranges) if ranges else "*", bounds.start, bounds.stop, columns, windows, compression]
        return {
            "ETag": f'"{bounds.digest}-{hashlib.sha256("|".join(map(str, query)).encode()).hexdigest()[:16]}"',
            "X-Total-Rows": str(bounds.total_rows),
            "X-Start": str(bounds.start),
            "X-Stop": str(bounds.stop),
            "Cache-Control": "no-cache",
        }

    if conditional:  # answered from the view alone: a 304 never reads (or builds) a segment
        headers = headers_of(dataset.slice_bounds(ranges, start, stop))
        if headers["ETag"] in [tag.strip() for tag in conditional.split(",")]:
            return Response(status_code=304, headers=headers)
    selected = dataset.read_slice(ranges, start, stop, columns, settings.max_rows_per_response, windows, inline)
    return _arrow_response(selected.schema, selected.batches, headers_of(selected), compression)


@router.post(
    "/datasets/{dataset_id:path}/rows/take",
    summary="Rows by view index (order kept, duplicates allowed), as an Arrow IPC stream",
    response_class=Response,
    responses=_TAKE_RESPONSES,
    openapi_extra=json_body_schema(TakeRequest),
)
async def take_rows(
    request: Request,
    dataset: Dataset = Depends(get_dataset),
    settings: Settings = Depends(get_settings),
) -> Response:
    body = await read_json_body(request, TakeRequest, settings.max_body_bytes)
    ranges = take_ranges(body, settings)
    return await run_read(request, take_response, dataset, ranges, body)


def take_route() -> APIRoute:
    """The route of `POST /rows/take` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(take_rows)


def slice_route() -> APIRoute:
    """The route of `GET /rows` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(read_rows)


def _route_of(endpoint: Callable[..., Any]) -> APIRoute:
    return next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is endpoint)


def take_ranges(body: TakeRequest, settings: Settings) -> EpisodeRanges | None:
    """The episodes a take reads from, once its size is checked against the limits."""
    if len(body.indices) > settings.max_take_indices:
        raise ProblemException(
            413,
            f"{len(body.indices)} indices asked; the limit is {settings.max_take_indices} per request",
            limit=settings.max_take_indices,
        )
    return episode_ranges(body.episodes, settings)


def take_response(
    dataset: Dataset, ranges: EpisodeRanges | None, body: TakeRequest, inline_bytes: int | None = None
) -> Response:
    """The Arrow response of a take (`inline_bytes`: see `Dataset.take`)."""
    windows = _windows(body.delta_timestamps, body.tolerance_s)
    taken = dataset.take(ranges, body.indices, body.columns, windows, inline_bytes)
    headers = {"X-Total-Rows": str(taken.total_rows)}
    return _arrow_response(taken.table.schema, table_batches(taken.table), headers, body.compression)
