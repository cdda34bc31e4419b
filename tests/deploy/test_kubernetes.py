"""The Kubernetes manifests: listed, valid against the Kubernetes schemas, hardened, with probes,
selectors and settings that match what the processes do."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from conveyor.core.config import Settings

from .checks import (
    BASE,
    KEDA_GROUP,
    KEDA_OVERLAY,
    OVERLAY,
    POSTGRESQL_COMPONENT,
    by_kind,
    listing_problems,
    schema_problems,
)
from .container_checks import DOCKERFILE, image_uid, parse_dockerfile
from .manifests import Doc, containers, load_yaml_docs, referenced_paths
from .pod_checks import hardening_problems, probe_problems, selector_problems
from .secret_docs import (
    DEPLOYING,
    STAND_IN,
    documented_secrets,
    optional_secret_refs,
    secret_refs,
)

KUSTOMIZATION_DIRS = [BASE, KEDA_OVERLAY, OVERLAY, POSTGRESQL_COMPONENT]


def image_user() -> int:
    uid = image_uid(parse_dockerfile(DOCKERFILE.read_text()))
    assert uid is not None
    return uid


def kubernetes_docs(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if not d["apiVersion"].startswith(KEDA_GROUP)]


def deployment(docs: list[Doc], name: str) -> Doc:
    return by_kind(docs, "Deployment")[name]


# ---------------------------------------------------------------------------- listing


@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=lambda p: p.name)
def test_every_file_is_listed_and_every_listed_file_exists(directory: Path) -> None:
    assert listing_problems(directory) == []


def test_an_unlisted_file_and_a_missing_file_are_reported(tmp_path: Path) -> None:
    copy_ = tmp_path / "base"
    shutil.copytree(BASE, copy_)
    (copy_ / "forgotten.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    (copy_ / "api.yaml").unlink()
    problems = listing_problems(copy_)
    assert any("forgotten.yaml is not listed" in p for p in problems)
    assert any("api.yaml, which does not exist" in p for p in problems)


# ---------------------------------------------------------------------------- schemas


def test_rendered_manifests_are_valid_kubernetes_objects(docs: list[Doc]) -> None:
    checked = kubernetes_docs(docs)
    kinds = {d["kind"] for d in checked}
    assert {"Namespace", "ConfigMap", "Deployment", "Service", "Job"} <= kinds
    assert "PodDisruptionBudget" in kinds
    assert [p for d in checked for p in schema_problems(d)] == []


@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=lambda p: p.name)
def test_every_resource_file_is_valid_on_its_own(directory: Path) -> None:
    resources = [p for p in referenced_paths(directory) if p.is_file() and "patch" not in p.name]
    docs = [d for path in resources for d in load_yaml_docs(path)]
    assert docs
    assert [p for d in kubernetes_docs(docs) for p in schema_problems(d)] == []


def test_keda_kinds_have_no_bundled_schema(rendered: dict[str, list[Doc]]) -> None:
    """Why the KEDA objects are checked structurally (test_keda.py) instead."""
    keda = [d for d in rendered["overlay"] if d["apiVersion"].startswith(KEDA_GROUP)]
    assert {d["kind"] for d in keda} == {"ScaledObject", "TriggerAuthentication"}
    assert all("Couldn't find schema" in schema_problems(d)[0] for d in keda)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("containers", 0, "imagePullPolcy"), "Always", "'imagePullPolcy' was unexpected"),
        (("containers", 0, "resources", "limits", "memory"), ["512Mi"], "memory"),
        (("terminationGracePeriodSeconds",), "seventy", "terminationGracePeriodSeconds"),
    ],
    ids=["misspelled-field", "wrong-type", "not-a-number"],
)
def test_a_broken_deployment_fails_schema_validation(
    docs: list[Doc], path: tuple[str | int, ...], value: object, expected: str
) -> None:
    broken = copy.deepcopy(deployment(docs, "worker-default"))
    node = broken["spec"]["template"]["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    problems = schema_problems(broken)
    assert problems and expected in problems[0]


# ---------------------------------------------------------------------------- pods


def test_pods_are_hardened(docs: list[Doc]) -> None:
    assert hardening_problems(docs, uid=image_user()) == []


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("readOnlyRootFilesystem", False, "readOnlyRootFilesystem"),
        ("allowPrivilegeEscalation", True, "allowPrivilegeEscalation"),
        ("capabilities", {"drop": ["NET_RAW"]}, "drop ALL"),
    ],
)
def test_a_weakened_container_is_reported(
    docs: list[Doc], field: str, value: object, expected: str
) -> None:
    api = deployment(docs, "api")
    api["spec"]["template"]["spec"]["containers"][0]["securityContext"][field] = value
    assert any(expected in p for p in hardening_problems([api], uid=image_user()))


def test_a_pod_running_as_another_user_than_the_image_is_reported(docs: list[Doc]) -> None:
    api = deployment(docs, "api")
    api["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0
    assert any("runAsUser 0" in p for p in hardening_problems([api], uid=image_user()))


def test_probes_reach_what_each_process_serves(docs: list[Doc]) -> None:
    assert probe_problems(docs) == []
    worker = deployment(docs, "worker-default")["spec"]["template"]["spec"]["containers"][0]
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_a_probe_on_the_wrong_port_or_path_is_reported(docs: list[Doc]) -> None:
    worker = deployment(docs, "worker-default")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["port"] = 8080
    container["livenessProbe"]["httpGet"]["path"] = "/readyz"
    problems = probe_problems([worker])
    assert any("readinessProbe port 8080 is not the served 8081" in p for p in problems)
    assert any("livenessProbe must GET /healthz" in p for p in problems)


def test_services_and_disruption_budgets_select_real_pods(docs: list[Doc]) -> None:
    assert selector_problems(docs) == []
    assert set(by_kind(docs, "PodDisruptionBudget")) >= {"api", "publisher", "worker-default"}


def test_a_selector_matching_no_pods_is_reported(docs: list[Doc]) -> None:
    service = by_kind(docs, "Service")["api"]
    service["spec"]["selector"]["app.kubernetes.io/component"] = "apii"
    assert any("not exactly one workload" in p for p in selector_problems(docs))


# ---------------------------------------------------------------------------- settings


def test_everything_lands_in_one_namespace(docs: list[Doc]) -> None:
    (namespace,) = by_kind(docs, "Namespace")
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == namespace, doc["metadata"]["name"]


OWN_SECRET = {"migrate": "conveyor-migrate", "api": "conveyor-api",
              "publisher": "conveyor-publisher", "worker": "conveyor-worker"}  # fmt: skip
DB_PASSWORDS = {f"CONVEYOR_{c}_DB_PASSWORD" for c in ("API", "PUBLISHER", "WORKER", "SWEEPER")}


def test_config_and_secret_keys_are_real_settings(docs: list[Doc]) -> None:
    fields = {f"CONVEYOR_{name.upper()}" for name in Settings.model_fields}
    config = by_kind(docs, "ConfigMap")["conveyor-config"]["data"]
    secrets = documented_secrets()
    for name in OWN_SECRET.values():
        data = secrets[name]
        extra = DB_PASSWORDS if name == "conveyor-migrate" else set()
        assert set(data) <= fields | extra, name
        Settings.model_validate(
            {k.removeprefix("CONVEYOR_").lower(): v for k, v in {**config, **data}.items()
             if k in fields}
        )  # fmt: skip
    assert set(config) <= fields


def test_each_component_reads_only_its_own_secret(docs: list[Doc]) -> None:
    """Least privilege: every pod reads the config and its component's Secret,
    whose URLs name that component's own role and user; only the migrate Job holds the
    owner's URL and the roles' passwords."""
    secrets = documented_secrets()
    seen = set()
    for doc in docs:
        label = doc.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component", "")
        component = "worker" if label.startswith("worker") else label  # worker-email, ...
        for c in containers(doc):
            sources = {
                (s.get("configMapRef") or s.get("secretRef"))["name"] for s in c.get("envFrom", [])
            }
            assert sources == {"conveyor-config", OWN_SECRET[component]}, (component, sources)
            seen.add(component)
            data = secrets[OWN_SECRET[component]]
            db = urlsplit(data["CONVEYOR_DATABASE_URL"])
            if component == "migrate":
                assert db.username == "conveyor" and set(data) >= DB_PASSWORDS
                continue
            assert db.username == f"conveyor_{component}", (component, db.username)
            assert not DB_PASSWORDS & set(data), component
            if component == "api":
                assert "CONVEYOR_AMQP_URL" not in data
            else:
                assert urlsplit(data["CONVEYOR_AMQP_URL"]).username == f"conveyor_{component}"
    assert seen >= set(OWN_SECRET)


def test_no_secret_is_created_and_no_placeholder_shipped(docs: list[Doc]) -> None:
    """Applying the manifests must not create credentials anyone can read in git: the Secrets
    come from the user (docs/deploying.md), and a pod whose Secret is missing stays in
    CreateContainerConfigError naming it instead of running with a known password."""
    assert by_kind(docs, "Secret") == {}
    assert "CHANGE-ME" not in yaml.safe_dump_all(docs)
    assert optional_secret_refs(docs) == []


def test_every_secret_the_manifests_read_is_documented(docs: list[Doc]) -> None:
    documented = documented_secrets()
    refs = secret_refs(docs)
    assert refs
    for name, key in sorted(refs, key=str):
        assert name in documented, f"Secret {name} is read but docs/deploying.md never creates it"
        if key is not None:
            assert key in documented[name], f"{name}/{key} is read but not documented"


def test_the_documented_secrets_use_generated_passwords() -> None:
    text = DEPLOYING.read_text()
    assert "CHANGE-ME" not in text
    assert "openssl rand -hex 24" in text
    for name, data in documented_secrets().items():
        for key, value in data.items():
            assert STAND_IN in value, f"{name}/{key}: a literal credential in the docs"


def test_the_migrate_job_runs_conveyor_migrate_once(docs: list[Doc]) -> None:
    job = by_kind(docs, "Job")["migrate"]
    spec = job["spec"]["template"]["spec"]
    assert spec["containers"][0]["args"] == ["migrate", "--create-roles"]
    assert spec["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] > 0


def test_the_api_listens_on_all_interfaces_behind_its_service(docs: list[Doc]) -> None:
    api = deployment(docs, "api")["spec"]["template"]["spec"]["containers"][0]
    assert api["args"] == ["api", "--host", "0.0.0.0", "--port", "8000"]
    (port,) = by_kind(docs, "Service")["api"]["spec"]["ports"]
    assert port["targetPort"] == "http"
