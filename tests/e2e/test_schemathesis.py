"""Schemathesis over the served ``/openapi.json`` of a real API on a real PostgreSQL:
every operation, positive and negative data, every check, stateful links. A bounded run in
``make test``; a long one behind the ``soak`` marker. Zero failures."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from schemathesis.core.warnings import SchemathesisWarning

from conveyor.api.auth import OPEN, ROUTE_SCOPES
from conveyor.cli.keys import create_key
from conveyor.core.apikeys import effective
from conveyor.core.config import Settings

from ..security import required
from ..stack import running_stack

# with a scoped key: 401/403 on operations outside its scopes, 404 for the ids fuzzing invents;
# low_valid_rate is not shown by default
WORKFLOW_CONFIG = """
[[operations]]
include-operation-id = "submit_workflow"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "409", "422", "5XX"]
"""
QUIET = ("missing_auth", "missing_test_data", "low_valid_rate")  # the last: opt-in by default


async def _schemathesis(
    settings: Settings, tmp_path: Path, *args: str, key: str = "", scopes: str = ""
) -> tuple[int, str]:
    """``key``: every request carries this key, which holds ``scopes``."""
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert exe is not None, "schemathesis is in the test extra"
    # any schema-valid type is accepted: which types a deployment knows is not in the schema
    # (the bounded-types 422 has its own tests)
    # likewise the schedule horizon (CONVEYOR_MAX_SCHEDULE_DAYS, relative to now: a schema
    # cannot state it; test_quotas.py tests it)
    open_types = settings.model_copy(
        update={"accept_unknown_types": True, "max_schedule_days": 3_000_000}
    )
    headers = ["-H", f"Authorization: Bearer {key}"] if key else []
    if key:  # a scoped key gets 401/403 on the operations it may not call: expected here
        headers += ["--warnings", ",".join(w.value for w in SchemathesisWarning
                                           if w.value not in QUIET)]  # fmt: skip
    # a schema-valid workflow may still name a key it lacks or hold a cycle (no JSON Schema
    # states either): its 422 invalid_workflow is expected there (test_workflows_api.py)
    (tmp_path / "schemathesis.toml").write_text(WORKFLOW_CONFIG)
    async with running_stack(open_types, None, maintenance=False, relays=0) as stack:
        proc = await asyncio.create_subprocess_exec(
            exe, "run", f"{stack.client.base_url}/openapi.json", "--checks", "all",
            "--mode", "all", "--workers", "1", "--wait-for-schema", "20", *headers, *args,
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        if key:
            await _forbidden_answers_403(stack.client, key, scopes.split(","))
    text = out.decode(errors="replace")
    print(text[-3000:])
    generated = re.search(r"(\d+) generated", text)
    assert proc.returncode == 0, text[-6000:]
    assert generated is not None and "No issues found" in text, text[-3000:]
    phases = ("Examples", "Coverage", "Fuzzing", "Stateful")
    if "--phases" in args:
        phases = tuple(p.capitalize() for p in args[args.index("--phases") + 1].split(","))
    for phase in phases:
        assert f"✅ {phase}" in text, (phase, text[-3000:])
    selected = re.search(r"Selected: (\d+)/(\d+)", text)
    assert selected is not None and selected.group(1) == selected.group(2), text[-3000:]
    assert f"Tested: {selected.group(1)}" in text, text[-3000:]  # every operation
    return int(generated.group(1)), text


@pytest.mark.timeout(180)
async def test_schemathesis_finds_nothing(settings: Settings, tmp_path: Path) -> None:
    """Auth required, every request with an ``admin`` key (which may call every operation):
    the full run, plus Schemathesis' own check that a request without the key is refused."""
    s = required(settings)
    key = await create_key(s, "fuzz-admin", "admin")
    cases, _ = await _schemathesis(
        s, tmp_path, "--max-examples", "5", "--seed", "9", key=key, scopes="admin"
    )
    print(f"[api] schemathesis with an admin key: {cases} cases, 0 failures")
    assert cases > 100


async def _forbidden_answers_403(client: httpx.AsyncClient, key: str, scopes: list[str]) -> None:
    """Every operation the served schema declares, sent with this key: 403 exactly when the
    key lacks the operation's scope (path parameters filled with a fresh UUID)."""
    schema = (await client.get("/openapi.json")).json()
    held = effective(scopes)
    checked = 0
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            need = re.search(r"Needs scope `([a-z:]+)`", op.get("description", ""))
            if need is None:
                continue
            url = re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)
            r = await client.request(method, url, headers={"Authorization": f"Bearer {key}"})
            assert (r.status_code == 403) is (need.group(1) not in held), (method, path, r.text)
            checked += 1
    # every operation that needs a scope (the dashboard's pages are not in the schema: the
    # route matrix in test_security.py covers them)
    assert checked == sum(1 for (_, p), need in ROUTE_SCOPES.items()
                          if need != OPEN and not p.startswith("/ui")), checked  # fmt: skip


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "scopes",
    # admin: test_schemathesis_finds_nothing; every scope runs in CI (~15 s each,
    # mostly startup)
    ["jobs:read", "jobs:write"],
)
async def test_schemathesis_with_each_scope(
    settings: Settings, tmp_path: Path, scopes: str
) -> None:
    """Auth required; every request carries a key with ``scopes``: zero failures (the declared
    401/403 included; schemathesis also checks that requests without the key are refused), and
    every operation outside the key's scopes answers 403."""
    s = required(settings)
    key = await create_key(s, f"fuzz-{scopes}", scopes)
    cases, _ = await _schemathesis(
        s, tmp_path, "--max-examples", "3", "--seed", "9", "--phases", "examples,fuzzing",
        key=key, scopes=scopes,
    )  # fmt: skip
    print(f"[api] schemathesis with a {scopes} key: {cases} cases, 0 failures")


@pytest.mark.soak
@pytest.mark.timeout(1800)
async def test_schemathesis_long_run(settings: Settings, tmp_path: Path) -> None:
    cases, _ = await _schemathesis(settings, tmp_path, "--max-examples", "300")
    print(f"[api] schemathesis long run: {cases} cases, 0 failures")
