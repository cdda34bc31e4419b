"""Submit fields and resource fields of the job features (SPEC §10): ``meta`` and unique jobs.
``SubmitJob`` and ``JobResource`` inherit them, so ``models.py`` stays short."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, Strict, StrictStr

from ..job_options import MAX_META_BYTES, MAX_UNIQUE_FOR, MAX_UNIQUE_KEY

_Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class SubmitOptions(BaseModel):
    meta: dict[str, Any] | None = Field(
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
