"""Benchmark sizes: the full mode matches the reference datasets of targets.md, the quick mode scales them down."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSize:
    """Shape of one generated LeRobot-style dataset."""

    name: str
    episodes: int
    min_length: int
    max_length: int
    image_side: int | None  # side of the PNG camera image; None for a vector-only dataset
    seed: int


@dataclass(frozen=True)
class CameraSize:
    """Shape of one generated LeRobot v3.0 dataset with one AV1 camera (P9, P10, P16)."""

    name: str
    height: int
    width: int
    episodes: int
    min_length: int
    max_length: int
    seed: int
    # "synthetic" (a drifting gradient with moving texture and noise), "photo" (a pan and zoom over photographs
    # with sensor noise) or "aloha" (the ALOHA insertion scene rendered with MuJoCo): see bench/camera_datasets.py
    content: str = "synthetic"

    @property
    def label(self) -> str:
        """The content and size, as table rows name the dataset: `aloha 480x640`."""
        return f"{self.content} {self.height}x{self.width}"


@dataclass(frozen=True)
class CameraScale:
    """The camera datasets (P9, P10, P16) and how much each loader reads."""

    datasets: tuple[CameraSize, ...]  # every content at both sizes
    samples: int  # frames drawn per episerve and mmap loader
    peer_samples: int  # frames drawn through the LeRobot-style per-sample decode path (slow)

    def of(self, *contents: str) -> tuple[CameraSize, ...]:
        """The datasets of these contents, in order."""
        return tuple(size for size in self.datasets if size.content in contents)


@dataclass(frozen=True)
class Scale:
    """Everything a mode changes: dataset sizes and how much work each figure does."""

    mode: str
    vector: DatasetSize
    image: DatasetSize
    p1_rows: dict[str, int]  # contiguous range length per dataset
    p1_repeats: int
    rounds: int  # P2 and P3: every cell is measured this many times, peers interleaved; the table shows medians
    p2_seconds: float  # measuring time per (peer, concurrency) cell
    p2_batch: int
    p3_samples: dict[str, int]  # samples drawn per loader and dataset
    p3_batch: int
    p7_requests: int  # episerve windowed takes of `p3_batch` samples
    p7_lerobot_samples: int  # samples through the LeRobot-style per-sample path
    p8_fraction: float
    p9: CameraScale


FULL = Scale(
    mode="full",
    vector=DatasetSize("vector", episodes=1000, min_length=200, max_length=592, image_side=None, seed=1),
    image=DatasetSize("image", episodes=300, min_length=206, max_length=600, image_side=64, seed=2),
    p1_rows={"vector": 100_000, "image": 20_000},
    p1_repeats=7,
    rounds=3,
    p2_seconds=6.0,
    p2_batch=256,
    p3_samples={"vector": 100_000, "image": 50_000},
    p3_batch=256,
    p7_requests=40,
    p7_lerobot_samples=600,
    p8_fraction=0.10,
    p9=CameraScale(
        datasets=(
            CameraSize("camera480", 480, 640, episodes=16, min_length=300, max_length=420, seed=9),
            CameraSize("camera224", 224, 224, episodes=16, min_length=300, max_length=420, seed=10),
            CameraSize("photo480", 480, 640, episodes=8, min_length=200, max_length=260, seed=11, content="photo"),
            CameraSize("photo224", 224, 224, episodes=8, min_length=200, max_length=260, seed=12, content="photo"),
            CameraSize("aloha480", 480, 640, episodes=8, min_length=200, max_length=260, seed=13, content="aloha"),
            CameraSize("aloha224", 224, 224, episodes=8, min_length=200, max_length=260, seed=14, content="aloha"),
        ),
        samples=3200,
        peer_samples=1280,
    ),
)

QUICK = Scale(
    mode="quick",
    vector=DatasetSize("vector", episodes=300, min_length=200, max_length=592, image_side=None, seed=1),
    image=DatasetSize("image", episodes=50, min_length=206, max_length=600, image_side=64, seed=2),
    p1_rows={"vector": 100_000, "image": 10_000},
    p1_repeats=5,
    rounds=1,
    p2_seconds=2.5,
    p2_batch=256,
    p3_samples={"vector": 30_000, "image": 10_000},
    p3_batch=256,
    p7_requests=15,
    p7_lerobot_samples=200,
    p8_fraction=0.10,
    p9=CameraScale(
        datasets=(
            CameraSize("camera480", 480, 640, episodes=8, min_length=300, max_length=420, seed=9),
            CameraSize("camera224", 224, 224, episodes=8, min_length=300, max_length=420, seed=10),
            CameraSize("photo480", 480, 640, episodes=4, min_length=120, max_length=160, seed=11, content="photo"),
            CameraSize("photo224", 224, 224, episodes=4, min_length=120, max_length=160, seed=12, content="photo"),
            CameraSize("aloha480", 480, 640, episodes=4, min_length=120, max_length=160, seed=13, content="aloha"),
            CameraSize("aloha224", 224, 224, episodes=4, min_length=120, max_length=160, seed=14, content="aloha"),
        ),
        samples=1280,
        peer_samples=640,
    ),
)

MODES = {"full": FULL, "quick": QUICK}
