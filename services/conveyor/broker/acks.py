"""Acknowledging deliveries cheaply and safely.

A worker holds each delivery until its job's outcome commits. When a batch of outcomes commits,
``Acks.ack`` sends one ``basic.ack(multiple=True)`` for the longest run of finished deliveries
at the bottom of the channel's outstanding tags (everything up to that tag is finished, so the
"multiple" covers nothing still running), and single acks for the rest. Under steady load most
of a batch goes in one frame instead of one per job.

Bounded: deliveries settled out of order leave stale tags in the heap until the bottom moves;
behind one long-running delivery the bottom never moves, so the heap is rebuilt from what is
still held once stale tags outnumber held ones. The bookkeeping stays within about twice the
deliveries in hand (which the prefetch bounds), however long a delivery runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from .consume import Delivery

_SLACK = 64  # stale tags tolerated before a rebuild is considered at all


@dataclass(frozen=True, slots=True)
class AckStatus:
    held: int  # deliveries in hand, not yet settled
    tracked: int  # tags in the bookkeeping (held + stale), bounded by 2 * held + _SLACK


class Acks:
    def __init__(self) -> None:
        self._channel: object | None = None
        self._heap: list[int] = []
        self._held: dict[int, Delivery] = {}

    def track(self, d: Delivery) -> None:
        """Note a delivery as outstanding (call on arrival)."""
        if d.channel is not self._channel:  # a new channel after a reconnect: tags start again
            self._channel, self._heap, self._held = d.channel, [], {}
        tag = d.delivery_tag
        if tag is not None:
            heapq.heappush(self._heap, tag)
            self._held[tag] = d

    def forget(self, d: Delivery) -> None:
        """The delivery is settled some other way (rejected, nacked)."""
        tag = d.delivery_tag
        if tag is not None and self._held.get(tag) is d:
            del self._held[tag]
            self._compact()

    def status(self) -> AckStatus:
        return AckStatus(held=len(self._held), tracked=len(self._heap))

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._held) + _SLACK:
            self._heap = list(self._held)
            heapq.heapify(self._heap)

    async def ack(self, deliveries: Iterable[Delivery]) -> int:
        """Acknowledge ``deliveries``; returns how many frames were sent."""
        finished: dict[int, Delivery] = {}
        strays: list[Delivery] = []
        for d in deliveries:
            tag = d.delivery_tag
            if tag is not None and self._held.get(tag) is d:
                finished[tag] = d
            else:
                strays.append(d)  # from a channel that is gone, or not tracked
        top: Delivery | None = None
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
            await top.ack(multiple=covered > 1)
            frames += 1
        for tag, d in finished.items():
            del self._held[tag]
            strays.append(d)
        self._compact()
        for d in strays:
            await d.ack()
            frames += 1
        return frames
