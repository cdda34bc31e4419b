"""A small shop, to show how an application tests its jobs with ``conveyor.testing``
(``examples/shop/tests/``). Placing an order enqueues the charge in the caller's transaction;
the charge, once it succeeds, enqueues the receipt as a follow-up."""

from __future__ import annotations

from typing import Any

from conveyor import Job, JobRouter, enqueue

router = JobRouter()


class CardDeclined(Exception):
    pass


class Payments:
    """The payment provider's client; tests swap in their own (``shop.payments = ...``)."""

    def charge(self, card: str, cents: int) -> str:
        if card == "declined":
            raise CardDeclined(f"card {card} declined")
        return f"ch_{card}_{cents}"


payments = Payments()
handled: list[str] = []  # the audit middleware's log: the types it saw, in order


@router.middleware
async def audit(job: Job, call_next: Any) -> Any:
    handled.append(job.type)
    return await call_next(job)


@router.job("shop_charge", max_retries=2, retry_delays=[60])
async def charge(job: Job) -> dict[str, Any]:
    charge_id = payments.charge(job.payload["card"], job.payload["cents"])
    job.enqueue("shop_receipt", {"order_id": job.payload["order_id"],
                                 "email": job.payload["email"]})  # fmt: skip
    return {"charge": charge_id}


@router.job("shop_receipt", timeout=5)
def receipt(job: Job) -> dict[str, Any]:
    """A sync handler: a worker runs it in a thread."""
    return {"sent_to": job.payload["email"]}


@router.job("shop_reminder")
async def reminder(job: Job) -> None:
    """Re-enqueues itself, forever: a periodic chain (``drain`` bounds it with ``max_jobs``)."""
    job.enqueue("shop_reminder", {"n": job.payload.get("n", 0) + 1})


async def place_order(conn: Any, order_id: int, *, card: str, cents: int, email: str,
                      delay_seconds: float | None = None) -> None:  # fmt: skip
    """The application's code under test: enqueues on its caller's connection and transaction
    (here only the job; a real shop would insert its order row beside it)."""
    await enqueue(conn, "shop_charge",
                  {"order_id": order_id, "card": card, "cents": cents, "email": email},
                  meta={"tenant": "acme"}, delay_seconds=delay_seconds)  # fmt: skip
