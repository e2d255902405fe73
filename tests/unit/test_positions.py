"""Where a partition resumes (bridge.positions): a commit past Redis's watermark tells it lost
writes."""

from __future__ import annotations

from confluent_kafka import OFFSET_INVALID, TopicPartition

from bridge.positions import commit_of, rebuild_point, writes_lost
from bridge.store import Shard

A, B, C = Shard("delay", 0), Shard("delay", 1), Shard("delay", 2)


def test_a_commit_past_the_watermark_redis_holds_means_it_lost_writes() -> None:
    marks = {A: 19, B: 19, C: 19}
    # A: committed up to 25 (the watermark was 24); B: what Redis holds; C: never committed.
    ends = {A: 25, B: 20, C: OFFSET_INVALID}
    assert writes_lost(marks, ends) == {A}
    assert writes_lost(marks, {}) == set()


def test_the_commit_names_the_watermark_and_the_rebuild_point_the_lowest_pending() -> None:
    tp = commit_of(A, 25, 7)
    assert (tp.offset, rebuild_point(tp)) == (25, 7)
    assert rebuild_point(TopicPartition("delay", 0, 12)) == 12  # an earlier version's commit
