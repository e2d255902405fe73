"""Inputs nobody scripted, on the real servers: each record is stored, dead-lettered or refused on
its own, and nothing it carries stops the rest or takes the process down."""

from __future__ import annotations

import time

import pytest

from bridge.message import H_DELIVER_AT, H_ERROR, H_ERROR_DETAIL, H_PRIORITY, H_TARGET_TOPIC
from tests.integration.harness import Bridge, Setup, produce_all

pytestmark = pytest.mark.integration


def test_due_times_before_2000_are_dead_lettered_and_the_rest_delivered_once(
    setup: Setup, bridges: list[Bridge]
) -> None:
    """A due time before 1970 used to be stored below its priority lane's floor: claimed by rank,
    the high one was never delivered and another record went twice; a normal one crashed the
    egress loop; Go's zero time (year 1) waited forever and pinned the partition's commit."""
    target = setup.targets[0].encode()
    soon = str(time.time_ns() // 1_000_000 + 2000).encode()

    def record(value: bytes, at: bytes, priority: bytes = b"normal") -> tuple[bytes, bytes, list]:  # type: ignore[type-arg]
        return (b"one-partition", value, [(H_TARGET_TOPIC, target), (H_DELIVER_AT, at),
                                          (H_PRIORITY, priority)])  # fmt: skip

    refused = {b"just-before-1970": b"1969-12-31T23:59:59Z", b"go-zero-time": b"0001-01-01T00:00:00Z",
               b"moon-landing": b"1969-07-20T20:17:00Z", b"in-1999": b"1999-12-31T23:59:59.999Z"}  # fmt: skip
    records = [record(b"just-before-1970", refused[b"just-before-1970"], b"high"),
               record(b"go-zero-time", refused[b"go-zero-time"]),
               record(b"moon-landing", refused[b"moon-landing"]),
               record(b"in-1999", refused[b"in-1999"], b"low"),
               record(b"high-1", soon, b"high"), record(b"high-2", soon, b"high"),
               record(b"normal-1", soon)]  # fmt: skip
    produce_all(setup.services.bootstrap, setup.delay, records)
    bridge = setup.bridge().start()
    bridges.append(bridge)
    collector = setup.collector()
    try:
        collector.until(
            lambda rs: len(rs) >= len(records), 60, "every record delivered or dead-lettered"
        )
        collector.poll(2.0)  # a duplicate would show up now
    finally:
        collector.close()
    delivered = sorted(r.value or b"" for r in collector.records if r.topic != setup.dlq)
    assert delivered == [b"high-1", b"high-2", b"normal-1"]
    dead = {r.value: r for r in collector.of(setup.dlq)}
    assert set(dead) == set(refused)
    for value, r in dead.items():
        assert r.header(H_ERROR) == b"bad-due-time", value
        assert b"before 2000-01-01" in (r.header(H_ERROR_DETAIL) or b""), value
    assert bridge.proc is not None and bridge.proc.poll() is None, bridge.output()
