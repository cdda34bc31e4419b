"""Request and response bodies of the REST API, documented for OpenAPI.

Submit fields are strict: no coercion (``true`` is not 1, ``"30"`` is not 30, ``0`` is not a
date), numbers are finite, ``run_at`` is an ISO 8601 string with an offset whose UTC time lies
inside years 1-9999. The job-type bodies are in ``types_routes.py``, the schedules' in
``schedules.py``."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    Strict,
    StrictInt,
    StrictStr,
    TypeAdapter,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import TypeAliasType

from ..core.jobs import MAX_PRIORITY, MIN_PRIORITY, TYPE_PATTERN, Status
from ..jobs.spec import (
    MAX_DEBOUNCE,
    MAX_DELAY_SECONDS,
    MAX_META_BYTES,
    MAX_PARTITION_KEY,
    MAX_TIMEOUT_SECONDS,
    MAX_UNIQUE_FOR,
    MAX_UNIQUE_KEY,
    MIN_TIMEOUT_SECONDS,
    JobSpec,
    check_run_at,
)
from .resource import resource

# the REST form of core.jobs' priorities (names and range), as the OpenAPI schema shows them
PriorityName = Literal["high", "normal", "low"]
PriorityValue = PriorityName | Annotated[StrictInt, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
_INTEGER_FIELDS = ("priority", "max_retries")
WaitingFor = Literal[
    "dependencies",
    "run_at",
    "paused",
    "ordered",
    "partition_limit",
    "partition_rate",
    "type_limit",
    "type_rate",
]

# The payload's schema: any JSON object whose strings and keys hold no NUL and whose integers fit
# 64 bits (what jsonb and the decoder return unchanged). Only the schema: validation keeps
# ``dict[str, Any]`` (fast), and the body parser and build_job enforce the same rules.
NO_NUL = "^[^\\x00]*$"
_KEYS: JsonDict = {"propertyNames": {"pattern": NO_NUL}}
JsonValue = TypeAliasType(  # type: ignore[misc]  # mypy cannot follow the recursion
    "JsonValue",
    bool
    | Annotated[int, Field(ge=-(2**63) + 2048, le=2**64 - 2048)]  # exact doubles, inside
    | float
    | Annotated[str, Field(pattern=NO_NUL)]
    | list["JsonValue"]  # type: ignore[misc]
    | Annotated[dict[str, "JsonValue"], Field(json_schema_extra=_KEYS)]  # type: ignore[misc]
    | None,
)
PAYLOAD_CORE = TypeAdapter(
    Annotated[dict[str, JsonValue], Field(json_schema_extra=_KEYS)]
).core_schema


class PayloadSchema:
    """Documents ``payload`` as ``JsonValue`` objects without validating through that union."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(PAYLOAD_CORE)


# Years 0002-9998 as written: whatever the offset, the UTC time then lies inside Python's and
# PostgreSQL's common range, away from the two instants asyncpg writes as -infinity / infinity.
# One rule the schema can state (``pattern``) and the server checks the same way.
RUN_AT_PATTERN = r"^(?!0000|0001|9999)\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}"
_ISO_8601 = re.compile(RUN_AT_PATTERN)


def _iso_text(value: Any) -> Any:
    if not isinstance(value, str) or not _ISO_8601.match(value):
        raise ValueError(
            "run_at must be an ISO 8601 string with an offset and a year from 0002 to 9998, "
            "like 2030-01-01T09:00Z"
        )
    return value


RunAt = Annotated[AwareDatetime, BeforeValidator(_iso_text), AfterValidator(check_run_at)]
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


# The job features' fields (``meta``, unique jobs): ``SubmitJob`` and ``JobResource`` inherit them.
def _unset(name: str) -> list[dict[str, Any]]:
    """JSON Schema: ``name`` absent or null (either clause)."""
    return [{"not": {"required": [name]}}, {"properties": {name: {"type": "null"}}}]


def _needs(name: str, number: str) -> dict[str, Any]:
    """JSON Schema: ``name`` absent or null, or ``number`` given as a number."""
    return {
        "anyOf": [*_unset(name), {"required": [number], "properties": {number: {"type": "number"}}}]
    }


# what a job's options need and exclude, beside their own types
OPTION_RULES: list[dict[str, Any]] = [
    _needs("unique_key", "unique_for"),
    _needs("debounce_key", "debounce_seconds"),
    _needs("debounce_max_seconds", "debounce_seconds"),
    # a debounced job's start is the debounce's, and a debounce is its own kind of uniqueness
    {
        "anyOf": [
            *_unset("debounce_seconds"),
            {"allOf": [{"anyOf": _unset(f)} for f in ("run_at", "delay_seconds", "unique_for")]},
        ]
    },
]


class SubmitOptions(BaseModel):
    meta: Annotated[dict[str, Any], PayloadSchema()] | None = Field(
        default=None,
        description=f"A small JSON object (at most {MAX_META_BYTES} bytes of UTF-8; over: 422) "
        "stored with the job, returned in the job resource and handed to the handler as "
        "`job.meta`: a tenant, a trace id, who asked.",
        examples=[{"tenant": "acme", "requested_by": "ada"}],
    )
    unique_for: Annotated[Seconds, Field(gt=0, le=MAX_UNIQUE_FOR)] | None = Field(
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
        """States what the options need and exclude (``OPTION_RULES``), beside the subclass's
        own rules."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        target.setdefault("allOf", []).extend(OPTION_RULES)
        return schema

    partition_key: (
        Annotated[StrictStr, Field(min_length=1, max_length=MAX_PARTITION_KEY, pattern=NO_NUL)]
        | None
    ) = Field(
        default=None,
        description="The job's partition key, for a type with per-key limits (its `partition_by` "
        "payload fields decide when absent; a partitioned type's job with neither: 422 "
        "`missing_partition_key`). Given for a type without limits, its jobs are served key by "
        "key in turn.",
        examples=["account-42"],
    )

    debounce_seconds: Annotated[Seconds, Field(gt=0, le=MAX_DEBOUNCE)] | None = Field(
        default=None,
        description="Debounce: while a job of this type and `debounce_key` has not started, a "
        "submit replaces its payload and `meta` and moves its start to this many seconds from "
        "now (answer 200, `debounced: true`); once it started, a submit makes a new job. Not "
        "with `run_at`, `delay_seconds`, `unique_for` or an Idempotency-Key.",
        examples=[1.0],
    )
    debounce_max_seconds: Annotated[Seconds, Field(gt=0, le=10 * MAX_DEBOUNCE)] | None = Field(
        default=None,
        description="The latest start of a debounced job, in seconds after its first submit "
        "(default: 10 times `debounce_seconds`), however many submits keep coming.",
        examples=[10.0],
    )
    debounce_key: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PARTITION_KEY)] | (
        None
    ) = Field(
        default=None,
        description="What makes submits the same debounced job; default: the partition key, "
        "else the type.",
        examples=["document-7"],
    )

    def options(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "unique_for": self.unique_for,
            "unique_key": self.unique_key,
            "partition_key": self.partition_key,
            "debounce_seconds": self.debounce_seconds,
            "debounce_max_seconds": self.debounce_max_seconds,
            "debounce_key": self.debounce_key,
        }


class ResourceOptions(BaseModel):
    meta: dict[str, Any] | None = Field(
        default=None, description="The `meta` given at submit; null when none."
    )
    duplicate: bool | None = Field(
        default=None,
        description="Only in submit answers: true when a unique job already held the key (the "
        "answer is that job, status 200), false for a new job.",
    )
    debounced: bool | None = Field(
        default=None,
        description="Only in answers to a debounced submit: true when it was folded into the "
        "job of its key still waiting (the answer is that job, status 200), false for a new job.",
    )


class Progress(BaseModel):
    """The running (or last) attempt's report: ``job.set_progress(percent, message)``."""

    percent: float = Field(description="0-100.", examples=[42.5])
    message: str | None = Field(default=None, description="The handler's message, if any.")
    updated_at: datetime = Field(description="When the worker wrote it (database clock).")


_PAYLOAD_EXAMPLE: JsonDict = {"to": "ada@example.com", "template": "welcome"}


class SubmitJob(SubmitOptions):
    """One job to submit. ``run_at`` and ``delay_seconds`` exclude each other; give neither to
    run the job as soon as a worker is free."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"type": "send_email", "payload": _PAYLOAD_EXAMPLE, "priority": "high"},
                {"type": "report.daily", "run_at": "2030-01-01T06:00:00Z", "max_retries": 5},
            ],
            "not": {"required": ["run_at", "delay_seconds"]},
        },
    )

    type: StrictStr = Field(
        pattern=TYPE_PATTERN,
        description="Job type; also the RabbitMQ routing key. Letters, digits, `_`, `.`, `-`; "
        "1-100 characters, starting with a letter or digit.",
        examples=["send_email"],
    )
    payload: Annotated[dict[str, Any], PayloadSchema()] = Field(
        default_factory=dict,
        description="A JSON object handed to the handler as `job.payload`; at most 256 KiB of "
        "UTF-8 (configurable). Numbers must be finite doubles or 64-bit integers; no NUL "
        "character in any string or key. Stored and returned unchanged.",
        examples=[_PAYLOAD_EXAMPLE],
    )
    priority: PriorityValue = Field(
        default="normal",
        description='`"high"` (9), `"normal"` (5), `"low"` (1) or an integer 0-9; higher runs '
        "first under backlog. The resource shows the integer.",
        examples=["high", 7],
    )
    max_retries: Annotated[StrictInt, Field(ge=0, le=1000)] | None = Field(
        default=None,
        description="Retries after the first attempt; absent: the handler's, else 3.",
        examples=[5],
    )
    timeout_seconds: Annotated[Seconds, Field(ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS)] | (
        None
    ) = Field(
        default=None,
        description="Seconds one attempt may run, 0.001 to 604800 (a week); absent: the "
        "handler's timeout, else none.",
        examples=[30],
    )
    run_at: RunAt | None = Field(
        default=None,
        description="When to run: ISO 8601 with an offset (`Z` or `+01:00`), years 0002 to 9998. "
        "A past time runs now. Not together with `delay_seconds`.",
        examples=["2030-01-01T06:00:00Z"],
        json_schema_extra={"pattern": RUN_AT_PATTERN},
    )
    delay_seconds: Annotated[Seconds, Field(ge=0, le=MAX_DELAY_SECONDS)] | None = Field(
        default=None,
        description="Run after this many seconds (0 to ten years). Not together with `run_at`.",
        examples=[60],
    )

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, data: Any) -> Any:
        """JSON Schema's integer: ``2`` and ``2.0`` are the same number (``true`` is none)."""
        if not isinstance(data, dict):
            return data
        p, m = data.get("priority"), data.get("max_retries")
        if (isinstance(p, float) and p.is_integer()) or (isinstance(m, float) and m.is_integer()):
            data = dict(data)
            for f in _INTEGER_FIELDS:
                if isinstance(data.get(f), float) and data[f].is_integer():
                    data[f] = int(data[f])
        return data

    @model_validator(mode="after")
    def _one_schedule(self) -> SubmitJob:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self

    def to_spec(self, idempotency_key: str | None = None) -> JobSpec:
        return JobSpec(
            type=self.type,
            payload=self.payload,
            priority=self.priority,
            max_retries=self.max_retries,
            timeout_seconds=self.timeout_seconds,
            run_at=self.run_at,
            delay_seconds=self.delay_seconds,
            idempotency_key=idempotency_key,
            meta=self.meta,
            unique_for=self.unique_for,
            unique_key=self.unique_key,
            partition_key=self.partition_key,
            debounce_seconds=self.debounce_seconds,
            debounce_max_seconds=self.debounce_max_seconds,
            debounce_key=self.debounce_key,
        )


class SubmitBatch(BaseModel):
    """Up to 1,000 jobs (configurable) committed in one transaction: all or none."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"jobs": [{"type": "send_email"}, {"type": "resize"}]}]},
    )

    # maxItems documents the default CONVEYOR_MAX_BATCH; the configured limit is enforced while
    # the body streams in (body.count_batch_items), before this model sees it
    jobs: list[SubmitJob] = Field(
        min_length=1,
        description="The jobs, answered in the same order (at most 1,000 by default).",
        json_schema_extra={"maxItems": 1000},
    )


class JobResource(ResourceOptions):
    """A job as stored: its request, its state and its timestamps."""

    id: uuid.UUID = Field(description="The job id (also the AMQP message_id).")
    type: str = Field(description="Job type.", examples=["send_email"])
    status: Status = Field(description="Where the job is in its life cycle.")
    priority: int = Field(description="AMQP priority 0-9.", examples=[5])
    payload: dict[str, Any] = Field(description="The submitted payload, unchanged.")
    result: Any = Field(default=None, description="The handler's return value once COMPLETED.")
    attempts: int = Field(description="Attempts started so far.")
    retry_count: int = Field(description="Retries used so far.")
    max_retries: int | None = Field(description="Retries allowed; null: decided at first run.")
    timeout_seconds: float | None = Field(description="Seconds per attempt; null: none.")
    last_error: str | None = Field(
        description="The last failure's final line (exception type and message), without the "
        "traceback.",
        examples=["ValueError: no such recipient"],
    )
    last_error_traceback: str | None = Field(
        default=None,
        description="The last failure's full traceback; null unless the server sets "
        "CONVEYOR_API_EXPOSE_TRACEBACKS (operators: `conveyor jobs show`).",
    )
    cancel_requested: bool = Field(description="A cancel was asked while the job ran.")
    run_at: datetime | None = Field(description="When the job is (or was) due.")
    created_at: datetime = Field(description="Accepted (committed) at.")
    updated_at: datetime = Field(description="Last change.")
    started_at: datetime | None = Field(description="Last attempt started at.")
    finished_at: datetime | None = Field(description="Reached a terminal status at.")
    progress: Progress | None = Field(default=None, description="The handler's last report.")
    workflow_id: uuid.UUID | None = Field(
        default=None, description="The workflow the job belongs to; null for a plain job."
    )
    depends_on: list[uuid.UUID] = Field(
        default_factory=list, description="The ids of the jobs it waits for (in its workflow)."
    )
    partition_key: str | None = Field(
        default=None, description="Its partition key; null for a job of a type without one."
    )
    waiting_for: WaitingFor | None = Field(
        default=None,
        description="Why a WAITING job waits: its `dependencies`, its `run_at`, a pause "
        "(`paused`: its type's or its key's), its key's turn (`ordered`), a limit "
        "(`partition_limit`, `partition_rate`, `type_limit`, `type_rate`); null when it does not "
        "wait, or waits only for its turn in the admission window.",
    )

    @classmethod
    def from_row(cls, row: Any) -> JobResource:
        """The operator's view (``conveyor jobs show``): the full traceback included."""
        return cls.model_validate(resource(row, tracebacks=True))


class BatchResource(BaseModel):
    """The batch's jobs in the order submitted."""

    jobs: list[JobResource] = Field(description="One resource per submitted job, same order.")


class JobPage(BaseModel):
    """One page of jobs, newest first."""

    jobs: list[JobResource] = Field(description="At most `limit` jobs.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )
