"""Coalesced acknowledgements never cover a delivery that is still running."""

from __future__ import annotations

from typing import Any

from conveyor.broker.acks import Acks
from conveyor.broker.consume import Delivery


class Recorded(Delivery):
    """A ``Delivery`` whose acks are recorded instead of sent (the bookkeeping is the subject
    here; ``tests/integration/test_broker_acks.py`` acks on a real channel, open and closed)."""

    log: list[tuple[int, bool]]

    async def ack(self, multiple: bool = False) -> None:
        assert self.delivery_tag is not None
        self.log.append((self.delivery_tag, multiple))


def _messages(n: int, channel: object, log: list[tuple[int, bool]]) -> list[Any]:
    out = []
    for t in range(1, n + 1):
        d = Recorded(b"{}", "q", None, t, channel)
        d.log = log
        out.append(d)
    return out


async def test_a_finished_prefix_goes_in_one_frame() -> None:
    log: list[tuple[int, bool]] = []
    acks, ch = Acks(), object()
    msgs = _messages(6, ch, log)
    for m in msgs:
        acks.track(m)
    assert await acks.ack([msgs[2], msgs[0], msgs[1]]) == 1
    assert log == [(3, True)]
    # 5 finishes while 4 still runs: acked alone, never covering 4
    assert await acks.ack([msgs[4]]) == 1
    assert log[-1] == (5, False)
    assert await acks.ack([msgs[3]]) == 1
    assert log[-1] == (4, False)  # the only outstanding one below 6
    assert acks.status().held == 1
    assert await acks.ack([msgs[5]]) == 1 and acks.status().held == 0


async def test_a_gap_stops_the_multiple() -> None:
    log: list[tuple[int, bool]] = []
    acks, ch = Acks(), object()
    msgs = _messages(5, ch, log)
    for m in msgs:
        acks.track(m)
    await acks.ack([msgs[0], msgs[1], msgs[3], msgs[4]])  # 3 still running
    assert log == [(2, True), (4, False), (5, False)]


async def test_forgotten_deliveries_do_not_block_the_prefix() -> None:
    log: list[tuple[int, bool]] = []
    acks, ch = Acks(), object()
    msgs = _messages(3, ch, log)
    for m in msgs:
        acks.track(m)
    acks.forget(msgs[0])  # rejected to the dead-letter queue
    await acks.ack([msgs[1], msgs[2]])
    assert log == [(3, True)]


async def test_a_new_channel_starts_over() -> None:
    log: list[tuple[int, bool]] = []
    acks = Acks()
    old = _messages(2, object(), log)
    for m in old:
        acks.track(m)
    new = _messages(2, object(), log)  # tags restart at 1 after a reconnect
    for m in new:
        acks.track(m)
    assert acks.status().held == 2
    await acks.ack(new)
    assert log == [(2, True)]


# The ack bookkeeping stays bounded behind one long-running delivery: a delivery acked out of
# order must not leave its tag in the heap until the bottom moves (10,000 deliveries behind one
# held delivery would leave 10,001 tags).


async def test_the_bookkeeping_stays_bounded_behind_one_long_delivery() -> None:
    log: list[tuple[int, bool]] = []
    acks, ch = Acks(), object()
    msgs = _messages(10_001, ch, log)
    acks.track(msgs[0])  # the long-running one, never finished here
    for m in msgs[1:]:
        acks.track(m)
        await acks.ack([m])
    status = acks.status()
    assert status.held == 1
    assert status.tracked <= 2 * status.held + 64, status
    assert log[-1] == (10_001, False)  # each acked alone: never covering the long one
    await acks.ack([msgs[0]])
    assert acks.status().held == 0
