"""Row endpoints: a contiguous slice of a view (`GET`/`POST /rows`), rows by view index (`POST /rows/take`) and
takes of several datasets in one request (`POST /takes`), and where a view's rows lie in the segment cache for a
client on the server's machine (`POST /rows/layout`).

Thin: each parses its request into the model of `app.reads.requests` and runs the read service, on the event loop
when the read is quick, else in the thread pool (`app.api.row_route`); the answer goes out as an Arrow IPC stream
(`app.api.arrow_response`). The routes are `RowRoute`s: documented as declared here, called without dependency
injection.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request, Response

from app.api.arrow_response import ArrowStreamsResponse
from app.api.deps import catalog_of, run_read
from app.api.json_body import json_body_schema, read_json_body
from app.api.problems import OrjsonResponse, problem_responses
from app.api.row_route import RowRoute, answered, answered_at_once, takes_headers
from app.reads.arrow_ipc import ARROW_STREAM_MEDIA_TYPE
from app.reads.multi_takes import TakesRead, naming
from app.reads.requests import RowLayoutRequest, SliceRequest, TakeRequest, TakesRequest, few_enough_takes
from app.reads.service import SliceRead, TakeRead, answer_row_layout

# Every row endpoint may answer these too: a missing or wrong token, invalid input, and a catalog still loading or a
# dataset unreadable.
router = APIRouter(tags=["rows"], route_class=RowRoute, responses=problem_responses(401, 403, 422, 503))


def _header(description: str, kind: str = "integer", required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": {"type": kind}}


_COUNT_HEADERS = {
    "X-Row-Count": _header("Rows in this response."),
    "X-Total-Rows": _header("Rows in the whole view of the picked episodes (N)."),
    "X-Arrow-Compression": _header("The body's codec, when compression was asked.", "string", required=False),
    "X-Expected-Length": _header(
        "A chunked, uncompressed answer's length, estimated a little over (to size a receive buffer by).",
        required=False,
    ),
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
_TAKES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The takes' Arrow IPC streams one after another, in the order asked (each ends with Arrow's "
        "end-of-stream marker, where the next begins)",
        "content": _ARROW_BODY,
        "headers": {
            "X-Row-Count": _header("Rows of all the takes together."),
            "X-Total-Rows": _header("Rows in each take's view, comma-separated, in order.", "string"),
        },
    },
    **problem_responses(404),
    **_BODY_PROBLEMS,
}
_QUERY_HELP = {
    "episodes": "Episode spec, e.g. '0,3-5,9'; absent means every episode.",
    "columns": "Comma-separated columns, in the order wanted.",
    "delta_timestamps": 'JSON object of LeRobot windows, e.g. {"action": [0, 0.0333333, 0.0666667]}.',
}


def _query_parameters(model: type[SliceRequest]) -> dict[str, Any]:
    """`openapi_extra` documenting the query parameters `model.from_query` reads (its fields, one each)."""
    parameters = []
    for name, info in model.model_fields.items():
        schema: dict[str, Any] = {"type": "string", "minLength": 1}  # an empty value is 422
        if name in ("start", "stop"):
            schema = {"type": "integer", "minimum": 0}
        elif name == "tolerance_s":
            schema = {"type": "number", "minimum": 0, "default": info.default}
        elif name == "compression":
            schema = {"type": "string", "enum": ["none", "lz4", "zstd"]}
        description = _QUERY_HELP.get(name, info.description)
        parameters.append(
            {"name": name, "in": "query", "required": False, "schema": schema, "description": description}
        )
    return {"parameters": parameters}


@router.get(
    "/datasets/{dataset_id:path}/rows",
    summary="A contiguous slice of the view, as an Arrow IPC stream",
    response_class=Response,
    responses=_SLICE_RESPONSES,
    openapi_extra=_query_parameters(SliceRequest),
)
async def read_rows(request: Request, dataset_id: str) -> Response:
    dataset = catalog_of(request).get(dataset_id)
    selection = SliceRequest.from_query(request.query_params.multi_items())
    return await answered(request, SliceRead(dataset, selection, request.headers.get("if-none-match")))


@router.post(
    "/datasets/{dataset_id:path}/rows",
    summary="The same slice as GET /rows, with the selection in a JSON body (for long episode lists)",
    response_class=Response,
    responses={**_SLICE_RESPONSES, **_BODY_PROBLEMS},
    openapi_extra=json_body_schema(SliceRequest),
)
async def read_rows_with_body(request: Request, dataset_id: str) -> Response:
    dataset = catalog_of(request).get(dataset_id)
    body = await read_json_body(request, SliceRequest, dataset.limits.max_body_bytes)
    return await answered(request, SliceRead(dataset, body, request.headers.get("if-none-match")))


@router.post(
    "/datasets/{dataset_id:path}/rows/take",
    summary="Rows by view index (order kept, duplicates allowed), as an Arrow IPC stream",
    response_class=Response,
    responses=_TAKE_RESPONSES,
    openapi_extra=json_body_schema(TakeRequest),
)
async def take_rows(request: Request, dataset_id: str) -> Response:
    dataset = catalog_of(request).get(dataset_id)
    body = await read_json_body(request, TakeRequest, dataset.limits.max_body_bytes)
    return await answered(request, TakeRead(dataset, body))


_LAYOUT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Where the view's rows lie in the segment cache: `rows` (the view's length), `columns`, the "
        "runs (`offsets`: the view row each starts at, then the length; `files`: each run's source file number; "
        "`starts`: its first row in that file's segment), `segments` (the segment files of those source files the "
        "answering process has mapped: `file`, `path` relative to the cache directory, `bytes`, `inode`, "
        "`mtime_ns`, `rows`) and `seconds` (how long a client may use it before asking again; 0: not at all)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
    **problem_responses(404),
    **_BODY_PROBLEMS,
}


@router.post(
    "/datasets/{dataset_id:path}/rows/layout",
    summary="Where a view's rows lie in the segment cache, for a client on the server's machine",
    response_class=OrjsonResponse,
    responses=_LAYOUT_RESPONSES,
    openapi_extra=json_body_schema(RowLayoutRequest),
)
async def row_layout(request: Request, dataset_id: str) -> Response:
    dataset = catalog_of(request).get(dataset_id)
    body = await read_json_body(request, RowLayoutRequest, dataset.limits.max_body_bytes)
    return OrjsonResponse(await run_read(request, answer_row_layout, dataset, body))


@router.post(
    "/takes",
    summary="Takes of one or more datasets in one request (a mixture's batch), as Arrow IPC streams in order",
    response_class=Response,
    responses=_TAKES_RESPONSES,
    openapi_extra=json_body_schema(TakesRequest),
)
async def take_many(request: Request) -> Response:
    settings = request.app.state.settings
    body = await read_json_body(request, TakesRequest, settings.max_body_bytes, few_enough_takes)
    takes = TakesRead(catalog_of(request), body, settings)
    at_once = answered_at_once(request, takes)
    if at_once is not None:
        return at_once
    await run_read(request, takes.check)
    # The first take is answered now (a problem with it is still an error status), the others as they are sent.
    made = [await _answered_take(request, takes, 0)]
    later = [functools.partial(_answered_take, request, takes, number) for number in range(1, len(takes.reads))]
    return ArrowStreamsResponse(made, later, takes_headers(takes))


async def _answered_take(request: Request, takes: TakesRead, number: int) -> Response:
    with naming(number, takes.takes[number]):
        return await answered(request, takes.reads[number])
