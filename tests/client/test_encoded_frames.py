"""Decoding encoded camera frames into reused blocks: a block is decoded into again only once nothing refers to it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from episerve._encoded_frames import _ReusedBlocks, decode_frames

simplejpeg = pytest.importorskip("simplejpeg")


def _jpegs(count: int, shape: tuple[int, int, int], seed: int) -> tuple[np.ndarray, pa.ChunkedArray]:
    images = np.random.default_rng(seed).integers(0, 256, size=(count, *shape), dtype=np.uint8)
    encoded = [simplejpeg.encode_jpeg(image, quality=90, colorspace="RGB") for image in images]
    decoded = np.stack([simplejpeg.decode_jpeg(data, fastdct=False, fastupsample=False) for data in encoded])
    return decoded, pa.chunked_array([pa.array(encoded, pa.binary())])


def test_a_block_in_use_is_never_decoded_into() -> None:
    shape = (16, 24, 3)
    first, first_column = _jpegs(3, shape, 0)
    second, second_column = _jpegs(3, shape, 1)
    kept = decode_frames("cam", "jpeg", shape, first_column)
    again = decode_frames("cam", "jpeg", shape, second_column)  # `kept` still holds its block
    assert np.array_equal(kept.to_numpy_ndarray(), first)
    assert np.array_equal(again.to_numpy_ndarray(), second)


def test_free_blocks_are_reused_and_kept_bounded() -> None:
    blocks = _ReusedBlocks(kept=2)
    a, b = blocks.empty((4, 3)), blocks.empty((4, 3))
    assert a.base is not b.base
    held = pa.py_buffer(a)
    del a
    c = blocks.empty((2, 3))  # the first block is still referenced through `held`: a new array
    assert len(blocks._blocks) == 2 and all(c.base is not block for block in blocks._blocks)
    del held, b
    d = blocks.empty((2, 3))
    assert any(d.base is block for block in blocks._blocks)
