"""Conveyor's fixtures (``conveyor_conn``, a migrated schema per session) come from the plugin
named in ``pytest.ini``; ``conveyor_router`` says whose job types to register."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import shop

from conveyor import JobRouter


@pytest.fixture
def conveyor_router() -> JobRouter:
    return shop.router


@pytest.fixture(autouse=True)
def _fresh_audit() -> Iterator[None]:
    shop.handled.clear()
    yield
