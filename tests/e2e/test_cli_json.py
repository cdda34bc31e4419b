"""Every ``conveyor … list`` and ``… show`` takes ``--json`` and prints JSON Lines with the REST
API's field names and time format (``+00:00``); human output never shows a Python repr; a
malformed argument is one line in the user's words and exit code 2."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from conveyor import Job, JobRouter, cli
from conveyor.core.config import Settings

from ..faults.harness import component_env
from ..integration.broker_state import published, wait_metric
from ..stack import running_stack, wait_for

router = JobRouter()


@router.job("cli_doomed", max_retries=0)
async def doomed(job: Job) -> None:
    raise ValueError("no such recipient")


@router.job("cli_fine")
async def fine(job: Job) -> dict[str, int]:
    return {"ok": 1}


TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?$")
REPR = re.compile(r"=None\b|=True\b|=False\b|\bNone\b|='|\bdatetime\(")


def _times(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _times(v)]
    if isinstance(value, list):
        return [t for v in value for t in _times(v)]
    return [value] if isinstance(value, str) and TIME.match(value) else []


@pytest.fixture
def run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    for name, value in component_env(settings).items():
        if name.startswith("CONVEYOR_"):
            monkeypatch.setenv(name, value)

    async def go(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = await asyncio.to_thread(cli.main, list(argv))
        except SystemExit as exc:  # argparse: a usage error
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return go


def _lines(out: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.splitlines()]


async def test_every_list_and_show_prints_json_lines_like_the_api(
    settings: Settings, run: Any
) -> None:
    async with running_stack(settings, router) as stack:
        c = stack.client
        done, failed = await stack.submit("cli_fine"), await stack.submit("cli_doomed")
        await wait_for(settings.database_url, [done, failed])
        await wait_metric(lambda: published(stack.relay, "dead") >= 1, what="a dead letter")
        assert (await run("schedules", "add", "nightly", "--type", "cli_fine", "--cron",
                          "30 2 * * *", "--timezone", "Europe/Berlin"))[0] == 0  # fmt: skip
        assert (await run("keys", "create", "--name", "ops", "--scopes", "admin"))[0] == 0

        rest: dict[str, list[dict[str, Any]]] = {
            "jobs list": (await c.get("/jobs")).json()["jobs"],
            "jobs show": [
                {**(await c.get(f"/jobs/{failed}")).json(),
                 **(await c.get(f"/jobs/{failed}/attempts")).json()}
            ],
            "types list": (await c.get("/types")).json()["types"],
            "schedules list": (await c.get("/schedules")).json()["schedules"],
        }  # fmt: skip
        commands = {
            "jobs list": ["jobs", "list", "--json"],
            "jobs show": ["jobs", "show", failed, "--json"],
            "types list": ["types", "list", "--json"],
            "schedules list": ["schedules", "list", "--json"],
            "keys list": ["keys", "list", "--json"],
            "dlq list": ["dlq", "list", "--json"],
        }
        problems = []
        for what, argv in commands.items():
            code, out, err = await run(*argv)
            if code != 0:
                problems.append(f"{what}: exit {code}: {err.strip()}")
                continue
            try:
                got = _lines(out)
            except orjson.JSONDecodeError as exc:
                problems.append(f"{what}: not JSON Lines: {exc}: {out[:200]!r}")
                continue
            if not got:
                problems.append(f"{what}: printed nothing")
                continue
            for t in _times(got):
                if not t.endswith("+00:00"):
                    problems.append(f"{what}: time {t} (the API writes +00:00)")
                    break
            if what in rest:
                expected = rest[what]
                key = "id" if "id" in expected[0] else "name"
                by_key = {e[key]: e for e in expected}
                for line in got:
                    want = by_key.get(line.get(key))
                    if want is None:
                        problems.append(f"{what}: {line.get(key)} not in the API's answer")
                    elif sorted(line) != sorted(want):
                        problems.append(f"{what}: fields {sorted(line)} != {sorted(want)}")
                    elif _times(line) != _times(want):
                        problems.append(f"{what}: times {_times(line)} != {_times(want)}")
        assert not problems, "\n".join(problems)

        # a schedule made by the CLI says so
        schedule = (await c.get("/schedules/nightly")).json()
        assert schedule["source"] == "cli", schedule


async def test_human_output_shows_no_repr(settings: Settings, run: Any) -> None:
    async with running_stack(settings, router) as stack:
        done = await stack.submit("cli_fine")
        await wait_for(settings.database_url, [done])
        assert (await run("schedules", "add", "every", "--type", "cli_fine", "--every", "60"))[
            0
        ] == 0
        assert (await run("keys", "create", "--name", "ops", "--scopes", "admin"))[0] == 0
        outputs = {}
        for argv in (["jobs", "list"], ["jobs", "show", done], ["types", "list"],
                     ["schedules", "list"], ["keys", "list"], ["dlq", "list"],
                     ["types", "pause", "cli_fine"], ["types", "resume", "cli_fine"],
                     ["types", "limit", "cli_fine", "--concurrency", "3"],
                     ["types", "limit", "cli_fine", "--concurrency", "none"],
                     ["schedules", "add", "nightly", "--type", "cli_fine", "--cron", "0 3 * * *"],
                     ["schedules", "pause", "nightly"]):  # fmt: skip
            code, out, err = await run(*argv)
            assert code == 0, (argv, err)
            outputs[" ".join(argv[:2])] = out + err
        leaks = {k: REPR.findall(v) for k, v in outputs.items() if REPR.search(v)}
        assert not leaks, {k: (leaks[k], outputs[k]) for k in leaks}


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "show", "not-a-job-id"],
        ["jobs", "cancel", "42"],
        ["jobs", "retry", "x"],
        ["jobs", "list", "--limit", "0"],
    ],
)
async def test_a_malformed_argument_is_one_line_in_the_users_words(
    settings: Settings, run: Any, argv: list[str]
) -> None:
    code, out, err = await run(*argv)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"conveyor {argv[0]}: "), err
    assert "hexadecimal" not in err and "UUID string" not in err, err
