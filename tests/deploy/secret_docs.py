"""The Secrets the manifests read but do not create: the ``kubectl create secret generic``
commands in docs/deploying.md, read back as ``{secret name: {key: value}}`` (the shell
variables in a value, the generated passwords, replaced by a stand-in), and the references
to Secrets in rendered manifests."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from .checks import ROOT
from .manifests import Doc, containers

DEPLOYING = ROOT / "docs" / "deploying.md"
CREATE = ("kubectl", "-n", "conveyor", "create", "secret", "generic")
SHELL_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
STAND_IN = "generated-password"


def secret_commands(text: str) -> list[list[str]]:
    """The ``kubectl create secret`` lines of the doc's ```sh and ```bash blocks, continuation
    lines joined, split as the shell would (without expanding variables)."""
    commands = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            if " create secret " in line:
                commands.append(shlex.split(line, comments=True))
    return commands


def documented_secrets(text: str | None = None) -> dict[str, dict[str, str]]:
    text = DEPLOYING.read_text() if text is None else text
    secrets: dict[str, dict[str, str]] = {}
    for argv in secret_commands(text):
        if tuple(argv[: len(CREATE)]) != CREATE:
            continue
        name, *options = argv[len(CREATE) :]
        data = secrets.setdefault(name, {})
        for option in options:
            key, _, value = option.removeprefix("--from-literal=").partition("=")
            assert option.startswith("--from-literal="), f"{name}: unexpected {option}"
            data[key] = SHELL_VARIABLE.sub(STAND_IN, value)
    return secrets


def secret_refs(docs: Iterable[Doc]) -> set[tuple[str, str | None]]:
    """(Secret, key) every pod and KEDA TriggerAuthentication reads; key None for envFrom."""
    refs: set[tuple[str, str | None]] = set()
    for doc in docs:
        for c in containers(doc):
            for source in c.get("envFrom", []):
                if "secretRef" in source:
                    refs.add((source["secretRef"]["name"], None))
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
        if doc.get("kind") == "TriggerAuthentication":
            for ref in doc["spec"].get("secretTargetRef", []):
                refs.add((ref["name"], ref["key"]))
    return refs


def optional_secret_refs(docs: Iterable[Doc]) -> list[str]:
    """Secret references marked optional: a pod would start without its credentials."""
    found = []
    for doc in docs:
        for c in containers(doc):
            for source in c.get("envFrom", []):
                if source.get("secretRef", {}).get("optional"):
                    found.append(source["secretRef"]["name"])
            for env in c.get("env", []):
                if env.get("valueFrom", {}).get("secretKeyRef", {}).get("optional"):
                    found.append(env["name"])
    return found
