"""A small, strict kustomize renderer for the subset k8s/ uses, so the tests need no binary.

Supported: ``resources`` (files and directories), ``components``, ``namespace``, ``images`` and
``patches`` holding RFC 6902 JSON patches (``add``, ``remove``, ``replace``, ``test``) with a
``target``. Anything else raises ``KustomizeError`` instead of being silently ignored, and so
does a patch whose target matches nothing. The order follows kustomize: resources, then
components, then this kustomization's patches, images and namespace. A test compares the output
with ``kubectl kustomize`` where that binary exists.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUSTOMIZATION = "kustomization.yaml"
SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "components", "patches", "images"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "ClusterTriggerAuthentication",
}
POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


class KustomizeError(Exception):
    pass


def load_yaml_docs(path: Path) -> list[Doc]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load_kustomization(directory: Path) -> Doc:
    path = directory / KUSTOMIZATION
    if not path.is_file():
        raise KustomizeError(f"{directory} has no {KUSTOMIZATION}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise KustomizeError(f"{path} is not a mapping")
    unsupported = set(data) - SUPPORTED
    if unsupported:
        raise KustomizeError(
            f"{path}: fields this renderer does not support: {sorted(unsupported)}"
        )
    return data


def referenced_paths(directory: Path) -> list[Path]:
    """Every local path a kustomization names: resources, components and patch files."""
    k = load_kustomization(directory)
    names = [*k.get("resources", []), *k.get("components", [])]
    names += [p["path"] for p in k.get("patches", []) if "path" in p]
    return [directory / n for n in names]


def render(directory: Path) -> list[Doc]:
    k = load_kustomization(directory)
    kind = k.get("kind", "Kustomization")
    if kind != "Kustomization":
        raise KustomizeError(f"{directory} is a {kind}, not a Kustomization")
    return _build(directory, k, [])


def _build(directory: Path, k: Doc, docs: list[Doc]) -> list[Doc]:
    docs = list(docs)
    for name in k.get("resources", []):
        path = directory / name
        if path.is_dir():
            docs += render(path)
        elif path.is_file():
            docs += load_yaml_docs(path)
        else:
            raise KustomizeError(f"{directory}: resource {name} does not exist")
    for name in k.get("components", []):
        comp_dir = directory / name
        comp = load_kustomization(comp_dir)
        if comp.get("kind") != "Component":
            raise KustomizeError(f"{comp_dir} is listed as a component but is not a Component")
        docs = _build(comp_dir, comp, docs)
    for patch in k.get("patches", []):
        docs = _apply_patch(directory, patch, docs)
    for image in k.get("images", []):
        _set_image(docs, image)
    if "namespace" in k:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc.setdefault("metadata", {})["namespace"] = k["namespace"]
    return docs


# ---------------------------------------------------------------------------- patches


def _apply_patch(directory: Path, patch: Doc, docs: list[Doc]) -> list[Doc]:
    if "path" in patch:
        ops = yaml.safe_load((directory / patch["path"]).read_text())
    elif "patch" in patch:
        ops = yaml.safe_load(patch["patch"])
    else:
        raise KustomizeError(f"{directory}: a patch needs path or patch")
    if not isinstance(ops, list):
        raise KustomizeError(f"{directory}: only JSON 6902 patches (lists of ops) are supported")
    target = patch.get("target")
    if not target:
        raise KustomizeError(f"{directory}: a JSON 6902 patch needs a target")
    matched = [i for i, d in enumerate(docs) if _matches(d, target)]
    if not matched:
        raise KustomizeError(f"{directory}: patch target {target} matches no resource")
    docs = list(docs)
    for i in matched:
        docs[i] = json_patch(docs[i], ops)
    return docs


def _matches(doc: Doc, target: Doc) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    meta = doc.get("metadata", {})
    wanted = {
        "group": group,
        "version": version,
        "kind": doc["kind"],
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
    }
    unknown = set(target) - set(wanted)
    if unknown:
        raise KustomizeError(f"unsupported target selectors {sorted(unknown)}")
    return all(wanted[key] == value for key, value in target.items())


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, append: bool = False) -> int:
    if append and token == "-":
        return len(container)
    if not token.isdigit():
        raise KustomizeError(f"{token!r} is not a list index")
    i = int(token)
    if i > len(container) or (i == len(container) and not append):
        raise KustomizeError(f"index {i} is out of range")
    return i


def json_patch(doc: Doc, ops: Iterable[Doc]) -> Doc:
    """RFC 6902 add / remove / replace / test on a copy of ``doc``."""
    result = copy.deepcopy(doc)
    for op in ops:
        kind, tokens = op.get("op"), _pointer(op["path"])
        parent: Any = result
        for token in tokens[:-1]:
            parent = parent[_index(parent, token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if kind == "test":
            current = parent[_index(parent, last)] if isinstance(parent, list) else parent[last]
            if current != op["value"]:
                raise KustomizeError(f"test failed at {op['path']}: {current!r} != {op['value']!r}")
        elif kind == "add":
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                parent.insert(_index(parent, last, append=True), value)
            else:
                parent[last] = value
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[_index(parent, last)]
            else:
                del parent[last]
        elif kind == "replace":
            if isinstance(parent, list):
                parent[_index(parent, last)] = copy.deepcopy(op["value"])
            elif last not in parent:
                raise KustomizeError(f"replace: nothing at {op['path']}")
            else:
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise KustomizeError(f"unsupported JSON patch op {kind!r}")
    return result


# ---------------------------------------------------------------------------- images


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


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` → (name, tag, digest); a registry port is not a tag."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None


def _set_image(docs: list[Doc], rule: Doc) -> None:
    for doc in docs:
        for c in containers(doc):
            name, tag, digest = split_image(c["image"])
            if name != rule["name"]:
                continue
            name = rule.get("newName", name)
            if "digest" in rule:
                c["image"] = f"{name}@{rule['digest']}"
            else:
                tag = rule.get("newTag", tag)
                c["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
