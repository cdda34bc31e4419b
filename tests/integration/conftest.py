"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from conveyor.core.config import Settings
from conveyor.maintenance.sweeper import Sweeper


@pytest.fixture
async def sweeper(settings: Settings) -> AsyncIterator[Sweeper]:
    """A started sweeper (its loop not running: tests call its one-step duties)."""
    s = Sweeper(settings)
    await s.start()
    yield s
    await s.close()
