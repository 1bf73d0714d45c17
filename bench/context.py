"""What every figure needs: the mode, the generated datasets, their peer copies, the running servers, and the
work directory (outside the repository) where caches and scratch directories live."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bench.access import Access, best_access
from bench.config import Scale
from bench.datasets import GeneratedDataset
from bench.processes import EpiserveServer


@dataclass
class Context:
    scale: Scale
    workdir: Path
    datasets: dict[str, GeneratedDataset]
    ipc: dict[str, Path]  # each dataset as one uncompressed Arrow IPC file (the mmap and Flight peers read it)
    hf_cache: Path  # HF `datasets` cache holding the full conversions
    logs: Path
    server: EpiserveServer | None = None  # the warm 2-worker server
    flight_port: int = 0
    loopback_port: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def data_root(self) -> Path:
        return self.workdir / "data"

    @property
    def cache_dir(self) -> Path:
        return self.workdir / "cache"

    def access(self) -> Access:
        assert self.server is not None, "the episerve server is not running"
        return best_access(self.server.url)

    def scratch(self, name: str) -> Path:
        """An empty directory `workdir/scratch/<name>` (emptied if it existed)."""
        path = self.workdir / "scratch" / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def drop_scratch(self, name: str) -> None:
        shutil.rmtree(self.workdir / "scratch" / name, ignore_errors=True)
