"""Partitions read again that wait for the journal (bridge.ingress.journal_waits), with a
consumer that records its seeks."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.catchup import CatchUp
from bridge.health import Readiness
from bridge.ingress import journal_waits
from bridge.ingress.journal_waits import CHECK, JournalWaits
from bridge.store import ResumePoint, Shard

A, B = Shard("delay", 0), Shard("delay", 1)


class Seeks:
    def __init__(self) -> None:
        self.seeks: list[tuple[int, int]] = []
        self.failing = False

    def seek(self, tp: TopicPartition) -> None:
        if self.failing:
            raise KafkaException(KafkaError(KafkaError._STATE, "not fetching yet"))
        self.seeks.append((tp.partition, tp.offset))


def test_a_partition_waiting_for_the_journal_is_held_and_read_again_from_where_it_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(journal_waits, "RETRY_S", 0.0)
    catch_up, seeks = CatchUp(), Seeks()
    consumer = cast(Consumer, seeks)
    waits = JournalWaits(catch_up)
    read: list[tuple[dict[Shard, int], list[Shard], object]] = []

    def reading_again(
        starts: Mapping[Shard, int],
        again: Collection[Shard],
        points: Mapping[Shard, ResumePoint] | None,
    ) -> None:
        read.append((dict(starts), list(again), points))

    point = ResumePoint(4, 5, False, None)
    waits.wait(dict.fromkeys([A, B], "no leader"), {A: 3, B: 7}, again=[A], points={B: point})
    assert waits.waiting() == {A, B} and catch_up.horizons() == {A: -1, B: -1}
    seeks.failing = True
    waits.read_again(consumer, reading_again)
    assert read == [], "not read again before the consumer is where it waits"
    seeks.failing = False
    waits.read_again(consumer, reading_again)
    assert seeks.seeks == [(0, 3), (1, 7)]
    assert read == [({A: 3}, [A], {}), ({B: 7}, [], {B: point})], "as at its assignment"
    waits.done({A})
    assert waits.waiting() == {B} and catch_up.horizons() == {B: -1}
    waits.done({B})
    assert catch_up.horizons() == {}


def test_readyz_names_the_partitions_waiting_for_the_journal_until_none_does() -> None:
    readiness = Readiness()
    waits = JournalWaits(CatchUp(), readiness)
    waits.wait({A: "no leader"}, {A: 3}, again=[], points=None)
    assert "delay[0]" in readiness.detail(CHECK) and "no leader" in readiness.detail(CHECK)
    waits.wait({B: "no leader"}, {B: 4}, again=[], points=None)
    waits.done({A})
    assert "delay[1]" in readiness.detail(CHECK)
    waits.done({B})
    assert readiness.detail(CHECK) == ""
