"""Acknowledging deliveries cheaply and safely.

A worker holds each delivery until its job's outcome commits. When a batch of outcomes commits,
``Acks.ack`` sends one ``basic.ack(multiple=True)`` for the longest run of finished deliveries
at the bottom of the channel's outstanding tags (everything up to that tag is finished, so the
"multiple" covers nothing still running), and single acks for the rest. Under steady load most
of a batch goes in one frame instead of one per job.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterable

from aio_pika.abc import AbstractIncomingMessage


def _channel_of(msg: AbstractIncomingMessage) -> object | None:
    try:
        return msg.channel
    except Exception:  # the channel is closed: its deliveries cannot be acknowledged any more
        return None


class Acks:
    def __init__(self) -> None:
        self._channel: object | None = None
        self._heap: list[int] = []
        self._held: dict[int, AbstractIncomingMessage] = {}

    def track(self, msg: AbstractIncomingMessage) -> None:
        """Note a delivery as outstanding (call on arrival)."""
        channel = _channel_of(msg)
        if channel is not self._channel:  # a new channel after a reconnect: tags start again
            self._channel, self._heap, self._held = channel, [], {}
        tag = msg.delivery_tag
        if tag is not None:
            heapq.heappush(self._heap, tag)
            self._held[tag] = msg

    def forget(self, msg: AbstractIncomingMessage) -> None:
        """The delivery is settled some other way (rejected, nacked)."""
        tag = msg.delivery_tag
        if tag is not None and self._held.get(tag) is msg:
            del self._held[tag]

    @property
    def outstanding(self) -> int:
        return len(self._held)

    async def ack(self, messages: Iterable[AbstractIncomingMessage]) -> int:
        """Acknowledge ``messages``; returns how many frames were sent."""
        finished: dict[int, AbstractIncomingMessage] = {}
        strays: list[AbstractIncomingMessage] = []
        for m in messages:
            tag = m.delivery_tag
            if tag is not None and self._held.get(tag) is m:
                finished[tag] = m
            else:
                strays.append(m)
        top: AbstractIncomingMessage | None = None
        covered = 0
        while self._heap:
            tag = self._heap[0]
            if tag not in self._held:
                heapq.heappop(self._heap)  # settled earlier
            elif tag in finished:
                heapq.heappop(self._heap)
                top = self._held.pop(tag)
                del finished[tag]
                covered += 1
            else:
                break
        frames = 0
        if top is not None:
            with contextlib.suppress(Exception):
                await top.ack(multiple=covered > 1)
            frames += 1
        for tag, m in finished.items():
            del self._held[tag]
            strays.append(m)
        for m in strays:
            with contextlib.suppress(Exception):
                await m.ack()
            frames += 1
        return frames
