"""Camera frames that came encoded (`Client(frames="encoded")`): decoded here, in the process that reads them (a
DataLoader worker), so the server's cores and the network carry JPEG bytes instead of raw pixels.

The server marks an encoded camera column by its field metadata (`episerve.encoding`, `shape`); each such column
becomes the fixed-shape uint8 (H, W, C) tensor column the server would have sent as pixels, so everything after the
read (batches, LeRobot samples, mixtures) is the same for both. JPEGs are decoded by libjpeg-turbo through
`simplejpeg`, with the accurate DCT and upsampling, so the pixels equal the server's decode of the same bytes.

Each column is decoded into one block of memory, and a block nothing refers to any more (its batch converted and
dropped, as a DataLoader worker does every batch) is decoded into again: the first write to fresh memory costs a
fifth of a 480x640 decode on these machines, and a batch's block is tens of MB.
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np
import pyarrow as pa

from episerve._errors import EpiserveError
from episerve._extras import install_hint

ENCODING_KEY, SHAPE_KEY = b"episerve.encoding", b"shape"
FRAMES = ("pixels", "encoded")


def is_encoded_camera(field: pa.Field) -> bool:
    """Whether `field` is a camera column of encoded frames."""
    return field.metadata is not None and ENCODING_KEY in field.metadata and pa.types.is_binary(field.type)


def decoded_frames(table: pa.Table) -> pa.Table:
    """`table` with every encoded camera column decoded into uint8 (H, W, C) tensors (the same table if none)."""
    for position, field in enumerate(table.schema):
        if is_encoded_camera(field):
            table = table.set_column(position, field.name, _decoded_column(field, table.column(position)))
    return table


def _decoded_column(field: pa.Field, column: pa.ChunkedArray) -> pa.Array:
    encoding = field.metadata[ENCODING_KEY].decode()
    return decode_frames(field.name, encoding, tuple(json.loads(field.metadata[SHAPE_KEY])), column)


def decode_frames(name: str, encoding: str, shape: tuple[int, ...], column: pa.ChunkedArray) -> pa.Array:
    """Camera `name`'s encoded frames (a binary column) as a uint8 (H, W, C) tensor column of `shape`."""
    if encoding != "jpeg":
        raise EpiserveError(f"camera {name!r} came encoded as {encoding!r}; this client decodes jpeg only")
    try:
        import simplejpeg
    except ImportError as exc:
        raise ImportError(f"encoded camera frames need simplejpeg: {install_hint('jpeg')}") from exc
    frames = _BLOCKS.empty((len(column), *shape))
    row = 0
    for chunk in column.chunks:
        for value in chunk:
            data = value.as_buffer()
            if data is None:
                raise EpiserveError(f"camera {name!r}: row {row} came without a frame")
            image = simplejpeg.decode_jpeg(
                np.frombuffer(data, np.uint8), colorspace="RGB", fastdct=False, fastupsample=False, buffer=frames[row]
            )
            if image.shape != shape:
                raise EpiserveError(f"camera {name!r}: row {row} is a {image.shape} frame, not {shape}")
            row += 1
    kind = pa.fixed_shape_tensor(pa.uint8(), list(shape))
    values = pa.Array.from_buffers(pa.uint8(), frames.size, [None, pa.py_buffer(frames)])
    storage = pa.Array.from_buffers(kind.storage_type, len(frames), [None], children=[values])
    return pa.ExtensionArray.from_storage(kind, storage)


class _ReusedBlocks:
    """uint8 arrays handed out again once nothing but this holds them (CPython's reference count says so): at most
    `kept` blocks, the largest first evicted when a request finds none free."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._blocks: list[np.ndarray] = []
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised uint8 array of `shape`: a view of a free block large enough, else a new block."""
        size = int(np.prod(shape))
        if size == 0:
            return np.empty(shape, dtype=np.uint8)
        with self._lock:
            free = [n for n in range(len(self._blocks)) if sys.getrefcount(self._blocks[n]) <= _FREE_REFERENCES]
            fitting = [n for n in free if self._blocks[n].size >= size]
            if fitting:
                block = self._blocks[min(fitting, key=lambda n: self._blocks[n].size)]
                return block[:size].reshape(shape)
            if len(self._blocks) >= self._kept:
                if not free:
                    return np.empty(shape, dtype=np.uint8)
                del self._blocks[max(free, key=lambda n: self._blocks[n].size)]
            block = np.empty(size, dtype=np.uint8)
            self._blocks.append(block)
            return block.reshape(shape)


# References to a free block while `sys.getrefcount(self._blocks[n])` looks at it: the list's and the argument.
_FREE_REFERENCES = 2
_BLOCKS = _ReusedBlocks(kept=2)
