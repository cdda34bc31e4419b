"""The Celery side of the comparison: one no-op task on its own queue, no result backend.

The worker is started as ``python -m celery -A bench.celery_worker worker ...`` and reads its
settings from the environment (``BENCH_CELERY_*``, set by the harness); the harness builds the
same app with :func:`make_app` to publish. Each task run appends one fixed-width record (its
finishing time) to a counter file, so the harness counts finished tasks honestly (file size)
without a result backend, and can time a drain from the first record to the last.
"""

from __future__ import annotations

import os
import time

from celery import Celery
from kombu import Exchange, Queue

TASK_NAME = "bench.noop"
RECORD_BYTES = 18  # b"%017.6f\n" % time.time()


def make_app(broker: str, queue: str, counter: str, prefetch: int = 16) -> Celery:
    app = Celery("bench", broker=broker)
    app.conf.update(
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_queues=[Queue(queue, Exchange(queue, type="direct", durable=True), routing_key=queue)],
        # the same window of unacknowledged messages as Conveyor's worker (--concurrency 16)
        worker_prefetch_multiplier=prefetch,
        worker_enable_remote_control=False,  # no pidbox queue left behind on the shared broker
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
    )
    fd: list[int] = []

    @app.task(name=TASK_NAME)
    def noop() -> None:
        if not fd:
            fd.append(os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        os.write(fd[0], b"%017.6f\n" % time.time())

    return app


def records(counter: str) -> int:
    """How many tasks have finished."""
    try:
        return os.stat(counter).st_size // RECORD_BYTES
    except FileNotFoundError:
        return 0


def span(counter: str, first: int, last: int) -> float:
    """Seconds from the finish of record ``first`` to that of record ``last`` (0-based)."""
    with open(counter, "rb") as f:
        f.seek(first * RECORD_BYTES)
        a = float(f.read(RECORD_BYTES))
        f.seek(last * RECORD_BYTES)
        b = float(f.read(RECORD_BYTES))
    return b - a


def app_from_env() -> Celery:
    return make_app(
        os.environ.get("BENCH_CELERY_BROKER", "pyamqp://guest:guest@127.0.0.1:5672//"),
        os.environ.get("BENCH_CELERY_QUEUE", "bench.celery"),
        os.environ.get("BENCH_CELERY_COUNTER", "/tmp/conveyor-bench-celery.count"),
        int(os.environ.get("BENCH_CELERY_PREFETCH", "16")),
    )
