"""``observe_many`` leaves a histogram exactly as one ``observe`` per value would (buckets and
count; the sum up to float rounding)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from conveyor.core.metrics import WAIT_BUCKETS, observe_many


def _samples(h: Histogram) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for metric in h.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize(
    "values",
    [
        [],
        [0.0],
        [0.003, 0.005, 0.0050001, 0.01, 7.5, 3600, 3601, 1e9, -1.0, 0.25, 0.25, 0.25],
        [float("inf"), 2.5],
        [float("nan"), 0.1],
    ],
)
def test_observe_many_equals_one_observe_per_value(values: list[float]) -> None:
    one = Histogram("one", "", ["type"], buckets=WAIT_BUCKETS, registry=CollectorRegistry())
    many = Histogram("many", "", ["type"], buckets=WAIT_BUCKETS, registry=CollectorRegistry())
    child = one.labels("t")
    for v in values:
        child.observe(v)
    observe_many(many.labels("t"), values)
    a = {k.replace("one", "h", 1): v for k, v in _samples(one).items()}
    b = {k.replace("many", "h", 1): v for k, v in _samples(many).items()}
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k] or math.isclose(a[k], b[k]) or (math.isnan(a[k]) and math.isnan(b[k]))
