"""Table-driven: what becomes of an attempt."""

from __future__ import annotations

import random

import pytest

from conveyor import JobRouter, Retry
from conveyor.worker import outcomes
from conveyor.worker.outcomes import Kind


def _spec(retry_delays: list[float] | None = None):  # type: ignore[no-untyped-def]
    router = JobRouter()
    router.job("t", retry_delays=retry_delays)(lambda job: None)
    return router.handlers["t"]


@pytest.mark.parametrize(
    ("exc", "retry_count", "max_retries", "delays", "kind", "delay", "consume"),
    [
        (ValueError("x"), 0, 3, [5, 30], Kind.FAIL, 5, True),
        (ValueError("x"), 1, 3, [5, 30], Kind.FAIL, 30, True),
        (ValueError("x"), 2, 3, [5, 30], Kind.FAIL, 30, True),
        (ValueError("x"), 3, 3, [5, 30], Kind.FAIL, None, True),  # exhausted → FAILED
        (ValueError("x"), 0, 0, None, Kind.FAIL, None, True),
        (Retry(delay=4), 3, 3, [5], Kind.FAIL, 5, False),  # Retry: no retry consumed
        (Retry(delay=0), 0, 0, None, Kind.FAIL, 1, False),  # the floor: never a hot loop
        (Retry(delay=0.2), 0, 0, None, Kind.FAIL, 1, False),
    ],
)
def test_failure_table(
    exc: BaseException,
    retry_count: int,
    max_retries: int,
    delays: list[float] | None,
    kind: Kind,
    delay: int | None,
    consume: bool,
) -> None:
    o = outcomes.failed(exc, retry_count=retry_count, max_retries=max_retries, spec=_spec(delays))
    assert (o.kind, o.delay, o.consume) == (kind, delay, consume)
    assert o.error


def test_error_text_names_the_exception_and_keeps_the_traceback() -> None:
    try:
        raise KeyError("missing-thing")
    except KeyError as exc:
        o = outcomes.failed(exc, retry_count=0, max_retries=1, spec=None, rng=random.Random(1))
    assert o.error is not None
    assert "KeyError" in o.error and "missing-thing" in o.error and "Traceback" in o.error


def test_results() -> None:
    assert outcomes.completed(None).result_json is None
    assert outcomes.completed({"a": 1}).result_json == '{"a":1}'
    bad = outcomes.completed({"a": object()})
    assert bad.kind is Kind.FAIL and "not JSON" in (bad.error or "")


@pytest.mark.parametrize(
    ("result", "where"),
    [
        ({"a": [1.0, float("nan")]}, "nan at result.a[1]"),
        ([{"x": float("inf")}], "inf at result[0].x"),
        ((None, float("-inf")), "-inf at result[1]"),
        (float("nan"), "nan at result"),
    ],
)
def test_a_non_finite_number_fails_instead_of_turning_null(result: object, where: str) -> None:
    bad = outcomes.completed(result)
    assert bad.kind is Kind.FAIL and bad.result_json is None
    assert bad.error == f"result is not JSON: numbers must be finite ({where})"
    assert outcomes.completed({"a": None, "b": [1.5, None]}).kind is Kind.COMPLETE


def test_retry_rejects_negative_delay() -> None:
    with pytest.raises(ValueError):
        Retry(delay=-1)


def test_retry_rejects_a_nan_delay() -> None:
    """``Retry(nan)`` snoozed 1 s (``max(nan, 1)`` is nan, snapped to the shortest pen) without a
    word: a delay computed from a broken value is a bug the handler's author should see."""
    with pytest.raises(ValueError, match="a number >= 0"):
        Retry(delay=float("nan"))
    assert Retry(delay=float("inf")).delay == float("inf")  # the longest pen


def test_error_texts_are_cleaned() -> None:
    o = outcomes.failed(ValueError("bad byte \x00 here \ud800"), retry_count=0, max_retries=0,
                        spec=None)  # fmt: skip
    assert o.error is not None and "\x00" not in o.error and "bad byte  here" in o.error
    o.error.encode("utf-8")  # no lone surrogate left
    r = outcomes.failed(Retry(1, reason="x\x00y"), retry_count=0, max_retries=0, spec=None)
    assert r.error == "Retry: xy"
    assert len(outcomes.clean_text("x" * 100_000)) == outcomes.MAX_ERROR_CHARS


# An error text is cut once, by one rule: cut twice (the traceback's tail kept by ``describe``,
# then the whole text's head by ``clean_text`` at twice the limit), a long message would leave up
# to 8,000 characters and no innermost frame.


def test_an_error_text_is_cut_once_keeping_its_message_and_innermost_frame() -> None:
    def innermost() -> None:
        raise ValueError("m" * 50_000)

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        innermost()

    try:
        deep(200)
    except ValueError as exc:
        error = outcomes.failed(exc, retry_count=0, max_retries=0, spec=None).error
    assert error is not None and len(error) == outcomes.MAX_ERROR_CHARS
    assert error.startswith("ValueError: mmm") and error.count(outcomes.CUT) == 1
    assert error.rstrip().endswith("m" * 100)  # the end of the traceback: the raise's line
    short = outcomes.failed(ValueError("short"), retry_count=0, max_retries=0, spec=None)
    assert outcomes.CUT not in (short.error or "")


# A result over ``CONVEYOR_MAX_RESULT_BYTES`` is a clear failure, not stored: the worker's other
# outcomes would wait while a 10 MB one is encoded, sent and parsed.


def test_a_result_over_the_cap_fails_with_its_size() -> None:
    ok = outcomes.completed({"blob": "x" * 1000}, max_bytes=1011)
    assert ok.kind is Kind.COMPLETE and len(ok.result_json or "") == 1011
    big = outcomes.completed({"blob": "x" * 1000}, max_bytes=1010)
    assert big.kind is Kind.FAIL and big.delay is None
    assert big.error == "result too large (1011 bytes > 1010, CONVEYOR_MAX_RESULT_BYTES)"
    assert outcomes.completed({"blob": "x" * 1000}).kind is Kind.COMPLETE  # no cap


def test_an_exception_whose_str_raises_is_described() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    o = outcomes.failed(Unprintable(), retry_count=0, max_retries=0, spec=None)
    assert o.error is not None and "Unprintable" in o.error


def test_raised_at_names_the_innermost_frame_of_the_last_exception() -> None:
    """A worker's ``job_attempt_failed`` line says where the error was raised (``at``): the
    innermost frame of the exception that ended the attempt, not of one it was raised from."""

    def inner() -> None:
        raise KeyError("k")

    def outer() -> None:
        try:
            inner()
        except KeyError as exc:
            raise ValueError("wrapped") from exc

    try:
        outer()
    except ValueError as exc:
        text = outcomes.describe(exc)
    where = outcomes.raised_at(text)
    assert where is not None and where.endswith(" in outer"), where
    assert where.startswith(f"{__file__}:"), where
    assert outcomes.raised_at("Retry: not yet") is None


def test_a_retry_snooze_is_labelled_snoozed_not_as_a_failure() -> None:
    """``conveyor_jobs_finished_total{outcome}``: a Retry asked for a later run and consumed
    nothing, so ConveyorHighFailureRate (retry|failed|lease_expired) does not count it."""
    snooze = outcomes.failed(Retry(delay=5, reason="upstream not ready"), retry_count=0,
                             max_retries=3, spec=None)  # fmt: skip
    error = outcomes.failed(ConnectionError("down"), retry_count=0, max_retries=3, spec=None)
    last = outcomes.failed(ConnectionError("down"), retry_count=3, max_retries=3, spec=None)
    assert (snooze.label, error.label, last.label) == ("snoozed", "retry", "failed")
