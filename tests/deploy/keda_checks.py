"""Checks on the KEDA objects, which the Kubernetes schemas do not cover: structure, and that
every name they use resolves within the same rendered kustomization."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from conveyor.broker.topology import Topology

from .checks import by_kind, settings_namespace, worker_types, workers
from .manifests import Doc
from .secret_docs import documented_secrets

# One queue name: what Topology.work_queue builds; no commas, wildcards or spaces.
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _secret_keys(docs: Iterable[Doc]) -> dict[str, set[str]]:
    """The keys of the Secrets rendered here and of those docs/deploying.md creates."""
    secrets = by_kind(docs, "Secret").items()
    keys = {name: {*s.get("data", {}), *s.get("stringData", {})} for name, s in secrets}
    for name, data in documented_secrets().items():
        keys.setdefault(name, set()).update(data)
    return keys


def _auth_problems(where: str, trigger: Doc, docs: Sequence[Doc], parameter: str) -> list[str]:
    ref = trigger.get("authenticationRef", {}).get("name")
    auths = by_kind(docs, "TriggerAuthentication")
    if ref not in auths:
        return [f"{where}: authenticationRef {ref!r} names no TriggerAuthentication"]
    problems = []
    refs = auths[ref].get("spec", {}).get("secretTargetRef", [])
    if parameter not in {r.get("parameter") for r in refs}:
        problems.append(f"{where}: TriggerAuthentication {ref} does not provide {parameter!r}")
    keys = _secret_keys(docs)
    for r in refs:
        if r.get("key") not in keys.get(r.get("name"), set()):
            source = f"{r.get('name')}/{r.get('key')}"
            problems.append(f"{where}: {ref} reads {source}, which no Secret holds")
    return problems


def _rabbitmq_trigger_problems(where: str, trigger: Doc, docs: Sequence[Doc]) -> list[str]:
    meta = trigger.get("metadata", {})
    problems = []
    queue = str(meta.get("queueName", ""))
    if not QUEUE_NAME.fullmatch(queue):
        problems.append(f"{where}: queueName {queue!r} must be exactly one queue name")
    if str(meta.get("useRegex", "false")).lower() == "true":
        problems.append(f"{where}: useRegex would match several queues")
    if meta.get("protocol") != "http":
        problems.append(f"{where}: protocol must be http (counts unacknowledged messages too)")
    if meta.get("mode") != "QueueLength":
        problems.append(f"{where}: mode must be QueueLength")
    if str(meta.get("excludeUnacknowledged", "false")).lower() == "true":
        problems.append(f"{where}: excludeUnacknowledged hides prefetched messages")
    if not re.fullmatch(r"\d+(\.\d+)?", str(meta.get("value", ""))) or float(meta["value"]) <= 0:
        problems.append(f"{where}: value must be a positive number (messages per replica)")
    if {"host", "hostFromEnv"} & set(meta):
        problems.append(f"{where}: the host (with credentials) belongs in a TriggerAuthentication")
    return problems + _auth_problems(where, trigger, docs, "host")


def _postgresql_trigger_problems(where: str, trigger: Doc, docs: Sequence[Doc]) -> list[str]:
    meta = trigger.get("metadata", {})
    problems = []
    if "count(" not in str(meta.get("query", "")).lower():
        problems.append(f"{where}: query must count jobs")
    if not re.fullmatch(r"\d+(\.\d+)?", str(meta.get("targetQueryValue", ""))):
        problems.append(f"{where}: targetQueryValue must be a number")
    if {"connectionFromEnv", "password", "passwordFromEnv"} & set(meta):
        problems.append(f"{where}: credentials belong in a TriggerAuthentication")
    return problems + _auth_problems(where, trigger, docs, "connection")


def keda_problems(docs: Sequence[Doc]) -> list[str]:
    """ScaledObjects: target an existing Deployment, one per Deployment, scale to zero, and
    triggers whose queues and credentials resolve."""
    problems = []
    deployments = by_kind(docs, "Deployment")
    targets: dict[str, str] = {}
    for name, so in by_kind(docs, "ScaledObject").items():
        spec = so.get("spec", {})
        ref = spec.get("scaleTargetRef", {})
        target = ref.get("name")
        if ref.get("kind", "Deployment") != "Deployment" or target not in deployments:
            problems.append(f"ScaledObject/{name}: scaleTargetRef {ref} is no Deployment here")
        elif deployments[target]["metadata"].get("namespace") != so["metadata"].get("namespace"):
            problems.append(f"ScaledObject/{name}: its Deployment is in another namespace")
        if target in targets:
            problems.append(f"ScaledObject/{name}: {target} is already scaled by {targets[target]}")
        targets[target] = name
        if spec.get("minReplicaCount") != 0:
            problems.append(f"ScaledObject/{name}: minReplicaCount must be 0 (scale to zero)")
        if not isinstance(spec.get("cooldownPeriod"), int) or spec["cooldownPeriod"] <= 0:
            problems.append(f"ScaledObject/{name}: cooldownPeriod must be set")
        triggers = spec.get("triggers") or []
        if not triggers:
            problems.append(f"ScaledObject/{name}: no triggers")
        queues = [t.get("metadata", {}).get("queueName") for t in triggers]
        if len(queues) != len(set(queues)):
            problems.append(f"ScaledObject/{name}: a queue appears in two triggers")
        for i, trigger in enumerate(triggers):
            where = f"ScaledObject/{name} trigger {i}"
            if trigger.get("type") == "rabbitmq":
                problems += _rabbitmq_trigger_problems(where, trigger, docs)
            elif trigger.get("type") == "postgresql":
                problems += _postgresql_trigger_problems(where, trigger, docs)
            else:
                problems.append(f"{where}: unexpected trigger type {trigger.get('type')!r}")
    for name in workers(docs):
        fixed = "replicas" in deployments[name]["spec"]
        if name in targets and fixed:
            problems.append(f"Deployment/{name}: sets replicas, which kubectl apply and KEDA fight")
        if name not in targets and not fixed:
            problems.append(f"Deployment/{name}: a worker with neither a ScaledObject nor replicas")
    return problems


def scaling_matches_worker_problems(docs: Sequence[Doc]) -> list[str]:
    """Each worker's ScaledObject watches exactly the queues (or job types) that worker consumes."""
    problems = []
    deployments = by_kind(docs, "Deployment")
    scaled_objects = by_kind(docs, "ScaledObject").values()
    scaled = {so["spec"]["scaleTargetRef"]["name"]: so for so in scaled_objects}
    for name, args in workers(docs).items():
        types = worker_types(args)
        if isinstance(types, str) or name not in scaled:
            continue  # reported by command_problems / keda_problems
        topology = Topology(settings_namespace(docs, deployments[name]))
        wanted = {topology.work_queue(t) for t in types}
        watched: set[str] = set()
        for trigger in scaled[name]["spec"].get("triggers", []):
            meta: dict[str, Any] = trigger.get("metadata", {})
            if trigger.get("type") == "rabbitmq":
                watched.add(str(meta.get("queueName")))
            elif trigger.get("type") == "postgresql":
                counted = re.findall(r"job_type\s*=\s*'([^']+)'", str(meta.get("query", "")))
                watched |= {topology.work_queue(t) for t in counted}
        if watched != wanted:
            problems.append(f"{name} consumes {sorted(wanted)} but scales on {sorted(watched)}")
    return problems
