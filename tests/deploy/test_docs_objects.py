"""The kubectl lines in the docs name objects the manifests create: ``kubectl … deploy/NAME``,
``job/NAME`` or ``svc/NAME`` in docs/*.md and the README must be a rendered object of that kind
(``kubectl exec deploy/conveyor-api`` would fail: the Deployment is ``api``)."""

from __future__ import annotations

import re

from .checks import BASE, ROOT
from .manifests import render

KINDS = {"deploy": "Deployment", "deployment": "Deployment", "job": "Job", "svc": "Service"}
KUBECTL_REF = re.compile(r"kubectl [^`\n]*?\b(deploy|deployment|job|svc)/([a-z0-9][a-z0-9-]*)")


def test_kubectl_lines_in_the_docs_name_objects_that_exist() -> None:
    objects = {(d["kind"], d["metadata"]["name"]) for d in render(BASE)}
    found, missing = [], []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in KUBECTL_REF.finditer(path.read_text()):
            ref = (KINDS[m.group(1)], m.group(2))
            found.append(ref)
            if ref not in objects:
                missing.append(f"{path.name}: {m.group(0)}")
    assert found, "no kubectl line found: the pattern is stale"
    assert not missing, missing
