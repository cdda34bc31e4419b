"""Every container command line, in compose and in Kubernetes, is one the real `conveyor` parser
accepts, and the worker's drain fits in the time the platform gives it before SIGKILL."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import yaml

from .checks import (
    by_kind,
    command_problems,
    drain_problems,
    parse_command,
    worker_types,
)
from .container_checks import COMPOSE, command_of
from .manifests import Doc


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def worker_container(docs: list[Doc], name: str = "worker-default") -> Doc:
    container: Doc = by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["containers"][0]
    return container


# ---------------------------------------------------------------------------- command lines


def test_kubernetes_containers_run_real_conveyor_commands(docs: list[Doc]) -> None:
    assert command_problems(docs) == []


@pytest.mark.parametrize("service", ["migrate", "api", "publisher", "worker"])
def test_compose_services_run_real_conveyor_commands(service: str) -> None:
    args = command_of(compose_services()[service])
    assert isinstance(args, argparse.Namespace), args
    assert args.command == service
    if service == "worker":
        assert worker_types(args) == [
            "hello",
            "never_succeeds",
            "poll_upstream",
            "resize_image",
            "send_email",
            "sync_account",
        ]


def test_the_compose_commands_are_the_documented_ones() -> None:
    services = compose_services()
    assert services["migrate"]["command"] == ["migrate", "--create-roles"]
    assert services["api"]["command"] == ["api", "--host", "0.0.0.0", "--port", "8000"]
    assert services["worker"]["command"] == [
        "worker", "--app", "examples.app:router", "--concurrency", "16", "--health-port", "8081",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--app", "examples.app:router", "--concurency", "16"],
        ["worker", "--concurrency", "16"],
        ["worker", "--app", "examples.app:router", "--concurrency", "many"],
        ["workers", "--app", "examples.app:router"],
        ["api", "--listen", "0.0.0.0"],
    ],
    ids=["misspelled-option", "missing-app", "not-a-number", "unknown-command", "unknown-option"],
)
def test_the_parser_rejects_a_wrong_command_line(argv: list[str]) -> None:
    assert isinstance(parse_command(argv), str)


def test_a_broken_container_command_is_reported(docs: list[Doc]) -> None:
    worker_container(docs)["args"].append("--prefetch=64")
    problems = command_problems(docs)
    assert any("unrecognized arguments: --prefetch=64" in p for p in problems), problems


def test_a_worker_naming_a_type_without_handler_is_reported(docs: list[Doc]) -> None:
    worker_container(docs)["args"] += ["--types", "hello,send_sms"]
    problems = command_problems(docs)
    assert any("send_sms" in p for p in problems), problems


def test_a_command_replacing_the_entrypoint_is_reported(docs: list[Doc]) -> None:
    worker_container(docs)["command"] = ["python", "-m", "conveyor"]
    assert any("does not run conveyor" in p for p in command_problems(docs))


# ---------------------------------------------------------------------------- the drain


def test_the_worker_drain_fits_in_its_termination_grace_period(docs: list[Doc]) -> None:
    assert drain_problems(docs) == []
    container = worker_container(docs)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    args = parse_command([str(a) for a in container["args"]])
    assert isinstance(args, argparse.Namespace)
    assert args.shutdown_grace == 25


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"terminationGracePeriodSeconds": 40}, "> terminationGracePeriodSeconds 40"),
        ({"preStop": ["sleep", "60"]}, "preStop 60 s"),
        ({"preStop": ["sh", "-c", "curl localhost/drain"]}, "cannot bound the preStop hook"),
        ({"shutdownGrace": "120"}, "shutdown grace 120 s"),
    ],
    ids=["short-grace-period", "long-prestop", "unbounded-prestop", "long-shutdown-grace"],
)
def test_a_drain_that_would_be_killed_is_reported(
    docs: list[Doc], change: dict[str, Any], expected: str
) -> None:
    spec = by_kind(docs, "Deployment")["worker-default"]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    if "terminationGracePeriodSeconds" in change:
        spec["terminationGracePeriodSeconds"] = change["terminationGracePeriodSeconds"]
    if "preStop" in change:
        container["lifecycle"]["preStop"]["exec"]["command"] = change["preStop"]
    if "shutdownGrace" in change:
        args = container["args"]
        args[args.index("--shutdown-grace") + 1] = change["shutdownGrace"]
    problems = drain_problems(docs)
    assert any(expected in p for p in problems), problems


def test_without_the_option_the_grace_comes_from_the_environment(docs: list[Doc]) -> None:
    container = worker_container(docs)
    args = container["args"]
    del args[args.index("--shutdown-grace") : args.index("--shutdown-grace") + 2]
    assert drain_problems(docs) == []  # the default 25 s fits
    container["env"] = [{"name": "CONVEYOR_SHUTDOWN_GRACE", "value": "90"}]
    assert any("shutdown grace 90 s" in p for p in drain_problems(docs))
