"""What OpenAPI declares beyond FastAPI's defaults: the error responses of each operation (one
model, with examples), the request bodies the routes parse themselves, and the links that let a
stateful client (Schemathesis) follow a created job to its other operations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, BeforeValidator
from pydantic.json_schema import models_json_schema

from .auth import OPEN, SUBMITS
from .errors import ErrorBody

REF = "#/components/schemas/{model}"

# The keyset page parameters of every list route (``GET /jobs``, ``GET /workflows``)
PageLimit = Annotated[int, Query(ge=1, le=500, description="Page size.")]
# a status filter in any case (`?status=failed`); the schema lists the statuses as stored
AnyCase = BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)
PageCursor = Annotated[
    str | None, Query(pattern=r"^[A-Za-z0-9_-]{22}$", description="`next_cursor` of the last page.")
]

_EXAMPLES: dict[int, tuple[str, str, Any]] = {
    400: ("The body is not JSON.", "malformed_json", "the body is not JSON: unexpected end"),
    404: ("No such job or route.", "not_found", "no job 0190b1a4-9c2e-7d7e-8000-1f6b2e1c4a01"),
    405: (
        "The path exists; the method does not (see `Allow`).",
        "method_not_allowed",
        "GET is not allowed here; allowed: OPTIONS, POST",
    ),
    409: (
        "The request conflicts with the job's state or an earlier use of its Idempotency-Key.",
        "idempotency_conflict",
        "this Idempotency-Key was already used with a different request body",
    ),
    413: (
        "The body (or one job's payload, in UTF-8 bytes) is over its limit.",
        "payload_too_large",
        "payload is 300000 bytes of UTF-8; the limit is 262144",
    ),
    422: (
        "Well-formed JSON that is not a valid request (fields, numbers, nesting, batch size).",
        "invalid_request",
        [
            {
                "loc": ["body", "priority"],
                "msg": "Input should be 'high', 'normal' or 'low'",
                "type": "literal_error",
            }
        ],
    ),
    401: (
        "No API key, or not a valid one (see `WWW-Authenticate`).",
        "unauthorized",
        "an API key is required: Authorization: Bearer <key>",
    ),
    403: (
        "The key lacks the scope this operation needs.",
        "forbidden",
        "this key lacks the scope jobs:write",
    ),
    429: (
        "Over this key's submit quota; retry after `Retry-After` seconds.",
        "rate_limited",
        "over the submit quota; retry in 1 s",
    ),
    503: (
        "PostgreSQL is unreachable; answered within 2 s. Safe to retry (with the same "
        "Idempotency-Key for submits).",
        "service_unavailable",
        "database unavailable",
    ),
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each code with the error model and an example."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        description, error, detail = _EXAMPLES[code]
        out[code] = {
            "model": ErrorBody,
            "description": description,
            "content": {"application/json": {"example": {"error": error, "detail": detail}}},
        }
        if code == 405:
            allow = {"description": "The methods this path serves.", "schema": {"type": "string"}}
            out[code]["headers"] = {"Allow": allow}
    return out


def json_body(
    model: type[BaseModel],
    description: str,
    headers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its body (see ``body.py``) and ``headers``
    itself."""
    extra: dict[str, Any] = {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        }
    }
    if headers:
        extra["parameters"] = headers
    return extra


def submit_headers() -> list[dict[str, Any]]:
    """The headers a submit reads (``routes.idempotency_key``, tracing)."""
    return [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            # no "example": Swagger UI would pre-fill it, and a second try with another body
            # would reuse the key (a 409)
            "description": "Makes a retry safe: the same key with the same body returns the "
            "first answer's jobs (200) without creating new ones; a different body with it is "
            "a 409. Use one key per operation of yours, e.g. `order-42-confirmation`.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 255},
        },
        {
            "name": "traceparent",
            "in": "header",
            "required": False,
            # no "example" either: every try-it would join one fixed trace
            "description": "W3C Trace Context of the caller (with `conveyor[otel]` and tracing "
            "on): the submit's span, and every attempt of the job, join the caller's trace, "
            "e.g. `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`. An invalid value "
            "is ignored (a new trace starts), as the W3C recommendation says.",
            "schema": {"type": "string"},
        },
    ]


# After POST /jobs (201/200), the new job's id feeds the operations on one job.
_JOB_LINKS = {
    "GetJob": {"operationId": "get_job", "parameters": {"job_id": "$response.body#/id"}},
    "CancelJob": {"operationId": "cancel_job", "parameters": {"job_id": "$response.body#/id"}},
    "RetryJob": {"operationId": "retry_job", "parameters": {"job_id": "$response.body#/id"}},
}
_BATCH_LINKS = {
    "GetFirstJob": {
        "operationId": "get_job",
        "parameters": {"job_id": "$response.body#/jobs/0/id"},
    },
}


def install(app: FastAPI, bodies: Sequence[type[BaseModel]]) -> None:
    """The app's OpenAPI document, with the schemas of ``bodies``: the request bodies that routes
    read themselves (``json_body``) and FastAPI therefore does not see."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        _, defs = models_json_schema([(b, "validation") for b in bodies], ref_template=REF)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in defs.get("$defs", {}).items():
            components.setdefault(name, definition)
        for path, links in (("/jobs", _JOB_LINKS), ("/jobs/batch", _BATCH_LINKS)):
            responses = schema["paths"][path]["post"]["responses"]
            for code in ("200", "201"):
                if code in responses:
                    responses[code]["links"] = links
        _security(app, schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _security(app: FastAPI, schema: dict[str, Any]) -> None:
    """With auth required: the bearer scheme, each operation's scope, and its 401/403 (429 for
    submits), from ``auth.ROUTE_SCOPES`` (with auth disabled nothing is declared: a client needs
    no key, and a fuzzer must not expect a 401)."""
    auth = getattr(app.state, "auth", None)
    if auth is None or not auth.required:
        return
    schema["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key, "
            "`conveyor keys create --name N --scopes jobs:read,jobs:write`.",
        }
    }
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            need = auth.scope_of(method.upper(), path)
            if need is None or need == OPEN:
                continue
            op["security"] = [{"bearer": []}]
            op["description"] = f"{op.get('description', '')}\n\nNeeds scope `{need}`.".strip()
            codes = (401, 403, 429) if (method.upper(), path) in SUBMITS else (401, 403)
            for code in codes:
                description, error, detail = _EXAMPLES[code]
                example = {"error": error, "detail": detail}
                schema_ref = {"$ref": REF.format(model="ErrorBody")}
                content = {"application/json": {"schema": schema_ref, "example": example}}
                op["responses"].setdefault(
                    str(code), {"description": description, "content": content}
                )
                if code == 401:
                    op["responses"]["401"]["headers"] = {
                        "WWW-Authenticate": {
                            "description": "`Bearer`",
                            "schema": {"type": "string"},
                        }
                    }
                if code == 429:
                    wait = {"description": "Seconds to wait.", "schema": {"type": "integer"}}
                    op["responses"]["429"]["headers"] = {"Retry-After": wait}
