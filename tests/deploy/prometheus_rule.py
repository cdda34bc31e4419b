"""Render k8s/components/prometheus/prometheusrule.yaml from deploy/prometheus/alerts.yml (the
one source of the alert rules):

    python -m tests.deploy.prometheus_rule > k8s/components/prometheus/prometheusrule.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
HEADER = """\
# The alert rules of deploy/prometheus/alerts.yml for the Prometheus Operator, generated from it
# (tests/deploy/test_prometheus_operator.py fails when they differ). Edit alerts.yml, then:
#   python -m tests.deploy.prometheus_rule > k8s/components/prometheus/prometheusrule.yaml
"""


def groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(ALERTS.read_text())["groups"])


def render() -> str:
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "conveyor", "labels": {"app.kubernetes.io/name": "conveyor"}},
        "spec": {"groups": groups()},
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100, allow_unicode=True)


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
