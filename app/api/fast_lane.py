"""The fast lane: quick row reads answered right on the event loop, ahead of the framework.

A 256-row take from a mapped segment is a fraction of a millisecond of work, less than the routing, dependency
injection and thread-pool hand-off around it; a contiguous slice of mapped segments is zero-copy views, sent on
the event loop anyway. This ASGI middleware answers the common cases itself:

- `POST /datasets/{id}/rows/take`: an accepted token, no query, a JSON body that validates, a loaded dataset whose
  touched segments this process has mapped already, and a result of at most `EPISERVE_INLINE_READ_BYTES`;
- `GET /datasets/{id}/rows` with only `episodes`, `start`, `stop` and `columns` in its query (no windows, no
  compression, no `If-None-Match`), an accepted token, and segments this process has mapped already.

A take's body is read here only if its declared length is within `EPISERVE_MAX_BODY_BYTES` (else the route
answers 413 before a byte of it is read), and only until the request's body deadline (`EPISERVE_BODY_TIMEOUT_S`,
shared with the route, which then answers 408).

`EPISERVE_INLINE_READ_BYTES=0` turns the lane off. Anything else (every error, a first touch that maps or builds
a segment, a large take) goes on, body intact, to the regular route, which answers it as it always does. The
response is the same either way; only its cost differs.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import anyio
from starlette.datastructures import Headers, State
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.api.deps import body_deadline, check_declared_length, check_json_content_type, decode_json_body
from app.api.problems import ProblemException
from app.api.rows import MAX_ROW, SliceRequest, TakeRequest, columns_of, slice_response, take_ranges, take_response
from app.auth import TokenCheck
from app.errors import EpiserveError, WouldBlock

_TAKE_SUFFIX = "/rows/take"
_SLICE_SUFFIX = "/rows"
_SLICE_PARAMETERS = frozenset({"episodes", "start", "stop", "columns"})
_MAX_ROW_DIGITS = len(str(MAX_ROW))  # longer ones (leading zeros aside) are the route's to refuse


class FastLane:
    """Serves quick takes and slices itself and hands every other request, untouched, to `app`."""

    def __init__(self, app: ASGIApp, state: State, take_route: BaseRoute, slice_route: BaseRoute) -> None:
        self.app = app
        self.state = state
        self.take_route = take_route
        self.slice_route = slice_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = getattr(self.state, "settings", None)
        if scope["type"] != "http" or settings is None or settings.inline_read_bytes == 0:
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and path.endswith(_TAKE_SUFFIX):
            await self._take(scope, receive, send)
        elif method == "GET" and path.endswith(_SLICE_SUFFIX):
            await self._slice(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _take(self, scope: Scope, receive: Receive, send: Send) -> None:
        match, child_scope = self.take_route.matches(scope)
        response = None
        settings = self.state.settings
        # A query (422), or a body declared over the limit (413, before a byte of it is read), is the route's.
        if match is Match.FULL and not scope["query_string"] and _declared_within(scope, settings.max_body_bytes):
            deadline = body_deadline(scope, settings.body_timeout_s)
            body, complete, receive = await _buffer_body(receive, settings.max_body_bytes, deadline)
            if complete:
                response = self._quick_take(scope, child_scope["path_params"]["dataset_id"], body)
        await self._answer(response, child_scope, scope, receive, send)

    async def _slice(self, scope: Scope, receive: Receive, send: Send) -> None:
        match, child_scope = self.slice_route.matches(scope)
        response = self._quick_slice(scope, child_scope["path_params"]["dataset_id"]) if match is Match.FULL else None
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

    def _accepted(self, headers: Headers) -> bool:
        return getattr(self.state, "catalog", None) is not None and (
            self.state.token_verifier.check(headers.get("authorization")) is TokenCheck.OK
        )

    def _quick_take(self, scope: Scope, dataset_id: str, body: bytes) -> Response | None:
        """The take's response if it can be answered right here without waiting; None otherwise."""
        headers = Headers(scope=scope)
        if not self._accepted(headers):
            return None
        settings = self.state.settings
        try:
            check_json_content_type(headers.get("content-type"))
            request = decode_json_body(body, TakeRequest)
            ranges = take_ranges(request, settings)
            response = take_response(self.state.catalog.get(dataset_id), ranges, request, settings.inline_read_bytes)
        except (ProblemException, EpiserveError, WouldBlock):
            return None  # the regular route answers it (and words every error)
        metrics.INLINE_TAKES.inc()
        return response

    def _quick_slice(self, scope: Scope, dataset_id: str) -> Response | None:
        """The slice's response if it can be answered right here without waiting; None otherwise."""
        headers = Headers(scope=scope)
        if "if-none-match" in headers or not self._accepted(headers):
            return None
        selection = _plain_slice(scope["query_string"])
        if selection is None:
            return None
        try:
            dataset = self.state.catalog.get(dataset_id)
            response = slice_response(dataset, self.state.settings, selection, None, inline=True)
        except (ProblemException, EpiserveError, WouldBlock):
            return None
        metrics.INLINE_SLICES.inc()
        return response


def _plain_slice(query: bytes) -> SliceRequest | None:
    """The selection of a query holding only well-formed `episodes`, `start`, `stop` and `columns`, each at most
    once; None for anything else, which the route validates and answers."""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    values = dict(pairs)
    if len(values) != len(pairs) or not values.keys() <= _SLICE_PARAMETERS:
        return None
    given: dict[str, object] = {"episodes": values.get("episodes"), "columns": columns_of(values.get("columns"))}
    for name in ("start", "stop"):
        text = values.get(name)
        if text is not None:
            if not (text.isascii() and text.isdigit()) or len(text) > _MAX_ROW_DIGITS or int(text) > MAX_ROW:
                return None
            given[name] = int(text)
    return SliceRequest.model_construct(**given)  # every other field at its default


def _declared_within(scope: Scope, limit: int) -> bool:
    """Whether the request's Content-Length, if any, is within `limit`."""
    try:
        check_declared_length(Headers(scope=scope).get("content-length"), limit)
    except ProblemException:
        return False
    return True


async def _buffer_body(receive: Receive, limit: int, deadline: float) -> tuple[bytes, bool, Receive]:
    """Read the request body, up to `limit` bytes and until `deadline`. Returns the bytes read, whether that was
    the whole body, and a `receive` that hands the same body (then whatever follows) to the next reader."""
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(deadline - anyio.current_time()):
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
