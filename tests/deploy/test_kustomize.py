"""The test renderer itself: JSON patches, images, strictness, and agreement with the real
kustomize (`kubectl kustomize`) wherever that binary is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .checks import BASE
from .kustomize import Doc, KustomizeError, containers, json_patch, render, split_image

KUBECTL = shutil.which("kubectl")
KUSTOMIZE = shutil.which("kustomize")


def identity(doc: Doc) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return (doc["kind"], meta.get("namespace", ""), meta["name"])


def external_render(directory: Path) -> list[Doc]:
    command = [KUSTOMIZE, "build"] if KUSTOMIZE else [str(KUBECTL), "kustomize"]
    out = subprocess.run(
        [*command, str(directory)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.skipif(not (KUBECTL or KUSTOMIZE), reason="neither kustomize nor kubectl installed")
def test_the_renderer_agrees_with_kustomize(variant_dirs: dict[str, Path]) -> None:
    for name, directory in variant_dirs.items():
        ours = {identity(d): d for d in render(directory)}
        theirs = {identity(d): d for d in external_render(directory)}
        assert sorted(ours) == sorted(theirs), name
        for key, doc in ours.items():
            assert doc == theirs[key], (name, key)


DOC: Doc = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "w"},
    "spec": {"args": ["worker"], "labels": {"a/b": "1"}},
}


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "add", "path": "/spec/args/-", "value": "--types"}], ["worker", "--types"]),
        ([{"op": "add", "path": "/spec/args/0", "value": "x"}], ["x", "worker"]),
        ([{"op": "replace", "path": "/spec/args/0", "value": "api"}], ["api"]),
        ([{"op": "remove", "path": "/spec/args/0"}], []),
    ],
)
def test_json_patch_on_lists(ops: list[dict[str, Any]], expected: list[str]) -> None:
    assert json_patch(DOC, ops)["spec"]["args"] == expected
    assert DOC["spec"]["args"] == ["worker"], "the input is never modified"


def test_json_patch_escapes_and_tests() -> None:
    ops = [
        {"op": "test", "path": "/metadata/name", "value": "w"},
        {"op": "replace", "path": "/spec/labels/a~1b", "value": "2"},
    ]
    assert json_patch(DOC, ops)["spec"]["labels"] == {"a/b": "2"}
    with pytest.raises(KustomizeError, match="test failed"):
        json_patch(DOC, [{"op": "test", "path": "/metadata/name", "value": "x"}])
    with pytest.raises(KustomizeError, match="out of range"):
        json_patch(DOC, [{"op": "remove", "path": "/spec/args/3"}])
    with pytest.raises(KustomizeError, match="unsupported JSON patch op"):
        json_patch(DOC, [{"op": "move", "from": "/spec", "path": "/x"}])


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        ("conveyor", ("conveyor", None, None)),
        ("conveyor:0.1.0", ("conveyor", "0.1.0", None)),
        ("registry:5000/team/conveyor", ("registry:5000/team/conveyor", None, None)),
        ("r:5000/conveyor:1@sha256:ab", ("r:5000/conveyor", "1", "sha256:ab")),
    ],
)
def test_split_image(image: str, parts: tuple[str, str | None, str | None]) -> None:
    assert split_image(image) == parts


def write_overlay(tmp_path: Path, extra: str) -> Path:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(f"resources:\n  - {BASE}\n{extra}")
    return overlay


def test_unsupported_fields_fail_loudly(tmp_path: Path) -> None:
    overlay = write_overlay(tmp_path, "commonLabels:\n  team: jobs\n")
    with pytest.raises(KustomizeError, match="commonLabels"):
        render(overlay)


def test_a_patch_that_matches_nothing_fails(tmp_path: Path) -> None:
    patch = (
        "patches:\n  - target: {kind: Deployment, name: worker-mail}\n"
        "    patch: '[{op: remove, path: /spec/replicas}]'\n"
    )
    with pytest.raises(KustomizeError, match="matches no resource"):
        render(write_overlay(tmp_path, patch))


def test_images_and_namespace_are_applied(tmp_path: Path) -> None:
    extra = "namespace: elsewhere\nimages:\n  - name: conveyor\n    newTag: '9.9'\n"
    docs = render(write_overlay(tmp_path, extra))
    assert {c["image"] for d in docs for c in containers(d)} == {"conveyor:9.9"}
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        "elsewhere"
    }
