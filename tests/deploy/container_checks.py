"""Checks on deploy/Dockerfile, .dockerignore, docker-compose.yml and .env.example."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import ROOT, parse_command

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"


# ---------------------------------------------------------------------------- Dockerfile


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for k, arg in self.instructions if k == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions (continuation lines joined, comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    stages: list[Stage] = []
    for line in lines:
        keyword, _, arg = line.strip().partition(" ")
        keyword, arg = keyword.upper(), " ".join(arg.split())
        if keyword == "FROM":
            words = arg.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{keyword} before the first FROM")
        else:
            stages[-1].instructions.append((keyword, arg))
    return stages


def exec_form(arg: str) -> list[str] | None:
    try:
        value = json.loads(arg)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def copy_sources(stages: list[Stage]) -> list[str]:
    """Build-context paths that COPY/ADD read (not those copied from another stage)."""
    sources = []
    for stage in stages:
        for keyword in ("COPY", "ADD"):
            for arg in stage.all(keyword):
                words = shlex.split(arg)
                if any(w.startswith("--from=") for w in words):
                    continue
                paths = [w for w in words if not w.startswith("--")]
                sources += paths[:-1]
    return sources


def image_uid(stages: list[Stage]) -> int | None:
    users = stages[-1].all("USER") if stages else []
    if not users:
        return None
    user = users[-1].split(":")[0]
    return int(user) if user.isdigit() else None


def dockerfile_problems(text: str) -> list[str]:
    stages = parse_dockerfile(text)
    problems = []
    if len(stages) < 2:
        return ["a multi-stage build needs a builder stage and a final stage"]
    for stage in stages:
        if not stage.base.startswith("python:3.11-slim"):
            problems.append(f"stage {stage.name}: based on {stage.base}, not python:3.11-slim")
    builder, final = stages[0], stages[-1]
    if not any("pip wheel" in run for run in builder.all("RUN")):
        problems.append("the builder stage does not build wheels (pip wheel)")
    uses_builder = f"from={builder.name}"
    if not any(uses_builder in arg for arg in final.all("RUN") + final.all("COPY")):
        problems.append(f"the final stage does not install from the {builder.name} stage")
    if any(src.startswith("services") for src in copy_sources([final])):
        problems.append("the final stage copies source code instead of installing the wheel")
    if not any(src.rstrip("/") == "examples" for src in copy_sources([final])):
        problems.append("the final stage does not copy examples/ (the compose worker runs it)")
    users = final.all("USER")
    uid = image_uid(stages)
    if not users:
        problems.append("the final stage sets no USER: it would run as root")
    elif uid is None or uid == 0:
        problems.append(f"the final USER {users[-1]!r} must be a numeric non-root UID")
    entrypoints = final.all("ENTRYPOINT")
    if not entrypoints or exec_form(entrypoints[-1]) != ["conveyor"]:
        problems.append('the final ENTRYPOINT must be ["conveyor"] (the command picks the service)')
    return problems


# ---------------------------------------------------------------------------- .dockerignore


def _pattern(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_excludes(text: str, path: str) -> bool:
    """Whether the build context leaves ``path`` out: the last pattern matching the path or one
    of its parent directories decides; ``!`` re-includes."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, _pattern(line.lstrip("!").strip("/"))))
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            excluded = not negate
    return excluded


# ---------------------------------------------------------------------------- compose

KNOWN_SERVICE_KEYS = {
    "build", "command", "container_name", "depends_on", "deploy", "entrypoint", "env_file",
    "environment", "expose", "healthcheck", "hostname", "image", "init", "labels", "logging",
    "networks", "ports", "profiles", "pull_policy", "read_only", "restart", "security_opt",
    "stop_grace_period", "stop_signal", "tmpfs", "ulimits", "user", "volumes", "working_dir",
}  # fmt: skip
KNOWN_HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "disable"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
APP_SERVICES = ("api", "publisher", "worker")
WAIT_FOR = {
    "postgres": "service_healthy",
    "rabbitmq": "service_healthy",
    "migrate": "service_completed_successfully",
    "broker-users": "service_completed_successfully",
}


def duration_seconds(value: str | int) -> float:
    """Compose durations: ``70s``, ``1m30s``, ``500ms`` or a number of seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a compose duration: {value!r}")
    return sum(float(n) * units[u] for n, u in parts)


def command_of(service: dict[str, Any]) -> argparse.Namespace | str:
    command = service.get("command")
    if not isinstance(command, list):
        return f"command {command!r} must be a list (exec form)"
    return parse_command([str(c) for c in command])


def compose_problems(compose: dict[str, Any], shutdown_grace: float, overhead: float) -> list[str]:
    problems = []
    services: dict[str, dict[str, Any]] = compose.get("services", {})
    for name in ("postgres", "rabbitmq", "migrate", "broker-users", *APP_SERVICES):
        if name not in services:
            problems.append(f"no {name} service")
    for name, svc in services.items():
        unknown = set(svc) - KNOWN_SERVICE_KEYS
        if unknown:
            problems.append(f"{name}: unknown keys {sorted(unknown)}")
        one_shot = svc.get("restart") == "no"  # migrate, broker-users: run once, then exit
        health = svc.get("healthcheck")
        if not one_shot and not (health and health.get("test")):
            problems.append(f"{name}: a long-running service without a healthcheck")
        if health and set(health) - KNOWN_HEALTHCHECK_KEYS:
            problems.append(
                f"{name}: unknown healthcheck keys {set(health) - KNOWN_HEALTHCHECK_KEYS}"
            )
        depends = svc.get("depends_on", {})
        if isinstance(depends, list):
            problems.append(f"{name}: depends_on needs conditions, not a list")
            continue
        for dep, spec in depends.items():
            if dep not in services:
                problems.append(f"{name}: depends on unknown service {dep}")
            if spec.get("condition") not in CONDITIONS:
                problems.append(f"{name}: depends_on {dep} has condition {spec.get('condition')}")
    for name in APP_SERVICES:
        depends = services.get(name, {}).get("depends_on", {})
        for dep, condition in WAIT_FOR.items():
            got = depends.get(dep, {}).get("condition") if isinstance(depends, dict) else None
            if got != condition:
                problems.append(f"{name}: must wait for {dep} with {condition}, not {got}")
    migrate = services.get("migrate", {})
    if migrate.get("restart", "no") != "no":
        problems.append("migrate: a one-shot service must not restart")
    worker = services.get("worker", {})
    if "container_name" in worker:
        problems.append("worker: container_name prevents --scale worker=N")
    for port in worker.get("ports", []):
        fixed = port.get("published") if isinstance(port, dict) else ":" in str(port)
        if fixed:
            problems.append(f"worker: fixed host port {port} prevents --scale worker=N")
    grace = duration_seconds(worker.get("stop_grace_period", "10s"))
    if grace < shutdown_grace + overhead:
        problems.append(
            f"worker: stop_grace_period {grace:g} s < shutdown grace {shutdown_grace:g} s + "
            f"drain bookkeeping {overhead:g} s"
        )
    return problems


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path.name}: {line!r} is not KEY=value")
            values[key.strip()] = value.strip()
    return values
