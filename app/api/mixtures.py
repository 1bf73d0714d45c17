"""Named mixture endpoints: the list of mixtures, and one mixture with its components' shares and its version."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from app.api.deps import get_catalog, get_settings
from app.api.problems import problem_responses
from app.reads.catalog import Catalog
from app.reads.mixtures import describe_all, describe_mixture, load_mixture
from app.settings import Settings

router = APIRouter(tags=["mixtures"])


@router.get(
    "/mixtures",
    summary="Named mixtures: ids, components, weights, shares and versions",
    description="Every mixture has a `status`: `valid`, or the problem of that one document (it is then listed "
    "with its `id` only).",
)
def list_mixtures(settings: Settings = Depends(get_settings), catalog: Catalog = Depends(get_catalog)) -> dict:
    return {"mixtures": describe_all(catalog, settings.mixtures_dir)}


@router.get(
    "/mixtures/{mixture_id:path}",
    summary="One named mixture: its document, each component's share, rows and dataset version, and its version",
    description="The version changes whenever the document or any component's data changes.",
    responses=problem_responses(404),
)
def mixture_info(
    mixture_id: str, settings: Settings = Depends(get_settings), catalog: Catalog = Depends(get_catalog)
) -> dict[str, Any]:
    return describe_mixture(catalog, mixture_id, load_mixture(settings.mixtures_dir, mixture_id))
