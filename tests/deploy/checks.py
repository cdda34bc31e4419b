"""Checks on the Kubernetes manifests: each returns a list of problems (empty when fine), so a
test can assert the real manifests pass and a deliberately broken copy fails."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import kubernetes_validate

from conveyor.cli.main import build_parser
from conveyor.cli.processes import load_router
from conveyor.core.config import Settings

from .manifests import KUSTOMIZATION, Doc, containers, pod_spec, referenced_paths

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
KEDA_OVERLAY = K8S / "overlays" / "keda"
POSTGRESQL_COMPONENT = K8S / "components" / "keda-postgresql"

KUBERNETES_VERSION = "1.30"
KEDA_GROUP = "keda.sh/"

# Worker.stop's own bounded waits after the grace period: a claim batch in flight (10 s),
# cancelled handlers reporting back (5 s), the result flush (15 s), closing the pool (5 s).
DRAIN_BOOKKEEPING = 10 + 5 + 15 + 5


def kind_name(doc: Doc) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def by_kind(docs: Iterable[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


# ---------------------------------------------------------------------------- files


def listing_problems(directory: Path) -> list[str]:
    """Every YAML file in a kustomization directory is listed, and every listed path exists."""
    listed = referenced_paths(directory)
    missing = [p for p in listed if not p.exists()]
    problems = [f"{directory.name}: lists {p.name}, which does not exist" for p in missing]
    listed_files = {p.resolve() for p in listed if p.is_file()}
    for path in sorted(directory.iterdir()):
        is_yaml = path.suffix in (".yaml", ".yml")
        if is_yaml and path.name != KUSTOMIZATION and path.resolve() not in listed_files:
            problems.append(f"{directory.name}: {path.name} is not listed in {KUSTOMIZATION}")
    return problems


# ---------------------------------------------------------------------------- schemas


def schema_problems(doc: Doc, version: str = KUBERNETES_VERSION) -> list[str]:
    """Strict validation against the bundled Kubernetes schemas (unknown fields fail)."""
    return list(_schema_problems(json.dumps(doc, sort_keys=True), version))


@functools.cache
def _schema_problems(doc_json: str, version: str) -> tuple[str, ...]:
    """Cached by content: the variants share most objects, and each validation reads the
    schema files again."""
    doc = json.loads(doc_json)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        return (f"{kind_name(doc)}: {where}: {exc.message}",)
    except kubernetes_validate.SchemaNotFoundError as exc:
        return (f"{kind_name(doc)}: {exc.message}",)
    return ()


# ---------------------------------------------------------------------------- commands


def parse_command(argv: Sequence[str]) -> argparse.Namespace | str:
    """The real CLI parser's reading of a container command line, or why it rejects it."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(list(argv))
    except SystemExit:
        return f"not a conveyor command line {list(argv)}: {err.getvalue().strip()}"


def container_argv(container: Doc) -> list[str] | str:
    """What follows `conveyor` in a container (the image's ENTRYPOINT is ["conveyor"])."""
    command = container.get("command")
    args = [str(a) for a in container.get("args", [])]
    if command is None:
        return args
    if not command or command[0] != "conveyor":
        return f"container {container.get('name')} does not run conveyor: {command}"
    return [str(c) for c in command[1:]] + args


def worker_types(args: argparse.Namespace) -> list[str] | str:
    """The job types a `conveyor worker` consumes, from its --app router and --types."""
    try:
        router = load_router(args.app)
    except SystemExit as exc:
        return f"--app {args.app}: {exc}"
    if not args.types:
        return sorted(router.types)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    unknown = sorted(set(types) - set(router.types))
    if unknown:
        return f"--types names types {args.app} has no handler for: {unknown}"
    return sorted(types)


def command_problems(docs: Iterable[Doc]) -> list[str]:
    problems = []
    for doc in docs:
        for c in containers(doc):
            argv = container_argv(c)
            parsed = parse_command(argv) if isinstance(argv, list) else argv
            if isinstance(parsed, str):
                problems.append(f"{kind_name(doc)}: {parsed}")
            elif parsed.command == "worker" and isinstance(types := worker_types(parsed), str):
                problems.append(f"{kind_name(doc)}: {types}")
    return problems


def workers(docs: Iterable[Doc]) -> dict[str, argparse.Namespace]:
    """Deployments running `conveyor worker`, by name, with their parsed arguments."""
    found = {}
    for doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        for c in containers(doc):
            argv = container_argv(c)
            parsed = parse_command(argv) if isinstance(argv, list) else argv
            if not isinstance(parsed, str) and parsed.command == "worker":
                found[doc["metadata"]["name"]] = parsed
    return found


def env_value(doc: Doc, container: Doc, docs: Iterable[Doc], name: str) -> str | None:
    """A container's environment variable, from env or from ConfigMaps/Secrets in envFrom."""
    for e in container.get("env", []):
        if e["name"] == name and "value" in e:
            return str(e["value"])
    maps = by_kind(docs, "ConfigMap")
    secrets = by_kind(docs, "Secret")
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = maps.get(source["configMapRef"]["name"], {}).get("data", {})
        else:
            data = secrets.get(source.get("secretRef", {}).get("name"), {}).get("stringData", {})
        if name in data:
            return str(data[name])
    return None


def settings_namespace(docs: Sequence[Doc], doc: Doc) -> str:
    for c in containers(doc):
        value = env_value(doc, c, docs, "CONVEYOR_NAMESPACE")
        if value is not None:
            return value
    return str(Settings.model_fields["namespace"].default)


# ---------------------------------------------------------------------------- the worker's drain


def prestop_seconds(container: Doc) -> float | str:
    pre = container.get("lifecycle", {}).get("preStop")
    if pre is None:
        return 0.0
    if "sleep" in pre:
        return float(pre["sleep"]["seconds"])
    command = pre.get("exec", {}).get("command", [])
    if len(command) == 2 and command[0] == "sleep" and re.fullmatch(r"\d+", str(command[1])):
        return float(command[1])
    return f"cannot bound the preStop hook {pre}"


def drain_problems(docs: Sequence[Doc]) -> list[str]:
    """preStop + --shutdown-grace + the drain's bookkeeping fit in terminationGracePeriodSeconds."""
    problems = []
    for name, args in workers(docs).items():
        doc = by_kind(docs, "Deployment")[name]
        spec = pod_spec(doc) or {}
        budget = spec.get("terminationGracePeriodSeconds", 30)
        for c in containers(doc):
            pre = prestop_seconds(c)
            if isinstance(pre, str):
                problems.append(f"{name}: {pre}")
                continue
            grace = args.shutdown_grace
            if grace is None:
                env = env_value(doc, c, docs, "CONVEYOR_SHUTDOWN_GRACE")
                grace = float(env) if env else Settings.model_fields["shutdown_grace"].default
            needed = pre + grace + DRAIN_BOOKKEEPING
            if needed > budget:
                problems.append(
                    f"{name}: preStop {pre:g} s + shutdown grace {grace:g} s + drain bookkeeping "
                    f"{DRAIN_BOOKKEEPING} s = {needed:g} s > terminationGracePeriodSeconds {budget}"
                )
    return problems
