"""Over the wire: what ``POST /jobs`` accepts comes back identical from
``GET /jobs/{id}`` (payload through jsonb, run_at through timestamptz, numbers included)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from conveyor.core.config import Settings

from ..stack import running_stack
from ..unit.test_submit_properties import offsets

# the documented run_at range: years 0002-9998 as written
instants = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31, 23, 59, 59), timezones=offsets
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12).filter(lambda s: "\x00" not in s)
    | st.sampled_from(["\\u0000", "\U0001f600", "\u2028"])
)
payloads = st.dictionaries(
    st.text(max_size=8).filter(lambda s: "\x00" not in s),
    st.recursive(
        json_scalars,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(max_size=5).filter(lambda s: "\x00" not in s), inner)
        ),
        max_leaves=12,
    ),
    max_size=5,
)


@st.composite
def accepted_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"type": draw(st.from_regex(r"[a-z][a-z0-9_.-]{0,10}", fullmatch=True))}
    body["payload"] = draw(payloads)
    if draw(st.booleans()):
        body["max_retries"] = draw(st.integers(0, 1000))
    if draw(st.booleans()):
        body["timeout_seconds"] = draw(st.floats(0.001, 604800))
    if draw(st.booleans()):
        body["run_at"] = draw(instants).isoformat()
    return body


@pytest.mark.timeout(300)
async def test_accepted_submissions_round_trip(settings: Settings) -> None:
    # random types: the bounded-types policy (a 422 for unregistered ones) is tested elsewhere
    # the whole documented run_at range (no schedule horizon: test_quotas.py tests that)
    open_types = settings.model_copy(
        update={"accept_unknown_types": True, "max_schedule_days": 3_000_000}
    )
    async with running_stack(open_types, None, maintenance=False, relays=0) as stack:
        base = str(stack.client.base_url)

        @hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(accepted_bodies())
        def check(body: dict[str, Any]) -> None:
            with httpx.Client(base_url=base, timeout=30) as c:
                r = c.post("/jobs", content=orjson.dumps(body))
                assert r.status_code == 201, (body, r.text)
                got = c.get(f"/jobs/{r.json()['id']}").json()
            # JSON equality: 1e16 and 10000000000000000 are one number (jsonb keeps numerics)
            assert got["payload"] == body["payload"], (body["payload"], got["payload"])
            assert got["type"] == body["type"]
            assert got["max_retries"] == body.get("max_retries")
            assert got["timeout_seconds"] == body.get("timeout_seconds")
            if "run_at" in body:
                sent = datetime.fromisoformat(body["run_at"])
                assert datetime.fromisoformat(got["run_at"]) == sent

        await asyncio.to_thread(check)
