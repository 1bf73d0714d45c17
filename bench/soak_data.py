"""The soak's datasets and their oracles: what every answer must hold, computed from the source files alone.

Three datasets, one server:
- `soak-rows` (local, generic parquet, 10 fps): episodes of different lengths scattered over files in shuffled
  order, so view order is not stored order; each row carries its episode, frame, a float vector and a 4 KiB blob.
  Its oracle is the source files read with pyarrow and put in view order (ascending episode, then stored order).
- `soak-cams` (local, LeRobot v3.0 with one camera): every frame shows its episode and frame index as a row of
  black/white cells (`app.demo_video`); the oracle reads that label back from the pixels.
- `objects` (an `s3://` root): two files; one is re-uploaded during the run with its episodes in reverse stored
  order and `version` 1. Every episode keeps its length, so a view position names the same (episode, frame) in
  both versions: rows of another episode are wrong rows whatever the version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS_DATASET, CAMS_DATASET, OBJECTS_DATASET = "soak-rows", "soak-cams", "objects"
CAMERA = "observation.images.top"
FPS = 10
BLOB_BYTES = 4096
OBJECT_LENGTHS = {0: 40, 1: 45, 2: 50, 3: 55, 4: 50, 5: 60, 6: 70, 7: 80}
OBJECT_FILES = {"data/part-000.parquet": [0, 1, 2, 3], "data/part-001.parquet": [4, 5, 6, 7]}
REPLACED_OBJECT = "data/part-001.parquet"
LABEL_CELL, LABEL_BITS = 8, 16  # the demo's frame label: see app.demo_video.camera_frames


def blob(row: int) -> bytes:
    """The `blob` of stored row `row` (its global index): 4 KiB that only this row has."""
    return np.random.default_rng(row).integers(0, 256, BLOB_BYTES, dtype=np.uint8).tobytes()


def write_rows_dataset(path: Path, episodes: int = 48, files: int = 4, seed: int = 5) -> None:
    """`soak-rows`: `episodes` episodes of 20-80 frames, in shuffled order over `files` files."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(episodes)
    lengths = rng.integers(20, 81, episodes)
    row = 0
    for number, part in enumerate(np.array_split(order, files)):
        ids = np.concatenate([np.full(lengths[e], e) for e in part])
        frames = np.concatenate([np.arange(lengths[e]) for e in part])
        index = np.arange(row, row + len(ids))
        row += len(ids)
        action = (ids[:, None] * 1000 + frames[:, None] + np.arange(8)[None, :] / 8).astype(np.float32)
        table = pa.table(
            {
                "episode_index": pa.array(ids, pa.int64()),
                "frame_index": pa.array(frames, pa.int64()),
                "index": pa.array(index, pa.int64()),
                "action": pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), 8),
                "blob": pa.array([blob(int(r)) for r in index], pa.binary()),
            }
        )
        pq.write_table(table, path / f"part-{number}.parquet", row_group_size=int(rng.integers(100, 400)))
    (path / "episerve.json").write_text(json.dumps({"fps": FPS}))


def object_table(episodes: list[int], version: int) -> pa.Table:
    """One file of `objects`: `episodes` in stored order; `value` names the row, `version` the upload."""
    ids = np.concatenate([np.full(OBJECT_LENGTHS[e], e) for e in episodes])
    frames = np.concatenate([np.arange(OBJECT_LENGTHS[e]) for e in episodes])
    return pa.table(
        {
            "episode_index": pa.array(ids, pa.int64()),
            "frame_index": pa.array(frames, pa.int64()),
            "value": pa.array(ids * 1000 + frames, pa.int64()),
            "version": pa.array(np.full(len(ids), version), pa.int64()),
        }
    )


def write_object_file(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path, row_group_size=32)  # several row groups: cold reads touch a few of them


@dataclass(frozen=True)
class RowsOracle:
    """`soak-rows` in view order: the whole table, and each episode's view rows `[starts[e], starts[e + 1])`."""

    table: pa.Table
    starts: np.ndarray

    @classmethod
    def read(cls, files: list[Path]) -> RowsOracle:
        """The oracle of a dataset whose source files, in stored order, are `files`."""
        table = pa.concat_tables(pq.read_table(p) for p in files)
        order = np.argsort(table["episode_index"].to_numpy(), kind="stable")
        table = table.take(pa.array(order))
        lengths = np.bincount(table["episode_index"].to_numpy())
        return cls(table, np.concatenate(([0], np.cumsum(lengths))))

    @property
    def episodes(self) -> int:
        return len(self.starts) - 1

    def view(self, episodes: list[int]) -> np.ndarray:
        """The oracle's rows (positions in `table`) of the view of `episodes`, in view order."""
        return np.concatenate([np.arange(self.starts[e], self.starts[e + 1]) for e in sorted(set(episodes))])

    def windows(self, rows: np.ndarray, offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """LeRobot's windows of table rows `rows`: per offset, the row clamped to its episode, and whether it was
        outside (padding)."""
        episode = self.table["episode_index"].to_numpy()[rows]
        lo, hi = self.starts[episode], self.starts[episode + 1]
        wanted = rows[:, None] + np.asarray(offsets)[None, :]
        return np.clip(wanted, lo[:, None], hi[:, None] - 1), (wanted < lo[:, None]) | (wanted >= hi[:, None])


def object_view(episodes: list[int]) -> list[tuple[int, int]]:
    """(episode, frame) of each view position of `episodes` in `objects`: the same in both versions."""
    return [(e, f) for e in sorted(set(episodes)) for f in range(OBJECT_LENGTHS[e])]


def read_label(frame: np.ndarray) -> tuple[int, int]:
    """(episode, frame index) drawn into a demo frame (H, W, 3): LABEL_CELL-pixel cells in raster order, the first
    LABEL_BITS the frame index and the next the episode, most significant bit first, white = 1. Each cell is read
    from the mean of its centre, so codec noise flips no bit."""
    columns = frame.shape[1] // LABEL_CELL
    bits = []
    for cell in range(2 * LABEL_BITS):
        row, column = divmod(cell, columns)
        top, left = row * LABEL_CELL + 2, column * LABEL_CELL + 2
        bits.append(int(frame[top : top + LABEL_CELL - 4, left : left + LABEL_CELL - 4].mean() > 127.5))
    number = int("".join(map(str, bits)), 2)
    return number & 0xFFFF, number >> LABEL_BITS
