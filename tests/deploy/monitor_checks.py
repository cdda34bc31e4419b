"""Checks on the Prometheus Operator objects (k8s/components/prometheus), which the bundled
Kubernetes schemas do not cover: the PodMonitor's shape (the CRD's field names, so a typo is
caught), and that it scrapes the metrics port of every Conveyor process that serves one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .checks import by_kind, container_argv, kind_name, parse_command
from .manifests import Doc, containers

GROUP = "monitoring.coreos.com/v1"
# monitoring.coreos.com/v1 PodMonitor: the fields Conveyor may use (a subset of the CRD's)
SPEC_FIELDS = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel",
               "podTargetLabels", "sampleLimit"}  # fmt: skip
ENDPOINT_FIELDS = {"port", "portNumber", "path", "scheme", "interval", "scrapeTimeout",
                   "honorLabels", "relabelings", "metricRelabelings", "params"}  # fmt: skip
DURATION = re.compile(r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


def metrics_port(argv: list[str]) -> int | None:
    """The port a Conveyor command serves /metrics on (None: it serves none)."""
    parsed = parse_command(argv)
    if isinstance(parsed, str):
        return None
    if parsed.command == "api":
        return int(parsed.port)
    port = getattr(parsed, "health_port", None)
    return int(port) if port is not None else None


def _pod_labels(doc: Doc) -> dict[str, str]:
    return dict(doc["spec"]["template"]["metadata"].get("labels", {}))


def shape_problems(doc: Doc) -> list[str]:
    where = kind_name(doc)
    problems = []
    if doc.get("apiVersion") != GROUP:
        problems.append(f"{where}: apiVersion must be {GROUP}")
    spec: dict[str, Any] = doc.get("spec", {})
    problems += [f"{where}: unknown field spec.{k}" for k in sorted(set(spec) - SPEC_FIELDS)]
    selector = spec.get("selector", {})
    if not selector.get("matchLabels"):
        problems.append(f"{where}: spec.selector.matchLabels must name the pods")
    endpoints = spec.get("podMetricsEndpoints", [])
    if not endpoints:
        problems.append(f"{where}: no podMetricsEndpoints")
    for i, e in enumerate(endpoints):
        at = f"{where}: podMetricsEndpoints[{i}]"
        problems += [f"{at}: unknown field {k}" for k in sorted(set(e) - ENDPOINT_FIELDS)]
        if not isinstance(e.get("port"), str) or not e["port"]:
            problems.append(f"{at}: port must be a container port's name")
        if e.get("path", "/metrics") != "/metrics":
            problems.append(f"{at}: Conveyor serves /metrics, not {e.get('path')}")
        for key in ("interval", "scrapeTimeout"):
            if key in e and not DURATION.fullmatch(str(e[key])):
                problems.append(f"{at}: {key} {e[key]!r} is not a Prometheus duration")
    return problems


def coverage_problems(docs: Sequence[Doc]) -> list[str]:
    """Every Deployment whose process serves /metrics is selected, on a port it names."""
    monitors = list(by_kind(docs, "PodMonitor").values())
    if not monitors:
        return ["no PodMonitor"]
    problems = []
    for doc in by_kind(docs, "Deployment").values():
        labels = _pod_labels(doc)
        for c in containers(doc):
            argv = container_argv(c)
            port = metrics_port(argv) if isinstance(argv, list) else None
            if port is None:
                continue
            names = {p.get("name") for p in c.get("ports", []) if p.get("containerPort") == port}
            scraped = any(
                labels.items() >= m["spec"]["selector"]["matchLabels"].items()
                and names & {e.get("port") for e in m["spec"]["podMetricsEndpoints"]}
                for m in monitors
            )
            if not scraped:
                problems.append(
                    f"{kind_name(doc)}: serves /metrics on {port} (ports named {sorted(names)}) "
                    "but no PodMonitor scrapes it"
                )
    return problems
