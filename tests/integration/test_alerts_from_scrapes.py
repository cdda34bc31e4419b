"""The alert rules (deploy/prometheus/alerts.yml) on what the processes really export: each
process's /metrics text becomes promtool input series, and ``promtool test rules`` says which
alerts fire. A gauge a process does not compute must be absent from its /metrics, not 0: the
API and the workers exported ``conveyor_outbox_lag_seconds 0`` (and ``conveyor_outbox_rows``,
``conveyor_leases_expired``), so with no maintenance running ``ConveyorMaintenanceAbsent`` (an
``absent()``) could never fire and the outbox looked empty."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conveyor import Job, JobRouter, JobSpec, enqueue_many
from conveyor.api.app import create_app
from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper
from conveyor.publisher.relay import Relay
from conveyor.worker import Worker

from ..deploy.metric_names import promtool
from ..deploy.test_alerts import RULES

MAINTENANCE_GAUGES = ("conveyor_outbox_lag_seconds", "conveyor_outbox_rows",
                      "conveyor_leases_expired")  # fmt: skip
MINUTES = 20

router = JobRouter()


@router.job("a")
async def a(job: Job) -> None:
    return None


async def _api(settings: Settings) -> str:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        r = await client.get("/metrics")
    assert r.status_code == 200
    return r.text


def _worker(settings: Settings) -> str:
    return generate_latest(Worker(settings, router).metrics.registry).decode()


def _relay(settings: Settings) -> str:
    """``conveyor publisher --no-maintenance``: the relay alone."""
    return generate_latest(Relay(settings).metrics.registry).decode()


async def _sweeper(settings: Settings) -> str:
    """``conveyor sweeper`` after one refresh of its gauges."""
    sweeper = Sweeper(settings)
    await sweeper.start()
    try:
        assert sweeper.gauges is not None
        await sweeper.gauges.refresh_once()
        return generate_latest(sweeper.metrics.registry).decode()
    finally:
        await sweeper.close()


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` → value of each Conveyor sample in a /metrics text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("conveyor_") and not s.name.endswith("_created"):
                labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _series(scrapes: dict[str, str]) -> list[dict[str, str]]:
    """promtool input series: each sample of each process (its ``instance``), held for the
    whole test; the outbox's lag grows a minute per minute, as it does while no relay runs."""
    series = []
    for instance, text in scrapes.items():
        for key, value in _samples(text).items():
            name, labels = key.split("{", 1)
            labels = f"{labels[:-1]},instance={json.dumps(instance)}".lstrip(",")
            step = 60 if name == "conveyor_outbox_lag_seconds" else 0
            series.append({"series": f"{name}{{{labels}}}", "values": f"{value}+{step}x{MINUTES}"})
    return series


def _promtool(tmp: Path, series: list[dict[str, str]], cases: list[dict[str, Any]]) -> str:
    """``promtool test rules`` on the rules (annotations left out: alerts.test.yml checks
    their text) with ``series``; promtool's output when a case fails, else ''."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp / "alerts.yml").write_text(yaml.safe_dump(rules))
    test = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
    (tmp / "scraped.test.yml").write_text(yaml.safe_dump(test))
    r = subprocess.run([promtool(), "test", "rules", "scraped.test.yml"], cwd=tmp,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    return "" if r.returncode == 0 else r.stdout + r.stderr


def _fires(alert: str, at: str, severity: str) -> dict[str, Any]:
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": {"severity": severity}}],
    }


def _quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


async def test_no_maintenance_fires_its_absent_alert(settings: Settings, tmp_path: Path) -> None:
    """The API, a worker and a relay without maintenance: no process computes the outbox's lag,
    so none exports it, and ``ConveyorMaintenanceAbsent`` fires after its 10 minutes."""
    scrapes = {"api": await _api(settings), "worker": _worker(settings), "relay": _relay(settings)}
    for instance, text in scrapes.items():
        exported = {k.split("{")[0] for k in _samples(text)}
        assert exported.isdisjoint(MAINTENANCE_GAUGES), (instance, exported & {*MAINTENANCE_GAUGES})
    cases = [
        _quiet("ConveyorMaintenanceAbsent", "9m"),
        _fires("ConveyorMaintenanceAbsent", "10m", "critical"),
        _quiet("ConveyorOutboxLag", "15m"),
        _quiet("ConveyorLeasesNotRecovered", "15m"),
    ]
    assert _promtool(tmp_path, _series(scrapes), cases) == ""


async def test_relay_down_and_a_minute_old_row_fire_the_outbox_lag(
    settings: Settings, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """No relay runs; ``conveyor sweeper`` sees an outbox row 60 s old. Beside the API's and a
    worker's /metrics, ``ConveyorOutboxLag`` fires once the lag has been over a minute for its
    5 minutes, and the maintenance alert stays quiet."""
    await enqueue_many(db, [JobSpec("a")])
    await db.execute("UPDATE job_outbox SET created_at = now() - interval '60 s'")
    scrapes = {"api": await _api(settings), "worker": _worker(settings),
               "sweeper": await _sweeper(settings)}  # fmt: skip
    lag = _samples(scrapes["sweeper"])["conveyor_outbox_lag_seconds{}"]
    assert 60 <= lag < 70
    assert _samples(scrapes["sweeper"])["conveyor_outbox_rows{}"] == 1
    cases = [
        _quiet("ConveyorOutboxLag", "4m"),
        _fires("ConveyorOutboxLag", "6m", "warning"),
        _quiet("ConveyorMaintenanceAbsent", "15m"),
    ]
    assert _promtool(tmp_path, _series(scrapes), cases) == ""
