"""The metric names Conveyor exposes, from its own registries (``core/metrics.py`` and the
worker's loop gauges), and the names a PromQL expression uses: alert rules and dashboards may
only use the first."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from conveyor.core.metrics import Metrics
from conveyor.worker.loop import LoopMonitor

SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}
# a Conveyor metric name (label values in quotes are stripped before matching)
_NAME = re.compile(r"\bconveyor_[a-z0-9_]+\b")


def exposed() -> set[str]:
    """Every sample name a Conveyor process can expose."""
    metrics = Metrics()
    metrics.maintenance_gauges()  # registered where maintenance computes them
    LoopMonitor(metrics.registry)  # the worker's conveyor_worker_loop_* gauges
    names: set[str] = set()
    for family in metrics.registry.collect():
        names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def used(expr: str) -> set[str]:
    """The ``conveyor_*`` metric names in a PromQL expression (label values in quotes are
    stripped first: a queue named ``conveyor_x`` is not a metric)."""
    return set(_NAME.findall(re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise AssertionError(
            "promtool not found on PATH: the alert tests run `promtool check rules` and "
            "`promtool test rules` (Debian's `prometheus` package; .ci/run installs it)"
        )
    return found


def check_expressions(exprs: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` on the expressions as recording rules: PromQL syntax only."""
    rules = [{"record": f"check:{i}", "expr": e} for i, e in enumerate(exprs.values())]
    path = tmp / "exprs.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
