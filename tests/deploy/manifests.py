"""The manifests under k8s/ as the deploy tests read them: rendered by the real kustomize
(``kubectl kustomize``, kustomize v5.5 on every machine here), never by a re-implementation.
Without kubectl the deploy tests fail and say so — they do not skip."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUSTOMIZATION = "kustomization.yaml"
POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


class KustomizeError(Exception):
    pass


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise KustomizeError(
            "kubectl not found on PATH: the deploy tests render k8s/ with `kubectl kustomize` "
            "(kustomize v5.5). Install kubectl (https://kubernetes.io/docs/tasks/tools/)."
        )
    return found


def render(directory: Path) -> list[Doc]:
    """``kubectl kustomize DIRECTORY`` → its documents; kustomize's own error on failure."""
    r = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    if r.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {directory} failed: {r.stderr.strip()[-2000:]}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def render_with_prometheus(tmp: Path) -> list[Doc]:
    """The example overlay (a copy under ``tmp``) with the Prometheus-operator component added
    the way its comment says, rendered."""
    from .checks import K8S, OVERLAY

    tree = tmp / "k8s"
    shutil.copytree(K8S, tree)
    overlay = tree / OVERLAY.relative_to(K8S)
    with (overlay / "kustomization.yaml").open("a") as f:
        f.write("components:\n  - ../../components/prometheus\n")
    return render(overlay)


def load_yaml_docs(path: Path) -> list[Doc]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def referenced_paths(directory: Path) -> list[Path]:
    """Every local path a kustomization names: resources, components and patch files."""
    k = yaml.safe_load((directory / KUSTOMIZATION).read_text()) or {}
    names = [*k.get("resources", []), *k.get("components", [])]
    names += [p["path"] for p in k.get("patches", []) if "path" in p]
    return [directory / n for n in names]


def pod_spec(doc: Doc) -> Doc | None:
    """The pod spec inside a workload, or None for other kinds."""
    path = POD_TEMPLATE_PATHS.get(doc.get("kind", ""))
    if path is None:
        return None
    node: Any = doc
    for key in path:
        node = node.get(key, {})
    return node if isinstance(node, dict) else None


def containers(doc: Doc) -> Iterator[Doc]:
    spec = pod_spec(doc)
    if spec is not None:
        yield from spec.get("initContainers", [])
        yield from spec.get("containers", [])
