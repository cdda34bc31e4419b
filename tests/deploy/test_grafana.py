"""The Grafana dashboard (deploy/grafana/conveyor.json): valid JSON of a dashboard whose every
query parses as PromQL (``promtool``) and reads only metrics Conveyor exposes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checks import ROOT
from .metric_names import check_expressions, exposed, used

DASHBOARD = ROOT / "deploy" / "grafana" / "conveyor.json"
# Grafana's variables, as Prometheus would see them after substitution
VARIABLES = {"$__rate_interval": "5m", "$type": ".*"}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # invalid JSON fails here


def _queries(dashboard: dict[str, Any]) -> dict[str, str]:
    found = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found[f"{panel['title']} / {target['refId']}"] = target["expr"]
    return found


def _substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_it_is_a_dashboard_with_a_datasource_variable() -> None:
    d = _dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    names = {v["name"]: v for v in d["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource"
    assert names["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_every_query_reads_only_metrics_conveyor_exposes() -> None:
    names = exposed()
    queries = _queries(_dashboard())
    assert len(queries) >= 15
    unknown = {where: used(e) - names for where, e in queries.items()}
    assert {w: u for w, u in unknown.items() if u} == {}
    assert all(used(e) for e in queries.values())
    # the variable's query too
    types = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "type")
    assert used(types["definition"]) <= names


def test_every_query_parses(tmp_path: Path) -> None:
    queries = {w: _substituted(e) for w, e in _queries(_dashboard()).items()}
    r = check_expressions(queries, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_malformed_query_is_caught(tmp_path: Path) -> None:
    r = check_expressions(
        {"bad": "sum by (type) (rate(conveyor_jobs_finished_total[5m])"}, tmp_path
    )
    assert r.returncode != 0
