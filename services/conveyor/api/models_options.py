"""Submit fields and resource fields of the job features: ``meta`` and unique jobs.
``SubmitJob`` and ``JobResource`` inherit them, so ``models.py`` stays short."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, GetJsonSchemaHandler, Strict, StrictStr
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ..jobs.spec import MAX_META_BYTES, MAX_UNIQUE_FOR, MAX_UNIQUE_KEY

_Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]
# valid when unique_key is absent or null, or unique_for is a number
UNIQUE_KEY_NEEDS_WINDOW: dict[str, Any] = {
    "anyOf": [
        {"not": {"required": ["unique_key"]}},
        {"properties": {"unique_key": {"type": "null"}}},
        {"required": ["unique_for"], "properties": {"unique_for": {"type": "number"}}},
    ]
}


class _MetaSchema:
    """Documents ``meta`` as the payload's JSON objects (no NUL, 64-bit integers)."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        from .models import _PAYLOAD_CORE

        return handler(_PAYLOAD_CORE)


class SubmitOptions(BaseModel):
    meta: Annotated[dict[str, Any], _MetaSchema()] | None = Field(
        default=None,
        description=f"A small JSON object (at most {MAX_META_BYTES} bytes of UTF-8; over: 422) "
        "stored with the job, returned in the job resource and handed to the handler as "
        "`job.meta`: a tenant, a trace id, who asked.",
        examples=[{"tenant": "acme", "requested_by": "ada"}],
    )
    unique_for: Annotated[_Seconds, Field(gt=0, le=MAX_UNIQUE_FOR)] | None = Field(
        default=None,
        description="Seconds during which a submit of the same job (same `unique_key`, by "
        "default the same type and payload) returns this job with 200 and `duplicate: true` "
        "instead of creating another, whatever this job's status meanwhile.",
        examples=[300],
    )
    unique_key: Annotated[StrictStr, Field(min_length=1, max_length=MAX_UNIQUE_KEY)] | None = Field(
        default=None,
        description="What makes two submits of one type the same job (needs `unique_for`); "
        "default: the type and the payload as canonical JSON.",
        examples=["invoice-42"],
    )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """States that ``unique_key`` needs ``unique_for`` (beside the subclass's own rules)."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        target.setdefault("allOf", []).append(UNIQUE_KEY_NEEDS_WINDOW)
        return schema

    def options(self) -> dict[str, Any]:
        return {"meta": self.meta, "unique_for": self.unique_for, "unique_key": self.unique_key}


class ResourceOptions(BaseModel):
    meta: dict[str, Any] | None = Field(
        default=None, description="The `meta` given at submit; null when none."
    )
    duplicate: bool | None = Field(
        default=None,
        description="Only in submit answers: true when a unique job already held the key (the "
        "answer is that job, status 200), false for a new job.",
    )
