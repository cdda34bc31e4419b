"""The nemesis soak's worker app: the fault suite's ledger-keeping handlers plus the adversarial
handlers (``tests.adversary.handlers``), in one router, so misbehaving jobs share workers with
the jobs the checker audits."""

from __future__ import annotations

from conveyor import JobRouter

from ..adversary.handlers import router as adversaries
from .apps import router as audited

router = JobRouter()
router.include(audited)
router.include(adversaries)
