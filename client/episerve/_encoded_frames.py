"""Camera frames that came encoded (`Client(frames="encoded")`): decoded here, in the process that reads them (a
DataLoader worker), so the server's cores and the network carry JPEG bytes instead of raw pixels. With
`Client(frames="jpeg")` they stay JPEG bytes into the batch, for the trainer to decode (`decode_jpeg`: on the GPU
with nvJPEG, through torchvision).

The server marks an encoded camera column by its field metadata (`episerve.encoding`, `shape`); each such column
becomes the fixed-shape uint8 (H, W, C) tensor column the server would have sent as pixels, so everything after the
read (batches, LeRobot samples, mixtures) is the same for both. JPEGs are decoded by libjpeg-turbo through
`simplejpeg`, with the accurate DCT and upsampling, so the pixels equal the server's decode of the same bytes.

Each column is decoded into one block of memory, and a block nothing refers to any more (its batch converted and
dropped, as a DataLoader worker does every batch) is decoded into again: the first write to fresh memory costs a
fifth of a 480x640 decode on these machines, and a batch's block is tens of MB.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from episerve._columns import channels_first
from episerve._errors import EpiserveError
from episerve._extras import install_hint

ENCODING_KEY, SHAPE_KEY = b"episerve.encoding", b"shape"
FRAMES = ("pixels", "encoded", "jpeg")  # a Client's `frames`: "jpeg" is "encoded" on the wire, left undecoded


def is_encoded_camera(field: pa.Field) -> bool:
    """Whether `field` is a camera column of encoded frames."""
    return field.metadata is not None and ENCODING_KEY in field.metadata and pa.types.is_binary(field.type)


def decoded_frames(table: pa.Table, frames: str = "encoded") -> pa.Table:
    """`table` with every encoded camera column decoded into uint8 (H, W, C) tensors (the same table if none); for
    a client with `frames="jpeg"`, left as they came (each checked to be JPEG), one `bytes` per row."""
    for position, field in enumerate(table.schema):
        if not is_encoded_camera(field):
            continue
        if frames == "jpeg":
            if field.metadata[ENCODING_KEY] != b"jpeg":
                raise EpiserveError(f"camera {field.name!r} came encoded as {field.metadata[ENCODING_KEY]!r}")
            continue
        table = table.set_column(position, field.name, _decoded_column(field, table.column(position)))
    return table


def require_pixels(frames: str, reader: str) -> None:
    """Raise a ValueError when a client's `frames` leaves camera frames undecoded for `reader`, which needs pixels."""
    if frames == "jpeg":
        raise ValueError(
            f"{reader} builds samples from camera pixels, and a Client(frames='jpeg') leaves them JPEG bytes: "
            "use Client(frames='encoded') (decoded in the DataLoader workers)"
        )


def decode_jpeg(frames: Sequence[bytes | None], *, device: Any = None) -> Any:
    """A batch's JPEG camera frames (one camera of a `Client(frames="jpeg")` batch: a list of `bytes`, one per
    sample) as one uint8 `(N, C, H, W)` torch tensor on `device`, the pixels a `frames="encoded"` batch holds.

    On a CUDA device nvJPEG decodes the whole batch on the GPU (`torchvision.io.decode_jpeg`; its pixels may differ
    from libjpeg-turbo's by a level here and there); on any other device libjpeg-turbo decodes them here, through
    `simplejpeg` with the accurate DCT and upsampling, as `frames="encoded"` does, and the tensor is moved there.
    Every frame must have the same size. An empty batch gives an empty `(0,)` tensor.
    """
    torch = _torch()
    target = torch.device(device) if device is not None else torch.device("cpu")
    if len(frames) == 0:
        return torch.empty((0,), dtype=torch.uint8, device=target)
    if target.type == "cuda":
        for row, data in enumerate(frames):
            if data is None:
                raise EpiserveError(f"row {row} came without a frame")
        return _decoded_on_gpu(torch, frames, target)  # type: ignore[arg-type]
    if frames[0] is None:
        raise EpiserveError("row 0 came without a frame")
    height, width, _, _ = _simplejpeg().decode_jpeg_header(frames[0])
    decoded = np.empty((len(frames), height, width, 3), dtype=np.uint8)
    _decode_into(decoded, frames, "")
    return torch.from_numpy(channels_first(decoded)).to(target)


def _decode_into(out: np.ndarray, images: Iterable[Any], what: str) -> None:
    """Decode each JPEG of `images` (bytes-like, None for a missing frame) into `out[row]`, as the server decodes
    them (libjpeg-turbo's accurate DCT and upsampling); `what` starts each error's words."""
    simplejpeg = _simplejpeg()
    for row, data in enumerate(images):
        if data is None:
            raise EpiserveError(f"{what}row {row} came without a frame")
        image = simplejpeg.decode_jpeg(
            np.frombuffer(data, np.uint8), colorspace="RGB", fastdct=False, fastupsample=False, buffer=out[row]
        )
        if image.shape != out.shape[1:]:
            raise EpiserveError(f"{what}row {row} is a {image.shape} frame, not {out.shape[1:]}")


def _decoded_on_gpu(torch: Any, frames: Sequence[bytes], device: Any) -> Any:
    if not torch.cuda.is_available():
        raise EpiserveError(f"cannot decode on {device}: this torch sees no CUDA device")
    try:
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as decode_on_device
    except ImportError as exc:
        raise ImportError("decoding JPEG frames on the GPU needs torchvision: pip install torchvision") from exc
    # One copy of the batch's bytes into one writable buffer, sliced per frame (torch wants writable memory).
    joined = torch.frombuffer(bytearray(b"".join(frames)), dtype=torch.uint8)
    bounds = np.cumsum([0, *(len(data) for data in frames)]).tolist()
    pieces = [joined[start:stop] for start, stop in itertools.pairwise(bounds)]
    images = decode_on_device(pieces, mode=ImageReadMode.RGB, device=device)
    if len({tuple(image.shape) for image in images}) > 1:
        raise EpiserveError("the frames of a batch differ in size: decode them one at a time")
    return torch.stack(images)


def _torch() -> Any:
    from episerve._output_torch import torch_module

    torch = torch_module()
    if torch is None:
        raise ImportError(f"decode_jpeg returns torch tensors: {install_hint('torch', 'jpeg')}")
    return torch


def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError as exc:
        raise ImportError(f"encoded camera frames need simplejpeg: {install_hint('jpeg')}") from exc
    return simplejpeg


def _decoded_column(field: pa.Field, column: pa.ChunkedArray) -> pa.Array:
    encoding = field.metadata[ENCODING_KEY].decode()
    return decode_frames(field.name, encoding, tuple(json.loads(field.metadata[SHAPE_KEY])), column)


def decode_frames(name: str, encoding: str, shape: tuple[int, ...], column: pa.ChunkedArray) -> pa.Array:
    """Camera `name`'s encoded frames (a binary column) as a uint8 (H, W, C) tensor column of `shape`."""
    if encoding != "jpeg":
        raise EpiserveError(f"camera {name!r} came encoded as {encoding!r}; this client decodes jpeg only")
    frames = _BLOCKS.empty((len(column), *shape))
    _decode_into(frames, (value.as_buffer() for chunk in column.chunks for value in chunk), f"camera {name!r}: ")
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
