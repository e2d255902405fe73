"""The watch for partitions the consumer is assigned and the mover does not deliver from."""

from __future__ import annotations

import logging

import pytest

from bridge.egress.owned import DRIFT_S, OwnedWatch
from bridge.store import Shard

A, B = Shard("delay", 0), Shard("delay", 1)


class Mover:
    def __init__(self, owned: set[Shard], taken: list[set[Shard]]) -> None:
        self.owned, self.taken = owned, taken

    def add_shards(self, shards: set[Shard]) -> None:
        self.taken.append(shards)
        self.owned |= shards


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_partition_assigned_and_not_delivered_from_is_taken_over_again_after_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    assigned, owned = {A, B}, {A}
    taken: list[set[Shard]] = []
    watch = OwnedWatch(lambda: assigned, Mover(owned, taken), clock)
    watch.check()
    clock.now += DRIFT_S - 1  # a hand-over under way: nothing yet
    watch.check()
    assert taken == []
    clock.now += 1
    with caplog.at_level(logging.ERROR):
        watch.check()
    assert taken == [{B}]
    assert "delay[1]" in caplog.text
    clock.now += DRIFT_S
    watch.check()  # owned now
    assert taken == [{B}]


def test_a_partition_handed_over_in_time_or_revoked_is_left_alone() -> None:
    clock = Clock()
    assigned, owned = {A, B}, {A}
    taken: list[set[Shard]] = []
    watch = OwnedWatch(lambda: assigned, Mover(owned, taken), clock)
    watch.check()
    clock.now += DRIFT_S / 2
    owned.add(B)  # the take-over came
    watch.check()
    owned.discard(B)  # then B went again, and was revoked soon after
    clock.now += DRIFT_S / 2
    watch.check()
    assigned.discard(B)
    clock.now += DRIFT_S
    watch.check()
    # A retired incarnation the mover delivers from is no drift either.
    owned.add(Shard("delay", 0, "old"))
    watch.check()
    assert taken == []
