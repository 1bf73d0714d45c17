"""FastAPI dependencies: settings, the catalog and its datasets, the request's deadline on an object store, and the
thread pool row reads run in. Token checks, query checks, body deadlines and JSON bodies have modules of their own
(`tokens`, `query_checks`, `body_deadline`, `json_body`)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
from fastapi import Request

from app.errors import TryLater
from app.reads.catalog import Catalog, Dataset, store_deadline
from app.settings import Settings

T = TypeVar("T")

# Dependencies are `async def` although they do not await: FastAPI would run plain `def` ones in the thread
# pool, one thread hop each, which costs more than their work on every request.


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_catalog(request: Request) -> Catalog:
    return catalog_of(request)


def catalog_of(request: Request) -> Catalog:
    catalog = getattr(request.app.state, "catalog", None)
    if catalog is None:
        raise TryLater("the catalog is still loading; retry shortly")
    return catalog


async def get_dataset(dataset_id: str, request: Request) -> Dataset:
    return catalog_of(request).get(dataset_id)


async def bound_store_waits(request: Request) -> AsyncIterator[None]:
    """The request's waits on an object store end `remote_wait_s` after it arrived (see `app.store.store_waits`);
    the threads it reads in see the deadline, as they run in a copy of its context."""
    with store_deadline(request.app.state.settings.remote_wait_s):
        yield


async def run_read(request: Request, function: Callable[..., T], *args: Any) -> T:
    """Run a row read in the thread pool, at most `max_concurrent_reads` at once per worker: beyond that,
    requests wait their turn instead of each holding its response's buffers at the same time."""
    limiter = request.app.state.read_limiter
    return await anyio.to_thread.run_sync(functools.partial(function, *args), limiter=limiter)
