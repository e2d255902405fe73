"""The lateness histogram's batch observation counts as one observation per value would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bridge.metrics import LATENESS_BUCKETS, BatchHistogram, Metrics

# Every bucket edge exactly (``le`` is inclusive), just above each, zero and past the last edge.
VALUES = [0.0, *LATENESS_BUCKETS, *(b + 1e-9 for b in LATENESS_BUCKETS), 7200.0, 0.0004]


def _exposition(histogram_type: type[Histogram], batch: bool) -> tuple[str, float]:
    """The exposition without ``_created`` and ``_sum`` lines, and the sum (whose last digits
    depend on the order of the additions)."""
    registry = CollectorRegistry()
    histogram = histogram_type("lateness", "help", buckets=LATENESS_BUCKETS, registry=registry)
    if batch:
        assert isinstance(histogram, BatchHistogram)
        histogram.observe_many(VALUES[:10])
        histogram.observe_many([])
        histogram.observe_many(VALUES[10:])
    else:
        for value in VALUES:
            histogram.observe(value)
    lines = generate_latest(registry).decode().splitlines()
    (total,) = (float(line.split()[1]) for line in lines if line.startswith("lateness_sum"))
    kept = (line for line in lines if "_created" not in line and "_sum" not in line)
    return "\n".join(kept), total


def test_a_batch_of_observations_counts_as_one_observation_each() -> None:
    one_by_one, total = _exposition(Histogram, batch=False)
    batched, batched_total = _exposition(BatchHistogram, batch=True)
    assert batched == one_by_one
    assert batched_total == pytest.approx(total, rel=1e-12)
    assert total == pytest.approx(sum(VALUES), rel=1e-12)
    assert 'lateness_bucket{le="0.001"} 3.0' in one_by_one  # 0, 0.0004 and 0.001 itself
    assert f"lateness_count {float(len(VALUES))}" in one_by_one


def test_the_lateness_of_every_priority_has_a_series_before_any_delivery() -> None:
    """Labelled by priority, the histogram had no series until the first delivery: dashboards
    and alerts saw "no data" instead of 0."""
    registry = CollectorRegistry()
    Metrics(registry)
    for priority in ("high", "normal", "low"):
        count = registry.get_sample_value(
            "delay_bridge_delivery_lateness_seconds_count", {"priority": priority}
        )
        assert count == 0.0, priority
