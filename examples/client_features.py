"""The job features against `make dev` (API on http://127.0.0.1:8000): unique jobs, meta, a
schedule, the Python client's wait. Run: `.venv/bin/python examples/client_features.py`."""

from __future__ import annotations

import sys
import time

from conveyor.client import Client, NotFound


def main(base_url: str = "http://127.0.0.1:8000") -> None:
    with Client(base_url) as c:
        # meta, and wait for the result
        job = c.submit("hello", {"name": "Ada"}, meta={"tenant": "acme"})
        done = c.wait(job.id, timeout=30)
        print("hello:", done.status, done.result, "meta:", done.meta)

        # unique for 5 minutes: the second submit returns the first job
        first = c.submit("send_email", {"to": "ada@example.com"}, unique_for=300)
        second = c.submit("send_email", {"to": "ada@example.com"}, unique_for=300)
        print("unique:", first.id == second.id, "duplicate:", second.duplicate)

        # a schedule every 2 seconds, through the API; three ticks, then delete it
        r = c.http.post(
            "/schedules",
            json={"name": "demo", "type": "hello", "every_seconds": 2, "payload": {"name": "tick"}},
        )
        print("schedule:", r.status_code, r.json()["next_run_at"])
        time.sleep(6.5)
        ticks = [j for j in c.list(type="hello", limit=50).jobs
                 if (j.meta or {}).get("schedule") == "demo"]  # fmt: skip
        print("scheduled jobs so far:", len(ticks))
        c.http.delete("/schedules/demo")
        try:
            c.get("00000000-0000-7000-8000-000000000000")
        except NotFound as exc:
            print("typed error:", exc.status, exc.error)


if __name__ == "__main__":
    main(*sys.argv[1:])
