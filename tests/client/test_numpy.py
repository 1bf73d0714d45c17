"""Arrow arrays to NumPy from their buffers, checked against pyarrow's own conversion on sliced arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from episerve._numpy import booleans, fixed_width, nulls, numeric_dtype, offsets

BITS = pa.array([bool(v) for v in np.random.default_rng(5).integers(0, 2, size=37)])


@pytest.mark.parametrize(("start", "stop"), [(0, 37), (3, 20), (9, 9), (13, 37), (1, 2)])
def test_booleans_unpack_any_bit_offset(start: int, stop: int) -> None:
    sliced = BITS[start:stop]
    unpacked = booleans(sliced)
    assert unpacked.dtype == np.bool_ and unpacked.flags.writeable
    assert unpacked.tolist() == sliced.to_pylist()


def test_nulls_of_a_sliced_array() -> None:
    values = pa.array([1, None, 3, None, None, 6, 7])[1:6]
    assert nulls(values).tolist() == [True, False, True, True, False]


@pytest.mark.parametrize("kind", [pa.int8(), pa.int64(), pa.float32(), pa.float64(), pa.uint16()])
def test_fixed_width_views_the_sliced_values(kind: pa.DataType) -> None:
    values = pa.array(np.arange(20), type=kind)[5:17]
    view = fixed_width(values, numeric_dtype(kind))
    np.testing.assert_array_equal(view, np.arange(5, 17))
    assert len(fixed_width(values[:0], np.dtype(np.int8))) == 0


@pytest.mark.parametrize(
    "values",
    [
        pa.array([b"a", b"bcd", b"", b"ef"]),
        pa.array(["a", "bcd", "", "ef"], type=pa.large_string()),
        pa.array([[1], [2, 3], [], [4, 5, 6]], type=pa.large_list(pa.int32())),
        pa.array([[1], [2, 3], [], [4, 5, 6]]),
    ],
)
def test_offsets_of_sliced_variable_width_arrays(values: pa.Array) -> None:
    sliced = values[1:4]
    bounds = offsets(sliced)
    assert bounds[0] == 1 and np.diff(bounds).tolist() == [len(value) for value in sliced.to_pylist()]
    assert offsets(values[:0]).tolist() == [0]
