"""The datasets reads are made on, named where the API can reach them: the catalog, one dataset, the warmer of
their caches and the deadline of a request's waits on an object store. The store keeps them (`app.store`); the API
goes through the reads layer only, so each layer imports the one below it."""

from __future__ import annotations

from app.store.catalog import DATASET_ID_PATTERN, Catalog
from app.store.dataset import Dataset
from app.store.store_waits import StoreDeadline, current_store_deadline, kept_store_deadline, store_deadline
from app.store.warming import Warmer

__all__ = [
    "DATASET_ID_PATTERN",
    "Catalog",
    "Dataset",
    "StoreDeadline",
    "Warmer",
    "current_store_deadline",
    "kept_store_deadline",
    "store_deadline",
]
