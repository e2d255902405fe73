"""How a bulk command follows the bridge (bridge.ops.bulk.Follow): it waits while more than ``ahead``
of what it produced is not applied, and stops waiting for good when the bridge applies nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bridge.ops import Follow
from bridge.store import Shard


class Bridge:
    """The ingest watermarks a bridge leaves in Redis, moving as a fake clock runs."""

    def __init__(self, moves: Mapping[float, Mapping[int, int]]) -> None:
        self.now = 0.0
        self.moves = moves  # at this time -> partition -> watermark from then on
        self.marks: dict[int, int] = {}
        self.asked = 0

    def serve(self, seconds: float) -> None:
        self.now += seconds
        for at, marks in self.moves.items():
            if at <= self.now:
                self.marks |= marks

    def watermarks(self, shards: Sequence[Shard]) -> dict[Shard, int]:
        self.asked += 1
        return {s: self.marks[s.partition] for s in shards if s.partition in self.marks}


def follow(bridge: Bridge) -> Follow:
    return Follow("delay", bridge.watermarks, ahead=2_000, stall_s=3.0, clock=lambda: bridge.now)


def produced(f: Follow, *records: tuple[int, int, int]) -> None:
    for partition, offset, acted in records:
        f.sent(acted)
        f.acknowledged(partition, offset, acted)


def test_it_does_not_wait_while_no_more_than_ahead_are_unapplied() -> None:
    bridge = Bridge({})
    f = follow(bridge)
    produced(f, (0, 10, 1_000), (1, 4, 1_000))
    f.wait(bridge.serve)
    assert (bridge.now, bridge.asked, f.stalled) == (0.0, 0, False)


def test_it_waits_until_the_bridge_applied_enough_in_every_partition() -> None:
    """3,000 produced in two partitions: the command goes on once partition 0's first record is
    applied (2,000 left), not when partition 1's watermark stops short of its record."""
    bridge = Bridge({0.5: {1: 3}, 1.0: {0: 10}})
    f = follow(bridge)
    produced(f, (0, 10, 1_000), (0, 11, 1_000), (1, 4, 1_000))
    f.wait(bridge.serve)
    assert 1.0 <= bridge.now < 1.1
    assert (f.applied, f.stalled) == (1_000, False)


def test_records_not_acknowledged_yet_count_as_unapplied() -> None:
    bridge = Bridge({0.2: {0: 100}})
    f = follow(bridge)
    produced(f, (0, 10, 2_000))
    f.sent(1_000)  # produced, no delivery report yet: applied or not, it cannot be known
    f.wait(bridge.serve)
    assert 0.2 <= bridge.now < 0.3 and f.applied == 2_000


def test_a_bridge_that_applies_nothing_for_stall_s_is_waited_for_no_more() -> None:
    bridge = Bridge({})
    f = follow(bridge)
    produced(f, (0, 10, 5_000))
    f.wait(bridge.serve)
    assert 3.0 < bridge.now < 3.1 and f.stalled
    asked = bridge.asked
    produced(f, (0, 11, 5_000))
    f.wait(bridge.serve)  # stalled: at once, without asking Redis
    assert bridge.asked == asked and 3.0 < bridge.now < 3.1


def test_progress_restarts_the_stall_clock() -> None:
    """The bridge applies a record every 2 s: slower than the stall, but never still for 3 s."""
    bridge = Bridge({2.0: {0: 10}, 4.0: {0: 11}, 6.0: {0: 12}})
    f = follow(bridge)
    produced(f, (0, 10, 1_000), (0, 11, 1_000), (0, 12, 1_000), (0, 13, 1_000))
    f.wait(bridge.serve)
    assert 4.0 <= bridge.now < 4.1 and not f.stalled and f.applied == 2_000
