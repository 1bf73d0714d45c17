"""FastAPI dependencies: settings, the catalog, and validated request pieces shared by routers."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

import anyio
import orjson
from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from app.auth import TokenCheck, TokenVerifier
from app.errors import InvalidInput, OverLimit, ProblemError, TryLater
from app.reads.requests import validated, validation_detail
from app.settings import Settings
from app.store.catalog import Catalog
from app.store.dataset import Dataset
from app.store.store_waits import store_deadline

T = TypeVar("T")
_BODY_DEADLINE = "episerve.body_deadline"
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
PREPARED_READ = "episerve.read"  # the request's read, decided not quick: the route answers it in the thread pool


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


async def reject_unknown_query(request: Request) -> None:
    """422 when the query holds a parameter the matched route does not declare: a misspelled `episode=` must
    not silently select every episode. The detail names each one, the nearest declared name and all of them."""
    if not request.scope.get("query_string"):
        return
    accepted = declared_query_names(request.scope["route"])
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in accepted]
    if unknown:
        raise InvalidInput(unknown_query_detail(unknown, accepted))


def declared_query_names(route: APIRoute) -> frozenset[str]:
    """The query parameter names a route reads: those of its dependencies, and those it documents itself
    (`openapi_extra`, for routes that parse their query with a request model). Remembered per route."""
    known = _DECLARED_QUERY_NAMES.get(id(route))
    if known is not None:
        return known
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(field.alias for field in dependant.query_params)
        pending.extend(dependant.dependencies)
    extra = (route.openapi_extra or {}).get("parameters", [])
    names.update(p["name"] for p in extra if p.get("in") == "query")
    known = _DECLARED_QUERY_NAMES[id(route)] = frozenset(names)
    return known


_DECLARED_QUERY_NAMES: dict[int, frozenset[str]] = {}  # routes live as long as the process


def unknown_query_detail(unknown: Iterable[str], accepted: Iterable[str]) -> str:
    """ "unknown query parameter 'episode' (did you mean 'episodes'?); this endpoint accepts: ..."."""
    accepted = sorted(accepted)
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, accepted, n=1)
        named.append(repr(name) + (f" (did you mean {close[0]!r}?)" if close else ""))
    noun = "parameter" if len(named) == 1 else "parameters"
    takes = f"this endpoint accepts: {', '.join(accepted)}" if accepted else "this endpoint takes no query parameters"
    return f"unknown query {noun} {', '.join(named)}; {takes}"


async def get_dataset(dataset_id: str, request: Request) -> Dataset:
    return catalog_of(request).get(dataset_id)


async def bound_store_waits(request: Request) -> AsyncIterator[None]:
    """The request's waits on an object store end `remote_wait_s` after it arrived (see `app.store.store_waits`);
    the threads it reads in see the deadline, as they run in a copy of its context."""
    with store_deadline(request.app.state.settings.remote_wait_s):
        yield


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
    """Parse and validate a JSON body, refusing wrong content types, oversize, slow and malformed bodies."""
    check_json_content_type(request.headers.get("content-type"))
    check_declared_length(request.headers.get("content-length"), max_bytes)
    timeout_s = request.app.state.settings.body_timeout_s
    body = bytearray()
    try:
        async with until(body_deadline(request.scope, timeout_s)):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_bytes:
                    raise OverLimit(f"the body is larger than the limit of {max_bytes} bytes", max_bytes)
    except TimeoutError as exc:
        raise body_timeout(timeout_s) from exc
    return decode_json_body(body, model)


def check_declared_length(declared: str | None, max_bytes: int) -> None:
    """413 at once, before a byte of the body is read, when its Content-Length is over `max_bytes`."""
    if declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > max_bytes):
        raise OverLimit(f"the body is {declared} bytes; the limit is {max_bytes} bytes", max_bytes)


def body_deadline(scope: dict[str, Any], timeout_s: float) -> float:
    """When the request body must have arrived (event loop clock): `timeout_s` after its first reader started, be
    that the fast lane or the route it hands the request on to."""
    if _BODY_DEADLINE not in scope:
        scope[_BODY_DEADLINE] = asyncio.get_running_loop().time() + timeout_s
    return scope[_BODY_DEADLINE]


def until(deadline: float) -> contextlib.AbstractAsyncContextManager[Any]:
    """A block that raises `TimeoutError` at `deadline` (event loop clock). asyncio's own timeout is one timer;
    anyio's (Python 3.10) costs a few more microseconds per request."""
    if hasattr(asyncio, "timeout_at"):
        return asyncio.timeout_at(deadline)
    return _anyio_until(deadline)


@contextlib.asynccontextmanager
async def _anyio_until(deadline: float) -> AsyncIterator[None]:
    with anyio.fail_after(max(0.0, deadline - asyncio.get_running_loop().time())):
        yield


def body_timeout(timeout_s: float) -> ProblemError:
    """408 for a body slower than `timeout_s`; the connection is closed, since the rest of the body may follow."""
    detail = f"the request body did not arrive within {timeout_s:g} s"
    return ProblemError(detail, status=408, headers={"Connection": "close"})


def check_json_content_type(content_type: str | None) -> None:
    """415 unless the content type is JSON (`application/json` or `*+json`)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ProblemError(f"the body must be application/json, got {content_type or 'no content type'!r}", status=415)


def decode_json_body(body: bytes | bytearray, model: type[M]) -> M:
    """The body as a validated `model`: 400 when it is not JSON, 422 when it does not validate (numbers out of
    range included)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _decode_with_big_numbers(body, model, exc)
    return validated(model, document, "body")


def _decode_with_big_numbers(body: bytes | bytearray, model: type[M], error: orjson.JSONDecodeError) -> M:
    """orjson refuses numbers past float64 (an integer of 400 digits is valid JSON all the same); pydantic's own
    parser reads them, so that the field's range check words the problem."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        if kinds != {"json_invalid"}:
            raise InvalidInput(f"invalid body: {validation_detail(exc, 'body')}") from exc
        out_of_range = [e["msg"] for e in exc.errors() if "number out of range" in e["msg"]]
        if out_of_range:
            raise InvalidInput(f"invalid body: a number has too many digits ({out_of_range[0]})") from exc
        raise ProblemError(f"the body is not valid JSON: {error}", status=400) from error
