"""The blocks a read decodes camera frames into: one is handed out again only once nothing refers to it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from app.reads.frames import ReusedBlocks


def test_a_block_is_reused_only_once_nothing_refers_to_it() -> None:
    blocks = ReusedBlocks(kept=2, most_bytes=1024)
    first = blocks.empty((4, 2, 2, 3))
    first[:] = 7
    held = pa.py_buffer(first)  # as an answer's column holds its frames until they are sent
    del first
    second = blocks.empty((4, 2, 2, 3))
    second[:] = 9
    assert np.frombuffer(held, np.uint8).tolist() == [7] * 48  # never written over while held
    del held, second
    again = blocks.empty((2, 2, 2, 3))
    assert any(again.base is block for block in blocks._blocks) and len(blocks._blocks) == 2


def test_large_or_empty_arrays_are_never_kept() -> None:
    blocks = ReusedBlocks(kept=2, most_bytes=1024)
    assert blocks.empty((2, 1024)).shape == (2, 1024) and blocks.empty((0, 3)).shape == (0, 3)
    assert blocks._blocks == []
