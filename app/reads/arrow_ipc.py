"""Arrow IPC stream encoding without materialising tables: schema message, one message per batch, end marker.

The stream comes out as chunks to send in order. Column buffers of at least `OWN_CHUNK_BYTES` are chunks of their
own that point into the batch's memory (for stored rows: the memory-mapped segment), so the data is copied once,
by the kernel into the socket; the small pieces between them (message headers, padding, rebased offsets) are
joined. The exact size of an uncompressed stream is known before the first byte is sent (`Content-Length`),
which lets clients read straight into a buffer of the right size. Rows an answer has not copied into its buffers
yet (`PendingCopies`) are sent from where they lie.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from app.reads.pending_copies import PendingCopies

ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
OWN_CHUNK_BYTES = 64 * 1024

Chunk = bytes | memoryview  # one piece of an encoded stream, sent as it is


def stream_size(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
    """Exact byte length of the uncompressed `encode_stream(schema, batches)`."""
    return schema.serialize().size + sum(pa.ipc.get_record_batch_size(b) for b in batches) + len(END_OF_STREAM)


def encode_whole(
    schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    compression: str | None = None,
    pending: PendingCopies | None = None,
) -> pa.Buffer:
    """The whole IPC stream in one buffer, written by Arrow itself. It copies the data (the `pending` rows are
    copied into place first), which for a small answer (no buffer as large as `OWN_CHUNK_BYTES`) costs less than
    collecting chunks."""
    if pending:
        pending.make()
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def encode_stream(
    schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    compression: str | None = None,
    pending: PendingCopies | None = None,
) -> Iterator[list[Chunk]]:
    """The IPC stream of `batches`: one list of chunks for the schema, one per batch (encoded only when the
    consumer gets to it) and one for the end marker. With `compression` (`lz4` or `zstd`, which every Arrow
    reader decompresses by itself) the batch bodies are compressed. The `pending` rows of the batches' buffers
    are sent from their sources (made in place first when compressing, which reads every byte)."""
    encoder = StreamEncoder(schema, compression)
    yield encoder.start()
    for batch in batches:
        yield encoder.batch(batch, pending)
    yield encoder.end()


class StreamEncoder:
    """One IPC stream encoded a batch at a time, each batch with the pending copies of its own piece of rows."""

    def __init__(self, schema: pa.Schema, compression: str | None = None) -> None:
        self.schema, self.compression = schema, compression
        self._chunks = _Chunks()
        options = pa.ipc.IpcWriteOptions(compression=compression)
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._chunks, mode="w"), schema, options=options)

    def start(self) -> list[Chunk]:
        """The schema message."""
        return self._chunks.drain()

    def batch(self, batch: pa.RecordBatch, pending: PendingCopies | None = None) -> list[Chunk]:
        """The message of `batch`, whose unfilled rows are `pending` (sent from their sources, or made first when
        compressing)."""
        if pending and self.compression is not None:
            pending.make()
        self._chunks.pending = pending
        self._writer.write_batch(batch)
        return self._chunks.drain()

    def end(self) -> list[Chunk]:
        """The end-of-stream marker."""
        self._writer.close()
        return self._chunks.drain()


class _Chunks:
    """A writable file that keeps large writes as they are: Arrow hands over its buffers, not copies."""

    def __init__(self, pending: PendingCopies | None = None) -> None:
        self.pending = pending
        self.chunks: list[Chunk] = []
        self.small: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | pa.Buffer) -> int:
        view = memoryview(data)
        pieces = None
        if self.pending and isinstance(data, pa.Buffer):
            pieces = self.pending.pieces(data.address, view.nbytes)
        if view.nbytes >= OWN_CHUNK_BYTES:
            self._join_small()
            self.chunks.extend(pieces or [view])
        else:
            self.small.extend([piece.tobytes() for piece in pieces] if pieces else [view.tobytes()])
        return view.nbytes

    def _join_small(self) -> None:
        if self.small:
            self.chunks.append(b"".join(self.small))
            self.small = []

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def drain(self) -> list[Chunk]:
        """What was written since the last drain."""
        self._join_small()
        chunks, self.chunks = self.chunks, []
        return chunks
