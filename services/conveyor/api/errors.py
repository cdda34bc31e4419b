"""One error shape for every non-2xx answer: ``{"error": <short code>, "detail": <str|object>}``
(under ``/ui``, the dashboard's, the same error as a page).

Every exception that can reach a client is mapped here; ``install`` registers the handlers, and
``ErrorRoutes`` answers unknown paths (404), wrong methods (405 with the true ``Allow`` header)
and ``OPTIONS`` (204 with the same header) before FastAPI's defaults could."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import (
    DebounceBusy,
    IdempotencyConflict,
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    MissingPartitionKey,
    PayloadTooLarge,
    ServiceUnavailable,
    UnknownJobType,
)
from ..core.jobs import Status
from ..core.logging import event
from ..core.metrics import Metrics
from ..jobs.schedules import InvalidSchedule
from ..store.connect import is_unavailable
from .body import BodyError, TooManyJobs
from .liveness import unavailable

log = logging.getLogger("conveyor.api")

# FastAPI's words for a body it could not decode (not UTF-8, say) before validating it
FASTAPI_UNPARSABLE_BODY = "There was an error parsing the body"

# A 422 lists at most this many problems (a 1,000-job batch of bad jobs answers in a few KB).
MAX_ERRORS = 20


def json_response(data: Any, status: int = 200) -> Response:
    """JSON as every route answers it (orjson: times as ``+00:00``; ``default=str``: asyncpg's
    own UUID type, which orjson does not know). ``response_model`` still documents it."""
    return Response(orjson.dumps(data, default=str), status, media_type="application/json")


def error_body(error: str, detail: Any = None) -> bytes:
    return orjson.dumps({"error": error, "detail": detail})


def error_response(
    status: int, error: str, detail: Any = None, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        error_body(error, detail), status, headers=headers, media_type="application/json"
    )


def validation_detail(errors: Iterable[Any], prefix: tuple[str | int, ...] = ()) -> Any:
    """Pydantic errors as ``[{"loc", "msg", "type"}]`` (no input echoed back), capped."""
    out: list[dict[str, Any]] = []
    total = 0
    for e in errors:
        total += 1
        if len(out) < MAX_ERRORS:
            loc = [*prefix, *e.get("loc", ())]
            out.append({"loc": loc, "msg": str(e.get("msg")), "type": str(e.get("type"))})
    if total > len(out):
        out.append({"loc": [], "msg": f"{total - len(out)} more errors", "type": "truncated"})
    return out


# exceptions answered with their message as ``detail``: (status, error code)
PLAIN: dict[type[Exception], tuple[int, str]] = {
    TooManyJobs: (422, "too_many_jobs"),
    PayloadTooLarge: (413, "payload_too_large"),
    MissingPartitionKey: (422, "missing_partition_key"),
    InvalidJob: (422, "invalid_job"),
    InvalidSchedule: (422, "invalid_schedule"),
    IdempotencyConflict: (409, "idempotency_conflict"),
    DebounceBusy: (409, "debounce_busy"),
    JobNotFound: (404, "not_found"),
    ServiceUnavailable: (503, "service_unavailable"),
}


def install(
    app: FastAPI,
    metrics: Metrics,
    *,
    ui_page: Callable[[Request, int, str], Response] | None = None,
) -> None:
    """The handlers. Under ``/ui`` an error is ``ui_page(request, status, message)``, a page of
    the dashboard (a browser showed the JSON), and JSON everywhere else."""

    def failure(
        request: Request,
        status: int,
        error: str,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        metrics.api_errors.labels(str(status)).inc()
        path = request.url.path
        if ui_page is not None and (path == "/ui" or path.startswith("/ui/")):
            page = ui_page(request, status, _sentence(detail) or error.replace("_", " "))
            page.headers.update(headers or {})
            return page
        return error_response(status, error, detail, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return failure(request, 422, "invalid_request", validation_detail(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _invalid_body(request: Request, exc: ValidationError) -> Response:
        detail = validation_detail(exc.errors(), ("body",))
        return failure(request, 422, "invalid_request", detail)

    @app.exception_handler(BodyError)
    async def _bad_body(request: Request, exc: BodyError) -> Response:
        return failure(request, exc.status, exc.error, exc.detail)

    @app.exception_handler(UnknownJobType)
    async def _unknown_type(request: Request, exc: UnknownJobType) -> Response:
        detail = {"type": exc.job_type, "known": exc.known, "message": str(exc)}
        return failure(request, 422, "unknown_job_type", detail)

    @app.exception_handler(InvalidTransition)
    async def _transition(request: Request, exc: InvalidTransition) -> Response:
        detail = {"message": str(exc), "status": exc.status}
        return failure(request, 409, "invalid_transition", detail)

    async def _plain(request: Request, exc: Exception) -> Response:
        # the nearest class of PLAIN in the exception's MRO: the one Starlette matched it by
        status, error = next(PLAIN[c] for c in type(exc).__mro__ if c in PLAIN)
        return failure(request, status, error, str(exc))

    for exc_type in PLAIN:
        app.add_exception_handler(exc_type, _plain)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return failure(request, 404, "not_found", f"no route {request.url.path}")
        if exc.status_code == 405:
            allow = allowed_methods(request.app, request.scope)
            detail = f"{request.method} is not allowed here; allowed: {', '.join(allow)}"
            return failure(request, 405, "method_not_allowed", detail, {"Allow": ", ".join(allow)})
        if exc.status_code == 400 and exc.detail == FASTAPI_UNPARSABLE_BODY:
            # a route with a model body (PUT /schedules, /types/.../limits) given bytes that
            # are not JSON text: the 400 the raw-body routes answer
            return failure(request, 400, "malformed_json", "the body is not JSON")
        code = re.sub(r"[^a-z]+", "_", str(exc.detail).lower()).strip("_") or "error"
        return failure(request, exc.status_code, code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        if is_unavailable(exc):
            detail = str(unavailable(type(exc).__name__, exc))
            return failure(request, 503, "service_unavailable", detail)
        event(log, "api_unexpected_error", logging.ERROR, error=repr(exc)[:1000])
        return failure(request, 500, "internal_error", "an unexpected error; it has been logged")


def _sentence(detail: Any) -> str:
    """An error's ``detail`` as one line of text for a page."""
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg', '')}" for d in detail
        )
    if isinstance(detail, dict):
        return str(detail.get("message", detail))
    return "" if detail is None else str(detail)


def allowed_methods(app: Any, scope: Scope) -> list[str]:
    """Every method some route serves at this path (the truth for ``Allow``)."""
    methods: set[str] = set()
    probe = {**scope, "type": "http"}
    for route in app.router.routes:
        route_methods = getattr(route, "methods", None)
        if not route_methods:
            continue
        match, _ = route.matches({**probe, "method": next(iter(route_methods))})
        if match is Match.FULL:
            methods |= set(route_methods)
    if methods:
        methods.add("OPTIONS")
    return sorted(methods)


class ErrorRoutes:
    """``OPTIONS`` answers 204 with the path's true ``Allow`` header (404 for unknown paths)."""

    def __init__(self, app: ASGIApp, fastapi_app: Callable[[], Any]) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        allow = allowed_methods(self.fastapi_app(), scope)
        if not allow:
            body = error_body("not_found", f"no route {scope['path']}")
            status, headers = 404, [(b"content-type", b"application/json")]
        else:
            body = b""
            status, headers = 204, [(b"allow", ", ".join(allow).encode())]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


# The error body every non-2xx answer has (built below; OpenAPI documents it).
class Problem(BaseModel):
    """One invalid field."""

    loc: list[str | int] = Field(description="Where: `body`, field names and list indexes.")
    msg: str = Field(description="What is wrong.")
    type: str = Field(description="Pydantic's error type.")


class TransitionDetail(BaseModel):
    message: str = Field(description="Why the operation does not apply.")
    status: Status = Field(description="The job's current status.")


class UnknownTypeDetail(BaseModel):
    type: str = Field(description="The type no worker registered.")
    known: list[str] = Field(description="The registered types.")
    message: str = Field(description="The same as a sentence.")


class ErrorBody(BaseModel):
    """Every non-2xx answer has this shape."""

    error: str = Field(
        description="A short code: malformed_json, invalid_request, invalid_number, "
        "nesting_too_deep, too_many_jobs, invalid_job, unknown_job_type, payload_too_large, "
        "body_too_large, "
        "not_found, method_not_allowed, idempotency_conflict, invalid_transition, "
        "service_unavailable.",
        examples=["invalid_request"],
    )
    detail: str | list[Problem] | TransitionDetail | UnknownTypeDetail = Field(
        description="A sentence, the list of invalid fields (422), the job's status (409), or "
        "the unknown type and the known ones (422)."
    )
