"""Issue 9.9: Schemathesis over the served ``/openapi.json`` of a real API on a real PostgreSQL:
every operation, positive and negative data, every check, stateful links. A bounded run in
``make test``; a long one behind the ``soak`` marker. Zero failures."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from pathlib import Path

import pytest

from conveyor.core.config import Settings

from ..stack import running_stack


async def _schemathesis(settings: Settings, tmp_path: Path, *args: str) -> tuple[int, str]:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert exe is not None, "schemathesis is in the test extra"
    # any schema-valid type is accepted: which types a deployment knows is not in the schema
    # (the bounded-types 422 has its own tests)
    open_types = settings.model_copy(update={"accept_unknown_types": True})
    async with running_stack(open_types, None, maintenance=False, relays=0) as stack:
        proc = await asyncio.create_subprocess_exec(
            exe, "run", f"{stack.client.base_url}/openapi.json", "--checks", "all",
            "--mode", "all", "--workers", "1", "--wait-for-schema", "20", *args,
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    print(text[-3000:])
    generated = re.search(r"(\d+) generated", text)
    assert proc.returncode == 0, text[-6000:]
    assert generated is not None and "No issues found" in text, text[-3000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in text, (phase, text[-3000:])
    selected = re.search(r"Selected: (\d+)/(\d+)", text)
    assert selected is not None and selected.group(1) == selected.group(2), text[-3000:]
    assert f"Tested: {selected.group(1)}" in text, text[-3000:]  # every operation
    return int(generated.group(1)), text


@pytest.mark.timeout(180)
async def test_schemathesis_finds_nothing(settings: Settings, tmp_path: Path) -> None:
    cases, _ = await _schemathesis(settings, tmp_path, "--max-examples", "5", "--seed", "9")
    print(f"[api] schemathesis: {cases} cases, 0 failures")
    assert cases > 100


@pytest.mark.soak
@pytest.mark.timeout(1800)
async def test_schemathesis_long_run(settings: Settings, tmp_path: Path) -> None:
    cases, _ = await _schemathesis(settings, tmp_path, "--max-examples", "300")
    print(f"[api] schemathesis long run: {cases} cases, 0 failures")
