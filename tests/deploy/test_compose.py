"""docker-compose.yml and .env.example: the services, their health checks and start order, a
scalable worker with room to drain, and settings that Conveyor accepts."""

from __future__ import annotations

import argparse
import copy
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from conveyor.core.config import Settings

from .checks import DRAIN_BOOKKEEPING, ROOT
from .container_checks import (
    COMPOSE,
    DOCKERFILE,
    ENV_EXAMPLE,
    command_of,
    compose_problems,
    copy_sources,
    duration_seconds,
    parse_dockerfile,
    read_env_file,
)
from .pod_checks import HEALTHCHECK_SCRIPT

CONVEYOR_SERVICES = ("migrate", "api", "publisher", "worker")


@pytest.fixture
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


def problems_of(compose: dict[str, Any], env: dict[str, str]) -> list[str]:
    grace = float(env["CONVEYOR_SHUTDOWN_GRACE"])
    return compose_problems(compose, shutdown_grace=grace, overhead=DRAIN_BOOKKEEPING)


def test_compose_file_is_consistent(compose: dict[str, Any], env: dict[str, str]) -> None:
    assert problems_of(compose, env) == []


def test_conveyor_services_share_one_image_built_from_deploy(compose: dict[str, Any]) -> None:
    images = set()
    for name in CONVEYOR_SERVICES:
        svc = compose["services"][name]
        assert svc["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
        assert (ROOT / svc["build"]["dockerfile"]).is_file()
        assert "env_file" not in svc, f"{name}: .env holds every service's password"
        images.add(svc["image"])
    assert len(images) == 1


def test_infrastructure_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres, rabbitmq = services["postgres"], services["rabbitmq"]
    assert postgres["image"] == "postgres:15"
    volume = postgres["volumes"][0].split(":")
    assert volume[1] == "/var/lib/postgresql/data" and volume[0] in compose["volumes"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert rabbitmq["image"] == "rabbitmq:3.10-management"
    assert rabbitmq["healthcheck"]["test"] == ["CMD", "rabbitmq-diagnostics", "-q", "ping"]


def health_url(svc: dict[str, Any]) -> str:
    test = svc["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", HEALTHCHECK_SCRIPT], test
    return str(test[3])


@pytest.mark.parametrize(
    ("service", "path"), [("api", "/healthz"), ("worker", "/healthz"), ("publisher", "/healthz")]
)
def test_health_checks_hit_the_port_the_command_serves(
    compose: dict[str, Any], service: str, path: str
) -> None:
    svc = compose["services"][service]
    args = command_of(svc)
    assert isinstance(args, argparse.Namespace)
    url = urlsplit(health_url(svc))
    served = args.port if service == "api" else args.health_port
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", served, path)


def test_the_health_check_script_is_in_the_image(compose: dict[str, Any]) -> None:
    stages = parse_dockerfile(DOCKERFILE.read_text())
    copies = [arg.split() for arg in stages[-1].all("COPY")]
    assert ["deploy/healthcheck.py", HEALTHCHECK_SCRIPT] in copies
    assert "deploy/healthcheck.py" in copy_sources(stages)
    assert compose["services"]["publisher"]["healthcheck"]["test"][-1].endswith(":8082/healthz")


def test_the_worker_may_take_longer_to_stop_than_its_drain(
    compose: dict[str, Any], env: dict[str, str]
) -> None:
    stop = duration_seconds(compose["services"]["worker"]["stop_grace_period"])
    assert stop >= float(env["CONVEYOR_SHUTDOWN_GRACE"]) + DRAIN_BOOKKEEPING


# ---------------------------------------------------------------------------- .env.example


PASSWORDS = {
    *(f"CONVEYOR_{c}_DB_PASSWORD" for c in ("API", "PUBLISHER", "WORKER", "SWEEPER")),
    *(f"CONVEYOR_{c}_AMQP_PASSWORD" for c in ("PUBLISHER", "WORKER", "SWEEPER")),
}


def test_env_example_holds_every_setting_conveyor_reads(env: dict[str, str]) -> None:
    conveyor = {k: v for k, v in env.items() if k.startswith("CONVEYOR_")}
    settings_names = {
        "CONVEYOR_NAMESPACE",
        "CONVEYOR_VISIBILITY_TIMEOUT",
        "CONVEYOR_SHUTDOWN_GRACE",
    }
    assert set(conveyor) == settings_names | PASSWORDS
    settings = Settings.model_validate(
        {k.removeprefix("CONVEYOR_").lower(): conveyor[k] for k in settings_names}
    )
    assert settings.namespace == "jobs"
    assert all("example" in conveyor[k] for k in PASSWORDS), "placeholders only"
    assert len({conveyor[k] for k in PASSWORDS if "_DB_" in k}) == 4, "one password per role"


def _env_of(compose: dict[str, Any], service: str) -> dict[str, str]:
    env = compose["services"][service].get("environment", {})
    assert isinstance(env, dict), f"{service}: environment as a mapping"
    return {k: str(v) for k, v in env.items()}


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m[1], m[2] or ""), value)


@pytest.mark.parametrize("service", ["api", "publisher", "worker"])
def test_each_component_connects_as_its_own_role_and_user(
    compose: dict[str, Any], env: dict[str, str], service: str
) -> None:
    """Least privilege: the component's own database role and broker user, with
    only its own password in its environment; never the owner's or the administrator's."""
    own = _env_of(compose, service)
    db = urlsplit(_expand(own["CONVEYOR_DATABASE_URL"], env))
    assert (db.hostname, db.username, db.path) == ("postgres", f"conveyor_{service}", "/conveyor")
    assert db.password == env[f"CONVEYOR_{service.upper()}_DB_PASSWORD"]
    if service == "api":
        assert "CONVEYOR_AMQP_URL" not in own, "the API uses no broker"
    else:
        amqp = urlsplit(_expand(own["CONVEYOR_AMQP_URL"], env))
        assert (amqp.hostname, amqp.username) == ("rabbitmq", f"conveyor_{service}")
        assert amqp.password == env[f"CONVEYOR_{service.upper()}_AMQP_PASSWORD"]
    text = " ".join(own.values())
    mine = {f"CONVEYOR_{service.upper()}_DB_PASSWORD", f"CONVEYOR_{service.upper()}_AMQP_PASSWORD"}
    for secret in ("POSTGRES_PASSWORD", "RABBITMQ_DEFAULT_PASS", *(PASSWORDS - mine)):
        assert "${" + secret + "}" not in text, f"{service} holds {secret}"


def test_migrate_creates_the_roles_and_broker_users_runs_the_generated_script(
    compose: dict[str, Any], env: dict[str, str]
) -> None:
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["migrate", "--create-roles"]
    own = _env_of(compose, "migrate")
    owner = urlsplit(_expand(own["CONVEYOR_DATABASE_URL"], env))
    assert (owner.username, owner.password) == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"])
    assert {k for k in own if k.endswith("_DB_PASSWORD")} == {
        p for p in PASSWORDS if p.endswith("_DB_PASSWORD")
    }
    users = compose["services"]["broker-users"]
    assert users["restart"] == "no" and "rabbitmq-users.sh" in " ".join(users["entrypoint"])
    mounted = [v for v in users["volumes"] if "rabbitmq-users.sh" in v]
    assert mounted and (ROOT / mounted[0].split(":")[0]).is_file()
    assert {k for k in _env_of(compose, "broker-users") if k.endswith("_AMQP_PASSWORD")} == {
        p for p in PASSWORDS if p.endswith("_AMQP_PASSWORD")
    }
    for infra, keys in (("postgres", "POSTGRES_"), ("rabbitmq", "RABBITMQ_")):
        assert "env_file" not in compose["services"][infra]
        assert all(k.startswith(keys) for k in _env_of(compose, infra)), infra


def test_the_real_env_file_stays_out_of_git() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in ignored


# ---------------------------------------------------------------------------- broken on purpose


def named_worker(c: dict[str, Any]) -> None:
    c["services"]["worker"]["container_name"] = "conveyor-worker"


def worker_host_port(c: dict[str, Any]) -> None:
    c["services"]["worker"]["ports"] = ["8081:8081"]


def api_not_waiting_for_migrate(c: dict[str, Any]) -> None:
    c["services"]["api"]["depends_on"]["migrate"]["condition"] = "service_started"


def publisher_without_healthcheck(c: dict[str, Any]) -> None:
    del c["services"]["publisher"]["healthcheck"]


def short_stop_grace(c: dict[str, Any]) -> None:
    c["services"]["worker"]["stop_grace_period"] = "30s"


def misspelled_key(c: dict[str, Any]) -> None:
    svc = c["services"]["api"]
    svc["healtcheck"] = svc.pop("healthcheck")


def no_worker(c: dict[str, Any]) -> None:
    del c["services"]["worker"]


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (named_worker, "container_name prevents --scale"),
        (worker_host_port, "fixed host port"),
        (api_not_waiting_for_migrate, "api: must wait for migrate"),
        (publisher_without_healthcheck, "publisher: a long-running service without"),
        (short_stop_grace, "stop_grace_period 30 s"),
        (misspelled_key, "unknown keys ['healtcheck']"),
        (no_worker, "no worker service"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_broken_compose_file_is_rejected(
    compose: dict[str, Any],
    env: dict[str, str],
    breakage: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    broken = copy.deepcopy(compose)
    breakage(broken)
    problems = problems_of(broken, env)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("text", "seconds"), [("70s", 70), ("1m30s", 90), ("500ms", 0.5), (5, 5)])
def test_compose_durations(text: str | int, seconds: float) -> None:
    assert duration_seconds(text) == seconds


def test_a_malformed_duration_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a compose duration"):
        duration_seconds("70 seconds")
