"""The error tree: one base class, handler-facing control flow exceptions."""

from __future__ import annotations


class ConveyorError(Exception):
    """Base class of every error Conveyor raises on purpose."""


class InvalidJob(ConveyorError, ValueError):
    """A submitted job is malformed (bad type name, priority, payload, schedule)."""


class DebounceBusy(ConveyorError):
    """A debounced submit waited too long for another transaction that submits with the same
    key and has not committed yet."""


class MissingPartitionKey(InvalidJob):
    """A job of a partitioned type has no partition key (neither given nor in its payload)."""


class PayloadTooLarge(InvalidJob):
    """A job's payload is over the configured limit."""


class UnknownJobType(InvalidJob):
    """No worker registered this job type (and unknown types are not accepted)."""

    def __init__(self, job_type: str, known: list[str]) -> None:
        shown = ", ".join(known[:50]) or "none yet"
        super().__init__(f"unknown job type {job_type!r}: no worker registered it (known: {shown})")
        self.job_type = job_type
        self.known = known


class IdempotencyConflict(ConveyorError):
    """The same Idempotency-Key was used with a different request body."""


class JobNotFound(ConveyorError):
    """No job has that id."""


class InvalidTransition(ConveyorError):
    """The job's status does not allow the requested operation."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class ServiceUnavailable(ConveyorError):
    """PostgreSQL or RabbitMQ cannot be reached right now."""


class Retry(Exception):
    """Raised by a handler to ask for another attempt after ``delay`` seconds.

    A ``Retry`` does not consume one of the job's retries (like Oban's snooze); any other
    exception does.
    """

    def __init__(self, delay: float = 0.0, reason: str = "retry requested") -> None:
        super().__init__(reason)
        if not delay >= 0:  # NaN too
            raise ValueError(f"Retry delay must be a number >= 0, not {delay!r}")
        self.delay = float(delay)
        self.reason = reason
