"""Arrow arrays to NumPy arrays straight from their buffers.

pyarrow's own `to_numpy()` goes through its pandas conversion layer and imports pandas on first use, which costs
each fresh DataLoader worker ~0.3 s and ~35 MB of memory; the client needs none of it for these layouts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_FLOATS = {16: np.float16, 32: np.float32, 64: np.float64}


def numeric_dtype(kind: pa.DataType) -> np.dtype:
    """The NumPy dtype of an Arrow integer or floating-point type (pyarrow's `to_pandas_dtype()` imports pandas,
    and fails without it before pyarrow 26)."""
    if pa.types.is_floating(kind):
        return np.dtype(_FLOATS[kind.bit_width])
    return np.dtype(f"{'i' if pa.types.is_signed_integer(kind) else 'u'}{kind.bit_width // 8}")


def fixed_width(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The values of a fixed-width array without nulls, as a read-only view of its data buffer."""
    if len(array) == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def offsets(array: pa.Array) -> np.ndarray:
    """The `len(array) + 1` value offsets of a list, string or binary array (a read-only view)."""
    large = pa.types.is_large_list(array.type) or pa.types.is_large_binary(array.type)
    large = large or pa.types.is_large_string(array.type)
    dtype = np.dtype(np.int64 if large else np.int32)
    if len(array) == 0:
        return np.zeros(1, dtype=dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array) + 1, offset=array.offset * dtype.itemsize)


def booleans(array: pa.BooleanArray) -> np.ndarray:
    """A boolean array without nulls, unpacked from its bits (a new, writable array)."""
    if len(array) == 0:
        return np.zeros(0, dtype=np.bool_)
    bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    unpacked = np.unpackbits(bits, count=array.offset + len(array), bitorder="little")
    return unpacked[array.offset :].view(np.bool_)


def nulls(array: pa.Array) -> np.ndarray:
    """True where `array` is null."""
    return booleans(array.is_null())
