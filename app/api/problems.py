"""Errors as RFC 9457 problem details (`type`, `title`, `status`, `detail`) for every failure."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.errors import DatasetError, ProblemError
from app.reads.catalog import DATASET_ID_PATTERN

PROBLEM_MEDIA_TYPE = "application/problem+json"


class Problem(BaseModel):
    """The body of every error response (RFC 9457 problem details); some kinds add fields."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="A URI naming the kind of problem.")
    title: str = Field(description="The kind of problem, in words.")
    status: int = Field(description="The HTTP status.")
    detail: str = Field(description="What was wrong with this request.")
    limit: int | None = Field(None, description="413: the limit the request exceeds.")
    errors: list[dict[str, Any]] | None = Field(None, description="422: each invalid field (`loc`, `msg`, `type`).")
    transient: bool | None = Field(
        None, description="503: false when retrying cannot help until the operator fixes a file (no `Retry-After`)."
    )


_PROBLEM_DESCRIPTIONS = {
    400: "The JSON body is not valid JSON",
    401: "No bearer token (the server is configured with tokens)",
    403: "The bearer token is not accepted",
    404: "No such dataset or episodes",
    413: "The request exceeds a limit (`limit` says which number)",
    415: "The body is not application/json",
    422: "Invalid input: the detail names the parameter or field and what is wrong",
    503: "Not ready (catalog loading, a download under way), its object store failing or too slow, or a source file "
    "changed mid-read: retry after `Retry-After`. A dataset or mixture file the operator must fix first: "
    "`transient` is false and there is no `Retry-After`",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries: a problem body under `application/problem+json` for each status."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {
            "description": _PROBLEM_DESCRIPTIONS[status],
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if status == 503:
            entry["headers"] = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}}
        if status == 401:
            entry["headers"] = {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}}
        responses[status] = entry
    return responses


def install_problem_schema(app: FastAPI) -> None:
    """Make the OpenAPI schema say what the server sends on errors: the `Problem` schema, and every 422 as a
    problem (FastAPI documents its own `HTTPValidationError`, which this server never sends)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    if "422" in operation.get("responses", {}):
                        operation["responses"]["422"] = problem_responses(422)[422]
                    _document_dataset_id(operation)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document_dataset_id(operation: dict[str, Any]) -> None:
    """State the form of a dataset id (one or two `/`-separated names) where an operation takes one: a fuzzer or
    a generated client then knows what the server accepts (anything else is 404 or 422)."""
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("name") == "dataset_id":
            parameter["schema"] = {**parameter.get("schema", {}), "pattern": DATASET_ID_PATTERN}
            parameter.setdefault("description", "Dataset id: `name` or `org/name`, as GET /datasets lists them.")


class OrjsonResponse(JSONResponse):
    """JSON rendered by orjson (numpy scalars and arrays included)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


log = logging.getLogger("episerve")


def problem(
    status: int, detail: str, title: str | None = None, headers: dict[str, str] | None = None, **extra: Any
) -> OrjsonResponse:
    """A problem-details JSON response. A 503 asks the client to retry in a second (`Retry-After`) unless it is
    marked `transient=False`: a problem only the operator can cure."""
    phrase = HTTPStatus(status).phrase
    body = {
        "type": f"https://episerve.dev/problems/{phrase.lower().replace(' ', '-')}",
        "title": title or phrase,
        "status": status,
        "detail": detail,
        **extra,
    }
    retry = status == 503 and extra.get("transient", True)
    headers = {**({"Retry-After": "1"} if retry else {}), **(headers or {})}
    return OrjsonResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def install_problem_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and unexpected exceptions to problem responses."""

    @app.exception_handler(ProblemError)
    async def problem_error(request: Request, exc: ProblemError) -> OrjsonResponse:
        if isinstance(exc, DatasetError):
            log.error("dataset error on %s: %s", request.url.path, exc.detail)
        extra: dict[str, Any] = {"limit": exc.limit} if exc.limit is not None else {}
        if exc.permanent:
            extra["transient"] = False
        return problem(exc.status, exc.public_detail(), exc.title or None, headers=exc.headers, **extra)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> OrjsonResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem(422, detail or "invalid request", "Invalid request", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> OrjsonResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        headers = exc.headers
        if exc.status_code == 405:
            allowed = ", ".join(_allowed_methods(request))
            headers = {**(headers or {}), "Allow": allowed}
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
        return problem(exc.status_code, detail, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> OrjsonResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "internal server error (this is a bug; the server log has the details)")


def _allowed_methods(request: Request) -> list[str]:
    """The methods some route accepts at the request's path (the router's 405 names only the first route's)."""
    methods: set[str] = set()
    pending = list(request.app.router.routes)
    while pending:
        route = pending.pop()
        included = getattr(route, "original_router", None)  # a router included with `include_router`
        if included is not None:
            pending.extend(included.routes)
        elif (
            isinstance(getattr(route, "methods", None), set | frozenset)
            and route.matches({**request.scope, "method": next(iter(route.methods))})[0] is Match.FULL
        ):
            methods.update(route.methods)
    return sorted(methods)
