"""k8s/components/prometheus: a PodMonitor that scrapes every Conveyor process's /metrics and a
PrometheusRule equal to deploy/prometheus/alerts.yml, rendered with the real kustomize on top of
the example overlay."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from .checks import K8S, by_kind, listing_problems
from .manifests import Doc, render_with_prometheus
from .monitor_checks import coverage_problems, shape_problems
from .prometheus_rule import groups
from .prometheus_rule import render as render_rule

COMPONENT = K8S / "components" / "prometheus"


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render_with_prometheus(tmp_path_factory.mktemp("prometheus"))


def test_every_file_is_listed() -> None:
    assert listing_problems(COMPONENT) == []


def test_the_rule_file_is_generated_from_alerts_yml() -> None:
    assert (COMPONENT / "prometheusrule.yaml").read_text() == render_rule()


def test_the_objects_render_in_the_namespace(docs: list[Doc]) -> None:
    (monitor,) = by_kind(docs, "PodMonitor").values()
    (rule,) = by_kind(docs, "PrometheusRule").values()
    assert monitor["metadata"]["namespace"] == rule["metadata"]["namespace"] == "conveyor"
    assert rule["spec"]["groups"] == groups()


def test_the_pod_monitor_has_the_crd_shape(docs: list[Doc]) -> None:
    (monitor,) = by_kind(docs, "PodMonitor").values()
    assert shape_problems(monitor) == []
    broken = copy.deepcopy(monitor)
    broken["spec"]["podMetricEndpoints"] = broken["spec"].pop("podMetricsEndpoints")
    broken["spec"].setdefault("podMetricsEndpoints", [{"port": 8081, "interval": "30 s"}])
    problems = shape_problems(broken)
    assert any("unknown field spec.podMetricEndpoints" in p for p in problems)
    assert any("port must be a container port's name" in p for p in problems)
    assert any("'30 s' is not a Prometheus duration" in p for p in problems)


def test_every_process_serving_metrics_is_scraped(docs: list[Doc]) -> None:
    deployments = set(by_kind(docs, "Deployment"))
    assert {"api", "publisher", "worker-default", "worker-email"} <= deployments
    assert coverage_problems(docs) == []


def test_a_port_the_monitor_does_not_name_is_reported(docs: list[Doc]) -> None:
    changed = copy.deepcopy(docs)
    email = by_kind(changed, "Deployment")["worker-email"]
    email["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = "metrics"
    assert coverage_problems(changed) == [
        "Deployment/worker-email: serves /metrics on 8081 (ports named ['metrics']) but no "
        "PodMonitor scrapes it"
    ]
    relabelled = copy.deepcopy(docs)
    api = by_kind(relabelled, "Deployment")["api"]
    api["spec"]["template"]["metadata"]["labels"] = {"app": "api"}
    assert any("Deployment/api" in p for p in coverage_problems(relabelled))


def test_alerts_yml_is_plain_prometheus_rule_file() -> None:
    """The same rules load in a Prometheus without the operator (rule_files)."""
    data = yaml.safe_load((Path(__file__).parents[2] / "deploy/prometheus/alerts.yml").read_text())
    assert set(data) == {"groups"}
