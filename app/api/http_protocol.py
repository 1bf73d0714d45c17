"""uvicorn's httptools protocol with a bounded request head and a send timeout: at most `max_bytes` of request
line and headers, received within `timeout_s` of the connection opening or of the head's first byte; and a
response the client stops reading is cut off after `send_timeout_s` without progress.

Neither uvicorn nor httptools bounds either: a 1 MiB header is parsed, and a client that sends its head a byte at
a time holds its connection (and a file descriptor) for as long as it likes. Beyond the size the server answers
431, beyond the time 408 (or closes silently when nothing was sent at all), and closes the connection either way.
The body's own deadline is kept where the body is read (`app.api.json_body.read_json_body`); the rest
of a body the response did not wait for gets as long as a head.

A client that stops reading its response (a trainer pausing for a checkpoint with requests in flight) leaves the
unsent rest of it in the server's memory: the transport's write buffer holds what the socket did not take, and the
response holds what it has not sent yet. Once the transport's buffer is full, uvicorn pauses the response
(`pause_writing`); if it is not resumed within `send_timeout_s`, the connection is aborted, which frees both. A
client reading slowly but steadily resumes it each time and is never cut off.

A response's head and a small body go out in one system call (`app.api.coalesced_writes`), and a large chunk of a
chunked body goes out beside its framing, not copied into one string with it (`_chunks_framed_in_place`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from app.api.coalesced_writes import CoalescedWrites

if TYPE_CHECKING:
    from starlette.types import Message  # the web framework: not for the supervisor, which only names this module


@dataclass(frozen=True)
class HeadLimits:
    """How large a request head may be, how long it may take to arrive, and how long a response may wait for the
    client to read on."""

    max_bytes: int
    timeout_s: float
    send_timeout_s: float = 60.0


class _HeadTooLarge(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` refusing request heads that are too large (431) or too slow (408)."""

    def __init__(self, *args: Any, limits: HeadLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._in_head = False
        self._between_requests = True
        self._head_bytes = 0  # bytes received while the head is incomplete (httptools buffers a partial header)
        self._head_size = 0  # request line and headers as parsed
        self._head_too_large = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescedWrites(transport, self.loop))  # type: ignore[arg-type]
        self._arm_head_timer()  # a connection that never sends a head is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_send_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        self._cancel_send_timer()
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        # Data that starts at a request boundary or inside a head belongs to the head up to its end (a chunk that
        # ends a body and starts the next head is not counted: that head is at most one read larger).
        counted = self._in_head or self._between_requests
        super().data_received(data)
        if self._in_head and counted:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_bytes:
                self._refuse(431, self._too_large_detail())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._between_requests = False
        self._head_bytes = 0
        self._head_size = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._between_requests = True
        self._cancel_head_timer()  # the unread-body timer, if the response went first

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._between_requests and not self.transport.is_closing():
            # Answered before its body arrived (a 413 on the declared length, a route that reads none): the rest
            # may follow, but no slower than a head would, or uvicorn's keep-alive timer (reset by every byte)
            # would hold the connection for as long as the client trickles.
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(self.limits.timeout_s, self._unread_body_timed_out)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head_size += len(name) + len(value) + 4

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_size += len(url)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if self._head_size > self.limits.max_bytes:  # a head that arrived whole, in one read
            self._head_too_large = True
            raise _HeadTooLarge  # stops the parser; uvicorn answers through send_400_response
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not before:
            self.cycle.send = _chunks_framed_in_place(self.cycle)  # type: ignore[method-assign]

    def send_400_response(self, msg: str) -> None:
        if self._head_too_large:
            self._refuse(431, self._too_large_detail())
        else:
            super().send_400_response(msg)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(408, f"the request line and headers did not arrive within {self.limits.timeout_s:g} s")
        elif self.cycle is None and not self.transport.is_closing():
            self.transport.close()  # connected and sent nothing

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing() or self.transport.get_write_buffer_size():
            self.logger.warning(
                "%s: read nothing of its response for %g s; connection closed",
                _client(self.client),
                self.limits.send_timeout_s,
            )
            self.transport.abort()  # drops the unsent rest (close() would wait for the client to read it)

    def _too_large_detail(self) -> str:
        return f"the request line and headers exceed {self.limits.max_bytes} bytes"

    def _unread_body_timed_out(self) -> None:
        self._head_timer = None
        if not self._between_requests and not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, detail: str) -> None:
        """Answer `status` as a problem document (unless a response is under way) and close the connection."""
        self._in_head = False
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        self.logger.warning("%s: %s", _client(self.client), detail)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_problem_response(status, detail))
        self.transport.close()


def _chunks_framed_in_place(cycle: RequestResponseCycle) -> Callable[[Message], Awaitable[None]]:
    """`cycle.send`, except that a large chunk of a chunked body goes to the transport beside its framing
    (`writelines`) instead of joined with it into a new bytes object, as uvicorn does: a copy of every byte of
    the body, into fresh memory. Everything else (the head, small or last chunks, lengths known, HEAD) is
    uvicorn's own send."""
    send = cycle.send

    async def framed(message: Message) -> None:
        body = message.get("body", b"") if message["type"] == "http.response.body" else b""
        if (
            len(body) < FRAMED_IN_PLACE_BYTES
            or not message.get("more_body", False)
            or not cycle.chunked_encoding
            or not cycle.response_started
            or cycle.response_complete
            or cycle.scope["method"] == "HEAD"
        ):
            await send(message)
            return
        if cycle.flow.write_paused and not cycle.disconnected:  # as uvicorn's send waits
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        cycle.transport.writelines([b"%x\r\n" % len(body), body, b"\r\n"])

    return framed


FRAMED_IN_PLACE_BYTES = 64 * 1024


def _client(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "client"


def _problem_response(status: int, detail: str) -> bytes:
    """The whole HTTP response of a problem (`app.api.problems.problem`), as written straight to the transport."""
    from app.api.problems import problem  # the web framework: not for the supervisor, which only names this class

    response = problem(status, detail, headers={"Connection": "close"})
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode("ascii")]
    lines.extend(name + b": " + value for name, value in response.raw_headers)
    return b"\r\n".join(lines) + b"\r\n\r\n" + response.body
