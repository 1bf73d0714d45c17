"""`MixtureIterableDataset`: a mixture streamed in batches, each rank and DataLoader worker its share of one
sequence of positions, resumable on any world size, worker count or per-rank batch (see `_global_steps`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from episerve._client import Client, connect
from episerve._global_steps import GlobalSteps, check_state, resume_state
from episerve._mixture import Mixture
from episerve._mixture_dataset import MixtureSource
from episerve._mixture_stats import Stats
from episerve._outputs import Formatter, Output
from episerve._prefetch import prefetched
from episerve._ranks import rank_and_world, worker_info
from episerve._retry import Retries
from episerve._selection import DeltaTimestamps

try:
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # numpy-only installs
    _Base = object  # type: ignore[assignment,misc]


class MixtureIterableDataset(_Base):  # type: ignore[misc]
    """The positions of a `Mixture`'s epochs as a stream of batches of `batch_size` samples per rank.

    Global step `s` covers positions `[s G, (s + 1) G)`, `G = batch_size * world_size`; this rank takes its
    consecutive part of each step, and its DataLoader workers take its steps in turn (use
    `DataLoader(ds, batch_size=None, num_workers=W)`). A worker reads `chunk_rows` rows of its batches per
    request (whole batches, at least one; by default one batch per request), each request a take per component in
    one `POST /takes`, and `prefetch` requests ahead on a background thread; chunks of up to two batches go where
    the output wants them (shared memory in a DataLoader worker), larger ones are copied out a batch at a time.
    Samples are as `MixtureDataset` describes them.

    `state_dict(batches)` — `batches` being how many batches this rank's loader delivered in this iteration —
    holds only (mixture version, seed, epoch, global position); `load_state_dict` continues from that position
    with any world size, worker count or per-rank batch: over the whole run every position is delivered exactly
    once. `set_epoch(e)` before each epoch.
    """

    def __init__(
        self,
        url: str | Client,
        mixture: Mixture,
        columns: Sequence[str] | None = None,
        *,
        batch_size: int,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        epoch_size: int | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
        decode_images: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        output: Output | Formatter | None = None,
        token: str | None = None,
        retries: Retries | int | None = None,
        chunk_rows: int | None = None,
        prefetch: int = 2,
    ) -> None:
        if chunk_rows is not None and chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1 (or None: one batch per request)")
        self.client = connect(url, token, retries, None)
        self.source = MixtureSource(
            self.client, mixture, columns, delta_timestamps, tolerance_s, decode_images, output, seed, epoch_size
        )
        self.batch_size = batch_size
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.drop_last = drop_last
        self.transform = transform
        self.batches_per_read = max(1, (chunk_rows or 0) // batch_size)
        self.prefetch = prefetch
        self.epoch = 0
        self.start = 0
        self._delivered: int | None = None  # batches handed out this iteration, when iterated in this process
        self._steps()  # validates

    @property
    def version(self) -> str:
        return self.source.version

    @property
    def seed(self) -> int:
        return self.source.plan.seed

    @property
    def epoch_size(self) -> int:
        return self.source.plan.epoch_size

    def __repr__(self) -> str:
        shard = f"batch_size={self.batch_size}, rank={self.rank}/{self.world_size}"
        return f"MixtureIterableDataset({self.client.url!r}, {self.source.mixture!r}, {shard})"

    def _steps(self) -> GlobalSteps:
        return GlobalSteps(self.epoch_size, self.start, self.batch_size, self.world_size, self.drop_last)

    def __len__(self) -> int:
        """Batches this rank delivers in the rest of the epoch."""
        return self._steps().num_steps

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (a resumed position holds only for the epoch it was saved in)."""
        if epoch != self.epoch:
            self.start = 0
        self.epoch = epoch
        self._delivered = None

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """Where the run is: `batches` is how many batches this rank's loader delivered since this iteration
        began (omit it when iterating in this process, without DataLoader workers)."""
        if batches is None:
            if self._delivered is None:
                raise ValueError(
                    "this dataset is iterated in DataLoader workers, so it cannot count what the training loop "
                    "consumed: pass state_dict(batches=<batches received from the loader in this iteration>)"
                )
            batches = self._delivered
        return resume_state(self.version, self.seed, self.epoch, self._steps().position_after(batches))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state's global position (in its epoch) on this run's ranks and workers."""
        self.epoch, self.start = check_state(state, self.version, self.seed, self.epoch_size)
        self._delivered = None

    def __iter__(self) -> Iterator[Any]:
        info = worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        steps = self._steps()
        if info is None:
            self._delivered = 0
        # Lazily: an epoch may hold billions of positions, and a resumed one starts anywhere in it.
        spans = (steps.span(step, self.rank) for step in range(worker, steps.num_steps, workers))
        mine = ((low, high) for low, high in spans if low < high)  # a last step may leave this rank no part
        per_read, epoch, source = self.batches_per_read, self.epoch, self.source
        # A batch cut from a chunk takes the chunk's shared memory along: worth it up to two batches a chunk.
        empty = None if per_read <= 2 else np.empty

        def load(reads: list[tuple[int, int]]) -> list[Any]:
            """The batches of `reads` (spans of positions), read in one request."""
            columns = source.read_columns(epoch, np.concatenate([np.arange(low, high) for low, high in reads]), empty)
            bounds = np.cumsum([0, *(high - low for low, high in reads)]).tolist()
            return [
                source.output.format(
                    {name: values[a:b] for name, values in columns.items()} if len(reads) > 1 else columns
                )
                for a, b in itertools.pairwise(bounds)
            ]

        chunks = iter(lambda: list(itertools.islice(mine, per_read)), [])
        for batches in prefetched(load, chunks, self.prefetch):
            for batch in batches:
                if info is None:
                    self._delivered = (self._delivered or 0) + 1
                yield batch if self.transform is None else self.transform(batch)

    def stats(self) -> Stats:
        """The mixture's feature statistics (see `episerve._mixture_stats`)."""
        return self.source.stats()


def mixture_iterable(
    url: Any, mixture: Mixture, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> MixtureIterableDataset:
    """`EpisodeIterableDataset(url, mixture, ...)`: the same arguments, for a mixture. Its plan orders the
    positions, so `shuffle` does not apply; `batch_size` is required, and `chunk_rows` (rows read per request)
    counts whole batches."""
    episodes, *rest = args or (None,)
    if episodes is not None or kwargs.pop("episodes", None) is not None:
        raise ValueError("a mixture picks episodes per component: Mixture([{'dataset': ..., 'episodes': ...}])")
    if kwargs.pop("image_size", None) is not None:
        raise ValueError("a mixture states the size of its cameras itself: Mixture([...], image_size=(h, w))")
    kwargs.pop("shuffle", None)
    if kwargs.get("batch_size") is None:
        raise ValueError("a mixture is streamed in batches: pass batch_size (per rank)")
    return MixtureIterableDataset(url, mixture, *rest, **kwargs)
