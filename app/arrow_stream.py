"""Arrow IPC stream encoding without materialising tables: schema message, one message per batch, end marker.

The exact body size is known before the first byte is sent (`Content-Length`), which lets clients read
straight into a buffer of the right size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def stream_size(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
    """Exact byte length of `encode_stream(schema, batches)`."""
    return schema.serialize().size + sum(pa.ipc.get_record_batch_size(b) for b in batches) + len(END_OF_STREAM)


def encode_stream(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> Iterator[memoryview]:
    """The IPC stream of `batches`, one chunk per batch, each serialised only when the consumer asks for it."""
    yield memoryview(schema.serialize())
    for batch in batches:
        yield memoryview(batch.serialize())
    yield memoryview(END_OF_STREAM)


def encode_stream_at_once(
    schema: pa.Schema, batches: Sequence[pa.RecordBatch], compression: str | None = None
) -> memoryview:
    """The whole IPC stream in one buffer, written in place (one copy of the data); optionally with IPC body
    compression (`lz4` or `zstd`, which every Arrow reader decompresses by itself)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return memoryview(sink.getvalue())


class _Chunks:
    """A writable file that hands over what was written since the last `drain()`."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def drain(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def encode_compressed_stream(schema: pa.Schema, batches: Sequence[pa.RecordBatch], compression: str) -> Iterator[bytes]:
    """A compressed IPC stream, one chunk per batch (its length is not known in advance)."""
    chunks = _Chunks()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    writer = pa.ipc.new_stream(pa.PythonFile(chunks, mode="w"), schema, options=options)
    yield chunks.drain()
    for batch in batches:
        writer.write_batch(batch)
        yield chunks.drain()
    writer.close()
    yield chunks.drain()


def table_batches(table: pa.Table) -> list[pa.RecordBatch]:
    """A table's record batches (empty tables yield none)."""
    return [b for b in table.to_batches() if b.num_rows]
