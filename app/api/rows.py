"""Row endpoints: a contiguous slice of a view (`GET`/`POST /rows`) and rows by view index (`POST /rows/take`).

Thin: each parses its request into the model of `app.reads.requests`, runs the read service in the thread pool
(quick reads are answered ahead of these routes by `app.api.fast_lane`, with the same models and service) and
encodes the answer as an Arrow IPC stream (`app.api.arrow_response`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.routing import APIRoute

from app.api.arrow_response import arrow_response
from app.api.deps import PARSED_REQUEST, get_dataset, json_body_schema, read_json_body, run_read
from app.reads.arrow_ipc import ARROW_STREAM_MEDIA_TYPE
from app.reads.requests import SliceRequest, TakeRequest
from app.reads.service import Answer, answer_slice, answer_take
from app.store.dataset import Dataset

router = APIRouter(tags=["rows"])

_ARROW_RESPONSE = {
    200: {"content": {ARROW_STREAM_MEDIA_TYPE: {}}, "description": "Arrow IPC stream of the rows"},
    304: {"description": "Not modified (ETag matched)"},
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
        schema: dict[str, Any] = {"type": "string"}
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


def to_response(answer: Answer | Any) -> Response:
    """The HTTP response of a read service answer (304 for `NotModified`)."""
    if isinstance(answer, Answer):
        return arrow_response(answer)
    return Response(status_code=304, headers=answer.headers)


def _slice(dataset: Dataset, request: SliceRequest, if_none_match: str | None) -> Response:
    return to_response(answer_slice(dataset, request, if_none_match))


def _take(dataset: Dataset, request: TakeRequest) -> Response:
    return to_response(answer_take(dataset, request))


@router.get(
    "/datasets/{dataset_id:path}/rows",
    summary="A contiguous slice of the view, as an Arrow IPC stream",
    response_class=Response,
    responses=_ARROW_RESPONSE,
    openapi_extra=_query_parameters(SliceRequest),
)
async def read_rows(request: Request, dataset: Dataset = Depends(get_dataset)) -> Response:
    selection = request.scope.get(PARSED_REQUEST) or SliceRequest.from_query(request.query_params.multi_items())
    return await run_read(request, _slice, dataset, selection, request.headers.get("if-none-match"))


@router.post(
    "/datasets/{dataset_id:path}/rows",
    summary="The same slice as GET /rows, with the selection in a JSON body (for long episode lists)",
    response_class=Response,
    responses=_ARROW_RESPONSE,
    openapi_extra=json_body_schema(SliceRequest),
)
async def read_rows_with_body(request: Request, dataset: Dataset = Depends(get_dataset)) -> Response:
    body = await read_json_body(request, SliceRequest, dataset.limits.max_body_bytes)
    return await run_read(request, _slice, dataset, body, request.headers.get("if-none-match"))


@router.post(
    "/datasets/{dataset_id:path}/rows/take",
    summary="Rows by view index (order kept, duplicates allowed), as an Arrow IPC stream",
    response_class=Response,
    responses=_ARROW_RESPONSE,
    openapi_extra=json_body_schema(TakeRequest),
)
async def take_rows(request: Request, dataset: Dataset = Depends(get_dataset)) -> Response:
    body = request.scope.get(PARSED_REQUEST) or await read_json_body(
        request, TakeRequest, dataset.limits.max_body_bytes
    )
    return await run_read(request, _take, dataset, body)


def take_route() -> APIRoute:
    """The route of `POST /rows/take` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(take_rows)


def slice_route() -> APIRoute:
    """The route of `GET /rows` (the fast lane answers its quick requests ahead of it)."""
    return _route_of(read_rows)


def _route_of(endpoint: Callable[..., Any]) -> APIRoute:
    return next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is endpoint)
