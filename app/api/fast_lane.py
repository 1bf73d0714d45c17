"""The fast lane: quick row takes answered right on the event loop, ahead of the framework.

A 256-row take from a mapped segment is a fraction of a millisecond of work, less than the routing, dependency
injection and thread-pool hand-off around it. This ASGI middleware answers the common case of
`POST /datasets/{id}/rows/take` itself: an accepted token, a JSON body that validates, a loaded dataset whose
touched segments this process has mapped already, and a result of at most `EPISERVE_INLINE_READ_BYTES` (0 turns
the lane off). Anything else (every error, a first touch that maps or builds a segment, a large take) goes on,
body intact, to the regular route, which answers it as it always does. The response is the same either way;
only its cost differs.
"""

from __future__ import annotations

from starlette.datastructures import Headers, State
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.api.deps import check_json_content_type, decode_json_body
from app.api.problems import ProblemException
from app.api.rows import TakeRequest, take_ranges, take_response
from app.auth import TokenCheck
from app.errors import EpiserveError, WouldBlock

_TAKE_SUFFIX = "/rows/take"


class FastLane:
    """Serves quick takes itself and hands every other request, untouched, to `app`."""

    def __init__(self, app: ASGIApp, state: State, take_route: BaseRoute) -> None:
        self.app = app
        self.state = state
        self.take_route = take_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith(_TAKE_SUFFIX):
            await self.app(scope, receive, send)
            return
        match, child_scope = self.take_route.matches(scope)
        settings = getattr(self.state, "settings", None)
        if match is not Match.FULL or settings is None or settings.inline_read_bytes == 0:
            await self.app(scope, receive, send)
            return
        body, complete, receive = await _buffer_body(receive, settings.max_body_bytes)
        response = self._quick_take(scope, child_scope["path_params"]["dataset_id"], body) if complete else None
        if response is None:
            await self.app(scope, receive, send)
            return
        scope.update(child_scope)  # the route, as the router would have set it (metrics label it by its path)
        await response(scope, receive, send)

    def _quick_take(self, scope: Scope, dataset_id: str, body: bytes) -> Response | None:
        """The take's response if it can be answered right here without waiting; None otherwise."""
        catalog = getattr(self.state, "catalog", None)
        if catalog is None:
            return None
        headers = Headers(scope=scope)
        if self.state.token_verifier.check(headers.get("authorization")) is not TokenCheck.OK:
            return None
        settings = self.state.settings
        try:
            check_json_content_type(headers.get("content-type"))
            request = decode_json_body(body, TakeRequest)
            ranges = take_ranges(request, settings)
            response = take_response(catalog.get(dataset_id), ranges, request, settings.inline_read_bytes)
        except (ProblemException, EpiserveError, WouldBlock):
            return None  # the regular route answers it (and words every error)
        metrics.INLINE_TAKES.inc()
        return response


async def _buffer_body(receive: Receive, limit: int) -> tuple[bytes, bool, Receive]:
    """Read the request body, up to `limit` bytes. Returns the bytes read, whether that was the whole body, and
    a `receive` that hands the same body (then whatever follows) to the next reader."""
    chunks: list[bytes] = []
    size = 0
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


def _replaying(body: bytes, more: bool, receive: Receive, *then: Message) -> Receive:
    """A `receive` that first hands over `body` (and `then`), then whatever `receive` brings."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": more}, *then]

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
