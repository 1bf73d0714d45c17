"""`EpisodeIterableDataset`: the view streamed in contiguous chunks, sharded, shuffled per epoch, resumable.

Each DataLoader worker of each rank reads its own chunks (see `_sharding`) with one `GET /rows` per chunk, a
background thread fetching up to `prefetch` chunks ahead. The order of every shard is fixed by
`(seed, epoch, rank, world_size, num_workers)`, so `state_dict()` only has to record the epoch and how many rows
the loader has delivered; on resume every worker recomputes how many of its rows were among them and skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from episerve._blobs import DeferredBlobs
from episerve._client import Client, connect
from episerve._columns import Column, Columns, table_columns
from episerve._episodes import Episodes
from episerve._errors import EpiserveError
from episerve._mixture import Mixture
from episerve._outputs import Output, formatter
from episerve._prefetch import prefetched
from episerve._ranks import rank_and_world, worker_info
from episerve._retry import Retries
from episerve._selection import DeltaTimestamps, ImageSize, Selection
from episerve._sharding import EpochPlan, delivered_per_worker

try:
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # numpy-only installs
    _Base = object  # type: ignore[assignment,misc]


_STATE_KEYS = ("total_rows", "chunk_rows", "batch_size", "shuffle", "seed", "rank", "world_size")


class EpisodeIterableDataset(_Base):  # type: ignore[misc]
    """The rows of a dataset view as a stream of samples (or of batches, with `batch_size`).

    The view (the selected episodes in ascending episode order, then stored frame order) is read in contiguous
    chunks of `chunk_rows` rows, dealt disjointly to the distributed ranks (`rank`/`world_size`, by default from
    `torch.distributed` when it is initialised) and to the DataLoader workers of each rank. With `shuffle=True`
    the chunk order and the rows inside each chunk are permuted, seeded by `seed` and the epoch (`set_epoch`).
    `prefetch` chunks are fetched ahead by a background thread.

    With `batch_size=None` it yields samples (dicts of tensors, numpy arrays without torch); with `batch_size=B`
    it yields batch dicts of up to `B` rows (use `DataLoader(ds, batch_size=None)`), cut across chunk bounds; each
    worker's last batch of an epoch may be short. `transform` is applied to every yielded sample or batch.
    `image_size` has camera frames downscaled by the server, as `EpisodeDataset` describes.

    `state_dict(consumed)` / `load_state_dict(state)` resume an epoch with exactly the rows not yet delivered.
    The resumed run must use the same seed, chunk_rows, batch_size, rank, world_size and number of workers.

    Given an `episerve.Mixture` instead of a dataset id, it makes a `MixtureIterableDataset` with the same
    arguments (which resumes on any world size, worker count or batch).
    """

    def __new__(cls, url: Any = None, dataset_id: Any = None, *args: Any, **kwargs: Any) -> Any:
        mixture = kwargs.pop("dataset_id", dataset_id)
        if cls is EpisodeIterableDataset and isinstance(mixture, Mixture):
            from episerve._mixture_iterable import mixture_iterable

            return mixture_iterable(url, mixture, args, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | Client,
        dataset_id: str,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        *,
        chunk_rows: int = 8192,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int = 2,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
        decode_images: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        output: Output | None = None,
        token: str | None = None,
        retries: Retries | int | None = None,
        image_size: ImageSize | None = None,
    ) -> None:
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be at least 1 (or None for samples)")
        self.client = connect(url, token, retries, None)
        self.selection = Selection.of(dataset_id, episodes, columns, delta_timestamps, tolerance_s, image_size)
        self.chunk_rows = chunk_rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.prefetch = prefetch
        self.decode_images = decode_images
        self.transform = transform
        self.output = formatter(output)
        self.total_rows = self.client.count(self.selection)
        self._epoch = 0
        self._resume: tuple[int, int] | None = None
        self._progress: int | None = None  # rows delivered this epoch, when iterated in this process

    def __repr__(self) -> str:
        view = f"{self.selection.dataset_id!r}, episodes={self.selection.episodes!r}"
        shape = f"chunk_rows={self.chunk_rows}, batch_size={self.batch_size}, shuffle={self.shuffle}"
        shard = f"rank={self.rank}/{self.world_size}"
        return f"EpisodeIterableDataset({self.client.url!r}, {view}, rows={self.total_rows}, {shape}, {shard})"

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def num_rows(self) -> int:
        """Rows this rank delivers per epoch (all its DataLoader workers together)."""
        return self._plan().rows(self.rank, self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the shuffle order) of the next iteration; call it before each epoch."""
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._epoch = epoch
        self._progress = None

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position in the epoch: the epoch and how many rows (samples) this rank has consumed in it.

        `consumed` counts the rows the DataLoader delivered to the training loop since the epoch began, resumed
        parts included. It may be omitted when this object was iterated in this process (`num_workers=0`); with
        DataLoader workers only the training loop knows it.
        """
        if consumed is None:
            if self._progress is None:
                raise ValueError(
                    "this dataset is iterated in DataLoader workers, so it cannot count what the training loop "
                    "consumed: pass state_dict(consumed=<rows received from the loader this epoch>)"
                )
            consumed = self._progress
        state = {key: getattr(self, key) for key in _STATE_KEYS}
        return {"epoch": self._epoch, "consumed": int(consumed), **state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration continues `state["epoch"]` with the rows not yet consumed."""
        mismatched = [
            f"{key}: saved {state.get(key)!r}, now {getattr(self, key)!r}"
            for key in _STATE_KEYS
            if state.get(key) != getattr(self, key)
        ]
        if mismatched:
            raise ValueError("the state was saved with a different setup; " + "; ".join(mismatched))
        self._epoch = int(state["epoch"])
        self._resume = (self._epoch, int(state["consumed"]))
        self._progress = None

    def __iter__(self) -> Iterator[Any]:
        info = worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        plan = self._plan()
        skip = 0
        if self._resume is not None and self._resume[0] == self._epoch:
            rows = [plan.rows(self.rank, self.world_size, w, num_workers) for w in range(num_workers)]
            skip = delivered_per_worker(rows, self.batch_size or 1, self._resume[1])[worker]
        if info is None:
            self._progress = self._resume[1] if self._resume and self._resume[0] == self._epoch else 0
        work = []  # (chunk, rows of it to skip), the chunks all delivered before a resume left out
        for chunk in plan.chunks(self.rank, self.world_size, worker, num_workers):
            start, stop = plan.chunk_span(chunk)
            if skip >= stop - start:
                skip -= stop - start
                continue
            work.append((int(chunk), skip))
            skip = 0

        def load(piece: tuple[int, int]) -> Columns:
            return self._load(plan, *piece)

        chunks = prefetched(load, work, self.prefetch)
        items = self._batches(chunks) if self.batch_size else self._samples(chunks)
        for rows, item in items:
            if info is None:  # counted when handed over: the consumer holds it while this generator is paused
                self._progress = (self._progress or 0) + rows
            yield item if self.transform is None else self.transform(item)

    def _plan(self) -> EpochPlan:
        return EpochPlan(self.total_rows, self.chunk_rows, self.shuffle, self.seed, self._epoch)

    def _load(self, plan: EpochPlan, chunk: int, skip: int) -> Columns:
        """A chunk's columns in delivery order, without its first `skip` rows."""
        start, stop = plan.chunk_span(chunk)
        order = plan.row_order(chunk)
        pages = self.client.read_slice(self.selection, start, stop)
        if pages.total_rows != self.total_rows:
            raise EpiserveError(
                f"the view of {self.selection.dataset_id!r} changed from {self.total_rows} to {pages.total_rows} rows "
                "during the epoch (its source files changed); start a new dataset object"
            )
        columns = table_columns(
            pages.table,
            buffers=pages.buffers,
            decode_images=self.decode_images,
            defer_blobs=True,
            empty=self.output.empty if self._batches_share_chunks() else np.empty,
            order=order,
        )
        if skip:
            columns = {name: values[skip:] for name, values in columns.items()}
        return columns

    def _batches_share_chunks(self) -> bool:
        """Whether a chunk's frames go where the output wants a batch's (shared memory in a DataLoader worker):
        only when each batch is at least half a chunk, since a batch cut from a chunk takes the whole chunk's
        memory along with it (a smaller one is copied out instead, and the chunk stays private)."""
        return self.batch_size is not None and self.chunk_rows <= 2 * self.batch_size

    def _samples(self, chunks: Iterator[Columns]) -> Iterator[tuple[int, dict[str, Any]]]:
        for columns in chunks:
            data = self.output.format(columns)
            names = list(data)
            # Split each column into per-row views once (torch's unbind is one C call), then zip rows together.
            for values in zip(*(_rows(data[name]) for name in names), strict=True):
                yield 1, dict(zip(names, values, strict=True))

    def _batches(self, chunks: Iterator[Columns]) -> Iterator[tuple[int, dict[str, Any]]]:
        size = self.batch_size or 1
        pending: list[Columns] = []
        held = 0
        for columns in chunks:
            pending.append(columns)
            held += _length(columns)
            while held >= size:
                batch, pending = _split(pending, size)
                held -= size
                yield size, self.output.format(batch)
        if held:
            batch, _ = _split(pending, held)
            yield held, self.output.format(batch)


def _rows(values: Any) -> Sequence[Any]:
    unbind = getattr(values, "unbind", None)
    return unbind(0) if unbind is not None else list(values)


def _length(columns: Columns) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def _split(pending: list[Columns], size: int) -> tuple[Columns, list[Columns]]:
    """The first `size` rows of the pending chunks (a view when they lie in one chunk), and the rest."""
    taken: list[Columns] = []
    need = size
    while need:
        head = pending[0]
        length = _length(head)
        if length <= need:
            taken.append(head)
            pending = pending[1:]
            need -= length
        else:
            taken.append({name: values[:need] for name, values in head.items()})
            pending = [{name: values[need:] for name, values in head.items()}, *pending[1:]]
            need = 0
    if len(taken) == 1:
        return taken[0], pending
    return {name: _concatenate([part[name] for part in taken]) for name in taken[0]}, pending


def _concatenate(parts: list[Column]) -> Column:
    if isinstance(parts[0], DeferredBlobs):
        return DeferredBlobs.concatenate(parts)
    return np.concatenate(parts)
