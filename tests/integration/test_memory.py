"""The bridge's memory after a burst: what a drain took, the process gives back (bridge.memory),
so its resident size says what it holds now, not the largest burst it has met."""

from __future__ import annotations

import time

import pytest

from bridge.message import H_DELIVER_AT, H_TARGET_TOPIC
from testbed.harness import Bridge, Setup, metric, produce_all
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

BURST = 60_000
MIB = 1 << 20


def test_memory_a_drain_took_is_given_back(setup: Setup, bridges: list[Bridge]) -> None:
    """60,000 records falling due at one instant: the bridge's anonymous memory grows while it
    moves them (about 30 MiB) and, once they are delivered, gives back at least half of what the
    drain took (measured: 10 MiB stay over the idle size, 14 without ``malloc_trim``; a bridge
    that kept what it moved would stay at its peak). Half, not a fixed size: what stays is the
    allocators' fragmentation, and it grows with the peak, which a loaded machine raises."""
    bridge = setup.bridge().start()
    bridges.append(bridge)
    wait_for(lambda: bridge.get("/readyz")[0] == 200, 60, "ready")
    before = bridge.memory("RssAnon")
    due = str(time.time_ns() // 1_000_000 + 4000).encode()  # stored first, then all due at once
    headers = [(H_TARGET_TOPIC, setup.targets[0].encode()), (H_DELIVER_AT, due)]
    produce_all(
        setup.services.bootstrap,
        setup.delay,
        [(b"k%d" % (i % 100), b"v" * 100, headers) for i in range(BURST)],
    )
    peak = before

    def delivered() -> bool:  # the peak is sampled during the drain: the bridge may give some
        nonlocal peak  # back before the last record is counted
        peak = max(peak, bridge.memory("RssAnon"))
        return metric(bridge, "delay_bridge_delivered_total") >= BURST

    wait_for(delivered, 120, "all delivered")
    assert peak - before > 12 * MIB, f"the burst took {(peak - before) / MIB:.1f} MiB: test void"
    took = peak - before
    wait_for(
        lambda: bridge.memory("RssAnon") - before <= took / 2,
        30,
        f"memory back within {took / 2 / MIB:.1f} MiB of {before / MIB:.1f} MiB (half of "
        f"what the drain took: its peak was {peak / MIB:.1f} MiB)",
    )
