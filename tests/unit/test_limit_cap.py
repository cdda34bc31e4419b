"""A type's fleet-wide concurrency limit is capped: the controlled claim counts the type's running
jobs, so its cost grows with the limit. Every path that accepts a limit refuses one over the cap:
the handler declaration (``router.job``, also ``conveyor types register``), the API's
``PUT /types/{type}/limits`` body (a 422) and ``conveyor types limit`` (``check_concurrency``;
both run against a stack in ``tests/integration/test_type_pause.py``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conveyor import JobRouter
from conveyor.api.types_routes import LimitsBody
from conveyor.core.limits import check_concurrency

OVER = 10_001


def test_the_cap_keeps_the_claim_cheap() -> None:
    assert check_concurrency(10_000) == 10_000


def test_a_limit_over_the_cap_is_refused_on_every_path() -> None:
    with pytest.raises(ValueError, match="from 1 to 10000"):
        check_concurrency(OVER)
    with pytest.raises(ValueError, match="from 1 to 10000"):
        JobRouter().job("capped", concurrency=OVER)(lambda payload: None)
    with pytest.raises(ValidationError, match="less than or equal to 10000"):
        LimitsBody.model_validate({"concurrency": OVER})
    assert LimitsBody.model_validate({"concurrency": 10_000}).concurrency == 10_000
