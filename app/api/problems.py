"""Errors as RFC 9457 problem details (`type`, `title`, `status`, `detail`) for every failure."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import DatasetError, ProblemError

PROBLEM_MEDIA_TYPE = "application/problem+json"


class OrjsonResponse(JSONResponse):
    """JSON rendered by orjson (numpy scalars and arrays included)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


log = logging.getLogger("episerve")


def problem(
    status: int, detail: str, title: str | None = None, headers: dict[str, str] | None = None, **extra: Any
) -> OrjsonResponse:
    """A problem-details JSON response."""
    phrase = HTTPStatus(status).phrase
    body = {
        "type": f"https://episerve.dev/problems/{phrase.lower().replace(' ', '-')}",
        "title": title or phrase,
        "status": status,
        "detail": detail,
        **extra,
    }
    headers = {**({"Retry-After": "1"} if status == 503 else {}), **(headers or {})}
    return OrjsonResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def install_problem_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and unexpected exceptions to problem responses."""

    @app.exception_handler(ProblemError)
    async def problem_error(request: Request, exc: ProblemError) -> OrjsonResponse:
        if isinstance(exc, DatasetError):
            log.error("dataset error on %s: %s", request.url.path, exc.detail)
        extra = {"limit": exc.limit} if exc.limit is not None else {}
        return problem(exc.status, exc.detail, exc.title or None, headers=exc.headers, **extra)

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
        return problem(exc.status_code, detail)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> OrjsonResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "internal server error (this is a bug; the server log has the details)")
