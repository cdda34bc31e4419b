"""Checks on pods: hardening, resources, probes that reach what the process serves, and Services
and PodDisruptionBudgets that select real pods."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .checks import by_kind, container_argv, kind_name, parse_command
from .manifests import Doc, containers, pod_spec

HEALTHCHECK_SCRIPT = "/opt/conveyor/healthcheck.py"


def _labels(doc: Doc) -> dict[str, str]:
    path = ("jobTemplate", "spec", "template") if doc["kind"] == "CronJob" else ("template",)
    node: Any = doc.get("spec", {})
    for key in path:
        node = node.get(key, {})
    return dict(node.get("metadata", {}).get("labels", {}))


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def hardening_problems(docs: Sequence[Doc], uid: int) -> list[str]:
    """Non-root (the image's UID), no privilege escalation, read-only root with /tmp on an
    emptyDir, every capability dropped, RuntimeDefault seccomp, requests and limits."""
    problems = []
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        where = kind_name(doc)
        pod_sc = spec.get("securityContext", {})
        if pod_sc.get("runAsNonRoot") is not True:
            problems.append(f"{where}: pod securityContext.runAsNonRoot must be true")
        if pod_sc.get("runAsUser") != uid:
            problems.append(
                f"{where}: runAsUser {pod_sc.get('runAsUser')} is not the image's {uid}"
            )
        if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: seccompProfile must be RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: Conveyor needs no Kubernetes API token")
        empty_dirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for c in containers(doc):
            sc = c.get("securityContext", {})
            name = f"{where} container {c.get('name')}"
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: allowPrivilegeEscalation must be false")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{name}: readOnlyRootFilesystem must be true")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problems.append(f"{name}: must drop ALL capabilities")
            if sc.get("privileged"):
                problems.append(f"{name}: must not be privileged")
            tmp = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/tmp"]
            if not tmp or tmp[0]["name"] not in empty_dirs:
                problems.append(f"{name}: /tmp must be an emptyDir (the root is read-only)")
            resources = c.get("resources", {})
            for part in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(resources.get(part, {}))
                if missing:
                    problems.append(f"{name}: resources.{part} lacks {sorted(missing)}")
    return problems


def _served_port(args: argparse.Namespace) -> int | None:
    if args.command == "api":
        return int(args.port)
    if args.command in ("worker", "publisher"):
        return None if args.health_port is None else int(args.health_port)
    return None


def _probe_port(container: Doc, port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    return named.get(port)


def probe_problems(docs: Sequence[Doc]) -> list[str]:
    """Every Deployment's container has liveness and readiness probes. HTTP probes hit /healthz
    (liveness) and /readyz (readiness) on the port the command serves; exec probes run the
    image's healthcheck script."""
    problems = []
    for doc in by_kind(docs, "Deployment").values():
        for c in containers(doc):
            where = f"{kind_name(doc)} container {c.get('name')}"
            argv = container_argv(c)
            args = parse_command(argv) if isinstance(argv, list) else argv
            if isinstance(args, str):
                continue  # reported by command_problems
            served = _served_port(args)
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                spec = c.get(probe)
                if spec is None:
                    problems.append(f"{where}: no {probe}")
                elif "httpGet" in spec:
                    port = _probe_port(c, spec["httpGet"].get("port", ""))
                    if served is None or port != served:
                        problems.append(f"{where}: {probe} port {port} is not the served {served}")
                    if spec["httpGet"].get("path") != path:
                        problems.append(f"{where}: {probe} must GET {path}")
                elif "exec" in spec:
                    command = spec["exec"].get("command", [])
                    if command[:2] != ["python", HEALTHCHECK_SCRIPT]:
                        problems.append(
                            f"{where}: {probe} runs {command}, not {HEALTHCHECK_SCRIPT}"
                        )
                else:
                    problems.append(f"{where}: {probe} is neither httpGet nor exec")
    return problems


def selector_problems(docs: Sequence[Doc]) -> list[str]:
    """Services and PodDisruptionBudgets select exactly one workload's pods; a Service's
    targetPort names a port of those pods; a PDB never blocks every eviction."""
    problems = []
    workloads = [d for d in docs if pod_spec(d) is not None]
    for kind in ("Service", "PodDisruptionBudget"):
        for name, obj in by_kind(docs, kind).items():
            spec = obj.get("spec", {})
            selector = spec.get("selector", {})
            selector = selector.get("matchLabels", {}) if kind != "Service" else selector
            chosen = [w for w in workloads if _selects(selector, _labels(w))]
            if len(chosen) != 1:
                names = [kind_name(w) for w in chosen]
                problems.append(f"{kind}/{name}: selects {names}, not exactly one workload")
                continue
            target = chosen[0]
            if kind == "Service":
                ports = {p.get("name") for c in containers(target) for p in c.get("ports", [])}
                ports |= {
                    p["containerPort"] for c in containers(target) for p in c.get("ports", [])
                }
                for p in spec.get("ports", []):
                    if p.get("targetPort", p.get("port")) not in ports:
                        problems.append(f"Service/{name}: targetPort {p.get('targetPort')} unknown")
            else:
                # an autoscaler owns the count when one targets the workload: its minimum
                scalers = [h["spec"] for h in by_kind(docs, "HorizontalPodAutoscaler").values()
                           if h["spec"]["scaleTargetRef"]["name"] == target["metadata"]["name"]
                           and h["spec"]["scaleTargetRef"]["kind"] == target["kind"]]  # fmt: skip
                replicas = target.get("spec", {}).get(
                    "replicas", scalers[0].get("minReplicas", 1) if scalers else 1
                )
                if "minAvailable" in spec and spec["minAvailable"] >= replicas:
                    problems.append(f"PodDisruptionBudget/{name}: minAvailable blocks every drain")
    return problems
