"""The rendered manifests every deploy test reads: the base (no KEDA), the keda overlay (the base
scaled by KEDA), the example overlay, and the example overlay with the optional
postgresql-scaler component switched on the way the docs say (uncommented)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from .checks import K8S, KEDA_OVERLAY, OVERLAY
from .manifests import Doc, render

VARIANTS = ("base", "keda", "overlay", "overlay+postgresql")
COMMENTED_COMPONENT = "# components:\n#   - ../../components/keda-postgresql\n"


def enable_postgresql_component(into: Path) -> Path:
    """A copy of k8s/ whose example overlay has the component's lines uncommented."""
    tree = into / "k8s"
    shutil.copytree(K8S, tree)
    overlay = tree / OVERLAY.relative_to(K8S)
    text = (overlay / "kustomization.yaml").read_text()
    assert COMMENTED_COMPONENT in text, "the overlay no longer shows how to enable the component"
    uncommented = COMMENTED_COMPONENT.replace("# ", "", 1).replace("#   ", "  ")
    (overlay / "kustomization.yaml").write_text(text.replace(COMMENTED_COMPONENT, uncommented))
    return overlay


@pytest.fixture(scope="session")
def postgresql_overlay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return enable_postgresql_component(tmp_path_factory.mktemp("keda-postgresql"))


@pytest.fixture(scope="session")
def variant_dirs(postgresql_overlay: Path) -> dict[str, Path]:
    return {
        "base": K8S / "base",
        "keda": KEDA_OVERLAY,
        "overlay": OVERLAY,
        "overlay+postgresql": postgresql_overlay,
    }


@pytest.fixture(scope="session")
def rendered(variant_dirs: dict[str, Path]) -> dict[str, list[Doc]]:
    return {name: render(path) for name, path in variant_dirs.items()}


@pytest.fixture(params=VARIANTS)
def docs(request: pytest.FixtureRequest, rendered: dict[str, list[Doc]]) -> list[Doc]:
    """Each rendered variant in turn (a copy: tests may break it on purpose)."""
    return copy.deepcopy(rendered[request.param])
