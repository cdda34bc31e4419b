"""What a run reports: the machine, ``latest.json``, and the markdown table for the README."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import psutil

from . import broker
from .db import Db

# the targets each run is compared with
TARGETS = {
    "rest": "≥ 1,200",
    "batch": "≥ 4,000",
    "ratio": "≥ 1.5x",
    "p50": "≤ 3",
    "p99": "≤ 10",
    "rss_worker": "api, worker ≤ 80",
    "backfill": "≥ 90 % of empty",
}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


async def machine(db: Db, amqp_url: str) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql": await db.server_version(),
        "rabbitmq": await broker.server_version(amqp_url),
        "conveyor": _version("conveyor"),
        "celery": _version("celery"),
    }


def summary(
    params: dict[str, Any],
    machine_info: dict[str, Any],
    details: dict[str, Any],
    rss: dict[str, float | None],
    failures: dict[str, str],
) -> dict[str, Any]:
    """The shape of ``latest.json``: headline numbers first, then each workload's details."""

    def get(name: str, key: str) -> Any:
        return (details.get(name) or {}).get(key)

    batch, celery_rate = get("batch", "jobs_per_s"), get("celery", "jobs_per_s")
    big = details.get("batch_backfill") or {}
    latency = details.get("latency") or {}
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if params["quick"] else "full",
        "params": params,
        "machine": machine_info,
        "conveyor": {
            "rest_jobs_per_s": get("rest", "jobs_per_s"),
            "batch_jobs_per_s": batch,
            "batch_jobs_per_s_backfill": big.get("jobs_per_s"),
            "batch_backfill_vs_empty": big.get("vs_empty"),
            "latency_ms": {"p50": latency.get("p50"), "p99": latency.get("p99")},
            "relay_msgs_per_s": get("relay", "msgs_per_s"),
            "worker_drain_jobs_per_s": get("drain", "jobs_per_s"),
            "rss_mb": {k: rss.get(k) for k in ("api", "publisher", "worker")},
        },
        "celery": {
            "jobs_per_s": celery_rate,
            "drain_jobs_per_s": get("celery", "drain_jobs_per_s"),
            "publish_jobs_per_s": get("celery", "publish_jobs_per_s"),
            "pool": get("celery", "pool"),
            "pools": get("celery", "pools"),
            "worker_args": get("celery", "worker_args"),
            "rss_mb": {"worker": rss.get("celery")},
        },
        "ratio_batch_vs_celery": round(batch / celery_rate, 3) if batch and celery_rate else None,
        "noise_cpus": noise(details),
        "failures": failures,
        "details": details,
    }


def noise(details: dict[str, Any]) -> float | None:
    """CPUs used on average by processes outside the benchmark while the workloads ran (another
    test suite, say). Anything well above 0 makes the numbers pessimistic and unstable."""
    other = wall = 0.0
    for d in details.values():
        for key in ("cpu_seconds", "drain_cpu_seconds"):
            cpu = d.get(key) if isinstance(d, dict) else None
            if cpu and "other" in cpu:
                other, wall = other + cpu["other"], wall + cpu["wall"]
    return round(other / wall, 2) if wall else None


def write(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str) + b"\n")
    tmp.replace(path)


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "failed"
    return f"{value:,.{digits}f}"


def table(data: dict[str, Any]) -> str:
    """The markdown table for the README: metric, Conveyor, Celery, target."""
    c, cel, p, m = data["conveyor"], data["celery"], data["params"], data["machine"]
    failures, skipped = data["failures"], set(p.get("skip", []))

    def cell(name: str, value: float | None, digits: int = 0) -> str:
        if name in skipped:
            return "not run"
        if name in failures and failures[name].startswith("skipped"):
            return "not run"
        return _num(value, digits)

    n, rest_n = f"{p['n']:,}", f"{p['rest_n']:,}"
    ratio = data["ratio_batch_vs_celery"]
    rss = c["rss_mb"]
    rows = [
        (f"REST: {rest_n} jobs, one `POST /jobs` each, {p['connections']} connections "
         "→ all COMPLETED (jobs/s)", cell("rest", c["rest_jobs_per_s"]), "—", TARGETS["rest"]),
        (f"Batch: {n} jobs, `POST /jobs/batch` of {p['batch_size']} → all COMPLETED (jobs/s); "
         f"Celery: {n} tasks published → all run",
         cell("batch", c["batch_jobs_per_s"]), cell("celery", cel["jobs_per_s"]), TARGETS["batch"]),
        ("Batch throughput vs Celery", "—" if ratio is None else f"{ratio:.2f}x",
         "1.00x" if cel["jobs_per_s"] else cell("celery", None), TARGETS["ratio"]),
        (f"Submit→start latency p50 at {p['latency_rate']:g} jobs/s (ms)",
         cell("latency", c["latency_ms"]["p50"], 1), "—", TARGETS["p50"]),
        (f"Submit→start latency p99 at {p['latency_rate']:g} jobs/s (ms)",
         cell("latency", c["latency_ms"]["p99"], 1), "—", TARGETS["p99"]),
        (f"Publisher relay, {n} outbox rows (msgs/s)", cell("relay", c["relay_msgs_per_s"]),
         "—", "—"),
        (f"Worker alone: drain of {n} jobs already queued (jobs/s)",
         cell("drain", c["worker_drain_jobs_per_s"]), cell("celery", cel["drain_jobs_per_s"]),
         "—"),
    ]  # fmt: skip
    wf = data["details"].get("workflow") or {}
    rows += [
        ("Workflow: 1,000-job fan-out + fan-in vs the same jobs as a plain batch (jobs/s, best "
         "of five turns each)",
         cell("workflow", wf.get("fan_out_jobs_per_s")) + " vs "
         + cell("workflow", wf.get("plain_batch_jobs_per_s"))
         + ("" if wf.get("fan_out_vs_plain") is None else f": **{wf['fan_out_vs_plain']:.0%}**"),
         "—", "≥ 80 %"),
        ("Workflow: 100-job chain, per link p50 (ms; release → next start) vs a single job's "
         "submit→start p50", cell("workflow", wf.get("chain_link_ms_p50"), 1) + " vs "
         + cell("workflow", wf.get("single_submit_to_start_ms_p50"), 1), "—",
         "≤ 1 submit→start"),
    ]  # fmt: skip
    if p.get("backfill_rows"):
        big = data["details"].get("batch_backfill") or {}
        share = c["batch_backfill_vs_empty"]
        note = (
            ""
            if share is None
            else (f" vs {_num(big.get('empty_jobs_per_s'))} before it: **{share:.0%}**")
        )
        rows.append((
            f"Batch with {p['backfill_rows']:,} generated jobs in `jobs` (medians of "
            f"{p.get('backfill_repeat', 1)} runs; jobs/s)",
            cell("batch_backfill", c["batch_jobs_per_s_backfill"]) + note, "—",
            TARGETS["backfill"],
        ))  # fmt: skip
    rows.append((
        "Peak RSS, MB (api / publisher / worker; Celery: worker)",
        " / ".join(_num(rss[k]) for k in ("api", "publisher", "worker")),
        cell("celery", cel["rss_mb"]["worker"]), TARGETS["rss_worker"],
    ))  # fmt: skip
    lines = ["| metric | Conveyor | Celery | target |", "| --- | ---: | ---: | --- |"]
    lines += [f"| {a} | {b} | {c_} | {d} |" for a, b, c_, d in rows]
    lines.append("")
    lines.append(
        f"{m['cpu_count']} x {m['cpu_model']}, {m['memory_gb']} GB; Python {m['python']}, "
        f"PostgreSQL {m['postgresql']}, {m['rabbitmq']}, Celery {m['celery']} "
        f"({_celery_config(cel)}); Conveyor worker: 1 process, "
        f"`--concurrency {p['concurrency']}`; API: `--workers {p.get('api_workers', 1)}`; "
        f"{data['mode']} run, {data['generated_at']}."
    )
    return "\n".join(lines)


def _celery_config(cel: dict[str, Any]) -> str:
    """Which Celery configuration the Celery column shows, and what the others did."""
    pools = cel.get("pools") or {}
    if not pools:
        return "not run"
    best = cel.get("pool")
    others = ", ".join(f"{k} {_num(v['jobs_per_s'])}/s" for k, v in pools.items() if k != best)
    shown = (
        f"the fastest of {len(pools)} configurations: `{' '.join(cel.get('worker_args') or [])}`"
    )
    return shown + (f"; {others}" if others else "")


def cpu_table(details: dict[str, Any]) -> str:
    """Where the CPU went in each workload: milliseconds of CPU per job, by process. On a small
    machine the sum bounds throughput (2 CPUs / 4 ms per job = 500 jobs/s at best) whatever the
    noise, so this is the table to read when optimising. ``other`` is the CPUs (not ms) used by
    processes outside the benchmark during the workload."""
    roles = ["api", "publisher", "worker", "celery", "postgres", "rabbitmq", "loadgen", "harness"]
    lines = [
        "| workload | jobs | wall s | " + " | ".join(roles) + " | total | other CPUs |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in roles) + " | ---: | ---: |",
    ]
    for name, d in details.items():
        if not isinstance(d, dict):
            continue
        for suffix, key in (("", "cpu"), (" (drain)", "drain_cpu")):
            cpu = d.get(f"{key}_seconds")
            jobs = d.get(f"{key}_jobs") or d.get("jobs") or d.get("msgs")
            if not cpu or not cpu.get("wall") or not jobs:
                continue
            ms = {r: 1000 * cpu[r] / jobs for r in roles if r in cpu}
            cells = [f"{ms[r]:.2f}" if r in ms else "" for r in roles]
            lines.append(
                f"| {name}{suffix} | {jobs:,} | {cpu['wall']:.1f} | "
                + " | ".join(cells)
                + f" | {sum(ms.values()):.2f} | {cpu.get('other', 0) / cpu['wall']:.2f} |"
            )
    return "\n".join(lines)
