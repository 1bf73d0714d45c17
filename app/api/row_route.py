"""The row endpoints' route class and how they answer a read: quick reads on the event loop, others in the pool.

A 256-row take from a mapped segment is a fraction of a millisecond of work, less than FastAPI's dependency
injection and the thread-pool hand-off around it. So the row endpoints (`app.api.rows`) are declared and documented
like any FastAPI route, but a `RowRoute` calls its endpoint with the request and the path parameters alone: the
endpoint does the work of the dependencies itself (`guard`: the bearer token, the query, the store deadline) and
then `answered` runs its read — right here when the read service says it is quick (`RowRead.quick`: the segments
it touches are mapped in this process and it copies at most `EPISERVE_INLINE_READ_BYTES`), else in the thread pool,
where it may load an index, map or build segments, read sources cold and decode camera frames. Either way the read
is parsed once and read once; `EPISERVE_INLINE_READ_BYTES=0` sends every read to the pool.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from app import metrics
from app.api.arrow_response import (
    FIRST_HOLD_BYTES,
    SEND_BYTES,
    ArrowStreamsResponse,
    arrow_response,
    arrow_streams_response,
)
from app.api.deps import run_read
from app.api.inflight import Hold
from app.api.query_checks import check_query
from app.api.tokens import check_token
from app.errors import WouldBlock
from app.reads.catalog import StoreDeadline, current_store_deadline, kept_store_deadline, store_deadline
from app.reads.multi_takes import TakesRead
from app.reads.service import Answer, NotModified, RowRead, TakeRead

Endpoint = Callable[..., Coroutine[Any, Any, Response]]
T = TypeVar("T")


class RowRoute(APIRoute):
    """A route documented by FastAPI from its declaration, whose endpoint is called as `endpoint(request,
    **path_params)` after `guard`: no dependency injection, no thread hop before the endpoint decides. Added to
    the application's own routes (`install`), it is served by `serve` alone; the exception middleware words what
    it raises, as for any route."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = self.serve

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint: Endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            wait_s = guard(request)
            if wait_s is None:
                return await endpoint(request, **request.path_params)
            with store_deadline(wait_s):
                response = await endpoint(request, **request.path_params)
                return _WithinStoreDeadline(response, current_store_deadline())

        return handler

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._handler(Request(scope, receive, send))
        await response(scope, receive, send)

    @functools.cached_property
    def _handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return self.get_route_handler()


def install(app: FastAPI, router: APIRouter) -> None:
    """Add `router`'s routes to `app`'s own, first: a row read, the most frequent request by far, is matched
    before any other route and without the indirection of an included router."""
    app.router.routes[0:0] = router.routes


def guard(request: Request) -> float | None:
    """What the other data routes' dependencies check: the bearer token (401/403) and the query (422 for a
    parameter the route does not declare). Returns the seconds a read may wait on an object store, when a root is
    one."""
    check_token(request)
    check_query(request)
    return request.app.state.store_wait_s


class _WithinStoreDeadline(Response):
    """`response`, sent under the store deadline of the request that made it: its later pieces may read the store."""

    def __init__(self, response: Response, deadline: StoreDeadline | None) -> None:
        self.response, self.deadline = response, deadline
        self.status_code, self.raw_headers = response.status_code, response.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with kept_store_deadline(self.deadline):
            await self.response(scope, receive, send)


async def answered(request: Request, read: RowRead) -> Response:
    """The response to `read`: answered on the event loop when it is quick and the in-flight budget has room right
    now, else in the thread pool once the budget has room for its first piece. The response holds its bytes on the
    budget until it is sent."""
    state = request.app.state
    inline = _read_inline(state, read, read.answer)
    if inline is not None:
        answer, hold = inline
        (metrics.INLINE_TAKES if isinstance(read, TakeRead) else metrics.INLINE_SLICES).inc()
        return to_response(answer, hold)
    hold = await state.inflight.hold(FIRST_HOLD_BYTES)
    try:
        return to_response(await run_read(request, read.answer), hold)
    except BaseException:
        hold.release()
        raise


def answered_at_once(request: Request, takes: TakesRead) -> Response | None:
    """The answer of a `POST /takes` whose takes are all quick, read right here, or None (not quick, or the
    in-flight budget spent: the caller answers each in the pool)."""
    inline = _read_inline(request.app.state, takes, lambda: [read.answer() for read in takes.reads])
    if inline is None:
        return None
    answers, hold = inline
    metrics.INLINE_TAKES.inc(len(answers))
    if any(answer.codec is not None for answer in answers):  # compressed as sent, a take at a time
        return ArrowStreamsResponse([to_response(answer) for answer in answers], [], takes_headers(takes), hold)
    return arrow_streams_response(answers, takes_headers(takes), hold)


def _read_inline(state: Any, read: RowRead | TakesRead, answer: Callable[[], T]) -> tuple[T, Hold] | None:
    """`answer()` with its hold on the in-flight budget, read right here when `read` is quick and the budget has
    room right now; None when it must go to the pool (not quick, the budget spent, or the snapshot moved on)."""
    inline_bytes = state.settings.inline_read_bytes
    if not inline_bytes or not _quick(read):
        return None
    hold = state.inflight.try_hold(inline_bytes + SEND_BYTES)
    if hold is None:
        return None
    try:
        return answer(), hold
    except WouldBlock:
        hold.release()  # the snapshot moved on: the pool reads it afresh
        return None
    except BaseException:
        hold.release()
        raise


def takes_headers(takes: TakesRead) -> dict[str, str]:
    """The headers of a `POST /takes` answer (once its takes are decided or checked)."""
    return {
        "X-Row-Count": str(sum(len(take.indices) for take in takes.takes)),
        "X-Total-Rows": ",".join(map(str, takes.view_rows())),
    }


def _quick(read: RowRead | TakesRead) -> bool:
    """`read.quick()`, False where deciding it would block (a problem with the request is raised)."""
    try:
        return read.quick()
    except WouldBlock:
        return False


def to_response(answer: Answer | NotModified, hold: Hold | None = None) -> Response:
    """The HTTP response of a read service answer (304 for `NotModified`), which keeps `hold` until it is sent."""
    if isinstance(answer, Answer):
        return arrow_response(answer, hold)
    if hold is not None:
        hold.release()
    return Response(status_code=304, headers=answer.headers)
