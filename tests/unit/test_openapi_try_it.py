"""/docs' "Try it out" can be used more than once: Swagger UI pre-fills a parameter's example
value into its form, and a submit's Idempotency-Key pre-filled with one fixed key turned the
second try with another body into a 409. The key's example lives in the description only."""

from __future__ import annotations

from typing import Any

from conveyor.api.app import create_app
from conveyor.core.config import Settings

SUBMITS = [("/jobs", "post"), ("/jobs/batch", "post"), ("/workflows", "post")]


def _header(
    spec: dict[str, Any], path: str, method: str, name: str = "Idempotency-Key"
) -> dict[str, Any]:
    params = spec["paths"][path][method]["parameters"]
    (header,) = [p for p in params if p["name"] == name]
    return dict(header)


def test_no_submit_pre_fills_an_idempotency_key() -> None:
    spec = create_app(Settings()).openapi()
    for path, method in SUBMITS:
        header = _header(spec, path, method)
        assert header["in"] == "header" and not header["required"], path
        schema = header["schema"]
        prefilled = {"example", "examples"} & (header.keys() | schema.keys())
        assert not prefilled, (path, prefilled)
        assert "default" not in schema, path
        assert "order-42-confirmation" in header["description"], path  # the example, as prose


def test_no_submit_pre_fills_a_traceparent() -> None:
    """A pre-filled traceparent would make every try-it join one fixed trace."""
    spec = create_app(Settings()).openapi()
    for path, method in SUBMITS[:2]:
        header = _header(spec, path, method, "traceparent")
        assert not {"example", "examples"} & (header.keys() | header["schema"].keys()), path
        assert "00-4bf92f35" in header["description"], path
