"""Rendering k8s/ with the real kustomize (``kubectl kustomize``): it must be there, and its
strictness (a patch that matches nothing) and transformations reach the tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .checks import BASE
from .manifests import KustomizeError, containers, render


def write_overlay(tmp_path: Path, extra: str) -> Path:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(BASE, overlay)  # kustomize refuses absolute resource paths
    (overlay / "kustomization.yaml").write_text(f"resources:\n  - {base}\n{extra}")
    return overlay


def test_without_kubectl_the_tests_fail_and_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KustomizeError, match=r"kubectl not found.*kubectl kustomize"):
        render(BASE)


def test_a_patch_that_matches_nothing_fails(tmp_path: Path) -> None:
    patch = (
        "patches:\n  - target: {kind: Deployment, name: worker-mail}\n"
        "    patch: '[{op: remove, path: /spec/replicas}]'\n"
    )
    with pytest.raises(KustomizeError, match=r"kubectl kustomize .* failed"):
        render(write_overlay(tmp_path, patch))


def test_images_and_namespace_are_applied(tmp_path: Path) -> None:
    extra = "namespace: elsewhere\nimages:\n  - name: conveyor\n    newTag: '9.9'\n"
    docs = render(write_overlay(tmp_path, extra))
    assert {c["image"] for d in docs for c in containers(d)} == {"conveyor:9.9"}
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        "elsewhere"
    }
