"""The FastAPI application: `create_app(settings)` wires settings, catalog, error handlers and routers."""

from __future__ import annotations

import faulthandler
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.api import cache, datasets, health, mixtures, rows
from app.api.deps import bound_store_waits
from app.api.docs import install_docs
from app.api.inflight import InflightBudget
from app.api.observability import ObservabilityMiddleware
from app.api.problems import OrjsonResponse, install_problem_handlers, install_problem_schema, problem_responses
from app.api.query_checks import reject_unknown_query
from app.api.row_route import install as install_row_routes
from app.api.tokens import require_token
from app.api.ui import install_viewer
from app.auth import TokenVerifier
from app.logs import configure_logging
from app.roots import resolve_roots
from app.settings import Settings, is_remote_root
from app.store.catalog import Catalog
from app.store.segment_builds import stop_background_builds
from app.store.warming import Warmer

log = logging.getLogger("episerve")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application. The catalog loads at startup; `/readyz` says when it is ready."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        roots = await run_in_threadpool(resolve_roots, settings)
        app.state.read_limiter = anyio.CapacityLimiter(settings.max_concurrent_reads)
        app.state.inflight = InflightBudget(settings.max_inflight_bytes)
        app.state.catalog = await run_in_threadpool(Catalog, settings, roots)
        app.state.catalog.hub.start_configured()  # by the serving process (not the command checking the settings)
        log.info("serving %d datasets from %s", len(app.state.catalog.ids()), ", ".join(map(str, roots)))
        yield
        app.state.warmer.shutdown()
        stop_background_builds()

    app = FastAPI(
        title="episerve",
        version=__version__,
        description="Episode-filtered rows of LeRobot-style parquet datasets as Arrow IPC streams.",
        default_response_class=OrjsonResponse,
        lifespan=lifespan,
        docs_url=None,  # served by app.api.docs with local assets instead of a CDN's
        redoc_url=None,
        # episerve reports through its own metrics and access log; FastAPI's OpenTelemetry hooks would look up
        # the global providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.token_verifier = TokenVerifier(settings.accepted_tokens())
    app.state.warmer = Warmer()
    app.add_middleware(ObservabilityMiddleware)
    install_problem_handlers(app)
    install_problem_schema(app)
    # Health and metrics stay lenient about their query: probes and scrapers add cache-busting parameters.
    protected = [Depends(require_token), Depends(reject_unknown_query)]
    reads_store = any(isinstance(root, str) and is_remote_root(root) for root in settings.roots)
    app.state.store_wait_s = settings.remote_wait_s if reads_store else None
    if reads_store:
        protected.append(Depends(bound_store_waits))  # no per-request deadline to set where no store is read
    # Every data endpoint may answer these: a missing or wrong token, invalid input, and a catalog still loading
    # or a dataset unreadable.
    guarded = problem_responses(401, 403, 422, 503)
    install_row_routes(app, rows.router)  # they check what `protected` does themselves
    install_docs(app)
    install_viewer(app)
    app.include_router(health.router)
    app.include_router(cache.router, dependencies=protected, responses=guarded)
    app.include_router(datasets.router, dependencies=protected, responses=guarded)
    app.include_router(mixtures.router, dependencies=protected, responses=guarded)
    return app


def app_from_environment() -> FastAPI:
    """Factory for `uvicorn --factory`: settings from `EPISERVE_*` variables (each worker calls it)."""
    faulthandler.enable(all_threads=True)  # a fatal signal (SIGBUS, SIGSEGV) logs every thread's traceback
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings)
