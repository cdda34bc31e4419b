"""The FastAPI application: ``create_app(settings)``. Nothing is built at import time."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.config import Settings
from ..core.errors import (
    IdempotencyConflict,
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    UnknownJobType,
)
from ..core.jobs import CANCELLABLE, REDRIVABLE, Status
from ..core.logging import event
from ..core.metrics import Metrics
from ..enqueue import build_job
from ..job_types import KnownTypes
from ..store import JobRow, for_schema
from ..store.connect import create_pool, is_unavailable, is_unmigrated
from ..store.notify import Notifier
from .access import AccessLog
from .attempts import add_attempt_routes
from .docs import install_docs
from .models import BatchResource, JobPage, JobResource, SubmitBatch, SubmitJob
from .ui import add_ui

log = logging.getLogger("conveyor.api")


class BodyLimit:
    """Reads the request body up to a limit before the app sees it: ``413`` for an oversized body,
    whether it announces a Content-Length or arrives chunked."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await _discard(receive, DISCARD_CAP)
                    await _too_large(send, limit)
                    return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                if message.get("more_body", False):
                    await _discard(receive, DISCARD_CAP)
                await _too_large(send, limit)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        whole = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


DISCARD_CAP = 16 * 1024 * 1024


async def _discard(receive: Receive, cap: int) -> None:
    """Read and drop the rest of a rejected body (up to ``cap`` bytes), so the client gets the
    413 instead of a connection reset while it is still sending."""
    seen = 0
    while seen <= cap:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _too_large(send: Send, limit: int) -> None:
    body = orjson.dumps({"error": "request body too large", "detail": {"limit_bytes": limit}})
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error(status: int, error: str, detail: Any = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def _encode_cursor(row: JobRow) -> str:
    return base64.urlsafe_b64encode(row.id.bytes).decode().rstrip("=")


def _decode_cursor(cursor: str) -> uuid.UUID:
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidJob("invalid cursor") from None


class Api:
    """Routes bound to a pool; ``create_app`` wires them."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = for_schema(settings.db_schema)
        self.known_types = None if settings.accept_unknown_types else KnownTypes(self.store)
        self.pool: Any = None
        self.notifier: Notifier | None = None

    def _wake(self) -> None:
        if self.notifier is not None:
            self.notifier.wake()

    async def start(self) -> None:
        self.pool = await create_pool(
            self.settings.database_url,
            application_name="conveyor-api",
            max_size=self.settings.db_pool_size,
            timeout=self.settings.db_timeout,
            # a server that stopped answering must not hold a request past the spec's 2 s
            command_timeout=self.settings.db_timeout,
        )
        self.notifier = Notifier(self.pool, self.store)
        self.notifier.start()

    async def stop(self) -> None:
        if self.notifier is not None:
            await self.notifier.stop()
        if self.pool is not None:
            await asyncio.wait_for(self.pool.close(), 10)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        try:
            async with asyncio.timeout(self.settings.db_timeout):
                conn = await self.pool.acquire()
        except Exception as exc:
            if is_unavailable(exc):
                raise ServiceUnavailable("database unavailable") from exc
            raise
        try:
            yield conn
        except BaseException as exc:
            if is_unavailable(exc):
                # broken or hung: resetting it would wait for the server, or fail and hide this
                # error behind an InternalClientError (a 500), so drop it
                with contextlib.suppress(Exception):  # asyncpg may have released it already
                    conn.terminate()
                # a handled 503: the catch-all handler would answer it too, but Starlette then
                # re-raises, uvicorn logs a traceback and closes the client's keep-alive connection
                raise ServiceUnavailable("database unavailable") from exc
            if is_unmigrated(exc):
                raise ServiceUnavailable(
                    f"database schema {self.store.schema!r} is not migrated: run `conveyor migrate`"
                ) from exc
            raise
        finally:
            try:
                await self.pool.release(conn)
            except Exception as exc:  # broke after the request's last statement: keep the answer
                event(log, "db_connection_dropped", logging.WARNING, error=repr(exc))

    async def submit(
        self, body: SubmitJob, idempotency_key: str | None
    ) -> tuple[int, dict[str, Any]]:
        new = build_job(
            body.to_spec(idempotency_key), max_payload_bytes=self.settings.max_payload_bytes
        )
        async with self.connection() as conn:
            if self.known_types is not None:
                await self.known_types.check(conn, [new.job_type])
            inserted = await self.store.job_insert_many(conn, [new])  # one atomic statement
            if new.id in inserted:
                self._wake()
                self.metrics.jobs_submitted.labels(new.job_type).inc()
                return 201, _resource(inserted[new.id])
            assert new.idempotency_key is not None
            existing = await self.store.job_get_by_idempotency_key(conn, new.idempotency_key)
        if existing is None or existing.request_hash != new.request_hash:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request body"
            )
        return 200, _resource(existing)

    async def submit_batch(self, body: SubmitBatch) -> dict[str, Any]:
        if len(body.jobs) > self.settings.max_batch:
            raise InvalidJob(f"a batch holds at most {self.settings.max_batch} jobs")
        rows = [
            build_job(j.to_spec(), max_payload_bytes=self.settings.max_payload_bytes)
            for j in body.jobs
        ]
        async with self.connection() as conn:
            if self.known_types is not None:
                await self.known_types.check(conn, [r.job_type for r in rows])
            # one atomic statement: all or none
            found = await self.store.job_insert_many(conn, rows)
        self._wake()
        for r in rows:
            self.metrics.jobs_submitted.labels(r.job_type).inc()
        return {"jobs": [_resource(found[r.id]) for r in rows]}

    async def get(self, job_id: uuid.UUID) -> dict[str, Any]:
        async with self.connection() as conn:
            row = await self.store.job_get(conn, job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return _resource(row)

    async def list(
        self, job_type: str | None, status: Status | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        after = _decode_cursor(cursor) if cursor else None
        async with self.connection() as conn:
            rows = await self.store.job_list(
                conn,
                job_type=job_type,
                status=status.value if status else None,
                after=after,
                limit=limit + 1,
            )
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "jobs": [_resource(r) for r in rows],
            "next_cursor": _encode_cursor(rows[-1]) if more and rows else None,
        }

    async def cancel(self, job_id: uuid.UUID) -> dict[str, Any]:
        async with self.connection() as conn, conn.transaction():
            done = await self.store.job_cancel(conn, job_id)
            row = await self.store.job_get(conn, job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        if not done:
            raise InvalidTransition(
                f"job is {row.status}; only {sorted(CANCELLABLE | {Status.IN_PROGRESS})} "
                "can be cancelled",
                row.status,
            )
        return _resource(row)

    async def retry(self, job_id: uuid.UUID) -> dict[str, Any]:
        async with self.connection() as conn, conn.transaction():
            done = await self.store.job_redrive(conn, [job_id])
            row = await self.store.job_get(conn, job_id)
        self._wake()
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        if not done:
            raise InvalidTransition(
                f"job is {row.status}; only {sorted(REDRIVABLE)} can be retried", row.status
            )
        return _resource(row)

    async def ready(self) -> str | None:
        """None when ready; else why not (the database is unreachable or not migrated)."""
        try:
            async with self.connection() as conn:
                if await self.store.schema_ready(conn, timeout=self.settings.db_timeout):
                    return None
            return f"database schema {self.store.schema!r} is not at the migration head"
        except Exception as exc:
            if isinstance(exc, ServiceUnavailable) or is_unavailable(exc):
                return "database unreachable"
            raise


def _resource(row: JobRow) -> dict[str, Any]:
    """The job resource (``JobResource``'s fields) straight from a row."""
    return {
        "id": row.id,
        "type": row.job_type,
        "status": row.status,
        "priority": row.priority,
        "payload": row.payload,
        "result": row.result,
        "attempts": row.attempts,
        "retry_count": row.retry_count,
        "max_retries": row.max_retries,
        "timeout_seconds": row.timeout_seconds,
        "last_error": row.last_error,
        "cancel_requested": row.cancel_requested,
        "run_at": row.run_at,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
    }


def _json(data: Any, status: int = 200) -> Response:
    # default=str: asyncpg returns its own UUID type, which orjson does not know
    body = orjson.dumps(data, default=str)
    return Response(body, status_code=status, media_type="application/json")


def create_app(settings: Settings, *, metrics: Metrics | None = None) -> FastAPI:
    metrics = metrics or Metrics()
    api = Api(settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await api.start()
        event(log, "api_started")
        try:
            yield
        finally:
            await api.stop()

    app = FastAPI(
        title="Conveyor",
        version="0.1.0",
        description="Background jobs where accepting a job is a database commit.",
        lifespan=lifespan,
    )
    app.state.api = api

    def limit_for(path: str) -> int:
        if path.endswith("/jobs/batch"):
            return settings.max_body_bytes
        return settings.max_payload_bytes + 64 * 1024

    app.add_middleware(BodyLimit, limit_for=limit_for)

    def failure(status: int, error: str, detail: Any = None) -> JSONResponse:
        metrics.api_errors.labels(str(status)).inc()
        return _error(status, error, detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
            for e in exc.errors()
        ]
        return failure(422, "invalid request", detail)

    @app.exception_handler(PayloadTooLarge)
    async def _too_big(_: Request, exc: PayloadTooLarge) -> JSONResponse:
        return failure(413, "payload too large", str(exc))

    @app.exception_handler(UnknownJobType)
    async def _unknown_type(_: Request, exc: UnknownJobType) -> JSONResponse:
        detail = {"type": exc.job_type, "known": exc.known, "message": str(exc)}
        return failure(422, "unknown job type", detail)

    @app.exception_handler(InvalidJob)
    async def _bad_job(_: Request, exc: InvalidJob) -> JSONResponse:
        return failure(422, "invalid job", str(exc))

    @app.exception_handler(IdempotencyConflict)
    async def _conflict(_: Request, exc: IdempotencyConflict) -> JSONResponse:
        return failure(409, "idempotency conflict", str(exc))

    @app.exception_handler(InvalidTransition)
    async def _transition(_: Request, exc: InvalidTransition) -> JSONResponse:
        return failure(409, "invalid transition", {"message": str(exc), "status": exc.status})

    @app.exception_handler(JobNotFound)
    async def _missing(_: Request, exc: JobNotFound) -> JSONResponse:
        return failure(404, "not found", str(exc))

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable_handler(_: Request, exc: ServiceUnavailable) -> JSONResponse:
        return failure(503, "service unavailable", str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if is_unavailable(exc):
            return failure(503, "service unavailable", "database unavailable")
        event(log, "api_unexpected_error", logging.ERROR, error=repr(exc))
        return failure(500, "internal error")

    # The handlers return ready JSON (``_json``): the resource dicts are built from the row in
    # one pass; ``response_model`` documents them in OpenAPI without a second validation.
    @app.post("/jobs", status_code=201, response_model=JobResource)
    async def submit_job(
        body: SubmitJob,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
    ) -> Response:
        status, resource = await api.submit(body, idempotency_key)
        return _json(resource, status)

    @app.post("/jobs/batch", status_code=201, response_model=BatchResource)
    async def submit_batch(body: SubmitBatch) -> Response:
        return _json(await api.submit_batch(body), 201)

    @app.get("/jobs/{job_id}", response_model=JobResource)
    async def get_job(job_id: uuid.UUID) -> Response:
        return _json(await api.get(job_id))

    @app.get("/jobs", response_model=JobPage)
    async def list_jobs(
        type: Annotated[str | None, Query(max_length=100)] = None,
        status: Status | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
    ) -> Response:
        return _json(await api.list(type, status, limit, cursor))

    @app.post("/jobs/{job_id}/cancel", response_model=JobResource)
    async def cancel_job(job_id: uuid.UUID) -> Response:
        return _json(await api.cancel(job_id))

    @app.post("/jobs/{job_id}/retry", response_model=JobResource)
    async def retry_job(job_id: uuid.UUID) -> Response:
        return _json(await api.retry(job_id))

    add_attempt_routes(app, api)
    add_ui(app, api)
    install_docs(app)
    app.add_middleware(AccessLog)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        problem = await api.ready()
        if problem is None:
            return JSONResponse({"status": "ready"})
        return failure(503, "not ready", problem)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
