"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.problems import OrjsonResponse, problem

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the catalog is loaded")
def readyz(request: Request) -> OrjsonResponse:
    catalog = getattr(request.app.state, "catalog", None)
    if catalog is None:
        return problem(503, "the catalog is still loading")
    return OrjsonResponse({"status": "ready", "datasets": len(catalog.ids())})
