"""Coalesced acknowledgements never cover a delivery that is still running."""

from __future__ import annotations

from typing import Any

from conveyor.worker.acks import Acks


class FakeMessage:
    """The slice of an aio-pika IncomingMessage that ``Acks`` uses."""

    def __init__(self, tag: int, channel: object, log: list[tuple[int, bool]]) -> None:
        self.delivery_tag = tag
        self.channel = channel
        self.log = log

    async def ack(self, multiple: bool = False) -> None:
        self.log.append((self.delivery_tag, multiple))


def _messages(n: int, channel: object, log: list[tuple[int, bool]]) -> list[Any]:
    return [FakeMessage(t, channel, log) for t in range(1, n + 1)]


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
    assert acks.outstanding == 1
    assert await acks.ack([msgs[5]]) == 1 and acks.outstanding == 0


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
    assert acks.outstanding == 2
    await acks.ack(new)
    assert log == [(2, True)]
    await acks.ack([old[0]])  # a stale delivery: a single ack, which the dead channel refuses
    assert log[-1] == (1, False)
