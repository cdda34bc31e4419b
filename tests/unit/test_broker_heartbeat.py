"""The worker's broker connection asks for a short heartbeat (``CONVEYOR_WORKER_AMQP_HEARTBEAT``),
so RabbitMQ closes the connection of a frozen worker within seconds and gives its deliveries to
the other consumers (``tests/faults/test_frozen_deliveries.py``)."""

from __future__ import annotations

import pytest
from yarl import URL

from conveyor.broker.cluster import heartbeat_url
from conveyor.core.config import Settings
from conveyor.worker import Worker

from ..apps import router


def test_the_heartbeat_goes_into_the_url() -> None:
    url = URL("amqp://u:p%40ss@rmq-0:5672/vhost?name=x")
    asked = heartbeat_url(url, 4)
    assert asked.query["heartbeat"] == "4"
    assert (asked.user, asked.password, asked.host, asked.path) == ("u", "p@ss", "rmq-0", "/vhost")
    assert asked.query["name"] == "x"
    assert heartbeat_url(url, 0).query["heartbeat"] == "0"  # 0: no heartbeat
    assert heartbeat_url(url, None) == url  # aiormq's own default


def test_a_heartbeat_written_in_the_url_is_kept() -> None:
    url = URL("amqp://u:p@rmq-0:5672/?heartbeat=10")
    assert heartbeat_url(url, 4).query["heartbeat"] == "10"


def test_the_worker_asks_for_the_setting() -> None:
    assert Settings().worker_amqp_heartbeat == 4
    for seconds in (4, 0, 7):
        worker = Worker(Settings(worker_amqp_heartbeat=seconds), router, concurrency=2)
        assert worker.subscription.heartbeat == seconds


def test_a_negative_heartbeat_is_refused() -> None:
    with pytest.raises(ValueError, match="worker_amqp_heartbeat"):
        Settings(worker_amqp_heartbeat=-1)
