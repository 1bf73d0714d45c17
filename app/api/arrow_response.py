"""Arrow IPC stream responses: exact Content-Length, column buffers sent from where they lie (no copy of the data).

`ArrowChunksResponse` sends a stream already encoded into chunks (small answers, such as takes).
`ArrowStreamResponse` encodes a large stream batch by batch as the connection takes it. Starlette's
`StreamingResponse` would run a synchronous body iterator through the thread pool, one hand-off per chunk, plus a
task group watching for the client leaving; for a 15 MB range that machinery cost more server CPU than the bytes.
Here each batch is encoded on the event loop right before it is sent (only its message header is new; larger
batches, such as windowed answers, are cut into slices first), and the stream stops as soon as the client goes
away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pyarrow as pa
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.reads.arrow_ipc import (
    ARROW_STREAM_MEDIA_TYPE,
    OWN_CHUNK_BYTES,
    Chunk,
    encode_stream,
    encode_whole,
    stream_size,
)
from app.reads.pending_copies import PendingCopies
from app.reads.service import Answer

_PIECE_BYTES = 16 * 1024 * 1024  # larger batches (windowed answers) are sent as slices: the loop never waits long
_SINGLE_PIECE_BYTES = 4 * 1024 * 1024


def arrow_response(answer: Answer) -> Response:
    """The answer as an Arrow IPC stream response: small bodies encoded at once (tiny ones into one buffer),
    large ones batch by batch as they are sent (compressed ones without a known length). Rows the answer left
    pending are sent from where they lie, uncompressed."""
    schema, batches, codec, pending = answer.schema, answer.batches, answer.codec, answer.pending
    headers = {**answer.headers, "X-Row-Count": str(sum(b.num_rows for b in batches))}
    if codec is not None:
        headers["X-Arrow-Compression"] = codec
    if sum(b.get_total_buffer_size() for b in batches) < OWN_CHUNK_BYTES:  # nbytes costs ~16 us a batch
        return ArrowChunksResponse([memoryview(encode_whole(schema, batches, codec, pending))], headers)
    size = stream_size(schema, batches)
    if size <= _SINGLE_PIECE_BYTES:
        chunks = [chunk for chunks in encode_stream(schema, batches, codec, pending) for chunk in chunks]
        return ArrowChunksResponse(chunks, headers)
    if codec is not None:
        joined = (b"".join(chunks) for chunks in encode_stream(schema, batches, codec, pending))
        return StreamingResponse(joined, media_type=ARROW_STREAM_MEDIA_TYPE, headers=headers)
    return ArrowStreamResponse(schema, batches, headers, size, pending)


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


class ArrowStreamResponse(Response):
    """`schema` and `batches` as one Arrow IPC stream of known length (`size`, computed when not given)."""

    media_type = ARROW_STREAM_MEDIA_TYPE

    def __init__(
        self,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        headers: dict[str, str],
        size: int | None = None,
        pending: PendingCopies | None = None,
    ) -> None:
        pieces = bounded(batches, _PIECE_BYTES)
        if size is None or len(pieces) != len(batches):
            size = stream_size(schema, pieces)
        super().__init__(headers={**headers, "Content-Length": str(size)})
        self.schema = schema
        self.batches = pieces
        self.pending = pending

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            for chunks in encode_stream(self.schema, self.batches, pending=self.pending):
                for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await asyncio.sleep(0)  # a send to a closed connection returns at once: let `gone` see it
                if gone.done():
                    return  # nobody reads the rest
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()


class ArrowChunksResponse(Response):
    """A whole Arrow IPC stream, already encoded into `chunks`, sent without joining them."""

    media_type = ARROW_STREAM_MEDIA_TYPE

    def __init__(self, chunks: list[Chunk], headers: dict[str, str]) -> None:
        super().__init__(headers={**headers, "Content-Length": str(sum(len(chunk) for chunk in chunks))})
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
