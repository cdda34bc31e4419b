from __future__ import annotations

import uuid

import pytest

from conveyor.broker.topology import Topology
from conveyor.broker.wire import JobMessage, MalformedMessage, decode
from conveyor.core.errors import InvalidJob


def test_message_round_trip() -> None:
    m = JobMessage(uuid.uuid4(), "send_email")
    assert decode(m.encode()) == m


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1,2]", b'{"id": "x", "type": "t"}', b'{"type": "t"}', b'{"id": 5}',
     b"{" + b" " * 5000 + b"}", b"\xff\xfe"],
)  # fmt: skip
def test_malformed_messages(body: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode(body)


def test_broker_names_for_the_jobs_namespace() -> None:
    t = Topology("jobs")
    assert t.exchange == "jobs.exchange"
    assert t.work_queue("send_email") == "jobs.queue.send_email"
    assert t.pen_queue(5) == "jobs.retry.5s"
    assert t.pen_queue(300) == "jobs.retry.5m"
    assert t.dead_letter_exchange == "jobs.dead_letter"
    assert t.dead_letter_queue == "jobs.dead_letter.queue"
    assert t.work_queue_arguments() == {
        "x-max-priority": 10,
        "x-dead-letter-exchange": "jobs.dead_letter",
    }
    assert t.pen_arguments(30) == {
        "x-message-ttl": 30000,
        "x-dead-letter-exchange": "jobs.exchange",
    }
    with pytest.raises(InvalidJob):
        t.work_queue("bad name")
