"""The fast lane: quick row reads answered right on the event loop, ahead of the framework.

A 256-row take from a mapped segment is a fraction of a millisecond of work, less than the routing, dependency
injection and thread-pool hand-off around it; a contiguous slice of mapped segments is zero-copy views, sent on
the event loop anyway. This ASGI middleware answers the common cases itself:

- `POST /datasets/{id}/rows/take`: an accepted token, no query, a JSON body that validates, a loaded dataset
  whose touched segments this process has mapped already, and a result of at most `EPISERVE_INLINE_READ_BYTES`;
- `GET /datasets/{id}/rows` without windows, compression or `If-None-Match`, with an accepted token, and
  segments this process has mapped already.

Camera frames qualify when every one comes from a decoded-frame segment this process has mapped (and not inside
a window): frames of 64 KiB or more are sent straight from the map (`app.reads.pending_copies`), so they count
nothing against the inline budget; smaller ones are copied and do.

A take's body is read here only if its declared length is within `EPISERVE_MAX_BODY_BYTES` (else the route
answers 413 before a byte of it is read), and only until the request's body deadline (`EPISERVE_BODY_TIMEOUT_S`,
shared with the route, which then answers 408).

Both parse the request with the route's own model (`app.reads.requests`) and ask the read service whether the
read is quick (`RowRead.quick`) before reading a row: a quick read is answered here; any other (a first touch that
maps or builds a segment, frames to decode, a large take) goes on, body intact and read decided, to the regular
route, which answers it in the thread pool. Either way the read runs once.

`EPISERVE_INLINE_READ_BYTES=0` turns the lane off. Every error goes on to the route too, which words it. The
response is the same either way; only its cost differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qsl

from starlette.datastructures import Headers, State
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.api.arrow_response import SEND_BYTES, ArrowStreamsResponse, arrow_streams_response
from app.api.body_deadline import body_deadline, until
from app.api.deps import PARSED_REQUEST, PREPARED_READ
from app.api.json_body import check_declared_length, check_json_content_type, decode_json_body
from app.api.rows import takes_headers, to_response
from app.api.tokens import TOKEN_ACCEPTED
from app.auth import TokenCheck
from app.errors import ProblemError, WouldBlock
from app.reads.multi_takes import TakesRead
from app.reads.requests import SliceRequest, TakeRequest, TakesRequest
from app.reads.service import RowRead, SliceRead, TakeRead

M = TypeVar("M", TakeRequest, TakesRequest)

_TAKE_SUFFIX = "/rows/take"
_SLICE_SUFFIX = "/rows"
_TAKES_SUFFIX = "/takes"


class FastLane:
    """Serves quick takes and slices itself and hands every other request, untouched, to `app`."""

    def __init__(
        self, app: ASGIApp, state: State, take_route: BaseRoute, slice_route: BaseRoute, takes_route: BaseRoute
    ) -> None:
        self.app = app
        self.state = state
        self.take_route = take_route
        self.slice_route = slice_route
        self.takes_route = takes_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = getattr(self.state, "settings", None)
        if scope["type"] != "http" or settings is None or settings.inline_read_bytes == 0:
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and path.endswith(_TAKE_SUFFIX):
            await self._take(scope, receive, send)
        elif method == "POST" and path.endswith(_TAKES_SUFFIX):
            await self._takes(scope, receive, send)
        elif method == "GET" and path.endswith(_SLICE_SUFFIX):
            await self._slice(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _take(self, scope: Scope, receive: Receive, send: Send) -> None:
        match, child_scope = self.take_route.matches(scope)
        response = None
        body, receive = await self._body(match, scope, receive)
        if body is not None:
            response = self._quick(scope, child_scope, lambda: self._parsed(scope, body, TakeRequest))
        await self._answer(response, child_scope, scope, receive, send)

    async def _takes(self, scope: Scope, receive: Receive, send: Send) -> None:
        match, child_scope = self.takes_route.matches(scope)
        response = None
        body, receive = await self._body(match, scope, receive)
        if body is not None:
            response = self._quick_takes(scope, body)
        await self._answer(response, child_scope, scope, receive, send)

    async def _body(self, match: Match, scope: Scope, receive: Receive) -> tuple[bytes | None, Receive]:
        """The whole JSON body of a request to a body route, or None when the route is to answer it: a query
        (422), a body declared over the limit (413, before a byte of it is read), no accepted token, or a body that
        did not arrive whole and in time. The `receive` returned hands the body over again."""
        settings = self.state.settings
        limit = settings.max_body_bytes
        if (
            match is not Match.FULL
            or scope["query_string"]
            or not _declared_within(scope, limit)
            or not self._accepted(scope)
        ):
            return None, receive
        deadline = body_deadline(scope, settings.body_timeout_s)
        body, complete, receive = await _buffer_body(receive, limit, deadline)
        return (body if complete and len(body) <= limit else None), receive

    async def _slice(self, scope: Scope, receive: Receive, send: Send) -> None:
        match, child_scope = self.slice_route.matches(scope)
        response = None
        if match is Match.FULL and self._accepted(scope):
            response = self._quick(scope, child_scope, lambda: _parsed_slice(scope))
        await self._answer(response, child_scope, scope, receive, send)

    async def _answer(
        self, response: Response | None, child_scope: Scope, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Send the lane's `response`, or pass the request on to the framework when there is none."""
        if response is None:
            await self.app(scope, receive, send)
            return
        scope.update(child_scope)  # the route, as the router would have set it (metrics label it by its path)
        await response(scope, receive, send)

    def _accepted(self, scope: Scope) -> bool:
        """A loaded catalog and an accepted token (remembered in the scope: the route does not check it again)."""
        if getattr(self.state, "catalog", None) is None:
            return False
        accepted = self.state.token_verifier.check(Headers(scope=scope).get("authorization")) is TokenCheck.OK
        scope[TOKEN_ACCEPTED] = accepted
        return accepted

    def _quick(
        self, scope: Scope, child_scope: Scope, parse: Callable[[], SliceRequest | TakeRequest]
    ) -> Response | None:
        """The read's response if it can be answered right here without waiting; None otherwise (after a valid
        request is parsed, the route reuses it, and the read if one was decided on)."""
        try:
            request = parse()
        except ProblemError:
            return None  # the route parses it again and words the error
        scope[PARSED_REQUEST] = request
        if isinstance(request, SliceRequest) and (request.codec is not None or "if-none-match" in Headers(scope=scope)):
            return None  # compressing a slice is CPU work; conditional reads check freshness
        try:
            dataset = self.state.catalog.get(child_scope["path_params"]["dataset_id"])
            read: RowRead = (
                TakeRead(dataset, request) if isinstance(request, TakeRequest) else SliceRead(dataset, request)
            )
            if not read.quick():
                scope[PREPARED_READ] = read
                return None
        except (ProblemError, WouldBlock):
            return None  # the regular route answers it (and words every error)
        hold = self.state.inflight.try_hold(self.state.settings.inline_read_bytes + SEND_BYTES)
        if hold is None:  # the in-flight budget is spent: the route waits its turn
            scope[PREPARED_READ] = read
            return None
        try:
            answer = read.answer()
        except (ProblemError, WouldBlock):
            hold.release()
            return None
        (metrics.INLINE_TAKES if isinstance(request, TakeRequest) else metrics.INLINE_SLICES).inc()
        return to_response(answer, hold)

    def _quick_takes(self, scope: Scope, body: bytes) -> Response | None:
        """The answer of a `POST /takes` whose takes are all quick, or None (the route answers it, reusing the
        parsed request and, once every take is decided, their reads)."""
        try:
            request = self._parsed(scope, body, TakesRequest)
            scope[PARSED_REQUEST] = request
            takes = TakesRead(self.state.catalog, request, self.state.settings)
            quick = takes.quick()
        except (ProblemError, WouldBlock):
            return None
        hold = self.state.inflight.try_hold(self.state.settings.inline_read_bytes + SEND_BYTES) if quick else None
        if hold is None:  # not quick, or the in-flight budget is spent: the route answers, with the reads decided
            scope[PREPARED_READ] = takes
            return None
        try:
            answers = [read.answer() for read in takes.reads]
        except (ProblemError, WouldBlock):
            hold.release()
            return None
        metrics.INLINE_TAKES.inc(len(answers))
        if any(answer.codec is not None for answer in answers):  # compressed as sent, a take at a time
            responses = [to_response(answer) for answer in answers]
            return ArrowStreamsResponse(responses, [], takes_headers(takes), hold)
        return arrow_streams_response(answers, takes_headers(takes), hold)

    @staticmethod
    def _parsed(scope: Scope, body: bytes, model: type[M]) -> M:
        check_json_content_type(Headers(scope=scope).get("content-type"))
        return decode_json_body(body, model)


def _parsed_slice(scope: Scope) -> SliceRequest:
    return SliceRequest.from_query(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))


def _declared_within(scope: Scope, limit: int) -> bool:
    """Whether the request's Content-Length, if any, is within `limit`."""
    try:
        check_declared_length(Headers(scope=scope).get("content-length"), limit)
    except ProblemError:
        return False
    return True


async def _buffer_body(receive: Receive, limit: int, deadline: float) -> tuple[bytes, bool, Receive]:
    """Read the request body, up to `limit` bytes and until `deadline`. Returns the bytes read, whether that was
    the whole body, and a `receive` that hands the same body (then whatever follows) to the next reader."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with until(deadline):
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client left: the route hears it after the partial body
                    return b"".join(chunks), False, _replaying(b"".join(chunks), True, receive, message)
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                complete = not message.get("more_body", False)
                if complete or size > limit:
                    body = b"".join(chunks)
                    return body, complete, _replaying(body, not complete, receive)
    except TimeoutError:  # too slow: the route, past the same deadline, answers 408
        return b"".join(chunks), False, _replaying(b"".join(chunks), True, receive)


def _replaying(body: bytes, more: bool, receive: Receive, *then: Message) -> Receive:
    """A `receive` that first hands over `body` (and `then`), then whatever `receive` brings."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": more}, *then]

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
