"""Row endpoints: a contiguous slice of a view (`GET`/`POST /rows`), rows by view index (`POST /rows/take`) and
takes of several datasets in one request (`POST /takes`).

Thin: each parses its request into the model of `app.reads.requests`, runs the read service in the thread pool
(quick reads are answered ahead of these routes by `app.api.fast_lane`, with the same models and service) and
encodes the answer as an Arrow IPC stream (`app.api.arrow_response`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.routing import APIRoute

from app.api.arrow_response import FIRST_HOLD_BYTES, ArrowStreamsResponse, arrow_response
from app.api.deps import PARSED_REQUEST, PREPARED_READ, catalog_of, get_dataset, run_read
from app.api.inflight import Hold
from app.api.json_body import json_body_schema, read_json_body
from app.api.problems import problem_responses
from app.reads.arrow_ipc import ARROW_STREAM_MEDIA_TYPE
from app.reads.catalog import Dataset
from app.reads.multi_takes import TakesRead, naming
from app.reads.requests import SliceRequest, TakeRequest, TakesRequest
from app.reads.service import Answer, RowRead, SliceRead, TakeRead

router = APIRouter(tags=["rows"])


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


def to_response(answer: Answer | Any, hold: Hold | None = None) -> Response:
    """The HTTP response of a read service answer (304 for `NotModified`), which keeps `hold` until it is sent."""
    if isinstance(answer, Answer):
        return arrow_response(answer, hold)
    if hold is not None:
        hold.release()
    return Response(status_code=304, headers=answer.headers)


async def _answered(request: Request, read: RowRead) -> Response:
    """`read` answered in the thread pool once the in-flight budget has room for its first piece; the response
    holds its bytes on the budget until it is sent."""
    hold = await request.app.state.inflight.hold(FIRST_HOLD_BYTES)
    try:
        return to_response(await run_read(request, read.answer), hold)
    except BaseException:
        hold.release()
        raise


@router.get(
    "/datasets/{dataset_id:path}/rows",
    summary="A contiguous slice of the view, as an Arrow IPC stream",
    response_class=Response,
    responses=_SLICE_RESPONSES,
    openapi_extra=_query_parameters(SliceRequest),
)
async def read_rows(request: Request, dataset: Dataset = Depends(get_dataset)) -> Response:
    selection = request.scope.get(PARSED_REQUEST) or SliceRequest.from_query(request.query_params.multi_items())
    read = request.scope.get(PREPARED_READ) or SliceRead(dataset, selection, request.headers.get("if-none-match"))
    return await _answered(request, read)


@router.post(
    "/datasets/{dataset_id:path}/rows",
    summary="The same slice as GET /rows, with the selection in a JSON body (for long episode lists)",
    response_class=Response,
    responses={**_SLICE_RESPONSES, **_BODY_PROBLEMS},
    openapi_extra=json_body_schema(SliceRequest),
)
async def read_rows_with_body(request: Request, dataset: Dataset = Depends(get_dataset)) -> Response:
    body = await read_json_body(request, SliceRequest, dataset.limits.max_body_bytes)
    return await _answered(request, SliceRead(dataset, body, request.headers.get("if-none-match")))


@router.post(
    "/datasets/{dataset_id:path}/rows/take",
    summary="Rows by view index (order kept, duplicates allowed), as an Arrow IPC stream",
    response_class=Response,
    responses=_TAKE_RESPONSES,
    openapi_extra=json_body_schema(TakeRequest),
)
async def take_rows(request: Request, dataset: Dataset = Depends(get_dataset)) -> Response:
    body = request.scope.get(PARSED_REQUEST) or await read_json_body(
        request, TakeRequest, dataset.limits.max_body_bytes
    )
    return await _answered(request, request.scope.get(PREPARED_READ) or TakeRead(dataset, body))


@router.post(
    "/takes",
    summary="Takes of one or more datasets in one request (a mixture's batch), as Arrow IPC streams in order",
    response_class=Response,
    responses=_TAKES_RESPONSES,
    openapi_extra=json_body_schema(TakesRequest),
)
async def take_many(request: Request) -> Response:
    takes = request.scope.get(PREPARED_READ)
    if takes is None:
        settings = request.app.state.settings
        body = request.scope.get(PARSED_REQUEST) or await read_json_body(request, TakesRequest, settings.max_body_bytes)
        takes = TakesRead(catalog_of(request), body, settings)
    await run_read(request, takes.check)
    # The first take is answered now (a problem with it is still an error status), the others as they are sent.
    made = [await _answered_take(request, takes, 0)]
    later = [functools.partial(_answered_take, request, takes, number) for number in range(1, len(takes.reads))]
    return ArrowStreamsResponse(made, later, takes_headers(takes))


async def _answered_take(request: Request, takes: TakesRead, number: int) -> Response:
    with naming(number, takes.takes[number]):
        return await _answered(request, takes.reads[number])


def takes_headers(takes: TakesRead) -> dict[str, str]:
    """The headers of a `POST /takes` answer."""
    return {
        "X-Row-Count": str(sum(len(take.indices) for take in takes.takes)),
        "X-Total-Rows": ",".join(map(str, takes.view_rows())),
    }


def take_route() -> APIRoute:
    """The route of `POST /rows/take` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(take_rows)


def takes_route() -> APIRoute:
    """The route of `POST /takes` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(take_many)


def slice_route() -> APIRoute:
    """The route of `GET /rows` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(read_rows)


def _route_of(endpoint: Callable[..., Any]) -> APIRoute:
    return next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is endpoint)
