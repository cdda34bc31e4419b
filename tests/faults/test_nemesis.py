"""The nemesis (``nemesis.py``): misbehaving handlers mixed with the fault suite's faults, two
publishers dying between publish and delete, two sweepers, two workers; then the checker: lost =
stuck = double-COMPLETED = 0, no job over its attempt budget, every audited job COMPLETED and
every adversarial one terminal.

``make test`` runs a smoke (shared services, worker SIGKILLs and adversary bursts, a few
seconds); ``-m soak`` the full nemesis against a private RabbitMQ node and PostgreSQL cluster for
``NEMESIS_SECONDS`` (default 600), seeded by ``FAULTS_SEED``, with ``NEMESIS_ADVERSARIES`` (a
comma-separated list of ``tests.adversary.handlers`` types, default the ones that do not wedge a
worker today)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from conveyor.core.config import Settings

from .checker import Ledger, check
from .harness import fault_settings
from .infra import PrivatePostgres, PrivateRabbit
from .nemesis import DEFAULT_ADVERSARIES, Nemesis


async def _run(nemesis: Nemesis, seconds: float, label: str, settle: float) -> None:
    async with nemesis.running(seconds):
        v = await check(
            nemesis.settings.database_url, nemesis.accepted, nemesis.ledger, label=label,
            timeout=settle,
        )  # fmt: skip
        over = await nemesis.over_budget()
        audited = [i for i in nemesis.accepted if i not in set(nemesis.adversarial)]
        work = await nemesis.statuses(audited)
        adversarial = await nemesis.statuses(nemesis.adversarial)
    v.extra.update(
        over_budget=len(over), adversarial=dict(adversarial), refused=nemesis.refused,
        restarts=nemesis.restarts, **dict(nemesis.faults),
    )  # fmt: skip
    print("\n" + v.summary())
    v.assert_clean(expect=None)
    assert not over, f"{len(over)} jobs over their attempt budget: {over[:5]}"
    assert work == {"COMPLETED": len(audited)}, work
    assert sum(adversarial.values()) == len(nemesis.adversarial), adversarial


@pytest.mark.timeout(120)
async def test_nemesis_smoke(fsettings: Settings, ledger: Ledger, tmp_path: Path) -> None:
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    nemesis = Nemesis(
        fsettings, tmp_path, ledger, random.Random(seed), crash_p=0.2,
        adversaries=("not_json", "times_out"), chaos_every=(0.5, 1.5),
    )  # fmt: skip
    await _run(nemesis, 5.0, f"nemesis-smoke seed={seed}", settle=60)


@pytest.mark.soak
@pytest.mark.timeout(int(os.environ.get("NEMESIS_SECONDS", "600")) + 900)
async def test_nemesis_soak(
    fsettings: Settings,
    rabbit: PrivateRabbit,
    private_pg: PrivatePostgres,
    private_db_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("FAULTS_SEED", time.time()))
    settings = fault_settings(
        fsettings, amqp_url=rabbit.amqp_url, database_url=private_db_url, reconcile_after=10.0
    )
    names = os.environ.get("NEMESIS_ADVERSARIES")
    adversaries = tuple(n for n in names.split(",") if n) if names else DEFAULT_ADVERSARIES
    nemesis = Nemesis(
        settings, tmp_path, ledger, random.Random(seed), adversaries=adversaries,
        rabbit=rabbit, pg=private_pg,
    )  # fmt: skip
    seconds = float(os.environ.get("NEMESIS_SECONDS", "600"))
    await _run(nemesis, seconds, f"nemesis seed={seed}", settle=300)
