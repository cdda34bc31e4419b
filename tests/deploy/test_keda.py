"""KEDA: one ScaledObject per worker Deployment, one rabbitmq trigger (HTTP mode) per queue the
worker consumes, credentials through a TriggerAuthentication, and the postgresql alternative."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from examples.app import router

from .checks import KEDA_GROUP, by_kind, worker_types, workers
from .keda_checks import keda_problems, scaling_matches_worker_problems
from .manifests import Doc

POSTGRESQL_QUERY = (
    "SELECT count(*) + conveyor.admissible('send_email') FROM conveyor.jobs "
    "WHERE job_type = 'send_email' "
    "AND status IN ('PENDING','IN_PROGRESS')"
)


def scaled_object(docs: list[Doc], name: str) -> Doc:
    return by_kind(docs, "ScaledObject")[name]


def test_keda_objects_are_consistent(docs: list[Doc]) -> None:
    assert keda_problems(docs) == []


def test_each_worker_scales_on_exactly_the_queues_it_consumes(docs: list[Doc]) -> None:
    assert scaling_matches_worker_problems(docs) == []


def test_the_base_applies_without_keda(rendered: dict[str, list[Doc]]) -> None:
    """A vanilla cluster has no keda.sh CRDs: the base uses none, and its worker runs a fixed
    number of replicas."""
    base = rendered["base"]
    assert [d["kind"] for d in base if d["apiVersion"].startswith(KEDA_GROUP)] == []
    assert by_kind(base, "Deployment")["worker-default"]["spec"]["replicas"] >= 1


def test_the_keda_overlay_scales_the_base_worker(rendered: dict[str, list[Doc]]) -> None:
    keda = rendered["keda"]
    assert set(by_kind(keda, "TriggerAuthentication")) == {"conveyor-rabbitmq"}
    assert set(by_kind(keda, "ScaledObject")) == {"worker-default"}
    assert "replicas" not in by_kind(keda, "Deployment")["worker-default"]["spec"]


def test_the_keda_worker_scales_on_one_trigger_per_queue(rendered: dict[str, list[Doc]]) -> None:
    so = scaled_object(rendered["keda"], "worker-default")
    queues = [t["metadata"]["queueName"] for t in so["spec"]["triggers"]]
    assert queues == [f"jobs.queue.{t}" for t in sorted(router.types)]
    assert so["spec"]["minReplicaCount"] == 0
    assert so["spec"]["cooldownPeriod"] > 0


def test_the_overlay_splits_the_job_types_between_two_workers(
    rendered: dict[str, list[Doc]],
) -> None:
    found = {name: worker_types(args) for name, args in workers(rendered["overlay"]).items()}
    assert found == {
        "worker-email": ["send_email"],
        "worker-default": [
            "hello",
            "never_succeeds",
            "poll_upstream",
            "resize_image",
            "sync_account",
        ],
    }
    so = scaled_object(rendered["overlay"], "worker-email")
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq"
    assert trigger["metadata"]["queueName"] == "jobs.queue.send_email"


def test_the_postgresql_component_counts_pending_and_running_jobs(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = rendered["overlay+postgresql"]
    (trigger,) = scaled_object(docs, "worker-email")["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert " ".join(trigger["metadata"]["query"].split()) == POSTGRESQL_QUERY
    assert trigger["authenticationRef"]["name"] in by_kind(docs, "TriggerAuthentication")
    # worker-default keeps its rabbitmq triggers
    default = scaled_object(docs, "worker-default")["spec"]["triggers"]
    assert {t["type"] for t in default} == {"rabbitmq"}


# ---------------------------------------------------------------------------- broken on purpose


def first_trigger(docs: list[Doc]) -> Doc:
    trigger: Doc = scaled_object(docs, "worker-email")["spec"]["triggers"][0]
    return trigger


def two_queues(docs: list[Doc]) -> None:
    first_trigger(docs)["metadata"]["queueName"] = "jobs.queue.send_email,jobs.queue.hello"


def wildcard(docs: list[Doc]) -> None:
    first_trigger(docs)["metadata"]["queueName"] = "jobs.queue.*"


def amqp_mode(docs: list[Doc]) -> None:
    first_trigger(docs)["metadata"]["protocol"] = "amqp"


def inline_host(docs: list[Doc]) -> None:
    first_trigger(docs)["metadata"]["host"] = "http://guest:guest@rabbitmq:15672/"


def unknown_auth(docs: list[Doc]) -> None:
    first_trigger(docs)["authenticationRef"]["name"] = "rabbitmq-auth"


def missing_secret_key(docs: list[Doc]) -> None:
    auth = by_kind(docs, "TriggerAuthentication")["conveyor-rabbitmq"]
    auth["spec"]["secretTargetRef"][0]["key"] = "rabbitmq-url"


def missing_deployment(docs: list[Doc]) -> None:
    scaled_object(docs, "worker-email")["spec"]["scaleTargetRef"]["name"] = "worker-mail"


def no_scale_to_zero(docs: list[Doc]) -> None:
    scaled_object(docs, "worker-email")["spec"]["minReplicaCount"] = 1


def unscaled_worker(docs: list[Doc]) -> None:
    docs.remove(scaled_object(docs, "worker-email"))


def fixed_and_scaled(docs: list[Doc]) -> None:
    by_kind(docs, "Deployment")["worker-email"]["spec"]["replicas"] = 2


def two_scaled_objects(docs: list[Doc]) -> None:
    twin = copy.deepcopy(scaled_object(docs, "worker-email"))
    twin["metadata"]["name"] = "worker-email-2"
    docs.append(twin)


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (two_queues, "exactly one queue name"),
        (wildcard, "exactly one queue name"),
        (amqp_mode, "protocol must be http"),
        (inline_host, "belongs in a TriggerAuthentication"),
        (unknown_auth, "names no TriggerAuthentication"),
        (missing_secret_key, "which no Secret holds"),
        (missing_deployment, "is no Deployment here"),
        (no_scale_to_zero, "minReplicaCount must be 0"),
        (unscaled_worker, "neither a ScaledObject nor replicas"),
        (fixed_and_scaled, "kubectl apply and KEDA fight"),
        (two_scaled_objects, "is already scaled by"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_broken_scaled_object_is_rejected(
    rendered: dict[str, list[Doc]], breakage: Callable[[list[Doc]], None], expected: str
) -> None:
    docs = copy.deepcopy(rendered["overlay"])
    assert keda_problems(docs) == []
    breakage(docs)
    problems = keda_problems(docs)
    assert any(expected in p for p in problems), problems


def test_a_worker_scaling_on_another_types_queue_is_reported(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = copy.deepcopy(rendered["overlay"])
    first_trigger(docs)["metadata"]["queueName"] = "jobs.queue.hello"
    (problem,) = scaling_matches_worker_problems(docs)
    assert "worker-email consumes ['jobs.queue.send_email']" in problem
