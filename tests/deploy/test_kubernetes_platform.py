"""What a platform team asks of the manifests before it approves them, on every
rendered variant (the schemas of the new kinds are checked by test_kubernetes.py's validation
of every rendered object): startup probes, topology spread, NetworkPolicies that let in only the
API's traffic and let out only DNS, PostgreSQL and RabbitMQ (where the Secrets' URLs point), and
an autoscaler for the API."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .checks import by_kind
from .manifests import Doc, containers, pod_spec
from .secret_docs import documented_secrets, secret_refs

LONG_RUNNING = ("api", "publisher", "worker")  # Deployments by the prefix of their name


def _deployments(docs: list[Doc]) -> dict[str, Doc]:
    return {n: d for n, d in by_kind(docs, "Deployment").items() if n.startswith(LONG_RUNNING)}


def _pod_labels(doc: Doc) -> dict[str, str]:
    labels: dict[str, str] = doc["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for e in selector.get("matchExpressions", []):
        if e["operator"] not in ("In", "NotIn"):
            raise AssertionError(f"{e['operator']}: extend this check")
        if (labels.get(e["key"]) in e["values"]) != (e["operator"] == "In"):
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_every_long_running_container_has_a_startup_probe(docs: list[Doc]) -> None:
    """A slow start (migrations pending, a cold node) is the startup probe's, so the liveness
    probe can stay strict without killing a pod that is still starting."""
    deployments = _deployments(docs)
    assert {"api", "publisher", "worker-default"} <= set(deployments)
    for name, doc in deployments.items():
        for c in containers(doc):
            startup = c.get("startupProbe")
            assert startup is not None, f"{name}: no startupProbe"
            assert startup["httpGet"] == c["livenessProbe"]["httpGet"], name
            budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
            assert 60 <= budget <= 300, (name, budget)
            assert "initialDelaySeconds" not in c["livenessProbe"], name


def test_the_api_and_the_workers_spread_over_zones_and_nodes(docs: list[Doc]) -> None:
    for name, doc in _deployments(docs).items():
        if name == "publisher":
            continue
        spread = pod_spec(doc).get("topologySpreadConstraints") or []
        keys = {c["topologyKey"] for c in spread}
        assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}, (name, keys)
        for c in spread:
            assert _selects(c["labelSelector"], _pod_labels(doc)), (name, c)
            # a spread that cannot be met must not leave pods Pending in a one-zone cluster
            assert c["whenUnsatisfiable"] == "ScheduleAnyway", (name, c)
            assert c.get("matchLabelKeys") == ["pod-template-hash"], (name, c)


def _policies_for(docs: list[Doc], labels: dict[str, str], kind: str) -> list[Doc]:
    return [
        p
        for p in by_kind(docs, "NetworkPolicy").values()
        if kind in p["spec"].get("policyTypes", []) and _selects(p["spec"]["podSelector"], labels)
    ]


def _service_hosts(docs: list[Doc]) -> dict[int, set[str]]:
    """port → the namespaces of the ``*.<namespace>.svc…`` hosts the URLs name in the Secrets
    the pods read (created as docs/deploying.md says)."""
    out: dict[int, set[str]] = {}
    read = {name for name, _ in secret_refs(docs)}
    for name, data in documented_secrets().items():
        if name not in read:
            continue
        for key, value in data.items():
            if "://" not in str(value) or not key.startswith("CONVEYOR_"):
                continue
            url = urlsplit(str(value))
            host, port = url.hostname or "", url.port
            if port is not None and ".svc" in host:
                out.setdefault(port, set()).add(host.split(".")[1])
    return out


def test_network_policies_let_in_the_api_and_let_out_only_the_database_and_the_broker(
    docs: list[Doc],
) -> None:
    workloads = [d for d in docs if pod_spec(d) is not None and d["kind"] != "CronJob"]
    hosts = _service_hosts(docs)
    assert set(hosts) == {5432, 5672}, hosts
    for doc in workloads:
        name, labels = doc["metadata"]["name"], _pod_labels(doc)
        ingress = _policies_for(docs, labels, "Ingress")
        egress = _policies_for(docs, labels, "Egress")
        assert ingress and egress, f"{name}: not isolated"
        allowed_in = [r for p in ingress for r in p["spec"].get("ingress", [])]
        if name == "api":
            assert [r["ports"] for r in allowed_in] == [[{"port": "http", "protocol": "TCP"}]]
        else:
            assert allowed_in == [], (name, allowed_in)
        rules = [r for p in egress for r in p["spec"].get("egress", [])]
        ports: dict[int, list[Any]] = {}
        for r in rules:
            for port in r["ports"]:  # a rule without ports would allow every port
                ports.setdefault(port["port"], []).append(r.get("to"))
        assert set(ports) <= {53, 5432, 5672}, (name, sorted(ports))
        assert 53 in ports and 5432 in ports, (name, sorted(ports))
        # only the processes that use the broker reach it
        uses_broker = labels["app.kubernetes.io/component"] not in ("api", "migrate")
        assert (5672 in ports) is uses_broker, (name, sorted(ports))
        for port in (5432, 5672):
            for to in ports.get(port, []):
                namespaces = {
                    t["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                    for t in to or [{}]
                }
                assert namespaces == hosts[port], (name, port, namespaces)


def test_the_api_has_an_autoscaler_that_owns_its_replicas(docs: list[Doc]) -> None:
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["api"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "api"}  # fmt: skip
    api = by_kind(docs, "Deployment")["api"]
    assert "replicas" not in api["spec"], "kubectl apply would fight the autoscaler"
    pdb = by_kind(docs, "PodDisruptionBudget")["api"]
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
    metric = hpa["spec"]["metrics"][0]["resource"]
    assert metric["name"] == "cpu" and metric["target"]["type"] == "Utilization"
    # utilization is relative to the request: every container needs one
    assert all(c["resources"]["requests"]["cpu"] for c in containers(api))
