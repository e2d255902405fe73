"""Never early, whatever one clock says: a real Redis's clock and a real bridge's clock stepped
mid-run (testbed/clock/shift.c), and every record still delivered no earlier than its due time,
none expired that was on time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.message import H_DELIVER_AT, H_MAX_LATENESS, H_TARGET_TOPIC, Headers
from testbed.clock import python_shift  # its sitecustomize says why
from testbed.harness import Bridge, Received, Setup, metric, produce_all, wait_ready
from tests.conftest import wait_for
from tests.integration.conftest import ClockShift, redis_server

pytestmark = pytest.mark.integration

HALF_AN_HOUR_MS = 30 * 60_000


def _due_between(
    setup: Setup, count: int, first_s: float, last_s: float, extra: Headers | None = None
) -> list[tuple[bytes, bytes, Headers]]:
    now_ms = time.time_ns() // 1_000_000
    step_ms = (last_s - first_s) * 1000 / max(1, count - 1)
    return [
        (
            f"k{i}".encode(),
            f"r{i}".encode(),
            [
                (H_TARGET_TOPIC, setup.targets[0].encode()),
                (H_DELIVER_AT, str(int(now_ms + first_s * 1000 + i * step_ms)).encode()),
                *(extra or []),
            ],
        )
        for i in range(count)
    ]


def _early(records: list[Received]) -> list[tuple[str, int]]:
    """The records seen before their due time: (value, how many ms early)."""
    return [
        ((r.value or b"").decode(), r.due_ms - r.seen_ms) for r in records if r.seen_ms < r.due_ms
    ]


def test_a_redis_clock_that_steps_forward_makes_nothing_early(
    setup: Setup, bridges: list[Bridge], tmp_path: Path, clock_shift: Callable[[str], ClockShift]
) -> None:
    """The Redis host's clock stepped 30 minutes forward (an NTP step, a failover to a replica
    whose host is off): every record due within minutes was delivered at once, up to 560 s early,
    and /readyz said ok. Claims decide by the lesser of Redis's clock and the bridge's own now;
    the skew is a metric and /readyz names it."""
    shift = clock_shift("redis")
    with redis_server(tmp_path, shift.env()) as url:
        bridge = setup.bridge(redis__url=url).start()
        bridges.append(bridge)
        assert wait_ready(bridge), bridge.output()
        records = _due_between(setup, 30, 5, 12)
        produce_all(setup.services.bootstrap, setup.delay, records)
        wait_for(lambda: metric(bridge, "delay_bridge_ingested_total") == 30, 30, "all stored")
        shift.step_to(HALF_AN_HOUR_MS)
        wait_for(lambda: "clock" in bridge.get("/readyz")[1], 30, "/readyz naming the skew")
        assert bridge.get("/readyz")[0] == 503
        assert metric(bridge, "delay_bridge_clock_skew_seconds") > 1700
        collector = setup.collector()
        try:
            collector.until(lambda rs: len(rs) >= 30, 60, "every record")
        finally:
            collector.close()
        assert _early(collector.records) == []
        assert sorted(r.value or b"" for r in collector.records) == sorted(v for _, v, _ in records)
        shift.step_to(0)
        wait_for(lambda: bridge.get("/readyz")[0] == 200, 30, "/readyz 200 once the clocks agree")


def test_a_bridge_clock_ahead_expires_nothing_on_time(setup: Setup, bridges: list[Bridge]) -> None:
    """A bridge whose own clock ran 20 s ahead dead-lettered every on-time record with
    ``delay-max-lateness: 5s`` as expired: expiry read the pod's clock, not the decision clock."""
    bridge = setup.bridge()
    bridge.env.update(python_shift(20_000))
    bridges.append(bridge.start())
    wait_for(lambda: "clock skew" in bridge.get("/readyz")[1], 60, "/readyz naming the skew")
    records = _due_between(setup, 20, 8, 12, [(H_MAX_LATENESS, b"5s")])
    produce_all(setup.services.bootstrap, setup.delay, records)
    collector = setup.collector()
    try:
        collector.until(lambda rs: len(rs) >= 20, 60, "every record delivered or dead-lettered")
    finally:
        collector.close()
    assert [r.topic for r in collector.records] == [setup.targets[0]] * 20
    assert _early(collector.records) == []
