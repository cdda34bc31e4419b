"""The FastAPI application: ``create_app(settings)`` wires the routes, the error model, the body
limits and OpenAPI. Nothing is built at import time."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from ..core.config import Settings
from ..core.logging import event
from ..core.metrics import Metrics
from ..core.probes import Background, beside
from . import auth, errors, openapi
from .access import AccessLog
from .attempts import add_attempt_routes
from .body import BodyLimit, TooManyJobs, count_batch_items
from .docs import install_docs
from .models import SubmitBatch, SubmitJob
from .partitions import add_partition_routes
from .routes import add_routes
from .schedules import add_schedule_routes
from .service import Api
from .types_routes import add_type_routes
from .ui import add_ui
from .ui.session import error_page, refused_page
from .workflows import SubmitWorkflow, add_workflow_routes

log = logging.getLogger("conveyor.api")

DESCRIPTION = """Background jobs where accepting a job is a database commit.

Every non-2xx answer is `{"error": <short code>, "detail": <sentence | list of invalid fields |
job status>}`, without stack traces."""


def create_app(
    settings: Settings, *, metrics: Metrics | None = None, background: Background | None = None
) -> FastAPI:
    """``background``: what the process runs beside the API (``conveyor api``: the duties, on
    ``metrics``), from the lifespan's start to its end; ``/healthz`` shows its details."""
    metrics = metrics or Metrics()
    api = Api(settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await api.start()
        try:
            async with beside(background):
                event(log, "api_started")
                yield
        finally:
            await api.stop()

    app = FastAPI(
        title="Conveyor",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        redoc_url=None,  # ReDoc's page loads fonts from the internet; /docs works offline
    )
    app.state.api = api
    auth.install(app, api, settings, refused_page)  # first: every route added below needs its scope
    add_routes(app, api, metrics, None if background is None else background.details)
    add_attempt_routes(app, api)
    add_type_routes(app, api)
    add_partition_routes(app, api)
    add_schedule_routes(app, api)
    add_workflow_routes(app, api)
    add_ui(app, api)
    install_docs(app)
    errors.install(app, metrics, ui_page=error_page)
    openapi.install(app, bodies=[SubmitJob, SubmitBatch, SubmitWorkflow])

    def limit_for(path: str) -> int:
        if path.endswith(("/jobs/batch", "/workflows")):
            return settings.max_body_bytes
        return settings.max_payload_bytes + 64 * 1024

    def too_large(limit: int) -> bytes:
        metrics.api_errors.labels("413").inc()
        return errors.error_body("body_too_large", f"the request body is over {limit} bytes")

    def precheck(path: str, prefix: bytes) -> tuple[int, bytes] | None:
        if not path.endswith("/jobs/batch"):
            return None
        try:
            count_batch_items(prefix, settings.max_batch)
        except TooManyJobs as exc:
            metrics.api_errors.labels("422").inc()
            return 422, errors.error_body("too_many_jobs", str(exc))
        return None

    app.add_middleware(BodyLimit, limit_for=limit_for, render=too_large, precheck=precheck)
    app.add_middleware(errors.ErrorRoutes, fastapi_app=lambda: app)
    app.add_middleware(AccessLog)
    return app
