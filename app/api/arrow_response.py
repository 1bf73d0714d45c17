"""Arrow IPC stream responses: column buffers sent from where they lie (no copy of the data), in sends of at most
`SEND_BYTES`, each response holding its bytes on the in-flight budget (`app.api.inflight`) until it is sent.

`ArrowChunksResponse` sends a stream already encoded into chunks (small answers, such as takes).
`ArrowStreamResponse` encodes a large stream of known length batch by batch as the connection takes it. Starlette's
`StreamingResponse` would run a synchronous body iterator through the thread pool, one hand-off per chunk, plus a
task group watching for the client leaving; for a 15 MB range that machinery cost more server CPU than the bytes.
Here each batch is encoded on the event loop right before it is sent (only its message header is new; larger
batches, such as windowed answers, are cut into slices first), and the stream stops as soon as the client goes
away. `ArrowPiecesResponse` sends an answer read piece by piece (`app.reads.pieces`), or a large compressed one,
chunked: each next piece is read in the thread pool while the one before is sent when the spare half of the
budget has room for it, else once the one before is sent and the budget has room; and compressed batch by
batch. The first two send `Content-Length`; the last, whose size is not known in advance, is chunked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence

import anyio
import pyarrow as pa
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from app.api.inflight import Hold
from app.api.observability import CUT_SHORT
from app.errors import ProblemError
from app.reads.arrow_ipc import (
    ARROW_STREAM_MEDIA_TYPE,
    OWN_CHUNK_BYTES,
    Chunk,
    StreamEncoder,
    encode_stream,
    encode_whole,
    stream_size,
)
from app.reads.pieces import PIECE_BYTES, Piece, RowPieces
from app.reads.service import Answer

_SINGLE_PIECE_BYTES = 4 * 1024 * 1024
SEND_BYTES = 1024 * 1024  # at most this much per send: the transport copies only the unsent rest of one send
FIRST_HOLD_BYTES = PIECE_BYTES + SEND_BYTES  # what a read waits for on the in-flight budget before it starts
log = logging.getLogger("episerve")


def arrow_response(answer: Answer, hold: Hold | None = None) -> Response:
    """The answer as an Arrow IPC stream response: small bodies encoded at once (tiny ones into one buffer),
    large ones batch by batch as they are sent, answers read in pieces piece by piece (those, and compressed ones,
    without a known length: chunked). Rows the answer left pending are sent from where they lie, uncompressed.
    `hold`: the answer's bytes on the in-flight budget, set here to the memory it holds (never the camera frames it
    sends from the maps) and released once it is sent."""
    schema, batches, codec, pending = answer.schema, answer.batches, answer.codec, answer.pending
    headers = {**answer.headers, "X-Row-Count": str(answer.row_count)}
    if codec is not None:
        headers["X-Arrow-Compression"] = codec
    if answer.rest is not None:
        return ArrowPiecesResponse(Piece(schema, batches, pending), answer.rest, headers, codec, hold)
    if sum(b.get_total_buffer_size() for b in batches) < OWN_CHUNK_BYTES:  # nbytes costs ~16 us a batch
        chunks: list[Chunk] = [memoryview(encode_whole(schema, batches, codec, pending))]
        return ArrowChunksResponse(chunks, headers, _held(hold, chunks[0].nbytes))
    size = stream_size(schema, batches)
    owned = _owned_bytes(answer, size)
    if size <= _SINGLE_PIECE_BYTES:
        chunks = [chunk for chunks in encode_stream(schema, batches, codec, pending) for chunk in chunks]
        return ArrowChunksResponse(chunks, headers, _held(hold, owned))
    if codec is not None:
        return ArrowPiecesResponse(Piece(schema, batches, pending), None, headers, codec, hold)
    return ArrowStreamResponse(Piece(schema, batches, pending), headers, size, _held(hold, owned))


def _owned_bytes(answer: Answer, size: int) -> int:
    """Memory of its own an answer whose stream is `size` bytes holds until it is sent: none when its batches are
    views of the maps, else its stream less the frames it leaves pending when sent uncompressed (they go to the
    socket from the maps: a take of camera frames from decoded-frame segments holds its stored columns alone)."""
    if not answer.owned:
        return 0
    if answer.pending is None or answer.codec is not None:
        return size
    return size - answer.pending.nbytes


def _held(hold: Hold | None, owned: int) -> Hold | None:
    """`hold` set to an answer's `owned` bytes plus what the transport may buffer of one send."""
    if hold is not None:
        hold.set(owned + SEND_BYTES)
    return hold


def bounded(batches: Sequence[pa.RecordBatch], max_bytes: int) -> list[pa.RecordBatch]:
    """`batches`, with any larger than `max_bytes` cut into zero-copy slices of about that size."""
    pieces = []
    for batch in batches:
        size = batch.nbytes
        if size <= max_bytes or batch.num_rows < 2:
            pieces.append(batch)
            continue
        step = max(1, batch.num_rows * max_bytes // size)
        pieces.extend(batch.slice(start, step) for start in range(0, batch.num_rows, step))
    return pieces


def sends(chunks: Sequence[Chunk]) -> Iterator[Chunk]:
    """`chunks` cut into pieces of at most `SEND_BYTES` (zero-copy views)."""
    for chunk in chunks:
        if len(chunk) <= SEND_BYTES:
            yield chunk
            continue
        view = memoryview(chunk).cast("B")
        for start in range(0, view.nbytes, SEND_BYTES):
            yield view[start : start + SEND_BYTES]


class _HeldResponse(Response):
    """A response that releases its bytes on the in-flight budget once it is done, however it ends."""

    hold: Hold | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.send_body(scope, receive, send)
        finally:
            if self.hold is not None:
                self.hold.release()

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class ArrowStreamResponse(_HeldResponse):
    """The rows of `piece` as one Arrow IPC stream of known length (`size`, computed when not given)."""

    media_type = ARROW_STREAM_MEDIA_TYPE

    def __init__(
        self, piece: Piece, headers: dict[str, str], size: int | None = None, hold: Hold | None = None
    ) -> None:
        pieces = bounded(piece.batches, PIECE_BYTES)
        if size is None or len(pieces) != len(piece.batches):
            size = stream_size(piece.schema, pieces)
        super().__init__(headers={**headers, "Content-Length": str(size)})
        self.schema = piece.schema
        self.batches = pieces
        self.pending = piece.pending
        self.hold = hold

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            for chunks in encode_stream(self.schema, self.batches, pending=self.pending):
                if not await _sent(chunks, send, gone):
                    return  # nobody reads the rest
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()


class ArrowPiecesResponse(_HeldResponse):
    """An Arrow IPC stream of unknown length (chunked): the `first` piece of an answer, then each piece of `rest`,
    read in the thread pool (among the row reads) while the piece before is sent when it holds camera frames and
    the spare half of the in-flight budget has room for it right away, else once the piece before is sent and the
    budget has room; with `codec`, each batch compressed as it is sent. Reading ahead keeps decoding camera frames
    from waiting on the socket, and the socket on decoding; a client that stops reading holds at most two pieces,
    the second only while the budget is at most half spent."""

    media_type = ARROW_STREAM_MEDIA_TYPE

    def __init__(
        self, first: Piece, rest: RowPieces | None, headers: dict[str, str], codec: str | None, hold: Hold | None
    ) -> None:
        super().__init__(headers=headers)
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        if codec is None:
            self.raw_headers.append((EXPECTED_LENGTH, str(expected_length(first, rest)).encode()))
        self.first, self.rest, self.codec = first, rest, codec
        self.hold = _held(hold, first.held_bytes(codec))

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnect(receive))
        encoder = StreamEncoder(self.first.schema, self.codec)
        ahead: asyncio.Future[Piece] | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            piece: Piece | None = self.first
            if not await _sent(encoder.start(), send, gone):
                return
            rows = 0
            while piece is not None:
                ahead = self._read_ahead(scope, piece)
                for batch in bounded(piece.batches, PIECE_BYTES):
                    if not await _sent(encoder.batch(batch, piece.pending), send, gone):
                        return
                    rows += batch.num_rows
                try:
                    piece = await ahead if ahead is not None else await self._next_piece(scope)
                except Exception as exc:  # too late for an error status: the stream stays unfinished
                    _cut_short(scope, rows, exc)
                    return
                finally:
                    ahead = None
                if piece is not None and self.hold is not None:
                    self.hold.set(SEND_BYTES + piece.held_bytes(self.codec))  # the piece sent is gone
            await _sent(encoder.end(), send, gone)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            if ahead is not None:
                ahead.cancel()  # its thread finishes on its own; nobody takes its piece

    def _read_ahead(self, scope: Scope, current: Piece) -> asyncio.Future[Piece] | None:
        """The next piece, being read in the pool while `current` is sent, when there is one worth reading ahead
        (`RowPieces.read_ahead`: camera frames) and the spare half of the budget has room for it right now."""
        rest = self.rest
        if rest is None or not rest.remaining or not rest.read_ahead:
            return None
        expected = int(rest.next_rows() * rest.row_bytes)
        held = SEND_BYTES + current.held_bytes(self.codec) + expected
        if self.hold is not None and not self.hold.try_grow_into_spare(held):
            return None
        return asyncio.ensure_future(self._read_next(scope, rest, current))

    async def _read_next(self, scope: Scope, rest: RowPieces, current: Piece) -> Piece:
        """The next piece, read in the pool; then the hold counts what it holds instead of the guess it was read
        under (which counts frames left to be sent from the maps: those hold nothing), even while the reader
        stops with `current` half sent."""
        piece = await _in_pool(scope, rest.next_piece)
        if self.hold is not None:
            self.hold.settle(SEND_BYTES + current.held_bytes(self.codec) + piece.held_bytes(self.codec))
        return piece

    async def _next_piece(self, scope: Scope) -> Piece | None:
        """The next piece of the answer (None after the last), read once the budget has room for it."""
        rest = self.rest
        if rest is None or not rest.remaining:
            return None
        if self.hold is not None:
            self.hold.set(SEND_BYTES)
            await self.hold.grow_to(SEND_BYTES + int(rest.next_rows() * rest.row_bytes))
        return await _in_pool(scope, rest.next_piece)


# A chunked answer's length, estimated a little over (a client reads the body into one buffer of that size instead of
# growing one as chunks arrive, each growth a copy of what came before and fresh memory to fault in).
EXPECTED_LENGTH = b"x-expected-length"


def expected_length(first: Piece, rest: RowPieces | None) -> int:
    """About how many bytes the uncompressed stream of `first` and the pieces of `rest` takes, rounded up: their
    buffers (the rest's at the bytes per row read so far), 1/64 over, plus room for each piece's message."""
    later = int(rest.remaining * rest.row_bytes) if rest is not None else 0
    pieces = 1 + -(-later // PIECE_BYTES)
    body = first.nbytes + later
    return body + body // 64 + (pieces + 2) * 4096


async def _in_pool(scope: Scope, read: Callable[[], Piece]) -> Piece:
    """`read()` in the thread pool, among the row reads of this process (`app.state.read_limiter`)."""
    state = scope["app"].state if "app" in scope else None
    return await anyio.to_thread.run_sync(read, limiter=getattr(state, "read_limiter", None))


class ArrowChunksResponse(_HeldResponse):
    """A whole Arrow IPC stream, already encoded into `chunks`, sent without joining them."""

    media_type = ARROW_STREAM_MEDIA_TYPE

    def __init__(self, chunks: list[Chunk], headers: dict[str, str], hold: Hold | None = None) -> None:
        super().__init__(headers={**headers, "Content-Length": str(sum(len(chunk) for chunk in chunks))})
        self.chunks = chunks
        self.hold = hold

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for chunk in sends(self.chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def arrow_streams_response(answers: Sequence[Answer], headers: dict[str, str], hold: Hold | None) -> Response:
    """Answers read whole (quick ones: one piece each, uncompressed) as their streams one after another in one
    body of known length, encoded now: only message headers are new, the data is sent from where it lies. `hold`
    is set to the bytes of the answers that hold memory of their own."""
    chunks: list[Chunk] = []
    owned = 0
    for answer in answers:
        assert answer.rest is None and answer.codec is None, "read whole, uncompressed"
        start = len(chunks)
        for encoded in encode_stream(answer.schema, answer.batches, None, answer.pending):
            chunks.extend(encoded)
        owned += _owned_bytes(answer, sum(len(chunk) for chunk in chunks[start:]))
    return ArrowChunksResponse(chunks, headers, _held(hold, owned))


PartAnswer = Callable[[], Awaitable[Response]]


class ArrowStreamsResponse(Response):
    """Several answers' Arrow IPC streams one after another in one body (`POST /takes`), in order.

    Each part is sent as its own response would send it (from where its rows lie, holding its bytes on the
    in-flight budget until they are sent), without its status line and without ending the body. `made` are parts
    answered already; each of `later` is answered only once the part before it is sent, so the request holds one
    part's bytes at a time beyond those. `hold`, if any, is released once the body is sent. The body has a
    `Content-Length` when every part is made and states one, else it is chunked. A part that cannot be answered or
    sent in full (a problem once the status is out, or the client gone) leaves the body unfinished: the connection
    closes and no reader takes it for a whole answer."""

    media_type = ARROW_STREAM_MEDIA_TYPE

    def __init__(
        self, made: list[Response], later: list[PartAnswer], headers: dict[str, str], hold: Hold | None = None
    ) -> None:
        super().__init__(headers=headers)
        self.hold = hold
        lengths = [part.headers.get("content-length") for part in made]
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        if not later and all(length is not None for length in lengths):
            self.raw_headers.append((b"content-length", str(sum(map(int, lengths))).encode()))  # type: ignore[arg-type]
        self.made, self.later = made, later

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rows = 0
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            for part in [*self.made, *self.later]:
                try:
                    response = part if isinstance(part, Response) else await part()
                except Exception as exc:  # too late for an error status: the body stays unfinished
                    _cut_short(scope, rows, exc)
                    return
                if not await _sent_as_part(response, scope, receive, send):
                    return
                rows += int(response.headers.get("x-row-count", "0"))
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            for response in self.made:  # those never sent still hold their bytes
                if isinstance(response, _HeldResponse) and response.hold is not None:
                    response.hold.release()
            if self.hold is not None:
                self.hold.release()


async def _sent_as_part(response: Response, scope: Scope, receive: Receive, send: Send) -> bool:
    """Send `response`'s body as part of a larger one; whether it was sent whole."""
    finished = False

    async def part_send(message: Message) -> None:
        nonlocal finished
        if message["type"] != "http.response.body":
            return  # its own status line: the larger body has one
        if not message.get("more_body", False):
            finished = True  # its end of body: the larger body goes on
            return
        await send(message)

    await response(scope, receive, part_send)
    return finished


def _cut_short(scope: Scope, rows: int, exc: Exception) -> None:
    """Log, in one line, an answer that a problem in a later piece cuts short. The response returns without its
    last chunk, so the server closes the connection and every reader sees an incomplete body, never a shorter
    answer; a problem the client caused is no server error, and a traceback per such answer would flood the log."""
    detail = exc.detail if isinstance(exc, ProblemError) else f"{type(exc).__name__}: {exc}"
    status = exc.status if isinstance(exc, ProblemError) else 500
    scope[CUT_SHORT] = status  # the access log and metrics record it, not a client that left (499)
    level = logging.WARNING if status < 500 else logging.ERROR
    log.log(level, "%s %s: answer cut short after %d rows: %s", scope.get("method"), scope.get("path"), rows, detail)


async def _sent(chunks: list[Chunk], send: Send, gone: asyncio.Future[None]) -> bool:
    """Send `chunks` (in pieces of at most `SEND_BYTES`); False when the client has gone away."""
    for chunk in sends(chunks):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await asyncio.sleep(0)  # a send to a closed connection returns at once: let `gone` see it
    return not gone.done()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
