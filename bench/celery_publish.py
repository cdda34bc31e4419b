"""Publishes the Celery side's tasks from its own process (like the HTTP load generator), with the
same protocol: prints ``ready`` once connected, waits for a line on stdin, publishes ``n`` tasks
with ``apply_async`` on one producer, and prints one JSON line of statistics.

``python -m bench.celery_publish --broker URL --queue Q --counter FILE --n 1000``
"""

from __future__ import annotations

import argparse
import sys
import time

import orjson

from .celery_app import TASK_NAME, make_app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.celery_publish", description=__doc__)
    p.add_argument("--broker", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--counter", required=True)
    p.add_argument("--prefetch", type=int, default=16)
    p.add_argument("--n", type=int, required=True)
    args = p.parse_args(argv)
    app = make_app(args.broker, args.queue, args.counter, args.prefetch)
    task = app.tasks[TASK_NAME]
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=3)
        print("ready", flush=True)
        sys.stdin.readline()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.n):
            task.apply_async(producer=producer)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    report = {
        "accepted": args.n,
        "errors": 0,
        "error_samples": [],
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
    }
    print(orjson.dumps(report).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
