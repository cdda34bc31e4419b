"""One error shape for every non-2xx answer, a true ``Allow``, an OpenAPI document
that declares what is served, and no tracebacks in job resources."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import TypeAdapter

from conveyor import JobRouter
from conveyor.api.errors import ErrorBody
from conveyor.core.config import Settings

from ..stack import Stack, running_stack, wait_for


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    async with running_stack(settings, None, maintenance=False, relays=0) as s:
        yield s


def _shape(r: Any, status: int, error: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error", "detail"}, body
    ErrorBody.model_validate(body)
    assert "Traceback" not in r.text and "<Status." not in r.text
    if error is not None:
        assert body["error"] == error, body
    return dict(body)


async def test_every_error_has_one_shape(stack: Stack) -> None:
    c = stack.client
    json_h = {"content-type": "application/json"}
    _shape(await c.post("/jobs", content=b"{not json", headers=json_h), 400, "malformed_json")
    deep = b'{"type": "t", "payload": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    _shape(await c.post("/jobs", content=deep, headers=json_h), 422, "nesting_too_deep")
    _shape(await c.get("/nope"), 404, "not_found")
    _shape(await c.get(f"/jobs/{uuid.uuid4()}"), 404, "not_found")
    _shape(await c.get("/jobs/not-a-uuid"), 404, "not_found")
    r = await c.get("/jobs/batch")
    _shape(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "OPTIONS, POST"
    r = await c.delete("/jobs")
    _shape(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "GET, OPTIONS, POST"
    r = await c.options("/jobs")
    assert r.status_code == 204 and r.headers["allow"] == "GET, OPTIONS, POST"
    r = await c.options(f"/jobs/{uuid.uuid4()}/cancel")
    assert r.status_code == 204 and r.headers["allow"] == "OPTIONS, POST"
    _shape(await c.options("/nope"), 404, "not_found")
    _shape(await c.post("/jobs", json={"type": "t", "x": 1}), 422, "invalid_request")
    _shape(await c.get("/jobs", params={"limit": 0}), 422, "invalid_request")
    big = {"type": "t", "payload": {"b": "x" * (400 * 1024)}}
    _shape(await c.post("/jobs", json=big), 413, "body_too_large")
    job = await stack.submit("t")
    assert (await c.post(f"/jobs/{job}/cancel")).status_code == 200
    body = _shape(await c.post(f"/jobs/{job}/cancel"), 409, "invalid_transition")
    assert body["detail"]["status"] == "CANCELLED"
    assert "CANCELLED" in body["detail"]["message"]
    h = {"Idempotency-Key": "k"}
    assert (await c.post("/jobs", json={"type": "t"}, headers=h)).status_code == 201
    _shape(await c.post("/jobs", json={"type": "x"}, headers=h), 409, "idempotency_conflict")
    r = await c.post("/jobs", json={"type": "nobody-registered-this"})
    assert _shape(r, 422, "unknown_job_type")["detail"]["type"] == "nobody-registered-this"


async def test_a_huge_422_is_small(stack: Stack) -> None:
    r = await stack.client.post("/jobs/batch", json={"jobs": [{"type": "bad type"}] * 1000})
    _shape(r, 422, "invalid_request")
    assert len(r.content) < 5000


def _send_all_then_read(port: int, head: bytes, size: int) -> bytes:
    """A client that writes its whole body before reading anything."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        chunk = b"x" * (1 << 20)
        sent = 0
        while sent < size:
            s.sendall(chunk[: size - sent])
            sent += len(chunk)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while data := s.recv(65536):
            out += data
        return out


async def test_a_70mb_body_sent_before_reading_gets_its_413(stack: Stack) -> None:
    port = int(str(stack.client.base_url).rsplit(":", 1)[1].strip("/"))
    size = 70 * 1024 * 1024
    head = (f"POST /jobs/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()  # fmt: skip
    answer = await asyncio.to_thread(_send_all_then_read, port, head, size)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"error":"body_too_large"' in answer


async def test_openapi_declares_what_is_served(stack: Stack) -> None:
    spec = (await stack.client.get("/openapi.json")).json()
    ops = {(p, m): op for p, item in spec["paths"].items() for m, op in item.items()}
    submit = ops[("/jobs", "post")]
    assert {"200", "201", "400", "409", "413", "422", "503"} <= set(submit["responses"])
    assert {"200", "201", "400", "409", "413", "422", "503"} <= set(
        ops[("/jobs/batch", "post")]["responses"]
    )
    assert {"404", "409", "503"} <= set(ops[("/jobs/{job_id}/cancel", "post")]["responses"])
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for (path, method), op in ops.items():
        assert op.get("description") and op.get("summary"), (path, method)
        for code, response in op["responses"].items():
            if code.startswith(("4", "5")):
                content = response["content"]["application/json"]
                assert content["schema"] == error_ref, (path, method, code)
                assert content["example"]["error"], (path, method, code)
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    for name in ("SubmitJob", "SubmitBatch", "JobResource", "ErrorBody"):
        for field, prop in schemas[name]["properties"].items():
            assert prop.get("description"), (name, field)
    assert schemas["SubmitJob"]["not"] == {"required": ["run_at", "delay_seconds"]}
    assert schemas["SubmitJob"]["examples"]
    # the declared error model is the one served
    r = await stack.client.post("/jobs", json={"type": 1})
    TypeAdapter(ErrorBody).validate_python(r.json())


async def test_last_error_shows_the_last_line_not_the_traceback(settings: Settings) -> None:
    router = JobRouter()

    @router.job("boom", max_retries=0)
    async def boom(job: Any) -> None:
        raise ValueError("no such recipient")

    async with running_stack(settings, router) as s:
        job = await s.submit("boom")
        await wait_for(settings.database_url, [job], ["FAILED"])
        got = (await s.client.get(f"/jobs/{job}")).json()
    assert got["last_error"] == "ValueError: no such recipient"
    assert got["last_error_traceback"] is None
    exposed = settings.model_copy(update={"api_expose_tracebacks": True})
    async with running_stack(exposed, None, maintenance=False, relays=0) as s:
        got = (await s.client.get(f"/jobs/{job}")).json()
    traceback = got["last_error_traceback"]
    assert "Traceback (most recent call last)" in traceback and ".py" in traceback


async def test_submit_headers_declared_and_validated(stack: Stack) -> None:
    """Both submit routes declare ``Idempotency-Key`` (1-255 characters) and ``traceparent``
    (W3C Trace Context, optional: an invalid one is ignored, a new trace starts) as header
    parameters; a key outside its bounds is a 422 naming the header, and writes nothing."""
    spec = (await stack.client.get("/openapi.json")).json()
    for path in ("/jobs", "/jobs/batch"):
        params = {p["name"]: p for p in spec["paths"][path]["post"].get("parameters", [])}
        assert set(params) == {"Idempotency-Key", "traceparent"}, (path, sorted(params))
        for p in params.values():
            assert p["in"] == "header" and not p.get("required") and p.get("description"), p
        key = params["Idempotency-Key"]["schema"]
        assert (key.get("minLength"), key.get("maxLength")) == (1, 255), key
    for path, body in (("/jobs", {"type": "t"}), ("/jobs/batch", {"jobs": [{"type": "t"}]})):
        for bad in ("k" * 256, ""):
            r = await stack.client.post(path, json=body, headers={"Idempotency-Key": bad})
            got = _shape(r, 422, "invalid_request")
            assert got["detail"][0]["loc"] == ["header", "idempotency-key"], got
        r = await stack.client.post(path, json=body, headers={"traceparent": "not-a-trace"})
        assert r.status_code in (201, 422), r.text  # 422 only for the unknown type "t"
        assert r.json().get("error") != "invalid_request", r.text
