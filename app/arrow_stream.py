"""Arrow IPC stream encoding without materialising tables: schema message, one message per batch, end marker.

The stream comes out as parts to send in order. Column buffers of at least `OWN_PART_BYTES` are parts of their
own that point into the batch's memory (for stored rows: the memory-mapped segment), so the data is copied once,
by the kernel into the socket; the small pieces between them (message headers, padding, rebased offsets) are
joined. The exact size of an uncompressed stream is known before the first byte is sent (`Content-Length`),
which lets clients read straight into a buffer of the right size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
OWN_PART_BYTES = 64 * 1024

Part = bytes | memoryview


def stream_size(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
    """Exact byte length of the uncompressed `encode_stream(schema, batches)`."""
    return schema.serialize().size + sum(pa.ipc.get_record_batch_size(b) for b in batches) + len(END_OF_STREAM)


def encode_whole(schema: pa.Schema, batches: Sequence[pa.RecordBatch], compression: str | None = None) -> pa.Buffer:
    """The whole IPC stream in one buffer, written by Arrow itself. It copies the data, which for a small answer
    (no buffer as large as `OWN_PART_BYTES`) costs less than collecting parts."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def encode_stream(
    schema: pa.Schema, batches: Sequence[pa.RecordBatch], compression: str | None = None
) -> Iterator[list[Part]]:
    """The IPC stream of `batches`: one list of parts for the schema, one per batch (encoded only when the
    consumer gets to it) and one for the end marker. With `compression` (`lz4` or `zstd`, which every Arrow
    reader decompresses by itself) the batch bodies are compressed."""
    parts = _Parts()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    writer = pa.ipc.new_stream(pa.PythonFile(parts, mode="w"), schema, options=options)
    yield parts.drain()
    for batch in batches:
        writer.write_batch(batch)
        yield parts.drain()
    writer.close()
    yield parts.drain()


class _Parts:
    """A writable file that keeps large writes as they are: Arrow hands over its buffers, not copies."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.small: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | pa.Buffer) -> int:
        view = memoryview(data)
        if view.nbytes >= OWN_PART_BYTES:
            self._join_small()
            self.parts.append(view)
        else:
            self.small.append(view.tobytes())
        return view.nbytes

    def _join_small(self) -> None:
        if self.small:
            self.parts.append(b"".join(self.small))
            self.small = []

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def drain(self) -> list[Part]:
        """What was written since the last drain."""
        self._join_small()
        parts, self.parts = self.parts, []
        return parts


def table_batches(table: pa.Table) -> list[pa.RecordBatch]:
    """A table's record batches (empty tables yield none)."""
    return [b for b in table.to_batches() if b.num_rows]
