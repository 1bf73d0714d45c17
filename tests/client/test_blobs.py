"""`DeferredBlobs`: binary columns indexed like object arrays and copied out only when handed out."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from episerve._blobs import DeferredBlobs
from episerve._columns import table_columns


def _chunks() -> list[pa.Array]:
    """Binary chunks covering the awkward cases: a sliced array, nulls, an empty value, large offsets."""
    sliced = pa.array([b"skipped", b"alpha", b"", b"gamma", b"skipped too"])[1:4]
    with_nulls = pa.array([None, b"delta", None, b"epsilon" * 50])
    large = pa.array([b"zeta", b"eta"], type=pa.large_binary())
    return [sliced, with_nulls, large.cast(pa.binary())]


def test_rows_come_out_in_order_with_nulls_and_sliced_offsets() -> None:
    chunks = _chunks()
    blobs = DeferredBlobs.of(chunks)
    assert len(blobs) == 9 and blobs.dtype == object
    assert blobs.tolist() == pa.chunked_array(chunks).to_pylist()


def test_large_binary_and_empty_inputs() -> None:
    large = pa.array([b"one", None, b"three"], type=pa.large_binary())
    assert DeferredBlobs.of([large[1:]]).tolist() == [None, b"three"]
    assert DeferredBlobs.of([]).tolist() == []
    assert DeferredBlobs.of([pa.array([], type=pa.binary())]).tolist() == []


def test_indexing_and_concatenation_match_a_python_list() -> None:
    chunks = _chunks()
    expected = pa.chunked_array(chunks).to_pylist()
    blobs = DeferredBlobs.of(chunks)
    order = np.random.default_rng(3).permutation(len(expected))
    shuffled = blobs[order]
    assert shuffled.tolist() == [expected[i] for i in order]
    head, tail = shuffled[:4], shuffled[4:]
    assert head.tolist() + tail.tolist() == shuffled.tolist()
    joined = DeferredBlobs.concatenate([tail, head, DeferredBlobs.of([pa.array([b"last", None])])])
    assert joined.tolist() == tail.tolist() + head.tolist() + [b"last", None]
    with pytest.raises(TypeError, match="slice or an array"):
        blobs[0]


def test_table_columns_defers_binary_and_undecoded_image_columns_only() -> None:
    images = pa.array(
        [{"bytes": b"png-0", "path": "a"}, None, {"bytes": b"png-2", "path": "c"}],
        type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    table = pa.table(
        {
            "observation.image": images,
            "blob": pa.array([b"x", b"yy", None]),
            "task": ["pick", "place", "pick"],
            "index": pa.array([0, 1, 2], type=pa.int64()),
        }
    )
    deferred = table_columns(table, defer_blobs=True)
    assert isinstance(deferred["observation.image"], DeferredBlobs) and isinstance(deferred["blob"], DeferredBlobs)
    assert deferred["observation.image"].tolist() == [b"png-0", None, b"png-2"]
    assert deferred["blob"][np.array([2, 0])].tolist() == [None, b"x"]
    assert deferred["task"].tolist() == ["pick", "place", "pick"]
    np.testing.assert_array_equal(deferred["index"], [0, 1, 2])
    eager = table_columns(table)
    assert eager["observation.image"].tolist() == [b"png-0", None, b"png-2"]
    assert eager["blob"].tolist() == [b"x", b"yy", None]
