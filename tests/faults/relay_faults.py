"""Faults injected into a relay from outside (no hook in production code): wrap the relay's
publisher so that something happens after a batch's confirms and before the outbox delete
commits — the window where a crash republishes (duplicates, never losses)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from conveyor.broker.publish import Outgoing
from conveyor.publisher.relay import Relay

Action = Callable[[Sequence[BaseException | None]], Awaitable[None]]


def after_confirm(relay: Relay, action: Action) -> Relay:
    """Run ``action(results)`` after every ``publish_batch`` returns (its confirms are in: None
    per confirmed message), inside the relay's open transaction: raising rolls back the outbox
    delete, ``os._exit`` kills the process."""
    publish_batch = relay.publisher.publish_batch

    async def wrapped(rows: Sequence[Outgoing]) -> list[BaseException | None]:
        results = await publish_batch(rows)
        await action(results)
        return results

    relay.publisher.publish_batch = wrapped  # type: ignore[method-assign]
    return relay


RelaySetup = Callable[[Relay], Any]
