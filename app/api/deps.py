"""FastAPI dependencies: settings, the catalog, and validated request pieces shared by routers."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import orjson
from fastapi import Request
from pydantic import BaseModel

from app.auth import TokenCheck, TokenVerifier
from app.errors import OverLimit, ProblemError, TryLater
from app.reads.requests import validated
from app.settings import Settings
from app.store.catalog import Catalog
from app.store.dataset import Dataset

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# Dependencies are `async def` although they do not await: FastAPI would run plain `def` ones in the thread
# pool, one thread hop each, which costs more than their work on every request.


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_catalog(request: Request) -> Catalog:
    return catalog_of(request)


def catalog_of(request: Request) -> Catalog:
    catalog = getattr(request.app.state, "catalog", None)
    if catalog is None:
        raise TryLater("the catalog is still loading; retry shortly")
    return catalog


# Scope keys the fast lane sets on a request it passes on, so the route does not repeat its work.
TOKEN_ACCEPTED = "episerve.token_accepted"  # the bearer token was checked and accepted
PARSED_REQUEST = "episerve.request"  # the request, parsed and validated by its model


async def require_token(request: Request) -> None:
    """401 without a bearer token, 403 with a wrong one, when tokens are configured."""
    if not request.scope.get(TOKEN_ACCEPTED):
        check_token(request)


def check_token(request: Request) -> None:
    """The check behind `require_token`, for callers outside dependency injection."""
    verifier: TokenVerifier = request.app.state.token_verifier
    result = verifier.check(request.headers.get("authorization"))
    if result is TokenCheck.MISSING:
        raise ProblemError(
            "this server requires a bearer token (Authorization: Bearer <token>)",
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    if result is TokenCheck.INVALID:
        raise ProblemError("the bearer token is not accepted", status=403)


async def get_dataset(dataset_id: str, request: Request) -> Dataset:
    return catalog_of(request).get(dataset_id)


async def run_read(request: Request, function: Callable[..., T], *args: Any) -> T:
    """Run a row read in the thread pool, at most `max_concurrent_reads` at once per worker: beyond that,
    requests wait their turn instead of each holding its response's buffers at the same time."""
    limiter = request.app.state.read_limiter
    return await anyio.to_thread.run_sync(functools.partial(function, *args), limiter=limiter)


def json_body_schema(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON body that the route reads itself with `read_json_body`."""
    content = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": required, "content": content}}


async def read_json_body(request: Request, model: type[M], max_bytes: int) -> M:
    """Parse and validate a JSON body, refusing wrong content types, oversize and malformed bodies."""
    check_json_content_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise OverLimit(f"the body is {declared} bytes; the limit is {max_bytes} bytes", max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise OverLimit(f"the body is larger than the limit of {max_bytes} bytes", max_bytes)
    return decode_json_body(body, model)


def check_json_content_type(content_type: str | None) -> None:
    """415 unless the content type is JSON (`application/json` or `*+json`)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ProblemError(f"the body must be application/json, got {content_type or 'no content type'!r}", status=415)


def decode_json_body(body: bytes | bytearray, model: type[M]) -> M:
    """The body as a validated `model`: 400 when it is not JSON, 422 when it does not validate."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProblemError(f"the body is not valid JSON: {exc}", status=400) from exc
    return validated(model, document, "body")
