"""The rendered PodMonitor and PrometheusRule against the Prometheus Operator's CRD schemas, as
generated into validators by the npm package @kubernetes-models/prometheus-operator (pinned),
installed into a cache directory on first use. No node/npm or no install is a failure, not a skip.

The CRDs' OpenAPI schemas don't forbid unknown fields (the API server prunes or, with strict field
validation, rejects them), so a misspelt field is caught by test_prometheus_operator's shape check,
not here; this checks types and required fields."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .checks import by_kind
from .manifests import Doc, render_with_prometheus

PACKAGE = "@kubernetes-models/prometheus-operator@6.0.0"
SCRIPT = Path(__file__).with_name("crd_validate.mjs")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "conveyor" / "npm-crds"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is required to validate against the Prometheus Operator CRDs")
    prefix = CACHE / PACKAGE.replace("/", "_")
    modules = prefix / "node_modules"
    CACHE.mkdir(parents=True, exist_ok=True)
    # one install at a time across the run's workers and concurrent runs (two npm installs into
    # one prefix can fail with ENOTEMPTY); a failed install is
    # retried once from an empty prefix
    with (CACHE / ".install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for attempt in (1, 2):
            if (modules / "@kubernetes-models" / "prometheus-operator" / "package.json").exists():
                break
            prefix.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", PACKAGE],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode == 0:
                break
            if attempt == 2:
                pytest.fail(f"could not install {PACKAGE}:\n{done.stderr}")
            shutil.rmtree(prefix, ignore_errors=True)
    return modules


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render_with_prometheus(tmp_path_factory.mktemp("crds"))


def problems(node_modules: Path, objects: list[Doc]) -> list[str]:
    # node resolves the package from the script's directory upwards: run a copy beside the modules
    script = node_modules.parent / SCRIPT.name
    shutil.copyfile(SCRIPT, script)
    done = subprocess.run(
        ["node", str(script)],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.splitlines()


def operator_objects(docs: list[Doc]) -> list[Doc]:
    return [*by_kind(docs, "PodMonitor").values(), *by_kind(docs, "PrometheusRule").values()]


def test_the_objects_pass_the_crd_schemas(node_modules: Path, docs: list[Doc]) -> None:
    objects = operator_objects(docs)
    assert len(objects) == 2
    assert problems(node_modules, objects) == []


def test_planted_mistakes_are_reported(node_modules: Path, docs: list[Doc]) -> None:
    (monitor,) = copy.deepcopy(list(by_kind(docs, "PodMonitor").values()))
    (rule,) = copy.deepcopy(list(by_kind(docs, "PrometheusRule").values()))
    monitor["spec"]["podMetricsEndpoints"][0]["port"] = 8081
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    found = "\n".join(problems(node_modules, [monitor, rule]))
    assert "podMetricsEndpoints/0/port must be string" in found
    assert "rules/0 must have required property expr" in found
