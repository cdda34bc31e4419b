"""Table-driven: what becomes of an attempt."""

from __future__ import annotations

import random

import pytest

from conveyor import Retry
from conveyor.router import JobRouter
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


def test_retry_rejects_negative_delay() -> None:
    with pytest.raises(ValueError):
        Retry(delay=-1)


def test_error_texts_are_cleaned() -> None:
    o = outcomes.failed(ValueError("bad byte \x00 here \ud800"), retry_count=0, max_retries=0,
                        spec=None)  # fmt: skip
    assert o.error is not None and "\x00" not in o.error and "bad byte  here" in o.error
    o.error.encode("utf-8")  # no lone surrogate left
    r = outcomes.failed(Retry(1, reason="x\x00y"), retry_count=0, max_retries=0, spec=None)
    assert r.error == "Retry: xy"
    assert len(outcomes.clean_text("x" * 100_000)) <= 2 * outcomes.MAX_ERROR_CHARS


def test_an_exception_whose_str_raises_is_described() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    o = outcomes.failed(Unprintable(), retry_count=0, max_retries=0, spec=None)
    assert o.error is not None and "Unprintable" in o.error
