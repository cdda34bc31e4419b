"""The shop's tests, written only against ``conveyor.testing``: no broker, no worker process."""

from __future__ import annotations

from typing import Any

import pytest
import shop

from conveyor.testing import (
    all_enqueued,
    assert_enqueued,
    drain,
    refute_enqueued,
    run_job,
)

ORDER = {"card": "4242", "cents": 1999, "email": "ann@example.com"}


async def test_placing_an_order_enqueues_its_charge(conveyor_conn: Any) -> None:
    async with conveyor_conn.transaction():
        await shop.place_order(conveyor_conn, 1, **ORDER)
    await assert_enqueued(conveyor_conn, "shop_charge", payload={"order_id": 1}, count=1)
    await assert_enqueued(conveyor_conn, "shop_charge", meta={"tenant": "acme"})
    await refute_enqueued(conveyor_conn, "shop_charge", payload={"order_id": 2})
    await refute_enqueued(conveyor_conn, "shop_receipt")


async def test_an_order_rolled_back_enqueues_nothing(conveyor_conn: Any) -> None:
    with pytest.raises(RuntimeError):
        async with conveyor_conn.transaction():
            await shop.place_order(conveyor_conn, 1, **ORDER)
            raise RuntimeError("the order's insert failed")
    assert await all_enqueued(conveyor_conn) == []


async def test_a_charge_completes_and_its_receipt_follows(conveyor_conn: Any) -> None:
    await shop.place_order(conveyor_conn, 7, **ORDER)
    result = await drain(conveyor_conn, shop.router)
    assert (result.completed, result.retried, result.failed) == (2, 0, 0)
    assert [a.type for a in result.attempts] == ["shop_charge", "shop_receipt"]
    assert shop.handled == ["shop_charge", "shop_receipt"]  # through the middleware
    assert await all_enqueued(conveyor_conn) == []


async def test_a_declined_card_is_retried_then_failed(conveyor_conn: Any) -> None:
    await shop.place_order(conveyor_conn, 8, **{**ORDER, "card": "declined"})
    result = await drain(conveyor_conn, shop.router)
    assert [a.status.value for a in result.attempts] == ["RETRYING", "RETRYING", "FAILED"]
    assert "CardDeclined: card declined declined" in (result.attempts[-1].error or "")
    await refute_enqueued(conveyor_conn, "shop_receipt")  # a failed charge sends no receipt


async def test_without_follow_ups_the_receipt_waits(conveyor_conn: Any) -> None:
    await shop.place_order(conveyor_conn, 9, **ORDER)
    result = await drain(conveyor_conn, shop.router, with_follow_ups=False)
    assert result.completed == 1
    await assert_enqueued(conveyor_conn, "shop_receipt",
                          payload={"order_id": 9, "email": "ann@example.com"})  # fmt: skip


async def test_a_later_order_waits_for_its_time(conveyor_conn: Any) -> None:
    await shop.place_order(conveyor_conn, 10, **ORDER, delay_seconds=3600)
    assert (await drain(conveyor_conn, shop.router)).attempts == []
    await assert_enqueued(conveyor_conn, "shop_charge", payload={"order_id": 10})
    result = await drain(conveyor_conn, shop.router, with_scheduled=True)
    assert result.completed == 2


async def test_the_charge_handler_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class Recording(shop.Payments):
        def charge(self, card: str, cents: int) -> str:
            return "ch_test"

    monkeypatch.setattr(shop, "payments", Recording())
    call = await run_job(shop.router, "shop_charge", {"order_id": 3, **ORDER})
    assert call.result == {"charge": "ch_test"}
    assert [(j.type, j.payload) for j in call.enqueued] == [
        ("shop_receipt", {"order_id": 3, "email": "ann@example.com"})
    ]
