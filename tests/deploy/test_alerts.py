"""The Prometheus alert rules (deploy/prometheus/alerts.yml): valid for ``promtool check
rules``, unit-tested by ``promtool test rules`` (alerts.test.yml: each alert fires on what it
names and stays quiet on its look-alike), and built only from metrics Conveyor exposes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from .checks import ROOT
from .metric_names import exposed, promtool, used

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
# what the rules must watch, by the alerts that do
WATCHED = {
    "outbox lag": {"ConveyorOutboxLag", "ConveyorOutboxLagCritical"},
    "stuck leases": {"ConveyorLeasesNotRecovered", "ConveyorLeasesExpiring"},
    "failure rate": {"ConveyorHighFailureRate"},
    "DLQ growth": {"ConveyorDeadLettersGrowing"},
    "worker down": {"ConveyorWorkersAbsent", "ConveyorNoProgress"},
    "reconciler activity": {"ConveyorReconcilerRepublishing"},
}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def test_promtool_checks_the_rules() -> None:
    r = _promtool("check", "rules", str(RULES), cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_promtool_unit_tests_pass() -> None:
    r = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_unit_tested_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {str(r["alert"]) for r in _rules()} == fired


def test_a_broken_expectation_fails_promtool(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests against a rule with a higher threshold."""
    (tmp_path / "alerts.yml").write_text(
        RULES.read_text().replace(
            "max(conveyor_outbox_lag_seconds) > 60", "max(conveyor_outbox_lag_seconds) > 600"
        )
    )
    (tmp_path / "alerts.test.yml").write_text(RULE_TESTS.read_text())
    r = _promtool("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "ConveyorOutboxLag" in r.stdout + r.stderr


def test_rules_use_only_metrics_conveyor_exposes() -> None:
    names = exposed()
    unknown = {str(r["alert"]): used(str(r["expr"])) - names for r in _rules()}
    assert {a: u for a, u in unknown.items() if u} == {}
    assert all(used(str(r["expr"])) for r in _rules())  # each reads a Conveyor metric


def test_the_metric_check_catches_a_misspelled_family() -> None:
    names = exposed()
    assert {"conveyor_jobs_finished_total", "conveyor_job_wait_seconds_bucket"} <= names
    assert used('rate(conveyor_job_finished_total{queue="conveyor_x"}[5m])') - names == {
        "conveyor_job_finished_total"
    }


def test_the_issue_list_is_covered_with_severities_and_text() -> None:
    rules = {str(r["alert"]): r for r in _rules()}
    for what, alerts in WATCHED.items():
        assert alerts <= rules.keys(), what
    for name, rule in rules.items():
        labels, notes = rule.get("labels", {}), rule.get("annotations", {})
        assert isinstance(labels, dict) and labels.get("severity") in {"warning", "critical"}
        assert isinstance(notes, dict) and notes.get("summary") and notes.get("description"), name
