"""Arrow tables to per-column numpy arrays, without a Python loop over rows (the outputs take it from there).

Numeric columns become views of the response buffer (the client owns it, so the views are writable and torch
takes them without copying); fixed-size lists are the flattened values reshaped to `(rows, size, ...)`, so a
window of 6-vectors is `(rows, T, 6)`. A column split across several record batches is copied once into one
array. Python objects (strings, bytes, variable-length lists, undecoded images) stay in 1-D object arrays, which
index like the numeric ones and turn into lists at the end. Images are decoded with Pillow, one image at a time.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from episerve._blobs import DeferredBlobs, is_binary
from episerve._extras import install_hint
from episerve._numpy import booleans, fixed_width, nulls, numeric_dtype, offsets

Column = np.ndarray | DeferredBlobs
Columns = dict[str, Column]
Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]  # like `np.empty(shape, dtype)`
Frames = Callable[[list[np.ndarray]], Any]  # a camera column from its record batches' channels-last frames


class _Owner:
    """The writable buffers a table was decoded from, to view its columns as writable arrays."""

    def __init__(self, buffers: Sequence[pa.Buffer]) -> None:
        self.buffers = [(b.address, b.size, memoryview(b).cast("B")) for b in buffers if b.is_mutable]

    def view(self, address: int, nbytes: int, dtype: np.dtype, count: int) -> np.ndarray | None:
        for base, size, memory in self.buffers:
            if base <= address and address + nbytes <= base + size:
                return np.frombuffer(memory, dtype=dtype, count=count, offset=address - base)
        return None


def table_columns(
    table: pa.Table,
    *,
    buffers: Sequence[pa.Buffer] = (),
    decode_images: bool = False,
    defer_blobs: bool = False,
    empty: Allocate = np.empty,
    order: np.ndarray | None = None,
    frames: Frames | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
) -> Columns:
    """Each column of `table` as one array whose first axis is the row (object arrays for Python values).

    `buffers` are the writable buffers the table was read from; columns lying in them are viewed, not copied.
    With `defer_blobs`, binary columns and undecoded images are `DeferredBlobs`, copied out only when handed out.
    Camera frames are copied channels-first, each record batch straight into its rows of one array that `empty`
    allocates (where the output wants it: shared memory in a DataLoader worker). With `order` (a permutation of
    the rows), rows come in that order; camera frames are put in it by the same copy that makes them
    channels-first. `frames`, if given, makes a camera column from its record batches' channels-last views
    instead (an output that converts the frames anyway, with no `order`). `arrays` holds columns already converted
    (as this function would, in the same memory: `ArrowBody.arrays`), which are taken as they are.
    """
    owner = _Owner(buffers) if buffers else None
    columns: Columns = {}
    for i, name in enumerate(table.column_names):
        column = table.column(i)
        if _is_camera(column.type):
            nothing = np.empty((0, *column.type.shape), np.uint8)
            parts = [_frames_view(c, owner) for c in column.chunks if len(c)] or [nothing]
            columns[name] = _frames_channels_first(parts, empty, order) if frames is None else frames(parts)
            continue
        values = arrays.get(name) if arrays else None
        if values is None:
            values = _chunked(column, owner, decode_images, defer_blobs)
        columns[name] = values if order is None else values[order]
    return columns


def _chunked(
    column: pa.ChunkedArray,
    owner: _Owner | None,
    decode_images: bool,
    defer_blobs: bool,
) -> Column:
    chunks = [c for c in column.chunks if len(c)] or [pa.nulls(0, type=column.type)]
    if defer_blobs and is_binary(column.type):
        return DeferredBlobs.of(chunks)
    if defer_blobs and is_image(column.type) and not decode_images:
        return DeferredBlobs.of([_image_bytes(chunk) for chunk in chunks])
    parts = [_array(c, owner, decode_images) for c in chunks]
    if len(parts) == 1:
        return parts[0]
    if all(p.dtype != object for p in parts) and len({(p.dtype, p.shape[1:]) for p in parts}) == 1:
        return np.concatenate(parts)
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    position = 0
    for part in parts:
        out[position : position + len(part)] = _as_objects(part)
        position += len(part)
    return out


def _array(array: pa.Array, owner: _Owner | None, decode_images: bool) -> np.ndarray:
    kind = array.type
    if isinstance(kind, pa.FixedShapeTensorType):
        return _tensors(array, owner)
    if pa.types.is_fixed_size_list(kind):
        return _fixed_size_list(array, owner, decode_images)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return _numeric_view(array, owner) if array.null_count == 0 else _numeric_with_nan(array)
    if pa.types.is_boolean(kind):
        flags = booleans(array)  # bit-packed in Arrow: one unavoidable unpacking copy
        if array.null_count == 0:
            return flags
        out = flags.astype(object)
        out[nulls(array)] = None
        return out
    if is_image(kind):
        blobs = _objects(_image_bytes(array))
        return decode_image_column(blobs) if decode_images else blobs
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _variable_list(array, owner, decode_images)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_binary(kind):
        return _objects(array)
    if pa.types.is_fixed_size_binary(kind):
        return _objects(array)
    if pa.types.is_dictionary(kind):
        return _array(array.dictionary_decode(), owner, decode_images)
    values = array.to_numpy(zero_copy_only=False)
    return values if values.ndim == 1 else _as_objects(values)


def is_image(kind: pa.DataType) -> bool:
    """LeRobot/HF image columns: a struct with a binary `bytes` field (and usually a `path`)."""
    if not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0:
        return False
    field = kind.field(kind.get_field_index("bytes"))
    return is_binary(field.type)


def _image_bytes(array: pa.StructArray) -> pa.Array:
    """The encoded bytes of an image column, null where the image is."""
    return array.flatten()[array.type.get_field_index("bytes")]


def _numeric_view(array: pa.Array, owner: _Owner | None) -> np.ndarray:
    dtype = numeric_dtype(array.type)
    data = array.buffers()[1]
    count = len(array)
    if owner is not None and data is not None:
        address = data.address + array.offset * dtype.itemsize
        viewed = owner.view(address, count * dtype.itemsize, dtype, count)
        if viewed is not None:
            return viewed
    view = fixed_width(array, dtype)
    return view if view.flags.writeable else view.copy()


def _numeric_with_nan(array: pa.Array) -> np.ndarray:
    """Numbers with nulls as pyarrow's `to_numpy()` gives them, without its pandas import: NaN at the nulls,
    integers widened to float64."""
    dtype = numeric_dtype(array.type)
    values = fixed_width(array, dtype).astype(dtype if dtype.kind == "f" else np.float64)
    values[nulls(array)] = np.nan
    return values


def _fixed_size_list(array: pa.FixedSizeListArray, owner: _Owner | None, decode_images: bool) -> np.ndarray:
    size = array.type.list_size
    # the child's slots of these lists, null lists' included (`flatten()` is a compute call of ~20 µs and drops
    # the slots of null lists)
    values = _array(array.values.slice(array.offset * size, len(array) * size), owner, decode_images)
    if values.dtype != object and not array.null_count:
        return values.reshape(len(array), size, *values.shape[1:])
    return _list_rows(array, values, np.arange(len(array) + 1) * size)


def _tensors(array: pa.ExtensionArray, owner: _Owner | None) -> np.ndarray:
    """A fixed-shape tensor column as one array of `(rows, *shape)`, a view where the data allows."""
    shape = list(array.type.shape)
    return _fixed_size_list(array.storage, owner, False).reshape(len(array), *shape)


def _frames_view(array: pa.ExtensionArray, owner: _Owner | None) -> np.ndarray:
    """Camera frames `(rows, *shape)` as a view of their buffer, never a copy: writable where the client owns the
    buffer, read-only where it maps the server's cache (`episerve._local_frames`), since they are copied
    channels-first anyway."""
    storage = array.storage
    size = storage.type.list_size
    start = storage.values.offset + storage.offset * size
    count = len(array) * size
    data = storage.values.buffers()[1]
    shape = (len(array), *array.type.shape)
    viewed = owner.view(data.address + start, count, np.dtype(np.uint8), count) if owner is not None else None
    if viewed is None:
        viewed = np.frombuffer(data, dtype=np.uint8, count=count, offset=start)
    return viewed.reshape(shape)


def _is_camera(kind: pa.DataType) -> bool:
    """Camera frames as the server sends them: uint8 (height, width, channels), or (time, height, width, channels)
    for windows."""
    if not isinstance(kind, pa.FixedShapeTensorType) or kind.value_type != pa.uint8():
        return False
    shape = list(kind.shape)
    return len(shape) in (3, 4) and shape[-1] in (1, 3, 4)


def channels_first(frames: np.ndarray) -> np.ndarray:
    """Frames `(rows, H, W, C)` as a new contiguous `(rows, C, H, W)` array (see `_frames_channels_first`)."""
    return _frames_channels_first([frames], np.empty, None)


def _frames_channels_first(parts: list[np.ndarray], empty: Allocate, order: np.ndarray | None) -> np.ndarray:
    """Frames `(rows, ..., H, W, C)` in one or more parts as one contiguous `(rows, ..., C, H, W)` array from
    `empty` (rows in `order` if given), as decoded images come. One plane at a time: a copy per channel with a
    contiguous destination runs ~2.5x faster than numpy's general strided copy of `moveaxis` (and than torch's)."""
    first = parts[0]
    channels = first.shape[-1]
    rows = sum(len(p) for p in parts)
    if order is not None and len(order) != rows:
        raise ValueError(f"an order of {len(order)} rows for {rows} frames")
    out = empty((rows, *first.shape[1:-3], channels, *first.shape[-3:-1]), first.dtype)
    if order is None:
        pieces = []
        position = 0
        for part in parts:
            pieces.append((out[position : position + len(part)], part))
            position += len(part)
    else:  # one frame at a time, each from its place in the parts
        starts = np.cumsum([0, *(len(p) for p in parts)])
        numbers = np.searchsorted(starts, order, side="right") - 1
        within = (np.asarray(order) - starts[numbers]).tolist()
        pieces = [(out[i], parts[n][r]) for i, (n, r) in enumerate(zip(numbers.tolist(), within, strict=True))]
    for target, source in pieces:
        for channel in range(channels):
            target[..., channel, :, :] = source[..., channel]
    return out


def _variable_list(array: pa.ListArray, owner: _Owner | None, decode_images: bool) -> np.ndarray:
    bounds = offsets(array).astype(np.int64)
    first = int(bounds[0])
    bounds -= first
    values = _array(array.values.slice(first, int(bounds[-1])), owner, decode_images)  # every list's range
    return _list_rows(array, values, bounds)


def _list_rows(array: pa.Array, values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """One object per list of `array`: its `values[bounds[i]:bounds[i + 1]]` (a list for Python objects), or
    None for a null list."""
    out = np.empty(len(array), dtype=object)
    for row, piece in enumerate(np.split(values, bounds[1:-1]) if len(array) else []):
        out[row] = piece if values.dtype != object else list(piece)
    if array.null_count:
        out[nulls(array)] = None
    return out


def _objects(array: pa.Array) -> np.ndarray:
    return _as_objects(array.to_pylist())


def _as_objects(values: np.ndarray | list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for row, value in enumerate(values):
        out[row] = value
    return out


def decode_image_column(blobs: np.ndarray) -> np.ndarray:
    """Encoded images (PNG, JPEG...) to `(rows, C, H, W)` arrays; an object array if their shapes differ."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(f"decode_images=True needs Pillow: {install_hint('images')}") from exc
    images = [None if blob is None else _decode_image(Image, blob) for blob in blobs]
    shapes = {(image.shape, image.dtype) for image in images if image is not None}
    if len(shapes) != 1 or any(image is None for image in images):
        return _as_objects([None if image is None else np.array(image) for image in images])
    [(shape, dtype)] = shapes
    out = np.empty((len(images), *shape), dtype=dtype)
    for row, image in enumerate(images):
        out[row] = image
    return out


def _decode_image(image_module: Any, blob: bytes) -> np.ndarray:
    with image_module.open(io.BytesIO(blob)) as image:
        if image.mode not in ("1", "L", "LA", "RGB", "RGBA", "I;16", "I", "F"):
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        pixels = np.asarray(image)
    # HWC, as Pillow decodes, to the CHW layout torchvision and LeRobot use.
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
