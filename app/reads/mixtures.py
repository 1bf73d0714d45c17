"""JSON descriptions of named mixtures (plain dicts, no HTTP): components, shares, and a version that changes
whenever the document or any component's data does."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import orjson

from app.errors import ProblemError
from app.reads.catalog import Catalog
from app.reads.episode_spec import parse_episode_spec, resolve_episodes
from app.store.mixtures import MixtureDocument, load_mixture, mixture_ids

__all__ = ["describe_all", "describe_mixture", "load_mixture", "mixture_ids"]

_MAX_SPEC_CHARS = 1_000_000


def describe_all(catalog: Catalog, directory: Any) -> list[dict[str, Any]]:
    """Every mixture of `directory`, each with its own `status`: `valid` (and its description), or the problem of
    that one document (an invalid file, a component naming no dataset), so one bad document hides no other."""
    described = []
    for mixture_id in mixture_ids(directory):
        try:
            described.append(describe_mixture(catalog, mixture_id, load_mixture(directory, mixture_id)))
        except ProblemError as exc:
            described.append({"id": mixture_id, "status": exc.detail})
    return described


def describe_mixture(catalog: Catalog, mixture_id: str, document: MixtureDocument) -> dict[str, Any]:
    """The document, and per component its share of every epoch (`weight / sum(weights)`), the rows of its view
    and its dataset's version; `version` digests all of it (and the document's `image_size`, where it states
    one)."""
    total = sum(component.weight for component in document.components)
    components = []
    for component in document.components:
        dataset = catalog.get(component.dataset)
        index = dataset.index()
        rows = index.total_rows
        if component.episodes is not None:
            picked = resolve_episodes(parse_episode_spec(component.episodes, _MAX_SPEC_CHARS), index.episodes)
            rows = int(index.episode_lengths[np.searchsorted(index.episodes, picked)].sum())
        components.append(
            {
                **component.model_dump(exclude_none=True),
                "share": component.weight / total,
                "rows": rows,
                "dataset_version": index.digest,
            }
        )
    digested: Any = components
    described: dict[str, Any] = {"id": mixture_id, "components": components}
    if document.image_size is not None:
        described["image_size"] = document.model_dump(mode="json")["image_size"]
        digested = {"components": components, "image_size": described["image_size"]}
    version = hashlib.sha256(orjson.dumps(digested, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    return {**described, "version": version, "status": "valid"}
